// Tests of the quantized weight kernels (kernels/quant.h, gemv_quant.h, gemm.h's GemmQuantB):
// - quantization: scales, codes and the packed layout checked against the definition (scale =
//   max|w| / 127 or / 7 in f32; code nearest to w / scale, ties to even; kI4: nibble s of
//   little-endian word k of a 128-element group holds element 16 s + k as code + 8, checked by
//   the test's own reading and byte by byte by hand), and |w - code * scale| <= scale / 2;
// - dequantization (DequantizeRows) on every target: code * scale rounded to f32, any start;
// - GemvQuant on every target: bitwise kernels::Gemv on the dequantized matrix (alpha 1, beta 0)
//   where its f32 vectors have at most 16 lanes (GemvQuantOrdersAsGemv: all but SVE wider than
//   512 bits), and within Gemv's bound of a double reference everywhere; odd sizes (k 1..300,
//   n 1..70, m 1..9 and 16), misaligned rows of a, codes and scales, padded row strides, every
//   storage of c;
// - GemmQuantB on every target: bitwise kernels::Gemm on the dequantized matrix, for row counts
//   on both sides of the GEMV route.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "kernels/gemv_quant.h"
#include "tests/kernel_test_util.h"
#include "tests/quant_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // 2^-24

// The dequantized matrix [rows, cols] (row stride cols), from the test's own reading of the
// layout: code * scale in f32.
std::vector<float> Dequantized(const QuantMatrix& q) {
  std::vector<float> out(q.rows * q.cols);
  for (size_t r = 0; r < q.rows; ++r) {
    for (size_t p = 0; p < q.cols; ++p) {
      const uint8_t* row = q.codes + r * q.row_bytes;
      int code;
      float scale;
      if (q.type == DType::kI8) {
        code = static_cast<int8_t>(row[p]);
        scale = q.scales[r * q.scales_per_row];
      } else {
        // Group p / 128 is 16 little-endian words of 4 bytes; element e of it is nibble e / 16
        // of word e % 16.
        const uint8_t* word = row + p / 128 * 64 + p % 16 * 4;
        const uint32_t bits = word[0] | word[1] << 8 | word[2] << 16 | uint32_t{word[3]} << 24;
        code = static_cast<int>(bits >> (p % 128 / 16 * 4) & 0xF) - 8;
        scale = q.scales[r * q.scales_per_row + p / q.block];
      }
      out[r * q.cols + p] = static_cast<float>(code) * scale;
    }
  }
  return out;
}

// Rows of varied magnitudes: uniform, with a few large outliers, tiny, all zero, and values on
// exact ties of the quantization grid.
std::vector<float> TestWeights(size_t rows, size_t cols, std::mt19937* rng) {
  std::vector<float> w = test::SymmetricFloats(rows * cols, 1.0f, rng);
  for (size_t r = 0; r < rows; ++r) {
    float* row = w.data() + r * cols;
    switch (r % 5) {
      case 1:
        row[(r * 7) % cols] *= 40.0f;  // an outlier sets the row's (block's) scale
        break;
      case 2:
        for (size_t p = 0; p < cols; ++p) row[p] *= 1e-20f;
        break;
      case 3:
        for (size_t p = 0; p < cols; ++p) row[p] = 0.0f;
        break;
      case 4:
        // Multiples of 0.5: with max 7 (or 127) the quotients hit every half-integer tie.
        for (size_t p = 0; p < cols; ++p) row[p] = 0.5f * static_cast<float>(int(p % 29) - 14);
        break;
      default:
        break;
    }
  }
  return w;
}

TEST(QuantizeTest, ScalesCodesAndLayoutFollowTheDefinition) {
  std::mt19937 rng(11);
  for (const Format& f : kFormats) {
    for (const size_t cols :
         {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 100, 127, 128, 129, 200, 255, 256, 257, 300}) {
      const size_t rows = 10;
      const std::vector<float> w = TestWeights(rows, cols, &rng);
      const QuantStorage q = Quantize(w, rows, cols, f, 1, 3);
      const int qmax = f.type == DType::kI8 ? 127 : 7;
      const size_t group = f.type == DType::kI8 ? cols : f.block;
      const std::vector<float> deq = Dequantized(q.m);
      for (size_t r = 0; r < rows; ++r) {
        for (size_t g0 = 0; g0 < cols; g0 += group) {
          const size_t g1 = std::min(cols, g0 + group);
          float amax = 0.0f;
          for (size_t p = g0; p < g1; ++p) amax = std::max(amax, std::fabs(w[r * cols + p]));
          const float scale = q.m.scales[r * q.m.scales_per_row + g0 / group];
          ASSERT_EQ(test::Bits(scale), test::Bits(amax / static_cast<float>(qmax)))
              << f.Name() << " cols " << cols << " row " << r << " group " << g0 / group;
          for (size_t p = g0; p < g1; ++p) {
            const int code = QuantCode(q.m, r, p);
            const double x = w[r * cols + p];
            const double err = std::fabs(x - static_cast<double>(code) * scale);  // exact
            ASSERT_LE(std::abs(code), qmax);
            ASSERT_LE(err, 0.5 * scale) << f.Name() << " row " << r << " element " << p;
            if (err == 0.5 * scale && scale > 0.0f) {
              ASSERT_EQ(code % 2, 0) << f.Name() << ": a tie rounds to even, element " << p;
            }
            // The test's reading of the layout agrees with the kernels' accessors.
            ASSERT_EQ(test::Bits(deq[r * cols + p]), test::Bits(DequantizedWeight(q.m, r, p)));
            ASSERT_EQ(test::Bits(deq[r * cols + p]), test::Bits(static_cast<float>(code) * scale));
          }
        }
        if (f.type == DType::kI4) {
          // The last group's padding holds zero codes.
          ASSERT_EQ(q.m.row_bytes - 3, (cols + 127) / 128 * 64);
          for (size_t p = cols; p < (cols + 127) / 128 * 128; ++p) {
            const uint8_t byte =
                q.m.codes[r * q.m.row_bytes + p / 128 * 64 + p % 16 * 4 + p % 128 / 32];
            ASSERT_EQ(p / 16 % 2 == 0 ? byte & 0xF : byte >> 4, 8) << "padding element " << p;
          }
        }
      }
    }
  }
}

TEST(QuantizeTest, I4BytesByHand) {
  // Row bytes: 64 per started group of 128 elements, whatever the block.
  for (const size_t block : {kI4Block, kI4LargeBlock}) {
    EXPECT_EQ(QuantRowBytes(DType::kI4, block, 1), 64u);
    EXPECT_EQ(QuantRowBytes(DType::kI4, block, 128), 64u);
    EXPECT_EQ(QuantRowBytes(DType::kI4, block, 129), 128u);
    EXPECT_EQ(QuantRowBytes(DType::kI4, block, 200), 128u);
    EXPECT_EQ(QuantScalesPerRow(DType::kI4, block, 200), block == 32 ? 7u : 2u);
  }
  EXPECT_EQ(QuantRowBytes(DType::kI8, 0, 200), 200u);
  // 130 elements whose codes are their values at scale 1 (every block has a 7): element p < 128
  // has code p % 15 - 7 (nibble p % 15 + 1), element 128 code 7, element 129 code -3.
  std::vector<float> w(130);
  for (size_t p = 0; p < 128; ++p) w[p] = static_cast<float>(static_cast<int>(p % 15) - 7);
  w[128] = 7.0f;
  w[129] = -3.0f;
  for (const size_t block : {kI4Block, kI4LargeBlock}) {
    std::vector<uint8_t> codes(128, 0);
    std::vector<float> scales(QuantScalesPerRow(DType::kI4, block, 130), -1.0f);
    QuantizeRow(w.data(), w.size(), DType::kI4, block, codes.data(), scales.data());
    for (const float s : scales) EXPECT_EQ(s, 1.0f);
    // Byte 4k + j holds element 32j + k (low nibble) and 32j + 16 + k (high nibble) of its group.
    EXPECT_EQ(codes[0], 0x21) << "elements 0 (nibble 1), 16 (2)";
    EXPECT_EQ(codes[1], 0x43) << "elements 32 (3), 48 (4)";
    EXPECT_EQ(codes[2], 0x65) << "elements 64 (5), 80 (6)";
    EXPECT_EQ(codes[3], 0x87) << "elements 96 (7), 112 (8)";
    EXPECT_EQ(codes[4], 0x32) << "elements 1 (2), 17 (3)";
    EXPECT_EQ(codes[61], 0x43) << "elements 47 (3), 63 (4)";
    EXPECT_EQ(codes[63], 0x87) << "elements 111 (7), 127 (8)";
    EXPECT_EQ(codes[64], 0x8F) << "elements 128 (F), 144 (padding 8)";
    EXPECT_EQ(codes[65], 0x88) << "elements 160, 176: padding";
    EXPECT_EQ(codes[68], 0x85) << "elements 129 (5), 145 (padding 8)";
    for (size_t i = 65; i < 128; ++i) {
      if (i != 68) {
        EXPECT_EQ(codes[i], 0x88) << "padding byte " << i;
      }
    }
  }
}

TEST(QuantizeTest, ExtremesStayInRange) {
  // The largest magnitude maps to +-qmax exactly; huge and tiny normal values keep the bound.
  for (const Format& f : kFormats) {
    const int qmax = f.type == DType::kI8 ? 127 : 7;
    for (const float big : {1.0f, 3.0e38f, 1.0e-30f, -2.5f}) {
      std::vector<float> w = {big, -big, big * 0.5f, 0.0f, big / 3.0f};
      const QuantStorage q = Quantize(w, 1, w.size(), f);
      EXPECT_EQ(QuantCode(q.m, 0, 0), big > 0 ? qmax : -qmax) << f.Name() << " " << big;
      EXPECT_EQ(QuantCode(q.m, 0, 1), big > 0 ? -qmax : qmax) << f.Name() << " " << big;
      EXPECT_EQ(QuantCode(q.m, 0, 3), 0);
    }
  }
}

class QuantTargetTest : public test::PerTargetTest {};

TEST_P(QuantTargetTest, DequantizeRowsGivesCodeTimesScale) {
  std::mt19937 rng(12);
  for (const Format& f : kFormats) {
    for (const size_t cols : {1, 7, 15, 16, 33, 64, 127, 129, 200, 300, 513}) {
      const std::vector<float> w = TestWeights(6, cols, &rng);
      const QuantStorage q = Quantize(w, 6, cols, f, 3, 1);
      const std::vector<float> ref = Dequantized(q.m);
      const size_t p0s[] = {0, 1, 5, 16, 31, 100, 128, 130, 161, 256};
      for (const size_t p0 : p0s) {
        if (p0 >= cols) continue;
        for (const size_t n : {cols - p0, (cols - p0 + 1) / 2}) {
          const size_t ld = n + 3;
          std::vector<float> out(5 * ld + 1, -7.0f);
          DequantizeRows(q.m, 1, 5, p0, n, out.data() + 1, ld);
          for (size_t i = 0; i < 5; ++i) {
            for (size_t p = 0; p < ld; ++p) {
              const float got = out[1 + i * ld + p];
              if (p < n) {
                ASSERT_EQ(test::Bits(got), test::Bits(ref[(1 + i) * cols + p0 + p]))
                    << f.Name() << " cols " << cols << " p0 " << p0 << " n " << n;
              } else {
                ASSERT_EQ(got, -7.0f) << "wrote past the row's n elements";
              }
            }
          }
          EXPECT_EQ(out[0], -7.0f);
        }
      }
    }
  }
}

// k: every length below 34 (vector tails), around the blocks and the 300 end; n: partial and
// full groups of 4 weight rows.
const size_t kKs[] = {1,  2,  3,  4,   5,   6,   7,   8,   9,   10,  11,  12, 13,
                      14, 15, 16, 17,  18,  19,  20,  23,  24,  31,  32,  33, 63,
                      64, 65, 96, 127, 128, 129, 191, 255, 256, 257, 299, 300};
const size_t kNs[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 70};

// c's storage: row-major with padding, column-major, or general; the view starts `offset`
// floats in.
MatrixView MakeC(std::vector<float>* buf, size_t m, size_t n, int layout, size_t offset) {
  const ptrdiff_t rs = layout == 0 ? static_cast<ptrdiff_t>(n + 2) : layout == 1 ? 1 : 2;
  const ptrdiff_t cs = layout == 0   ? 1
                       : layout == 1 ? static_cast<ptrdiff_t>(m + 1)
                                     : static_cast<ptrdiff_t>(2 * m + 3);
  buf->assign(offset + static_cast<size_t>(rs) * (m - 1) + static_cast<size_t>(cs) * (n - 1) + 4,
              std::nanf(""));
  return {buf->data() + offset, m, n, rs, cs};
}

float At(const ConstMatrixView& v, size_t i, size_t j) {
  return v
      .data[static_cast<ptrdiff_t>(i) * v.row_stride + static_cast<ptrdiff_t>(j) * v.col_stride];
}

// One case of the GemvQuant sweep: a quantized [n, k] matrix, its dequantized reading and a's
// [m, k] rows (stride k + 3), with c's layout and offset.
struct GemvQuantCase {
  const Format* f;
  size_t m, k, n, offset;
  int layout;
  QuantStorage q;
  std::vector<float> deq, a_buf;
  ConstMatrixView a() const {
    return {a_buf.data() + offset, m, k, static_cast<ptrdiff_t>(k + 3), 1};
  }
  std::string Name() const {
    return f->Name() + " m " + std::to_string(m) + " k " + std::to_string(k) + " n " +
           std::to_string(n);
  }
};

// Runs visit on every case of the sweep, in order, with the same inputs at every call: every
// format, m 1..9 and 16, every k of kKs and n of kNs; misaligned rows of a, codes and scales
// (offset), padded weight rows, every storage of c. Stops at a fatal failure.
template <class Visit>
void ForEachGemvQuantCase(const Visit& visit) {
  std::mt19937 rng(13);
  for (const Format& f : kFormats) {
    for (const size_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
      for (const size_t k : kKs) {
        for (const size_t n : kNs) {
          GemvQuantCase t;
          t.f = &f;
          t.m = m;
          t.k = k;
          t.n = n;
          t.offset = (m + k + n) % 4;
          t.layout = static_cast<int>((m + k + n) % 3);
          const std::vector<float> w = TestWeights(n, k, &rng);
          t.q = Quantize(w, n, k, f, t.offset, (m + k + n) % 2 == 0 ? 0 : 5);
          t.deq = Dequantized(t.q.m);
          t.a_buf = test::SymmetricFloats(t.offset + m * (k + 3), 1.0f, &rng);
          visit(t);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// A case's double reference c = a deq^T, [m, n], with Gemv's bound on each element.
struct GemvQuantReference {
  uint64_t inputs;
  std::vector<double> dot, tol;
};

// The references of the whole sweep, computed once per process (every target's instance checks
// against them; a fingerprint ties each to its inputs) and apart from the kernels' calls: under
// qemu with 256-bit SVE the same loops ran over ten times as long interleaved with them, case by
// case.
const std::vector<GemvQuantReference>& GemvQuantReferences() {
  static const std::vector<GemvQuantReference> references = [] {
    std::vector<GemvQuantReference> refs;
    ForEachGemvQuantCase([&](const GemvQuantCase& t) {
      GemvQuantReference r{test::Fingerprint({&t.deq, &t.a_buf}), std::vector<double>(t.m * t.n),
                           std::vector<double>(t.m * t.n)};
      const ConstMatrixView a = t.a();
      for (size_t i = 0; i < t.m; ++i) {
        for (size_t j = 0; j < t.n; ++j) {
          double dot = 0.0, abs_sum = 0.0;
          for (size_t p = 0; p < t.k; ++p) {
            const double prod = static_cast<double>(At(a, i, p)) * t.deq[j * t.k + p];
            dot += prod;
            abs_sum += std::fabs(prod);
          }
          r.dot[i * t.n + j] = dot;
          r.tol[i * t.n + j] = (2.0 * static_cast<double>(t.k) + 8.0) * kU * abs_sum + 1e-30;
        }
      }
      refs.push_back(std::move(r));
    });
    return refs;
  }();
  return references;
}

TEST_P(QuantTargetTest, GemvQuantIsGemvOnTheDequantizedWeights) {
  const std::vector<GemvQuantReference>& references = GemvQuantReferences();
  size_t index = 0;
  ForEachGemvQuantCase([&](const GemvQuantCase& t) {
    ASSERT_LT(index, references.size());
    const GemvQuantReference& ref = references[index++];
    const std::string what = t.Name();
    ASSERT_EQ(ref.inputs, test::Fingerprint({&t.deq, &t.a_buf}))
        << what << ": not the reference's inputs";
    const ConstMatrixView a = t.a();
    std::vector<float> c_buf, r_buf;
    const MatrixView c = MakeC(&c_buf, t.m, t.n, t.layout, t.offset);
    const MatrixView r = MakeC(&r_buf, t.m, t.n, t.layout, t.offset);
    GemvQuant(a, t.q.m, c);
    Gemv(1.0f, a, ConstMatrixView{t.deq.data(), t.k, t.n, 1, static_cast<ptrdiff_t>(t.k)}, 0.0f, r);
    for (size_t e = 0; e < c_buf.size() && GemvQuantOrdersAsGemv(); ++e) {
      ASSERT_EQ(test::Bits(c_buf[e]), test::Bits(r_buf[e])) << what << " element " << e;
    }
    for (size_t i = 0; i < t.m; ++i) {
      for (size_t j = 0; j < t.n; ++j) {
        ASSERT_LE(std::fabs(At(c, i, j) - ref.dot[i * t.n + j]), ref.tol[i * t.n + j])
            << what << " (" << i << ", " << j << ")";
      }
    }
  });
  if (!HasFatalFailure()) {
    EXPECT_EQ(index, references.size()) << "cases checked";
  }
}

// GemmQuantB against Gemm on the dequantized weights, every combination of ms x ks x ns, both
// layouts of c: bitwise wherever the route's sums are ordered as Gemm's.
void ExpectGemmQuantBIsGemm(std::initializer_list<size_t> ms, std::initializer_list<size_t> ks,
                            std::initializer_list<size_t> ns, std::mt19937* rng) {
  std::vector<float> scratch_buf(GemmScratchBytes() / sizeof(float) + 16);
  float* scratch = scratch_buf.data();
  while (reinterpret_cast<uintptr_t>(scratch) % kGemmScratchAlignment != 0) ++scratch;
  for (const Format& f : kFormats) {
    for (const size_t m : ms) {
      for (const size_t k : ks) {
        for (const size_t n : ns) {
          const std::vector<float> w = TestWeights(n, k, rng);
          const QuantStorage q = Quantize(w, n, k, f, 1);
          const std::vector<float> deq = Dequantized(q.m);
          const std::vector<float> a_buf = test::SymmetricFloats(m * k + 1, 1.0f, rng);
          const ConstMatrixView a{a_buf.data() + 1, m, k, static_cast<ptrdiff_t>(k), 1};
          for (const int layout : {0, 1}) {
            std::vector<float> c_buf, r_buf;
            const MatrixView c = MakeC(&c_buf, m, n, layout, 1);
            const MatrixView r = MakeC(&r_buf, m, n, layout, 1);
            GemmQuantB(a, q.m, c, scratch);
            Gemm(1.0f, a, ConstMatrixView{deq.data(), k, n, 1, static_cast<ptrdiff_t>(k)}, 0.0f, r,
                 scratch);
            // The GEMV route's bits are Gemv's where GemvQuant orders its sums as Gemv does.
            const bool bitwise = m > kGemvMaxRows || GemvQuantOrdersAsGemv();
            for (size_t e = 0; e < c_buf.size() && bitwise; ++e) {
              ASSERT_EQ(test::Bits(c_buf[e]), test::Bits(r_buf[e]))
                  << f.Name() << " m " << m << " k " << k << " n " << n << " layout " << layout
                  << " element " << e;
            }
          }
        }
      }
    }
  }
}

// Per target: both routes (GEMV up to kGemvMaxRows rows, dequantized panels beyond), vector
// tails and partial kI4 groups. The target's code in the panel route is DequantizeRows alone.
TEST_P(QuantTargetTest, GemmQuantBIsGemmOnTheDequantizedWeights) {
  std::mt19937 rng(14);
  ExpectGemmQuantBIsGemm({1, 5, 17, 40}, {7, 33, 128, 300}, {3, 16, 70}, &rng);
}

MHA_INSTANTIATE_PER_TARGET(QuantTargetTest);

// On the dispatched target: the driver's blocks (rows of a beyond one block, k beyond one
// panel depth, weight rows beyond a panel), which are the same code on every target.
TEST(QuantTest, GemmQuantBCrossesTheDriversBlocks) {
  std::mt19937 rng(15);
  ExpectGemmQuantBIsGemm({16, 200}, {1100}, {130}, &rng);
}

}  // namespace
}  // namespace kernels
}  // namespace mha
