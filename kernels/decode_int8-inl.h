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
void QuantizeWeightsBlockHwy(const float* p, const float* value_scales, size_t count, float* codes,
                             float* scale) {
  // At most kDotValueBlock lanes (SVE vectors may hold 64 floats).
  const hn::CappedTag<float, kDotValueBlock> d;
  const size_t N = hn::Lanes(d);
  // A short block's inputs, zero-padded to whole vectors (Highway 1.0.3's MaskedLoad reads the
  // whole vector on some targets; kDotValueBlock is a multiple of every lane count up to it).
  HWY_ALIGN float pp[kDotValueBlock], vs[kDotValueBlock];
  if (count < kDotValueBlock) {
    std::memset(pp, 0, sizeof(pp));
    std::memset(vs, 0, sizeof(vs));
    std::memcpy(pp, p, count * sizeof(float));
    std::memcpy(vs, value_scales, count * sizeof(float));
    p = pp;
    value_scales = vs;
  }
  auto vmax = hn::Zero(d);
  bool finite = true;
  for (size_t i = 0; i < kDotValueBlock; i += N) {
    const auto x = hn::Mul(hn::LoadU(d, p + i), hn::LoadU(d, value_scales + i));
    finite = finite && hn::AllTrue(d, hn::IsFinite(x));
    vmax = hn::Max(vmax, x);
    hn::Store(x, d, codes + i);  // the weights, for now
  }
  const float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  if (!finite || mx < 0x1p-100f) {
    std::memset(codes, 0, kDotValueBlock * sizeof(float));
    *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  *scale = mx / 255.0f;
  const auto inv = hn::Set(d, 255.0f / mx);
  const auto lo = hn::Zero(d), hi = hn::Set(d, 255.0f), magic = hn::Set(d, 0x1.8p23f);
  for (size_t i = 0; i < kDotValueBlock; i += N) {
    const auto x = hn::Min(hn::Max(hn::Mul(hn::Load(d, codes + i), inv), lo), hi);
    // Round half to even by adding and subtracting 1.5 * 2^23 (exact below 2^22), as the scalar
    // definition does: Highway 1.0.3's NearestInt and Round on EMU128 and SCALAR add 0.5 and
    // truncate (0.49999997 -> 1). Positions past `count` have weight 0: code 0.
    hn::Store(hn::Sub(hn::Add(x, magic), magic), d, codes + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_DECODE_INT8_INL_H_
