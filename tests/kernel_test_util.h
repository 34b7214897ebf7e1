// Helpers shared by the kernel tests: one parameterized test per Highway target compiled into
// mha that this CPU supports (the scalar fallback included), named after the target
// (PerTargetTest).
#ifndef MHA_TESTS_KERNEL_TEST_UTIL_H_
#define MHA_TESTS_KERNEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/gemm_bf16.h"
#include "kernels/targets.h"

namespace mha {
namespace test {

// A fixture for tests parameterized over the supported targets, so that each target is a test
// of its own, named after it (Targets/Suite.Name/AVX2): dispatch is forced to the test's target
// for its duration. Instantiate each suite with MHA_INSTANTIATE_PER_TARGET.
class PerTargetTest : public testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    kernels::ForceTarget(GetParam());
    ASSERT_EQ(kernels::ActiveTarget(), GetParam())
        << "dispatch did not switch to target " << target_name();
  }
  void TearDown() override { kernels::ForceTarget(0); }
  const char* target_name() const { return kernels::TargetName(GetParam()); }
  // Runs f with default dispatch (e.g. to make a layer as a caller would), then forces the
  // test's target again; an ASSERT inside f returns from f only.
  template <class F>
  void WithDefaultTarget(const F& f) {
    kernels::ForceTarget(0);
    f();
    kernels::ForceTarget(GetParam());
  }
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

// A float's bits and back.
inline uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// FNV-1a over the bits of some arrays of floats: names the inputs a result computed once (a
// double reference that every target's instance checks against) is of.
inline uint64_t Fingerprint(std::initializer_list<const std::vector<float>*> arrays) {
  uint64_t h = 14695981039346656037u;
  for (const std::vector<float>* v : arrays) {
    for (const float x : *v) h = (h ^ Bits(x)) * 1099511628211u;
  }
  return h;
}

// The reference bf16 rounding of the kernels (elementwise.h, gemm_bf16.h): nearest even, NaN
// quieted (sign and top payload bits kept, 0x0040 set); and a bf16's f32 value (exact).
inline uint16_t RoundBf16(float x) {
  const uint32_t u = Bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float FromBf16(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

// Every bf16 kernel (each test skips those this CPU does not run).
inline constexpr kernels::Bf16Kernel kAllBf16Kernels[] = {
    kernels::Bf16Kernel::kEmulated, kernels::Bf16Kernel::kAvx512Bf16, kernels::Bf16Kernel::kAmx,
    kernels::Bf16Kernel::kNeonBf16};

// n elements of heap memory aligned to 64 bytes (the kernels' scratch and packing alignment).
template <typename T>
struct Aligned {
  explicit Aligned(size_t n) : raw(new uint8_t[n * sizeof(T) + 64]) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(raw.get());
    data = reinterpret_cast<T*>(raw.get() + (64 - p % 64) % 64);
  }
  std::unique_ptr<uint8_t[]> raw;
  T* data;
};

}  // namespace test
}  // namespace mha

#define MHA_INSTANTIATE_PER_TARGET(Suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Targets, Suite, ::testing::ValuesIn(::mha::test::TestTargets()), \
                           ::mha::test::TargetTestName)

#endif  // MHA_TESTS_KERNEL_TEST_UTIL_H_
