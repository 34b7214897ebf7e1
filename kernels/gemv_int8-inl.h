// Per-target code of the int8-activation products (contract and arithmetic in
// kernels/gemv_int8.h): the activation quantization (Highway vectors for the block maxima and
// codes) and the portable kernel (plain lane loops that the compiler vectorizes for each target;
// the exact int sums and lane-wise f32 operations make its bits the definition's). Included once
// per Highway target by kernels/gemv_int8.cc (foreach_target).

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_GEMV_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_GEMV_INT8_INL_H_
#undef MHA_KERNELS_GEMV_INT8_INL_H_
#else
#define MHA_KERNELS_GEMV_INT8_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "kernels/gemv_int8.h"
#include "kernels/quant.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace gemv_int8_detail {

namespace hn = hwy::HWY_NAMESPACE;

// Quantizes one block of B (32 or 128) activations, n of them valid (the rest read as zero),
// into codes (B int8, input order); returns the block's scale.
inline float QuantizeBlock(const float* a, size_t n, size_t block, int8_t* codes) {
  // At most 16 lanes, so that vectors tile a block of 32 (SVE may be up to 64 f32 lanes wide).
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(di)> d8;
  const size_t lanes = hn::Lanes(df);
  HWY_ALIGN float padded[kI4LargeBlock];
  if (n < block) {
    std::memset(padded, 0, sizeof(padded));
    std::memcpy(padded, a, n * sizeof(float));
    a = padded;
  }
  // Largest magnitude on the bits (sign cleared): an integer maximum, NaN-safe on every target.
  auto max_bits = hn::Zero(di);
  const auto abs_mask = hn::Set(di, 0x7FFFFFFF);
  for (size_t i = 0; i < block; i += lanes) {
    max_bits = hn::Max(max_bits, hn::And(hn::BitCast(di, hn::LoadU(df, a + i)), abs_mask));
  }
  const int32_t bits = hn::GetLane(hn::MaxOfLanes(di, max_bits));
  float amax;
  std::memcpy(&amax, &bits, sizeof(amax));
  if (bits >= 0x7F800000 || !(amax >= kInt8MinAmax)) {
    std::memset(codes, 0, block);
    return bits >= 0x7F800000 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  }
  const float scale = amax / 127.0f;
  const auto inv = hn::Set(df, 127.0f / amax);
  // Round to nearest even by adding and subtracting 1.5 * 2^23 (|a * inv| <= 127.5): two IEEE
  // additions, the same on every target (Highway's emulated NearestInt is not exact).
  const auto magic = hn::Set(df, 12582912.0f);
  const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
  for (size_t i = 0; i < block; i += lanes) {
    const auto x = hn::Mul(hn::LoadU(df, a + i), inv);
    const auto r = hn::Sub(hn::Add(x, magic), magic);
    const auto q = hn::Min(hn::Max(hn::ConvertTo(di, r), lo), hi);
    hn::StoreU(hn::DemoteTo(d8, q), d8, codes + i);
  }
  return scale;
}

inline void QuantizeRow(const float* a, size_t k, DType type, const Int8ActLayout& lay,
                        uint8_t* dst) {
  int8_t* codes = reinterpret_cast<int8_t*>(dst);
  float* scales = reinterpret_cast<float*>(dst + lay.scales_offset);
  int32_t* sums = reinterpret_cast<int32_t*>(dst + lay.sums_offset);
  HWY_ALIGN int8_t unit_codes[kI4Group];
  for (size_t u = 0; u < lay.units; ++u) {
    const size_t p0 = u * lay.unit;
    float block_scales[4];
    const size_t blocks = lay.unit / lay.block;
    for (size_t b = 0; b < blocks; ++b) {
      const size_t start = p0 + b * lay.block;
      const size_t n = start < k ? std::min(lay.block, k - start) : 0;
      block_scales[b] =
          QuantizeBlock(a + std::min(start, k), n, lay.block, unit_codes + b * lay.block);
    }
    int8_t* out = codes + p0;
    int32_t* lane_sums = sums + 16 * u;
    const int32_t offset = type == DType::kI8 ? -128 : -8;  // VPDPBUSD's unsigned weight bias
    for (size_t j = 0; j < 4; ++j) scales[4 * u + j] = block_scales[blocks == 4 ? j : 0];
    for (size_t l = 0; l < 4; ++l) {
      for (size_t j = 0; j < 4; ++j) {
        const int8_t* lo = unit_codes + 32 * j + 4 * l;
        std::memcpy(out + 16 * l + 4 * j, lo, 4);
        std::memcpy(out + 64 + 16 * l + 4 * j, lo + 16, 4);
        lane_sums[4 * l + j] =
            offset * (lo[0] + lo[1] + lo[2] + lo[3] + lo[16] + lo[17] + lo[18] + lo[19]);
      }
    }
  }
}

// The lane tree of the definition.
inline float LaneTree(const float* acc) {
  float t8[8], t4[4], t2[2];
  for (size_t l = 0; l < 8; ++l) t8[l] = acc[l] + acc[l + 8];
  for (size_t l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  for (size_t l = 0; l < 2; ++l) t2[l] = t4[l] + t4[l + 2];
  return t2[0] + t2[1];
}

// One output: activation row qa (layout lay) times weight row r of w.
inline float DotRow(const uint8_t* qa, const Int8ActLayout& lay, const QuantMatrix& w, size_t r) {
  const int8_t* codes = reinterpret_cast<const int8_t*>(qa);
  const float* ascales = reinterpret_cast<const float*>(qa + lay.scales_offset);
  const uint8_t* wrow = w.codes + r * w.row_bytes;
  const float* ws = w.scales + r * w.scales_per_row;
  float acc[16] = {};
  int32_t s[16];
  float f[16];
  if (w.type == DType::kI8) {
    const size_t full = w.cols / kI4Group;
    const int8_t* wq = reinterpret_cast<const int8_t*>(wrow);
    for (size_t u = 0; u < lay.units; ++u) {
      const int8_t* lo = codes + 128 * u;
      const int8_t* hi = lo + 64;
      for (size_t l = 0; l < 4; ++l) {
        for (size_t j = 0; j < 4; ++j) {
          const size_t p = 128 * u + 32 * j + 4 * l;  // the lane's first input
          int32_t sum = 0;
          for (size_t i = 0; i < 4; ++i) {
            if (u < full || p + i < w.cols) sum += lo[16 * l + 4 * j + i] * wq[p + i];
            if (u < full || p + 16 + i < w.cols) sum += hi[16 * l + 4 * j + i] * wq[p + 16 + i];
          }
          s[4 * l + j] = sum;
        }
      }
      for (size_t l = 0; l < 16; ++l) f[l] = static_cast<float>(s[l]) * ascales[4 * u + l % 4];
      for (size_t l = 0; l < 16; ++l) acc[l] = acc[l] + f[l];
    }
    return LaneTree(acc) * ws[0];
  }
  const bool block32 = w.block == kI4Block;
  for (size_t u = 0; u < lay.units; ++u) {
    const int8_t* lo = codes + 128 * u;
    const int8_t* hi = lo + 64;
    const uint8_t* g = wrow + kI4GroupBytes * u;
    for (size_t l = 0; l < 4; ++l) {
      for (size_t j = 0; j < 4; ++j) {
        int32_t sum = 0;
        for (size_t i = 0; i < 4; ++i) {
          const uint8_t byte = g[4 * (4 * l + i) + j];
          sum += lo[16 * l + 4 * j + i] * ((byte & 0xF) - 8) +
                 hi[16 * l + 4 * j + i] * ((byte >> 4) - 8);
        }
        s[4 * l + j] = sum;
      }
    }
    float scale4[4];
    for (size_t j = 0; j < 4; ++j) {
      const size_t b = block32 ? 4 * u + j : u;
      scale4[j] = ascales[4 * u + j] * (b < w.scales_per_row ? ws[b] : 0.0f);
    }
    for (size_t l = 0; l < 16; ++l) f[l] = static_cast<float>(s[l]) * scale4[l % 4];
    for (size_t l = 0; l < 16; ++l) acc[l] = acc[l] + f[l];
  }
  return LaneTree(acc);
}

}  // namespace gemv_int8_detail

// Rows [0, rows) of a into dst (gemv_int8.h's layout).
inline void QuantizeActivationsInt8Impl(const float* a, size_t lda, size_t rows, size_t k,
                                        DType type, size_t block, uint8_t* dst) {
  const Int8ActLayout lay = Int8ActLayoutOf(type, block, k);
  for (size_t i = 0; i < rows; ++i) {
    gemv_int8_detail::QuantizeRow(a + i * lda, k, type, lay, dst + i * lay.row_bytes);
  }
}

// The portable kernel: c row i = quantized row i times w^T.
inline void GemvInt8PortableImpl(const uint8_t* qa, size_t rows, const QuantMatrix& w, float* c,
                                 ptrdiff_t c_rs, ptrdiff_t c_cs) {
  const Int8ActLayout lay = Int8ActLayoutOf(w.type, w.block, w.cols);
  for (size_t r = 0; r < w.rows; ++r) {
    for (size_t i = 0; i < rows; ++i) {
      c[static_cast<ptrdiff_t>(i) * c_rs + static_cast<ptrdiff_t>(r) * c_cs] =
          gemv_int8_detail::DotRow(qa + i * lay.row_bytes, lay, w, r);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_GEMV_INT8_INL_H_
