// kernels/pack_bf16.h on every target: rows rounded as kernels::F32ToBF16 rounds them (ties,
// NaN, inf, values that round to inf), zero padding, and one k block packed into the layout of
// gemm_bf16.h from a b with contiguous rows, contiguous columns or neither, against an
// element-by-element scalar packing, on odd sizes and misaligned data.
#include "kernels/pack_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

// Random floats with the special values a rounding must get right mixed in.
std::vector<float> Values(size_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max(),  // rounds to inf
                           1.0f + 1.0f / 256.0f,               // a tie, rounds to even (down)
                           1.0f + 3.0f / 256.0f,               // a tie, rounds up
                           std::numeric_limits<float>::denorm_min(),
                           -0.0f};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = (*rng)() % 7 == 0 ? special[(*rng)() % 7] : normal(*rng);
  }
  return v;
}

// The rounding pack_bf16.h promises: kernels::F32ToBF16's, element by element.
uint16_t RoundOne(float x) {
  uint16_t h;
  kernels::F32ToBF16(&x, &h, 1);
  return h;
}

class PackBf16Test : public test::PerTargetTest {};

TEST_P(PackBf16Test, RoundRowsIsF32ToBF16PerRowThenZeros) {
  std::mt19937 rng(1);
  for (size_t cols : {1, 5, 16, 17, 63, 64, 100, 512}) {
    const size_t rows = 7, row_stride = cols + 3, padded = (cols + 31) / 32 * 32,
                 stride = padded + 5;
    const std::vector<float> a = Values(rows * row_stride + 1, &rng);
    std::vector<uint16_t> got(rows * stride + 1, 0xABCD);
    kernels::RoundRowsToBF16(a.data() + 1, row_stride, rows, cols, padded, got.data() + 1, stride);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < stride; ++j) {
        const uint16_t want = j < cols     ? RoundOne(a[1 + i * row_stride + j])
                              : j < padded ? 0
                                           : 0xABCD;
        ASSERT_EQ(got[1 + i * stride + j], want) << "row " << i << " col " << j << " of " << cols;
      }
    }
  }
}

TEST_P(PackBf16Test, BlockMatchesTheScalarLayout) {
  std::mt19937 rng(2);
  for (size_t kc : {1, 2, 3, 31, 32, 33, 64, 77, 512}) {
    for (size_t n : {1, 15, 16, 17, 32, 33, 70, 100}) {
      const size_t depth =
          (kc + kernels::kBf16DepthAlign - 1) / kernels::kBf16DepthAlign * kernels::kBf16DepthAlign;
      const size_t panels = (n + 31) / 32;
      const size_t panel_stride = depth * 32;
      // 0: rows contiguous, 1: columns contiguous, 2: neither.
      for (int layout = 0; layout < 3; ++layout) {
        const ptrdiff_t ld = static_cast<ptrdiff_t>((layout == 1 ? kc : n) + 3);
        const ptrdiff_t rs = layout == 0 ? ld : layout == 1 ? 1 : 2 * ld;
        const ptrdiff_t cs = layout == 0 ? 1 : layout == 1 ? ld : 2;
        const std::vector<float> b = Values(static_cast<size_t>(2 * ld) * (kc + n) + 8, &rng);
        const float* src = b.data() + 1;  // misaligned
        std::vector<uint16_t> want(panels * panel_stride + 1, 0), got(want.size(), 0);
        for (size_t kk = 0; kk < kc; ++kk) {
          for (size_t j = 0; j < n; ++j) {
            want[1 + (j / 32) * panel_stride + (kk / 2) * 64 + (j % 32) * 2 + kk % 2] =
                RoundOne(src[static_cast<ptrdiff_t>(kk) * rs + static_cast<ptrdiff_t>(j) * cs]);
          }
        }
        kernels::PackBF16Block(src, rs, cs, kc, n, got.data() + 1, panel_stride);
        ASSERT_EQ(got, want) << "kc " << kc << " n " << n << " layout " << layout;
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(PackBf16Test);

#if defined(__x86_64__)
// The x86 kernels' rounding: RoundRowsToBF16's bits, but f32 subnormals become zero of their sign.
TEST(PackBf16FlushedTest, RoundRowsAsF32ToBF16ButSubnormalsToZero) {
  if (!kernels::Bf16KernelAvailable(kernels::Bf16Kernel::kAvx512Bf16)) {
    GTEST_SKIP() << "this CPU has no AVX512_BF16";
  }
  std::mt19937 rng(3);
  for (size_t cols : {1, 15, 16, 17, 31, 32, 33, 64, 100, 512}) {
    const size_t rows = 5, row_stride = cols + 1, padded = (cols + 31) / 32 * 32 + 32;
    const size_t stride = padded + 3;
    std::vector<float> a = Values(rows * row_stride + 1, &rng);
    a[1] = -std::numeric_limits<float>::denorm_min();
    std::vector<uint16_t> got(rows * stride + 1, 0xABCD);
    kernels::RoundRowsToBF16Flushed(a.data() + 1, row_stride, rows, cols, padded, got.data() + 1,
                                    stride);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < stride; ++j) {
        uint16_t want = 0xABCD;
        if (j < cols) {
          const float x = a[1 + i * row_stride + j];
          want = std::fpclassify(x) == FP_SUBNORMAL ? (std::signbit(x) ? 0x8000 : 0) : RoundOne(x);
        } else if (j < padded) {
          want = 0;
        }
        ASSERT_EQ(got[1 + i * stride + j], want) << "row " << i << " col " << j << " of " << cols;
      }
    }
  }
}
#endif

}  // namespace
}  // namespace mha
