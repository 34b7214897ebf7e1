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
// kI4: one scale per block of `block` (32 or 128) consecutive elements of a row (scales_per_row
//   = ceil(cols / block)); the codes in groups of kI4Group (128) consecutive elements,
//   kI4GroupBytes (64) bytes each (row_bytes = ceil(cols / 128) * 64), read as 16 little-endian
//   32-bit words: nibble s (bits 4s..4s+3, s = 0..7) of word k (k = 0..15) holds element 16 * s + k
//   of the group, as code + 8 for codes in [-7, 7]. In bytes: element e of a group lies in byte 4 *
//   (e % 16) + e / 32, its low nibble when e / 16 is even, else its high one (I4Byte). A 32-block
//   is nibbles 2b and 2b + 1 of a group's words (b = 0..3); a 128-block is a group. A row's last
//   group is padded with code 0 (nibble 8).
// Why these orders: a vector of V <= 16 consecutive elements is one load of V consecutive bytes
// (kI8, then sign-extended to 32 bits) or of V consecutive words (kI4: elements 16s + k0 ..
// 16s + k0 + V - 1 are nibble s of words k0 .. k0 + V - 1). A kI4 vector needs no widening
// shuffle: a 32-bit shift right by 4s puts each element's nibble in its lane's low 4 bits (an
// index into a 16-entry table, or, masked and or-ed into the bits of 2^23, the f32 2^23 +
// nibble). Successive vectors of a group are consecutive elements, so products walk k in
// increasing order as the f32 kernels do. The scales are apart so that the codes of a row
// stream contiguously.
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
// kI4 code groups: elements and bytes (the layout above).
inline constexpr size_t kI4Group = 128;
inline constexpr size_t kI4GroupBytes = kI4Group / 2;

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
  // Compute::kInt8: products by this matrix quantize their activations to int8 (gemv_int8.h)
  // instead of dequantizing the weights to f32 (GemmQuantB routes by it).
  bool int8_activations = false;
  // Compute::kBF16: products of more than kGemvMaxRows rows multiply bf16(a) by bf16 of the
  // dequantized weights (gemm_bf16_quant.h; the runtime routes by it, GemmQuantB ignores it).
  bool bf16_products = false;

  bool empty() const { return codes == nullptr; }
  // Rows [r0, r0 + n) (r0 + n <= rows).
  QuantMatrix Rows(size_t r0, size_t n) const {
    return {codes + r0 * row_bytes,
            scales + r0 * scales_per_row,
            type,
            block,
            n,
            cols,
            row_bytes,
            scales_per_row,
            int8_activations,
            bf16_products};
  }
};

// Codes from their bytes: a kI8 byte; the byte of element p of a kI4 row and the code of that
// element; the code of element p of one row's codes.
inline int I8Code(uint8_t byte) { return static_cast<int8_t>(byte); }
inline size_t I4Byte(size_t p) {
  return p / kI4Group * kI4GroupBytes + p % 16 * 4 + p % kI4Group / 32;
}
inline int I4Code(const uint8_t* row, size_t p) {
  const uint8_t byte = row[I4Byte(p)];
  return (p / 16 % 2 == 0 ? byte & 0xF : byte >> 4) - 8;
}
inline int RowCode(const uint8_t* row, DType type, size_t p) {
  return type == DType::kI4 ? I4Code(row, p) : I8Code(row[p]);
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
// dst, row i at dst + i * ld (n <= ld). Any p0 (vectors within each 16 elements of a kI4
// group, element by element elsewhere); the values are DequantizedWeight's on every target.
void DequantizeRows(const QuantMatrix& w, size_t r0, size_t rows, size_t p0, size_t n, float* dst,
                    size_t ld);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_QUANT_H_
