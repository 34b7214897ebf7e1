// Rotary position embedding (RoPE) and RMSNorm over rows of projected q or k (plain
// declarations; per-target code in rope-inl.h, dispatch in rope.cc).
//
// Layout: `rows` rows, row r at x + r * row_stride (elements), each holding `heads` heads of
// head_dim f32 values back to back (head h at x + r * row_stride + h * head_dim).
#ifndef MHA_KERNELS_ROPE_H_
#define MHA_KERNELS_ROPE_H_

#include <cstddef>
#include <cstdint>

namespace mha {
namespace kernels {

// The cos and sin of row r's angles: angle_i = positions[r] * inv_freq[i] for i < half
// (positions null: pos0 + r), formed in double, its cos and sin taken in double (libm, whose
// argument reduction modulo 2 pi is exact) and multiplied by `attention` in double, then
// rounded to f32: within one f32 rounding of the exact values plus |angle| * 2^-52 (the
// product's rounding; 2.3e-10 rad at 2^20 * 1.0), and the same on every target. cos and sin
// are [rows, half] dense. inv_freq[i] = theta^(-2i / rotary_dim) / rope_scale, or a RoPE
// scaling's (runtime/rope_scaling.h), whose attention factor is `attention` (1: unscaled, the
// same bits as without it).
void RopeAngles(const int32_t* positions, int64_t pos0, size_t rows, const double* inv_freq,
                size_t half, float* cos, float* sin, double attention = 1.0);

// Rotates the first rotary_dim (= 2 * half) components of every head of every row in place,
// with row r's cos/sin [half] at cos + r * half: for each pair (a, b),
//   a' = a * c - b * s,  b' = b * c + a * s   (f32, each product rounded, no FMA).
// interleaved false (neox): pairs (x_i, x_{i + half}); true (gptj): pairs (x_{2i}, x_{2i+1}).
// Components >= rotary_dim are left as they are. Bitwise the same on every target.
void ApplyRope(float* x, size_t rows, ptrdiff_t row_stride, size_t heads, size_t head_dim,
               size_t rotary_dim, bool interleaved, const float* cos, const float* sin);

// RMSNorm in place: each row holds `groups` groups of `group_size` values; every group becomes
// (x * f) * weight, f = 1 / sqrt(mean(x^2) + eps) computed in double (sum of exact squares)
// and rounded to f32 once per group; each product rounded in f32. Bitwise the same on every
// target. weight [group_size] (the same for every group). An all-zero group with eps 0 gives NaN.
void RmsNormRows(float* x, size_t rows, ptrdiff_t row_stride, size_t groups, size_t group_size,
                 const float* weight, float eps);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_ROPE_H_
