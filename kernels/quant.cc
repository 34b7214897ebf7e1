// Quantized weights (quant.h): the scalar quantization and element access, and the dispatch of
// the per-target dequantization (quant-inl.h, compiled once per Highway target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quant.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/quant-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <cassert>
#include <cmath>

#include "kernels/quant.h"

namespace mha {
namespace kernels {

HWY_EXPORT(DequantizeRowsImpl);

size_t QuantRowBytes(DType type, size_t block, size_t cols) {
  (void)block;
  return type == DType::kI8 ? cols : (cols + kI4Group - 1) / kI4Group * kI4GroupBytes;
}

size_t QuantScalesPerRow(DType type, size_t block, size_t cols) {
  return type == DType::kI8 ? 1 : (cols + block - 1) / block;
}

namespace {

// The scale of a group of n values: max|w| / qmax, rounded to f32.
float GroupScale(const float* w, size_t n, int qmax) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  return amax / static_cast<float>(qmax);
}

// The code of x at `scale`: the integer nearest to x / scale, ties to even, in [-qmax, qmax].
// The quotient in double is exact to 2^-53 relative, far finer than any distance between a
// quotient of two floats (24-bit significands) and a half-integer it is not equal to, so the
// rounding is that of the exact quotient.
int Code(float x, float scale, int qmax) {
  if (!(scale > 0.0f)) return 0;
  const double q = std::nearbyint(static_cast<double>(x) / static_cast<double>(scale));
  return static_cast<int>(std::min<double>(qmax, std::max<double>(-qmax, q)));
}

}  // namespace

void QuantizeRow(const float* w, size_t n, DType type, size_t block, uint8_t* codes,
                 float* scales) {
  assert((type == DType::kI8 || type == DType::kI4) && "QuantizeRow: kI8 or kI4");
  if (type == DType::kI8) {
    scales[0] = GroupScale(w, n, 127);
    for (size_t i = 0; i < n; ++i) {
      codes[i] = static_cast<uint8_t>(static_cast<int8_t>(Code(w[i], scales[0], 127)));
    }
    return;
  }
  assert((block == kI4Block || block == kI4LargeBlock) && "QuantizeRow: kI4 block 32 or 128");
  for (size_t b0 = 0; b0 < n; b0 += block) {
    scales[b0 / block] = GroupScale(w + b0, std::min(block, n - b0), 7);
  }
  // Group by group: nibble s of word k holds element 16 s + k as code + 8, the word stored
  // little-endian; past the row's end (its last group's padding) the code is 0.
  for (size_t g0 = 0; g0 < n; g0 += kI4Group) {
    uint8_t* dst = codes + g0 / 2;
    for (size_t k = 0; k < 16; ++k) {
      uint32_t word = 0;
      for (size_t s = 0; s < 8; ++s) {
        const size_t p = g0 + 16 * s + k;
        const int code = p < n ? Code(w[p], scales[p / block], 7) : 0;
        word |= static_cast<uint32_t>(code + 8) << (4 * s);
      }
      for (size_t j = 0; j < 4; ++j) dst[4 * k + j] = static_cast<uint8_t>(word >> (8 * j));
    }
  }
}

int QuantCode(const QuantMatrix& w, size_t r, size_t p) {
  return RowCode(w.codes + r * w.row_bytes, w.type, p);
}

float DequantizedWeight(const QuantMatrix& w, size_t r, size_t p) {
  const float scale = w.scales[r * w.scales_per_row + (w.type == DType::kI8 ? 0 : p / w.block)];
  return static_cast<float>(QuantCode(w, r, p)) * scale;
}

void DequantizeRows(const QuantMatrix& w, size_t r0, size_t rows, size_t p0, size_t n, float* dst,
                    size_t ld) {
  assert(r0 + rows <= w.rows && p0 + n <= w.cols && n <= ld && "DequantizeRows: out of range");
  if (rows == 0 || n == 0) return;
  HWY_DYNAMIC_DISPATCH(DequantizeRowsImpl)
  (w.codes, w.scales, w.type, w.block, w.row_bytes, w.scales_per_row, r0, rows, p0, n, dst, ld);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
