// The tools' spelling of a layer's weight storage (--weights-dtype): f32, bf16, f16, and the
// quantized i8 and i4 (block 32) or i4-128 (AttentionConfig::weight_dtype and weight_block).
#ifndef MHA_TOOLS_WEIGHTS_DTYPE_H_
#define MHA_TOOLS_WEIGHTS_DTYPE_H_

#include <cstdint>
#include <string>

#include "mha/types.hpp"

namespace mha {

// The accepted names, for usage and error messages.
inline const char* WeightsDtypeNames() { return "f32, bf16, f16, i8, i4 or i4-128"; }

// Parses `text` into a weight dtype and kI4 block (0: the default, 32); false if unknown.
inline bool ParseWeightsDtype(const std::string& text, DType* dtype, int64_t* block) {
  *block = 0;
  if (text == "f32") {
    *dtype = DType::kF32;
  } else if (text == "bf16") {
    *dtype = DType::kBF16;
  } else if (text == "f16") {
    *dtype = DType::kF16;
  } else if (text == "i8") {
    *dtype = DType::kI8;
  } else if (text == "i4" || text == "i4-128") {
    *dtype = DType::kI4;
    *block = text == "i4" ? 0 : 128;
  } else {
    return false;
  }
  return true;
}

// The name ParseWeightsDtype reads back.
inline std::string WeightsDtypeName(DType dtype, int64_t block) {
  return dtype == DType::kI4 && block == 128 ? "i4-128" : DTypeName(dtype);
}

}  // namespace mha

#endif  // MHA_TOOLS_WEIGHTS_DTYPE_H_
