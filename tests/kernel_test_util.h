// Helpers shared by the kernel tests: run a check once per Highway target compiled into mha that
// this CPU supports (the scalar fallback included), with the target named in the log and in
// every failure message (ForEachTarget), or as one parameterized test per target
// (PerTargetTest).
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

// A fixture for tests parameterized over the targets ForEachTarget visits, so that each target
// is a test of its own, named after it (Targets/Suite.Name/AVX2): dispatch is forced to the
// test's target for its duration. Instantiate each suite with MHA_INSTANTIATE_PER_TARGET.
class PerTargetTest : public testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    kernels::ForceTarget(GetParam());
    ASSERT_EQ(kernels::ActiveTarget(), GetParam())
        << "dispatch did not switch to target " << target_name();
  }
  void TearDown() override { kernels::ForceTarget(0); }
  const char* target_name() const { return kernels::TargetName(GetParam()); }
};

// The targets of a parameterized suite: those compiled into mha that this CPU supports, read
// with no target forced.
inline std::vector<int64_t> TestTargets() {
  kernels::ForceTarget(0);
  return kernels::SupportedTargets();
}

inline std::string TargetTestName(const testing::TestParamInfo<int64_t>& info) {
  return kernels::TargetName(info.param);
}

}  // namespace test
}  // namespace mha

#define MHA_INSTANTIATE_PER_TARGET(Suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Targets, Suite, ::testing::ValuesIn(::mha::test::TestTargets()), \
                           ::mha::test::TargetTestName)

#endif  // MHA_TESTS_KERNEL_TEST_UTIL_H_
