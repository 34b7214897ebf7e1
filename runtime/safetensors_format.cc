// The safetensors header: the dtype table, strict UTF-8, and the streaming parse and validation
// of SafeTensorsFile::Parse (rules in runtime/safetensors.h).
#include "runtime/safetensors_format.h"

#include <algorithm>
#include <limits>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/safetensors.h"

namespace mha {
namespace safetensors {

// Every whole-byte safetensors dtype. Sub-byte types (F4, F6_*) are not listed: their byte size
// is not elements * size and mha has no use for them.
constexpr DTypeEntry kDTypes[] = {
    {"F32", 4, true, DType::kF32},     {"F16", 2, true, DType::kF16},
    {"BF16", 2, true, DType::kBF16},   {"BOOL", 1, true, DType::kBool},
    {"U8", 1, true, DType::kU8},       {"I8", 1, false, DType::kU8},
    {"I16", 2, false, DType::kU8},     {"U16", 2, false, DType::kU8},
    {"I32", 4, true, DType::kI32},     {"U32", 4, false, DType::kU8},
    {"I64", 8, true, DType::kI64},     {"U64", 8, false, DType::kU8},
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

}  // namespace safetensors

namespace {

using safetensors::CheckedMul;
using safetensors::DTypeEntry;
using safetensors::FirstInvalidUtf8;
using safetensors::LookupDType;
using safetensors::ShapeToString;

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

}  // namespace mha
