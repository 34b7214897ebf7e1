// Tests of kernels/decode_int8.h: every kernel this CPU can run (the portable one, whose
// arithmetic is Highway's, on every target; the AVX512_VNNI one where the CPU has it) against a
// scalar transcription of the header's definition written here, bit for bit, on odd sizes (hd and n
// not multiples of the tiles), padded strides and misaligned pointers; the error of both products
// against the exact f32 arithmetic within the header's bounds; and the edge cases of the weights'
// quantization.
#include "kernels/decode_int8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/decode.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

using kernels::DecodeDotKernel;

std::vector<DecodeDotKernel> Kernels() {
  std::vector<DecodeDotKernel> out = {DecodeDotKernel::kPortable};
  if (kernels::DecodeDotKernelAvailable(DecodeDotKernel::kAvx512Vnni)) {
    out.push_back(DecodeDotKernel::kAvx512Vnni);
  }
  return out;
}

// The same bits, or both NaN (the payload of a NaN made by different operations may differ).
bool SameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0 || (std::isnan(a) && std::isnan(b));
}

// int8 rows: n rows of `stride` bytes at `misalign` bytes into the buffer, codes in [-127, 127]
// and a random scale per row.
struct Rows {
  std::vector<int8_t> storage;
  const int8_t* data = nullptr;
  std::vector<float> scales;
};

Rows MakeRows(size_t n, size_t stride, size_t misalign, std::mt19937* rng) {
  Rows out;
  out.storage.assign(n * stride + misalign + 64, 0);
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (size_t i = 0; i < n * stride; ++i) {
    out.storage[misalign + i] = static_cast<int8_t>(code(*rng));
  }
  out.data = out.storage.data() + misalign;
  out.scales.resize(n + 1);
  for (float& s : out.scales) s = scale(*rng);
  return out;
}

// The definition of QueryKeyScoresDot, transcribed.
float ReferenceScore(const float* q, const int8_t* k, float k_scale, size_t hd) {
  std::vector<int8_t> qc(hd);
  float qs;
  kernels::QuantizeRowI8(q, hd, qc.data(), &qs);
  int64_t dot = 0;
  for (size_t d = 0; d < hd; ++d) dot += int64_t{qc[d]} * k[d];
  return (static_cast<float>(dot) * k_scale) * qs;
}

// The definition of the weights' block quantization, transcribed.
void ReferenceBlock(const float* p, const float* vs, size_t count, std::vector<int>* codes,
                    float* scale) {
  codes->assign(count, 0);
  std::vector<float> w(count);
  float m = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    w[i] = p[i] * vs[i];
    if (!std::isfinite(w[i])) {
      *scale = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    m = std::max(m, w[i]);
  }
  if (m < std::ldexp(1.0f, -100)) {
    *scale = 0.0f;
    return;
  }
  *scale = m / 255.0f;
  const float inv = 255.0f / m;
  for (size_t i = 0; i < count; ++i) {
    const float c = std::min(std::max(w[i] * inv, 0.0f), 255.0f);
    (*codes)[i] = static_cast<int>(std::nearbyint(c));
  }
}

// The definition of AccumulateWeightedValuesDot for one row, transcribed.
void ReferenceValues(const float* p, const int8_t* v, ptrdiff_t v_stride, const float* vs, size_t n,
                     size_t hd, float* acc) {
  for (size_t b = 0; b < n; b += kernels::kDotValueBlock) {
    const size_t count = std::min(kernels::kDotValueBlock, n - b);
    std::vector<int> codes;
    float scale;
    ReferenceBlock(p + b, vs + b, count, &codes, &scale);
    for (size_t d = 0; d < hd; ++d) {
      int64_t sum = 0;
      for (size_t j = 0; j < count; ++j) sum += int64_t{codes[j]} * v[(b + j) * v_stride + d];
      acc[d] = acc[d] + static_cast<float>(sum) * scale;
    }
  }
}

class DecodeInt8TargetTest : public test::PerTargetTest {};

constexpr size_t kHeadDims[] = {1, 3, 4, 17, 63, 64, 67, 128, 130, 256};
constexpr size_t kCounts[] = {1, 5, 15, 16, 17, 31, 32, 33, 100};

TEST_P(DecodeInt8TargetTest, ScoresMatchTheDefinitionBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DecodeDotKernel kernel : Kernels()) {
    for (size_t hd : kHeadDims) {
      for (size_t n : kCounts) {
        for (size_t rows : {1u, 3u, 4u, 6u}) {
          const size_t stride = hd + 5, misalign = (hd + n) % 7;
          const Rows keys = MakeRows(n, stride, misalign, &rng);
          const ptrdiff_t q_stride = static_cast<ptrdiff_t>(hd + 3);
          std::vector<float> qbuf(rows * (hd + 3) + 1);
          for (float& x : qbuf) x = normal(rng);
          const float* q = qbuf.data() + 1;  // misaligned
          const ptrdiff_t score_stride = static_cast<ptrdiff_t>(n + 2);
          std::vector<float> scores(rows * (n + 2) + 1, -7.0f);
          kernels::QueryKeyScoresDot(kernel, q, rows, q_stride, keys.data,
                                     static_cast<ptrdiff_t>(stride), keys.scales.data(), n, hd,
                                     scores.data() + 1, score_stride);
          for (size_t r = 0; r < rows; ++r) {
            for (size_t j = 0; j < n + 2; ++j) {
              const float got = scores[1 + r * (n + 2) + j];
              if (j >= n) {
                ASSERT_EQ(got, -7.0f) << "wrote past n";
                continue;
              }
              const float want =
                  ReferenceScore(q + r * (hd + 3), keys.data + j * stride, keys.scales[j], hd);
              ASSERT_TRUE(SameBits(got, want))
                  << kernels::DecodeDotKernelName(kernel) << " hd " << hd << " n " << n << " rows "
                  << rows << " r " << r << " j " << j << ": " << got << " vs " << want;
            }
          }
        }
      }
    }
  }
}

TEST_P(DecodeInt8TargetTest, ValuesMatchTheDefinitionBitForBit) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> prob(0.0f, 1.0f);
  for (DecodeDotKernel kernel : Kernels()) {
    for (size_t hd : kHeadDims) {
      for (size_t n : kCounts) {
        for (size_t rows : {1u, 2u, 3u, 4u, 5u}) {
          const size_t stride = hd + 3, misalign = (hd * 3 + n) % 5;
          const Rows values = MakeRows(n, stride, misalign, &rng);
          const ptrdiff_t p_stride = static_cast<ptrdiff_t>(n + 1);
          std::vector<float> p(rows * (n + 1) + 1);
          for (float& x : p) x = prob(rng) * prob(rng);  // many small weights, some large
          // Masked positions (p = 0) at the start of row 0.
          for (size_t j = 0; j < std::min<size_t>(n, 3); ++j) p[1 + j] = 0.0f;
          const ptrdiff_t acc_stride = static_cast<ptrdiff_t>(hd + 2);
          std::vector<float> acc(rows * (hd + 2) + 1);
          for (float& x : acc) x = prob(rng);
          std::vector<float> want = acc;
          kernels::AccumulateWeightedValuesDot(kernel, p.data() + 1, rows, p_stride, values.data,
                                               static_cast<ptrdiff_t>(stride), values.scales.data(),
                                               n, hd, acc.data() + 1, acc_stride);
          for (size_t r = 0; r < rows; ++r) {
            ReferenceValues(p.data() + 1 + r * (n + 1), values.data, static_cast<ptrdiff_t>(stride),
                            values.scales.data(), n, hd, want.data() + 1 + r * (hd + 2));
          }
          for (size_t i = 0; i < acc.size(); ++i) {
            ASSERT_TRUE(SameBits(acc[i], want[i]))
                << kernels::DecodeDotKernelName(kernel) << " hd " << hd << " n " << n << " rows "
                << rows << " element " << i << ": " << acc[i] << " vs " << want[i];
          }
        }
      }
    }
  }
}

TEST_P(DecodeInt8TargetTest, ErrorWithinTheHeaderBounds) {
  // Scores: |error| <= qs / 2 * sum_d |k_d| + 2 ulp; values: <= sum_j m_b / 510 * |vc_jd| + f32
  // roundings, against the exact products of the f32 inputs with the cached rows.
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t hd = 64, n = 300;
  const Rows rows = MakeRows(n, hd, 0, &rng);
  std::vector<float> q(hd), p(n), acc(hd, 0.0f), score(n);
  for (float& x : q) x = normal(rng);
  float total = 0.0f;
  for (float& x : p) total += (x = std::exp(2.0f * normal(rng)));
  for (float& x : p) x /= total;
  for (DecodeDotKernel kernel : Kernels()) {
    kernels::QueryKeyScoresDot(kernel, q.data(), 1, 0, rows.data, hd, rows.scales.data(), n, hd,
                               score.data(), 0);
    float amax = 0.0f;
    for (float x : q) amax = std::max(amax, std::fabs(x));
    const double qs = amax / 127.0;
    for (size_t j = 0; j < n; ++j) {
      double exact = 0.0, kabs = 0.0;
      for (size_t d = 0; d < hd; ++d) {
        const double k = static_cast<double>(rows.data[j * hd + d]) * rows.scales[j];
        exact += static_cast<double>(q[d]) * k;
        kabs += std::fabs(k);
      }
      EXPECT_LE(std::fabs(score[j] - exact), qs / 2 * kabs * 1.001 + 1e-6) << j;
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    kernels::AccumulateWeightedValuesDot(kernel, p.data(), 1, 0, rows.data, hd, rows.scales.data(),
                                         n, hd, acc.data(), 0);
    for (size_t d = 0; d < hd; ++d) {
      double exact = 0.0, bound = 0.0;
      for (size_t b = 0; b < n; b += kernels::kDotValueBlock) {
        const size_t count = std::min(kernels::kDotValueBlock, n - b);
        double m = 0.0;
        for (size_t j = b; j < b + count; ++j) m = std::max(m, double{p[j]} * rows.scales[j]);
        for (size_t j = b; j < b + count; ++j) {
          const double v = rows.data[j * hd + d];
          exact += double{p[j]} * rows.scales[j] * v;
          bound += m / 510.0 * std::fabs(v) * 1.001;
        }
      }
      EXPECT_LE(std::fabs(acc[d] - exact), bound + 1e-5) << d;
    }
  }
}

TEST_P(DecodeInt8TargetTest, WeightBlocksEdgeCases) {
  for (DecodeDotKernel kernel : Kernels()) {
    const size_t hd = 64, n = 40;
    std::mt19937 rng(14);
    const Rows values = MakeRows(n, hd, 0, &rng);
    std::vector<float> p(n, 0.0f), acc(hd, 1.0f);
    // All-zero weights: no change (scale 0).
    kernels::AccumulateWeightedValuesDot(kernel, p.data(), 1, 0, values.data, hd,
                                         values.scales.data(), n, hd, acc.data(), 0);
    for (float a : acc) ASSERT_EQ(a, 1.0f);
    // A NaN weight in the second block: the row's sums become NaN.
    p[35] = std::numeric_limits<float>::quiet_NaN();
    kernels::AccumulateWeightedValuesDot(kernel, p.data(), 1, 0, values.data, hd,
                                         values.scales.data(), n, hd, acc.data(), 0);
    for (float a : acc) ASSERT_TRUE(std::isnan(a)) << kernels::DecodeDotKernelName(kernel);
    // A NaN query element: NaN scores (QuantizeRowI8's NaN scale).
    std::vector<float> q(hd, 0.5f), score(n);
    q[7] = std::numeric_limits<float>::quiet_NaN();
    kernels::QueryKeyScoresDot(kernel, q.data(), 1, 0, values.data, hd, values.scales.data(), n, hd,
                               score.data(), 0);
    for (float s : score) ASSERT_TRUE(std::isnan(s));
    // An infinite query element: NaN scores too (scale inf, codes 0); a zero query: zeros.
    q.assign(hd, 0.25f);
    q[9] = std::numeric_limits<float>::infinity();
    kernels::QueryKeyScoresDot(kernel, q.data(), 1, 0, values.data, hd, values.scales.data(), n, hd,
                               score.data(), 0);
    for (float s : score) ASSERT_TRUE(std::isnan(s));
    q.assign(hd, 0.0f);
    kernels::QueryKeyScoresDot(kernel, q.data(), 1, 0, values.data, hd, values.scales.data(), n, hd,
                               score.data(), 0);
    for (float s : score) ASSERT_EQ(s, 0.0f);
    // A single weight of 1 in a block: code 255, the exact value row times its scale.
    std::fill(p.begin(), p.end(), 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
    p[3] = 1.0f;
    kernels::AccumulateWeightedValuesDot(kernel, p.data(), 1, 0, values.data, hd,
                                         values.scales.data(), n, hd, acc.data(), 0);
    for (size_t d = 0; d < hd; ++d) {
      const float want =
          static_cast<float>(255 * values.data[3 * hd + d]) * (values.scales[3] / 255.0f);
      ASSERT_TRUE(SameBits(acc[d], 0.0f + want)) << d;
    }
  }
}

// Query rows of every kind in one call, bit for bit against the definition: a normal row, one
// with a NaN, one of zeros, one whose largest magnitude is ~1e-38 (127 / max overflows: its
// zeros must stay code 0), one with an infinity; and the largest head_dim with every code at
// +-127, whose dot products (1024 * 127 * 127) are the largest the kernels sum exactly.
TEST_P(DecodeInt8TargetTest, QueryRowsOfEveryKind) {
  std::mt19937 rng(15);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DecodeDotKernel kernel : Kernels()) {
    for (size_t hd : {size_t{70}, kernels::kDotMaxHeadDim}) {
      const size_t n = 37, rows = 5;
      Rows keys = MakeRows(n, hd, 3, &rng);
      if (hd == kernels::kDotMaxHeadDim) {
        for (size_t i = 0; i < n * hd; ++i) keys.storage[3 + i] = (i / hd) % 2 ? -127 : 127;
      }
      std::vector<float> q(rows * hd);
      for (float& x : q) x = normal(rng);
      q[hd + 5] = std::numeric_limits<float>::quiet_NaN();
      std::fill(q.begin() + 2 * hd, q.begin() + 3 * hd, 0.0f);
      for (size_t d = 0; d < hd; ++d) q[3 * hd + d] = d % 3 == 0 ? 0.0f : 1e-38f * normal(rng);
      q[4 * hd + 1] = -std::numeric_limits<float>::infinity();
      if (hd == kernels::kDotMaxHeadDim) std::fill(q.begin(), q.begin() + hd, 3.0f);
      std::vector<float> scores(rows * n);
      kernels::QueryKeyScoresDot(kernel, q.data(), rows, static_cast<ptrdiff_t>(hd), keys.data,
                                 static_cast<ptrdiff_t>(hd), keys.scales.data(), n, hd,
                                 scores.data(), static_cast<ptrdiff_t>(n));
      for (size_t r = 0; r < rows; ++r) {
        for (size_t j = 0; j < n; ++j) {
          const float want =
              ReferenceScore(q.data() + r * hd, keys.data + j * hd, keys.scales[j], hd);
          ASSERT_TRUE(SameBits(scores[r * n + j], want))
              << kernels::DecodeDotKernelName(kernel) << " hd " << hd << " row " << r << " key "
              << j << ": " << scores[r * n + j] << " vs " << want;
        }
      }
      if (hd == kernels::kDotMaxHeadDim) {
        // Row 0: codes all 127 against +-127 rows: +-16516096 * scale exactly.
        EXPECT_EQ(scores[0], (16516096.0f * keys.scales[0]) * (3.0f / 127.0f));
      }
    }
  }
}

// The weights' quantization on inputs built to land on its edges, bit for bit against the
// definition, in a call of 3 rows (one pass of the VNNI kernel's 3-row form): exact ties
// (p / 255 of the block's largest: 2.5 -> 2, 3.5 -> 4, 0.5 -> 0), 0.49999997 (not a tie: 0),
// a negative p (counts as 0), a block whose largest weight is below 2^-100 (scale 0), and a
// block with an infinite weight (NaN sums) beside finite rows.
TEST_P(DecodeInt8TargetTest, WeightQuantizationEdges) {
  std::mt19937 rng(16);
  for (DecodeDotKernel kernel : Kernels()) {
    const size_t hd = 48, n = 70, rows = 3;
    Rows values = MakeRows(n, hd, 1, &rng);
    std::fill(values.scales.begin(), values.scales.end(), 1.0f);
    std::vector<float> p(rows * n, 0.0f);
    const float ties[] = {255.0f, 2.5f, 3.5f, 0.5f, 1.5f, 0.49999997f, -3.0f, 254.5f, 127.5f};
    for (size_t j = 0; j < n; ++j) p[j] = ties[j % 9];
    for (size_t j = 0; j < n; ++j) p[n + j] = j < 32 ? 1e-31f * static_cast<float>(j % 3) : 0.25f;
    for (size_t j = 0; j < n; ++j) p[2 * n + j] = j == 40 ? INFINITY : 0.5f;
    std::vector<float> acc(rows * hd, 0.5f), want = acc;
    kernels::AccumulateWeightedValuesDot(
        kernel, p.data(), rows, static_cast<ptrdiff_t>(n), values.data, static_cast<ptrdiff_t>(hd),
        values.scales.data(), n, hd, acc.data(), static_cast<ptrdiff_t>(hd));
    for (size_t r = 0; r < rows; ++r) {
      ReferenceValues(p.data() + r * n, values.data, static_cast<ptrdiff_t>(hd),
                      values.scales.data(), n, hd, want.data() + r * hd);
    }
    for (size_t i = 0; i < acc.size(); ++i) {
      ASSERT_TRUE(SameBits(acc[i], want[i])) << kernels::DecodeDotKernelName(kernel) << " element "
                                             << i << ": " << acc[i] << " vs " << want[i];
    }
    for (size_t d = 0; d < hd; ++d) ASSERT_TRUE(std::isnan(acc[2 * hd + d]));
  }
  // The reference itself on the ties: codes 255, 2, 4, 0, 2, 0, 0, 254, 128 (p * 255 / 255).
  std::vector<int> codes;
  float scale;
  const float ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  const float ties[] = {255.0f, 2.5f, 3.5f, 0.5f, 1.5f, 0.49999997f, -3.0f, 254.5f, 127.5f};
  ReferenceBlock(ties, ones, 9, &codes, &scale);
  EXPECT_EQ(codes, (std::vector<int>{255, 2, 4, 0, 2, 0, 0, 254, 128}));
  EXPECT_EQ(scale, 1.0f);
}

MHA_INSTANTIATE_PER_TARGET(DecodeInt8TargetTest);

TEST(DecodeInt8Test, KernelNamesAndChoice) {
  EXPECT_STREQ(kernels::DecodeDotKernelName(DecodeDotKernel::kPortable), "portable");
  EXPECT_STREQ(kernels::DecodeDotKernelName(DecodeDotKernel::kAvx512Vnni), "avx512_vnni");
  const DecodeDotKernel active = kernels::DecodeDotActiveKernel();
  EXPECT_NE(active, DecodeDotKernel::kAuto);
  EXPECT_TRUE(kernels::DecodeDotKernelAvailable(active));
  // kAuto runs the active kernel: the same bits as the portable one.
  std::mt19937 rng(17);
  const size_t hd = 64, n = 50;
  const Rows rows = MakeRows(n, hd, 0, &rng);
  std::vector<float> q(2 * hd), p(2 * n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  for (float& x : p) x = std::fabs(normal(rng));
  std::vector<float> s_auto(2 * n), s_port(2 * n), a_auto(2 * hd, 0.0f), a_port(2 * hd, 0.0f);
  kernels::QueryKeyScoresDot(DecodeDotKernel::kAuto, q.data(), 2, hd, rows.data, hd,
                             rows.scales.data(), n, hd, s_auto.data(), n);
  kernels::QueryKeyScoresDot(DecodeDotKernel::kPortable, q.data(), 2, hd, rows.data, hd,
                             rows.scales.data(), n, hd, s_port.data(), n);
  kernels::AccumulateWeightedValuesDot(DecodeDotKernel::kAuto, p.data(), 2, n, rows.data, hd,
                                       rows.scales.data(), n, hd, a_auto.data(), hd);
  kernels::AccumulateWeightedValuesDot(DecodeDotKernel::kPortable, p.data(), 2, n, rows.data, hd,
                                       rows.scales.data(), n, hd, a_port.data(), hd);
  EXPECT_EQ(std::memcmp(s_auto.data(), s_port.data(), s_auto.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a_auto.data(), a_port.data(), a_auto.size() * 4), 0);
}

}  // namespace
}  // namespace mha
