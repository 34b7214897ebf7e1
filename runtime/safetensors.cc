// safetensors reader and writer (runtime/safetensors.h).
#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace mha {

namespace {

struct DTypeEntry {
  const char* name;
  size_t size;
  bool supported;
  DType dtype;
};

// Every whole-byte safetensors dtype. Sub-byte types (F4, F6_*) are not listed: their byte size
// is not elements * size and mha has no use for them.
constexpr DTypeEntry kDTypes[] = {
    {"F32", 4, true, DType::kF32},     {"F16", 2, true, DType::kF16},
    {"BF16", 2, true, DType::kBF16},   {"BOOL", 1, true, DType::kBool},
    {"U8", 1, true, DType::kU8},       {"I8", 1, false, DType::kU8},
    {"I16", 2, false, DType::kU8},     {"U16", 2, false, DType::kU8},
    {"I32", 4, false, DType::kU8},     {"U32", 4, false, DType::kU8},
    {"I64", 8, false, DType::kU8},     {"U64", 8, false, DType::kU8},
    {"F64", 8, false, DType::kU8},     {"C64", 8, false, DType::kU8},
    {"F8_E4M3", 1, false, DType::kU8}, {"F8_E5M2", 1, false, DType::kU8},
    {"F8_E8M0", 1, false, DType::kU8},
};

const DTypeEntry* LookupDType(const std::string& name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

bool IsLittleEndianHost() {
  const uint16_t probe = 1;
  uint8_t first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF. Returns the
// offset of the first bad byte, or `size` when the whole input is valid.
size_t FirstInvalidUtf8(const uint8_t* s, size_t size) {
  size_t i = 0;
  while (i < size) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
    } else {
      return i;
    }
    if (size - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return size;
}

bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// One header entry as the SAX pass collects it; checked afterwards in Parse.
struct RawEntry {
  std::string name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> offsets;
};

using Json = nlohmann::json;

// Streams the header through nlohmann's SAX interface so that (1) duplicate keys are seen
// (the DOM parser silently keeps the last), (2) nesting is bounded at 3 while parsing, and
// (3) no DOM is built. Any violation stops the parse with `error` set.
class HeaderSax : public nlohmann::json_sax<Json> {
 public:
  explicit HeaderSax(std::string where) : where_(std::move(where)) {}

  Status error;
  std::vector<RawEntry> entries;
  std::map<std::string, std::string> metadata;

  bool null() override { return Scalar("null"); }
  bool boolean(bool) override { return Scalar("a boolean"); }
  bool number_integer(number_integer_t v) override {
    if (depth_ == 3) {
      if (v < 0) {
        return Fail("tensor '" + key1_ + "': " + key2_ + " must hold non-negative integers, got " +
                    std::to_string(v));
      }
      return PushInt(static_cast<uint64_t>(v));
    }
    return Scalar("an integer");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 3) return PushInt(v);
    return Scalar("an integer");
  }
  bool number_float(number_float_t, const string_t& text) override {
    if (depth_ == 3) {
      return Fail("tensor '" + key1_ + "': " + key2_ + " must hold non-negative integers, got " +
                  text);
    }
    return Scalar("a number");
  }
  bool string(string_t& s) override {
    if (depth_ == 2 && in_metadata_) {
      metadata[key2_] = s;
      return true;
    }
    if (depth_ == 2 && key2_ == "dtype") {
      entries.back().dtype = s;
      return true;
    }
    return Scalar("a string");
  }
  bool binary(binary_t&) override { return Scalar("binary data"); }

  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      if (key1_ == "__metadata__") {
        in_metadata_ = true;
      } else {
        in_metadata_ = false;
        entries.emplace_back();
        entries.back().name = key1_;
      }
      keys2_.clear();
      return true;
    }
    if (depth_ >= 3) {
      return Fail("tensor '" + key1_ + "': " + key2_ +
                  ": nesting deeper than 3 levels (expected an array of integers, got an object)");
    }
    return Scalar("an object");
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 2 && !in_metadata_ && (key2_ == "shape" || key2_ == "data_offsets")) {
      depth_ = 3;
      return true;
    }
    if (depth_ >= 3) {
      return Fail("tensor '" + key1_ + "': " + key2_ +
                  ": nesting deeper than 3 levels (expected an array of integers, got an array)");
    }
    return Scalar("an array");
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      if (!keys1_.insert(k).second) {
        return Fail(k == "__metadata__" ? std::string("duplicate \"__metadata__\" entry")
                                        : "duplicate tensor name '" + k + "'");
      }
      key1_ = k;
      return true;
    }
    // depth 2
    if (!keys2_.insert(k).second) {
      return Fail(in_metadata_ ? "__metadata__: duplicate key '" + k + "'"
                               : "tensor '" + key1_ + "': duplicate field '" + k + "'");
    }
    key2_ = k;
    if (in_metadata_) return true;
    RawEntry& e = entries.back();
    if (k == "dtype") {
      e.has_dtype = true;
    } else if (k == "shape") {
      e.has_shape = true;
    } else if (k == "data_offsets") {
      e.has_offsets = true;
    } else {
      return Fail("tensor '" + key1_ + "': unknown field '" + k +
                  "' (expected dtype, shape, data_offsets)");
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (error.ok()) error = FormatError(where_ + "header is not valid JSON: " + ex.what());
    return false;
  }

 private:
  // A value of the wrong kind at the current position.
  bool Scalar(const char* got) {
    switch (depth_) {
      case 0:
        return Fail(std::string("header must be a JSON object, got ") + got);
      case 1:
        return Fail(key1_ == "__metadata__"
                        ? std::string("\"__metadata__\" must be an object, got ") + got
                        : "tensor '" + key1_ + "': expected an object, got " + got);
      case 2:
        if (in_metadata_) {
          return Fail("__metadata__: value of '" + key2_ + "' must be a string, got " + got);
        }
        if (key2_ == "dtype")
          return Fail("tensor '" + key1_ + "': dtype must be a string, got " + got);
        return Fail("tensor '" + key1_ + "': " + key2_ + " must be an array of integers, got " +
                    got);
      default:
        return Fail("tensor '" + key1_ + "': " + key2_ + " must hold non-negative integers, got " +
                    got);
    }
  }
  bool PushInt(uint64_t v) {
    RawEntry& e = entries.back();
    if (key2_ == "shape") {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Fail("tensor '" + key1_ + "': shape dimension " + std::to_string(e.shape.size()) +
                    " is " + std::to_string(v) + ", expected < 2^63");
      }
      e.shape.push_back(static_cast<int64_t>(v));
    } else {
      if (e.offsets.size() >= 2) {
        return Fail("tensor '" + key1_ + "': data_offsets must hold 2 integers [begin, end], got " +
                    "more than 2");
      }
      e.offsets.push_back(v);
    }
    return true;
  }
  bool Fail(std::string message) {
    if (error.ok()) error = FormatError(where_ + message);
    return false;
  }

  std::string where_;
  int depth_ = 0;  // 1 = top-level object, 2 = tensor entry / metadata, 3 = shape/offsets array
  bool in_metadata_ = false;
  std::string key1_, key2_;
  std::unordered_set<std::string> keys1_, keys2_;
};

}  // namespace

std::string TensorInfo::ShapeString() const { return ShapeToString(shape) + " " + dtype_name; }

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

Status SafeTensorsFile::Parse(const uint8_t* data, size_t size) {
  const std::string where = "safetensors '" + path_ + "': ";
  if (size < 8) {
    return FormatError(where + "file is " + std::to_string(size) +
                       " bytes, expected at least 8 (the header length)");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    return FormatError(where + "header length is " + std::to_string(header_len) +
                       " bytes, expected at most " + std::to_string(kMaxHeaderBytes));
  }
  const uint64_t avail = size - 8;
  if (header_len > avail) {
    return FormatError(where + "header length is " + std::to_string(header_len) +
                       " bytes, but only " + std::to_string(avail) +
                       " bytes follow the 8-byte length");
  }
  const uint8_t* header = data + 8;
  const size_t hlen = static_cast<size_t>(header_len);
  if (hlen == 0 || header[0] != '{') {
    static const char kHex[] = "0123456789abcdef";
    return FormatError(
        where + "header must start with '{' (a JSON object), got " +
        (hlen == 0 ? std::string("an empty header")
         : header[0] >= 0x20 && header[0] < 0x7F
             ? std::string("'") + static_cast<char>(header[0]) + "'"
             : std::string("byte 0x") + kHex[header[0] >> 4] + kHex[header[0] & 15]));
  }
  const size_t bad = FirstInvalidUtf8(header, hlen);
  if (bad != hlen) {
    return FormatError(where + "header is not valid UTF-8 (invalid byte at header offset " +
                       std::to_string(bad) + ")");
  }

  HeaderSax sax(where);
  bool parsed = false;
  try {
    parsed = Json::sax_parse(reinterpret_cast<const char*>(header),
                             reinterpret_cast<const char*>(header) + hlen, &sax,
                             nlohmann::detail::input_format_t::json, /*strict=*/true);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(where + "out of memory while parsing the header");
  } catch (const std::exception& e) {
    return FormatError(where + "header is not valid JSON: " + e.what());
  }
  if (!sax.error.ok()) return sax.error;
  if (!parsed) return FormatError(where + "header is not valid JSON");

  const uint64_t data_size = avail - header_len;
  const uint8_t* region = header + hlen;
  std::vector<TensorInfo> tensors;
  tensors.reserve(sax.entries.size());
  for (RawEntry& e : sax.entries) {
    const std::string t = where + "tensor '" + e.name + "': ";
    if (!e.has_dtype) return FormatError(t + "missing field \"dtype\"");
    if (!e.has_shape) return FormatError(t + "missing field \"shape\"");
    if (!e.has_offsets) return FormatError(t + "missing field \"data_offsets\"");
    const DTypeEntry* dt = LookupDType(e.dtype);
    if (dt == nullptr) {
      return FormatError(t + "unknown dtype \"" + e.dtype +
                         "\" (expected one of BOOL U8 I8 I16 U16 I32 U32 I64 U64 F16 BF16 F32 "
                         "F64 C64 F8_E4M3 F8_E5M2 F8_E8M0)");
    }
    if (e.offsets.size() != 2) {
      return FormatError(t + "data_offsets must hold 2 integers [begin, end], got " +
                         std::to_string(e.offsets.size()));
    }
    // Exact element count: zero if any dimension is zero, otherwise a checked product.
    uint64_t count = 1;
    bool empty = false;
    for (int64_t d : e.shape) empty |= (d == 0);
    if (empty) {
      count = 0;
    } else {
      for (int64_t d : e.shape) {
        if (!CheckedMul(count, static_cast<uint64_t>(d), &count)) {
          return FormatError(t + "element count of shape " + ShapeToString(e.shape) +
                             " overflows 64 bits");
        }
      }
    }
    uint64_t nbytes = 0;
    if (!CheckedMul(count, dt->size, &nbytes)) {
      return FormatError(t + "byte size of shape " + ShapeToString(e.shape) + " " + e.dtype +
                         " overflows 64 bits");
    }
    const uint64_t begin = e.offsets[0], end = e.offsets[1];
    if (end < begin) {
      return FormatError(t + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         "] must be ascending (begin <= end)");
    }
    if (end - begin != nbytes) {
      return FormatError(t + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         "] span " + std::to_string(end - begin) + " bytes, expected " +
                         std::to_string(nbytes) + " for shape " + ShapeToString(e.shape) + " " +
                         e.dtype);
    }
    if (end > data_size) {
      return FormatError(t + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         "] extend beyond the data region of " + std::to_string(data_size) +
                         " bytes");
    }
    TensorInfo info;
    info.name = std::move(e.name);
    info.dtype_name = std::move(e.dtype);
    info.supported = dt->supported;
    info.dtype = dt->dtype;
    info.element_size = dt->size;
    info.shape = std::move(e.shape);
    info.num_elements = count;
    info.offset = begin;
    info.nbytes = nbytes;
    info.data = region + begin;
    tensors.push_back(std::move(info));
  }

  // The tensors must tile [0, data_size) exactly.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].offset != tensors[b].offset) return tensors[a].offset < tensors[b].offset;
    return tensors[a].nbytes < tensors[b].nbytes;
  });
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& ti = tensors[i];
    if (ti.offset < expected) {
      return FormatError(where + "tensor '" + ti.name + "' (bytes [" + std::to_string(ti.offset) +
                         ", " + std::to_string(ti.offset + ti.nbytes) + ")) overlaps tensor '" +
                         prev->name + "' which ends at " + std::to_string(expected));
    }
    if (ti.offset > expected) {
      return FormatError(where + "hole in the data region: bytes [" + std::to_string(expected) +
                         ", " + std::to_string(ti.offset) +
                         ") belong to no tensor (expected tensor '" + ti.name + "' to begin at " +
                         std::to_string(expected) + ")");
    }
    expected = ti.offset + ti.nbytes;
    prev = &ti;
  }
  if (expected != data_size) {
    return FormatError(where + "data region is " + std::to_string(data_size) +
                       " bytes but the tensors cover only " + std::to_string(expected) +
                       " (trailing bytes belong to no tensor)");
  }

  index_.clear();
  for (size_t i = 0; i < tensors.size(); ++i) index_.emplace(tensors[i].name, i);
  tensors_ = std::move(tensors);
  metadata_ = std::move(sax.metadata);
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

Status SafeTensorsFile::GetF32(const std::string& name, std::vector<float>* out) const {
  if (out == nullptr) return InvalidArgument("GetF32: out is null");
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return InvalidArgument("safetensors '" + path_ + "': no tensor named '" + name + "'");
  }
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
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return InvalidArgument("safetensors '" + path_ + "': no tensor named '" + name + "'");
  }
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
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return InvalidArgument("safetensors '" + path_ + "': no tensor named '" + name + "'");
  }
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

// ------------------------------------------------------------------------------------------
// Writer

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
