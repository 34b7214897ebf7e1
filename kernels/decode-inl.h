// Per-target decode kernels; the contract is in kernels/decode.h. Included once per Highway
// target by kernels/decode.cc (foreach_target).
//
// 16-bit rows are widened with elementwise-inl.h's exact converters (bf16: a shift; f16: F16C on
// x86 AVX2 and above, an exact integer/float algorithm elsewhere), so a row costs one 16-bit
// load plus a promote per vector: half the memory traffic of f32 for the same arithmetic. bf16
// rows are read as 32-bit pairs where the layout allows (LoadPairs: one shift or mask per
// vector, no promote).
// Highway 1.0.3's ReorderWidenMulAccumulate would multiply bf16 by bf16 (the query would have
// to be rounded to bf16 too) and offers no f16 form, so it is not used.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_DECODE_INL_H_
#undef MHA_KERNELS_DECODE_INL_H_
#else
#define MHA_KERNELS_DECODE_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/elementwise-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace decode_detail {

namespace hn = hwy::HWY_NAMESPACE;

// Row readers (exact widening of f32/bf16/f16 rows): elementwise-inl.h.
using elementwise_detail::BF16Row;
using elementwise_detail::F16Row;
using elementwise_detail::F32Row;

// int8 codes, widened exactly (int8 -> int32 -> f32); a row's scale is applied to its whole dot
// product (scores) or to its probability (weighted sums), never inside the inner loop.
struct I8Row {
  using T = int8_t;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* p) {
    return hn::ConvertTo(
        df, hn::PromoteTo(hn::Rebind<int32_t, DF>(), hn::LoadU(hn::Rebind<int8_t, DF>(), p)));
  }
  static HWY_INLINE float Scalar(T x) { return static_cast<float>(x); }
};

// Row j's factor: its scale for int8 rows (scales[j]), else 1 (and scales unused).
template <class Row>
HWY_INLINE float RowScale(const float* HWY_RESTRICT scales, size_t j) {
  if constexpr (std::is_same<Row, I8Row>::value) {
    return scales[j];
  } else {
    (void)scales;
    (void)j;
    return 1.0f;
  }
}

// The scalar tail q[hv..hd) . k[hv..hd) added in order to `sum`.
template <class Row>
HWY_INLINE float AddTail(float sum, const float* HWY_RESTRICT q,
                         const typename Row::T* HWY_RESTRICT k, size_t hv, size_t hd) {
  for (size_t d = hv; d < hd; ++d) sum += q[d] * Row::Scalar(k[d]);
  return sum;
}

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
// Sums of the lanes of four vectors at once, out[i] = sum of a_i's lanes: within each 128-bit
// block a 4 x 4 transpose by interleaves folded into adds (each output lane adds lanes of one
// input only), then the blocks added pairwise. A quarter of the shuffles of four SumOfLanes,
// which dominated the scores of grouped-query decoding (G query rows per key). The tree an
// input's lanes go through does not depend on the other inputs, so a sum alone (zeros beside
// it) has the bits it has in a group.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> AddBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) <= 4) {
    return v;
  } else {
    const hn::Half<D> dh;
    return AddBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

template <class DF, class V = hn::Vec<DF>>
HWY_INLINE void SumLanes4(DF df, V a0, V a1, V a2, V a3, float* HWY_RESTRICT out) {
  const V t01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const V t23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const hn::Repartition<double, DF> dd;
  const auto lo = hn::InterleaveLower(dd, hn::BitCast(dd, t01), hn::BitCast(dd, t23));
  const auto hi = hn::InterleaveUpper(dd, hn::BitCast(dd, t01), hn::BitCast(dd, t23));
  hn::StoreU(AddBlocks(df, hn::Add(hn::BitCast(df, lo), hn::BitCast(df, hi))), hn::Full128<float>(),
             out);
}
#else
// Targets without 128-bit blocks of four lanes (scalar, EMU128, SVE's scalable vectors, Arm
// NEON kept on Highway's reduction): one reduction per input.
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE void SumLanes4(DF df, V a0, V a1, V a2, V a3, float* HWY_RESTRICT out) {
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
}
#endif

// Four streams: both kernels split the n cache rows into four equal runs and read them side by
// side (row i of each run in turn), then the n % 4 remaining rows in order: each stream gets its
// own hardware prefetcher, and one sequential stream leaves a core well below the read
// bandwidth (bench/README.md). Each stream also requests its rows kPrefetchBytes ahead
// (`prefetch`: always for 16-bit and int8 rows, for f32 rows where the CPU's family reads them
// faster for it: kernels::DecodePrefetchActive, decode.h).
constexpr size_t kStreams = 4;
// 512 bytes: 2 f32 or 4 bf16 rows of head_dim 64. A prefetch is a hint and never faults, so
// running past the end of the cache is harmless.
constexpr size_t kPrefetchBytes = 512;

// Requests the cache lines of one row of `bytes` bytes in each stream, kPrefetchBytes ahead of
// `row` (stream s starts `stream_bytes` * s after stream 0).
HWY_INLINE void PrefetchStreams(const void* row, size_t bytes, size_t stream_bytes) {
  const uint8_t* b = static_cast<const uint8_t*>(row) + kPrefetchBytes;
  for (size_t s = 0; s < kStreams; ++s, b += stream_bytes) {
    for (size_t o = 0; o < bytes; o += 64) hwy::Prefetch(b + o);
  }
}

// Query rows per pass (the G query heads of a kv head, grouped-query attention): each key or
// value vector is loaded, and widened from 16-bit or int8, once per pass and multiplied into the
// accumulators of every row of the pass, instead of once per row. kGroupRows rows of 4
// accumulators (scores: 4 keys; weighted sums: 4 vectors of the output row) with 4 loaded
// vectors: 13 registers for 2 rows on x86 below AVX-512 (16 registers), 21 for 4 rows elsewhere.
// Each (row, key) or (row, output vector) accumulator runs the same chain of operations as with
// one row per pass, so the results do not depend on the grouping.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kGroupRows = 2;
#else
constexpr size_t kGroupRows = 4;
#endif

// Keeps four accumulators in registers at this point of a loop (x86 GCC/Clang; elsewhere a
// no-op): with 16 registers (AVX2) GCC 12 otherwise kept one of two rows' eight in memory
// while two registers stayed free, a store-to-load chain per iteration.
template <class V>
HWY_INLINE void Pin4(V& a0, V& a1, V& a2, V& a3) {
#if HWY_ARCH_X86 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG) && HWY_TARGET != HWY_SCALAR && \
    HWY_TARGET != HWY_EMU128
  asm("" : "+v"(a0.raw), "+v"(a1.raw), "+v"(a2.raw), "+v"(a3.raw));
#else
  (void)a0;
  (void)a1;
  (void)a2;
  (void)a3;
#endif
}

// a_i += x * v_i for four vectors v_i (four accumulators of one query row; named variables, not
// a struct or array: SVE vectors are sizeless types).
template <class V>
HWY_INLINE void MulAdd4(V x, V v0, V v1, V v2, V v3, V& a0, V& a1, V& a2, V& a3) {
  a0 = hn::MulAdd(x, v0, a0);
  a1 = hn::MulAdd(x, v1, a1);
  a2 = hn::MulAdd(x, v2, a2);
  a3 = hn::MulAdd(x, v3, a3);
}

// Scores of kR query rows (row r at q + r * q_stride) against keys k0..k3 (hd elements each,
// rows i, run + i, 2 run + i, 3 run + i of the block): scores[r * score_stride + {0, run, 2 run,
// 3 run}]; scale[0..3] multiply the four dot products.
template <class Row, size_t kR, class DF>
HWY_INLINE void ScoreRows(DF df, const float* HWY_RESTRICT q, ptrdiff_t q_stride,
                          const typename Row::T* HWY_RESTRICT k0,
                          const typename Row::T* HWY_RESTRICT k1,
                          const typename Row::T* HWY_RESTRICT k2,
                          const typename Row::T* HWY_RESTRICT k3, size_t hv, size_t hd,
                          const float (&scale)[4], size_t run, float* HWY_RESTRICT scores,
                          ptrdiff_t score_stride) {
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  V x00 = hn::Zero(df), x01 = x00, x02 = x00, x03 = x00, x10 = x00, x11 = x00, x12 = x00;
  V x13 = x00, x20 = x00, x21 = x00, x22 = x00, x23 = x00, x30 = x00, x31 = x00, x32 = x00;
  V x33 = x00;
  const float* HWY_RESTRICT q0 = q;
  const float* HWY_RESTRICT q1 = q0 + (kR > 1 ? q_stride : 0);
  const float* HWY_RESTRICT q2 = q1 + (kR > 2 ? q_stride : 0);
  const float* HWY_RESTRICT q3 = q2 + (kR > 3 ? q_stride : 0);
  for (size_t d = 0; d < hv; d += N) {
    const V v0 = Row::Load(df, k0 + d), v1 = Row::Load(df, k1 + d);
    const V v2 = Row::Load(df, k2 + d), v3 = Row::Load(df, k3 + d);
    MulAdd4(hn::LoadU(df, q0 + d), v0, v1, v2, v3, x00, x01, x02, x03);
    if constexpr (kR > 1) MulAdd4(hn::LoadU(df, q1 + d), v0, v1, v2, v3, x10, x11, x12, x13);
    if constexpr (kR > 2) MulAdd4(hn::LoadU(df, q2 + d), v0, v1, v2, v3, x20, x21, x22, x23);
    if constexpr (kR > 3) MulAdd4(hn::LoadU(df, q3 + d), v0, v1, v2, v3, x30, x31, x32, x33);
  }
  const auto store = [&](V a0, V a1, V a2, V a3, const float* HWY_RESTRICT qr, size_t r) {
    HWY_ALIGN float sums[4];
    SumLanes4(df, a0, a1, a2, a3, sums);
    float* sr = scores + static_cast<ptrdiff_t>(r) * score_stride;
    sr[0] = AddTail<Row>(sums[0], qr, k0, hv, hd) * scale[0];
    sr[run] = AddTail<Row>(sums[1], qr, k1, hv, hd) * scale[1];
    sr[2 * run] = AddTail<Row>(sums[2], qr, k2, hv, hd) * scale[2];
    sr[3 * run] = AddTail<Row>(sums[3], qr, k3, hv, hd) * scale[3];
  };
  store(x00, x01, x02, x03, q0, 0);
  if constexpr (kR > 1) store(x10, x11, x12, x13, q1, 1);
  if constexpr (kR > 2) store(x20, x21, x22, x23, q2, 2);
  if constexpr (kR > 3) store(x30, x31, x32, x33, q3, 3);
}

template <class Row>
HWY_INLINE void Scores(const float* HWY_RESTRICT q, size_t rows, ptrdiff_t q_stride,
                       const typename Row::T* HWY_RESTRICT keys, ptrdiff_t key_stride,
                       const float* HWY_RESTRICT key_scales, size_t n, size_t hd,
                       float* HWY_RESTRICT scores, ptrdiff_t score_stride, bool prefetch) {
  using T = typename Row::T;
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const size_t hv = hd / N * N;
  const size_t run = n / kStreams;  // rows per stream
  const ptrdiff_t run_stride = static_cast<ptrdiff_t>(run) * key_stride;
  // Keys i, run + i, 2 run + i, 3 run + i together: four independent FMA chains per query row,
  // each key row read from memory once and from L1 for the other rows.
  for (size_t i = 0; i < run; ++i) {
    const T* k0 = keys + static_cast<ptrdiff_t>(i) * key_stride;
    const T* k1 = k0 + run_stride;
    const T* k2 = k1 + run_stride;
    const T* k3 = k2 + run_stride;
    if (prefetch) {
      PrefetchStreams(k0, hd * sizeof(T), static_cast<size_t>(run_stride) * sizeof(T));
    }
    const float scale[4] = {RowScale<Row>(key_scales, i), RowScale<Row>(key_scales, run + i),
                            RowScale<Row>(key_scales, 2 * run + i),
                            RowScale<Row>(key_scales, 3 * run + i)};
    size_t r = 0;
    for (; r + kGroupRows <= rows; r += kGroupRows) {
      ScoreRows<Row, kGroupRows>(
          df, q + static_cast<ptrdiff_t>(r) * q_stride, q_stride, k0, k1, k2, k3, hv, hd, scale,
          run, scores + static_cast<ptrdiff_t>(r) * score_stride + i, score_stride);
    }
    for (; r < rows; ++r) {
      ScoreRows<Row, 1>(df, q + static_cast<ptrdiff_t>(r) * q_stride, q_stride, k0, k1, k2, k3, hv,
                        hd, scale, run, scores + static_cast<ptrdiff_t>(r) * score_stride + i,
                        score_stride);
    }
  }
  // Remaining keys: the same operations per key as above.
  for (size_t j = kStreams * run; j < n; ++j) {
    const T* k0 = keys + static_cast<ptrdiff_t>(j) * key_stride;
    for (size_t r = 0; r < rows; ++r) {
      const float* qr = q + static_cast<ptrdiff_t>(r) * q_stride;
      auto a0 = hn::Zero(df);
      for (size_t d = 0; d < hv; d += N)
        a0 = hn::MulAdd(hn::LoadU(df, qr + d), Row::Load(df, k0 + d), a0);
      // Through the same reduction as the keys above (the zeros beside it change nothing).
      HWY_ALIGN float sums[4];
      SumLanes4(df, a0, hn::Zero(df), hn::Zero(df), hn::Zero(df), sums);
      scores[static_cast<ptrdiff_t>(r) * score_stride + j] =
          AddTail<Row>(sums[0], qr, k0, hv, hd) * RowScale<Row>(key_scales, j);
    }
  }
}

// bf16 keys read as 32-bit pairs: a vector of N words holds 2N elements, and the even elements
// widen with one shift (the low half moved up), the odd ones with one mask (the high half kept):
// one instruction per N elements instead of a zero-extension and a shift, which bound the scores
// of grouped-query decoding (four query rows per key; bench/kernels_bench BM_DecodeKernel). The
// query rows are split into the same even/odd order once per call (SplitPairs).
//
// Rows of a pass of SplitPairs' buffer: a row of hd floats is, per block of 2N elements, its N
// even then its N odd elements.
constexpr size_t kPairQueryFloats = 4096;  // 16 KiB on the stack

// Whether a score of hd elements takes the paired path: hd a whole number of 2N blocks, and one
// row fits SplitPairs' buffer. Depends on hd and the target only, so a score's operations do
// not depend on the call's rows.
template <class DF>
HWY_INLINE bool PairedBF16(DF df, size_t hd) {
  const size_t N2 = 2 * hn::Lanes(df);
  return hd >= N2 && hd % N2 == 0 && hd <= kPairQueryFloats;
}

// dst[r * hd + ...] = rows [0, rows) of src (row r at src + r * src_stride) in the paired order
// (hd a multiple of 2N): the query rows of the bf16 scores, the accumulators of the bf16 sums.
template <class DF>
HWY_INLINE void SplitPairs(DF df, const float* HWY_RESTRICT src, size_t rows, ptrdiff_t src_stride,
                           size_t hd, float* HWY_RESTRICT dst) {
  const size_t N = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    const float* sr = src + static_cast<ptrdiff_t>(r) * src_stride;
    float* dr = dst + r * hd;
    // Scalar: once per call, and portable to targets without ConcatEven (HWY_SCALAR).
    for (size_t d = 0; d < hd; d += 2 * N) {
      for (size_t i = 0; i < N; ++i) {
        dr[d + i] = sr[d + 2 * i];
        dr[d + N + i] = sr[d + 2 * i + 1];
      }
    }
  }
}

// The inverse of SplitPairs: rows of hd paired floats at src back into dst's natural order.
template <class DF>
HWY_INLINE void MergePairs(DF df, const float* HWY_RESTRICT src, size_t rows, size_t hd,
                           float* HWY_RESTRICT dst, ptrdiff_t dst_stride) {
  const size_t N = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    const float* sr = src + r * hd;
    float* dr = dst + static_cast<ptrdiff_t>(r) * dst_stride;
    for (size_t d = 0; d < hd; d += 2 * N) {
      for (size_t i = 0; i < N; ++i) {
        dr[d + 2 * i] = sr[d + i];
        dr[d + 2 * i + 1] = sr[d + N + i];
      }
    }
  }
}

// The even (shifted up) and odd (masked) elements of the 2N bf16 values at p, as f32.
template <class DF>
HWY_INLINE void LoadPairs(DF df, const uint16_t* HWY_RESTRICT p, hn::Vec<DF>& even,
                          hn::Vec<DF>& odd) {
  const hn::Repartition<uint32_t, DF> du;
  const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  even = hn::BitCast(df, hn::ShiftLeft<16>(w));
  odd = hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

// ScoreRows over bf16 keys in pairs: qp = kR rows of SplitPairs' buffer (row stride hd).
template <size_t kR, class DF>
HWY_INLINE void ScoreRowsPaired(DF df, const float* HWY_RESTRICT qp,
                                const uint16_t* HWY_RESTRICT k0, const uint16_t* HWY_RESTRICT k1,
                                const uint16_t* HWY_RESTRICT k2, const uint16_t* HWY_RESTRICT k3,
                                size_t hd, size_t run, float* HWY_RESTRICT scores,
                                ptrdiff_t score_stride) {
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  V x00 = hn::Zero(df), x01 = x00, x02 = x00, x03 = x00, x10 = x00, x11 = x00, x12 = x00;
  V x13 = x00, x20 = x00, x21 = x00, x22 = x00, x23 = x00, x30 = x00, x31 = x00, x32 = x00;
  V x33 = x00;
  const float* HWY_RESTRICT q0 = qp;
  const float* HWY_RESTRICT q1 = q0 + (kR > 1 ? hd : 0);
  const float* HWY_RESTRICT q2 = q1 + (kR > 2 ? hd : 0);
  const float* HWY_RESTRICT q3 = q2 + (kR > 3 ? hd : 0);
  // The even elements of the four keys, then their odd elements (each a second load of the
  // same words, from L1): four key vectors live at a time instead of eight, which with two
  // rows' eight accumulators exceeded AVX2's 16 registers and kept one accumulator in memory
  // (bench/README.md "AMD EPYC Zen 3", "Decoding"). Each accumulator still adds even, then odd.
  const hn::Repartition<uint32_t, DF> du;
  const auto words = [&](const uint16_t* HWY_RESTRICT p) {
    return hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  };
  const auto hi = hn::Set(du, 0xFFFF0000u);
  for (size_t d = 0; d < hd; d += 2 * N) {
    {
      const V e0 = hn::BitCast(df, hn::ShiftLeft<16>(words(k0 + d)));
      const V e1 = hn::BitCast(df, hn::ShiftLeft<16>(words(k1 + d)));
      const V e2 = hn::BitCast(df, hn::ShiftLeft<16>(words(k2 + d)));
      const V e3 = hn::BitCast(df, hn::ShiftLeft<16>(words(k3 + d)));
      MulAdd4(hn::LoadU(df, q0 + d), e0, e1, e2, e3, x00, x01, x02, x03);
      if constexpr (kR > 1) MulAdd4(hn::LoadU(df, q1 + d), e0, e1, e2, e3, x10, x11, x12, x13);
      if constexpr (kR > 2) MulAdd4(hn::LoadU(df, q2 + d), e0, e1, e2, e3, x20, x21, x22, x23);
      if constexpr (kR > 3) MulAdd4(hn::LoadU(df, q3 + d), e0, e1, e2, e3, x30, x31, x32, x33);
    }
    const V o0 = hn::BitCast(df, hn::And(words(k0 + d), hi));
    const V o1 = hn::BitCast(df, hn::And(words(k1 + d), hi));
    const V o2 = hn::BitCast(df, hn::And(words(k2 + d), hi));
    const V o3 = hn::BitCast(df, hn::And(words(k3 + d), hi));
    MulAdd4(hn::LoadU(df, q0 + d + N), o0, o1, o2, o3, x00, x01, x02, x03);
    if constexpr (kR > 1) MulAdd4(hn::LoadU(df, q1 + d + N), o0, o1, o2, o3, x10, x11, x12, x13);
    if constexpr (kR > 2) MulAdd4(hn::LoadU(df, q2 + d + N), o0, o1, o2, o3, x20, x21, x22, x23);
    if constexpr (kR > 3) MulAdd4(hn::LoadU(df, q3 + d + N), o0, o1, o2, o3, x30, x31, x32, x33);
    Pin4(x00, x01, x02, x03);
    if constexpr (kR > 1) Pin4(x10, x11, x12, x13);
    if constexpr (kR > 2) Pin4(x20, x21, x22, x23);
    if constexpr (kR > 3) Pin4(x30, x31, x32, x33);
  }
  const auto store = [&](V a0, V a1, V a2, V a3, size_t r) {
    HWY_ALIGN float sums[4];
    SumLanes4(df, a0, a1, a2, a3, sums);
    float* sr = scores + static_cast<ptrdiff_t>(r) * score_stride;
    sr[0] = sums[0];
    sr[run] = sums[1];
    sr[2 * run] = sums[2];
    sr[3 * run] = sums[3];
  };
  store(x00, x01, x02, x03, 0);
  if constexpr (kR > 1) store(x10, x11, x12, x13, 1);
  if constexpr (kR > 2) store(x20, x21, x22, x23, 2);
  if constexpr (kR > 3) store(x30, x31, x32, x33, 3);
}

// Scores over bf16 keys when PairedBF16(hd): Scores' order of keys and rows, the rows in blocks
// that fit SplitPairs' buffer (each block reads the keys again; decode calls have one block).
HWY_INLINE void ScoresPairedBF16(const float* HWY_RESTRICT q, size_t rows, ptrdiff_t q_stride,
                                 const uint16_t* HWY_RESTRICT keys, ptrdiff_t key_stride, size_t n,
                                 size_t hd, float* HWY_RESTRICT scores, ptrdiff_t score_stride,
                                 bool prefetch) {
  const hn::ScalableTag<float> df;
  HWY_ALIGN float qp[kPairQueryFloats];
  const size_t block = kPairQueryFloats / hd;
  const size_t run = n / kStreams;
  const ptrdiff_t run_stride = static_cast<ptrdiff_t>(run) * key_stride;
  for (size_t r0 = 0; r0 < rows; r0 += block) {
    const size_t nr = std::min(block, rows - r0);
    SplitPairs(df, q + static_cast<ptrdiff_t>(r0) * q_stride, nr, q_stride, hd, qp);
    float* sb = scores + static_cast<ptrdiff_t>(r0) * score_stride;
    for (size_t i = 0; i < run; ++i) {
      const uint16_t* k0 = keys + static_cast<ptrdiff_t>(i) * key_stride;
      const uint16_t* k1 = k0 + run_stride;
      const uint16_t* k2 = k1 + run_stride;
      const uint16_t* k3 = k2 + run_stride;
      if (prefetch) {
        PrefetchStreams(k0, hd * sizeof(uint16_t),
                        static_cast<size_t>(run_stride) * sizeof(uint16_t));
      }
      size_t r = 0;
      for (; r + kGroupRows <= nr; r += kGroupRows) {
        ScoreRowsPaired<kGroupRows>(df, qp + r * hd, k0, k1, k2, k3, hd, run,
                                    sb + static_cast<ptrdiff_t>(r) * score_stride + i,
                                    score_stride);
      }
      for (; r < nr; ++r) {
        ScoreRowsPaired<1>(df, qp + r * hd, k0, k1, k2, k3, hd, run,
                           sb + static_cast<ptrdiff_t>(r) * score_stride + i, score_stride);
      }
    }
    // Remaining keys: the same operations per key as above.
    for (size_t j = kStreams * run; j < n; ++j) {
      const uint16_t* k0 = keys + static_cast<ptrdiff_t>(j) * key_stride;
      for (size_t r = 0; r < nr; ++r) {
        ScoreRowsPaired<1>(df, qp + r * hd, k0, k0, k0, k0, hd, 0,
                           sb + static_cast<ptrdiff_t>(r) * score_stride + j, score_stride);
      }
    }
  }
}

// acc rows [r, r + kR) (row i at ar + i * acc_stride, weights at pr + i * p_stride), output
// columns [d, d + 4N): += sum_j weight_j v_j over the n rows in WeightedValues' order, each value
// vector loaded once for the kR rows. prefetch_bytes: of each stream's row from this block's first
// column on, the bytes to request ahead (0: none).
template <class Row, size_t kR, class DF, class Weight>
HWY_INLINE void WeightedRows(DF df, const float* HWY_RESTRICT pr, ptrdiff_t p_stride,
                             const typename Row::T* HWY_RESTRICT values, ptrdiff_t value_stride,
                             size_t n, size_t run, const Weight& weight, size_t prefetch_bytes,
                             float* HWY_RESTRICT ar, ptrdiff_t acc_stride) {
  using T = typename Row::T;
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  const ptrdiff_t run_stride = static_cast<ptrdiff_t>(run) * value_stride;
  const size_t tail = kStreams * run;
  // Accumulators: row i's four output vectors in xi0..xi3 (rows past kR stay unused).
  const auto row = [&](size_t r) { return ar + static_cast<ptrdiff_t>(r) * acc_stride; };
  V x00 = hn::LoadU(df, row(0)), x01 = hn::LoadU(df, row(0) + N);
  V x02 = hn::LoadU(df, row(0) + 2 * N), x03 = hn::LoadU(df, row(0) + 3 * N);
  V x10 = x00, x11 = x00, x12 = x00, x13 = x00, x20 = x00, x21 = x00, x22 = x00, x23 = x00;
  V x30 = x00, x31 = x00, x32 = x00, x33 = x00;
  if constexpr (kR > 1) {
    x10 = hn::LoadU(df, row(1)), x11 = hn::LoadU(df, row(1) + N);
    x12 = hn::LoadU(df, row(1) + 2 * N), x13 = hn::LoadU(df, row(1) + 3 * N);
  }
  if constexpr (kR > 2) {
    x20 = hn::LoadU(df, row(2)), x21 = hn::LoadU(df, row(2) + N);
    x22 = hn::LoadU(df, row(2) + 2 * N), x23 = hn::LoadU(df, row(2) + 3 * N);
  }
  if constexpr (kR > 3) {
    x30 = hn::LoadU(df, row(3)), x31 = hn::LoadU(df, row(3) + N);
    x32 = hn::LoadU(df, row(3) + 2 * N), x33 = hn::LoadU(df, row(3) + 3 * N);
  }
  const float* HWY_RESTRICT p0 = pr;
  const float* HWY_RESTRICT p1 = p0 + (kR > 1 ? p_stride : 0);
  const float* HWY_RESTRICT p2 = p1 + (kR > 2 ? p_stride : 0);
  const float* HWY_RESTRICT p3 = p2 + (kR > 3 ? p_stride : 0);
  // Value row j (at v) into every row of the pass.
  const auto step = [&](const T* HWY_RESTRICT v, size_t j) {
    const V v0 = Row::Load(df, v), v1 = Row::Load(df, v + N);
    const V v2 = Row::Load(df, v + 2 * N), v3 = Row::Load(df, v + 3 * N);
    MulAdd4(hn::Set(df, weight(p0, j)), v0, v1, v2, v3, x00, x01, x02, x03);
    if constexpr (kR > 1) MulAdd4(hn::Set(df, weight(p1, j)), v0, v1, v2, v3, x10, x11, x12, x13);
    if constexpr (kR > 2) MulAdd4(hn::Set(df, weight(p2, j)), v0, v1, v2, v3, x20, x21, x22, x23);
    if constexpr (kR > 3) MulAdd4(hn::Set(df, weight(p3, j)), v0, v1, v2, v3, x30, x31, x32, x33);
  };
  // Rows i, run + i, 2 run + i, 3 run + i for i < run, then tail, tail + 1, ..., n - 1.
  const T* v = values;
  for (size_t i = 0; i < run; ++i, v += value_stride) {
    if (prefetch_bytes != 0) {
      PrefetchStreams(v, prefetch_bytes, static_cast<size_t>(run_stride) * sizeof(T));
    }
    for (size_t s = 0; s < kStreams; ++s)
      step(v + static_cast<ptrdiff_t>(s) * run_stride, s * run + i);
  }
  v = values + static_cast<ptrdiff_t>(tail) * value_stride;
  for (size_t j = tail; j < n; ++j, v += value_stride) step(v, j);
  const auto store = [&](V a0, V a1, V a2, V a3, size_t r) {
    hn::StoreU(a0, df, row(r));
    hn::StoreU(a1, df, row(r) + N);
    hn::StoreU(a2, df, row(r) + 2 * N);
    hn::StoreU(a3, df, row(r) + 3 * N);
  };
  store(x00, x01, x02, x03, 0);
  if constexpr (kR > 1) store(x10, x11, x12, x13, 1);
  if constexpr (kR > 2) store(x20, x21, x22, x23, 2);
  if constexpr (kR > 3) store(x30, x31, x32, x33, 3);
}

// WeightedRows over bf16 values read as 32-bit pairs (LoadPairs): the four accumulators of a
// row hold the even and the odd columns of [d, d + 2N), then of [d + 2N, d + 4N); the rows of
// acc are split into that order on entry and merged back on exit (scalar, once per call). Every
// output element takes the same multiply-adds in the same order as WeightedRows', so the
// results are the same bits.
template <size_t kR, class DF, class Weight>
HWY_INLINE void WeightedRowsPaired(DF df, const float* HWY_RESTRICT pr, ptrdiff_t p_stride,
                                   const uint16_t* HWY_RESTRICT values, ptrdiff_t value_stride,
                                   size_t n, size_t run, const Weight& weight,
                                   size_t prefetch_bytes, float* HWY_RESTRICT ar,
                                   ptrdiff_t acc_stride) {
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  const ptrdiff_t run_stride = static_cast<ptrdiff_t>(run) * value_stride;
  const size_t tail = kStreams * run;
  // Row r's 4N accumulators, split: [even, odd] of each 2N block (at most 4 rows of 4 vectors).
  HWY_ALIGN float split[4 * 4 * hn::MaxLanes(df)];
  SplitPairs(df, ar, kR, acc_stride, 4 * N, split);
  const auto at = [&](size_t r, size_t v) { return hn::Load(df, split + r * 4 * N + v * N); };
  V x00 = at(0, 0), x01 = at(0, 1), x02 = at(0, 2), x03 = at(0, 3);
  V x10 = x00, x11 = x00, x12 = x00, x13 = x00, x20 = x00, x21 = x00, x22 = x00, x23 = x00;
  V x30 = x00, x31 = x00, x32 = x00, x33 = x00;
  if constexpr (kR > 1) x10 = at(1, 0), x11 = at(1, 1), x12 = at(1, 2), x13 = at(1, 3);
  if constexpr (kR > 2) x20 = at(2, 0), x21 = at(2, 1), x22 = at(2, 2), x23 = at(2, 3);
  if constexpr (kR > 3) x30 = at(3, 0), x31 = at(3, 1), x32 = at(3, 2), x33 = at(3, 3);
  const float* HWY_RESTRICT p0 = pr;
  const float* HWY_RESTRICT p1 = p0 + (kR > 1 ? p_stride : 0);
  const float* HWY_RESTRICT p2 = p1 + (kR > 2 ? p_stride : 0);
  const float* HWY_RESTRICT p3 = p2 + (kR > 3 ? p_stride : 0);
  const auto step = [&](const uint16_t* HWY_RESTRICT v, size_t j) {
    V e0, o0, e1, o1;
    LoadPairs(df, v, e0, o0);
    LoadPairs(df, v + 2 * N, e1, o1);
    MulAdd4(hn::Set(df, weight(p0, j)), e0, o0, e1, o1, x00, x01, x02, x03);
    if constexpr (kR > 1) MulAdd4(hn::Set(df, weight(p1, j)), e0, o0, e1, o1, x10, x11, x12, x13);
    if constexpr (kR > 2) MulAdd4(hn::Set(df, weight(p2, j)), e0, o0, e1, o1, x20, x21, x22, x23);
    if constexpr (kR > 3) MulAdd4(hn::Set(df, weight(p3, j)), e0, o0, e1, o1, x30, x31, x32, x33);
  };
  const uint16_t* v = values;
  for (size_t i = 0; i < run; ++i, v += value_stride) {
    if (prefetch_bytes != 0) {
      PrefetchStreams(v, prefetch_bytes, static_cast<size_t>(run_stride) * sizeof(uint16_t));
    }
    for (size_t s = 0; s < kStreams; ++s)
      step(v + static_cast<ptrdiff_t>(s) * run_stride, s * run + i);
  }
  v = values + static_cast<ptrdiff_t>(tail) * value_stride;
  for (size_t j = tail; j < n; ++j, v += value_stride) step(v, j);
  const auto put = [&](size_t r, V a0, V a1, V a2, V a3) {
    float* sr = split + r * 4 * N;
    hn::Store(a0, df, sr);
    hn::Store(a1, df, sr + N);
    hn::Store(a2, df, sr + 2 * N);
    hn::Store(a3, df, sr + 3 * N);
  };
  put(0, x00, x01, x02, x03);
  if constexpr (kR > 1) put(1, x10, x11, x12, x13);
  if constexpr (kR > 2) put(2, x20, x21, x22, x23);
  if constexpr (kR > 3) put(3, x30, x31, x32, x33);
  MergePairs(df, split, kR, 4 * N, ar, acc_stride);
}

// One row's columns [d, d + 8N) in one pass (WeightedRows' order of value rows and the same
// multiply-add per element): below AVX-512 a head_dim-64 f32 row is 8 vectors, and four-vector
// blocks would read each value row in two passes, the second over half of every row's cache
// lines (bench/README.md "Decode on AVX2: one pass over the values"). a: the 8N accumulators in
// the order `step` keeps them; step(v, w, a0..a7) adds w times the 8N values at v.
template <class T, class DF, class Weight, class Step>
HWY_INLINE void WeightedPass8(DF df, const float* HWY_RESTRICT pr, const T* HWY_RESTRICT values,
                              ptrdiff_t value_stride, size_t n, size_t run, const Weight& weight,
                              bool prefetch, float* HWY_RESTRICT a, const Step& step) {
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  const ptrdiff_t run_stride = static_cast<ptrdiff_t>(run) * value_stride;
  const size_t tail = kStreams * run;
  V a0 = hn::LoadU(df, a), a1 = hn::LoadU(df, a + N), a2 = hn::LoadU(df, a + 2 * N);
  V a3 = hn::LoadU(df, a + 3 * N), a4 = hn::LoadU(df, a + 4 * N);
  V a5 = hn::LoadU(df, a + 5 * N), a6 = hn::LoadU(df, a + 6 * N);
  V a7 = hn::LoadU(df, a + 7 * N);
  const auto row = [&](const T* HWY_RESTRICT v, size_t j) {
    step(v, hn::Set(df, weight(pr, j)), a0, a1, a2, a3, a4, a5, a6, a7);
  };
  const T* v = values;
  for (size_t i = 0; i < run; ++i, v += value_stride) {
    if (prefetch) {
      PrefetchStreams(v, 8 * N * sizeof(T), static_cast<size_t>(run_stride) * sizeof(T));
    }
    for (size_t s = 0; s < kStreams; ++s)
      row(v + static_cast<ptrdiff_t>(s) * run_stride, s * run + i);
  }
  v = values + static_cast<ptrdiff_t>(tail) * value_stride;
  for (size_t j = tail; j < n; ++j, v += value_stride) row(v, j);
  hn::StoreU(a0, df, a);
  hn::StoreU(a1, df, a + N);
  hn::StoreU(a2, df, a + 2 * N);
  hn::StoreU(a3, df, a + 3 * N);
  hn::StoreU(a4, df, a + 4 * N);
  hn::StoreU(a5, df, a + 5 * N);
  hn::StoreU(a6, df, a + 6 * N);
  hn::StoreU(a7, df, a + 7 * N);
}

// WeightedPass8 over rows widened by Row::Load, accumulating in place in ar.
template <class Row, class DF, class Weight>
HWY_INLINE void WeightedRow8(DF df, const float* HWY_RESTRICT pr,
                             const typename Row::T* HWY_RESTRICT values, ptrdiff_t value_stride,
                             size_t n, size_t run, const Weight& weight, bool prefetch,
                             float* HWY_RESTRICT ar) {
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  WeightedPass8(df, pr, values, value_stride, n, run, weight, prefetch, ar,
                [&](const typename Row::T* HWY_RESTRICT v, V w, V& a0, V& a1, V& a2, V& a3, V& a4,
                    V& a5, V& a6, V& a7) {
                  MulAdd4(w, Row::Load(df, v), Row::Load(df, v + N), Row::Load(df, v + 2 * N),
                          Row::Load(df, v + 3 * N), a0, a1, a2, a3);
                  MulAdd4(w, Row::Load(df, v + 4 * N), Row::Load(df, v + 5 * N),
                          Row::Load(df, v + 6 * N), Row::Load(df, v + 7 * N), a4, a5, a6, a7);
                });
}

// WeightedPass8 over bf16 values read as pairs (LoadPairs), on ar split as WeightedRowsPaired
// splits its rows (per 2N block: its even, then its odd columns) and merged back on exit.
template <class DF, class Weight>
HWY_INLINE void WeightedRowPaired8(DF df, const float* HWY_RESTRICT pr,
                                   const uint16_t* HWY_RESTRICT values, ptrdiff_t value_stride,
                                   size_t n, size_t run, const Weight& weight, bool prefetch,
                                   float* HWY_RESTRICT ar) {
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  HWY_ALIGN float split[8 * hn::MaxLanes(df)];
  SplitPairs(df, ar, 1, 0, 8 * N, split);
  WeightedPass8(df, pr, values, value_stride, n, run, weight, prefetch, split,
                [&](const uint16_t* HWY_RESTRICT v, V w, V& a0, V& a1, V& a2, V& a3, V& a4, V& a5,
                    V& a6, V& a7) {
                  V e0, o0, e1, o1;
                  LoadPairs(df, v, e0, o0);
                  LoadPairs(df, v + 2 * N, e1, o1);
                  MulAdd4(w, e0, o0, e1, o1, a0, a1, a2, a3);
                  LoadPairs(df, v + 4 * N, e0, o0);
                  LoadPairs(df, v + 6 * N, e1, o1);
                  MulAdd4(w, e0, o0, e1, o1, a4, a5, a6, a7);
                });
  MergePairs(df, split, 1, 8 * N, ar, 0);
}

// The four-vector column blocks of WeightedValues: bf16 rows as pairs, the others widened.
template <class Row, size_t kR, class DF, class Weight>
HWY_INLINE void WeightedBlock(DF df, const float* HWY_RESTRICT pr, ptrdiff_t p_stride,
                              const typename Row::T* HWY_RESTRICT values, ptrdiff_t value_stride,
                              size_t n, size_t run, const Weight& weight, size_t prefetch_bytes,
                              float* HWY_RESTRICT ar, ptrdiff_t acc_stride) {
  if constexpr (std::is_same<Row, BF16Row>::value) {
    WeightedRowsPaired<kR>(df, pr, p_stride, values, value_stride, n, run, weight, prefetch_bytes,
                           ar, acc_stride);
  } else {
    WeightedRows<Row, kR>(df, pr, p_stride, values, value_stride, n, run, weight, prefetch_bytes,
                          ar, acc_stride);
  }
}

template <class Row>
HWY_INLINE void WeightedValues(const float* HWY_RESTRICT p, size_t rows, ptrdiff_t p_stride,
                               const typename Row::T* HWY_RESTRICT values, ptrdiff_t value_stride,
                               const float* HWY_RESTRICT value_scales, size_t n, size_t hd,
                               float* HWY_RESTRICT acc, ptrdiff_t acc_stride, bool prefetch) {
  using T = typename Row::T;
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const size_t run = n / kStreams;  // rows per stream
  const ptrdiff_t run_stride = static_cast<ptrdiff_t>(run) * value_stride;
  const size_t tail = kStreams * run;
  // Row j's weight: its probability, times its scale for int8 rows.
  auto weight = [value_scales](const float* pr, size_t j) {
    return pr[j] * RowScale<Row>(value_scales, j);
  };
  // One row: blocks of eight vectors first (WeightedRow8, bf16 rows as pairs).
  size_t d0 = 0;
  if (rows == 1) {
    for (; d0 + 8 * N <= hd; d0 += 8 * N) {
      if constexpr (std::is_same<Row, BF16Row>::value) {
        WeightedRowPaired8(df, p, values + d0, value_stride, n, run, weight, prefetch, acc + d0);
      } else {
        WeightedRow8<Row>(df, p, values + d0, value_stride, n, run, weight, prefetch, acc + d0);
      }
    }
  }
  // Output columns in blocks of four vectors, kGroupRows rows per pass (WeightedRows), in the
  // order i, run + i, 2 run + i, 3 run + i for i < run, then tail, tail + 1, ..., n - 1.
  const size_t d4 = d0 + (hd - d0) / (4 * N) * (4 * N);
  for (size_t d = d0; d < d4; d += 4 * N) {
    // The walk of the first rows over the values requests each row ahead from this block's first
    // column to the row's end, not only this block's columns: below AVX-512 a bf16 or int8 row of
    // head_dim 64 is two blocks, and the lines of the second then come from memory with the
    // first's (bench/README.md "Decode on AVX2: one pass over the values").
    const size_t ahead = prefetch ? (hd - d) * sizeof(T) : 0;
    size_t r = 0;
    for (; r + kGroupRows <= rows; r += kGroupRows) {
      WeightedBlock<Row, kGroupRows>(df, p + static_cast<ptrdiff_t>(r) * p_stride, p_stride,
                                     values + d, value_stride, n, run, weight, r == 0 ? ahead : 0,
                                     acc + static_cast<ptrdiff_t>(r) * acc_stride + d, acc_stride);
    }
    for (; r < rows; ++r) {
      WeightedBlock<Row, 1>(df, p + static_cast<ptrdiff_t>(r) * p_stride, p_stride, values + d,
                            value_stride, n, run, weight, r == 0 ? ahead : 0,
                            acc + static_cast<ptrdiff_t>(r) * acc_stride + d, acc_stride);
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    const float* pr = p + static_cast<ptrdiff_t>(r) * p_stride;
    float* ar = acc + static_cast<ptrdiff_t>(r) * acc_stride;
    size_t d = d4;
    for (; d + N <= hd; d += N) {
      auto a0 = hn::LoadU(df, ar + d);
      const T* v = values + d;
      for (size_t i = 0; i < run; ++i, v += value_stride) {
        for (size_t s = 0; s < kStreams; ++s) {
          a0 = hn::MulAdd(hn::Set(df, weight(pr, s * run + i)),
                          Row::Load(df, v + static_cast<ptrdiff_t>(s) * run_stride), a0);
        }
      }
      v = values + d + static_cast<ptrdiff_t>(tail) * value_stride;
      for (size_t j = tail; j < n; ++j, v += value_stride) {
        a0 = hn::MulAdd(hn::Set(df, weight(pr, j)), Row::Load(df, v), a0);
      }
      hn::StoreU(a0, df, ar + d);
    }
    for (; d < hd; ++d) {
      float a = ar[d];
      const T* v = values + d;
      for (size_t i = 0; i < run; ++i, v += value_stride) {
        for (size_t s = 0; s < kStreams; ++s) {
          a += weight(pr, s * run + i) * Row::Scalar(v[static_cast<ptrdiff_t>(s) * run_stride]);
        }
      }
      v = values + d + static_cast<ptrdiff_t>(tail) * value_stride;
      for (size_t j = tail; j < n; ++j, v += value_stride) a += weight(pr, j) * Row::Scalar(*v);
      ar[d] = a;
    }
  }
}

}  // namespace decode_detail

// See kernels/decode.h. `type`: 0 f32, 1 bf16, 2 f16, 5 int8 (DType).
inline void QueryKeyScores(const float* q, size_t rows, ptrdiff_t q_stride, const void* keys,
                           int type, ptrdiff_t key_stride, const float* key_scales, size_t n,
                           size_t hd, float* scores, ptrdiff_t score_stride, bool prefetch) {
  namespace dd = decode_detail;
  if (type == 0) {
    dd::Scores<dd::F32Row>(q, rows, q_stride, static_cast<const float*>(keys), key_stride,
                           key_scales, n, hd, scores, score_stride, prefetch);
  } else if (type == 1) {
    if (dd::PairedBF16(hwy::HWY_NAMESPACE::ScalableTag<float>(), hd)) {
      dd::ScoresPairedBF16(q, rows, q_stride, static_cast<const uint16_t*>(keys), key_stride, n, hd,
                           scores, score_stride, prefetch);
    } else {
      dd::Scores<dd::BF16Row>(q, rows, q_stride, static_cast<const uint16_t*>(keys), key_stride,
                              key_scales, n, hd, scores, score_stride, prefetch);
    }
  } else if (type == 2) {
    dd::Scores<dd::F16Row>(q, rows, q_stride, static_cast<const uint16_t*>(keys), key_stride,
                           key_scales, n, hd, scores, score_stride, prefetch);
  } else {
    dd::Scores<dd::I8Row>(q, rows, q_stride, static_cast<const int8_t*>(keys), key_stride,
                          key_scales, n, hd, scores, score_stride, prefetch);
  }
}

inline void AccumulateWeightedValues(const float* p, size_t rows, ptrdiff_t p_stride,
                                     const void* values, int type, ptrdiff_t value_stride,
                                     const float* value_scales, size_t n, size_t hd, float* acc,
                                     ptrdiff_t acc_stride, bool prefetch) {
  namespace dd = decode_detail;
  if (type == 0) {
    dd::WeightedValues<dd::F32Row>(p, rows, p_stride, static_cast<const float*>(values),
                                   value_stride, value_scales, n, hd, acc, acc_stride, prefetch);
  } else if (type == 1) {
    dd::WeightedValues<dd::BF16Row>(p, rows, p_stride, static_cast<const uint16_t*>(values),
                                    value_stride, value_scales, n, hd, acc, acc_stride, prefetch);
  } else if (type == 2) {
    dd::WeightedValues<dd::F16Row>(p, rows, p_stride, static_cast<const uint16_t*>(values),
                                   value_stride, value_scales, n, hd, acc, acc_stride, prefetch);
  } else {
    dd::WeightedValues<dd::I8Row>(p, rows, p_stride, static_cast<const int8_t*>(values),
                                  value_stride, value_scales, n, hd, acc, acc_stride, prefetch);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_DECODE_INL_H_
