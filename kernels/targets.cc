// Compiled once per Highway target (foreach_target) so that ActiveTarget reports exactly what
// HWY_DYNAMIC_DISPATCH selects for the kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/targets.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {

int64_t CurrentTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/targets.h"
#include "hwy/targets.h"

namespace mha {
namespace kernels {

HWY_EXPORT(CurrentTarget);

std::vector<int64_t> SupportedTargets() {
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  // Highway 1.0.3 makes its dispatch choice before it adds SVE2_128/SVE_256 to the supported
  // set: choose again so 128-bit SVE2 and 256-bit SVE cores get their best target.
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return targets;
}

const char* TargetName(int64_t target) { return hwy::TargetName(target); }

int64_t ActiveTarget() { return HWY_DYNAMIC_DISPATCH(CurrentTarget)(); }

void ForceTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
