// Tests of kernels::Gemm, mha's blocked driver over the BLIS micro-kernel: random shapes and
// every storage of a, b and c (row-major, column-major, general strides, transposed views,
// per-head views, misaligned pointers) against a double-precision triple loop; alpha/beta
// semantics (beta 0 never reads c); determinism, also across threads; no heap allocation per
// call; sub-block calls give the same bits as one call (on the same path: see gemm.h's GEMV
// note). Its speed against bli_sgemm_ex is bench/kernels_bench's BM_GemmVersusBlis.
//
// Accuracy contract checked: |c - ref| <= 1e-5 * (|alpha| * sum_k |a_ik * b_kj| + |beta * c_ij|)
// per element (f32 accumulation over k <= 1100; observed errors are ~1e-7 of that scale).
#include "kernels/gemm.h"

#include <blis.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gemm_direct.h"
#include "kernels/gemm_strassen.h"
#include "kernels/gemv.h"
#include "kernels/targets.h"
#include "tests/kernel_test_util.h"

// Allocation counting (malloc and operator new interposed; counted while g_counting is set, by
// the one test that checks Gemm allocates nothing; skipped in sanitizer builds).
#include "tests/alloc_counter.h"

namespace mha {
namespace kernels {
namespace {

constexpr double kRelTolerance = 1e-5;

// GemmScratchBytes() bytes, 64-byte aligned, owned by one caller.
class Scratch {
 public:
  Scratch() : buf_(GemmScratchBytes() + kGemmScratchAlignment) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf_.data());
    ptr_ =
        buf_.data() + (kGemmScratchAlignment - p % kGemmScratchAlignment) % kGemmScratchAlignment;
  }
  void* get() { return ptr_; }

 private:
  std::vector<unsigned char> buf_;
  unsigned char* ptr_;
};

enum class Layout { kRowMajor, kColMajor, kGeneralRows, kGeneralCols };
constexpr Layout kLayouts[] = {Layout::kRowMajor, Layout::kColMajor, Layout::kGeneralRows,
                               Layout::kGeneralCols};

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kRowMajor:
      return "row-major";
    case Layout::kColMajor:
      return "col-major";
    case Layout::kGeneralRows:
      return "general(rows)";
    case Layout::kGeneralCols:
      return "general(cols)";
  }
  return "?";
}

// A matrix view into its own storage, with padding around and between the elements that the
// view does not cover (to check Gemm writes nothing outside c's view).
// Copies get their own storage, with the view rebased onto it.
struct Buffer {
  std::vector<float> storage;
  MatrixView view;
  std::vector<bool> in_view;  // per storage element

  Buffer() = default;
  Buffer(const Buffer& other) : storage(other.storage), view(other.view), in_view(other.in_view) {
    view.data = storage.data() + (other.view.data - other.storage.data());
  }
  Buffer& operator=(const Buffer& other) {
    if (this != &other) *this = Buffer(other);
    return *this;
  }
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;

  float at(size_t i, size_t j) const {
    return view.data[static_cast<ptrdiff_t>(i) * view.row_stride +
                     static_cast<ptrdiff_t>(j) * view.col_stride];
  }
};

// rows x cols with the given layout; `offset` floats before the first element (misalignment),
// `pad` extra elements per leading dimension. General layouts have no unit stride.
Buffer MakeBuffer(size_t rows, size_t cols, Layout layout, size_t offset, size_t pad) {
  Buffer b;
  ptrdiff_t rs = 0, cs = 0;
  switch (layout) {
    case Layout::kRowMajor:
      rs = static_cast<ptrdiff_t>(cols + pad);
      cs = 1;
      break;
    case Layout::kColMajor:
      rs = 1;
      cs = static_cast<ptrdiff_t>(rows + pad);
      break;
    case Layout::kGeneralRows:
      cs = 2;
      rs = static_cast<ptrdiff_t>(2 * cols + pad + 1);
      break;
    case Layout::kGeneralCols:
      rs = 3;
      cs = static_cast<ptrdiff_t>(3 * rows + pad + 1);
      break;
  }
  size_t size = offset + 1;
  if (rows > 0 && cols > 0) {
    size = offset + static_cast<size_t>(rs) * (rows - 1) + static_cast<size_t>(cs) * (cols - 1) + 1;
  }
  size += 3;  // trailing padding
  b.storage.assign(size, 0.0f);
  b.in_view.assign(size, false);
  b.view = {b.storage.data() + offset, rows, cols, rs, cs};
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      b.in_view[offset + i * static_cast<size_t>(rs) + j * static_cast<size_t>(cs)] = true;
    }
  }
  return b;
}

void FillUniform(Buffer& b, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : b.storage) x = dist(rng);
}

// Checks c_out (after Gemm) against alpha * a * b + beta * c_in in double, and that the storage
// outside c's view is unchanged.
void ExpectGemmMatches(float alpha, const Buffer& a, const Buffer& b, float beta,
                       const Buffer& c_in, const Buffer& c_out, const std::string& what) {
  const size_t m = c_out.view.rows, n = c_out.view.cols, k = a.view.cols;
  int failures = 0;
  for (size_t i = 0; i < m && failures < 5; ++i) {
    for (size_t j = 0; j < n && failures < 5; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (size_t p = 0; p < k; ++p) {
        const double prod = static_cast<double>(a.at(i, p)) * b.at(p, j);
        sum += prod;
        abs_sum += std::fabs(prod);
      }
      double ref = alpha * sum;
      double scale = std::fabs(alpha) * abs_sum;
      if (beta != 0.0f) {
        ref += static_cast<double>(beta) * c_in.at(i, j);
        scale += std::fabs(static_cast<double>(beta) * c_in.at(i, j));
      }
      const double got = c_out.at(i, j);
      const double tol = kRelTolerance * scale + 1e-30;
      if (!(std::fabs(got - ref) <= tol)) {
        ADD_FAILURE() << what << ": c(" << i << ", " << j << ") = " << got << ", expected " << ref
                      << " (tolerance " << tol << ")";
        ++failures;
      }
    }
  }
  for (size_t e = 0; e < c_out.storage.size(); ++e) {
    if (!c_out.in_view[e] && std::memcmp(&c_out.storage[e], &c_in.storage[e], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": wrote outside c's view at storage element " << e;
      break;
    }
  }
}

struct Case {
  size_t m, n, k;
  Layout la, lb, lc;
  size_t offset_a, offset_b, offset_c;
  float alpha, beta;
};

std::string Describe(const Case& t) {
  return "m=" + std::to_string(t.m) + " n=" + std::to_string(t.n) + " k=" + std::to_string(t.k) +
         " a " + LayoutName(t.la) + "+" + std::to_string(t.offset_a) + ", b " + LayoutName(t.lb) +
         "+" + std::to_string(t.offset_b) + ", c " + LayoutName(t.lc) + "+" +
         std::to_string(t.offset_c) + ", alpha " + std::to_string(t.alpha) + ", beta " +
         std::to_string(t.beta);
}

// Runs one case against the reference; beta == 0 cases start from a NaN-filled c.
void RunCase(const Case& t, std::mt19937& rng, Scratch& scratch) {
  Buffer a = MakeBuffer(t.m, t.k, t.la, t.offset_a, rng() % 4);
  Buffer b = MakeBuffer(t.k, t.n, t.lb, t.offset_b, rng() % 4);
  Buffer c = MakeBuffer(t.m, t.n, t.lc, t.offset_c, rng() % 4);
  FillUniform(a, rng);
  FillUniform(b, rng);
  FillUniform(c, rng);
  if (t.beta == 0.0f) {
    std::fill(c.storage.begin(), c.storage.end(), std::numeric_limits<float>::quiet_NaN());
  }
  Buffer c_out = c;
  Gemm(t.alpha, a.view, b.view, t.beta, c_out.view, scratch.get());
  ExpectGemmMatches(t.alpha, a, b, t.beta, c, c_out, Describe(t));
}

TEST(GemmTest, ReportsConfiguration) {
  GemmInit();
  const size_t bytes = GemmScratchBytes();
  std::printf("[blis] arch %s, scratch %zu bytes (%.2f MiB)\n", GemmArchName(), bytes,
              bytes / 1048576.0);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, size_t{4} << 20) << "scratch is allocated per worker thread";
  EXPECT_EQ(bytes, GemmScratchBytes());
}

TEST(GemmTest, RandomShapesAllLayouts) {
  std::mt19937 rng(1234);
  Scratch scratch;
  const float alphas[] = {1.0f, -0.5f, 2.0f};
  const float betas[] = {0.0f, 1.0f, 0.75f};
  for (int iter = 0; iter < 300; ++iter) {
    Case t;
    // Mostly small sizes, sometimes up to 300; 0 and 1 included.
    auto dim = [&]() -> size_t {
      const uint32_t r = rng() % 10;
      if (r == 0) return rng() % 2;
      if (r < 6) return 1 + rng() % 40;
      return rng() % 301;
    };
    t.m = dim();
    t.n = dim();
    t.k = dim();
    t.la = kLayouts[rng() % 4];
    t.lb = kLayouts[rng() % 4];
    t.lc = kLayouts[rng() % 4];
    t.offset_a = rng() % 4;
    t.offset_b = rng() % 4;
    t.offset_c = rng() % 4;
    t.alpha = alphas[rng() % 3];
    t.beta = betas[rng() % 3];
    RunCase(t, rng, scratch);
    if (HasFailure()) return;
  }
}

TEST(GemmTest, EveryLayoutCombination) {
  std::mt19937 rng(99);
  Scratch scratch;
  // Sizes that cross MR/NR and (for k) KC boundaries of the common configurations.
  for (Layout la : kLayouts) {
    for (Layout lb : kLayouts) {
      for (Layout lc : kLayouts) {
        for (float beta : {0.0f, 1.0f}) {
          RunCase({37, 45, 300, la, lb, lc, 1, 2, 3, 1.5f, beta}, rng, scratch);
          RunCase({1, 19, 7, la, lb, lc, 0, 0, 0, 1.0f, beta}, rng, scratch);
          RunCase({13, 1, 5, la, lb, lc, 3, 1, 2, 1.0f, beta}, rng, scratch);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(GemmTest, LargeShapesCrossEveryBlock) {
  std::mt19937 rng(7);
  Scratch scratch;
  // m > MC and k > KC (several k blocks, beta 1 after the first); n > NC with 2300 columns
  // (for either orientation of the column-major c); four k blocks with general strides. k 513,
  // 520 and 1100 end in a block deeper than KC (KcBlockDepth) on KC 256 and 512, which packs
  // fewer rows of a (1000 rows) and columns of b (2300 columns) at a time.
  RunCase({1000, 700, 513, Layout::kRowMajor, Layout::kRowMajor, Layout::kRowMajor, 0, 0, 0, 1.0f,
           0.0f},
          rng, scratch);
  RunCase({2300, 40, 300, Layout::kRowMajor, Layout::kColMajor, Layout::kColMajor, 1, 2, 3, -1.0f,
           0.5f},
          rng, scratch);
  RunCase({40, 2300, 300, Layout::kColMajor, Layout::kRowMajor, Layout::kRowMajor, 1, 2, 3, -1.0f,
           0.5f},
          rng, scratch);
  RunCase({200, 60, 1100, Layout::kGeneralCols, Layout::kRowMajor, Layout::kGeneralRows, 0, 1, 0,
           0.25f, 1.0f},
          rng, scratch);
  RunCase(
      {40, 2300, 520, Layout::kRowMajor, Layout::kRowMajor, Layout::kRowMajor, 0, 1, 2, 1.0f, 0.5f},
      rng, scratch);
}

TEST(GemmTest, KZeroAndAlphaZeroScaleC) {
  std::mt19937 rng(5);
  Scratch scratch;
  for (float beta : {0.0f, 1.0f, -2.0f}) {
    RunCase(
        {17, 23, 0, Layout::kRowMajor, Layout::kRowMajor, Layout::kRowMajor, 0, 0, 0, 1.0f, beta},
        rng, scratch);
    RunCase(
        {17, 23, 9, Layout::kRowMajor, Layout::kRowMajor, Layout::kColMajor, 0, 0, 0, 0.0f, beta},
        rng, scratch);
  }
  // alpha == 0 must not read a or b (BLIS semantics): infinities there do not give NaN.
  Buffer a = MakeBuffer(4, 3, Layout::kRowMajor, 0, 0);
  Buffer b = MakeBuffer(3, 5, Layout::kRowMajor, 0, 0);
  Buffer c = MakeBuffer(4, 5, Layout::kRowMajor, 0, 0);
  std::fill(a.storage.begin(), a.storage.end(), std::numeric_limits<float>::infinity());
  std::fill(b.storage.begin(), b.storage.end(), 1.0f);
  std::fill(c.storage.begin(), c.storage.end(), 2.0f);
  Gemm(0.0f, a.view, b.view, 0.5f, c.view, scratch.get());
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(c.at(i, j), 1.0f);
  }
}

TEST(GemmTest, EmptyOutputTouchesNothing) {
  Scratch scratch;
  float sentinel = 42.0f;
  float x = 1.0f;
  Gemm(1.0f, {&x, 0, 4, 4, 1}, {&x, 4, 3, 3, 1}, 0.0f, {&sentinel, 0, 3, 3, 1}, scratch.get());
  Gemm(1.0f, {&x, 3, 4, 4, 1}, {&x, 4, 0, 0, 1}, 0.0f, {&sentinel, 3, 0, 0, 1}, scratch.get());
  EXPECT_EQ(sentinel, 42.0f);
}

TEST(GemmTest, BetaZeroIgnoresNaNAndBetaOneAccumulates) {
  std::mt19937 rng(11);
  Scratch scratch;
  const size_t m = 50, n = 70, k = 600;  // several k blocks
  Buffer a = MakeBuffer(m, k, Layout::kRowMajor, 0, 0);
  Buffer b = MakeBuffer(k, n, Layout::kRowMajor, 0, 0);
  FillUniform(a, rng);
  FillUniform(b, rng);
  for (Layout lc : kLayouts) {
    SCOPED_TRACE(LayoutName(lc));
    Buffer c = MakeBuffer(m, n, lc, 1, 1);
    std::fill(c.storage.begin(), c.storage.end(), std::numeric_limits<float>::quiet_NaN());
    Gemm(1.0f, a.view, b.view, 0.0f, c.view, scratch.get());
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) ASSERT_TRUE(std::isfinite(c.at(i, j))) << i << "," << j;
    }
    // c = a b, then c += a b: twice the product (exact doubling up to one rounding).
    Buffer once = c;
    Gemm(1.0f, a.view, b.view, 1.0f, c.view, scratch.get());
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) {
        ASSERT_NEAR(c.at(i, j), 2.0f * once.at(i, j), 1e-5f * (1.0f + std::fabs(once.at(i, j))))
            << i << "," << j;
      }
    }
  }
}

TEST(GemmTest, TransposedViews) {
  std::mt19937 rng(3);
  Scratch scratch;
  // a^T * b^T into c^T, with the transposes expressed as views of row-major storage.
  for (const size_t m : {1, 8, 61}) {
    for (const size_t n : {1, 16, 130}) {
      const size_t k = 33;
      Buffer at = MakeBuffer(k, m, Layout::kRowMajor, 1, 0);  // storage of a^T
      Buffer bt = MakeBuffer(n, k, Layout::kRowMajor, 2, 0);  // storage of b^T
      Buffer ct = MakeBuffer(n, m, Layout::kRowMajor, 3, 0);  // storage of c^T
      FillUniform(at, rng);
      FillUniform(bt, rng);
      FillUniform(ct, rng);
      Buffer a = at, b = bt, c_in = ct;
      a.view = a.view.Transposed();
      b.view = b.view.Transposed();
      c_in.view = c_in.view.Transposed();
      Buffer c_out = c_in;
      Gemm(0.5f, a.view, b.view, 1.0f, c_out.view, scratch.get());
      ExpectGemmMatches(0.5f, a, b, 1.0f, c_in, c_out,
                        "transposed m=" + std::to_string(m) + " n=" + std::to_string(n));
    }
  }
}

TEST(GemmTest, PerHeadViewsOfAttentionBuffers) {
  std::mt19937 rng(17);
  Scratch scratch;
  // q, k, v: [tokens, heads * hd] row-major; per head h: s = q_h k_h^T [tq, tk], then
  // out_h = s v_h written into the per-head columns of out [tq, heads * hd].
  const size_t heads = 3, tq = 29, tk = 41;
  for (const size_t hd : {1, 7, 64}) {
    const size_t width = heads * hd;
    Buffer q = MakeBuffer(tq, width, Layout::kRowMajor, 1, 0);
    Buffer kk = MakeBuffer(tk, width, Layout::kRowMajor, 2, 0);
    Buffer v = MakeBuffer(tk, width, Layout::kRowMajor, 3, 0);
    Buffer out = MakeBuffer(tq, width, Layout::kRowMajor, 0, 0);
    FillUniform(q, rng);
    FillUniform(kk, rng);
    FillUniform(v, rng);
    for (size_t h = 0; h < heads; ++h) {
      Buffer qh = q, kth = kk, vh = v;
      qh.view = qh.view.Block(0, h * hd, tq, hd);
      kth.view = kth.view.Block(0, h * hd, tk, hd).Transposed();
      vh.view = vh.view.Block(0, h * hd, tk, hd);
      Buffer s_in = MakeBuffer(tq, tk, Layout::kRowMajor, 0, 0);
      std::fill(s_in.storage.begin(), s_in.storage.end(), std::numeric_limits<float>::quiet_NaN());
      Buffer s = s_in;
      Gemm(1.0f, qh.view, kth.view, 0.0f, s.view, scratch.get());
      ExpectGemmMatches(1.0f, qh, kth, 0.0f, s_in, s, "q k^T head " + std::to_string(h));
      Buffer out_in = out;
      out_in.view = out_in.view.Block(0, h * hd, tq, hd);
      Buffer out_h = out_in;
      // Only head h's columns may change.
      out_in.in_view.assign(out_in.storage.size(), false);
      out_h.in_view = out_in.in_view;
      for (size_t i = 0; i < tq; ++i) {
        for (size_t j = 0; j < hd; ++j) out_h.in_view[i * width + h * hd + j] = true;
      }
      Gemm(1.0f, s.view, vh.view, 0.0f, out_h.view, scratch.get());
      ExpectGemmMatches(1.0f, s, vh, 0.0f, out_in, out_h, "s v head " + std::to_string(h));
      std::copy(out_h.storage.begin(), out_h.storage.end(), out.storage.begin());
    }
  }
}

// Problems for the determinism tests: fixed data, several shapes and layouts.
struct Problem {
  Buffer a, b, c;
  float alpha, beta;
};

std::vector<Problem> MakeProblems(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Problem> problems;
  const size_t shapes[][3] = {{64, 1024, 64}, {7, 300, 129}, {200, 33, 700}, {1, 1, 1000}};
  for (const auto& s : shapes) {
    // b column-major (the weight layout: up to kGemvMaxRows rows take the GEMV path) and
    // row-major (always the packed path).
    for (Layout lb : {Layout::kColMajor, Layout::kRowMajor}) {
      for (Layout lc : {Layout::kRowMajor, Layout::kColMajor}) {
        Problem p;
        p.a = MakeBuffer(s[0], s[2], Layout::kRowMajor, 1, 0);
        p.b = MakeBuffer(s[2], s[1], lb, 0, 1);
        p.c = MakeBuffer(s[0], s[1], lc, 2, 0);
        FillUniform(p.a, rng);
        FillUniform(p.b, rng);
        FillUniform(p.c, rng);
        p.alpha = 0.5f;
        p.beta = lc == Layout::kRowMajor ? 0.0f : 1.0f;
        problems.push_back(std::move(p));
      }
    }
  }
  return problems;
}

std::vector<float> Solve(const Problem& p, Scratch& scratch) {
  std::vector<float> storage = p.c.storage;
  MatrixView c = p.c.view;
  c.data = storage.data() + (p.c.view.data - p.c.storage.data());
  Gemm(p.alpha, p.a.view, p.b.view, p.beta, c, scratch.get());
  return storage;
}

bool BitwiseEqual(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST(GemmTest, RepeatedCallsAreBitwiseEqual) {
  Scratch scratch;
  for (const Problem& p : MakeProblems(21)) {
    EXPECT_TRUE(BitwiseEqual(Solve(p, scratch), Solve(p, scratch)));
  }
}

TEST(GemmTest, ConcurrentCallsMatchSingleThreaded) {
  const std::vector<Problem> problems = MakeProblems(22);
  std::vector<std::vector<float>> expected;
  {
    Scratch scratch;
    for (const Problem& p : problems) expected.push_back(Solve(p, scratch));
  }
  constexpr int kThreads = 4;
  std::vector<std::vector<std::vector<float>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Scratch scratch;
      for (int rep = 0; rep < 3; ++rep) {
        got[t].clear();
        // Each thread walks the problems from a different start, so different shapes overlap.
        for (size_t i = 0; i < problems.size(); ++i) {
          got[t].push_back(Solve(problems[(i + t) % problems.size()], scratch));
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (size_t i = 0; i < problems.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(got[t][i], expected[(i + t) % problems.size()]))
          << "thread " << t << " problem " << (i + t) % problems.size();
    }
  }
}

// Computes c by Gemm calls on sub-blocks of c (rows split at row_cuts, columns at col_cuts).
std::vector<float> SolveInBlocks(const Problem& p, Scratch& scratch,
                                 const std::vector<size_t>& row_cuts,
                                 const std::vector<size_t>& col_cuts) {
  std::vector<float> storage = p.c.storage;
  MatrixView c = p.c.view;
  c.data = storage.data() + (p.c.view.data - p.c.storage.data());
  for (size_t ri = 0; ri + 1 < row_cuts.size(); ++ri) {
    for (size_t ci = 0; ci + 1 < col_cuts.size(); ++ci) {
      const size_t r0 = row_cuts[ri], r1 = row_cuts[ri + 1];
      const size_t c0 = col_cuts[ci], c1 = col_cuts[ci + 1];
      Gemm(p.alpha, p.a.view.Block(r0, 0, r1 - r0, p.a.view.cols),
           p.b.view.Block(0, c0, p.b.view.rows, c1 - c0), p.beta, c.Block(r0, c0, r1 - r0, c1 - c0),
           scratch.get());
    }
  }
  return storage;
}

// True if a Gemm call with `rows` rows of p's operands takes the GEMV path (see gemm.h).
bool TakesGemvPath(const Problem& p, size_t rows) {
  return rows <= kGemvMaxRows && GemvLayoutMatches(p.a.view, p.b.view);
}

// Splitting c into sub-block calls gives the same bits as one call for beta 0 and 1 (ParallelGemm
// relies on this for results that do not depend on its panel sizes): every element's sum runs
// over k in the same order and KC split, whatever tile it lands in; likewise on the GEMV path.
// The guarantee holds between calls on the same path only, so the bitwise check is restricted to
// splits whose every row block takes the whole call's path (the 5-row block of a 64- or 200-row
// problem with a column-major b takes the GEMV path while the whole is packed: there the results
// must agree to rounding, 1e-5 relative to the magnitudes involved).
TEST(GemmTest, SubBlockCallsMatchOneCall) {
  Scratch scratch;
  int bitwise_checks = 0;
  for (const Problem& p : MakeProblems(23)) {
    const size_t m = p.c.view.rows, n = p.c.view.cols;
    const std::vector<size_t> rows = {0, m / 3, m / 3 + std::min<size_t>(m - m / 3, 5), m};
    const std::vector<size_t> cols = {0, n / 2 + (n > 1 ? 1 : 0), n};
    bool same_path = true;
    for (size_t r = 0; r + 1 < rows.size(); ++r) {
      const size_t part = rows[r + 1] - rows[r];
      if (part > 0 && TakesGemvPath(p, part) != TakesGemvPath(p, m)) same_path = false;
    }
    const std::vector<float> whole = Solve(p, scratch);
    const std::vector<float> split = SolveInBlocks(p, scratch, rows, cols);
    if (same_path) {
      ++bitwise_checks;
      EXPECT_TRUE(BitwiseEqual(whole, split))
          << m << "x" << n << " beta " << p.beta << " gemv path " << TakesGemvPath(p, m);
    } else {
      for (size_t e = 0; e < whole.size(); ++e) {
        ASSERT_NEAR(whole[e], split[e], 1e-5f * (1.0f + std::fabs(whole[e])))
            << m << "x" << n << " beta " << p.beta << " storage element " << e;
      }
    }
  }
  // Both paths keep bitwise checks: 7-row splits (GEMV), everything with a row-major b (packed).
  EXPECT_GE(bitwise_checks, 10);
}

// A 64-byte-aligned float buffer for a packed operand.
struct PackedBuffer {
  explicit PackedBuffer(size_t floats) : storage(floats + kGemmScratchAlignment / sizeof(float)) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + (kGemmScratchAlignment - p % kGemmScratchAlignment) %
                                kGemmScratchAlignment / sizeof(float);
  }
  std::vector<float> storage;
  float* data;
};

TEST(GemmTest, NoHeapAllocationPerCall) {
#ifdef MHA_SANITIZED
  GTEST_SKIP() << "allocation counting needs the interposed malloc (not with sanitizers)";
#else
  std::vector<Problem> problems = MakeProblems(24);
  Scratch scratch;
  for (Problem& p : problems) {
    Gemm(p.alpha, p.a.view, p.b.view, p.beta, p.c.view, scratch.get());  // warm-up
  }
  Problem& p0 = problems[0];
  PackedBuffer packed(PackedBFloats(p0.b.view.rows, p0.b.view.cols));
  g_allocations.store(0);
  g_counting.store(true);
  for (int i = 0; i < 100; ++i) {
    Problem& p = problems[static_cast<size_t>(i) % problems.size()];
    Gemm(p.alpha, p.a.view, p.b.view, p.beta, p.c.view, scratch.get());
  }
  // The packed-operand pair, as attention uses it.
  for (int i = 0; i < 10; ++i) {
    const PackedB pb = PackB(p0.b.view, packed.data);
    GemmBlisPackedB(p0.alpha, p0.a.view, pb, p0.beta, p0.c.view, scratch.get());
  }
  g_counting.store(false);
  EXPECT_EQ(g_allocations.load(), 0)
      << "heap allocations in 100 Gemm and 10 PackB/GemmBlisPackedB calls";
#endif
}

// MakeBuffer filled with FillUniform.
Buffer RandomBuffer(size_t rows, size_t cols, Layout layout, size_t offset, size_t pad,
                    std::mt19937& rng) {
  Buffer b = MakeBuffer(rows, cols, layout, offset, pad);
  FillUniform(b, rng);
  return b;
}

// One random product's scalars and its a [m, k], c [m, n] operands in layouts la, lc (random
// misalignment and padding): alpha 1 or 0.125, beta 0, 0.5 or 1; with beta 0 c is NaN-filled,
// so a product that read it would show.
struct RandomOperands {
  float alpha = 1.0f, beta = 0.0f;
  Buffer a, c;
};
RandomOperands MakeRandomOperands(size_t m, size_t n, size_t k, Layout la, Layout lc,
                                  std::mt19937& rng) {
  RandomOperands r;
  r.alpha = (rng() % 2) ? 1.0f : 0.125f;
  r.beta = static_cast<float>(rng() % 3) * 0.5f;
  r.a = MakeBuffer(m, k, la, rng() % 3, rng() % 4);
  r.c = MakeBuffer(m, n, lc, rng() % 3, rng() % 4);
  FillUniform(r.a, rng);
  FillUniform(r.c, rng);
  if (r.beta == 0.0f) {
    std::fill(r.c.storage.begin(), r.c.storage.end(), std::numeric_limits<float>::quiet_NaN());
  }
  return r;
}

// GemmBlisPackedB against the double reference: every layout of a, b and c, misaligned views, k
// across several KC blocks, n not a multiple of NR, m across MC blocks, alpha/beta (beta 0 from
// a NaN-filled c); the same packed b reused by several products.
TEST(GemmBlisPackedBTest, MatchesReference) {
  std::mt19937 rng(31);
  Scratch scratch;
  const size_t shapes[][3] = {{1, 1, 1},    {6, 16, 64},  {24, 512, 64}, {24, 64, 512},
                              {7, 33, 300}, {5, 17, 1},   {200, 3, 700}, {13, 100, 257},
                              {37, 48, 9},  {190, 70, 70}};
  for (const auto& s : shapes) {
    const size_t m = s[0], n = s[1], k = s[2];
    for (const Layout lb : kLayouts) {
      Buffer b = MakeBuffer(k, n, lb, rng() % 3, rng() % 4);
      FillUniform(b, rng);
      PackedBuffer packed(PackedBFloats(k, n));
      const PackedB pb = PackB(b.view, packed.data);
      ASSERT_EQ(pb.data, packed.data);
      ASSERT_EQ(pb.k, k);
      ASSERT_EQ(pb.n, n);
      for (const Layout la : kLayouts) {
        for (const Layout lc : kLayouts) {
          RandomOperands r = MakeRandomOperands(m, n, k, la, lc, rng);
          const float alpha = r.alpha, beta = r.beta;
          const Buffer& a = r.a;
          const Buffer& c = r.c;
          Buffer c_out = c;
          GemmBlisPackedB(alpha, a.view, pb, beta, c_out.view, scratch.get());
          ExpectGemmMatches(alpha, a, b, beta, c, c_out,
                            "GemmBlisPackedB m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                " k=" + std::to_string(k) + " a " + LayoutName(la) + ", b " +
                                LayoutName(lb) + ", c " + LayoutName(lc));
        }
      }
    }
  }
}

// Row strips of one product (as attention runs them) give the bits of the whole product, and,
// where the micro-kernel prefers row-stored tiles and the product is not a GEMV (so Gemm takes
// its driver without swapping operands), the bits of Gemm too. k = 0 and alpha = 0 scale c.
TEST(GemmBlisPackedBTest, StripsAndGemmGiveTheSameBits) {
  std::mt19937 rng(32);
  Scratch scratch;
  for (const auto& s : {std::array<size_t, 3>{96, 512, 64}, std::array<size_t, 3>{50, 64, 600},
                        std::array<size_t, 3>{31, 45, 260}}) {
    const size_t m = s[0], n = s[1], k = s[2];
    Buffer a = MakeBuffer(m, k, Layout::kRowMajor, 1, 3);
    Buffer b = MakeBuffer(k, n, Layout::kColMajor, 2, 1);  // K^T of a row-major K
    Buffer c = MakeBuffer(m, n, Layout::kRowMajor, 0, 5);
    FillUniform(a, rng);
    FillUniform(b, rng);
    FillUniform(c, rng);
    PackedBuffer packed(PackedBFloats(k, n));
    const PackedB pb = PackB(b.view, packed.data);
    for (const float beta : {0.0f, 1.0f}) {
      Buffer whole = c, strips = c, gemm = c;
      GemmBlisPackedB(0.125f, a.view, pb, beta, whole.view, scratch.get());
      for (size_t r0 = 0; r0 < m; r0 += 24) {
        const size_t rows = std::min<size_t>(24, m - r0);
        GemmBlisPackedB(0.125f, a.view.Block(r0, 0, rows, k), pb, beta,
                        strips.view.Block(r0, 0, rows, n), scratch.get());
      }
      EXPECT_EQ(std::memcmp(whole.storage.data(), strips.storage.data(),
                            whole.storage.size() * sizeof(float)),
                0)
          << "m=" << m << " beta=" << beta;
      if (bli_cntx_l3_nat_ukr_prefers_rows_dt(BLIS_FLOAT, BLIS_GEMM_UKR, bli_gks_query_cntx())) {
        Gemm(0.125f, a.view, b.view, beta, gemm.view, scratch.get());
        EXPECT_EQ(std::memcmp(whole.storage.data(), gemm.storage.data(),
                              whole.storage.size() * sizeof(float)),
                  0)
            << "m=" << m << " beta=" << beta;
      }
    }
  }
  // k = 0 and alpha = 0: c = beta * c without reading a or b.
  Buffer c = MakeBuffer(5, 7, Layout::kRowMajor, 0, 0);
  FillUniform(c, rng);
  Buffer a = MakeBuffer(5, 3, Layout::kRowMajor, 0, 0);
  Buffer b = MakeBuffer(3, 7, Layout::kRowMajor, 0, 0);
  FillUniform(b, rng);
  PackedBuffer packed(PackedBFloats(3, 7));
  const PackedB pb = PackB(b.view, packed.data);
  Buffer out = c;
  GemmBlisPackedB(0.0f, a.view, pb, 0.5f, out.view, scratch.get());
  for (size_t i = 0; i < 5; ++i) {
    for (size_t j = 0; j < 7; ++j) EXPECT_EQ(out.at(i, j), 0.5f * c.at(i, j));
  }
  PackedBuffer empty(PackedBFloats(0, 7));
  const PackedB pb0 = PackB(MatrixView{b.view.data, 0, 7, 7, 1}, empty.data);
  out = c;
  GemmBlisPackedB(1.0f, MatrixView{a.view.data, 5, 0, 3, 1}, pb0, 0.0f, out.view, scratch.get());
  for (size_t i = 0; i < 5; ++i) {
    for (size_t j = 0; j < 7; ++j) EXPECT_EQ(out.at(i, j), 0.0f);
  }
}

// One packing written by parts (PackBColumns over disjoint NR-aligned column ranges, as
// ParallelGemm's threads write a projection's weights) and read by parts (PackedB::Columns):
// every column range gives the bits of the same columns of the whole product, and the whole
// product matches the reference. The buffer starts NaN-filled, so a panel left unwritten by
// the parts would show. k spans several KC blocks, n ends in a partial micro-panel.
TEST(GemmBlisPackedBTest, ColumnRangesOfOnePacking) {
  std::mt19937 rng(33);
  Scratch scratch;
  const size_t nr = GemmBlocking().nr;
  ASSERT_GT(nr, 0u);
  ASSERT_GT(GemmBlocking().mc, 0u);
  ASSERT_GT(GemmBlocking().kc, 0u);
  const size_t m = 40, n = 7 * nr + 5, k = 2 * GemmBlocking().kc + 9;
  for (const Layout lb : kLayouts) {
    Buffer a = MakeBuffer(m, k, Layout::kRowMajor, 1, 2);
    Buffer b = MakeBuffer(k, n, lb, 1, 3);
    Buffer c = MakeBuffer(m, n, Layout::kRowMajor, 0, 1);
    FillUniform(a, rng);
    FillUniform(b, rng);
    std::fill(c.storage.begin(), c.storage.end(), std::numeric_limits<float>::quiet_NaN());
    const size_t floats = PackedBFloats(k, n);
    PackedBuffer parts(floats);
    std::fill(parts.data, parts.data + floats, std::numeric_limits<float>::quiet_NaN());
    const size_t cuts[] = {0, 2 * nr, 3 * nr, 6 * nr, n};
    PackedB whole;
    for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
      const PackedB part = PackBColumns(b.view, cuts[i], cuts[i + 1] - cuts[i], parts.data);
      EXPECT_EQ(part.col0, cuts[i]);
      EXPECT_EQ(part.n, cuts[i + 1] - cuts[i]);
      EXPECT_EQ(part.packed_n, n);
      whole = {part.data, part.k, n, n, 0, part.k};
    }
    PackedBuffer once(floats);
    const PackedB pb = PackB(b.view, once.data);
    EXPECT_EQ(pb.packed_n, n);
    EXPECT_EQ(pb.col0, 0u);
    Buffer c_whole = c, c_parts = c;
    GemmBlisPackedB(1.0f, a.view, pb, 0.0f, c_whole.view, scratch.get());
    ExpectGemmMatches(1.0f, a, b, 0.0f, c, c_whole,
                      std::string("PackB whole, b ") + LayoutName(lb));
    // Column ranges that differ from the packing's parts, read from the parts' packing.
    const size_t reads[] = {0, nr, 4 * nr, 5 * nr, n};
    for (size_t i = 0; i + 1 < std::size(reads); ++i) {
      const size_t c0 = reads[i], nc = reads[i + 1] - reads[i];
      GemmBlisPackedB(1.0f, a.view, whole.Columns(c0, nc), 0.0f, c_parts.view.Block(0, c0, m, nc),
                      scratch.get());
    }
    EXPECT_EQ(std::memcmp(c_whole.storage.data(), c_parts.storage.data(),
                          c_whole.storage.size() * sizeof(float)),
              0)
        << "b " << LayoutName(lb);
  }
}

// GemmBlisPackedAB (a packed once, PackA) gives the bits of GemmBlisPackedB on the unpacked a, for
// the whole a and for MR-aligned row ranges of its packing (PackedA::Rows, as attention's strips
// read a task's packed Q rows), with every layout of a (misaligned views), k across KC blocks,
// m across MC blocks and ending in a partial micro-panel, beta 0 (NaN-filled c) and 1; the
// whole product matches the double reference. The packing starts NaN-filled, so a panel PackA
// left unwritten would show. alpha = 0 scales c.
TEST(GemmBlisPackedABTest, PackedAGivesTheBitsOfGemmPackedB) {
  std::mt19937 rng(34);
  Scratch scratch;
  const size_t mr = GemmBlocking().mr;
  ASSERT_GT(mr, 0u);
  const size_t shapes[][3] = {{1, 1, 1},
                              {24, 512, 64},
                              {7, 33, 300},
                              {GemmBlocking().mc + 2 * mr + 5, 70, 2 * GemmBlocking().kc + 9},
                              {5 * mr + 3, 16, 64}};
  for (const auto& s : shapes) {
    const size_t m = s[0], n = s[1], k = s[2];
    Buffer b = MakeBuffer(k, n, Layout::kColMajor, 1, 2);
    FillUniform(b, rng);
    PackedBuffer packed_b(PackedBFloats(k, n));
    const PackedB pb = PackB(b.view, packed_b.data);
    for (const Layout la : kLayouts) {
      Buffer a = MakeBuffer(m, k, la, rng() % 3, rng() % 4);
      FillUniform(a, rng);
      const size_t floats = PackedAFloats(m, k);
      PackedBuffer packed_a(floats);
      std::fill(packed_a.data, packed_a.data + floats, std::numeric_limits<float>::quiet_NaN());
      const PackedA pa = PackA(a.view, packed_a.data);
      EXPECT_EQ(pa.m, m);
      EXPECT_EQ(pa.k, k);
      EXPECT_EQ(pa.packed_m, m);
      EXPECT_EQ(pa.row0, 0u);
      for (const float beta : {0.0f, 1.0f}) {
        Buffer c = MakeBuffer(m, n, Layout::kRowMajor, 0, 3);
        FillUniform(c, rng);
        if (beta == 0.0f) {
          std::fill(c.storage.begin(), c.storage.end(), std::numeric_limits<float>::quiet_NaN());
        }
        Buffer want = c, whole = c, parts = c;
        GemmBlisPackedB(0.125f, a.view, pb, beta, want.view, scratch.get());
        GemmBlisPackedAB(0.125f, pa, pb, beta, whole.view);
        const std::string what = "m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                 " k=" + std::to_string(k) + " a " + LayoutName(la) +
                                 " beta=" + std::to_string(beta);
        EXPECT_EQ(std::memcmp(want.storage.data(), whole.storage.data(),
                              want.storage.size() * sizeof(float)),
                  0)
            << what;
        ExpectGemmMatches(0.125f, a, b, beta, c, whole, "GemmBlisPackedAB " + what);
        // Strips of 2 MR rows (the last one shorter), each from the whole packing.
        for (size_t r0 = 0; r0 < m; r0 += 2 * mr) {
          const size_t rows = std::min(2 * mr, m - r0);
          GemmBlisPackedAB(0.125f, pa.Rows(r0, rows), pb, beta, parts.view.Block(r0, 0, rows, n));
        }
        EXPECT_EQ(std::memcmp(want.storage.data(), parts.storage.data(),
                              want.storage.size() * sizeof(float)),
                  0)
            << what << " (row ranges)";
      }
    }
  }
  // alpha = 0: c = beta * c without reading the packings.
  Buffer c = MakeBuffer(5, 7, Layout::kRowMajor, 0, 0);
  FillUniform(c, rng);
  Buffer out = c;
  const PackedA pa{nullptr, 5, 3, 5, 0};
  const PackedB pb{nullptr, 3, 7, 7, 0, 3};
  GemmBlisPackedAB(0.0f, pa, pb, 0.5f, out.view);
  for (size_t i = 0; i < 5; ++i) {
    for (size_t j = 0; j < 7; ++j) EXPECT_EQ(out.at(i, j), 0.5f * c.at(i, j));
  }
}

class GemmDirectPackedBTargetTest : public test::PerTargetTest {};

// Why the direct kernel's tests skip a target.
constexpr char kNoDirect[] =
    "the direct micro-kernel does not run here (BLIS's NR is not a multiple of the target's "
    "f32 lanes)";

// kernels::GemmDirectPackedB(gemm_direct.h) on every Highway target this CPU supports: against
// the double reference for every layout of a and c (misaligned views), m across the 6-row tiles
// and their 6 + 5 + 5 splits, n ending in partial vectors and micro-panels, k across KC blocks,
// alpha/beta (beta 0 from a NaN-filled c, so c is not read), column ranges of a packing (col0),
// nothing written outside c's view; k = 0 and alpha = 0 scale c. Where the kernel cannot run
// (NR not a multiple of the target's lanes) it must return false and leave c untouched.
TEST_P(GemmDirectPackedBTargetTest, MatchesReference) {
  const size_t nr = GemmBlocking().nr, kc = GemmBlocking().kc;
  ASSERT_GT(nr, 0u);
  const size_t shapes[][3] = {{1, 1, 1},
                              {1, 70, 300},
                              {2, 33, 7},
                              {3, 16, 64},
                              {4, nr + 1, 2 * kc + 3},
                              {5, 5, 256},
                              {6, 17, 100},
                              {7, 2 * nr, 9},
                              {11, 40, kc + 1},
                              {13, 9, 33},
                              {16, 3 * nr - 1, 256},
                              {17, 48, 129},
                              {24, 64, 512},
                              {40, 21, 2},
                              {130, 37, 70}};
  const char* const target = target_name();
  std::mt19937 rng(41);
  const bool supported = GemmDirectSupported();
  std::printf("[target] %s: GemmDirectPackedB %s\n", target,
              supported ? "runs" : "not supported (NR vs lanes)");
  for (const auto& s : shapes) {
    const size_t m = s[0], n = s[1], k = s[2];
    Buffer b = MakeBuffer(k, n, kLayouts[rng() % std::size(kLayouts)], rng() % 3, rng() % 4);
    FillUniform(b, rng);
    // The operand is columns [nr, nr + n) of a wider packing (PackedB::Columns).
    Buffer wide = MakeBuffer(k, n + 2 * nr, Layout::kColMajor, 1, 1);
    FillUniform(wide, rng);
    for (size_t p = 0; p < k; ++p) {
      for (size_t j = 0; j < n; ++j)
        wide.view.data[p + (nr + j) * wide.view.col_stride] = b.at(p, j);
    }
    PackedBuffer packed(PackedBFloats(k, n + 2 * nr));
    const PackedB pb = PackB(wide.view, packed.data).Columns(nr, n);
    for (const Layout la : kLayouts) {
      for (const Layout lc : kLayouts) {
        const RandomOperands r = MakeRandomOperands(m, n, k, la, lc, rng);
        Buffer c_out = r.c;
        const std::string what = std::string("GemmDirectPackedB ") + target +
                                 " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                 " k=" + std::to_string(k) + " a " + LayoutName(la) + ", c " +
                                 LayoutName(lc);
        ASSERT_EQ(GemmDirectPackedB(r.alpha, r.a.view, pb, r.beta, c_out.view), supported) << what;
        if (!supported) {
          ASSERT_EQ(0, std::memcmp(r.c.storage.data(), c_out.storage.data(),
                                   r.c.storage.size() * sizeof(float)))
              << what << ": wrote c without running";
          continue;
        }
        ExpectGemmMatches(r.alpha, r.a, b, r.beta, r.c, c_out, what);
      }
    }
  }
  if (!supported) return;
  // k = 0 and alpha = 0: c = beta * c (beta 0: zeros, NaN not propagated).
  Buffer a = MakeBuffer(3, 4, Layout::kRowMajor, 0, 0);
  Buffer b = MakeBuffer(4, 5, Layout::kColMajor, 0, 0);
  FillUniform(a, rng);
  FillUniform(b, rng);
  PackedBuffer packed(PackedBFloats(4, 5));
  const PackedB pb = PackB(b.view, packed.data);
  Buffer c = MakeBuffer(3, 5, Layout::kRowMajor, 0, 0);
  FillUniform(c, rng);
  Buffer scaled = c;
  ASSERT_TRUE(GemmDirectPackedB(0.0f, a.view, pb, 0.5f, scaled.view));
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(scaled.at(i, j), 0.5f * c.at(i, j));
  }
  std::fill(c.storage.begin(), c.storage.end(), std::numeric_limits<float>::quiet_NaN());
  const PackedB pb0 = PackB(MatrixView{b.view.data, 0, 5, 1, 4}, packed.data);
  ASSERT_TRUE(GemmDirectPackedB(1.0f, MatrixView{a.view.data, 3, 0, 4, 1}, pb0, 0.0f, c.view));
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(c.at(i, j), 0.0f);
  }
}

// Rows and columns of c are independent: any split of a product into row ranges and NR-aligned
// column ranges gives the bits of the whole product, on every target (attention's strips and
// ParallelGemm's panels rely on it for thread-count independence). And where BLIS's micro-kernel
// performs the same operations (the haswell/zen 6 x 16 sgemm kernel; the FMA targets), the bits
// of GemmBlisPackedB for beta 0 and 1, as gemm_direct.h states.
TEST_P(GemmDirectPackedBTargetTest, SplitsAndBlisKernelGiveTheSameBits) {
  const size_t nr = GemmBlocking().nr;
  const size_t m = 29, n = 5 * nr + 3, k = 2 * GemmBlocking().kc + 17;
  const std::string arch = GemmArchName();
  const bool haswell_kernel =
      arch == "haswell" || arch == "zen" || arch == "zen2" || arch == "zen3";
  const char* const target = target_name();
  if (!GemmDirectSupported()) GTEST_SKIP() << kNoDirect;
  std::mt19937 rng(42);
  Scratch scratch;
  const Buffer a = RandomBuffer(m, k, Layout::kRowMajor, 1, 3, rng);
  const Buffer b = RandomBuffer(k, n, Layout::kColMajor, 2, 1, rng);
  const Buffer c = RandomBuffer(m, n, Layout::kRowMajor, 0, 5, rng);
  PackedBuffer packed(PackedBFloats(k, n));
  const PackedB pb = PackB(b.view, packed.data);
  const std::string t(target);
  const bool fma_target = t == "AVX2" || t.rfind("AVX3", 0) == 0;
  for (const float beta : {0.0f, 1.0f}) {
    Buffer whole = c, parts = c, blis = c;
    ASSERT_TRUE(GemmDirectPackedB(0.125f, a.view, pb, beta, whole.view));
    const size_t row_cuts[] = {0, 1, 3, 10, 16, 22, m};
    const size_t col_cuts[] = {0, nr, 3 * nr, n};
    for (size_t r = 0; r + 1 < std::size(row_cuts); ++r) {
      for (size_t q = 0; q + 1 < std::size(col_cuts); ++q) {
        const size_t r0 = row_cuts[r], nr_rows = row_cuts[r + 1] - r0;
        const size_t c0 = col_cuts[q], nc = col_cuts[q + 1] - c0;
        ASSERT_TRUE(GemmDirectPackedB(0.125f, a.view.Block(r0, 0, nr_rows, k), pb.Columns(c0, nc),
                                      beta, parts.view.Block(r0, c0, nr_rows, nc)));
      }
    }
    EXPECT_EQ(0, std::memcmp(whole.storage.data(), parts.storage.data(),
                             whole.storage.size() * sizeof(float)))
        << target << " beta " << beta << ": row/column parts differ from the whole product";
    if (haswell_kernel && fma_target) {
      GemmBlisPackedB(0.125f, a.view, pb, beta, blis.view, scratch.get());
      EXPECT_EQ(0, std::memcmp(whole.storage.data(), blis.storage.data(),
                               whole.storage.size() * sizeof(float)))
          << target << " beta " << beta << ": differs from GemmBlisPackedB on BLIS " << arch;
    }
  }
}

// GemmDirectPackedB's bias (gemm_direct.h): c = (alpha a b + beta c) + bias[j], bitwise the
// product followed by a separate add, on every target where the kernel runs: k across KC blocks
// (the bias is added once, after the last one), n ending mid-vector, c row-major (whole-vector
// stores) and column-major (lane-buffer stores), beta 0 and 1, k = 0.
// The operands of the direct kernel's store tests: a [m, k] (misaligned, padded), b [k, n]
// packed, bias [n], uniform in [-1, 1).
struct DirectOperands {
  DirectOperands(size_t m_, size_t n_, size_t k_, std::mt19937& rng)
      : m(m_),
        n(n_),
        k(k_),
        a(RandomBuffer(m, k, Layout::kRowMajor, 1, 2, rng)),
        b(RandomBuffer(k, n, Layout::kRowMajor, 0, 1, rng)),
        bias(RandomBuffer(1, n, Layout::kRowMajor, 1, 0, rng)),
        packed(PackedBFloats(k, n)),
        pb(PackB(b.view, packed.data)) {}
  size_t m, n, k;
  Buffer a, b, bias;
  PackedBuffer packed;
  PackedB pb;
};

// body(target, operands, rng) for the store tests' shapes (m, n, k): one row with n ending
// mid-vector, k across KC blocks (the second deeper than KC) with n ending mid-vector, whole
// vectors, and one block deeper than KC.
template <typename Body>
void ForEachDirectStoreCase(const char* target, uint32_t seed, const Body& body) {
  const size_t nr = GemmBlocking().nr, kc = GemmBlocking().kc;
  const size_t shapes[][3] = {
      {1, 5, 9}, {7, 3 * nr + 5, 2 * kc + 3}, {13, 2 * nr, 64}, {5, nr + 3, kc + 5}};
  std::mt19937 rng(seed);
  for (const auto& sh : shapes) body(target, DirectOperands(sh[0], sh[1], sh[2], rng), rng);
}

TEST_P(GemmDirectPackedBTargetTest, BiasIsAddedOnceAfterTheProduct) {
  if (!GemmDirectSupported()) GTEST_SKIP() << kNoDirect;
  ForEachDirectStoreCase(
      target_name(), 44, [](const char* target, const DirectOperands& ops, std::mt19937& rng) {
        const size_t m = ops.m, n = ops.n, k = ops.k;
        const Buffer& a = ops.a;
        const Buffer& bias = ops.bias;
        const PackedB& pb = ops.pb;
        for (const Layout lc : {Layout::kRowMajor, Layout::kColMajor}) {
          const Buffer c = RandomBuffer(m, n, lc, 0, 3, rng);
          for (const float beta : {0.0f, 1.0f}) {
            for (const size_t kk : {k, size_t{0}}) {
              const PackedB operand = pb.LeadingRows(kk);
              const MatrixView a_used = a.view.Block(0, 0, m, kk);
              Buffer fused = c, separate = c;
              ASSERT_TRUE(
                  GemmDirectPackedB(0.5f, a_used, operand, beta, bias.view.data, fused.view));
              ASSERT_TRUE(GemmDirectPackedB(0.5f, a_used, operand, beta, separate.view));
              for (size_t i = 0; i < m; ++i) {
                for (size_t j = 0; j < n; ++j) {
                  separate.view.data[static_cast<ptrdiff_t>(i) * separate.view.row_stride +
                                     static_cast<ptrdiff_t>(j) * separate.view.col_stride] +=
                      bias.at(0, j);
                }
              }
              EXPECT_EQ(0, std::memcmp(fused.storage.data(), separate.storage.data(),
                                       fused.storage.size() * sizeof(float)))
                  << target << " m " << m << " n " << n << " k " << kk << " c " << LayoutName(lc)
                  << " beta " << beta;
            }
          }
        }
      });
}

// GemmDirectPackedBDual(gemm_direct.h) on every target where the kernel runs: c gets exactly
// GemmDirectPackedB's bits; kCopy writes them to c2 too, kAdd leaves c2 = c2 + alpha a b, bitwise
// GemmDirectPackedB with beta 1 over c2 (and, for k within one KC block, the stored product
// added by one rounded add). Shapes with k across KC blocks (a copy is written once, an add per
// block), n ending mid-vector (lane-buffer stores), one row; c and c2 misaligned and padded
// (the padding must stay untouched), in both layouts (different column strides run the kernel
// twice), k = 0 and alpha = 0 (c2 copied, or left as it is).
TEST_P(GemmDirectPackedBTargetTest, SecondDestinationGetsTheCopyOrTheAddedProduct) {
  if (!GemmDirectSupported()) GTEST_SKIP() << kNoDirect;
  const size_t kc = GemmBlocking().kc;
  ForEachDirectStoreCase(
      target_name(), 45, [kc](const char* target, const DirectOperands& ops, std::mt19937& rng) {
        const size_t m = ops.m, n = ops.n, k = ops.k;
        const Buffer& a = ops.a;
        const Buffer& bias = ops.bias;
        const PackedB& pb = ops.pb;
        for (const Layout lc : {Layout::kRowMajor, Layout::kColMajor}) {
          for (const Layout l2 : {Layout::kRowMajor, Layout::kColMajor}) {
            const Buffer c = RandomBuffer(m, n, lc, 0, 3, rng);
            const Buffer c2 = RandomBuffer(m, n, l2, 2, 1, rng);
            for (const SecondStore mode : {SecondStore::kCopy, SecondStore::kAdd}) {
              for (const float beta : {0.0f, 1.0f}) {
                for (const float alpha : {-0.5f, 0.0f}) {
                  for (const size_t kk : {k, size_t{0}}) {
                    const PackedB operand = pb.LeadingRows(kk);
                    const MatrixView a_used = a.view.Block(0, 0, m, kk);
                    const bool copy = mode == SecondStore::kCopy;
                    const std::string what =
                        std::string(target) + " m " + std::to_string(m) + " n " +
                        std::to_string(n) + " k " + std::to_string(kk) + " c " + LayoutName(lc) +
                        " c2 " + LayoutName(l2) + (copy ? " copy" : " add") + " beta " +
                        std::to_string(beta) + " alpha " + std::to_string(alpha);
                    Buffer dual = c, dual2 = c2, single = c, want2 = c2;
                    ASSERT_TRUE(GemmDirectPackedBDual(alpha, a_used, operand, beta, bias.view.data,
                                                      mode, dual.view, dual2.view))
                        << what;
                    ASSERT_TRUE(GemmDirectPackedB(alpha, a_used, operand, beta, bias.view.data,
                                                  single.view));
                    ASSERT_EQ(0, std::memcmp(dual.storage.data(), single.storage.data(),
                                             dual.storage.size() * sizeof(float)))
                        << what << ": c differs from GemmDirectPackedB's";
                    for (size_t e = 0; e < c2.storage.size(); ++e) {
                      if (!c2.in_view[e]) {
                        ASSERT_EQ(dual2.storage[e], c2.storage[e]) << what << " padding " << e;
                      }
                    }
                    Buffer product = c;
                    if (!copy) {
                      ASSERT_TRUE(GemmDirectPackedB(alpha, a_used, operand, 1.0f, want2.view));
                      ASSERT_TRUE(GemmDirectPackedB(alpha, a_used, operand, 0.0f, product.view));
                    }
                    for (size_t i = 0; i < m; ++i) {
                      for (size_t j = 0; j < n; ++j) {
                        const float got = dual2.at(i, j);
                        if (copy) {
                          ASSERT_EQ(got, single.at(i, j)) << what << " (" << i << ", " << j << ")";
                          continue;
                        }
                        ASSERT_EQ(got, want2.at(i, j)) << what << " (" << i << ", " << j << ")";
                        if (KcBlockDepth(kc, kk, 0) == kk) {
                          ASSERT_EQ(got, c2.at(i, j) + product.at(i, j))
                              << what << " one rounded add (" << i << ", " << j << ")";
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      });
}

// PackedB::LeadingRows (gemm.h): the first kk rows of a packing packed_k deep multiply as the
// whole packing does by an a whose columns past kk are zero (what attention's causal strips rely
// on: they multiply their probabilities by the leading rows of a key block's packed V), bitwise,
// through GemmBlisPackedB and (on every target where it runs) GemmDirectPackedB, for kk inside
// the first KC block, at its end, in a later one and inside a block deeper than KC (KcBlockDepth),
// combined with a column range (Columns); and where their KC blocks are those of a packing kk deep
// (LeadingKcBlocksAreOwn, false for kk = KC + 3 of a packing 2 KC + 9 deep, whose own packing is
// one block), as that packing does, also through GemmBlisPackedAB.
class PackedBTargetTest : public test::PerTargetTest {};

TEST_P(PackedBTargetTest, LeadingRowsOfAPackingGiveTheProductOfThoseRows) {
  const size_t nr = GemmBlocking().nr, kc = GemmBlocking().kc;
  const size_t m = 17, n = 3 * nr + 5;
  const size_t depths[][2] = {{70, 1},
                              {70, 24},
                              {70, 70},
                              {kc, kc - 1},
                              {kc + 9, kc + 3},
                              {2 * kc + 9, kc},
                              {2 * kc + 9, kc + 3},
                              {2 * kc + 9, 2 * kc + 1}};
  std::mt19937 rng(43);
  Scratch scratch;
  for (const auto& d : depths) {
    const size_t packed_k = d[0], kk = d[1];
    const Buffer b = RandomBuffer(packed_k, n, Layout::kRowMajor, 1, 2, rng);
    const Buffer a = RandomBuffer(m, kk, Layout::kRowMajor, 0, 3, rng);
    Buffer a_zero = RandomBuffer(m, packed_k, Layout::kRowMajor, 0, 3, rng);  // a, then zeros
    for (size_t i = 0; i < m; ++i) {
      for (size_t p = 0; p < packed_k; ++p) {
        a_zero.view.data[static_cast<ptrdiff_t>(i) * a_zero.view.row_stride +
                         static_cast<ptrdiff_t>(p) * a_zero.view.col_stride] =
            p < kk ? a.at(i, p) : 0.0f;
      }
    }
    const Buffer c = RandomBuffer(m, n - nr, Layout::kRowMajor, 0, 1, rng);
    PackedBuffer deep(PackedBFloats(packed_k, n)), shallow(PackedBFloats(kk, n));
    const PackedB whole = PackB(b.view, deep.data).Columns(nr, n - nr);
    const PackedB leading = whole.LeadingRows(kk);
    const PackedB own = PackB(b.view.Block(0, 0, kk, n), shallow.data).Columns(nr, n - nr);
    const bool own_blocks = LeadingKcBlocksAreOwn(kc, packed_k, kk);
    ASSERT_EQ(leading.k, kk);
    ASSERT_EQ(leading.packed_k, packed_k);
    ASSERT_EQ(own_blocks, !(packed_k == 2 * kc + 9 && kk == kc + 3));
    Buffer b_used = b;  // the operand: rows [0, kk), columns [nr, n) of b
    b_used.view = b_used.view.Block(0, nr, kk, n - nr);
    const std::string what =
        "packed_k " + std::to_string(packed_k) + ", leading rows " + std::to_string(kk);
    auto expect_same = [&](const char* call, const Buffer& x, const Buffer& y) {
      EXPECT_EQ(0,
                std::memcmp(x.storage.data(), y.storage.data(), x.storage.size() * sizeof(float)))
          << call << ", " << what;
    };
    for (const float beta : {0.0f, 1.0f}) {
      Buffer x = c, y = c, z = c;
      GemmBlisPackedB(0.5f, a.view, leading, beta, x.view, scratch.get());
      GemmBlisPackedB(0.5f, a_zero.view, whole, beta, y.view, scratch.get());
      expect_same("GemmBlisPackedB by the zero-extended a", x, y);
      ExpectGemmMatches(0.5f, a, b_used, beta, c, x, "GemmBlisPackedB, " + what);
      if (own_blocks) {
        GemmBlisPackedB(0.5f, a.view, own, beta, z.view, scratch.get());
        expect_same("GemmBlisPackedB by the packing of the rows", x, z);
        PackedBuffer pa_buf(PackedAFloats(m, kk));
        const PackedA pa = PackA(a.view, pa_buf.data);
        Buffer u = c;
        GemmBlisPackedAB(0.5f, pa, leading, beta, u.view);
        expect_same("GemmBlisPackedAB", u, x);
      }
      if (GemmDirectSupported()) {
        Buffer u = c, v = c;
        ASSERT_TRUE(GemmDirectPackedB(0.5f, a.view, leading, beta, u.view));
        ASSERT_TRUE(GemmDirectPackedB(0.5f, a_zero.view, whole, beta, v.view));
        expect_same(
            (std::string("GemmDirectPackedB by the zero-extended a ") + target_name()).c_str(), u,
            v);
        ExpectGemmMatches(0.5f, a, b_used, beta, c, u,
                          std::string("GemmDirectPackedB ") + target_name() + ", " + what);
        if (own_blocks) {
          Buffer w = c;
          ASSERT_TRUE(GemmDirectPackedB(0.5f, a.view, own, beta, w.view));
          expect_same((std::string("GemmDirectPackedB by the packing of the rows ") + target_name())
                          .c_str(),
                      u, w);
        }
      }
    }
  }
}

// PackedB::Rows (gemm.h): rows [r0, r0 + kk) of a packing one KC block deep multiply as the
// packing of those rows alone would, bitwise, through GemmBlisPackedB, GemmBlisPackedAB and
// GemmDirectPackedB, for any r0 (odd ones too) and with a column range. Windowed attention
// strips multiply their probabilities by the rows of V from their band's start.
TEST_P(PackedBTargetTest, RowsOfAOneBlockPackingGiveTheProductOfThoseRows) {
  const size_t nr = GemmBlocking().nr, kc = GemmBlocking().kc, packnr = GemmBlocking().packnr;
  const size_t m = 13, n = 2 * nr + 3;
  const size_t cases[][3] = {
      {70, 0, 70}, {70, 1, 69}, {70, 33, 20}, {kc, 17, kc - 17}, {kc, kc - 1, 1}};
  std::mt19937 rng(44);
  Scratch scratch;
  for (const auto& d : cases) {
    const size_t packed_k = d[0], r0 = d[1], kk = d[2];
    const Buffer b = RandomBuffer(packed_k, n, Layout::kRowMajor, 1, 2, rng);
    const Buffer a = RandomBuffer(m, kk, Layout::kRowMajor, 0, 3, rng);
    const Buffer c = RandomBuffer(m, n - nr, Layout::kRowMajor, 0, 1, rng);
    PackedBuffer whole(PackedBFloats(packed_k, n)), own_buf(PackedBFloats(kk, n));
    const PackedB rows = PackB(b.view, whole.data).Rows(r0, kk, packnr).Columns(nr, n - nr);
    const PackedB own = PackB(b.view.Block(r0, 0, kk, n), own_buf.data).Columns(nr, n - nr);
    const std::string what = target_name() + std::string(" packed_k ") + std::to_string(packed_k) +
                             " r0 " + std::to_string(r0) + " k " + std::to_string(kk);
    auto expect_same = [&](const char* call, const Buffer& x, const Buffer& y) {
      EXPECT_EQ(0,
                std::memcmp(x.storage.data(), y.storage.data(), x.storage.size() * sizeof(float)))
          << call << ", " << what;
    };
    for (const float beta : {0.0f, 1.0f}) {
      Buffer x = c, y = c;
      GemmBlisPackedB(0.5f, a.view, rows, beta, x.view, scratch.get());
      GemmBlisPackedB(0.5f, a.view, own, beta, y.view, scratch.get());
      expect_same("GemmBlisPackedB", x, y);
      PackedBuffer pa_buf(PackedAFloats(m, kk));
      Buffer z = c;
      GemmBlisPackedAB(0.5f, PackA(a.view, pa_buf.data), rows, beta, z.view);
      expect_same("GemmBlisPackedAB", z, y);
      if (GemmDirectSupported()) {
        Buffer u = c, v = c;
        ASSERT_TRUE(GemmDirectPackedB(0.5f, a.view, rows, beta, u.view));
        ASSERT_TRUE(GemmDirectPackedB(0.5f, a.view, own, beta, v.view));
        expect_same("GemmDirectPackedB", u, v);
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(GemmDirectPackedBTargetTest);
MHA_INSTANTIATE_PER_TARGET(PackedBTargetTest);

}  // namespace
}  // namespace kernels
}  // namespace mha

namespace mha {
namespace kernels {
namespace {

class GemmStrassenTargetTest : public test::PerTargetTest {};

// One level of Strassen-Winograd over packed operands (gemm_strassen.h), on every Highway
// target where the direct kernel runs: against the double-precision product within
// 8 eps k max|a| max|b| (+ |bias|) per element (the plain product's error is ~eps k max|a|
// max|b| in the worst case; Strassen's is a few times larger), for even m (2 to 130), depths
// inside one KC block and over several, widths that are one micro-panel per half or ragged, with
// misaligned a (row padding and offset) and c halves in one padded buffer; column ranges of the
// operands (Columns) give bitwise the columns of the whole product; the storage around c is
// untouched.
TEST_P(GemmStrassenTargetTest, MatchesTheProductWithinItsBoundAndColumnRangesAreBitwiseTheWhole) {
  const size_t nr = GemmBlocking().nr, kc = GemmBlocking().kc;
  const size_t shapes[][3] = {
      {2, 2, 2},         {6, 70, 2 * nr},        {34, 2 * kc + 6, 2 * nr + 6},
      {64, 512, 4 * nr}, {130, 96, 6 * nr + 10}, {128, 2, 4 * nr}};
  const char* const target = target_name();
  if (!GemmDirectSupported()) GTEST_SKIP() << kNoDirect;
  std::mt19937 rng(91);
  for (const auto& sh : shapes) {
    const size_t m = sh[0], k = sh[1], n = sh[2], n2 = n / 2;
    const std::string what = std::string(target) + " m " + std::to_string(m) + " k " +
                             std::to_string(k) + " n " + std::to_string(n);
    const Buffer a = RandomBuffer(m, k, Layout::kRowMajor, 3, 5, rng);
    const Buffer b = RandomBuffer(k, n, Layout::kColMajor, 0, 2, rng);  // w^T of an [n, k] w
    const Buffer bias = RandomBuffer(1, n, Layout::kRowMajor, 1, 0, rng);
    PackedBuffer packed(StrassenPackedBFloats(k, n));
    std::vector<float> tmp(StrassenPackTmpFloats(k, n));
    const StrassenPackedB ops = PackBStrassen(b.view, packed.data, tmp.data());
    ASSERT_EQ(ops.half_k(), k / 2) << what;
    ASSERT_EQ(ops.half_n(), n2) << what;
    std::vector<float> sums(StrassenSumsFloats(m, k) + 1);
    const StrassenA sa = StrassenSumsOfA(a.view, sums.data() + 1);  // misaligned sums
    for (const bool with_bias : {false, true}) {
      // c = [left | right] in one row-padded buffer with sentinels around.
      const size_t ldc = n + 3, offset = 1;
      std::vector<float> c(offset + m * ldc + 2, -777.0f);
      float* c0 = c.data() + offset;
      const MatrixView left{c0, m, n2, static_cast<ptrdiff_t>(ldc), 1};
      const MatrixView right{c0 + n2, m, n2, static_cast<ptrdiff_t>(ldc), 1};
      const float* bl = with_bias ? bias.view.data : nullptr;
      const float* br = with_bias ? bias.view.data + n2 : nullptr;
      ASSERT_TRUE(GemmStrassenPackedB(sa, ops, bl, br, left, right)) << what;
      double max_a = 0, max_b = 0;
      for (size_t i = 0; i < m; ++i) {
        for (size_t p = 0; p < k; ++p) max_a = std::max(max_a, std::abs(double{a.at(i, p)}));
      }
      for (size_t p = 0; p < k; ++p) {
        for (size_t j = 0; j < n; ++j) max_b = std::max(max_b, std::abs(double{b.at(p, j)}));
      }
      const double eps = std::numeric_limits<float>::epsilon();
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < n; ++j) {
          double want = with_bias ? double{bias.at(0, j)} : 0.0;
          for (size_t p = 0; p < k; ++p) want += double{a.at(i, p)} * double{b.at(p, j)};
          const double bound = 8 * eps * (k * max_a * max_b + std::abs(want));
          ASSERT_NEAR(c0[i * ldc + j], want, bound)
              << what << " bias " << with_bias << " (" << i << ", " << j << ")";
        }
        for (size_t j = n; j < ldc && i + 1 < m; ++j) {
          ASSERT_EQ(c0[i * ldc + j], -777.0f) << what << " padding of row " << i;
        }
      }
      ASSERT_EQ(c[0], -777.0f) << what;
      ASSERT_EQ(c[offset + (m - 1) * ldc + n], -777.0f) << what;
      // Columns [nr, n2) of each half through Columns: the same bits as the whole call.
      if (n2 > nr) {
        std::vector<float> part(m * ldc, 0.0f);
        const size_t nc = n2 - nr;
        const MatrixView pl{part.data(), m, nc, static_cast<ptrdiff_t>(ldc), 1};
        const MatrixView pr{part.data() + n2, m, nc, static_cast<ptrdiff_t>(ldc), 1};
        ASSERT_TRUE(GemmStrassenPackedB(sa, ops.Columns(nr, nc), with_bias ? bl + nr : nullptr,
                                        with_bias ? br + nr : nullptr, pl, pr));
        for (size_t i = 0; i < m; ++i) {
          for (size_t j = 0; j < nc; ++j) {
            ASSERT_EQ(part[i * ldc + j], c0[i * ldc + nr + j]) << what << " left " << i;
            ASSERT_EQ(part[i * ldc + n2 + j], c0[i * ldc + n2 + nr + j]) << what << " right";
          }
        }
      }
    }
  }
}
MHA_INSTANTIATE_PER_TARGET(GemmStrassenTargetTest);

}  // namespace
}  // namespace kernels
}  // namespace mha
