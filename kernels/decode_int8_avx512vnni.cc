// DecodeDotKernel::kAvx512Vnni: the int8 dot-product decode kernels (decode_int8.h) on
// AVX512_VNNI (VPDPBUSD: 4 unsigned bytes times 4 signed bytes added to a 32-bit lane). x86-64
// only; every function carries the instruction set's target attribute (the rest of the library
// is compiled for baseline x86-64) and runs only after DecodeDotKernelAvailable.
//
// Scores: a tile of 16 cached key rows is transposed by dwords (16 x 16), so that vector g holds
// bytes 4g..4g+3 of each of the 16 rows in lane i = row i; VPDPBUSD with a query row's 4 codes
// broadcast then adds to lane i its part of row i's dot product: after every dword of the row,
// lane i is the whole score of row i, with no sum across lanes. The keys are the unsigned operand
// (code + 128, an xor of the sign bit); the accumulator starts at -128 times the query row's code
// sum, so it ends at the exact sum of code products. One transpose serves up to 4 query rows.
// Values: 4 cached value rows are interleaved by bytes (8 unpacks), so that each dword holds one
// column of the 4 rows, in the lane order d = 16 L + 4 k + i of vector k (L the 128-bit lane);
// VPDPBUSD with the 4 rows' weight codes broadcast adds c_j * v_jd over the 4 rows. A block ends
// with the definition's f32 update, lane by lane, of accumulators kept in that lane order for
// the whole call (put there and back by a 4 x 4 transpose of 128-bit lanes, once per call). The
// weights of a block are quantized with vector operations that give QuantizeWeightsBlock's bits
// (the same f32 products, maximum, quotient and rounding).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/decode_int8.h"
#include "kernels/decode_int8_native.h"

#define MHA_DOT_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define MHA_DOT_INLINE MHA_DOT_ATTR inline __attribute__((always_inline))

namespace mha {
namespace kernels {
// Above-baseline code lives in this namespace and the entry points only
// (tools/cross/check-x86-baseline allows exactly those).
namespace decode_int8_avx512vnni {
namespace {

constexpr size_t kMaxRows = 4;          // query / probability rows per pass
constexpr size_t kKeyTile = 16;         // key rows per transposed tile
constexpr ptrdiff_t kValueAhead = 128;  // value rows requested ahead of the group read
constexpr size_t kKeyAhead = 96;        // key rows requested ahead of the tile read
// All lanes: the zero-masking forms of the intrinsics whose plain forms start from
// _mm512_undefined_*, which GCC 12 reports as maybe-uninitialized.
constexpr __mmask16 kAll = 0xFFFF;
constexpr __mmask8 kAll8 = 0xFF;

MHA_DOT_INLINE __mmask64 ByteMask(size_t bytes) {
  return bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1;
}
MHA_DOT_INLINE __mmask16 LaneMask(size_t lanes) {
  return lanes >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << lanes) - 1);
}
MHA_DOT_INLINE int32_t LoadDword(const void* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

// acc + the dword sums of a's unsigned bytes times b's signed bytes (VPDPBUSD). In asm: with the
// intrinsic, GCC 12 copies every accumulator of a loop to a new register and back on each
// iteration (22 moves and 2 spills per 16 VPDPBUSD in the value sums' loop).
MHA_DOT_INLINE __m512i Dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// The 4 x 4 transpose of 128-bit lanes: out[L] = lane L of x[0], x[1], x[2], x[3].
MHA_DOT_INLINE void TransposeLanes(const __m512i x[4], __m512i out[4]) {
  const __m512i t0 = _mm512_maskz_shuffle_i32x4(kAll, x[0], x[1], 0x44);
  const __m512i t1 = _mm512_maskz_shuffle_i32x4(kAll, x[2], x[3], 0x44);
  const __m512i t2 = _mm512_maskz_shuffle_i32x4(kAll, x[0], x[1], 0xEE);
  const __m512i t3 = _mm512_maskz_shuffle_i32x4(kAll, x[2], x[3], 0xEE);
  out[0] = _mm512_maskz_shuffle_i32x4(kAll, t0, t1, 0x88);
  out[1] = _mm512_maskz_shuffle_i32x4(kAll, t0, t1, 0xDD);
  out[2] = _mm512_maskz_shuffle_i32x4(kAll, t2, t3, 0x88);
  out[3] = _mm512_maskz_shuffle_i32x4(kAll, t2, t3, 0xDD);
}

// The 16 x 16 transpose of dwords: out[g] lane i = dword g of r[i].
MHA_DOT_INLINE void TransposeDwords(const __m512i r[16], __m512i out[16]) {
  __m512i a[16], b[16];
  for (int p = 0; p < 8; ++p) {
    a[2 * p] = _mm512_maskz_unpacklo_epi32(kAll, r[2 * p], r[2 * p + 1]);
    a[2 * p + 1] = _mm512_maskz_unpackhi_epi32(kAll, r[2 * p], r[2 * p + 1]);
  }
  // b[4q + m] lane L: rows 4q..4q+3 at dword 4L + m.
  for (int q = 0; q < 4; ++q) {
    b[4 * q + 0] = _mm512_maskz_unpacklo_epi64(kAll8, a[4 * q], a[4 * q + 2]);
    b[4 * q + 1] = _mm512_maskz_unpackhi_epi64(kAll8, a[4 * q], a[4 * q + 2]);
    b[4 * q + 2] = _mm512_maskz_unpacklo_epi64(kAll8, a[4 * q + 1], a[4 * q + 3]);
    b[4 * q + 3] = _mm512_maskz_unpackhi_epi64(kAll8, a[4 * q + 1], a[4 * q + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i x[4] = {b[m], b[4 + m], b[8 + m], b[12 + m]};
    __m512i t[4];
    TransposeLanes(x, t);
    for (int l = 0; l < 4; ++l) out[4 * l + m] = t[l];
  }
}

// NR quantized query rows against the key rows [j0, j0 + nt), nt <= 16.
template <size_t NR>
MHA_DOT_INLINE void ScoreTile(const int8_t (*qc)[kDotMaxHeadDim], const float* qs,
                              const int32_t* qsum, const int8_t* keys, ptrdiff_t key_stride,
                              const float* key_scales, size_t j0, size_t nt, size_t hd,
                              float* scores, ptrdiff_t score_stride) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acc[NR];
  for (size_t r = 0; r < NR; ++r) acc[r] = _mm512_set1_epi32(-128 * qsum[r]);
  for (size_t c = 0; c < hd; c += 64) {
    const size_t bytes = std::min<size_t>(64, hd - c);
    const __mmask64 mask = ByteMask(bytes);
    __m512i rows[kKeyTile], cols[kKeyTile];
    for (size_t i = 0; i < kKeyTile; ++i) {
      // The rows kKeyAhead positions on (a hint: past the call's rows it reads nothing).
      _mm_prefetch(reinterpret_cast<const char*>(
                       keys + static_cast<ptrdiff_t>(j0 + kKeyAhead + i) * key_stride + c),
                   _MM_HINT_T0);
    }
    for (size_t i = 0; i < kKeyTile; ++i) {
      rows[i] = i < nt ? _mm512_xor_si512(
                             _mm512_maskz_loadu_epi8(
                                 mask, keys + static_cast<ptrdiff_t>(j0 + i) * key_stride + c),
                             sign)
                       : sign;
    }
    TransposeDwords(rows, cols);
    const size_t groups = (bytes + 3) / 4;
    for (size_t g = 0; g < groups; ++g) {
      for (size_t r = 0; r < NR; ++r) {
        acc[r] =
            _mm512_dpbusd_epi32(acc[r], cols[g], _mm512_set1_epi32(LoadDword(qc[r] + c + 4 * g)));
      }
    }
  }
  const __mmask16 lanes = LaneMask(nt);
  const __m512 ks = _mm512_maskz_loadu_ps(lanes, key_scales + j0);
  for (size_t r = 0; r < NR; ++r) {
    const __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, acc[r]), ks),
                                   _mm512_set1_ps(qs[r]));
    _mm512_mask_storeu_ps(scores + static_cast<ptrdiff_t>(r) * score_stride + j0, lanes, s);
  }
}

// The largest of x's lanes (no NaN: the caller checked).
MHA_DOT_INLINE float MaxLane(__m512 x) {
  const __m256 h = _mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xFF, x, 0),
                                 _mm512_maskz_extractf32x8_ps(0xFF, x, 1));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// QuantizeQueryRowForDot in vectors, for a row of finite values (the same maximum, quotients,
// clamp and round-half-even conversion as QuantizeRowI8); rows with a NaN or an infinity take the
// scalar function, whose special cases they are.
MHA_DOT_INLINE void QuantizeQuery(const float* q, size_t hd, int8_t* codes, float* scale,
                                  int32_t* sum) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (size_t d = 0; d < hd; d += 16) {
    const __m512 x = _mm512_maskz_loadu_ps(LaneMask(hd - d), q + d);
    bad |= _mm512_fpclass_ps_mask(x, 0x99);
    amax = _mm512_maskz_max_ps(kAll, amax, _mm512_abs_ps(x));
  }
  if (bad != 0) {
    QuantizeQueryRowForDot(q, hd, codes, scale, sum);
    return;
  }
  const size_t padded = (hd + 63) / 64 * 64;
  const float a = MaxLane(amax);
  const float inv_a = 127.0f / a;
  if (a > 0.0f && !(inv_a <= 3.4e38f)) {
    // 127 / a overflows (a below ~3.7e-37): QuantizeRowI8's NaN products (0 * inf) become code
    // 0 there, which the clamp below would not give.
    QuantizeQueryRowForDot(q, hd, codes, scale, sum);
    return;
  }
  *scale = a / 127.0f;
  if (!(a > 0.0f)) {
    std::memset(codes, 0, padded);
    *sum = 0;
    return;
  }
  const __m512 inv = _mm512_set1_ps(inv_a);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  __m512i s = _mm512_setzero_si512();
  size_t d = 0;
  for (; d < hd; d += 16) {
    const __m512 x = _mm512_maskz_loadu_ps(LaneMask(hd - d), q + d);
    const __m512 c =
        _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, _mm512_mul_ps(x, inv), lo), hi);
    const __m512i ci = _mm512_maskz_cvtps_epi32(kAll, c);
    s = _mm512_add_epi32(s, ci);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + d), _mm512_maskz_cvtepi32_epi8(kAll, ci));
  }
  std::memset(codes + d, 0, padded - d);
  const __m256i h = _mm256_add_epi32(_mm512_maskz_extracti32x8_epi32(0xFF, s, 0),
                                     _mm512_maskz_extracti32x8_epi32(0xFF, s, 1));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *sum = _mm_cvtsi128_si32(t);
}

template <size_t NR>
MHA_DOT_ATTR void ScoreRows(const float* q, ptrdiff_t q_stride, const int8_t* keys,
                            ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                            float* scores, ptrdiff_t score_stride) {
  alignas(64) int8_t qc[NR][kDotMaxHeadDim];
  float qs[NR];
  int32_t qsum[NR];
  for (size_t r = 0; r < NR; ++r) {
    QuantizeQuery(q + static_cast<ptrdiff_t>(r) * q_stride, hd, qc[r], &qs[r], &qsum[r]);
  }
  for (size_t j0 = 0; j0 < n; j0 += kKeyTile) {
    ScoreTile<NR>(qc, qs, qsum, keys, key_stride, key_scales, j0, std::min(kKeyTile, n - j0), hd,
                  scores, score_stride);
  }
}

// QuantizeWeightsBlock for NR rows of a block's weights (p row r at p + r * p_stride), in
// vectors: the same f32 products, maximum (from 0), quotients (the NR rows' in one division) and
// round-half-even conversion.
template <size_t NR>
MHA_DOT_INLINE void QuantizeBlocks(const float* p, ptrdiff_t p_stride, const float* value_scales,
                                   size_t count, uint8_t (*codes)[kDotValueBlock], float* scale) {
  const __mmask16 m0 = LaneMask(count), m1 = LaneMask(count > 16 ? count - 16 : 0);
  const __m512 vs0 = _mm512_maskz_loadu_ps(m0, value_scales);
  const __m512 vs1 = _mm512_maskz_loadu_ps(m1, value_scales + 16);
  __m512 w[NR][2];
  bool bad[NR];
  float m[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  for (size_t r = 0; r < NR; ++r) {
    const float* pr = p + static_cast<ptrdiff_t>(r) * p_stride;
    w[r][0] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, pr), vs0);
    w[r][1] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, pr + 16), vs1);
    // QNaN, SNaN, +inf, -inf.
    bad[r] = (_mm512_fpclass_ps_mask(w[r][0], 0x99) | _mm512_fpclass_ps_mask(w[r][1], 0x99)) != 0;
    m[r] = std::max(0.0f, MaxLane(_mm512_maskz_max_ps(kAll, w[r][0], w[r][1])));
  }
  const __m128 m4 = _mm_setr_ps(m[0], m[1], m[2], m[3]);
  alignas(16) float inv[4], sc[4];
  _mm_store_ps(inv, _mm_div_ps(_mm_set1_ps(255.0f), m4));
  _mm_store_ps(sc, _mm_div_ps(m4, _mm_set1_ps(255.0f)));
  const __m512 zero = _mm512_setzero_ps();
  for (size_t r = 0; r < NR; ++r) {
    if (bad[r] || m[r] < 0x1p-100f) {
      std::memset(codes[r], 0, kDotValueBlock);
      scale[r] = bad[r] ? __builtin_nanf("") : 0.0f;
      continue;
    }
    scale[r] = sc[r];
    const __m512 iv = _mm512_set1_ps(inv[r]);
    for (int h = 0; h < 2; ++h) {
      // No clamp at 255: w <= m, so w * (255 / m) rounds to at most 255 (1 + 2^-23), whose
      // nearest integer is 255.
      const __m512 c = _mm512_maskz_max_ps(kAll, _mm512_mul_ps(w[r][h], iv), zero);
      _mm_store_si128(reinterpret_cast<__m128i*>(codes[r] + 16 * h),
                      _mm512_maskz_cvtepi32_epi8(kAll, _mm512_maskz_cvtps_epi32(kAll, c)));
    }
  }
}

// The 4 value rows x interleaved by bytes: z[k] dword (L, i) = column 16 L + 4 k + i of the rows.
MHA_DOT_INLINE void InterleaveRows(const __m512i x[4], __m512i z[4]) {
  const __m512i lo01 = _mm512_unpacklo_epi8(x[0], x[1]), lo23 = _mm512_unpacklo_epi8(x[2], x[3]);
  const __m512i hi01 = _mm512_unpackhi_epi8(x[0], x[1]), hi23 = _mm512_unpackhi_epi8(x[2], x[3]);
  z[0] = _mm512_unpacklo_epi16(lo01, lo23);
  z[1] = _mm512_unpackhi_epi16(lo01, lo23);
  z[2] = _mm512_unpacklo_epi16(hi01, hi23);
  z[3] = _mm512_unpackhi_epi16(hi01, hi23);
}

template <size_t NR>
MHA_DOT_INLINE void AddGroup(const __m512i z[4], const uint8_t (*codes)[kDotValueBlock], size_t g,
                             __m512i (*sums)[4]) {
  for (size_t r = 0; r < NR; ++r) {
    const __m512i w = _mm512_set1_epi32(LoadDword(codes[r] + 4 * g));
    for (int k = 0; k < 4; ++k) sums[r][k] = Dpbusd(sums[r][k], w, z[k]);
  }
}

// NR probability rows over the value rows [b0, b0 + count), count <= kDotValueBlock, into accp:
// the rows' accumulators in the sums' lane order (InterleaveRows), padded to 64 columns.
template <size_t NR>
MHA_DOT_INLINE void ValueBlock(const float* p, ptrdiff_t p_stride, const int8_t* values,
                               ptrdiff_t value_stride, const float* value_scales, size_t b0,
                               size_t count, size_t hd, float (*accp)[kDotMaxHeadDim]) {
  alignas(64) uint8_t codes[NR][kDotValueBlock];
  float scale[NR];
  QuantizeBlocks<NR>(p + b0, p_stride, value_scales + b0, count, codes, scale);
  const size_t full = count / 4;
  for (size_t c = 0; c < hd; c += 64) {
    const __mmask64 mask = ByteMask(hd - c);
    const int8_t* v = values + static_cast<ptrdiff_t>(b0) * value_stride + c;
    __m512i sums[NR][4];
    for (size_t r = 0; r < NR; ++r) {
      for (int k = 0; k < 4; ++k) sums[r][k] = _mm512_setzero_si512();
    }
    for (size_t g = 0; g < full; ++g) {
      const int8_t* vg = v + static_cast<ptrdiff_t>(4 * g) * value_stride;
      __m512i x[4], z[4];
      for (int i = 0; i < 4; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(vg + (kValueAhead + i) * value_stride),
                     _MM_HINT_T0);
        x[i] = _mm512_maskz_loadu_epi8(mask, vg + i * value_stride);
      }
      InterleaveRows(x, z);
      AddGroup<NR>(z, codes, g, sums);
    }
    if (count % 4 != 0) {
      const int8_t* vg = v + static_cast<ptrdiff_t>(4 * full) * value_stride;
      __m512i x[4], z[4];
      for (size_t i = 0; i < 4; ++i) {
        x[i] = 4 * full + i < count ? _mm512_maskz_loadu_epi8(mask, vg + i * value_stride)
                                    : _mm512_setzero_si512();
      }
      InterleaveRows(x, z);
      AddGroup<NR>(z, codes, full, sums);
    }
    for (size_t r = 0; r < NR; ++r) {
      const __m512 sc = _mm512_set1_ps(scale[r]);
      for (int k = 0; k < 4; ++k) {
        float* a = accp[r] + c + 16 * k;
        const __m512 add = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, sums[r][k]), sc);
        _mm512_store_ps(a, _mm512_add_ps(_mm512_load_ps(a), add));
      }
    }
  }
}

// Moves NR accumulator rows between acc (column order) and accp (the sums' lane order): the
// lane order's vector k holds 128-bit lane k of the column order's 4 vectors, a 4 x 4 transpose
// of 128-bit lanes, its own inverse.
template <size_t NR, bool kToLaneOrder>
MHA_DOT_INLINE void MoveAccumulators(float* acc, ptrdiff_t acc_stride, size_t hd,
                                     float (*accp)[kDotMaxHeadDim]) {
  for (size_t r = 0; r < NR; ++r) {
    float* a = acc + static_cast<ptrdiff_t>(r) * acc_stride;
    for (size_t c = 0; c < hd; c += 64) {
      __m512i x[4], t[4];
      for (size_t k = 0; k < 4; ++k) {
        x[k] = kToLaneOrder ? _mm512_castps_si512(_mm512_maskz_loadu_ps(
                                  c + 16 * k < hd ? LaneMask(hd - c - 16 * k) : 0, a + c + 16 * k))
                            : _mm512_castps_si512(_mm512_load_ps(accp[r] + c + 16 * k));
      }
      TransposeLanes(x, t);
      for (size_t k = 0; k < 4; ++k) {
        if (kToLaneOrder) {
          _mm512_store_ps(accp[r] + c + 16 * k, _mm512_castsi512_ps(t[k]));
        } else if (c + 16 * k < hd) {
          _mm512_mask_storeu_ps(a + c + 16 * k, LaneMask(hd - c - 16 * k),
                                _mm512_castsi512_ps(t[k]));
        }
      }
    }
  }
}

template <size_t NR>
MHA_DOT_ATTR void ValueRows(const float* p, ptrdiff_t p_stride, const int8_t* values,
                            ptrdiff_t value_stride, const float* value_scales, size_t n, size_t hd,
                            float* acc, ptrdiff_t acc_stride) {
  // The accumulators stay in the sums' lane order for the whole call: a block's update is then
  // lane-wise, and the two reorderings run once per call instead of once per block.
  alignas(64) float accp[NR][kDotMaxHeadDim];
  MoveAccumulators<NR, true>(acc, acc_stride, hd, accp);
  for (size_t b0 = 0; b0 < n; b0 += kDotValueBlock) {
    ValueBlock<NR>(p, p_stride, values, value_stride, value_scales, b0,
                   std::min(kDotValueBlock, n - b0), hd, accp);
  }
  MoveAccumulators<NR, false>(acc, acc_stride, hd, accp);
}

}  // namespace
}  // namespace decode_int8_avx512vnni

MHA_DOT_ATTR void ScoresDotAvx512Vnni(const float* q, size_t rows, ptrdiff_t q_stride,
                                      const int8_t* keys, ptrdiff_t key_stride,
                                      const float* key_scales, size_t n, size_t hd, float* scores,
                                      ptrdiff_t score_stride) {
  using namespace decode_int8_avx512vnni;  // NOLINT
  for (size_t r = 0; r < rows; r += kMaxRows) {
    const float* qr = q + static_cast<ptrdiff_t>(r) * q_stride;
    float* sr = scores + static_cast<ptrdiff_t>(r) * score_stride;
    switch (std::min(kMaxRows, rows - r)) {
      case 1:
        ScoreRows<1>(qr, q_stride, keys, key_stride, key_scales, n, hd, sr, score_stride);
        break;
      case 2:
        ScoreRows<2>(qr, q_stride, keys, key_stride, key_scales, n, hd, sr, score_stride);
        break;
      case 3:
        ScoreRows<3>(qr, q_stride, keys, key_stride, key_scales, n, hd, sr, score_stride);
        break;
      default:
        ScoreRows<4>(qr, q_stride, keys, key_stride, key_scales, n, hd, sr, score_stride);
    }
  }
}

MHA_DOT_ATTR void ValuesDotAvx512Vnni(const float* p, size_t rows, ptrdiff_t p_stride,
                                      const int8_t* values, ptrdiff_t value_stride,
                                      const float* value_scales, size_t n, size_t hd, float* acc,
                                      ptrdiff_t acc_stride) {
  using namespace decode_int8_avx512vnni;  // NOLINT
  for (size_t r = 0; r < rows; r += kMaxRows) {
    const float* pr = p + static_cast<ptrdiff_t>(r) * p_stride;
    float* ar = acc + static_cast<ptrdiff_t>(r) * acc_stride;
    switch (std::min(kMaxRows, rows - r)) {
      case 1:
        ValueRows<1>(pr, p_stride, values, value_stride, value_scales, n, hd, ar, acc_stride);
        break;
      case 2:
        ValueRows<2>(pr, p_stride, values, value_stride, value_scales, n, hd, ar, acc_stride);
        break;
      case 3:
        ValueRows<3>(pr, p_stride, values, value_stride, value_scales, n, hd, ar, acc_stride);
        break;
      default:
        ValueRows<4>(pr, p_stride, values, value_stride, value_scales, n, hd, ar, acc_stride);
    }
  }
}

}  // namespace kernels
}  // namespace mha
