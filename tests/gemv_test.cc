// Tests of kernels::Gemv (kernels/gemv.h) on every Highway target this CPU supports: odd sizes
// (k 1..300 including every k below 34, n 1..70, m 1..9 and kGemvMaxRows - 3, kGemvMaxRows,
// kGemvMaxRows + 1: partial vectors, partial column groups, partial row tiles), padded strides,
// misaligned pointers and every storage of c, against a double reference with the documented error
// bound; beta == 0 never reads c; nothing outside c's view is written; results do not depend on how
// c is split into calls, on repetition or on threads; and kernels::Gemm takes this path (bitwise
// the same result, scratch untouched) for a.rows <= kGemvMaxRows with matching layouts.
//
// Tolerance per element (gemv.h): |alpha| * (2 k + 8) * 2^-24 * S + 3 * 2^-24 * (|alpha| S +
// |beta c|), S = sum_p |a_ip b_pj|: the dot product's bound plus the roundings of alpha * dot,
// beta * c and their sum.
#include "kernels/gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gemm.h"
#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // 2^-24
constexpr float kSentinel = -12345.5f;

// Storage of c's view: row-major, column-major, or general (no unit stride).
enum class CLayout { kRowMajor, kColMajor, kGeneral };

const char* CLayoutName(CLayout l) {
  return l == CLayout::kRowMajor ? "row-major" : l == CLayout::kColMajor ? "col-major" : "general";
}

// The operands of one problem in their own storage: a [m, k] rows at a_stride, w [n, k] (b = w^T)
// rows at w_stride, c [m, n]; each view starts `offset` floats into its buffer (misaligned for
// every vector width when odd). Storage outside c's view holds kSentinel.
struct Problem {
  size_t m = 0, n = 0, k = 0;
  std::vector<float> a_buf, w_buf, c_buf;
  MatrixView a, b, c;
  std::vector<bool> c_in_view;
};

Problem MakeProblem(size_t m, size_t n, size_t k, CLayout layout, size_t offset,
                    std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Problem p;
  p.m = m;
  p.n = n;
  p.k = k;
  const size_t a_stride = k + 3, w_stride = k + 1;
  p.a_buf = test::SymmetricFloats(offset + m * a_stride + 4, 1.0f, rng);
  p.w_buf = test::SymmetricFloats(offset + n * w_stride + 4, 1.0f, rng);
  p.a = {p.a_buf.data() + offset, m, k, static_cast<ptrdiff_t>(a_stride), 1};
  // b = w^T: element (p, j) at w[j * w_stride + p].
  p.b = {p.w_buf.data() + offset, k, n, 1, static_cast<ptrdiff_t>(w_stride)};
  ptrdiff_t rs = 0, cs = 0;
  switch (layout) {
    case CLayout::kRowMajor:
      rs = static_cast<ptrdiff_t>(n + 2);
      cs = 1;
      break;
    case CLayout::kColMajor:
      rs = 1;
      cs = static_cast<ptrdiff_t>(m + 1);
      break;
    case CLayout::kGeneral:
      rs = 2;
      cs = static_cast<ptrdiff_t>(2 * m + 3);
      break;
  }
  const size_t c_size =
      offset + static_cast<size_t>(rs) * (m - 1) + static_cast<size_t>(cs) * (n - 1) + 1 + 3;
  p.c_buf.assign(c_size, kSentinel);
  p.c_in_view.assign(c_size, false);
  p.c = {p.c_buf.data() + offset, m, n, rs, cs};
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const size_t e = offset + i * static_cast<size_t>(rs) + j * static_cast<size_t>(cs);
      p.c_buf[e] = u(*rng);
      p.c_in_view[e] = true;
    }
  }
  return p;
}

float At(const MatrixView& v, size_t i, size_t j) {
  return v
      .data[static_cast<ptrdiff_t>(i) * v.row_stride + static_cast<ptrdiff_t>(j) * v.col_stride];
}

// The double reference alpha a b + beta c of a problem, with the documented bound on each
// element ([m, n] row-major), and the fingerprint of the inputs it is of.
struct Reference {
  uint64_t inputs = 0;
  std::vector<double> c, tol;
};

Reference ReferenceOf(const Problem& p, float alpha, float beta) {
  Reference r{test::Fingerprint({&p.a_buf, &p.w_buf, &p.c_buf}), std::vector<double>(p.m * p.n),
              std::vector<double>(p.m * p.n)};
  for (size_t i = 0; i < p.m; ++i) {
    for (size_t j = 0; j < p.n; ++j) {
      double dot = 0.0, abs_sum = 0.0;
      for (size_t q = 0; q < p.k; ++q) {
        const double prod = static_cast<double>(At(p.a, i, q)) * At(p.b, q, j);
        dot += prod;
        abs_sum += std::fabs(prod);
      }
      const double c0 = beta == 0.0f ? 0.0 : static_cast<double>(beta) * At(p.c, i, j);
      r.c[i * p.n + j] = alpha * dot + c0;
      r.tol[i * p.n + j] =
          std::fabs(alpha) * (2.0 * static_cast<double>(p.k) + 8.0) * kU * abs_sum +
          3.0 * kU * (std::fabs(alpha) * abs_sum + std::fabs(c0)) + 1e-30;
    }
  }
  return r;
}

// Runs Gemv on a copy of p's c and checks every element against the double reference ref of p
// within the documented bound, and the storage outside the view against the original. beta == 0
// runs on a NaN-filled view (so a read of c would show).
void CheckAgainstReference(const Problem& p, float alpha, float beta, const Reference& ref,
                           const std::string& what) {
  ASSERT_EQ(ref.inputs, test::Fingerprint({&p.a_buf, &p.w_buf, &p.c_buf}))
      << what << ": not the reference's inputs";
  std::vector<float> out = p.c_buf;
  MatrixView c = p.c;
  c.data = out.data() + (p.c.data - p.c_buf.data());
  if (beta == 0.0f) {
    for (size_t e = 0; e < out.size(); ++e) {
      if (p.c_in_view[e]) out[e] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  Gemv(alpha, p.a, p.b, beta, c);
  int failures = 0;
  for (size_t i = 0; i < p.m && failures < 5; ++i) {
    for (size_t j = 0; j < p.n && failures < 5; ++j) {
      const double want = ref.c[i * p.n + j], tol = ref.tol[i * p.n + j];
      const double got = At(c, i, j);
      if (!(std::fabs(got - want) <= tol)) {
        ADD_FAILURE() << what << ": c(" << i << ", " << j << ") = " << got << ", expected " << want
                      << " (tolerance " << tol << ")";
        ++failures;
      }
    }
  }
  for (size_t e = 0; e < out.size(); ++e) {
    if (!p.c_in_view[e] && std::memcmp(&out[e], &p.c_buf[e], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": wrote outside c's view at storage element " << e;
      break;
    }
  }
}

void CheckAgainstReference(const Problem& p, float alpha, float beta, const std::string& what) {
  CheckAgainstReference(p, alpha, beta, ReferenceOf(p, alpha, beta), what);
}

std::string Describe(size_t m, size_t n, size_t k, CLayout l, size_t offset, float alpha,
                     float beta) {
  return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " c " +
         CLayoutName(l) + " offset " + std::to_string(offset) + " alpha " + std::to_string(alpha) +
         " beta " + std::to_string(beta);
}

// k: every length below 34 (all tails of vectors up to 32 lanes), then around multiples of 64
// and the 300 end; n: partial and full groups of 4 columns; m: partial and full row tiles.
const size_t kKs[] = {1,  2,  3,  4,  5,  6,   7,   8,   9,   10,  11,  12,  13,  14, 15, 16,
                      17, 18, 19, 20, 21, 22,  23,  24,  25,  26,  27,  28,  29,  30, 31, 32,
                      33, 63, 64, 65, 96, 127, 128, 129, 191, 255, 256, 257, 299, 300};
const size_t kNs[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 64, 70};

class GemvTargetTest : public test::PerTargetTest {};

// Runs visit(p, alpha, beta, what) on every problem of the sweep, in order, with the same
// inputs at every call. Every row-tile remainder (m 1..9), then full and partial tiles up to one
// past the GEMV threshold; not every m in between, which would only repeat those tile shapes (and
// cost minutes under emulation in CI). Stops at the first failure.
template <class Visit>
void ForEachReferenceProblem(const Visit& visit) {
  std::mt19937 rng(5);
  for (const size_t m :
       {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{5}, size_t{6}, size_t{7}, size_t{8},
        size_t{9}, kGemvMaxRows - 3, kGemvMaxRows, kGemvMaxRows + 1}) {
    for (const size_t k : kKs) {
      for (const size_t n : kNs) {
        // Rotate layouts, offsets and alpha/beta over the cases rather than crossing them all.
        const size_t pick = m + k + n;
        const CLayout layout = static_cast<CLayout>(pick % 3);
        const size_t offset = pick % 4;
        const float alphas[] = {1.0f, -0.5f, 1.5f};
        const float betas[] = {0.0f, 1.0f, 0.25f};
        const float alpha = alphas[(pick / 3) % 3];
        const float beta = betas[(pick / 9) % 3];
        const Problem p = MakeProblem(m, n, k, layout, offset, &rng);
        visit(p, alpha, beta, Describe(m, n, k, layout, offset, alpha, beta));
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// The sweep's references, computed once per process (every target's instance checks against
// them; a fingerprint ties each to its inputs) and apart from the kernel's calls: under qemu with
// 256-bit SVE the same loops ran over ten times as long interleaved with them, problem by problem.
const std::vector<Reference>& SweepReferences() {
  static const std::vector<Reference> references = [] {
    std::vector<Reference> refs;
    ForEachReferenceProblem([&](const Problem& p, float alpha, float beta, const std::string&) {
      refs.push_back(ReferenceOf(p, alpha, beta));
    });
    return refs;
  }();
  return references;
}

TEST_P(GemvTargetTest, MatchesDoubleReference) {
  const std::vector<Reference>& references = SweepReferences();
  size_t index = 0;
  ForEachReferenceProblem([&](const Problem& p, float alpha, float beta, const std::string& what) {
    ASSERT_LT(index, references.size());
    CheckAgainstReference(p, alpha, beta, references[index++], what);
  });
  if (!HasFailure()) {
    EXPECT_EQ(index, references.size()) << "problems checked";
  }
}

TEST_P(GemvTargetTest, EveryStorageOfCAndMisalignment) {
  std::mt19937 rng(6);
  for (const CLayout layout : {CLayout::kRowMajor, CLayout::kColMajor, CLayout::kGeneral}) {
    for (size_t offset = 0; offset < 4; ++offset) {
      for (const float beta : {0.0f, 1.0f, -2.0f}) {
        for (const size_t m : {1, 4, 6}) {
          const Problem p = MakeProblem(m, 37, 77, layout, offset, &rng);
          CheckAgainstReference(p, 0.75f, beta, Describe(m, 37, 77, layout, offset, 0.75f, beta));
        }
      }
    }
  }
}

TEST_P(GemvTargetTest, BetaZeroIgnoresNaNInC) {
  std::mt19937 rng(8);
  Problem p = MakeProblem(3, 11, 40, CLayout::kRowMajor, 1, &rng);
  for (size_t e = 0; e < p.c_buf.size(); ++e) {
    if (p.c_in_view[e]) p.c_buf[e] = std::numeric_limits<float>::quiet_NaN();
  }
  Gemv(1.0f, p.a, p.b, 0.0f, p.c);
  for (size_t i = 0; i < p.m; ++i) {
    for (size_t j = 0; j < p.n; ++j) ASSERT_TRUE(std::isfinite(At(p.c, i, j))) << i << "," << j;
  }
}

bool BitwiseEqual(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// c of p after one Gemv call over the whole view, or after calls on the blocks between the given
// row and column cuts.
std::vector<float> Solve(const Problem& p, float alpha, float beta,
                         const std::vector<size_t>& row_cuts, const std::vector<size_t>& col_cuts) {
  std::vector<float> out = p.c_buf;
  MatrixView c = p.c;
  c.data = out.data() + (p.c.data - p.c_buf.data());
  for (size_t ri = 0; ri + 1 < row_cuts.size(); ++ri) {
    for (size_t ci = 0; ci + 1 < col_cuts.size(); ++ci) {
      const size_t r0 = row_cuts[ri], r1 = row_cuts[ri + 1];
      const size_t c0 = col_cuts[ci], c1 = col_cuts[ci + 1];
      Gemv(alpha, p.a.Block(r0, 0, r1 - r0, p.k), p.b.Block(0, c0, p.k, c1 - c0), beta,
           c.Block(r0, c0, r1 - r0, c1 - c0));
    }
  }
  return out;
}

// Each element runs the same operations whatever tile it lands in, so any split of c into calls
// (rows into tiles of other sizes, columns out of their groups of 4) gives the same bits, for
// any beta.
TEST_P(GemvTargetTest, SplitCallsGiveTheSameBits) {
  std::mt19937 rng(9);
  for (const float beta : {0.0f, 1.0f, 0.3f}) {
    const Problem p = MakeProblem(8, 23, 131, CLayout::kRowMajor, 1, &rng);
    const std::vector<float> whole = Solve(p, 0.5f, beta, {0, 8}, {0, 23});
    EXPECT_TRUE(BitwiseEqual(whole, Solve(p, 0.5f, beta, {0, 1, 3, 6, 8}, {0, 2, 7, 23})));
    EXPECT_TRUE(BitwiseEqual(whole, Solve(p, 0.5f, beta, {0, 5, 8}, {0, 1, 2, 3, 4, 5, 6, 23})));
    std::vector<size_t> every_row, every_col;
    for (size_t i = 0; i <= 8; ++i) every_row.push_back(i);
    for (size_t j = 0; j <= 23; ++j) every_col.push_back(j);
    EXPECT_TRUE(BitwiseEqual(whole, Solve(p, 0.5f, beta, every_row, every_col)));
  }
}
MHA_INSTANTIATE_PER_TARGET(GemvTargetTest);

TEST(GemvTest, RepeatedAndConcurrentCallsAreBitwiseEqual) {
  std::mt19937 rng(10);
  const Problem p = MakeProblem(4, 70, 300, CLayout::kRowMajor, 3, &rng);
  const std::vector<float> expected = Solve(p, 1.0f, 0.0f, {0, 4}, {0, 70});
  EXPECT_TRUE(BitwiseEqual(expected, Solve(p, 1.0f, 0.0f, {0, 4}, {0, 70})));
  constexpr int kThreads = 4;
  std::vector<int> equal(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        equal[t] += BitwiseEqual(expected, Solve(p, 1.0f, 0.0f, {0, 4}, {0, 70})) ? 1 : 0;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(equal[t], 20) << "thread " << t;
}

// kernels::Gemm dispatches to Gemv for a.rows <= kGemvMaxRows with matching layouts: the same
// bits, and the packing scratch is never written. One row more takes the packed path (which
// writes the scratch) and still agrees to rounding.
TEST(GemvTest, GemmTakesTheGemvPath) {
  std::mt19937 rng(11);
  std::vector<float> scratch_buf((GemmScratchBytes() + kGemmScratchAlignment) / sizeof(float));
  const uintptr_t addr = reinterpret_cast<uintptr_t>(scratch_buf.data());
  float* scratch = scratch_buf.data() + (kGemmScratchAlignment - addr % kGemmScratchAlignment) %
                                            kGemmScratchAlignment / sizeof(float);
  const size_t scratch_floats = GemmScratchBytes() / sizeof(float);
  for (size_t m = 1; m <= kGemvMaxRows + 1; ++m) {
    SCOPED_TRACE("m=" + std::to_string(m));
    const Problem p = MakeProblem(m, 45, 200, CLayout::kRowMajor, 0, &rng);
    ASSERT_TRUE(GemvLayoutMatches(p.a, p.b));
    const std::vector<float> expected = Solve(p, 1.0f, 0.0f, {0, m}, {0, 45});
    std::vector<float> out = p.c_buf;
    MatrixView c = p.c;
    c.data = out.data() + (p.c.data - p.c_buf.data());
    std::fill(scratch, scratch + scratch_floats, kSentinel);
    Gemm(1.0f, p.a, p.b, 0.0f, c, scratch);
    size_t scratch_written = 0;
    for (size_t e = 0; e < scratch_floats; ++e) scratch_written += scratch[e] != kSentinel;
    if (m <= kGemvMaxRows) {
      EXPECT_TRUE(BitwiseEqual(expected, out));
      EXPECT_EQ(scratch_written, 0u);
    } else {
      EXPECT_GT(scratch_written, 0u);
      for (size_t e = 0; e < out.size(); ++e) {
        ASSERT_NEAR(out[e], expected[e], 1e-5f * (1.0f + std::fabs(expected[e]))) << e;
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace mha
