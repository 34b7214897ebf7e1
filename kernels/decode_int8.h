// Decode kernels with integer dot products over an int8 cache (KvCacheOptions::int8_attention):
// the two products of decode.h, for kI8 rows only, with the query rows and the softmax's
// probabilities quantized as the call runs, so that both products are sums of 8-bit integer
// products (AVX512_VNNI VPDPBUSD where the CPU has it). An opt-in change of numerics: the f32
// kernels of decode.h stay the default.
//
// Why: with f32 arithmetic a grouped-query layer's int8 cache is bound by multiply-adds, not by
// memory: G query rows share each cached row, so every cached byte costs G multiply-adds for the
// scores and G for the sums (bench/README.md "Where the grouped-query int8 step's time goes").
// VPDPBUSD does 64 such products per instruction instead of 16.
//
// Layout: as decode.h's (`rows` f32 rows at q / p + r * stride; `n` int8 rows of `hd` codes at
// keys / values + j * stride bytes, their f32 scales at key_scales / value_scales + j). Pointers
// need no alignment; hd <= kDotMaxHeadDim.
//
// Definition (every kernel gives these bits: integer sums are exact, and the f32 operations
// around them are the same, in the same order, on every kernel and target):
// - QueryKeyScoresDot: each query row r is quantized by QuantizeRowI8 (decode.h) to codes
//   qc_rd and a scale qs_r; score_rj = (float(sum_d qc_rd * kc_jd) * key_scales[j]) * qs_r, two
//   f32 multiplications in that order. Error against the exact dot product of the f32 query with the
//   cached row (code * scale): |q_rd - qc_rd qs_r| <= qs_r / 2 per element, so
//   <= qs_r / 2 * sum_d |k_jd| + 2 ulp.
// - AccumulateWeightedValuesDot: per row r, the call's positions in blocks of kDotValueBlock
//   (from j = 0; the last block may be shorter). In a block, w_j = p_rj * value_scales[j] (f32);
//   m = the block's largest w_j; the weights' codes are c_j = round_half_even(w_j * (255 / m))
//   clamped to [0, 255] with scale m / 255 (m below 2^-100: codes 0, scale 0; a NaN or infinite
//   w_j in the block: codes 0, scale NaN, so the row's sums become NaN as an f32 cache's would).
//   Then acc_rd = acc_rd + float(sum_j c_j * vc_jd) * (m / 255), a multiplication then an
//   addition, block after block. p must be >= 0 (probabilities; negative weights count as 0).
//   Error: each weight within m / 510 of w_j (m: its block's largest, at most the block's
//   largest p times its largest value scale), so acc_rd moves by at most
//   sum_j (m_j / 510) * |vc_jd| (vc: the codes; 1/510 of the block's largest term per term); the
//   outputs' error is measured in README "Incremental decoding (KV cache)".
// The portable kernel runs decode.h's f32 kernels on the codes (exact: every product and partial
// sum is an integer below 2^24) on every Highway target: their scores' speed, and sums about
// twice as slow (per block of 32 positions: a call, the weights' quantization, the scaling).
// Tested against a scalar transcription of this definition on every kernel, bit for bit, in
// tests/decode_int8_test.cc.
#ifndef MHA_KERNELS_DECODE_INT8_H_
#define MHA_KERNELS_DECODE_INT8_H_

#include <cstddef>
#include <cstdint>

namespace mha {
namespace kernels {

// The integer sums stay below 2^24 (a dot product of query and key codes <= 1024 * 127 * 127),
// so the portable kernel's f32-exact arithmetic and VPDPBUSD's int32 sums agree; the kernels'
// stack buffers hold four quantized query rows of this many codes.
inline constexpr size_t kDotMaxHeadDim = 1024;
// Positions per quantization block of the probabilities: 32 keeps each weight's error at 1/510
// of a local maximum while the per-block f32 work (one scale, hd multiply-adds) stays small
// beside 32 * hd integer products.
inline constexpr size_t kDotValueBlock = 32;

// kAuto: the VNNI kernel where the CPU has AVX512_VNNI and the dispatched Highway target is an
// AVX-512 one (AVX3 on Cascade Lake, AVX3_DL on Ice Lake, Sapphire Rapids, Zen 4; so
// MHA_TARGETS=AVX2 runs the portable one on any CPU), else the portable kernel (decode.h's f32
// kernels on the codes). Both give the same bits.
enum class DecodeDotKernel { kAuto, kPortable, kAvx512Vnni };
bool DecodeDotKernelAvailable(DecodeDotKernel kernel);
const char* DecodeDotKernelName(DecodeDotKernel kernel);
// The kernel kAuto runs on this CPU and dispatched target (never kAuto).
DecodeDotKernel DecodeDotActiveKernel();

// scores[r * score_stride + j] for r < rows, j < n, by the definition above.
void QueryKeyScoresDot(DecodeDotKernel kernel, const float* q, size_t rows, ptrdiff_t q_stride,
                       const int8_t* keys, ptrdiff_t key_stride, const float* key_scales, size_t n,
                       size_t hd, float* scores, ptrdiff_t score_stride);

// acc[r * acc_stride + d] for r < rows, d < hd, by the definition above.
void AccumulateWeightedValuesDot(DecodeDotKernel kernel, const float* p, size_t rows,
                                 ptrdiff_t p_stride, const int8_t* values, ptrdiff_t value_stride,
                                 const float* value_scales, size_t n, size_t hd, float* acc,
                                 ptrdiff_t acc_stride);

// The block quantization of the definition, as the portable kernel runs it (the VNNI kernel has
// its own vector form of the same operations): codes[i] (as f32: integers 0..255) and *scale for
// the `count` <= kDotValueBlock weights w_i = p[i] * value_scales[i]; codes[count..kDotValueBlock)
// are set to 0. codes: kDotValueBlock floats, aligned to 64 bytes.
void QuantizeWeightsBlock(const float* p, const float* value_scales, size_t count, float* codes,
                          float* scale);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_DECODE_INT8_H_
