// Tests of kernels/softmax.h on every Highway target this CPU supports, against a scalar double
// reference.
//
// Reference: y_j is formed in f32 exactly as the kernel documents (x * scale, then each additive
// mask, each step rounded; -inf where masked), then softmax(y) is computed in double. The
// variant terms follow the same order: the softcap in double (rounded to f32), ALiBi in f32,
// visibility from an independent per-column predicate, the sink in the softmax's denominator.
//
// Tolerance, per output: |got - want| <= kAbs + want * (kRel + 2^-23 * (d_j + E[d])), where
// d_j = max - y_j and E[d] = sum_k p_k d_k.
// - kRel = 2e-6 covers the kernel's own arithmetic: Exp (2 ULP = 2^-22), the sum (f32 partial
//   sums of <= 16 additions folded into a double, <= (17 + log2(lanes)) * 2^-24 <= 1.3e-6 relative
//   for positive terms), the reciprocal and the final multiply (2^-24 each): about 1.8e-6.
//   (exp is kernels::ExpNonPositiveRow's, tested alone below: 2 ULP.)
// - 2^-23 * (d_j + E[d]) is the conditioning of the f32 input to exp: y_j - max is rounded to
//   f32 (relative 2^-24, i.e. absolute 2^-24 * d_j in the exponent), which perturbs p_j by that
//   much relatively and the sum by 2^-24 * E[d]; the factor 2 is margin. It only matters for
//   large |y| (e.g. the +-1e4 cases), where it is inherent to f32 scores.
// - kAbs = 1e-37 admits flushed / gradually underflowed outputs below FLT_MIN (Exp of arguments
//   below -87 is zero).
// - With a softcap, kRel grows by softmax.h's 2^-19 * softcap (hn::Tanh's error against the
//   reference's tanh in double).
#include "kernels/softmax.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

using kernels::SoftmaxMasks;

// One test per target: Targets/SoftmaxRowsTest.MaskKinds/AVX2.
class SoftmaxRowsTest : public test::PerTargetTest {};
class OnlineSoftmaxTest : public test::PerTargetTest {};
class ExpNonPositiveTest : public test::PerTargetTest {};

constexpr double kRel = 2e-6;
constexpr double kCond = 1.0 / (1 << 23);  // 2^-23
constexpr double kAbs = 1e-37;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Fills padding between rows and around buffers; must come back unchanged.
constexpr float kSentinel = -12345.5f;

// Expected softmax of one row: columns outside [begin, valid) are exactly 0.
struct RefRow {
  enum Kind { kNormal, kNaNRow, kZeroRow } kind = kNormal;
  size_t begin = 0;
  size_t valid = 0;
  std::vector<double> p;  // [valid], kNormal only
  std::vector<double> d;  // max - y_j, kNormal only
  double mean_d = 0;      // sum p_j d_j
  double p_sink = 0;      // the sink's share of the row (0 without a sink)
  double cap_rel = 0;     // the softcap's relative tolerance (softmax.h): 2^-19 * softcap
};

size_t ValidColumns(const SoftmaxMasks& m, size_t r, size_t cols) {
  if (!m.causal) return cols;
  // In double: exact for the offsets tested, and no overflow for extreme ones.
  const double limit = static_cast<double>(m.causal_offset) + static_cast<double>(r) + 1.0;
  return static_cast<size_t>(std::min(std::max(limit, 0.0), static_cast<double>(cols)));
}

// The position distance d of (r, j), exact (__int128: no overflow for any offset).
__int128 Distance(const SoftmaxMasks& m, size_t r, size_t j) {
  if (m.q_pos) return static_cast<__int128>(m.q_pos[r]) - m.k_pos[j];
  return static_cast<__int128>(m.causal_offset) + static_cast<__int128>(r) - j;
}

// Whether the window (if any) shows column j to row r.
bool WindowVisible(const SoftmaxMasks& m, size_t r, size_t j) {
  if (m.window <= 0) return true;
  const __int128 d = Distance(m, r, j);
  return m.causal ? d >= 0 && d < m.window : d > -m.window && d < m.window;
}

// Reference for row r of a block; `x` points at that row's raw scores.
RefRow ReferenceRow(const float* x, size_t r, size_t cols, float scale, const SoftmaxMasks& m) {
  RefRow ref;
  ref.valid = ValidColumns(m, r, cols);
  if (m.window > 0 && !m.q_pos) {
    // Index positions: the window's visible columns are a range [begin, valid).
    size_t first = cols, last = 0;
    for (size_t j = 0; j < ref.valid; ++j) {
      if (WindowVisible(m, r, j)) first = std::min(first, j), last = j + 1;
    }
    ref.begin = first < last ? first : 0;
    ref.valid = first < last ? last : 0;
  }
  if (m.softcap > 0) ref.cap_rel = std::ldexp(static_cast<double>(m.softcap), -19);
  const ptrdiff_t ri = static_cast<ptrdiff_t>(r);
  std::vector<float> y(ref.valid, -kInf);
  bool has_nan = false;
  float max = -kInf;
  for (size_t j = ref.begin; j < ref.valid; ++j) {
    float v = x[j] * scale;
    if (m.softcap > 0) {
      v = static_cast<float>(m.softcap * std::tanh(static_cast<double>(v) / m.softcap));
    }
    if (m.alibi_slope != 0) {
      const __int128 d = Distance(m, r, j);
      v = v - m.alibi_slope * static_cast<float>(static_cast<int64_t>(d < 0 ? -d : d));
    }
    for (int k = 0; k < 2; ++k) {
      if (m.add[k]) v = v + m.add[k][ri * m.add_row_stride[k] + static_cast<ptrdiff_t>(j)];
    }
    for (int k = 0; k < 2; ++k) {
      if (m.masked[k] && m.masked[k][ri * m.masked_row_stride[k] + static_cast<ptrdiff_t>(j)]) {
        v = -kInf;
      }
    }
    if (!WindowVisible(m, r, j)) v = -kInf;
    y[j] = v;
    has_nan |= std::isnan(v);
    if (v > max) max = v;
  }
  if (max == -kInf && !has_nan) {
    ref.kind = RefRow::kZeroRow;
    return ref;
  }
  if (has_nan || max == kInf || std::isnan(m.sink) || m.sink == kInf) {
    ref.kind = RefRow::kNaNRow;
    return ref;
  }
  const float ref_max = std::max(max, m.sink);
  ref.p.assign(ref.valid, 0.0);
  ref.d.assign(ref.valid, kInf);
  double sum = 0;
  for (size_t j = ref.begin; j < ref.valid; ++j) {
    ref.d[j] = static_cast<double>(ref_max) - static_cast<double>(y[j]);
    ref.p[j] = std::exp(-ref.d[j]);
    sum += ref.p[j];
  }
  const double d_sink = static_cast<double>(ref_max) - static_cast<double>(m.sink);
  ref.p_sink = std::exp(-d_sink);  // 0 for a sink of -inf
  sum += ref.p_sink;
  for (size_t j = ref.begin; j < ref.valid; ++j) {
    ref.p[j] /= sum;
    if (std::isfinite(ref.d[j])) ref.mean_d += ref.p[j] * ref.d[j];
  }
  ref.p_sink /= sum;
  if (ref.p_sink > 0) ref.mean_d += ref.p_sink * d_sink;
  return ref;
}

// Largest |got - want| / tolerance seen since the last ReportWorst (printed to show the margin).
double g_worst_ratio = 0;

void ReportWorst(const char* target, const char* what) {
  std::printf("[worst] %s %s: max |err| / tolerance = %.3g\n", target, what, g_worst_ratio);
  g_worst_ratio = 0;
}

std::string Num(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

// Compares one output row with the reference; reports at most a few mismatches per call.
void ExpectRow(const RefRow& ref, const float* got, size_t cols, const std::string& what,
               int* budget) {
  for (size_t j = 0; j<cols&& * budget> 0; ++j) {
    const double g = got[j];
    bool ok = true;
    std::string want;
    if (j < ref.begin || j >= ref.valid || ref.kind == RefRow::kZeroRow) {
      ok = g == 0.0 && !std::signbit(g);
      want = "0";
    } else if (ref.kind == RefRow::kNaNRow) {
      ok = std::isnan(g);
      want = "NaN";
    } else {
      const double w = ref.p[j];
      // Masked entries (d = inf) have w = 0 exactly.
      const double tol = std::isinf(ref.d[j])
                             ? kAbs
                             : kAbs + w * (kRel + ref.cap_rel + kCond * (ref.d[j] + ref.mean_d));
      ok = std::fabs(g - w) <= tol;
      g_worst_ratio = std::max(g_worst_ratio, std::fabs(g - w) / tol);
      want = Num(w) + " +- " + Num(tol) + " (|err| = " + Num(std::fabs(g - w)) + ")";
    }
    if (!ok) {
      --*budget;
      ADD_FAILURE() << what << ": column " << j << " of " << cols << " (valid " << ref.valid
                    << "): got " << g << ", want " << want;
    }
  }
}

// A block of rows with row padding and a misaligned start; padding holds kSentinel.
struct Block {
  size_t rows, cols, stride, offset;
  std::vector<float> storage;

  Block(size_t rows_in, size_t cols_in, size_t pad, size_t offset_in)
      : rows(rows_in),
        cols(cols_in),
        stride(cols_in + pad),
        offset(offset_in),
        storage(offset_in + rows_in * (cols_in + pad) + 8, kSentinel) {}
  float* row(size_t r) { return storage.data() + offset + r * stride; }
  float* data() { return row(0); }

  void CheckSentinels(const std::string& what) const {
    for (size_t i = 0; i < storage.size(); ++i) {
      const bool inside = i >= offset && i < offset + rows * stride && (i - offset) % stride < cols;
      if (!inside && storage[i] != kSentinel) {
        ADD_FAILURE() << what << ": wrote outside the rows at storage index " << i;
        return;
      }
    }
  }
};

std::vector<uint8_t> RandomBytes(std::mt19937& rng, size_t n, double p_masked) {
  std::bernoulli_distribution masked(p_masked);
  std::uniform_int_distribution<int> value(1, 255);  // any nonzero byte means masked
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = masked(rng) ? static_cast<uint8_t>(value(rng)) : 0;
  return v;
}

// Runs SoftmaxRows on `input` ([rows, cols] dense) copied into a padded, misaligned block and
// checks every row against the reference.
void RunAndCheck(const std::vector<float>& input, size_t rows, size_t cols, float scale,
                 const SoftmaxMasks& masks, size_t pad, size_t offset, const std::string& what) {
  Block block(rows, cols, pad, offset);
  for (size_t r = 0; r < rows; ++r) {
    std::copy(input.begin() + static_cast<ptrdiff_t>(r * cols),
              input.begin() + static_cast<ptrdiff_t>((r + 1) * cols), block.row(r));
  }
  kernels::SoftmaxRows(block.data(), rows, cols, static_cast<ptrdiff_t>(block.stride), scale,
                       masks);
  int budget = 5;
  for (size_t r = 0; r < rows; ++r) {
    const RefRow ref = ReferenceRow(input.data() + r * cols, r, cols, scale, masks);
    ExpectRow(ref, block.row(r), cols, what + " row " + std::to_string(r), &budget);
  }
  block.CheckSentinels(what);
}

TEST_P(SoftmaxRowsTest, LengthsAndAlignments) {
  const char* const target = target_name();
  std::mt19937 rng(1);
  std::vector<size_t> lengths;
  for (size_t n = 1; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {1000, 4099, 8192}) lengths.push_back(n);
  for (const size_t n : lengths) {
    for (size_t offset = 0; offset < 4; ++offset) {
      const size_t rows = n > 300 ? 2 : 1;
      const std::vector<float> x = test::UniformFloats(rows * n, -8.0f, 8.0f, &rng);
      RunAndCheck(
          x, rows, n, 0.125f, SoftmaxMasks(), /*pad=*/offset, offset,
          std::string(target) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset));
    }
  }
  ReportWorst(target, "LengthsAndAlignments");
}

// Every mask kind, alone and combined, with per-row and broadcast (stride 0) rows.
TEST_P(SoftmaxRowsTest, MaskKinds) {
  const char* const target = target_name();
  std::mt19937 rng(2);
  const size_t rows = 5;
  for (const size_t n : {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 65, 100, 257, 1000}) {
    const std::vector<float> x = test::UniformFloats(rows * n, -4.0f, 4.0f, &rng);
    const std::vector<float> add0 = test::UniformFloats(rows * n, -3.0f, 3.0f, &rng);
    const std::vector<float> add1 = test::UniformFloats(rows * n, -1.0f, 1.0f, &rng);
    const std::vector<uint8_t> m0 = RandomBytes(rng, rows * n, 0.3);
    const std::vector<uint8_t> m1 = RandomBytes(rng, rows * n, 0.2);
    for (int combo = 1; combo < 16; ++combo) {
      for (int broadcast = 0; broadcast < 2; ++broadcast) {
        SoftmaxMasks masks;
        const ptrdiff_t stride = broadcast ? 0 : static_cast<ptrdiff_t>(n);
        if (combo & 1) masks.add[0] = add0.data(), masks.add_row_stride[0] = stride;
        // The second additive mask is always per row: mixes broadcast and per-row strides.
        if (combo & 2) masks.add[1] = add1.data(), masks.add_row_stride[1] = n;
        if (combo & 4) masks.masked[0] = m0.data(), masks.masked_row_stride[0] = stride;
        if (combo & 8) masks.masked[1] = m1.data(), masks.masked_row_stride[1] = n;
        RunAndCheck(x, rows, n, 0.25f, masks, /*pad=*/3, /*offset=*/n % 4,
                    std::string(target) + " n=" + std::to_string(n) + " masks=" +
                        std::to_string(combo) + " broadcast=" + std::to_string(broadcast));
      }
    }
  }
  ReportWorst(target, "MaskKinds");
}

TEST_P(SoftmaxRowsTest, CausalOffsets) {
  const char* const target = target_name();
  std::mt19937 rng(3);
  const size_t rows = 6;
  for (const size_t n : {1, 5, 6, 17, 40, 300}) {
    const std::vector<float> x = test::UniformFloats(rows * n, -5.0f, 5.0f, &rng);
    const std::vector<uint8_t> m0 = RandomBytes(rng, n, 0.25);
    for (const int64_t offset : std::vector<int64_t>{-1000, -7, -3, -1, 0, 1, 2, 5, 1000,
                                                     std::numeric_limits<int64_t>::min(),
                                                     std::numeric_limits<int64_t>::max()}) {
      for (int with_mask = 0; with_mask < 2; ++with_mask) {
        SoftmaxMasks masks;
        masks.causal = true;
        masks.causal_offset = offset;
        if (with_mask) masks.masked[0] = m0.data();  // broadcast key padding
        RunAndCheck(x, rows, n, 1.0f, masks, /*pad=*/1, /*offset=*/1,
                    std::string(target) + " n=" + std::to_string(n) + " causal_offset=" +
                        std::to_string(offset) + " mask=" + std::to_string(with_mask));
      }
    }
  }
  ReportWorst(target, "CausalOffsets");
}

// Columns beyond the causal limit are written as 0 without being read (NaN there is harmless).
TEST_P(SoftmaxRowsTest, CausalColumnsAreNotRead) {
  const char* const target = target_name();
  const size_t rows = 4, cols = 9;
  std::vector<float> x(rows * cols, kNaN);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j <= r + 1 && j < cols; ++j) x[r * cols + j] = 0.5f * j;
  }
  SoftmaxMasks masks;
  masks.causal = true;
  masks.causal_offset = 1;
  RunAndCheck(x, rows, cols, 1.0f, masks, 0, 0, target);
  std::vector<float> y = x;
  kernels::SoftmaxRows(y.data(), rows, cols, cols, 1.0f, masks);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < cols; ++j) {
      EXPECT_FALSE(std::isnan(y[r * cols + j])) << target << " row " << r << " col " << j;
    }
  }
}

// Rows with no unmasked entry become zeros (never NaN) and leave other rows alone.
TEST_P(SoftmaxRowsTest, FullyMaskedRowsAreZero) {
  const char* const target = target_name();
  std::mt19937 rng(4);
  for (const size_t n : {1, 3, 16, 37, 300}) {
    const size_t rows = 4;
    const std::vector<float> x = test::UniformFloats(rows * n, -2.0f, 2.0f, &rng);
    // Row 1 fully masked by the bool mask, row 2 by -inf additive entries, row 3 by -inf
    // scores; row 0 is normal.
    std::vector<uint8_t> m(rows * n, 0);
    std::fill(m.begin() + n, m.begin() + 2 * n, 1);
    std::vector<float> add(rows * n, 0.0f);
    std::fill(add.begin() + 2 * n, add.begin() + 3 * n, -kInf);
    std::vector<float> xin = x;
    std::fill(xin.begin() + 3 * n, xin.end(), -kInf);
    SoftmaxMasks masks;
    masks.masked[0] = m.data();
    masks.masked_row_stride[0] = n;
    masks.add[0] = add.data();
    masks.add_row_stride[0] = n;
    RunAndCheck(xin, rows, n, 0.5f, masks, 2, 3, std::string(target) + " n=" + std::to_string(n));
    // Causal with a negative offset: the first rows see no key at all.
    SoftmaxMasks causal;
    causal.causal = true;
    causal.causal_offset = -2;
    RunAndCheck(x, rows, n, 0.5f, causal, 0, 1,
                std::string(target) + " causal n=" + std::to_string(n));
  }
}

// +inf makes its row NaN (as PyTorch: exp(inf - inf)); NaN in x or in an additive mask makes its
// row NaN; NaN or +inf at a bool-masked position is ignored; -inf is just a masked entry. Other
// rows are unaffected.
TEST_P(SoftmaxRowsTest, InfAndNaN) {
  const char* const target = target_name();
  std::mt19937 rng(5);
  for (const size_t n : {1, 2, 5, 16, 33, 129}) {
    const size_t rows = 7;
    std::vector<float> x = test::UniformFloats(rows * n, -3.0f, 3.0f, &rng);
    std::vector<float> add(rows * n, 0.0f);
    std::vector<uint8_t> m(rows * n, 0);
    const size_t j = n / 2;
    x[1 * n + j] = kInf;    // row 1: NaN row
    x[2 * n + j] = kNaN;    // row 2: NaN row
    add[3 * n + j] = kNaN;  // row 3: NaN row
    x[4 * n + j] = kNaN;    // row 4: masked NaN, normal row
    m[4 * n + j] = 1;
    x[5 * n + j] = -kInf;  // row 5: p_j = 0
    x[6 * n + j] = kInf;   // row 6: masked +inf, normal row
    m[6 * n + j] = 1;
    SoftmaxMasks masks;
    masks.add[0] = add.data();
    masks.add_row_stride[0] = n;
    masks.masked[0] = m.data();
    masks.masked_row_stride[0] = n;
    RunAndCheck(x, rows, n, 1.0f, masks, 1, 2, std::string(target) + " n=" + std::to_string(n));
    // Scale 1 without masks takes the first pass's read-only loop (y = x): rows 1, 2, 4 and 6
    // are NaN rows there, row 5 keeps p_j = 0.
    RunAndCheck(x, rows, n, 1.0f, SoftmaxMasks(), 1, 2,
                std::string(target) + " unmasked n=" + std::to_string(n));
    // Spot-check the documented outcomes directly (the reference encodes the same rules).
    Block b(rows, n, 0, 0);
    std::copy(x.begin(), x.end(), b.data());
    kernels::SoftmaxRows(b.data(), rows, n, n, 1.0f, masks);
    for (size_t r : {1, 2, 3}) {
      EXPECT_TRUE(std::isnan(b.row(r)[0])) << target << " row " << r;
    }
    for (size_t r : {0, 4, 5, 6}) {
      EXPECT_FALSE(std::isnan(b.row(r)[0])) << target << " row " << r;
    }
    if (n > 1) {
      EXPECT_EQ(b.row(5)[j], 0.0f) << target;
    }
  }
}

// Scores of magnitude 1e4 (scale included) and scaled overflow to +-inf.
TEST_P(SoftmaxRowsTest, HugeMagnitudes) {
  const char* const target = target_name();
  std::mt19937 rng(6);
  for (const size_t n : {1, 7, 64, 333, 4099}) {
    for (const float scale : {1.0f, 0.125f, 1e4f, -1.0f}) {
      const size_t rows = 3;
      std::vector<float> x = test::UniformFloats(rows * n, -1e4f, 1e4f, &rng);
      if (scale == 1e4f) x = test::UniformFloats(rows * n, -1.0f, 1.0f, &rng);
      // Row 2: values clustered near +1e4 (nearly uniform after the max shift).
      for (size_t j = 0; j < n; ++j) {
        x[2 * n + j] = (scale == 1e4f ? 1.0f : 1e4f) + 0.001f * static_cast<float>(j % 7);
      }
      RunAndCheck(
          x, rows, n, scale, SoftmaxMasks(), 0, 1,
          std::string(target) + " n=" + std::to_string(n) + " scale=" + std::to_string(scale));
    }
    // Overflow of x * scale: -inf entries are masked; a +inf entry makes the row NaN.
    std::vector<float> x = test::UniformFloats(2 * n, -1.0f, 1.0f, &rng);
    x[0] = -3e38f;
    x[n + n / 2] = 3e38f;
    RunAndCheck(x, 2, n, 10.0f, SoftmaxMasks(), 0, 0,
                std::string(target) + " overflow n=" + std::to_string(n));
  }
  ReportWorst(target, "HugeMagnitudes");
}

// Positions for the variant tests. kind 0: index positions (null pointers); 1: explicit and
// monotone with an offset (keys 1000.., queries the last rows' positions, as a KV cache); 2:
// non-monotone (packed or permuted); 3: near the top of the int32 range (no overflow).
struct Positions {
  std::vector<int32_t> q, k;
};

Positions MakePositions(std::mt19937& rng, int kind, size_t rows, size_t cols) {
  Positions p;
  if (kind == 0) return p;
  p.q.resize(rows);
  p.k.resize(cols);
  std::uniform_int_distribution<int32_t> spread(0, static_cast<int32_t>(cols + rows + 3));
  for (size_t j = 0; j < cols; ++j) {
    p.k[j] = kind == 1   ? 1000 + static_cast<int32_t>(j)
             : kind == 2 ? 500 + spread(rng)
                         : std::numeric_limits<int32_t>::max() - spread(rng);
  }
  for (size_t r = 0; r < rows; ++r) {
    p.q[r] = kind == 1 ? 1000 + static_cast<int32_t>(cols) - static_cast<int32_t>(rows) +
                             static_cast<int32_t>(r)
             : kind == 2 ? 500 + spread(rng)
                         : std::numeric_limits<int32_t>::max() - spread(rng);
  }
  return p;
}

// The variant terms of one test case (softmax.h's SoftmaxMasks fields).
struct TermsCase {
  int pos_kind;
  bool causal;
  int64_t window;
  int terms;  // 0: window (and sink) only; 1: softcap on large scores; 2: ALiBi; 3: all + masks
  float sink;
  int64_t causal_offset;

  std::string Name() const {
    return "pos=" + std::to_string(pos_kind) + " causal=" + std::to_string(causal) +
           " window=" + std::to_string(window) + " terms=" + std::to_string(terms) +
           " sink=" + Num(sink) + " offset=" + std::to_string(causal_offset);
  }
};

// Scores, masks and positions of one case; `masks` points into the vectors.
struct TermsInputs {
  std::vector<float> x, add;
  std::vector<uint8_t> bools;
  Positions pos;
  SoftmaxMasks masks;
  float scale = 0.25f;

  TermsInputs(std::mt19937& rng, const TermsCase& c, size_t rows, size_t cols) {
    pos = MakePositions(rng, c.pos_kind, rows, cols);
    if (c.terms == 1 || c.terms == 3) {
      // Large scores: the cap saturates (|y| up to 150 against a cap of 30).
      x = test::UniformFloats(rows * cols, -300.0f, 300.0f, &rng);
      scale = 0.5f;
      masks.softcap = 30.0f;
    } else {
      x = test::UniformFloats(rows * cols, -6.0f, 6.0f, &rng);
    }
    if (c.terms >= 2) masks.alibi_slope = c.terms == 2 ? 0.0625f : 0.5f;
    if (c.terms == 3) {
      add = test::UniformFloats(rows * cols, -2.0f, 2.0f, &rng);
      bools = RandomBytes(rng, rows * cols, 0.2);
      masks.add[0] = add.data();
      masks.add_row_stride[0] = static_cast<ptrdiff_t>(cols);
      masks.masked[0] = bools.data();
      masks.masked_row_stride[0] = static_cast<ptrdiff_t>(cols);
    }
    masks.causal = c.causal;
    masks.causal_offset = c.causal_offset;
    masks.window = c.window;
    masks.sink = c.sink;
    if (c.pos_kind != 0) {
      masks.q_pos = pos.q.data();
      masks.k_pos = pos.k.data();
    }
  }
};

// Every variant term and their combinations against the reference: window sizes around the
// vector lengths and beyond the row, causal and not, index / offset / non-monotone / int32-edge
// positions, odd lengths and misaligned rows.
TEST_P(SoftmaxRowsTest, VariantTerms) {
  const char* const target = target_name();
  std::mt19937 rng(11);
  const size_t rows = 6;
  const float sinks[] = {-kInf, 0.0f, 2.5f, -3.0f, 40.0f};
  size_t case_index = 0;
  for (const size_t n : {1, 2, 3, 7, 16, 17, 33, 100, 257}) {
    const int64_t offsets[] = {0, 2, -3, static_cast<int64_t>(n) - static_cast<int64_t>(rows)};
    for (int pos_kind = 0; pos_kind < 4; ++pos_kind) {
      for (const bool causal : {false, true}) {
        for (const int64_t window : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{16},
                                     static_cast<int64_t>(n) + 5, int64_t{1} << 40}) {
          for (int terms = 0; terms < 4; ++terms, ++case_index) {
            const TermsCase c = {
                pos_kind, causal, window, terms, sinks[case_index % 5], offsets[case_index % 4]};
            const TermsInputs in(rng, c, rows, n);
            RunAndCheck(in.x, rows, n, in.scale, in.masks, /*pad=*/n % 3, /*offset=*/case_index % 4,
                        std::string(target) + " n=" + std::to_string(n) + " " + c.Name());
          }
        }
      }
    }
  }
  ReportWorst(target, "VariantTerms");
}

// Columns outside VisibleColumns (the window with index positions) are written as 0 without
// being read: NaN there is harmless, in SoftmaxRows and in OnlineSoftmaxUpdate.
TEST_P(SoftmaxRowsTest, WindowColumnsAreNotRead) {
  const char* const target = target_name();
  const size_t rows = 5, cols = 23;
  for (const bool causal : {false, true}) {
    for (const int64_t window : {1, 4, 9}) {
      SoftmaxMasks masks;
      masks.causal = causal;
      masks.causal_offset = 6;
      masks.window = window;
      masks.alibi_slope = 0.25f;
      std::vector<float> x(rows * cols, kNaN);
      for (size_t r = 0; r < rows; ++r) {
        const kernels::ColumnRange c = kernels::VisibleColumns(masks, r, cols);
        ASSERT_LT(c.begin, c.end) << target;
        for (size_t j = c.begin; j < c.end; ++j) x[r * cols + j] = 0.1f * static_cast<float>(j);
      }
      const std::string what = std::string(target) + " causal=" + std::to_string(causal) +
                               " window=" + std::to_string(window);
      RunAndCheck(x, rows, cols, 1.0f, masks, 1, 1, what);
      std::vector<float> online = x, row_max(rows, -kInf), row_sum(rows, 0.0f), acc(rows, 0.0f);
      kernels::OnlineSoftmaxUpdate(online.data(), rows, cols, cols, 1.0f, masks, row_max.data(),
                                   row_sum.data(), acc.data(), 1, 1);
      for (size_t r = 0; r < rows; ++r) {
        const kernels::ColumnRange c = kernels::VisibleColumns(masks, r, cols);
        for (size_t j = 0; j < cols; ++j) {
          const float v = online[r * cols + j];
          if (j < c.begin || j >= c.end) {
            EXPECT_EQ(v, 0.0f) << what << " online row " << r << " col " << j;
          } else {
            EXPECT_GT(v, 0.0f) << what << " online row " << r << " col " << j;
          }
        }
        EXPECT_GT(row_sum[r], 0.0f) << what << " row " << r;
      }
    }
  }
}

// Sinks: the weights sum to 1 - p_sink; a sink of -inf is bitwise no sink; a row whose keys are
// all masked is zeros whatever the sink; a NaN or +inf sink gives NaN rows.
TEST_P(SoftmaxRowsTest, Sinks) {
  const char* const target = target_name();
  std::mt19937 rng(12);
  for (const size_t n : {1, 5, 16, 37, 300}) {
    const size_t rows = 3;
    const std::vector<float> x = test::UniformFloats(rows * n, -4.0f, 4.0f, &rng);
    std::vector<uint8_t> bools(rows * n, 0);
    std::fill(bools.begin() + 2 * n, bools.end(), 1);  // row 2 fully masked
    SoftmaxMasks masks;
    masks.masked[0] = bools.data();
    masks.masked_row_stride[0] = n;
    std::vector<float> none = x;
    kernels::SoftmaxRows(none.data(), rows, n, n, 0.5f, masks);
    for (const float sink : {-kInf, -30.0f, -1.0f, 0.0f, 3.0f, 90.0f}) {
      SoftmaxMasks with = masks;
      with.sink = sink;
      std::vector<float> y = x;
      kernels::SoftmaxRows(y.data(), rows, n, n, 0.5f, with);
      const std::string what =
          std::string(target) + " n=" + std::to_string(n) + " sink=" + Num(sink);
      if (sink == -kInf) {
        EXPECT_EQ(std::memcmp(y.data(), none.data(), y.size() * sizeof(float)), 0) << what;
      }
      for (size_t r = 0; r < 2; ++r) {
        const RefRow ref = ReferenceRow(x.data() + r * n, r, n, 0.5f, with);
        double sum = 0;
        for (size_t j = 0; j < n; ++j) sum += y[r * n + j];
        EXPECT_NEAR(sum, 1.0 - ref.p_sink, 4e-6) << what << " row " << r;
      }
      for (size_t j = 0; j < n; ++j) EXPECT_EQ(y[2 * n + j], 0.0f) << what << " masked row";
    }
    for (const float sink : {kNaN, kInf}) {
      SoftmaxMasks with = masks;
      with.sink = sink;
      std::vector<float> y = x;
      kernels::SoftmaxRows(y.data(), rows, n, n, 0.5f, with);
      EXPECT_TRUE(std::isnan(y[0])) << target << " sink " << sink;
      EXPECT_EQ(y[2 * n], 0.0f) << target << " masked row, sink " << sink;
    }
  }
}

// The online recurrence over uneven key blocks, finished, equals the one-shot softmax-weighted
// sum of V. The test adds p . V for each block with a plain loop (in double, rounded into the f32
// acc once per block).
//
// Tolerance per output c: kAbs + sum_j p_j |V_jc| * (kOnlineRel + (blocks + 1) * 2^-23 * (d_j +
// E[d])): kOnlineRel = 4e-6 is the softmax budget (2e-6) plus one rounding per block of acc,
// row_sum and the rescale factors (<= 8 blocks * 3 * 2^-24 = 1.4e-6) and the final reciprocal;
// each rescale by exp(m_old - m_new) adds a conditioning term like the one of SoftmaxRows.
TEST_P(OnlineSoftmaxTest, MatchesOneShot) {
  const char* const target = target_name();
  std::mt19937 rng(7);
  constexpr double kOnlineRel = 4e-6;
  const size_t rows = 5;
  for (const size_t total : {1, 5, 17, 64, 100, 257, 1000}) {
    for (const size_t num_blocks : {1, 2, 3, 7}) {
      if (num_blocks > total) continue;
      for (const size_t hd : {1, 3, 16, 37}) {
        for (int variant = 0; variant < 6; ++variant) {
          // variant 0: no masks; 1: bool + additive masks; 2: causal (offset 2) + bool;
          // 3: causal with a negative offset (some rows fully masked); 4 and 5: variants 0
          // and 1 on scores rising along the row by 300 after the scale, so later blocks rise
          // above the reference by more than kOnlineSoftmaxHeadroom (the fused pass stops
          // inside a block and the rest of the block takes passes 1 and 2).
          std::vector<float> x = test::UniformFloats(rows * total, -6.0f, 6.0f, &rng);
          if (variant >= 4) {
            for (size_t i = 0; i < x.size(); ++i) {
              x[i] += 1000.0f * static_cast<float>(i % total) / static_cast<float>(total);
            }
          }
          const std::vector<float> v = test::UniformFloats(total * hd, -1.0f, 1.0f, &rng);
          const std::vector<float> add = test::UniformFloats(rows * total, -2.0f, 2.0f, &rng);
          std::vector<uint8_t> m = RandomBytes(rng, rows * total, 0.3);
          std::fill(m.begin() + 4 * total, m.end(), 1);  // row 4 fully masked
          SoftmaxMasks full;
          if (variant == 1 || variant == 2 || variant == 5) {
            full.masked[0] = m.data();
            full.masked_row_stride[0] = total;
          }
          if (variant == 1 || variant == 5) {
            full.add[0] = add.data();
            full.add_row_stride[0] = total;
          }
          if (variant == 2 || variant == 3) {
            full.causal = true;
            full.causal_offset = variant == 2 ? 2 : -3;
          }
          const float scale = 0.3f;
          // Uneven block boundaries: sorted distinct cut points.
          std::vector<size_t> cuts = {0, total};
          std::uniform_int_distribution<size_t> cut(1, total - 1);
          while (cuts.size() < num_blocks + 1) {
            const size_t c = cut(rng);
            if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
          }
          std::sort(cuts.begin(), cuts.end());

          std::vector<float> row_max(rows, -kInf), row_sum(rows, 0.0f);
          const size_t acc_stride = hd + 2;
          std::vector<float> acc(rows * acc_stride, 0.0f);
          for (size_t b = 0; b < num_blocks; ++b) {
            const size_t k0 = cuts[b], cols = cuts[b + 1] - cuts[b];
            Block scores(rows, cols, 1, b % 4);
            for (size_t r = 0; r < rows; ++r) {
              std::copy(x.begin() + static_cast<ptrdiff_t>(r * total + k0),
                        x.begin() + static_cast<ptrdiff_t>(r * total + k0 + cols), scores.row(r));
            }
            SoftmaxMasks bm = full;
            for (int k = 0; k < 2; ++k) {
              if (bm.add[k]) bm.add[k] += k0;
              if (bm.masked[k]) bm.masked[k] += k0;
            }
            bm.causal_offset = full.causal_offset - static_cast<int64_t>(k0);
            kernels::OnlineSoftmaxUpdate(
                scores.data(), rows, cols, static_cast<ptrdiff_t>(scores.stride), scale, bm,
                row_max.data(), row_sum.data(), acc.data(), hd, static_cast<ptrdiff_t>(acc_stride));
            for (size_t r = 0; r < rows; ++r) {
              for (size_t c = 0; c < hd; ++c) {
                double dot = 0;
                for (size_t j = 0; j < cols; ++j) {
                  dot += static_cast<double>(scores.row(r)[j]) * v[(k0 + j) * hd + c];
                }
                acc[r * acc_stride + c] = static_cast<float>(acc[r * acc_stride + c] + dot);
              }
            }
            scores.CheckSentinels(std::string(target) + " scores");
          }
          kernels::OnlineSoftmaxFinish(acc.data(), rows, hd, static_cast<ptrdiff_t>(acc_stride),
                                       row_sum.data());

          int budget = 5;
          for (size_t r = 0; r < rows; ++r) {
            const RefRow ref = ReferenceRow(x.data() + r * total, r, total, scale, full);
            for (size_t c = 0; c < hd && budget > 0; ++c) {
              const float g = acc[r * acc_stride + c];
              double want = 0, tol = kAbs;
              if (ref.kind == RefRow::kNormal) {
                for (size_t j = 0; j < ref.valid; ++j) {
                  const double pv = ref.p[j] * v[j * hd + c];
                  want += pv;
                  if (std::isinf(ref.d[j])) continue;  // masked: p = 0
                  tol += std::fabs(pv) *
                         (kOnlineRel + (num_blocks + 1) * kCond * (ref.d[j] + ref.mean_d));
                }
              }
              const bool ok =
                  ref.kind == RefRow::kNaNRow ? std::isnan(g) : std::fabs(g - want) <= tol;
              if (ref.kind != RefRow::kNaNRow) {
                g_worst_ratio = std::max(g_worst_ratio, std::fabs(g - want) / tol);
              }
              if (!ok) {
                --budget;
                ADD_FAILURE() << target << " total=" << total << " blocks=" << num_blocks
                              << " hd=" << hd << " variant=" << variant << " row " << r << " col "
                              << c << ": got " << Num(g) << ", want " << Num(want) << " +- "
                              << Num(tol);
              }
            }
          }
        }
      }
    }
  }
  ReportWorst(target, "MatchesOneShot");
}

// NaN or +inf in any block makes the row's output NaN, in the first block (passes 1 and 2) and
// in a later one (the fused pass, in its two-vector loop and in its tail); NaN at a bool-masked
// position is ignored; fully masked rows finish as zeros.
TEST_P(OnlineSoftmaxTest, SpecialValues) {
  const char* const target = target_name();
  const size_t rows = 5, cols = 19, hd = 4;
  std::vector<float> row_max(rows, -kInf), row_sum(rows, 0.0f), acc(rows * hd, 0.0f);
  std::vector<uint8_t> m(rows * cols, 0);
  std::fill(m.begin() + 2 * cols, m.begin() + 3 * cols, 1);  // row 2 fully masked
  m[4 * cols + 10] = 1;
  SoftmaxMasks masks;
  masks.masked[0] = m.data();
  masks.masked_row_stride[0] = cols;
  for (int block = 0; block < 2; ++block) {
    std::vector<float> s(rows * cols, 1.0f);
    if (block == 1) s[0 * cols + 3] = kNaN;   // row 0: NaN in the second block
    if (block == 0) s[1 * cols + 2] = kInf;   // row 1: +inf in the first block
    if (block == 1) s[3 * cols + 17] = kInf;  // row 3: +inf in the second block's last columns
    if (block == 1) s[4 * cols + 10] = kNaN;  // row 4: NaN where the bool mask is set
    kernels::OnlineSoftmaxUpdate(s.data(), rows, cols, cols, 1.0f, masks, row_max.data(),
                                 row_sum.data(), acc.data(), hd, hd);
    for (size_t j = 0; j < cols; ++j) EXPECT_EQ(s[2 * cols + j], 0.0f) << target;
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < hd; ++c) {
        double dot = 0;
        for (size_t j = 0; j < cols; ++j) dot += s[r * cols + j] * 0.5;
        acc[r * hd + c] = static_cast<float>(acc[r * hd + c] + dot);
      }
    }
  }
  kernels::OnlineSoftmaxFinish(acc.data(), rows, hd, hd, row_sum.data());
  for (size_t c = 0; c < hd; ++c) {
    EXPECT_TRUE(std::isnan(acc[0 * hd + c])) << target;
    EXPECT_TRUE(std::isnan(acc[1 * hd + c])) << target;
    EXPECT_EQ(acc[2 * hd + c], 0.0f) << target;
    EXPECT_TRUE(std::isnan(acc[3 * hd + c])) << target;
    EXPECT_NEAR(acc[4 * hd + c], 0.5f, 1e-6f) << target;
  }
  EXPECT_EQ(row_sum[2], 0.0f) << target;
  EXPECT_EQ(row_max[2], -kInf) << target;
}

// The online recurrence with the variant terms over uneven key blocks (masks, k_pos and the
// index offset moved to each block), started from the sink's state (row_max = sink, row_sum =
// 1, acc = 0; or (-inf, 0) without one) and finished, equals SoftmaxRows's weights (with the
// sink) times V. Tolerance as MatchesOneShot's, plus the softcap's.
TEST_P(OnlineSoftmaxTest, VariantTermsMatchOneShot) {
  const char* const target = target_name();
  std::mt19937 rng(13);
  constexpr double kOnlineRel = 4e-6;
  const size_t rows = 5;
  const float sinks[] = {-kInf, -20.0f, 0.5f, 30.0f, 200.0f};
  size_t case_index = 0;
  for (const size_t total : {1, 5, 17, 64, 257}) {
    for (const size_t num_blocks : {1, 2, 3, 5}) {
      if (num_blocks > total) continue;
      for (int pos_kind = 0; pos_kind < 3; ++pos_kind) {
        for (const bool causal : {false, true}) {
          for (const int64_t window :
               {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{16}, static_cast<int64_t>(total) + 2}) {
            for (int terms = 0; terms < 5; ++terms, ++case_index) {
              // terms 4: ALiBi on scores rising along the row by 300 (the rescaling path).
              const TermsCase c = {pos_kind,
                                   causal,
                                   window,
                                   terms == 4 ? 2 : terms,
                                   sinks[case_index % 5],
                                   case_index % 2 ? 2 : -1};
              TermsInputs in(rng, c, rows, total);
              if (terms == 4) {
                for (size_t i = 0; i < in.x.size(); ++i) {
                  in.x[i] += 1200.0f * static_cast<float>(i % total) / static_cast<float>(total);
                }
              }
              // Row 4 fully masked (its output is zeros even with a sink).
              std::vector<uint8_t> row4(rows * total, 0);
              std::fill(row4.begin() + 4 * total, row4.end(), 1);
              if (!in.masks.masked[0]) {
                in.masks.masked[0] = row4.data();
                in.masks.masked_row_stride[0] = static_cast<ptrdiff_t>(total);
              } else {
                in.masks.masked[1] = row4.data();
                in.masks.masked_row_stride[1] = static_cast<ptrdiff_t>(total);
              }
              const size_t hd = case_index % 2 ? 3 : 16;
              const std::vector<float> v = test::UniformFloats(total * hd, -1.0f, 1.0f, &rng);
              std::vector<size_t> cuts = {0, total};
              std::uniform_int_distribution<size_t> cut(1, total - 1);
              while (cuts.size() < num_blocks + 1) {
                const size_t k = cut(rng);
                if (std::find(cuts.begin(), cuts.end(), k) == cuts.end()) cuts.push_back(k);
              }
              std::sort(cuts.begin(), cuts.end());

              const float sink = in.masks.sink;
              std::vector<float> row_max(rows, sink), row_sum(rows, sink > -kInf ? 1.0f : 0.0f);
              const size_t acc_stride = hd + 1;
              std::vector<float> acc(rows * acc_stride, 0.0f);
              for (size_t b = 0; b < num_blocks; ++b) {
                const size_t k0 = cuts[b], cols = cuts[b + 1] - cuts[b];
                Block scores(rows, cols, 2, (b + case_index) % 4);
                for (size_t r = 0; r < rows; ++r) {
                  std::copy(in.x.begin() + static_cast<ptrdiff_t>(r * total + k0),
                            in.x.begin() + static_cast<ptrdiff_t>(r * total + k0 + cols),
                            scores.row(r));
                }
                SoftmaxMasks bm = in.masks;
                for (int k = 0; k < 2; ++k) {
                  if (bm.add[k]) bm.add[k] += k0;
                  if (bm.masked[k]) bm.masked[k] += k0;
                }
                if (bm.k_pos) bm.k_pos += k0;
                bm.causal_offset = in.masks.causal_offset - static_cast<int64_t>(k0);
                kernels::OnlineSoftmaxUpdate(scores.data(), rows, cols,
                                             static_cast<ptrdiff_t>(scores.stride), in.scale, bm,
                                             row_max.data(), row_sum.data(), acc.data(), hd,
                                             static_cast<ptrdiff_t>(acc_stride));
                for (size_t r = 0; r < rows; ++r) {
                  for (size_t col = 0; col < hd; ++col) {
                    double dot = 0;
                    for (size_t j = 0; j < cols; ++j) {
                      dot += static_cast<double>(scores.row(r)[j]) * v[(k0 + j) * hd + col];
                    }
                    acc[r * acc_stride + col] = static_cast<float>(acc[r * acc_stride + col] + dot);
                  }
                }
                scores.CheckSentinels(std::string(target) + " scores");
              }
              kernels::OnlineSoftmaxFinish(acc.data(), rows, hd, static_cast<ptrdiff_t>(acc_stride),
                                           row_sum.data());

              int budget = 3;
              for (size_t r = 0; r < rows; ++r) {
                const RefRow ref =
                    ReferenceRow(in.x.data() + r * total, r, total, in.scale, in.masks);
                ASSERT_NE(ref.kind, RefRow::kNaNRow);
                for (size_t col = 0; col < hd && budget > 0; ++col) {
                  const float g = acc[r * acc_stride + col];
                  double want = 0, tol = kAbs;
                  if (ref.kind == RefRow::kNormal) {
                    for (size_t j = ref.begin; j < ref.valid; ++j) {
                      if (std::isinf(ref.d[j])) continue;  // masked: p = 0
                      const double pv = ref.p[j] * v[j * hd + col];
                      want += pv;
                      tol += std::fabs(pv) * (kOnlineRel + ref.cap_rel +
                                              (num_blocks + 1) * kCond * (ref.d[j] + ref.mean_d));
                    }
                  }
                  g_worst_ratio = std::max(g_worst_ratio, std::fabs(g - want) / tol);
                  if (!(std::fabs(g - want) <= tol)) {
                    --budget;
                    ADD_FAILURE() << target << " total=" << total << " blocks=" << num_blocks << " "
                                  << c.Name() << " rising=" << (terms == 4) << " row " << r
                                  << " col " << col << ": got " << Num(g) << ", want " << Num(want)
                                  << " +- " << Num(tol);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  ReportWorst(target, "VariantTermsMatchOneShot");
}

// Rows with nothing added (scale 1, no masks or terms: the scores product applied the scale)
// build no per-row masks; they must give the bits of the general path, which an all-zero
// additive mask forces (y = x + 0 = x): scores, acc, row max and sum after a first block (passes
// 1 and 2) and a second one (the fused pass), at lengths around the vector and two-vector
// boundaries, non-causal and causal (rows with no visible key too), with rows holding a NaN, a
// +inf, only -inf, and some -inf.
TEST_P(OnlineSoftmaxTest, PlainRowsMatchGeneralPath) {
  const char* const target = target_name();
  std::mt19937 rng(29);
  const size_t rows = 7, hd = 5;
  for (const size_t cols : {1, 5, 8, 15, 16, 17, 31, 32, 33, 47, 64, 70}) {
    // No causal mask, then causal with offsets 0, -3 (rows 0-2 see no key) and 4.
    for (const int64_t causal_offset : {int64_t{-100}, int64_t{0}, int64_t{-3}, int64_t{4}}) {
      const std::string what = std::string(target) + " cols " + std::to_string(cols) +
                               " causal_offset " + std::to_string(causal_offset);
      SoftmaxMasks plain;
      plain.causal = causal_offset != -100;
      plain.causal_offset = plain.causal ? causal_offset : 0;
      const std::vector<float> zeros(rows * cols, 0.0f);
      SoftmaxMasks general = plain;
      general.add[0] = zeros.data();
      general.add_row_stride[0] = static_cast<ptrdiff_t>(cols);
      std::vector<float> row_max[2], row_sum[2], acc[2];
      for (int k = 0; k < 2; ++k) {
        row_max[k].assign(rows, -kInf);
        row_sum[k].assign(rows, 0.0f);
        acc[k].assign(rows * hd, kSentinel);
      }
      for (int block = 0; block < 2; ++block) {
        std::vector<float> x = test::UniformFloats(rows * cols, -6.0f, 6.0f, &rng);
        if (block == 0) {
          x[1 * cols + cols / 2] = kNaN;
          x[2 * cols] = kInf;
          std::fill(x.begin() + 3 * cols, x.begin() + 4 * cols, -kInf);
          for (size_t j = 0; j < cols; j += 3) x[5 * cols + j] = -kInf;
        }
        std::vector<float> y[2] = {x, x};
        for (int k = 0; k < 2; ++k) {
          kernels::OnlineSoftmaxUpdate(
              y[k].data(), rows, cols, static_cast<ptrdiff_t>(cols), 1.0f, k == 0 ? plain : general,
              row_max[k].data(), row_sum[k].data(), acc[k].data(), hd, static_cast<ptrdiff_t>(hd));
        }
        const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
          return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same(y[0], y[1])) << what << " block " << block << ": scores";
        EXPECT_TRUE(same(acc[0], acc[1])) << what << " block " << block << ": acc";
        EXPECT_TRUE(same(row_max[0], row_max[1])) << what << " block " << block << ": row max";
        EXPECT_TRUE(same(row_sum[0], row_sum[1])) << what << " block " << block << ": row sum";
      }
    }
  }
}

// Finish alone: acc / row_sum, zeros for a zero sum, with row strides.
TEST_P(OnlineSoftmaxTest, Finish) {
  const char* const target = target_name();
  for (const size_t hd : {1, 5, 16, 67}) {
    const size_t rows = 3, stride = hd + 3;
    std::vector<float> acc(rows * stride, kSentinel);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < hd; ++c) acc[r * stride + c] = static_cast<float>(c) - 2.5f;
    }
    const std::vector<float> sums = {4.0f, 0.0f, 3.0f};
    kernels::OnlineSoftmaxFinish(acc.data(), rows, hd, stride, sums.data());
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < stride; ++c) {
        const float want = c >= hd        ? kSentinel
                           : sums[r] == 0 ? 0.0f
                                          : (static_cast<float>(c) - 2.5f) * (1.0f / sums[r]);
        EXPECT_EQ(acc[r * stride + c], want) << target << " hd=" << hd << " row " << r;
      }
    }
  }
}

// The softmax exp alone against exp in double, correctly rounded to f32: at most 2 ULP on a
// sample of every 4099th f32 bit pattern in [-87, 0] and in (0, 8] (every binade) plus the
// boundaries; below -87 and -inf give 0, 0 and -0 give exactly 1. Misaligned starts and every
// tail length up to two vectors. (Run over every 7th f32 in [-87, 0], 159 million values, on
// AVX2, SSE4, SSSE3 and SCALAR, the maximum was also 2 ULP; 0.7% of values are 2 ULP off.)
TEST_P(ExpNonPositiveTest, WithinTwoUlp) {
  const char* const target = target_name();
  auto bits_of = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u;
  };
  std::vector<float> x;
  for (uint32_t b = bits_of(-0.0f); b <= bits_of(-87.0f); b += 4099) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    x.push_back(f);
  }
  // (0, kOnlineSoftmaxHeadroom]: the online softmax's fused pass exponentiates up to there.
  for (uint32_t b = bits_of(1e-45f); b <= bits_of(kernels::kOnlineSoftmaxHeadroom); b += 4099) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    x.push_back(f);
  }
  for (const float f : {0.0f, -0.0f, -87.0f, -86.99999f, -1e-45f, -1e-38f, -0.34657359f,
                        -0.34657362f, -0.69314718f, -1.0f, -10.0f, -50.5f}) {
    x.push_back(f);
  }
  const size_t n_checked = x.size();
  for (const float f : {-87.00001f, -88.0f, -103.9f, -1e4f, -3.4e38f, -kInf}) x.push_back(f);
  for (size_t offset = 0; offset < 3; ++offset) {
    std::vector<float> in(offset + x.size()), out(offset + x.size() + 1, kSentinel);
    std::copy(x.begin(), x.end(), in.begin() + offset);
    kernels::ExpNonPositiveRow(in.data() + offset, out.data() + offset, x.size());
    int failures = 0;
    for (size_t i = 0; i < x.size() && failures < 5; ++i) {
      const float got = out[offset + i];
      if (i >= n_checked) {
        if (got != 0.0f) ++failures;
        EXPECT_EQ(got, 0.0f) << target << " x=" << x[i];
        continue;
      }
      const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
      const int64_t ulps =
          std::abs(static_cast<int64_t>(bits_of(got)) - static_cast<int64_t>(bits_of(want)));
      if (ulps > 2) ++failures;
      EXPECT_LE(ulps, 2) << target << " x=" << x[i] << " got " << got << " want " << want;
    }
    EXPECT_EQ(out[offset + x.size()], kSentinel) << target << ": wrote past the end";
    EXPECT_EQ(out[offset + 0], 1.0f) << target;  // exp(-0) (the sample starts at -0.0)
  }
  // Every short length: vector tails and the in-place form (x and y the same array).
  for (size_t n = 1; n <= 40; ++n) {
    std::vector<float> v(n + 1, kSentinel);
    for (size_t i = 0; i < n; ++i) v[i] = -0.25f * static_cast<float>(i);
    kernels::ExpNonPositiveRow(v.data(), v.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(std::exp(-0.25 * static_cast<double>(i)));
      EXPECT_NEAR(v[i], want, want * 2.4e-7f) << target << " n=" << n << " i=" << i;  // 2 ULP
    }
    EXPECT_EQ(v[n], kSentinel) << target << " n=" << n;
  }
}

// VisibleColumns against the per-column predicates in exact arithmetic, at extreme offsets and
// windows (no int64 overflow).
TEST(VisibleColumnsTest, MatchesPredicate) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const size_t cols : {0, 1, 5, 40}) {
    for (const int64_t offset :
         {kMin, kMin + 3, int64_t{-1000}, int64_t{-7}, int64_t{-1}, int64_t{0}, int64_t{1},
          int64_t{5}, int64_t{1000}, kMax - 2, kMax}) {
      for (const int64_t window :
           {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, kMax - 1, kMax}) {
        for (const bool causal : {false, true}) {
          SoftmaxMasks m;
          m.causal = causal;
          m.causal_offset = offset;
          m.window = window;
          for (size_t r = 0; r < 8; ++r) {
            size_t first = cols, last = 0;
            for (size_t j = 0; j < cols; ++j) {
              const bool visible = (!causal || Distance(m, r, j) >= 0) && WindowVisible(m, r, j);
              if (visible) first = std::min(first, j), last = j + 1;
            }
            const kernels::ColumnRange c = kernels::VisibleColumns(m, r, cols);
            const std::string what =
                "cols=" + std::to_string(cols) + " offset=" + std::to_string(offset) +
                " window=" + std::to_string(window) + " causal=" + std::to_string(causal) +
                " r=" + std::to_string(r);
            ASSERT_LE(c.begin, c.end) << what;
            ASSERT_LE(c.end, cols) << what;
            if (first < last) {
              EXPECT_EQ(c.begin, first) << what;
              EXPECT_EQ(c.end, last) << what;
            } else {
              EXPECT_EQ(c.begin, c.end) << what;
            }
          }
        }
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(SoftmaxRowsTest);
MHA_INSTANTIATE_PER_TARGET(OnlineSoftmaxTest);
MHA_INSTANTIATE_PER_TARGET(ExpNonPositiveTest);

}  // namespace
}  // namespace mha
