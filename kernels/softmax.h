// Softmax kernels for attention scores (plain declarations; per-target code in softmax-inl.h,
// dispatch in softmax.cc).
//
// Layout: a block of `rows` rows of `cols` f32 scores, row r at scores + r * row_stride
// (elements). Masks are per-row pointers with their own row strides; a row stride of 0
// broadcasts one mask row to every row.
//
// Semantics, for each row r and column j < cols, with d = q_pos[r] - k_pos[j] (or the index
// distance causal_offset + r - j without positions):
//   y_j = x_j * scale; y_j = softcap * tanh(y_j / softcap) (softcap > 0); y_j -= alibi_slope *
//         |d|; y_j += each additive mask; then y_j = -inf if any boolean mask is nonzero at j
//         (true = masked out, as nn.MultiheadAttention), j is beyond the causal limit, or the
//         window hides j (see SoftmaxMasks);
//   p_j = exp(y_j - m) / (sum_j exp(y_j - m) + exp(sink - m)), m = max(max_j y_j, sink)
//         (sink -inf, the default: the plain softmax).
// y is formed in f32, rounded after the multiply, the division, tanh, the product slope * |d|
// (|d| converted to f32) and each addition or subtraction (no FMA), the same on every target
// except tanh (see Accuracy).
// Special values:
// - A row with no unmasked entry (every y_j == -inf) yields all zeros, never NaN, whatever the
//   sink.
// - A NaN or +inf sink makes each row with an unmasked entry NaN (exp(inf - inf), as PyTorch).
// - With softcap, +-inf scores become +-softcap (tanh saturates) before the masks.
// - NaN in x or in an additive mask (at an unmasked position), or a +inf y_j (exp(inf - inf),
//   as PyTorch), makes the visible columns of its row NaN; other rows are unaffected. NaN or
//   +inf at a bool-masked position is ignored. -inf behaves as a masked entry (p_j = 0).
// - Columns outside VisibleColumns(r) (the causal limit, and the window with index positions)
//   are written as 0 and never read.
//
// Accuracy (SoftmaxRows): exp is ExpNonPositiveRow's (max error 2 ULP, see below); the row sum
// is accumulated in f32 partial sums of at most 16 additions folded into a double. Against the
// exact softmax of the f32 y above, each output satisfies
//   |p_j - exact_j| <= exact_j * (2e-6 + 2^-23 * (d_j + E[d])) + 1e-37,
// where d_j = max - y_j and E[d] = sum_k exact_k d_k: 2e-6 bounds the kernel's own roundings
// (about 1.8e-6 worst case), and the 2^-23 term is the conditioning of rounding y_j - max to f32
// (it matters only for scores of large magnitude, e.g. 1e4). Tested in tests/softmax_test.cc on
// every target, where the largest observed error is about a quarter of this bound.
// Softcap: tanh is Highway's hn::Tanh (4 ULP by its documentation), so a capped score differs
// from softcap * tanh(fl(x * scale) / softcap) by at most 2^-20 * softcap (tanh, the division
// and the product) and may differ between targets by a few ULP; p_j gains a relative error of at
// most 2^-19 * softcap (1e-4 at softcap 50), tested with the rest. The sink's exp is computed in
// double.
#ifndef MHA_KERNELS_SOFTMAX_H_
#define MHA_KERNELS_SOFTMAX_H_

#include <cstddef>
#include <cstdint>
#include <limits>

namespace mha {
namespace kernels {

// A logit that never contributes: a masked score, an absent sink, an empty row's maximum.
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Masks applied to a block of score rows. Every pointer may be null (absent).
struct SoftmaxMasks {
  // Up to two additive f32 masks (attn_mask and key_padding_mask, say), each [rows, cols] with
  // its own row stride in elements (0 = the same row for all rows).
  const float* add[2] = {nullptr, nullptr};
  ptrdiff_t add_row_stride[2] = {0, 0};
  // Up to two boolean masks, one byte per column, nonzero = masked out.
  const uint8_t* masked[2] = {nullptr, nullptr};
  ptrdiff_t masked_row_stride[2] = {0, 0};
  // Causal limit: when causal is true, row r keeps only columns j < causal_offset + r + 1
  // (clamped to [0, cols]). For a query block starting at query index q0 over keys starting at
  // key index k0, causal_offset = q0 - k0. It is also the index positions' offset: without
  // q_pos/k_pos below, the position distance of (r, j) is d = causal_offset + r - j.
  bool causal = false;
  int64_t causal_offset = 0;

  // Attention variants (AttentionConfig). Order per element: y = x * scale; softcap; ALiBi;
  // additive masks; then bool masks, causal and window give -inf. Positions must lie in
  // [0, 2^31) (index distances are clamped to int32), so |d| < 2^31.
  float softcap = 0.0f;      // > 0: y = softcap * tanh(y / softcap)
  float alibi_slope = 0.0f;  // y -= alibi_slope * |d| (d as f32, exact below 2^24)
  // > 0: visible iff 0 <= d < window when causal is set, |d| < window otherwise. With index
  // positions this is a column range per row (VisibleColumns): the kernels start there.
  int64_t window = 0;
  // Explicit positions (both or neither): d = q_pos[r] - k_pos[j]. Null: index positions above.
  const int32_t* q_pos = nullptr;  // [rows]
  const int32_t* k_pos = nullptr;  // [cols]
  // SoftmaxRows only: one more logit per row whose value vector is zero (attention sinks); the
  // row's p_j sum to 1 - exp(sink - m) / sum. -inf = none. OnlineSoftmaxUpdate ignores it: the
  // online recurrence takes a sink as its initial state instead (see there).
  float sink = kNegInf;
};

// Columns [begin, end) of row r that the index predicates leave visible: the causal limit and,
// with index positions (q_pos null), the window (causal: begin = clamp(causal_offset + r -
// window + 1, 0, cols); non-causal also end = clamp(causal_offset + r + window, 0, cols)).
// SoftmaxRows and OnlineSoftmaxUpdate write the columns outside it as 0 and never read them, so
// a caller need not compute their scores. Computed without int64 overflow for any offset.
struct ColumnRange {
  size_t begin;
  size_t end;
};

namespace softmax_internal {

// a + b, saturated to the int64 range.
inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

inline size_t ClampColumn(int64_t c, size_t cols) {
  if (c <= 0) return 0;
  return static_cast<uint64_t>(c) >= cols ? cols : static_cast<size_t>(c);
}

}  // namespace softmax_internal

inline ColumnRange VisibleColumns(const SoftmaxMasks& m, size_t r, size_t cols) {
  using softmax_internal::ClampColumn;
  using softmax_internal::SaturatingAdd;
  const int64_t ri = static_cast<int64_t>(r);
  ColumnRange c = {0, cols};
  // Causal: j <= causal_offset + r.
  if (m.causal) c.end = ClampColumn(SaturatingAdd(m.causal_offset, ri + 1), cols);
  if (m.window > 0 && m.q_pos == nullptr) {
    // d = causal_offset + r - j < window  <=>  j >= causal_offset + r + 1 - window (no overflow:
    // ri + 1 >= 1 and window > 0).
    c.begin = ClampColumn(SaturatingAdd(m.causal_offset, ri + 1 - m.window), cols);
    // Non-causal: also d > -window  <=>  j < causal_offset + r + window.
    if (!m.causal) {
      c.end = ClampColumn(SaturatingAdd(SaturatingAdd(m.causal_offset, ri), m.window), cols);
    }
    if (c.begin > c.end) c.begin = c.end;
  }
  return c;
}

// Headroom of the online softmax's reference over the scores it exponentiates (see
// OnlineSoftmaxUpdate): p_j <= exp(kOnlineSoftmaxHeadroom) ~= 2981.
constexpr float kOnlineSoftmaxHeadroom = 8.0f;

// y[i] = exp(x[i]) for n values x[i] <= kOnlineSoftmaxHeadroom (8): the exp of the softmax
// kernels, whose arguments are y - max <= 0, or y - reference <= 8 in OnlineSoftmaxUpdate. Max
// error 2 ULP against exp in double for x in [-87, 8]; x < -87 (exact result below 1.7e-38) and
// -inf give 0; NaN gives 0 (the softmax kernels never pass NaN: they handle NaN rows before).
// x > 8 is outside the contract. x and y may be the same array.
void ExpNonPositiveRow(const float* x, float* y, size_t n);

// In-place softmax of each row with scale and masks (see the file comment).
void SoftmaxRows(float* scores, size_t rows, size_t cols, ptrdiff_t row_stride, float scale,
                 const SoftmaxMasks& masks);

// One step of the online-softmax (flash-attention) recurrence over a block of keys.
//
// In: scores [rows, cols] for keys [k0, k0 + cols) (raw x, scaled, capped, biased and masked
// here exactly as SoftmaxRows does; the block's masks, k_pos and causal_offset are offset to
// k0); row_max[rows], row_sum[rows] from the previous blocks (start with -inf and 0);
// acc [rows, acc_cols] (row stride acc_row_stride), the running unnormalized output.
// Sinks: start instead with row_max = sink, row_sum = 1 and acc = 0 (zeroed by the caller: a
// finite m_old makes the update scale acc rather than overwrite it). That is the state after a
// block holding only the sink's logit with a zero value vector, so the finish divides by the sum
// including exp(sink - m), as SoftmaxRows with masks.sink; a row whose keys are all masked keeps
// acc = 0 and finishes as zeros. A sink of -inf means none: start with (-inf, 0).
// Out: scores hold p_j = exp(y_j - m_new) (0 where masked); row_sum = row_sum * exp(m_old -
// m_new) + sum_j p_j; acc rows are multiplied by exp(m_old - m_new). The caller then adds
// p · V_block to acc, and after the last block calls OnlineSoftmaxFinish.
// row_max holds a reference m, not always the running max: a row whose m_old is finite keeps
// m_new = m_old while every y_j <= m_old + kOnlineSoftmaxHeadroom (then p_j <= e^8 and nothing
// is rescaled), computed in one fused pass that both checks and exponentiates; otherwise (and on
// the row's first visible keys) m_new = max(m_old, max_j y_j). Either way y_j <= m_new + 8 for
// every key seen, so p, row_sum and acc stay within a factor e^8 of the max-referenced ones; the
// division by row_sum at the end makes the reference cancel (its rounding: one more f32 multiply
// of the p_j done before a late rescale). Columns outside VisibleColumns are set to 0; a row
// whose keys so far are all masked keeps (-inf, 0) and gets p = 0; NaN or +inf (see above) sets
// the row's p, acc, row_max and row_sum to NaN, so its final output is NaN.
void OnlineSoftmaxUpdate(float* scores, size_t rows, size_t cols, ptrdiff_t row_stride, float scale,
                         const SoftmaxMasks& masks, float* row_max, float* row_sum, float* acc,
                         size_t acc_cols, ptrdiff_t acc_row_stride);

// The state (row_max, row_sum) a row of OnlineSoftmaxUpdate starts from. An attention sink s is
// one more logit whose value vector is zero: the recurrence starts from (s, 1) with acc zeroed
// (the update rescales acc by exp(m_old - m_new) instead of overwriting it once m_old is finite).
// A head without one (s = -inf) starts from (-inf, 0): the first visible keys set the state. A
// merge of partial states seeds its max with row_max and its sum with row_sum * exp(row_max - m).
struct OnlineSoftmaxState {
  float row_max;
  float row_sum;
  bool has_sink() const { return row_sum > 0.0f; }
};
inline OnlineSoftmaxState SinkSeededState(float sink) {
  return sink > kNegInf ? OnlineSoftmaxState{sink, 1.0f} : OnlineSoftmaxState{kNegInf, 0.0f};
}

// acc[r, :] /= row_sum[r]; rows whose sum is 0 (fully masked) become zeros.
void OnlineSoftmaxFinish(float* acc, size_t rows, size_t acc_cols, ptrdiff_t acc_row_stride,
                         const float* row_sum);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_SOFTMAX_H_
