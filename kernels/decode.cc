// Dynamic dispatch of the decode kernels: decode-inl.h is compiled once per Highway target
// (foreach_target); each entry point dispatches once per call (one call covers a whole block of
// query rows against a block of cache rows).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/decode-inl.h"

#if HWY_ONCE
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/decode.h"

namespace mha {
namespace kernels {

namespace {
std::atomic<DecodePrefetch> g_prefetch{DecodePrefetch::kAuto};
}  // namespace

void SetDecodePrefetch(DecodePrefetch mode) { g_prefetch.store(mode, std::memory_order_relaxed); }

bool DecodePrefetchOnThisCpu() {
  static const bool on = [] {
    if (const char* env = std::getenv("MHA_DECODE_PREFETCH"); env != nullptr && *env != '\0') {
      if (std::strcmp(env, "on") == 0) return true;
      if (std::strcmp(env, "off") == 0) return false;
      std::fprintf(stderr, "mha: MHA_DECODE_PREFETCH=%s: unknown (on, off); ignored\n", env);
    }
    return CpuHasAmx();
  }();
  return on;
}

bool DecodePrefetchActive() {
  const DecodePrefetch mode = g_prefetch.load(std::memory_order_relaxed);
  return mode == DecodePrefetch::kAuto ? DecodePrefetchOnThisCpu() : mode == DecodePrefetch::kOn;
}

namespace {
// Whether the kernels prefetch rows of `type`: f32 rows as the setting says, the others always.
bool PrefetchRows(DType type) { return type != DType::kF32 || DecodePrefetchActive(); }
}  // namespace

HWY_EXPORT(QueryKeyScores);
HWY_EXPORT(AccumulateWeightedValues);

void QueryKeyScores(const float* q, size_t rows, ptrdiff_t q_stride, const void* keys, DType type,
                    ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                    float* scores, ptrdiff_t score_stride) {
  if (rows == 0 || n == 0) return;
  HWY_DYNAMIC_DISPATCH(QueryKeyScores)
  (q, rows, q_stride, keys, static_cast<int>(type), key_stride, key_scales, n, hd, scores,
   score_stride, PrefetchRows(type));
}

void AccumulateWeightedValues(const float* p, size_t rows, ptrdiff_t p_stride, const void* values,
                              DType type, ptrdiff_t value_stride, const float* value_scales,
                              size_t n, size_t hd, float* acc, ptrdiff_t acc_stride) {
  if (rows == 0 || n == 0 || hd == 0) return;
  HWY_DYNAMIC_DISPATCH(AccumulateWeightedValues)
  (p, rows, p_stride, values, static_cast<int>(type), value_stride, value_scales, n, hd, acc,
   acc_stride, PrefetchRows(type));
}

void QuantizeRowI8(const float* x, size_t hd, int8_t* codes, float* scale) {
  float amax = 0.0f;
  for (size_t d = 0; d < hd; ++d) {
    const float a = std::fabs(x[d]);
    // A NaN, once met, stays (a later element compared with NaN would replace it).
    if (!(a <= amax) && amax == amax) amax = a;
  }
  *scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (size_t d = 0; d < hd; ++d) {
    float c = x[d] * inv;
    c = c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c;
    // Round half to even (the default rounding mode): adding 1.5 * 2^23 leaves no fraction bits
    // for |c| < 2^22, so the sum is rounded to an integer (what nearbyint does, without a libm
    // call per element).
    codes[d] = static_cast<int8_t>(c == c ? (c + 0x1.8p23f) - 0x1.8p23f : 0.0f);
  }
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
