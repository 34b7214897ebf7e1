// Tests of Bf16BlockNeon (kernels/gemm_bf16_native.h), the Arm FEAT_BF16 (BFDOT) block kernel,
// called directly on blocks built here by hand in gemm_bf16.h's packed layout: a's rows bf16,
// zero-padded to the block's depth (a multiple of kBf16DepthAlign = 32), b in panels of 32
// columns, pair row p of a panel holding columns j at (j % 32) * 2 (k = 2p) and + 1 (k = 2p + 1).
// aarch64 builds only (tests/meson.build); skipped on a CPU without FEAT_BF16.
//
// Shapes: every m in 1..13 (two 5-row tiles and each tail), n in 1..70 (one to three panels, both
// 16-column halves, partial vectors), products' k from 1 to 512 (block depths 32..512, with a's
// zero padding past k, and finite values in b's rows past k as a Rows view leaves them).
// Epilogues: first block with beta == 0 (c's view holds NaN, which must not be read), first block
// with beta != 0, later block (c += alpha * acc), each with and without bias; c row-major,
// column-major, with a column stride of 2 and with rows in decreasing addresses (negative c_rs);
// a, b, c and bias misaligned by one element in some cases, lda past the depth, a panel stride
// past the panel. Nothing outside c's view may be written (sentinels), and neither the columns
// of the last panel past n nor a's elements past the depth (both NaN here) may reach c.
//
// Two checks:
//   - ExactSums: operands q / 8 with integer |q| <= 15, so every product and every partial sum
//     (|sum| <= 512 * 225 / 64, multiples of 1 / 64) is exact in f32 whatever the rounding mode:
//     BFDOT's accumulator is the exact sum, and c must equal bitwise the header's epilogue
//     evaluated here in float (each multiply and add rounded separately). This pins the layout,
//     the indexing and the epilogue's operation order.
//   - RandomBound: operands uniform in [-1, 1] rounded to bf16 (full 8-bit significands, no
//     denormal products), against a double reference of the same bf16 operands, within the
//     bound below.
//
// The bound. Arm ARM, BFDOT (vector / by element), FEAT_EBF16 absent or FPCR.EBF == 0: "an
// unfused sum-of-products ... The intermediate single-precision products are rounded before they
// are summed, and the intermediate sum is rounded before accumulation", with "the non-IEEE 754
// Round-to-Odd rounding mode", denormal inputs and results flushed to zero (FPCR.{FZ, FIZ} = {1,
// 1}); with FEAT_EBF16 and FPCR.EBF == 1 the products are fused and rounding follows FPCR
// (nearest), which the same bound covers. A product of two bf16 is exact in f32 (8 + 8 significand
// bits) unless it underflows, which these operands (|x| >= 2^-8 or 0) exclude. Round-to-odd is
// faithful: |RO(x) - x| < ulp(x) <= 2^-23 |x| (twice the 2^-24 of round-to-nearest). Per element,
// the kernel does depth / 2 BFDOT steps acc = RO(acc + RO(p0 + p1)): each pair's sum carries one
// relative error <= u = 2^-23 and each of the depth / 2 accumulations another, so (first order,
// recursive summation) |acc - exact| <= (depth / 2 + 1) * u * S, S = sum over k of |a_k b_k|.
// The epilogue adds at most 4 roundings to nearest (alpha * acc, beta * c, the add, the bias
// add), each <= 2^-24 of a magnitude <= |alpha| S + |beta c| (or |c|) + |bias|. So
//   |c - reference| <= |alpha| (depth / 2 + 1) 2^-23 S + 4 2^-24 (|alpha| S + |c term| + |bias|),
// times 1.001 for second-order terms. It is a worst case (errors of random signs grow like the
// square root of the steps); a missing or misplaced product of these operands is far outside it
// for the shapes where it is tight, and ExactSums catches those exactly everywhere.
#include <gtest/gtest.h>
#include <sys/auxv.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"
#include "tests/kernel_test_util.h"

#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1UL << 14)  // Linux arch/arm64 uapi hwcap.h
#endif

namespace mha {
namespace kernels {
namespace {

constexpr float kSentinel = -12345.5f;
constexpr uint16_t kBf16NaN = 0x7FC0;

bool HasFeatBf16() { return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0; }

#define MHA_SKIP_WITHOUT_BF16()                                                               \
  if (!HasFeatBf16()) {                                                                       \
    GTEST_SKIP() << "this CPU has no FEAT_BF16 (getauxval(AT_HWCAP2) & HWCAP2_BF16 is 0): "   \
                    "BFDOT would be an undefined instruction, and the dispatcher never runs " \
                    "Bf16BlockNeon here";                                                     \
  }

using test::Bits;
using test::FromBf16;
using test::FromBits;
// Round to nearest even (the operands here are finite).
uint16_t ToBf16(float x) { return test::RoundBf16(x); }

size_t RoundUp(size_t x, size_t align) { return (x + align - 1) / align * align; }

enum class Values { kExact, kRandom };
enum class Mode { kFirstBeta0, kFirstBeta, kLater };
enum class Layout { kRowMajor, kColMajor, kColStride2, kRowsReversed };

struct Case {
  size_t m, n, k;
  float alpha, beta;
  Mode mode;
  bool bias;
  Layout layout;
  size_t misalign;     // 0 or 1 element, for a, b, c and bias
  size_t lda_extra;    // elements past the depth in a's rows (NaN, never read)
  size_t panel_extra;  // elements past a panel (NaN, never read)

  std::string Name() const {
    static const char* kModes[] = {"first beta 0", "first beta", "later block"};
    static const char* kLayouts[] = {"row-major", "col-major", "c_cs 2", "rows reversed"};
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "m %zu n %zu k %zu alpha %g beta %g %s%s c %s misalign %zu lda +%zu "
                  "panel +%zu",
                  m, n, k, alpha, beta, kModes[static_cast<int>(mode)], bias ? " bias" : "",
                  kLayouts[static_cast<int>(layout)], misalign, lda_extra, panel_extra);
    return buf;
  }
};

// Runs one case; returns the largest |error| / bound (RandomBound), 0 for ExactSums.
double RunCase(const Case& cs, Values values, std::mt19937* rng) {
  SCOPED_TRACE(cs.Name());
  const size_t m = cs.m, n = cs.n, k = cs.k;
  const size_t depth = RoundUp(k, kBf16DepthAlign);
  const size_t panels = RoundUp(n, kBf16PanelCols) / kBf16PanelCols;

  std::uniform_int_distribution<int> q(-15, 15);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto operand = [&]() -> uint16_t {
    if (values == Values::kExact) return ToBf16(static_cast<float>(q(*rng)) / 8.0f);
    const float x = u(*rng);
    return ToBf16(std::fabs(x) < 1.0f / 256 ? 0.0f : x);  // no denormal products
  };

  // a [m, depth]: the product's k, then zeros to the depth, then NaN to lda.
  const size_t lda = depth + cs.lda_extra;
  std::vector<uint16_t> a_buf(cs.misalign + m * lda, kBf16NaN);
  uint16_t* a = a_buf.data() + cs.misalign;
  std::vector<double> av(m * k);
  for (size_t i = 0; i < m; ++i) {
    for (size_t kk = 0; kk < depth; ++kk) {
      const uint16_t h = kk < k ? operand() : 0;
      a[i * lda + kk] = h;
      if (kk < k) av[i * k + kk] = FromBf16(h);
    }
  }

  // b: panels of depth / 2 pair rows x 64, panel_stride apart. Columns past n: NaN (a packing
  // zero-pads them; NaN shows they never reach c). Rows k..depth: finite values (a Rows view's
  // next rows), multiplied by a's zeros.
  const size_t panel_stride = depth * kBf16PanelCols + cs.panel_extra;
  std::vector<uint16_t> b_buf(cs.misalign + panels * panel_stride, kBf16NaN);
  uint16_t* b = b_buf.data() + cs.misalign;
  std::vector<double> bv(k * n);
  for (size_t kk = 0; kk < depth; ++kk) {
    for (size_t j = 0; j < panels * kBf16PanelCols; ++j) {
      const size_t idx = (j / kBf16PanelCols) * panel_stride + (kk / 2) * (2 * kBf16PanelCols) +
                         (j % kBf16PanelCols) * 2 + kk % 2;
      if (j >= n) {
        b[idx] = kBf16NaN;
      } else if (kk >= k) {
        b[idx] = ToBf16(0.75f);
      } else {
        b[idx] = operand();
        bv[kk * n + j] = FromBf16(b[idx]);
      }
    }
  }

  // c inside a sentinel-filled buffer.
  ptrdiff_t c_rs = 0, c_cs = 1;
  size_t base = 0, c_size = 0;
  const size_t pad = 3;
  switch (cs.layout) {
    case Layout::kRowMajor:
      c_rs = static_cast<ptrdiff_t>(n + 3), c_cs = 1, base = 0, c_size = m * (n + 3);
      break;
    case Layout::kColMajor:
      c_rs = 1, c_cs = static_cast<ptrdiff_t>(m + 2), base = 0, c_size = n * (m + 2);
      break;
    case Layout::kColStride2:
      c_rs = static_cast<ptrdiff_t>(2 * n + 1), c_cs = 2, base = 0, c_size = m * (2 * n + 1);
      break;
    case Layout::kRowsReversed:
      c_rs = -static_cast<ptrdiff_t>(n + 1), c_cs = 1, base = (m - 1) * (n + 1),
      c_size = m * (n + 1);
      break;
  }
  std::vector<float> c_buf(pad + cs.misalign + c_size + pad, kSentinel);
  float* c = c_buf.data() + pad + cs.misalign + base;
  auto at = [&](size_t i, size_t j) -> float& {
    return c[static_cast<ptrdiff_t>(i) * c_rs + static_cast<ptrdiff_t>(j) * c_cs];
  };
  std::vector<float> c0(m * n);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      c0[i * n + j] =
          cs.mode == Mode::kFirstBeta0 ? std::numeric_limits<float>::quiet_NaN() : u(*rng) * 4.0f;
      at(i, j) = c0[i * n + j];
    }
  }
  std::vector<float> bias_buf(cs.misalign + n);
  for (float& x : bias_buf) x = u(*rng);
  const float* bias = cs.bias ? bias_buf.data() + cs.misalign : nullptr;
  std::vector<float> before = c_buf;

  Bf16Block blk;
  blk.a = a;
  blk.lda = lda;
  blk.m = m;
  blk.depth = depth;
  blk.b = b;
  blk.panel_stride = panel_stride;
  blk.n = n;
  blk.c = c;
  blk.c_rs = c_rs;
  blk.c_cs = c_cs;
  blk.alpha = cs.alpha;
  blk.beta = cs.mode == Mode::kFirstBeta0 ? 0.0f : cs.beta;
  blk.first = cs.mode != Mode::kLater;
  blk.bias = bias;
  alignas(64) static uint8_t scratch[kBf16BlockScratchBytes];
  blk.scratch = scratch;
  Bf16BlockNeon(blk);

  // Outside the view: untouched.
  std::vector<bool> in_view(c_buf.size(), false);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) in_view[static_cast<size_t>(&at(i, j) - c_buf.data())] = true;
  }
  size_t clobbered = 0;
  for (size_t x = 0; x < c_buf.size(); ++x) {
    if (!in_view[x] && Bits(c_buf[x]) != Bits(before[x])) ++clobbered;
  }
  EXPECT_EQ(clobbered, 0u) << "elements written outside c's view";

  double worst = 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double exact = 0.0, sum_abs = 0.0;
      for (size_t kk = 0; kk < k; ++kk) {
        const double p = av[i * k + kk] * bv[kk * n + j];
        exact += p;
        sum_abs += std::fabs(p);
      }
      const float got = at(i, j);
      const float cij = c0[i * n + j];
      const float bj = cs.bias ? bias[j] : 0.0f;
      if (values == Values::kExact) {
        // exact is a float (see the top): the epilogue of gemm_bf16_native.h, in float.
        const float acc = static_cast<float>(exact);
        float want = cs.alpha * acc;
        if (cs.mode == Mode::kFirstBeta) want = want + cs.beta * cij;
        if (cs.mode == Mode::kLater) want = cij + want;
        if (cs.bias) want = want + bj;
        if (Bits(got) != Bits(want) && bad++ < 5) {
          ADD_FAILURE() << "c(" << i << ", " << j << ") = " << got << ", want " << want
                        << " (exact acc " << exact << ")";
        }
      } else {
        double ref = static_cast<double>(cs.alpha) * exact + bj;
        double c_term = 0.0;
        if (cs.mode == Mode::kFirstBeta) c_term = static_cast<double>(cs.beta) * cij;
        if (cs.mode == Mode::kLater) c_term = cij;
        ref += c_term;
        const double alpha_s = std::fabs(static_cast<double>(cs.alpha)) * sum_abs;
        const double bound =
            1.001 * (alpha_s * (static_cast<double>(depth / 2) + 1.0) * std::ldexp(1.0, -23) +
                     4.0 * std::ldexp(1.0, -24) * (alpha_s + std::fabs(c_term) + std::fabs(bj))) +
            1e-30;
        const double err = std::fabs(static_cast<double>(got) - ref);
        if (!(err <= bound)) {
          if (bad++ < 5) {
            ADD_FAILURE() << "c(" << i << ", " << j << ") = " << got << ", reference " << ref
                          << ", error " << err << " > bound " << bound;
          }
        } else {
          worst = std::max(worst, err / bound);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  return worst;
}

// The cases: every m in 1..13 with n and k lists, the epilogue / layout / alignment options
// rotated with coprime periods so that each size meets several of them.
std::vector<Case> Cases() {
  static const size_t kNs[] = {1, 3, 4, 5, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 70};
  static const size_t kKs[] = {1, 31, 32, 77, 160, 257, 512};
  static const float kAlphas[] = {1.0f, -0.75f, 3.0f, 0.1f, 2.5f};
  static const float kBetas[] = {0.5f, -1.25f, 0.3f};
  std::vector<Case> cases;
  size_t t = 0;
  for (size_t m = 1; m <= 13; ++m) {
    for (size_t n : kNs) {
      for (size_t k : kKs) {
        Case cs;
        cs.m = m;
        cs.n = n;
        cs.k = k;
        cs.alpha = kAlphas[t % 5];
        cs.beta = kBetas[t % 3];
        cs.mode = static_cast<Mode>(t % 3);
        cs.bias = (t / 3) % 2 == 1;
        cs.layout = static_cast<Layout>(t % 4);
        cs.misalign = (t / 2) % 2;
        cs.lda_extra = (t % 7 == 0) ? 8 : (t % 7 == 1 ? 3 : 0);
        cs.panel_extra = (t % 11 == 0) ? 64 : 0;
        cases.push_back(cs);
        ++t;
      }
    }
  }
  return cases;
}

TEST(GemmBf16NeonTest, ExactSums) {
  MHA_SKIP_WITHOUT_BF16();
  std::mt19937 rng(31);
  size_t failed = 0;
  for (const Case& cs : Cases()) {
    RunCase(cs, Values::kExact, &rng);
    if (HasFailure() && ++failed >= 10) break;  // the first failures say enough
  }
}

TEST(GemmBf16NeonTest, RandomBound) {
  MHA_SKIP_WITHOUT_BF16();
  std::mt19937 rng(1031);
  double worst = 0.0;
  for (const Case& cs : Cases()) {
    worst = std::max(worst, RunCase(cs, Values::kRandom, &rng));
    if (HasFailure()) break;
  }
  std::printf("largest |error| / bound: %.3g\n", worst);
  RecordProperty("worst_error_over_bound", std::to_string(worst));
}

// A product over two blocks (k 1024, depth 512 each: first block, then a later block with the
// bias), as GemmBf16PackedB calls the kernel, equals the exact sum in the ExactSums operands.
TEST(GemmBf16NeonTest, TwoBlocksExact) {
  MHA_SKIP_WITHOUT_BF16();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> q(-15, 15);
  const size_t m = 7, n = 45, depth = kBf16BlockDepth, k = 2 * depth;
  const size_t panels = RoundUp(n, kBf16PanelCols) / kBf16PanelCols;
  std::vector<uint16_t> a(m * k), b(2 * panels * depth * kBf16PanelCols, 0);
  std::vector<double> av(m * k), bv(k * n);
  for (size_t x = 0; x < a.size(); ++x) {
    a[x] = ToBf16(static_cast<float>(q(rng)) / 8.0f);
    av[x] = FromBf16(a[x]);
  }
  const size_t panel_stride = depth * kBf16PanelCols;
  for (size_t kk = 0; kk < k; ++kk) {
    for (size_t j = 0; j < n; ++j) {
      const size_t blk = kk / depth, r = kk % depth;
      const size_t at = blk * panels * panel_stride + (j / kBf16PanelCols) * panel_stride +
                        (r / 2) * (2 * kBf16PanelCols) + (j % kBf16PanelCols) * 2 + r % 2;
      b[at] = ToBf16(static_cast<float>(q(rng)) / 8.0f);
      bv[kk * n + j] = FromBf16(b[at]);
    }
  }
  std::vector<float> bias(n), c(m * n, std::numeric_limits<float>::quiet_NaN());
  for (size_t j = 0; j < n; ++j) bias[j] = static_cast<float>(j) * 0.25f - 3.0f;
  const float alpha = -1.5f;
  for (size_t blk_index = 0; blk_index < 2; ++blk_index) {
    Bf16Block blk;
    blk.a = a.data() + blk_index * depth;
    blk.lda = k;
    blk.m = m;
    blk.depth = depth;
    blk.b = b.data() + blk_index * panels * panel_stride;
    blk.panel_stride = panel_stride;
    blk.n = n;
    blk.c = c.data();
    blk.c_rs = static_cast<ptrdiff_t>(n);
    blk.alpha = alpha;
    blk.beta = 0.0f;
    blk.first = blk_index == 0;
    blk.bias = blk_index == 1 ? bias.data() : nullptr;
    Bf16BlockNeon(blk);
  }
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double s0 = 0.0, s1 = 0.0;
      for (size_t kk = 0; kk < depth; ++kk) s0 += av[i * k + kk] * bv[kk * n + j];
      for (size_t kk = depth; kk < k; ++kk) s1 += av[i * k + kk] * bv[kk * n + j];
      float want = alpha * static_cast<float>(s0);
      want = want + alpha * static_cast<float>(s1);
      want = want + bias[j];
      ASSERT_EQ(Bits(c[i * n + j]), Bits(want))
          << "c(" << i << ", " << j << ") = " << c[i * n + j] << ", want " << want;
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace mha
