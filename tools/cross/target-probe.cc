// target-probe: prints the Highway targets mha's kernels were compiled for that this (possibly
// emulated) CPU supports, best first, and the one dynamic dispatch selects. Built and run by
// tools/cross/cross-test against the build directory's libmha_kernels.a, so it reports exactly
// what the kernels (and the tests that loop over kernels::SupportedTargets()) see.
#include <cstdio>

#include "kernels/targets.h"

int main() {
  // Dispatch first: with Highway 1.0.3, calling hwy::SupportedTargets() before the first
  // dynamic dispatch leaves the chosen target without SVE2_128/SVE_256 (see README.md).
  const char* dispatched = mha::kernels::TargetName(mha::kernels::ActiveTarget());
  std::printf("targets:");
  for (long long t : mha::kernels::SupportedTargets()) {
    std::printf(" %s", mha::kernels::TargetName(t));
  }
  std::printf(" | dispatch: %s\n", dispatched);
  return 0;
}
