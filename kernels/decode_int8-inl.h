// Per-target code of the int8 dot-product decode kernels (decode_int8.h): the quantization of a
// block of the softmax's weights, which the portable kernel runs on every Highway target. Its
// operations (f32 products, maximum, quotients, clamp, round half to even) are exact IEEE ones,
// so every target and the VNNI kernel's own vector code give the same bits. Included once per
// target by kernels/decode_int8.cc (foreach_target).

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_DECODE_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_DECODE_INT8_INL_H_
#undef MHA_KERNELS_DECODE_INT8_INL_H_
#else
#define MHA_KERNELS_DECODE_INT8_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "kernels/decode_int8.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// QuantizeWeightsBlock (decode_int8.h) on this target.
void QuantizeWeightsBlockHwy(const float* p, const float* value_scales, size_t count,
                             uint8_t* codes, float* scale) {
  // At most kDotValueBlock lanes (SVE vectors may hold 64 floats).
  const hn::CappedTag<float, kDotValueBlock> d;
  const hn::Rebind<int32_t, decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> du8;
  const size_t N = hn::Lanes(d);
  // The block's inputs, zero-padded to whole vectors (Highway 1.0.3's MaskedLoad reads the whole
  // vector on some targets; kDotValueBlock is a multiple of every lane count up to it).
  HWY_ALIGN float pp[kDotValueBlock] = {}, vs[kDotValueBlock] = {}, w[kDotValueBlock];
  std::memcpy(pp, p, count * sizeof(float));
  std::memcpy(vs, value_scales, count * sizeof(float));
  auto vmax = hn::Zero(d);
  bool finite = true;
  for (size_t i = 0; i < count; i += N) {
    const auto x = hn::Mul(hn::Load(d, pp + i), hn::Load(d, vs + i));
    finite = finite && hn::AllTrue(d, hn::IsFinite(x));
    vmax = hn::Max(vmax, x);
    hn::Store(x, d, w + i);
  }
  std::memset(codes, 0, kDotValueBlock);
  if (!finite) {
    *scale = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  if (mx < 0x1p-100f) {
    *scale = 0.0f;
    return;
  }
  *scale = mx / 255.0f;
  const auto inv = hn::Set(d, 255.0f / mx);
  const auto lo = hn::Zero(d), hi = hn::Set(d, 255.0f), magic = hn::Set(d, 0x1.8p23f);
  HWY_ALIGN uint8_t c[kDotValueBlock];
  for (size_t i = 0; i < count; i += N) {
    const auto x = hn::Min(hn::Max(hn::Mul(hn::Load(d, w + i), inv), lo), hi);
    // Round half to even by adding and subtracting 1.5 * 2^23 (exact below 2^22), as the scalar
    // definition does: Highway 1.0.3's NearestInt and Round on EMU128 and SCALAR add 0.5 and
    // truncate (0.49999997 -> 1). The result is an integer, so the conversion is exact.
    const auto r = hn::Sub(hn::Add(x, magic), magic);
    hn::StoreU(hn::DemoteTo(du8, hn::ConvertTo(di, r)), du8, c + i);
  }
  std::memcpy(codes, c, count);
}

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_DECODE_INT8_INL_H_
