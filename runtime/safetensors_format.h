// The safetensors format's rules that the reader (runtime/safetensors_format.cc parses and
// validates a header) and the writer (runtime/safetensors_writer.cc) share: the dtype table,
// strict UTF-8 and checked byte counts. Internal; the format itself is in runtime/safetensors.h.
#ifndef MHA_RUNTIME_SAFETENSORS_FORMAT_H_
#define MHA_RUNTIME_SAFETENSORS_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mha/types.hpp"

namespace mha {
namespace safetensors {

struct DTypeEntry {
  const char* name;  // as written in the header: "F32", "BF16", ...
  size_t size;       // bytes per element
  bool supported;    // maps to `dtype`
  DType dtype;
};

// The whole-byte dtype named `name`, or nullptr.
const DTypeEntry* LookupDType(const std::string& name);
// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF. Returns the
// offset of the first bad byte, or `size` when the whole input is valid.
size_t FirstInvalidUtf8(const uint8_t* s, size_t size);
// *out = a * b; false (and *out untouched) when the product overflows 64 bits.
bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out);
// "[2, 3]".
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace safetensors
}  // namespace mha

#endif  // MHA_RUNTIME_SAFETENSORS_FORMAT_H_
