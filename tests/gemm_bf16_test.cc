// Tests of the bf16 compute products (kernels/gemm_bf16.h): every Bf16Kernel this CPU runs (the
// others skip with the reason), and the emulated kernel on every Highway target this CPU
// supports, against a scalar reference (the bf16-rounded operands' products summed in double),
// with a tolerance from f32 accumulation's bound relative to sum |a| |b|. Odd sizes (m 1..37, n
// 1..100, k 1..1100: several k blocks), misaligned and strided a, b and c, row- and
// column-stored c, alpha / beta / bias combinations, column and row views of a packing, bf16
// and f16 b. Bitwise: the emulated kernel on every target equals AVX512_BF16 (normal inputs),
// and splitting a's rows into separate calls changes no bit. Nothing outside c's view is
// written, and beta == 0 does not read c (NaN there does not propagate).
#include "kernels/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace kernels {
namespace {

constexpr float kSentinel = -12345.5f;

using test::Aligned;
using test::Bits;
using test::FromBits;
using test::RoundBf16;
float Bf16Value(float x) { return test::FromBf16(RoundBf16(x)); }

// Scalar reference of one product: c = alpha * bf16(a) bf16(b) + beta * c + bias, in double;
// tol per element from the f32 accumulation bound: (k + 2) * 2^-24 * |alpha| * sum |a||b| plus
// the epilogue's roundings (a few ulps of the terms).
void Reference(float alpha, const MatrixView& a, const MatrixView& b, float beta, const float* bias,
               const MatrixView& c, std::vector<double>* ref, std::vector<double>* tol) {
  const size_t m = c.rows, n = c.cols, k = a.cols;
  ref->assign(m * n, 0.0);
  tol->assign(m * n, 0.0);
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (size_t p = 0; p < k; ++p) {
        const double prod =
            static_cast<double>(Bf16Value(a.data[i * a.row_stride + p * a.col_stride])) *
            Bf16Value(b.data[p * b.row_stride + j * b.col_stride]);
        sum += prod;
        abs_sum += std::fabs(prod);
      }
      const double old =
          beta == 0.0f ? 0.0 : c.data[i * c.row_stride + j * c.col_stride] * double{beta};
      const double bj = bias != nullptr ? bias[j] : 0.0;
      const double r = alpha * sum + old + bj;
      (*ref)[i * n + j] = r;
      (*tol)[i * n + j] = (k + 2) * u * std::fabs(alpha) * abs_sum +
                          4 * u * (std::fabs(alpha * sum) + std::fabs(old) + std::fabs(bj));
    }
  }
}

// Runs the active kernel on a case and checks it against the reference: a [m, k] (rows a_rs
// apart, offset floats into its buffer), b [k, n] row-stored with padded stride, c row- or
// column-stored in a sentinel-filled buffer. Returns c's values (row-major) for bitwise
// comparisons.
struct Case {
  size_t m, n, k;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  bool c_col_major = false;
  size_t offset = 0;          // floats: misaligns a, b and c
  bool a_col_stride = false;  // a stored column-major (col_stride != 1)
  uint32_t seed = 1;
};

std::string Describe(const Case& cs) {
  return "m " + std::to_string(cs.m) + " n " + std::to_string(cs.n) + " k " + std::to_string(cs.k) +
         " alpha " + std::to_string(cs.alpha) + " beta " + std::to_string(cs.beta) +
         (cs.bias ? " bias" : "") + (cs.c_col_major ? " c col-major" : "") +
         (cs.a_col_stride ? " a col-major" : "") + " offset " + std::to_string(cs.offset) +
         " kernel " + Bf16KernelName(Bf16ActiveKernel());
}

std::vector<float> RunCase(const Case& cs) {
  SCOPED_TRACE(Describe(cs));
  std::mt19937 rng(cs.seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t m = cs.m, n = cs.n, k = cs.k, off = cs.offset;
  const size_t a_ld = (cs.a_col_stride ? m : k) + 3;
  std::vector<float> a_buf(off + a_ld * (cs.a_col_stride ? k : m) + 1);
  for (float& x : a_buf) x = dist(rng);
  const MatrixView a = cs.a_col_stride
                           ? MatrixView{a_buf.data() + off, m, k, 1, static_cast<ptrdiff_t>(a_ld)}
                           : MatrixView{a_buf.data() + off, m, k, static_cast<ptrdiff_t>(a_ld), 1};
  const size_t b_ld = n + 5;
  std::vector<float> b_buf(off + b_ld * k + 1);
  for (float& x : b_buf) x = dist(rng);
  const MatrixView b{b_buf.data() + off, k, n, static_cast<ptrdiff_t>(b_ld), 1};
  std::vector<float> bias(n);
  for (float& x : bias) x = dist(rng);
  const size_t c_ld = (cs.c_col_major ? m : n) + 2;
  const size_t c_size = off + c_ld * (cs.c_col_major ? n : m) + 3;
  std::vector<float> c_buf(c_size, kSentinel);
  const MatrixView c = cs.c_col_major
                           ? MatrixView{c_buf.data() + off, m, n, 1, static_cast<ptrdiff_t>(c_ld)}
                           : MatrixView{c_buf.data() + off, m, n, static_cast<ptrdiff_t>(c_ld), 1};
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      c.data[i * c.row_stride + j * c.col_stride] =
          cs.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
    }
  }
  std::vector<double> ref, tol;
  Reference(cs.alpha, a, b, cs.beta, cs.bias ? bias.data() : nullptr, c, &ref, &tol);
  // The packing 64-byte aligned, then moved by 0 or 64 bytes: the kernels may assume nothing
  // past the contract's alignment.
  Aligned<uint16_t> packed(PackedBf16Elements(k, n) + 32);
  const PackedBf16B pb = PackBf16B(b, packed.data + (off % 2) * 32);
  Aligned<uint8_t> scratch(GemmBf16ScratchBytes());
  GemmBf16PackedB(cs.alpha, a, pb, cs.beta, cs.bias ? bias.data() : nullptr, c, scratch.data);
  std::vector<float> out(m * n);
  size_t bad = 0;
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const float got = c.data[i * c.row_stride + j * c.col_stride];
      out[i * n + j] = got;
      const double err = std::fabs(got - ref[i * n + j]);
      if (!(err <= tol[i * n + j]) && bad++ < 5) {
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", reference " << ref[i * n + j]
                      << ", error " << err << " > bound " << tol[i * n + j];
      }
    }
  }
  // Nothing outside c's view written.
  std::vector<bool> inside(c_size, false);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) inside[off + i * c.row_stride + j * c.col_stride] = true;
  }
  for (size_t x = 0; x < c_size; ++x) {
    if (!inside[x] && c_buf[x] != kSentinel) {
      ADD_FAILURE() << "wrote outside c at buffer index " << x;
      break;
    }
  }
  return out;
}

// The sizes every kernel runs: k across the 32-alignment and the 512-deep blocks, m across the
// kernels' row tiles (4, 6, 8, 16, 32) and the driver's 96-row chunks, n across 16- and
// 32-column panels.
const size_t kKs[] = {1, 2, 3, 17, 32, 33, 100, 511, 512, 513, 1024, 1100};
const size_t kMn[][2] = {{1, 1},   {1, 100}, {2, 33},  {3, 16},  {5, 17},   {7, 64},
                         {13, 31}, {16, 32}, {17, 65}, {31, 47}, {37, 100}, {36, 96}};

// Every size of the sweep, cycling the alpha/beta/bias/layout combinations so each meets many
// shapes.
void Sweep(size_t k_stride = 1) {
  size_t index = 0;
  for (size_t ki = 0; ki < std::size(kKs); ki += k_stride) {
    for (const auto& mn : kMn) {
      Case cs{mn[0], mn[1], kKs[ki]};
      const size_t v = index++;
      const float alphas[] = {1.0f, 0.5f, -2.0f, 1.0f};
      const float betas[] = {0.0f, 1.5f, 0.0f, 1.0f};
      cs.alpha = alphas[v % 4];
      cs.beta = betas[(v / 4) % 4];
      cs.bias = v % 3 == 1;
      cs.c_col_major = v % 5 == 2;
      cs.a_col_stride = v % 7 == 3;
      cs.offset = v % 3;
      cs.seed = static_cast<uint32_t>(v + 1);
      RunCase(cs);
      if (testing::Test::HasFailure()) return;  // the first failing case is enough
    }
  }
}

// Runs each available Bf16Kernel in turn.
class Bf16KernelTest : public testing::TestWithParam<Bf16Kernel> {
 protected:
  void SetUp() override {
    if (!Bf16KernelAvailable(GetParam())) {
      GTEST_SKIP() << Bf16KernelName(GetParam())
                   << " does not run here (the CPU or OS lacks the instructions; amx: or the "
                      "tile data permission; neon_bf16: or gemm_bf16_neon.cc is not built)";
    }
    ForceBf16Kernel(GetParam());
  }
  void TearDown() override { ForceBf16Kernel(Bf16DefaultKernel()); }
};

TEST_P(Bf16KernelTest, MatchesReference) { Sweep(); }

TEST_P(Bf16KernelTest, RowSplitsGiveTheSameBits) {
  for (const size_t k : {33, 700}) {
    const size_t m = 37, n = 70;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> a(m * k), b(k * n), bias(n), c_init(m * n);
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
    for (float& x : bias) x = dist(rng);
    for (float& x : c_init) x = dist(rng);
    Aligned<uint16_t> packed(PackedBf16Elements(k, n));
    const PackedBf16B pb = PackBf16B({b.data(), k, n, static_cast<ptrdiff_t>(n), 1}, packed.data);
    Aligned<uint8_t> scratch(GemmBf16ScratchBytes());
    const MatrixView av{a.data(), m, k, static_cast<ptrdiff_t>(k), 1};
    std::vector<float> whole = c_init;
    const MatrixView cw{whole.data(), m, n, static_cast<ptrdiff_t>(n), 1};
    GemmBf16PackedB(0.75f, av, pb, 0.5f, bias.data(), cw, scratch.data);
    for (const size_t split : {1, 5, 16, 17, 33}) {
      std::vector<float> parts = c_init;
      const MatrixView cp{parts.data(), m, n, static_cast<ptrdiff_t>(n), 1};
      for (size_t r = 0; r < m; r += split) {
        const size_t rows = std::min(split, m - r);
        GemmBf16PackedB(0.75f, av.Block(r, 0, rows, k), pb, 0.5f, bias.data(),
                        cp.Block(r, 0, rows, n), scratch.data);
      }
      for (size_t x = 0; x < m * n; ++x) {
        ASSERT_EQ(Bits(parts[x]), Bits(whole[x]))
            << "k " << k << " split " << split << " element " << x;
      }
    }
  }
}

// Column ranges (Columns), leading rows (LeadingRows) and row ranges (Rows) of a packing equal
// packing the sub-matrix itself, bitwise.
TEST_P(Bf16KernelTest, ViewsOfAPacking) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t m = 19, k = 600, n = 130;
  std::vector<float> a(m * k), b(k * n);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  const MatrixView bv{b.data(), k, n, static_cast<ptrdiff_t>(n), 1};
  Aligned<uint16_t> packed(PackedBf16Elements(k, n));
  const PackedBf16B pb = PackBf16B(bv, packed.data);
  Aligned<uint8_t> scratch(GemmBf16ScratchBytes());
  // The product of a's columns [a0, a0 + kk) with view `view`, against the product with the
  // sub-matrix b[r0 + .., c0 + ..] packed on its own.
  auto check = [&](const PackedBf16B& view, size_t a0, size_t r0, size_t c0, const char* what) {
    SCOPED_TRACE(what);
    const size_t kk = view.k, nc = view.n;
    const MatrixView av{a.data() + a0, m, kk, static_cast<ptrdiff_t>(k), 1};
    std::vector<float> got(m * nc), want(m * nc);
    GemmBf16PackedB(1.0f, av, view, 0.0f, nullptr,
                    {got.data(), m, nc, static_cast<ptrdiff_t>(nc), 1}, scratch.data);
    Aligned<uint16_t> own(PackedBf16Elements(kk, nc));
    const PackedBf16B ob = PackBf16B(bv.Block(r0, c0, kk, nc), own.data);
    GemmBf16PackedB(1.0f, av, ob, 0.0f, nullptr,
                    {want.data(), m, nc, static_cast<ptrdiff_t>(nc), 1}, scratch.data);
    for (size_t x = 0; x < m * nc; ++x) ASSERT_EQ(Bits(got[x]), Bits(want[x])) << "element " << x;
  };
  check(pb.Columns(32, 70), 0, 0, 32, "Columns(32, 70)");
  check(pb.Columns(96, 34), 0, 0, 96, "Columns(96, 34)");
  check(pb.LeadingRows(300), 0, 0, 0, "LeadingRows(300)");
  check(pb.LeadingRows(530).Columns(64, 66), 0, 0, 64, "LeadingRows(530).Columns(64, 66)");
  // Rows of a one-block packing.
  const size_t k1 = 300;
  Aligned<uint16_t> packed1(PackedBf16Elements(k1, n));
  const PackedBf16B pb1 = PackBf16B(bv.Block(0, 0, k1, n), packed1.data);
  check(pb1.Rows(64, 100), 64, 64, 0, "Rows(64, 100)");
  check(pb1.Rows(32, 268), 32, 32, 0, "Rows(32, 268)");
  check(pb1.Rows(256, 44).Columns(32, 40), 256, 256, 32, "Rows(256, 44).Columns(32, 40)");
}

// k == 0 and alpha == 0: c = beta * c (+ bias), a and b not read.
TEST_P(Bf16KernelTest, TrivialProducts) {
  const size_t m = 3, n = 5, k = 4;
  std::vector<float> a(m * k, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> b(k * n, 1.0f), bias = {1, 2, 3, 4, 5}, c(m * n, 2.0f);
  Aligned<uint16_t> packed(PackedBf16Elements(k, n));
  const PackedBf16B pb = PackBf16B({b.data(), k, n, static_cast<ptrdiff_t>(n), 1}, packed.data);
  Aligned<uint8_t> scratch(GemmBf16ScratchBytes());
  const MatrixView cv{c.data(), m, n, static_cast<ptrdiff_t>(n), 1};
  GemmBf16PackedB(0.0f, {a.data(), m, k, static_cast<ptrdiff_t>(k), 1}, pb, 0.5f, bias.data(), cv,
                  scratch.data);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) EXPECT_EQ(c[i * n + j], 1.0f + bias[j]);
  }
  GemmBf16PackedB(1.0f, {a.data(), m, 0, static_cast<ptrdiff_t>(k), 1}, pb.LeadingRows(0), 0.0f,
                  nullptr, cv, scratch.data);
  for (const float x : c) EXPECT_EQ(x, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16KernelTest, testing::ValuesIn(test::kAllBf16Kernels),
                         [](const testing::TestParamInfo<Bf16Kernel>& info) {
                           return std::string(Bf16KernelName(info.param));
                         });

// The emulated kernel on every Highway target: the reference sweep (every other depth), and
// its bits against the default target's and AVX512_BF16's (normal inputs: the same roundings).
class Bf16EmulatedTargetTest : public test::PerTargetTest {
 protected:
  void SetUp() override {
    test::PerTargetTest::SetUp();
    ForceBf16Kernel(Bf16Kernel::kEmulated);
  }
  void TearDown() override {
    ForceBf16Kernel(Bf16DefaultKernel());
    test::PerTargetTest::TearDown();
  }
};

TEST_P(Bf16EmulatedTargetTest, MatchesReference) { Sweep(/*k_stride=*/2); }

TEST_P(Bf16EmulatedTargetTest, BitwiseEqualToOtherTargetsAndAvx512Bf16) {
  size_t index = 0;
  for (const size_t k : {1, 31, 64, 513, 1100}) {
    for (const auto& mn : kMn) {
      Case cs{mn[0], mn[1], k};
      cs.alpha = index % 2 ? 0.5f : 1.0f;
      cs.beta = index % 3 ? 0.0f : 1.25f;
      cs.bias = index % 4 == 1;
      cs.seed = static_cast<uint32_t>(100 + index++);
      const std::vector<float> here = RunCase(cs);
      std::vector<float> other;
      WithDefaultTarget([&] { other = RunCase(cs); });
      ASSERT_EQ(here.size(), other.size());
      for (size_t x = 0; x < here.size(); ++x) {
        ASSERT_EQ(Bits(here[x]), Bits(other[x]))
            << Describe(cs) << ": element " << x << " differs from the default target's";
      }
      if (Bf16KernelAvailable(Bf16Kernel::kAvx512Bf16)) {
        ForceBf16Kernel(Bf16Kernel::kAvx512Bf16);
        other = RunCase(cs);
        ForceBf16Kernel(Bf16Kernel::kEmulated);
        for (size_t x = 0; x < here.size(); ++x) {
          ASSERT_EQ(Bits(here[x]), Bits(other[x]))
              << Describe(cs) << ": element " << x << " differs from avx512_bf16's";
        }
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(Bf16EmulatedTargetTest);

// The packed layout (gemm_bf16.h): element (kk, j) of block kk / 512 at panel j / 32, pair row
// (kk % 512) / 2, offset (j % 32) * 2 + kk % 2; zero padding; each element rounded as
// kernels::F32ToBF16 (NaN and the largest values included).
TEST(PackBf16Test, LayoutAndRounding) {
  const size_t k = 530, n = 45;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> b(k * n);
  for (float& x : b) x = dist(rng);
  b[7] = std::numeric_limits<float>::quiet_NaN();
  b[8] = -std::numeric_limits<float>::infinity();
  b[9] = std::numeric_limits<float>::max();
  b[10] = FromBits(0x7F800001u);  // signalling NaN
  b[11] = FromBits(0x3F808000u);  // a tie: rounds to even
  b[12] = FromBits(0x3F818000u);  // a tie: rounds up to even
  std::vector<uint16_t> rounded(b.size());
  F32ToBF16(b.data(), rounded.data(), b.size());
  const size_t elements = PackedBf16Elements(k, n);
  // Blocks of 512 and 18 -> 32 rows, 2 panels of 32 columns.
  EXPECT_EQ(elements, 2u * 32 * (512 + 32));
  EXPECT_EQ(PackedBf16Elements(0, 10), 0u);
  EXPECT_EQ(PackedBf16Elements(1, 1), 32u * 32);
  std::vector<uint16_t> packed(elements, 0xFFFF);
  const PackedBf16B pb = PackBf16B({b.data(), k, n, static_cast<ptrdiff_t>(n), 1}, packed.data());
  EXPECT_EQ(pb.k, k);
  EXPECT_EQ(pb.n, n);
  EXPECT_EQ(pb.packed_n, n);
  EXPECT_EQ(pb.packed_k, k);
  EXPECT_EQ(pb.col0, 0u);
  std::vector<bool> seen(elements, false);
  for (size_t kk = 0; kk < k; ++kk) {
    const size_t block = kk / 512, depth = block == 0 ? 512 : 32, in = kk % 512;
    for (size_t j = 0; j < n; ++j) {
      const size_t at =
          block * 2 * 32 * 512 + (j / 32) * depth * 32 + (in / 2) * 64 + (j % 32) * 2 + in % 2;
      ASSERT_EQ(packed[at], rounded[kk * n + j]) << "kk " << kk << " j " << j;
      ASSERT_EQ(packed[at], RoundBf16(b[kk * n + j])) << "kk " << kk << " j " << j;
      seen[at] = true;
    }
  }
  for (size_t x = 0; x < elements; ++x) {
    if (!seen[x]) {
      ASSERT_EQ(packed[x], 0u) << "padding at " << x;
    }
  }
  EXPECT_EQ(packed[(11 % n) * 2 + 0], 0x3F80u);  // row 0, column 11: even k
  EXPECT_EQ(packed[(12 % n) * 2 + 0], 0x3F82u);
}

// PackBf16BHalf: bf16 copied exactly, f16 widened exactly and rounded once: the packing of the
// widened f32 b, bitwise; strided (column-major) sources included.
TEST(PackBf16Test, HalfSources) {
  const size_t k = 70, n = 37;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (const DType type : {DType::kBF16, DType::kF16}) {
    for (const bool col_major : {false, true}) {
      SCOPED_TRACE(std::string(type == DType::kBF16 ? "bf16" : "f16") +
                   (col_major ? " column-major" : " row-major"));
      std::vector<float> src(k * n);
      for (float& x : src) x = dist(rng);
      src[3] = std::numeric_limits<float>::quiet_NaN();
      src[4] = std::numeric_limits<float>::infinity();
      src[5] = 1e-6f;  // f16 subnormal
      std::vector<uint16_t> h(src.size());
      std::vector<float> wide(src.size());
      if (type == DType::kBF16) {
        F32ToBF16(src.data(), h.data(), src.size());
        BF16ToF32(h.data(), wide.data(), h.size());
      } else {
        F32ToF16(src.data(), h.data(), src.size());
        F16ToF32(h.data(), wide.data(), h.size());
      }
      // Element (kk, j) at kk * rs + j * cs of both arrays.
      const ptrdiff_t rs = col_major ? 1 : static_cast<ptrdiff_t>(n);
      const ptrdiff_t cs = col_major ? static_cast<ptrdiff_t>(k) : 1;
      std::vector<uint16_t> from_half(PackedBf16Elements(k, n), 1);
      std::vector<uint16_t> from_f32(from_half.size(), 2);
      PackBf16BHalf({h.data(), type, k, n, rs, cs}, from_half.data());
      PackBf16B({wide.data(), k, n, rs, cs}, from_f32.data());
      ASSERT_EQ(from_half, from_f32);
      if (type == DType::kBF16) {
        // bf16 exactly: (0, 0) is element 0 of the packing.
        EXPECT_EQ(from_half[0], h[0]);
      }
    }
  }
}

TEST(Bf16KernelChoiceTest, NamesAndDefault) {
  EXPECT_STREQ(Bf16KernelName(Bf16Kernel::kEmulated), "emulated");
  EXPECT_STREQ(Bf16KernelName(Bf16Kernel::kAvx512Bf16), "avx512_bf16");
  EXPECT_STREQ(Bf16KernelName(Bf16Kernel::kAmx), "amx");
  EXPECT_STREQ(Bf16KernelName(Bf16Kernel::kNeonBf16), "neon_bf16");
  EXPECT_TRUE(Bf16KernelAvailable(Bf16Kernel::kEmulated));
  EXPECT_TRUE(Bf16KernelAvailable(Bf16DefaultKernel()));
  EXPECT_EQ(Bf16ActiveKernel(), Bf16DefaultKernel());
  ForceBf16Kernel(Bf16Kernel::kEmulated);
  EXPECT_EQ(Bf16ActiveKernel(), Bf16Kernel::kEmulated);
  ForceBf16Kernel(Bf16DefaultKernel());
  EXPECT_EQ(Bf16ActiveKernel(), Bf16DefaultKernel());
  std::string available;
  for (const Bf16Kernel kernel : test::kAllBf16Kernels) {
    if (Bf16KernelAvailable(kernel)) available += std::string(" ") + Bf16KernelName(kernel);
  }
  std::printf("bf16 kernels available:%s; default %s\n", available.c_str(),
              Bf16KernelName(Bf16DefaultKernel()));
  // MHA_BF16_KERNEL naming an available kernel selects it (tests/meson.build runs this test
  // with the variable set too); unset, unknown or unavailable: the fastest available.
  const char* env = std::getenv("MHA_BF16_KERNEL");
  for (const Bf16Kernel kernel : test::kAllBf16Kernels) {
    if (env != nullptr && std::strcmp(env, Bf16KernelName(kernel)) == 0 &&
        Bf16KernelAvailable(kernel)) {
      EXPECT_EQ(Bf16DefaultKernel(), kernel) << "MHA_BF16_KERNEL=" << env;
      return;
    }
  }
  Bf16Kernel fastest = Bf16Kernel::kEmulated;
  for (const Bf16Kernel kernel :
       {Bf16Kernel::kNeonBf16, Bf16Kernel::kAvx512Bf16, Bf16Kernel::kAmx}) {
    if (Bf16KernelAvailable(kernel)) fastest = kernel;
  }
  EXPECT_EQ(Bf16DefaultKernel(), fastest);
}

}  // namespace
}  // namespace kernels
}  // namespace mha
