// Tests of the bf16 products by quantized weights (kernels/gemm_bf16_quant.h): every Bf16Kernel
// this CPU runs (the others skip with the reason), and the emulated kernel on every Highway
// target this CPU supports; i8, i4 in blocks of 32 and 128; odd sizes (m 1..150: several token
// panels, n 1..200: several chunks of w's rows, k 1..1100: several k blocks and partial i4
// groups), a misaligned and strided a, c row-strided. Checked against a scalar reference (the
// bf16-rounded operands' products summed in double, f32 accumulation's bound) and bitwise
// against GemmBf16PackedB on the packing of bf16(w)^T (the same products in the same order; the
// bias added after the sums). PackBf16Transposed: bitwise PackBf16B of a^T. Nothing outside c's
// view is written.
#include "kernels/gemm_bf16_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm_bf16.h"
#include "kernels/quant.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace kernels {
namespace {

constexpr float kSentinel = -12345.5f;

using test::Aligned;

float Bf16Value(float x) { return test::FromBf16(test::RoundBf16(x)); }

// A quantized matrix [rows, cols] of random weights, its storage owned.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  QuantMatrix m;
};
Quantized Quantize(DType type, size_t block, size_t rows, size_t cols, std::mt19937* rng) {
  Quantized q;
  const size_t row_bytes = QuantRowBytes(type, block, cols);
  const size_t spr = QuantScalesPerRow(type, block, cols);
  q.codes.assign(rows * row_bytes, 0);
  q.scales.assign(rows * spr, 0.0f);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> row(cols);
  for (size_t r = 0; r < rows; ++r) {
    for (float& x : row) x = dist(*rng);
    QuantizeRow(row.data(), cols, type, block, q.codes.data() + r * row_bytes,
                q.scales.data() + r * spr);
  }
  q.m = {q.codes.data(), q.scales.data(), type, block, rows, cols, row_bytes, spr};
  return q;
}

struct Shape {
  size_t m, n, k;
};

// One product on `kernel`: checks c against the reference and GemmBf16PackedB, with and
// without a bias.
void CheckProduct(Bf16Kernel kernel, DType type, size_t block, const Shape& s, std::mt19937* rng) {
  const size_t m = s.m, n = s.n, k = s.k;
  SCOPED_TRACE(std::string(DTypeName(type)) + "/" + std::to_string(block) + " m " +
               std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k));
  const Quantized w = Quantize(type, block, n, k, rng);
  // a [m, k]: misaligned (one float in) and row-strided.
  const size_t lda = k + 3;
  std::vector<float> a_store(m * lda + 1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : a_store) x = dist(*rng);
  const ConstMatrixView a{a_store.data() + 1, m, k, static_cast<ptrdiff_t>(lda), 1};
  std::vector<float> bias(n);
  for (float& x : bias) x = dist(*rng);
  // bf16(w)^T's f32 source [k, n] (element (p, j) = DequantizedWeight(w, j, p)).
  std::vector<float> wt(k * n);
  for (size_t j = 0; j < n; ++j) {
    for (size_t p = 0; p < k; ++p) wt[p * n + j] = DequantizedWeight(w.m, j, p);
  }
  Aligned<uint16_t> at(PackedBf16Elements(k, m));
  const PackedBf16B packed_at = PackBf16Transposed(kernel, a, at.data);
  {
    // The transposed packing is PackBf16B's of a^T (the data has no subnormals).
    Aligned<uint16_t> want(PackedBf16Elements(k, m));
    PackBf16B(ConstMatrixView{a.data, k, m, 1, a.row_stride}, want.data);
    ASSERT_EQ(std::memcmp(at.data, want.data, PackedBf16Elements(k, m) * sizeof(uint16_t)), 0)
        << "PackBf16Transposed";
  }
  Aligned<uint16_t> wpack(PackedBf16Elements(k, n));
  const PackedBf16B packed_w =
      PackBf16B(ConstMatrixView{wt.data(), k, n, static_cast<ptrdiff_t>(n), 1}, wpack.data);
  Aligned<uint8_t> scratch(std::max(GemmBf16QuantScratchBytes(m), GemmBf16ScratchBytes()));
  const size_t ldc = n + 5;
  for (const bool with_bias : {false, true}) {
    std::vector<float> got(m * ldc, kSentinel), want(m * ldc, kSentinel);
    const MatrixView c{got.data(), m, n, static_cast<ptrdiff_t>(ldc), 1};
    GemmBf16QuantB(kernel, packed_at, w.m, with_bias ? bias.data() : nullptr, c, scratch.data);
    GemmBf16PackedB(kernel, 1.0f, a, packed_w, 0.0f, nullptr,
                    MatrixView{want.data(), m, n, static_cast<ptrdiff_t>(ldc), 1}, scratch.data);
    const double u = std::ldexp(1.0, -24);
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < ldc; ++j) {
        const float g = got[i * ldc + j];
        if (j >= n) {
          ASSERT_EQ(test::Bits(g), test::Bits(kSentinel)) << "wrote outside c at " << i << "," << j;
          continue;
        }
        // Bitwise: GemmBf16PackedB's sums, then the bias added once.
        const float sum = want[i * ldc + j];
        const float expect = with_bias ? sum + bias[j] : sum;
        ASSERT_EQ(test::Bits(g), test::Bits(expect)) << "vs GemmBf16PackedB at " << i << "," << j;
        double ref = with_bias ? bias[j] : 0.0, abs_sum = 0.0;
        for (size_t p = 0; p < k; ++p) {
          const double prod = static_cast<double>(Bf16Value(a.data[i * lda + p])) *
                              Bf16Value(DequantizedWeight(w.m, j, p));
          ref += prod;
          abs_sum += std::fabs(prod);
        }
        const double tol = (k + 2) * u * abs_sum + 4 * u * std::fabs(ref);
        ASSERT_LE(std::fabs(g - ref), tol) << "vs the reference at " << i << "," << j;
      }
    }
  }
}

void Sweep(Bf16Kernel kernel) {
  std::mt19937 rng(11);
  const Shape shapes[] = {{1, 1, 1},    {17, 7, 31},    {33, 96, 512}, {40, 97, 513},
                          {150, 50, 64}, {5, 200, 1100}, {64, 33, 129}, {31, 100, 300}};
  const struct {
    DType type;
    size_t block;
  } quants[] = {{DType::kI8, 0}, {DType::kI4, kI4Block}, {DType::kI4, kI4LargeBlock}};
  for (const auto& q : quants) {
    for (const Shape& s : shapes) {
      CheckProduct(kernel, q.type, q.block, s, &rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

class Bf16QuantKernelTest : public testing::TestWithParam<Bf16Kernel> {
 protected:
  void SetUp() override {
    if (!Bf16KernelAvailable(GetParam())) {
      GTEST_SKIP() << "this CPU does not run the " << Bf16KernelName(GetParam()) << " kernel";
    }
  }
};

TEST_P(Bf16QuantKernelTest, MatchesReferenceAndPackedB) { Sweep(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16QuantKernelTest, testing::ValuesIn(test::kAllBf16Kernels),
                         [](const testing::TestParamInfo<Bf16Kernel>& info) {
                           return std::string(Bf16KernelName(info.param));
                         });

// The emulated kernel (and the dequantization and rounding) on every Highway target.
class Bf16QuantTargetTest : public test::PerTargetTest {};

TEST_P(Bf16QuantTargetTest, EmulatedMatchesReferenceAndPackedB) { Sweep(Bf16Kernel::kEmulated); }

MHA_INSTANTIATE_PER_TARGET(Bf16QuantTargetTest);

// k == 0: c is the bias (or zeros), as GemmBf16PackedB gives.
TEST(Bf16QuantTest, EmptyDepth) {
  const QuantMatrix w{nullptr, nullptr, DType::kI8, 0, 3, 0, 0, 1};
  Aligned<uint16_t> at(32);
  const PackedBf16B packed{at.data, 0, 2, 2, 0, 0};
  std::vector<float> c(6, kSentinel);
  const float bias[3] = {1.5f, -2.0f, 0.25f};
  Aligned<uint8_t> scratch(GemmBf16QuantScratchBytes(2));
  GemmBf16QuantB(Bf16Kernel::kEmulated, packed, w, bias, MatrixView{c.data(), 2, 3, 3, 1},
                 scratch.data);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(c[i], bias[i % 3]);
}

}  // namespace
}  // namespace kernels
}  // namespace mha
