// SafeTensorsWriter (runtime/safetensors.h): tensors collected in memory, serialized with a
// space-padded header, written atomically (temporary file, fsync, rename).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/safetensors.h"
#include "runtime/safetensors_format.h"

namespace mha {

using safetensors::CheckedMul;
using safetensors::DTypeEntry;
using safetensors::FirstInvalidUtf8;
using safetensors::LookupDType;
using safetensors::ShapeToString;

Status SafeTensorsWriter::Add(const std::string& name, DType dtype,
                              const std::vector<int64_t>& shape, const void* data) {
  if (DTypeSize(dtype) == 0) {
    return InvalidArgument("SafeTensorsWriter::Add: tensor '" + name + "': invalid dtype " +
                           std::to_string(static_cast<int>(dtype)));
  }
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return InvalidArgument("SafeTensorsWriter::Add: tensor '" + name +
                             "': expected dimensions >= 0, got shape " + ShapeToString(shape));
    }
    if (!CheckedMul(count, static_cast<uint64_t>(d), &count)) {
      return InvalidArgument("SafeTensorsWriter::Add: tensor '" + name + "': shape " +
                             ShapeToString(shape) + " overflows 64 bits");
    }
  }
  uint64_t nbytes = 0;
  if (!CheckedMul(count, DTypeSize(dtype), &nbytes) ||
      nbytes > std::numeric_limits<size_t>::max()) {
    return InvalidArgument("SafeTensorsWriter::Add: tensor '" + name + "': byte size of shape " +
                           ShapeToString(shape) + " overflows");
  }
  return AddRaw(name, SafeTensorsDTypeName(dtype), shape, data, static_cast<size_t>(nbytes));
}

Status SafeTensorsWriter::AddRaw(const std::string& name, const std::string& dtype_name,
                                 const std::vector<int64_t>& shape, const void* data,
                                 size_t nbytes) {
  const std::string w = "SafeTensorsWriter::Add: tensor '" + name + "': ";
  if (name.empty()) return InvalidArgument("SafeTensorsWriter::Add: tensor name is empty");
  if (name == "__metadata__") {
    return InvalidArgument(w + "the name is reserved for metadata");
  }
  if (FirstInvalidUtf8(reinterpret_cast<const uint8_t*>(name.data()), name.size()) != name.size()) {
    return InvalidArgument("SafeTensorsWriter::Add: tensor name is not valid UTF-8");
  }
  for (const Entry& e : entries_) {
    if (e.name == name) return InvalidArgument(w + "duplicate name");
  }
  const DTypeEntry* dt = LookupDType(dtype_name);
  if (dt == nullptr) return InvalidArgument(w + "unknown dtype \"" + dtype_name + "\"");
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return InvalidArgument(w + "expected dimensions >= 0, got shape " + ShapeToString(shape));
    }
    if (!CheckedMul(count, static_cast<uint64_t>(d), &count)) {
      return InvalidArgument(w + "shape " + ShapeToString(shape) + " overflows 64 bits");
    }
  }
  uint64_t expected = 0;
  if (!CheckedMul(count, dt->size, &expected) || expected != nbytes) {
    return InvalidArgument(w + "expected " + std::to_string(expected) + " bytes for shape " +
                           ShapeToString(shape) + " " + dtype_name + ", got " +
                           std::to_string(nbytes));
  }
  if (data == nullptr && nbytes != 0) return InvalidArgument(w + "data is null");
  Entry e;
  e.name = name;
  e.dtype_name = dtype_name;
  e.shape = shape;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (nbytes != 0) e.bytes.assign(p, p + nbytes);
  entries_.push_back(std::move(e));
  return Status::Ok();
}

Status SafeTensorsWriter::AddMetadata(const std::string& key, const std::string& value) {
  auto valid = [](const std::string& s) {
    return FirstInvalidUtf8(reinterpret_cast<const uint8_t*>(s.data()), s.size()) == s.size();
  };
  if (!valid(key) || !valid(value)) {
    return InvalidArgument("SafeTensorsWriter::AddMetadata: key or value of '" + key +
                           "' is not valid UTF-8");
  }
  for (auto& kv : metadata_) {
    if (kv.first == key) {
      kv.second = value;
      return Status::Ok();
    }
  }
  metadata_.emplace_back(key, value);
  return Status::Ok();
}

Status SafeTensorsWriter::Serialize(std::vector<uint8_t>* out) const {
  if (out == nullptr) return InvalidArgument("SafeTensorsWriter::Serialize: out is null");
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& kv : metadata_) meta[kv.first] = kv.second;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = e.dtype_name;
    t["shape"] = e.shape;
    t["data_offsets"] = {offset, offset + e.bytes.size()};
    header[e.name] = std::move(t);
    offset += e.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const std::exception& ex) {
    return Internal(std::string("SafeTensorsWriter: cannot serialize the header: ") + ex.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> bytes;
  bytes.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(n >> (8 * i)));
  bytes.insert(bytes.end(), text.begin(), text.end());
  for (const Entry& e : entries_) bytes.insert(bytes.end(), e.bytes.begin(), e.bytes.end());
  *out = std::move(bytes);
  return Status::Ok();
}

Status SafeTensorsWriter::WriteFile(const std::string& path) const {
  std::vector<uint8_t> bytes;
  Status s = Serialize(&bytes);
  if (!s.ok()) return s;
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return IoError("SafeTensorsWriter: cannot create '" + tmp + "': " + std::strerror(errno));
  }
  auto fail = [&](const std::string& what, int err, bool fd_open) {
    if (fd_open) close(fd);
    unlink(tmp.c_str());
    return IoError("SafeTensorsWriter: " + what + " '" + tmp + "': " + std::strerror(err));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write", errno, true);
    }
    done += static_cast<size_t>(w);
  }
  if (fsync(fd) != 0) return fail("cannot sync", errno, true);
  if (close(fd) != 0) return fail("cannot close", errno, false);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return IoError("SafeTensorsWriter: cannot rename '" + tmp + "' to '" + path +
                   "': " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace mha
