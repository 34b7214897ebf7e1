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
#include <strings.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

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

int64_t ActiveTarget() {
  TargetsFromEnvironment();
  return HWY_DYNAMIC_DISPATCH(CurrentTarget)();
}

bool ActiveTargetIsAvx512() {
#if HWY_ARCH_X86
  return ActiveTarget() <= HWY_AVX3;
#else
  return false;
#endif
}

namespace {
std::atomic<uint64_t> g_dispatch_epoch{0};
}  // namespace

uint64_t DispatchEpoch() { return g_dispatch_epoch.load(std::memory_order_relaxed); }
void AdvanceDispatchEpoch() { g_dispatch_epoch.fetch_add(1, std::memory_order_relaxed); }

void ForceTarget(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
  AdvanceDispatchEpoch();
}

int64_t SupportedTargetByName(const char* name) {
  for (int64_t t : SupportedTargets()) {
    if (strcasecmp(name, TargetName(t)) == 0) return t;
  }
  return 0;
}

namespace {

// BLIS 0.9.0's arch_t values of its AVX2 configurations, as BLIS_ARCH_TYPE takes them.
[[maybe_unused]] constexpr const char* kBlisArchHaswell = "3";
[[maybe_unused]] constexpr const char* kBlisArchZen3 = "6";

// Asks BLIS for its AVX2 kernels (haswell, or zen3 on AMD) unless the caller set BLIS_ARCH_TYPE.
// The library's one setenv, and why it cannot do without: BLIS 0.9.0 chooses its configuration
// once, at its first use, from the environment variable BLIS_ARCH_TYPE (bli_arch_set_id, run
// once by bli_arch_query_id), and offers no call to choose it: its shared library exports
// bli_arch_query_id and bli_arch_string only; bli_arch_set_id takes no argument, and neither
// bli_gks_lookup_nat_cntx nor the per-configuration bli_cntx_init_<arch> are exported (checked
// against blis.h and `nm -D libblis.so.4`). It runs once, from TargetsFromEnvironment, before
// BLIS's first use and never at load; only for MHA_TARGETS naming a target below AVX3, a
// developer's request for measurements; on other architectures it does nothing. setenv is not thread-safe against getenv in other
// threads: it runs inside the process's first mha call (context or layer creation, or the first
// kernel), as a developer override should.
void SelectBlisAvx2ConfigurationThroughEnvironment() {
#if HWY_ARCH_X86
  if (std::getenv("BLIS_ARCH_TYPE") != nullptr) return;
  setenv("BLIS_ARCH_TYPE", __builtin_cpu_is("amd") ? kBlisArchZen3 : kBlisArchHaswell, 0);
#endif
}

std::string ApplyTargetsFromEnvironment() {
  const char* name = std::getenv("MHA_TARGETS");
  if (name == nullptr || *name == '\0') return "";
  const int64_t target = SupportedTargetByName(name);
  if (target == 0) {
    std::string supported;
    for (int64_t t : SupportedTargets()) supported += std::string(" ") + TargetName(t);
    const std::string message = std::string("MHA_TARGETS: expected one of the supported targets (") +
                                supported.substr(1) + "), got '" + name + "'; ignored";
    // Said once on stderr: the variable is a developer's request, and a silent fallback would
    // measure the wrong paths.
    std::fprintf(stderr, "mha: %s\n", message.c_str());
    return message;
  }
  // BLIS's AVX-512 configurations (skx, knl) would keep AVX-512 kernels under an AVX2 target
  // (x86 only: elsewhere the call does nothing).
  if (target != HWY_AVX3 && target != HWY_AVX3_DL) SelectBlisAvx2ConfigurationThroughEnvironment();
  ForceTarget(target);
  return std::string("MHA_TARGETS=") + TargetName(target);
}

}  // namespace

const std::string& TargetsFromEnvironment() {
  static const std::string applied = ApplyTargetsFromEnvironment();
  return applied;
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
