// Per-target decode kernels; the contract is in kernels/decode.h. Included once per Highway
// target by kernels/decode.cc (foreach_target).
//
// 16-bit rows are widened with elementwise-inl.h's exact converters (bf16: a shift; f16: F16C on
// x86 AVX2 and above, an exact integer/float algorithm elsewhere), so a row costs one 16-bit
// load plus a promote per vector: half the memory traffic of f32 for the same arithmetic.
// Highway 1.0.3's ReorderWidenMulAccumulate would multiply bf16 by bf16 (the query would have
// to be rounded to bf16 too) and offers no f16 form, so it is not used.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_DECODE_INL_H_
#undef MHA_KERNELS_DECODE_INL_H_
#else
#define MHA_KERNELS_DECODE_INL_H_
#endif

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
    return hn::ConvertTo(df, hn::PromoteTo(hn::Rebind<int32_t, DF>(),
                                           hn::LoadU(hn::Rebind<int8_t, DF>(), p)));
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

// Sum of the lanes of `acc`, then the scalar tail q[hv..hd) . k[hv..hd).
template <class Row, class DF>
HWY_INLINE float FinishDot(DF df, hn::Vec<DF> acc, const float* HWY_RESTRICT q,
                           const typename Row::T* HWY_RESTRICT k, size_t hv, size_t hd) {
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (size_t d = hv; d < hd; ++d) sum += q[d] * Row::Scalar(k[d]);
  return sum;
}

// Four streams: both kernels split the n cache rows into four equal runs and read them side by
// side (row i of each run in turn), then the n % 4 remaining rows in order. One sequential stream
// left a core at 9-10 GB/s on this machine (AVX3_DL Xeon VM, standalone read of 64 KiB K and V
// chunks); four concurrent streams reach 15-17 GB/s: each stream gets its own hardware
// prefetcher and the core keeps more DRAM pages open. On top of that, each stream requests its
// rows kPrefetchBytes ahead. mha-bench --decode (context 4096, batch 1, 16 heads, attention
// alone, share of copy bandwidth, 6-16 runs each): f32 46-62% with one prefetched stream, 60-83%
// with four streams, 69-79% with four prefetched streams; bf16 41-59%, 45-74%, 57-70%.
constexpr size_t kStreams = 4;
// 512 bytes: 2 f32 or 4 bf16 rows of head_dim 64. 256 and 1024 measured no better; a prefetch is
// a hint and never faults, so running past the end of the cache is harmless.
constexpr size_t kPrefetchBytes = 512;

// Requests the cache lines of one row of `bytes` bytes in each stream, kPrefetchBytes ahead of
// `row` (stream s starts `stream_bytes` * s after stream 0).
HWY_INLINE void PrefetchStreams(const void* row, size_t bytes, size_t stream_bytes) {
  const uint8_t* b = static_cast<const uint8_t*>(row) + kPrefetchBytes;
  for (size_t s = 0; s < kStreams; ++s, b += stream_bytes) {
    for (size_t o = 0; o < bytes; o += 64) hwy::Prefetch(b + o);
  }
}

template <class Row>
HWY_INLINE void Scores(const float* HWY_RESTRICT q, size_t rows, ptrdiff_t q_stride,
                       const typename Row::T* HWY_RESTRICT keys, ptrdiff_t key_stride,
                       const float* HWY_RESTRICT key_scales, size_t n, size_t hd,
                       float* HWY_RESTRICT scores, ptrdiff_t score_stride) {
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
    PrefetchStreams(k0, hd * sizeof(T), static_cast<size_t>(run_stride) * sizeof(T));
    for (size_t r = 0; r < rows; ++r) {
      const float* qr = q + static_cast<ptrdiff_t>(r) * q_stride;
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      for (size_t d = 0; d < hv; d += N) {
        const auto vq = hn::LoadU(df, qr + d);
        a0 = hn::MulAdd(vq, Row::Load(df, k0 + d), a0);
        a1 = hn::MulAdd(vq, Row::Load(df, k1 + d), a1);
        a2 = hn::MulAdd(vq, Row::Load(df, k2 + d), a2);
        a3 = hn::MulAdd(vq, Row::Load(df, k3 + d), a3);
      }
      float* sr = scores + static_cast<ptrdiff_t>(r) * score_stride + i;
      sr[0] = FinishDot<Row>(df, a0, qr, k0, hv, hd) * RowScale<Row>(key_scales, i);
      sr[run] = FinishDot<Row>(df, a1, qr, k1, hv, hd) * RowScale<Row>(key_scales, run + i);
      sr[2 * run] = FinishDot<Row>(df, a2, qr, k2, hv, hd) * RowScale<Row>(key_scales, 2 * run + i);
      sr[3 * run] = FinishDot<Row>(df, a3, qr, k3, hv, hd) * RowScale<Row>(key_scales, 3 * run + i);
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
      scores[static_cast<ptrdiff_t>(r) * score_stride + j] =
          FinishDot<Row>(df, a0, qr, k0, hv, hd) * RowScale<Row>(key_scales, j);
    }
  }
}

template <class Row>
HWY_INLINE void WeightedValues(const float* HWY_RESTRICT p, size_t rows, ptrdiff_t p_stride,
                               const typename Row::T* HWY_RESTRICT values, ptrdiff_t value_stride,
                               const float* HWY_RESTRICT value_scales, size_t n, size_t hd,
                               float* HWY_RESTRICT acc, ptrdiff_t acc_stride) {
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
  for (size_t r = 0; r < rows; ++r) {
    const float* pr = p + static_cast<ptrdiff_t>(r) * p_stride;
    float* ar = acc + static_cast<ptrdiff_t>(r) * acc_stride;
    size_t d = 0;
    // Four vectors of the output row stay in registers over all n value rows, taken in the order
    // i, run + i, 2 run + i, 3 run + i for i < run, then tail, tail + 1, ..., n - 1.
    for (; d + 4 * N <= hd; d += 4 * N) {
      auto a0 = hn::LoadU(df, ar + d), a1 = hn::LoadU(df, ar + d + N);
      auto a2 = hn::LoadU(df, ar + d + 2 * N), a3 = hn::LoadU(df, ar + d + 3 * N);
      const T* v = values + d;
      for (size_t i = 0; i < run; ++i, v += value_stride) {
        // The first row pass streams V from memory; later rows find it in cache.
        if (r == 0) PrefetchStreams(v, 4 * N * sizeof(T), static_cast<size_t>(run_stride) * sizeof(T));
        for (size_t s = 0; s < kStreams; ++s) {
          const T* vs = v + static_cast<ptrdiff_t>(s) * run_stride;
          const auto pj = hn::Set(df, weight(pr, s * run + i));
          a0 = hn::MulAdd(pj, Row::Load(df, vs), a0);
          a1 = hn::MulAdd(pj, Row::Load(df, vs + N), a1);
          a2 = hn::MulAdd(pj, Row::Load(df, vs + 2 * N), a2);
          a3 = hn::MulAdd(pj, Row::Load(df, vs + 3 * N), a3);
        }
      }
      v = values + d + static_cast<ptrdiff_t>(tail) * value_stride;
      for (size_t j = tail; j < n; ++j, v += value_stride) {
        const auto pj = hn::Set(df, weight(pr, j));
        a0 = hn::MulAdd(pj, Row::Load(df, v), a0);
        a1 = hn::MulAdd(pj, Row::Load(df, v + N), a1);
        a2 = hn::MulAdd(pj, Row::Load(df, v + 2 * N), a2);
        a3 = hn::MulAdd(pj, Row::Load(df, v + 3 * N), a3);
      }
      hn::StoreU(a0, df, ar + d);
      hn::StoreU(a1, df, ar + d + N);
      hn::StoreU(a2, df, ar + d + 2 * N);
      hn::StoreU(a3, df, ar + d + 3 * N);
    }
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

// See kernels/decode.h. `type`: 0 f32, 1 bf16, 2 f16, 5 int8 (kernels::CacheType).
inline void QueryKeyScores(const float* q, size_t rows, ptrdiff_t q_stride, const void* keys,
                           int type, ptrdiff_t key_stride, const float* key_scales, size_t n,
                           size_t hd, float* scores, ptrdiff_t score_stride) {
  namespace dd = decode_detail;
  if (type == 0) {
    dd::Scores<dd::F32Row>(q, rows, q_stride, static_cast<const float*>(keys), key_stride,
                           key_scales, n, hd, scores, score_stride);
  } else if (type == 1) {
    dd::Scores<dd::BF16Row>(q, rows, q_stride, static_cast<const uint16_t*>(keys), key_stride,
                            key_scales, n, hd, scores, score_stride);
  } else if (type == 2) {
    dd::Scores<dd::F16Row>(q, rows, q_stride, static_cast<const uint16_t*>(keys), key_stride,
                           key_scales, n, hd, scores, score_stride);
  } else {
    dd::Scores<dd::I8Row>(q, rows, q_stride, static_cast<const int8_t*>(keys), key_stride,
                          key_scales, n, hd, scores, score_stride);
  }
}

inline void AccumulateWeightedValues(const float* p, size_t rows, ptrdiff_t p_stride,
                                     const void* values, int type, ptrdiff_t value_stride,
                                     const float* value_scales, size_t n, size_t hd, float* acc,
                                     ptrdiff_t acc_stride) {
  namespace dd = decode_detail;
  if (type == 0) {
    dd::WeightedValues<dd::F32Row>(p, rows, p_stride, static_cast<const float*>(values),
                                   value_stride, value_scales, n, hd, acc, acc_stride);
  } else if (type == 1) {
    dd::WeightedValues<dd::BF16Row>(p, rows, p_stride, static_cast<const uint16_t*>(values),
                                    value_stride, value_scales, n, hd, acc, acc_stride);
  } else if (type == 2) {
    dd::WeightedValues<dd::F16Row>(p, rows, p_stride, static_cast<const uint16_t*>(values),
                                   value_stride, value_scales, n, hd, acc, acc_stride);
  } else {
    dd::WeightedValues<dd::I8Row>(p, rows, p_stride, static_cast<const int8_t*>(values),
                                  value_stride, value_scales, n, hd, acc, acc_stride);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_DECODE_INL_H_
