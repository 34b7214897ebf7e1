// SafeTensorsFile (runtime/safetensors.h): mapping a file or wrapping a buffer, and the
// tensor accessors; the header's parse and validation are in runtime/safetensors_format.cc.
#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runtime/safetensors_format.h"

namespace mha {

namespace {

bool IsLittleEndianHost() {
  const uint16_t probe = 1;
  uint8_t first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

}  // namespace

std::string TensorInfo::ShapeString() const {
  return safetensors::ShapeToString(shape) + " " + dtype_name;
}

const char* SafeTensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kBool:
      return "BOOL";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "invalid";
}

float F16BitsToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN with its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: value = mant * 2^-24; normalize so the leading 1 becomes implicit.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float BF16BitsToF32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

SafeTensorsFile::~SafeTensorsFile() { Unmap(); }

SafeTensorsFile::SafeTensorsFile(SafeTensorsFile&& other) noexcept { *this = std::move(other); }

SafeTensorsFile& SafeTensorsFile::operator=(SafeTensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    mapping_ = other.mapping_;
    mapping_size_ = other.mapping_size_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    other.mapping_ = nullptr;
    other.mapping_size_ = 0;
    other.tensors_.clear();
    other.index_.clear();
    other.metadata_.clear();
  }
  return *this;
}

void SafeTensorsFile::Unmap() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
  mapping_ = nullptr;
  mapping_size_ = 0;
}

Status SafeTensorsFile::Open(const std::string& path, SafeTensorsFile* out) {
  if (out == nullptr) return InvalidArgument("SafeTensorsFile::Open: out is null");
  if (!IsLittleEndianHost()) {
    return Unsupported("safetensors '" + path + "': big-endian hosts are not supported");
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return IoError("safetensors '" + path + "': cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return IoError("safetensors '" + path + "': cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return IoError("safetensors '" + path + "': not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    close(fd);
    return FormatError("safetensors '" + path + "': file is " + std::to_string(size) +
                       " bytes, expected at least 8 (the header length)");
  }
  if (size > std::numeric_limits<size_t>::max()) {
    close(fd);
    return IoError("safetensors '" + path + "': file of " + std::to_string(size) +
                   " bytes does not fit the address space");
  }
  void* map = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return IoError("safetensors '" + path + "': cannot mmap " + std::to_string(size) +
                   " bytes: " + std::strerror(map_errno));
  }
  SafeTensorsFile file;
  file.path_ = path;
  file.mapping_ = map;
  file.mapping_size_ = static_cast<size_t>(size);
  Status s = file.Parse(static_cast<const uint8_t*>(map), static_cast<size_t>(size));
  if (!s.ok()) return s;  // ~SafeTensorsFile unmaps
  *out = std::move(file);
  return Status::Ok();
}

Status SafeTensorsFile::FromBuffer(const uint8_t* data, size_t size, SafeTensorsFile* out,
                                   const std::string& name) {
  if (out == nullptr) return InvalidArgument("SafeTensorsFile::FromBuffer: out is null");
  if (!IsLittleEndianHost()) {
    return Unsupported("safetensors '" + name + "': big-endian hosts are not supported");
  }
  if (data == nullptr && size != 0) {
    return InvalidArgument("safetensors '" + name + "': data is null with size " +
                           std::to_string(size));
  }
  SafeTensorsFile file;
  file.path_ = name;
  Status s = file.Parse(data, size);
  if (!s.ok()) return s;
  *out = std::move(file);
  return Status::Ok();
}

std::vector<std::string> SafeTensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

const TensorInfo* SafeTensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafeTensorsFile::FindOrError(const std::string& name, const TensorInfo** out) const {
  *out = Find(name);
  if (*out == nullptr) {
    return InvalidArgument("safetensors '" + path_ + "': no tensor named '" + name + "'");
  }
  return Status::Ok();
}

Status SafeTensorsFile::GetF32(const std::string& name, std::vector<float>* out) const {
  if (out == nullptr) return InvalidArgument("GetF32: out is null");
  const TensorInfo* t = nullptr;
  Status found = FindOrError(name, &t);
  if (!found.ok()) return found;
  if (!t->supported ||
      (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16)) {
    return Unsupported("safetensors '" + path_ + "': tensor '" + name + "' has dtype " +
                       t->dtype_name + ", expected F32, F16 or BF16 for GetF32");
  }
  // num_elements * element_size == nbytes <= the buffer size, so this cannot overflow size_t.
  const size_t n = static_cast<size_t>(t->num_elements);
  std::vector<float> v(n);
  if (t->dtype == DType::kF32) {
    if (n != 0) std::memcpy(v.data(), t->data, n * sizeof(float));
  } else {
    const bool f16 = t->dtype == DType::kF16;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t bits =
          static_cast<uint16_t>(t->data[2 * i] | (static_cast<uint16_t>(t->data[2 * i + 1]) << 8));
      v[i] = f16 ? F16BitsToF32(bits) : BF16BitsToF32(bits);
    }
  }
  *out = std::move(v);
  return Status::Ok();
}

Status SafeTensorsFile::ViewF32(const std::string& name, TensorView* out) const {
  if (out == nullptr) return InvalidArgument("ViewF32: out is null");
  const TensorInfo* t = nullptr;
  Status found = FindOrError(name, &t);
  if (!found.ok()) return found;
  const std::string id = "safetensors '" + path_ + "': tensor '" + name + "' ";
  if (!t->supported || t->dtype != DType::kF32) {
    return Unsupported(id + "has dtype " + t->dtype_name +
                       ", ViewF32 needs F32; use GetF32 to convert");
  }
  if (t->rank() > kMaxRank) {
    return Unsupported(id + "has rank " + std::to_string(t->rank()) +
                       ", views support 0..4; use GetF32");
  }
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    return Unsupported(id + "is not 4-byte aligned (data offset " + std::to_string(t->offset) +
                       "), so it cannot be viewed in place; use GetF32 to copy");
  }
  const int64_t scalar_shape[1] = {1};
  const int rank = t->rank() == 0 ? 1 : t->rank();
  const int64_t* shape = t->rank() == 0 ? scalar_shape : t->shape.data();
  // Views are non-owning and typed void*; the memory is read-only (documented in the header).
  return TensorView::Dense(const_cast<uint8_t*>(t->data), DType::kF32, rank, shape, out,
                           name.c_str(), /*allow_empty=*/true);
}

Status SafeTensorsFile::GetBool(const std::string& name, std::vector<uint8_t>* out) const {
  if (out == nullptr) return InvalidArgument("GetBool: out is null");
  const TensorInfo* t = nullptr;
  Status found = FindOrError(name, &t);
  if (!found.ok()) return found;
  if (!t->supported || (t->dtype != DType::kBool && t->dtype != DType::kU8)) {
    return Unsupported("safetensors '" + path_ + "': tensor '" + name + "' has dtype " +
                       t->dtype_name + ", expected BOOL or U8 for GetBool");
  }
  std::vector<uint8_t> v(t->data, t->data + t->nbytes);
  if (t->dtype == DType::kBool) {
    for (uint8_t& b : v) b = b != 0;
  }
  *out = std::move(v);
  return Status::Ok();
}

Status SafeTensorsFile::GetInt64(const std::string& name, std::vector<int64_t>* out) const {
  if (out == nullptr) return InvalidArgument("GetInt64: out is null");
  const TensorInfo* t = nullptr;
  Status found = FindOrError(name, &t);
  if (!found.ok()) return found;
  if (!t->supported || (t->dtype != DType::kI32 && t->dtype != DType::kI64)) {
    return Unsupported("safetensors '" + path_ + "': tensor '" + name + "' has dtype " +
                       t->dtype_name + ", expected I32 or I64 for GetInt64");
  }
  // Element bytes are little-endian like the host (checked at Open), and only 1-byte aligned.
  const size_t n = static_cast<size_t>(t->num_elements);
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t->dtype == DType::kI32) {
      int32_t x;
      std::memcpy(&x, t->data + 4 * i, 4);
      v[i] = x;
    } else {
      std::memcpy(&v[i], t->data + 8 * i, 8);
    }
  }
  *out = std::move(v);
  return Status::Ok();
}

}  // namespace mha
