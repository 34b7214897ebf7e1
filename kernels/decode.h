// Decode kernels: the two products of attention over a key/value cache whose rows are stored as
// f32, bf16, f16 or int8 codes with a per-row f32 scale, read directly (each element is widened
// exactly to f32 in registers; all arithmetic is f32). Plain declarations; per-target code in
// decode-inl.h, dispatch in decode.cc.
//
// Why not the BLIS GEMM: decoding one token multiplies a few query rows (the query heads that
// share a key/value head, times the new tokens) by long K and V blocks, so it is bound by
// memory bandwidth, not arithmetic; reading 16-bit rows halves the bytes, and GEMM would need
// them converted to f32 first.
//
// Layout: `rows` query/probability rows (row r at q + r * q_stride, elements) against `n`
// cache rows of `hd` elements (row j at cache + j * cache_stride elements of `type`). Pointers
// need no alignment.
//
// Numerics: a score is computed by the same sequence of operations wherever it sits in the block
// (any rows, any n), so scores do not depend on how a caller splits rows or keys; a weighted sum
// depends on the rows and n of the call (its summation order below), never on anything else.
// Both may differ between SIMD targets (lane count changes the summation order).
// - QueryKeyScores: lane-wise multiply-adds (fused where the target has FMA) over hd in
//   increasing order, then a sum over lanes (on x86: a fixed tree, pairs of lanes within each
//   128-bit block, then the blocks pairwise), then the hd % lanes remaining products added in
//   order. bf16 rows whose hd is a multiple of 2 x lanes are read as 32-bit pairs instead: per
//   block of 2 x lanes elements, lane i adds the products of elements 2i, then 2i + 1 (the
//   same tree follows). Error against the exact dot product of the f32 values:
//   <= 2 * (hd + 4) * 2^-24 * sum_d |q_d k_d|.
// - AccumulateWeightedValues: acc[d] + sum_j p_j v_jd by multiply-adds, one running sum, in an
//   order fixed by n alone: with m = n / 4, rows i, m + i, 2m + i, 3m + i for i = 0 .. m - 1,
//   then rows 4m .. n - 1 (the kernels read four streams of rows at once: memory bandwidth).
//   Error <= 2 * (n + 1) * 2^-24 * (|acc_d| + sum_j |p_j v_jd|).
// Tested on every target against a double reference in tests/decode_test.cc.
#ifndef MHA_KERNELS_DECODE_H_
#define MHA_KERNELS_DECODE_H_

#include <cstddef>
#include <cstdint>

#include "mha/types.hpp"

namespace mha {
namespace kernels {

// scores[r * score_stride + j] = sum_{d < hd} q[r * q_stride + d] * key_j[d], r < rows, j < n.
// `type`: DType::kF32, kBF16, kF16 or kI8. kI8 rows hold codes: key_j[d] = key_scales[j] * code_jd,
// and the scale multiplies the dot product of the codes (one more rounding); key_scales is ignored
// for the other types.
void QueryKeyScores(const float* q, size_t rows, ptrdiff_t q_stride, const void* keys, DType type,
                    ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                    float* scores, ptrdiff_t score_stride);

// acc[r * acc_stride + d] += sum_{j < n} p[r * p_stride + j] * value_j[d], r < rows, d < hd.
// kI8 rows: value_j[d] = value_scales[j] * code_jd, applied as the weight p_j * value_scales[j]
// (one more rounding per term); value_scales is ignored for the other types.
void AccumulateWeightedValues(const float* p, size_t rows, ptrdiff_t p_stride, const void* values,
                              DType type, ptrdiff_t value_stride, const float* value_scales,
                              size_t n, size_t hd, float* acc, ptrdiff_t acc_stride);

// Software prefetch of f32 cache rows (the four streams' rows kPrefetchBytes ahead,
// decode-inl.h) on top of the hardware prefetchers; 16-bit and int8 rows are always prefetched.
// A hint: the results are bitwise the same either way (tested); only the read rate differs, and
// by CPU family. Measured (bench/decode_bench BM_DecodePrefetch, bench/README.md "Decode
// prefetch"): on f32 rows it raised the attention's read rate on the Intel Xeon (AMX) VM and
// lowered it on the AMD Zen 4 VM, where steps over f32 caches beyond the L3 ran 5-10% faster
// without it (16-bit and int8 rows: 0-6% faster with it there too). kAuto: this CPU's choice
// (DecodePrefetchOnThisCpu). Process-wide, for every later kernel call; benchmarks and tests set
// it, a library user never needs to.
enum class DecodePrefetch { kAuto, kOff, kOn };
void SetDecodePrefetch(DecodePrefetch mode);
// Whether the kernels prefetch f32 rows now (the setting, kAuto resolved).
bool DecodePrefetchActive();
// kAuto's choice: the environment's MHA_DECODE_PREFETCH (on or off; anything else is ignored
// with a message on stderr), read once; else on where the CPU has AMX (the family it was
// measured to help: an ISA bit that tells the two families measured apart, never a CPU name),
// else off.
bool DecodePrefetchOnThisCpu();

// The int8 rows the kernels above read: symmetric codes of one row of hd f32 values x with one
// f32 scale, scale = max_d |x_d| / 127 and codes[d] = round_half_even(x_d * (127 / max_d |x_d|))
// in [-127, 127], so code_d * scale is within scale / 2 (plus the f32 roundings of the two
// quotients) of x_d. A zero row gets scale 0 and codes 0; a row with a NaN gets a NaN scale (the
// NaN reaches the scores and sums that read the row, as an f32 cache's would) and codes 0 where
// x_d is NaN. Scalar code: every target stores the same bytes.
void QuantizeRowI8(const float* x, size_t hd, int8_t* codes, float* scale);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_DECODE_H_
