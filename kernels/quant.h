// Quantized weight matrices (AttentionConfig::weight_dtype kI8 / kI4): the packed format, the
// quantization a layer makes once at creation, and the dequantization of rows into f32 that the
// GEMM driver packs from (gemm.h, GemmQuantB). Products by the format: gemv_quant.h (a few rows
// of activations, dequantized in registers) and GemmQuantB (many rows). Plain declarations; the
// per-target dequantization is quant-inl.h, dispatched in quant.cc.
//
// Layout (internal, kernels/README.md "Quantized weights"): a matrix w [rows, cols] in nn.Linear
// layout ([out, in]: a row is one output's weights over the inputs) is two arrays,
//   codes:  rows x row_bytes bytes, row r at codes + r * row_bytes;
//   scales: rows x scales_per_row f32, row r's at scales + r * scales_per_row.
// kI8: row_bytes = cols, one signed byte (two's complement, [-127, 127]) per element, one scale
//   per row (scales_per_row 1).
// kI4: blocks of `block` (32 or 128) consecutive elements of a row, one scale each
//   (scales_per_row = ceil(cols / block)), block / 2 bytes each (row_bytes = scales_per_row *
//   block / 2): byte i of a block holds element i in its low nibble and element i + block / 2 in
//   its high nibble, each nibble code + 8 for codes in [-7, 7] (ggml's q4_0 orders a block's
//   nibbles and offsets them this way). A row's last block is padded with code 0 (nibble 8).
// Why these orders: a vector of V <= 16 consecutive elements is one load of V consecutive bytes
// (kI4: their low or their high nibbles, split at byte width, where x86 works on 16-byte
// registers, before the widening to 32 bits), a sign extension to 32 bits and a conversion; the
// scales are apart so that the codes of a row stream contiguously.
//
// The dequantized weight of element (r, p) is code * scale rounded once to f32 (exact code,
// one multiplication): every kernel reads exactly these values.
#ifndef MHA_KERNELS_QUANT_H_
#define MHA_KERNELS_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "mha/types.hpp"

namespace mha {
namespace kernels {

// kI4 blocks: the default and the other size a layer may choose (AttentionConfig::weight_block).
inline constexpr size_t kI4Block = 32;
inline constexpr size_t kI4LargeBlock = 128;

// Bytes of one row's codes and f32 scales per row of a cols-wide matrix (`block`: kI4's, ignored
// for kI8).
size_t QuantRowBytes(DType type, size_t block, size_t cols);
size_t QuantScalesPerRow(DType type, size_t block, size_t cols);

// A read-only view of a quantized matrix w [rows, cols] (the layout above).
struct QuantMatrix {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  DType type = DType::kI8;  // kI8 or kI4
  size_t block = 0;         // kI4: elements per scale (kI4Block or kI4LargeBlock); kI8: 0
  size_t rows = 0;
  size_t cols = 0;
  size_t row_bytes = 0;       // QuantRowBytes(type, block, cols)
  size_t scales_per_row = 0;  // QuantScalesPerRow(type, block, cols)

  bool empty() const { return codes == nullptr; }
  // Rows [r0, r0 + n) (r0 + n <= rows).
  QuantMatrix Rows(size_t r0, size_t n) const {
    return {codes + r0 * row_bytes, scales + r0 * scales_per_row, type, block, n, cols, row_bytes,
            scales_per_row};
  }
};

// Codes from their bytes: a kI8 byte, the low and the high nibble of a kI4 byte (code + 8), and
// the code of element p of one row's codes.
inline int I8Code(uint8_t byte) { return static_cast<int8_t>(byte); }
inline int I4LowCode(uint8_t byte) { return (byte & 0xF) - 8; }
inline int I4HighCode(uint8_t byte) { return (byte >> 4) - 8; }
inline int RowCode(const uint8_t* row, DType type, size_t block, size_t p) {
  if (type != DType::kI4) return I8Code(row[p]);
  const size_t half = block / 2, in_block = p % block;
  const uint8_t byte = row[p / block * half + in_block % half];
  return in_block < half ? I4LowCode(byte) : I4HighCode(byte);
}

// Quantizes one row of n finite f32 values into `codes` (QuantRowBytes bytes) and `scales`
// (QuantScalesPerRow floats), symmetrically: per group (kI8: the row, kI4: each block) scale =
// max|w| / 127 (kI8) or / 7 (kI4), rounded to f32; code = the integer nearest to w / scale (the
// quotient in double, ties to even), clamped to [-127, 127] / [-7, 7]; a group of zeros (or
// whose scale underflows to 0) gets scale 0 and zero codes. Scalar, so every CPU and target
// stores the same bytes. Then |w - code * scale| <= scale / 2 in exact arithmetic (the clamp
// never binds unless max|w| / 127 or / 7 is subnormal).
void QuantizeRow(const float* w, size_t n, DType type, size_t block, uint8_t* codes, float* scales);

// The code of element (r, p) of w, and its dequantized weight (code * scale, rounded to f32).
int QuantCode(const QuantMatrix& w, size_t r, size_t p);
float DequantizedWeight(const QuantMatrix& w, size_t r, size_t p);

// Writes the dequantized weights of elements [p0, p0 + n) of rows [r0, r0 + rows) of w into
// dst, row i at dst + i * ld (n <= ld). Any p0 (vectors where a block's half allows, element by
// element elsewhere); the values are DequantizedWeight's on every target.
void DequantizeRows(const QuantMatrix& w, size_t r0, size_t rows, size_t p0, size_t n, float* dst,
                    size_t ld);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_QUANT_H_
