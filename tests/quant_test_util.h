// Quantized weight matrices for the kernel tests (quant_test.cc, gemv_int8_test.cc): the
// formats and a matrix quantized into storage of its own, optionally misaligned and padded.
#ifndef MHA_TESTS_QUANT_TEST_UTIL_H_
#define MHA_TESTS_QUANT_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace mha {
namespace kernels {

// One quantization format: a dtype and its block.
struct Format {
  DType type;
  size_t block;
  std::string Name() const { return type == DType::kI8 ? "i8" : "i4/" + std::to_string(block); }
};
inline const Format kFormats[] = {
    {DType::kI8, 0}, {DType::kI4, kI4Block}, {DType::kI4, kI4LargeBlock}};

// A quantized matrix in its own storage: codes and scales `offset` bytes / floats into their
// buffers (misaligned when odd), rows `row_pad` bytes apart beyond QuantRowBytes.
struct QuantStorage {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  QuantMatrix m;
};

inline QuantStorage Quantize(const std::vector<float>& w, size_t rows, size_t cols, const Format& f,
                             size_t offset = 0, size_t row_pad = 0) {
  QuantStorage q;
  const size_t row_bytes = QuantRowBytes(f.type, f.block, cols) + row_pad;
  const size_t spr = QuantScalesPerRow(f.type, f.block, cols);
  q.codes.assign(offset + rows * row_bytes + 8, 0xA5);
  q.scales.assign(offset + rows * spr + 2, -1.0f);
  for (size_t r = 0; r < rows; ++r) {
    QuantizeRow(w.data() + r * cols, cols, f.type, f.block, q.codes.data() + offset + r * row_bytes,
                q.scales.data() + offset + r * spr);
  }
  q.m = {q.codes.data() + offset,
         q.scales.data() + offset,
         f.type,
         f.block,
         rows,
         cols,
         row_bytes,
         spr};
  return q;
}

}  // namespace kernels
}  // namespace mha

#endif  // MHA_TESTS_QUANT_TEST_UTIL_H_
