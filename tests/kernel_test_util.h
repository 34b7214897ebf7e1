// Helpers shared by the kernel tests: run a check once per Highway target compiled into mha that
// this CPU supports (the scalar fallback included), with the target named in the log and in
// every failure message.
#ifndef MHA_TESTS_KERNEL_TEST_UTIL_H_
#define MHA_TESTS_KERNEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/targets.h"

namespace mha {
namespace test {

// Restores default dispatch when it goes out of scope (also on an early ASSERT return).
class ScopedTargetReset {
 public:
  ScopedTargetReset() = default;
  ScopedTargetReset(const ScopedTargetReset&) = delete;
  ScopedTargetReset& operator=(const ScopedTargetReset&) = delete;
  ~ScopedTargetReset() { kernels::ForceTarget(0); }
};

// Calls check(target_name) once per supported target, with dispatch forced to that target.
// Prints "[target] NAME" per target; failures inside check carry "target NAME" in their trace.
template <class Check>
void ForEachTarget(const Check& check) {
  kernels::ForceTarget(0);
  // Read once: SupportedTargets() reflects the forced target while one is forced.
  const std::vector<int64_t> targets = kernels::SupportedTargets();
  ASSERT_FALSE(targets.empty()) << "no Highway target compiled into mha runs on this CPU";
  ScopedTargetReset reset;
  for (const int64_t target : targets) {
    const char* name = kernels::TargetName(target);
    kernels::ForceTarget(target);
    ASSERT_EQ(kernels::ActiveTarget(), target)
        << "dispatch did not switch to target " << name << " (active: "
        << kernels::TargetName(kernels::ActiveTarget()) << ")";
    std::printf("[target] %s\n", name);
    std::fflush(stdout);
    SCOPED_TRACE(std::string("target ") + name);
    check(name);
  }
}

}  // namespace test
}  // namespace mha

#endif  // MHA_TESTS_KERNEL_TEST_UTIL_H_
