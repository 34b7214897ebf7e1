// Tests of kernels/decode.h on every Highway target this CPU supports, against a double
// reference over the exactly widened cache values, on odd sizes (hd and n not multiples of any
// vector length), padded strides and misaligned pointers; plus the documented independence of
// each output from how rows and keys are split into calls; and the int8 rows kernels::QuantizeRowI8
// writes, against their contract and as every target reads them.
#include "kernels/decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

constexpr float kSentinel = -12345.5f;
constexpr double kU = 1.0 / (1 << 24);  // 2^-24

constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI8};

const char* TypeName(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : t == DType::kF16 ? "f16" : "i8";
}

size_t ElementBytes(DType t) { return t == DType::kF32 ? 4 : t == DType::kI8 ? 1 : 2; }

// `n` cache rows of `stride` elements of `type` starting `misalign` elements into the buffer,
// filled from random floats (int8: random codes, and a random scale per row in `scales`);
// `widened` gets the exact value each stored element stands for (int8: code * scale, in double
// as the reference needs it).
struct CacheRows {
  std::vector<uint8_t> storage;
  const void* data = nullptr;
  std::vector<double> widened;
  std::vector<float> scales;  // int8 only: [n]
};

void MakeRows(DType type, size_t n, size_t stride, size_t misalign, std::mt19937* rng,
              CacheRows* out) {
  const size_t count = n * stride;
  const std::vector<float> x = test::SymmetricFloats(count, 2.0f, rng);
  const size_t elem = ElementBytes(type);
  out->storage.assign((count + misalign + 8) * elem, 0);
  uint8_t* p = out->storage.data() + misalign * elem;
  out->widened.resize(count);
  out->data = p;
  if (type == DType::kI8) {
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    out->scales.resize(n);
    for (float& sc : out->scales) sc = scale(*rng);
    for (size_t i = 0; i < count; ++i) {
      const int8_t c = static_cast<int8_t>(code(*rng));
      p[i] = static_cast<uint8_t>(c);
      out->widened[i] = static_cast<double>(c) * out->scales[i / stride];
    }
    return;
  }
  std::vector<float> w(count);
  if (type == DType::kF32) {
    std::memcpy(p, x.data(), count * 4);
    w = x;
  } else {
    std::vector<uint16_t> h(count);
    if (type == DType::kBF16) {
      kernels::F32ToBF16(x.data(), h.data(), count);
      kernels::BF16ToF32(h.data(), w.data(), count);
    } else {
      kernels::F32ToF16(x.data(), h.data(), count);
      kernels::F16ToF32(h.data(), w.data(), count);
    }
    std::memcpy(p, h.data(), count * 2);
  }
  out->widened.assign(w.begin(), w.end());
}

const void* Offset(const void* p, DType type, size_t elements) {
  return static_cast<const uint8_t*>(p) + elements * ElementBytes(type);
}

// The scales of rows from `row` on (null when the type has none).
const float* ScalesFrom(const CacheRows& c, size_t row) {
  return c.scales.empty() ? nullptr : c.scales.data() + row;
}

// int8 adds one rounding per score (the scale) and per weighted term (p_j * scale_j).
double ExtraRoundings(DType t) { return t == DType::kI8 ? 1.0 : 0.0; }

class DecodeTargetTest : public test::PerTargetTest {};

TEST_P(DecodeTargetTest, QueryKeyScoresMatchesDoubleReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (DType type : kTypes) {
    for (size_t hd : {1, 3, 8, 12, 17, 33, 64, 67}) {
      for (size_t n : {1, 3, 4, 5, 13, 67, 70}) {
        for (size_t rows : {1, 3, 5, 8}) {
          SCOPED_TRACE(::testing::Message()
                       << TypeName(type) << " hd " << hd << " n " << n << " rows " << rows);
          const size_t key_stride = hd + 3, q_stride = hd + 1, s_stride = n + 2;
          CacheRows keys;
          MakeRows(type, n, key_stride, 1, &rng, &keys);
          // q starts one float into its buffer: misaligned for every vector width.
          std::vector<float> q_buf(rows * q_stride + 1);
          for (float& v : q_buf) v = u(rng);
          const float* q = q_buf.data() + 1;
          std::vector<float> scores(rows * s_stride + 1, kSentinel);
          float* s = scores.data() + 1;
          kernels::QueryKeyScores(q, rows, q_stride, keys.data, type, key_stride,
                                  ScalesFrom(keys, 0), n, hd, s, s_stride);
          for (size_t r = 0; r < rows; ++r) {
            for (size_t j = 0; j < n; ++j) {
              double want = 0, mag = 0;
              for (size_t d = 0; d < hd; ++d) {
                const double t =
                    static_cast<double>(q[r * q_stride + d]) * keys.widened[j * key_stride + d];
                want += t;
                mag += std::fabs(t);
              }
              const double bound = (2.0 * (hd + 4) + ExtraRoundings(type)) * kU * mag + 1e-30;
              ASSERT_LE(std::fabs(s[r * s_stride + j] - want), bound) << "r " << r << " j " << j;
            }
            for (size_t j = n; j < s_stride; ++j) {
              ASSERT_EQ(s[r * s_stride + j], kSentinel) << "wrote past n at r " << r;
            }
          }
          ASSERT_EQ(scores[0], kSentinel);
          // Splitting keys and rows over several calls gives the same bits.
          if (n > 2 && rows > 1) {
            std::vector<float> split(rows * s_stride, kSentinel);
            const size_t a = n / 2 + 1;
            kernels::QueryKeyScores(q, 1, q_stride, keys.data, type, key_stride,
                                    ScalesFrom(keys, 0), a, hd, split.data(), s_stride);
            kernels::QueryKeyScores(q, 1, q_stride, Offset(keys.data, type, a * key_stride), type,
                                    key_stride, ScalesFrom(keys, a), n - a, hd, split.data() + a,
                                    s_stride);
            kernels::QueryKeyScores(q + q_stride, rows - 1, q_stride, keys.data, type, key_stride,
                                    ScalesFrom(keys, 0), n, hd, split.data() + s_stride, s_stride);
            for (size_t r = 0; r < rows; ++r) {
              for (size_t j = 0; j < n; ++j) {
                ASSERT_EQ(split[r * s_stride + j], s[r * s_stride + j]) << "r " << r << " j " << j;
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(DecodeTargetTest, AccumulateWeightedValuesMatchesDoubleReference) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_real_distribution<float> up(0.0f, 1.0f);
  for (DType type : kTypes) {
    for (size_t hd : {1, 3, 8, 12, 17, 33, 64, 67, 130}) {
      for (size_t n : {1, 2, 4, 5, 13, 67, 70, 256}) {
        for (size_t rows : {1, 3, 4, 8}) {
          SCOPED_TRACE(::testing::Message()
                       << TypeName(type) << " hd " << hd << " n " << n << " rows " << rows);
          const size_t v_stride = hd + 5, p_stride = n + 1, a_stride = hd + 2;
          CacheRows values;
          MakeRows(type, n, v_stride, 3, &rng, &values);
          std::vector<float> p_buf(rows * p_stride + 1);
          for (float& v : p_buf) v = up(rng);
          const float* p = p_buf.data() + 1;
          std::vector<float> acc_buf(rows * a_stride + 1, kSentinel);
          float* acc = acc_buf.data() + 1;
          for (size_t r = 0; r < rows; ++r) {
            for (size_t d = 0; d < hd; ++d) acc[r * a_stride + d] = u(rng);
          }
          const std::vector<float> acc0 = acc_buf;
          kernels::AccumulateWeightedValues(p, rows, p_stride, values.data, type, v_stride,
                                            ScalesFrom(values, 0), n, hd, acc, a_stride);
          for (size_t r = 0; r < rows; ++r) {
            for (size_t d = 0; d < hd; ++d) {
              double want = acc0[1 + r * a_stride + d];
              double mag = std::fabs(want);
              for (size_t j = 0; j < n; ++j) {
                const double t =
                    static_cast<double>(p[r * p_stride + j]) * values.widened[j * v_stride + d];
                want += t;
                mag += std::fabs(t);
              }
              const double bound = (2.0 * (n + 1) + ExtraRoundings(type)) * kU * mag + 1e-30;
              ASSERT_LE(std::fabs(acc[r * a_stride + d] - want), bound) << "r " << r << " d " << d;
            }
            for (size_t d = hd; d < a_stride && r + 1 < rows; ++d) {
              ASSERT_EQ(acc[r * a_stride + d], kSentinel) << "wrote past hd at r " << r;
            }
          }
          ASSERT_EQ(acc_buf[0], kSentinel);
          // One row alone gives the same bits as within the block.
          std::vector<float> single(acc0.begin() + 1 + (rows - 1) * a_stride,
                                    acc0.begin() + 1 + (rows - 1) * a_stride + hd);
          kernels::AccumulateWeightedValues(p + (rows - 1) * p_stride, 1, p_stride, values.data,
                                            type, v_stride, ScalesFrom(values, 0), n, hd,
                                            single.data(), hd);
          for (size_t d = 0; d < hd; ++d) {
            ASSERT_EQ(single[d], acc[(rows - 1) * a_stride + d]) << "d " << d;
          }
        }
      }
    }
  }
}

// bf16 values are read as 32-bit pairs (even and odd columns apart): every output element still
// takes the multiply-adds of the f32 path, so bf16 rows give exactly the bits of f32 rows holding
// their widened values, in column blocks and tails alike.
TEST_P(DecodeTargetTest, Bf16ValuesGiveTheBitsOfTheirF32Widening) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> up(0.0f, 1.0f);
  for (size_t hd : {8, 64, 67, 130}) {
    for (size_t n : {5, 70}) {
      for (size_t rows : {1, 4, 5}) {
        SCOPED_TRACE(::testing::Message() << "hd " << hd << " n " << n << " rows " << rows);
        const size_t v_stride = hd + 1;
        CacheRows values;
        MakeRows(DType::kBF16, n, v_stride, 1, &rng, &values);
        const std::vector<float> widened(values.widened.begin(), values.widened.end());
        std::vector<float> p(rows * n);
        for (float& v : p) v = up(rng);
        std::vector<float> a16(rows * hd, 0.5f), a32(rows * hd, 0.5f);
        kernels::AccumulateWeightedValues(p.data(), rows, n, values.data, DType::kBF16, v_stride,
                                          nullptr, n, hd, a16.data(), hd);
        kernels::AccumulateWeightedValues(p.data(), rows, n, widened.data(), DType::kF32, v_stride,
                                          nullptr, n, hd, a32.data(), hd);
        ASSERT_EQ(std::memcmp(a16.data(), a32.data(), a16.size() * sizeof(float)), 0);
      }
    }
  }
}

// bf16 scores of head_dims that are whole blocks of 2 x lanes read the keys as pairs, with the
// query rows split into even and odd elements in blocks of rows that fit 16 KiB: 70 rows of 64
// or 128 take two or three blocks, and each row's scores are the bits it gets alone.
TEST_P(DecodeTargetTest, PairedBf16ScoresAcrossRowBlocks) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (size_t hd : {64, 128}) {
    SCOPED_TRACE(::testing::Message() << "hd " << hd);
    const size_t rows = 70, n = 9, key_stride = hd + 3;
    CacheRows keys;
    MakeRows(DType::kBF16, n, key_stride, 1, &rng, &keys);
    std::vector<float> q(rows * hd);
    for (float& v : q) v = u(rng);
    std::vector<float> s(rows * n), one(n);
    kernels::QueryKeyScores(q.data(), rows, hd, keys.data, DType::kBF16, key_stride, nullptr, n, hd,
                            s.data(), n);
    for (size_t r = 0; r < rows; ++r) {
      kernels::QueryKeyScores(q.data() + r * hd, 1, hd, keys.data, DType::kBF16, key_stride,
                              nullptr, n, hd, one.data(), n);
      for (size_t j = 0; j < n; ++j) {
        double want = 0, mag = 0;
        for (size_t d = 0; d < hd; ++d) {
          const double t = static_cast<double>(q[r * hd + d]) * keys.widened[j * key_stride + d];
          want += t;
          mag += std::fabs(t);
        }
        ASSERT_LE(std::fabs(s[r * n + j] - want), 2.0 * (hd + 4) * kU * mag) << r << ", " << j;
        ASSERT_EQ(one[j], s[r * n + j]) << "row " << r << " alone, key " << j;
      }
    }
  }
}

// The int8 rows kernels::QuantizeRowI8 writes read back on every target as code * scale: a
// one-hot query picks each element's score, code_d * scale rounded once (the codes' dot product
// is exact), and a one-hot probability picks each weighted value, likewise.
TEST_P(DecodeTargetTest, QuantizedRowsReadAsCodeTimesScale) {
  std::mt19937 rng(11);
  for (size_t hd : {1, 5, 16, 67}) {
    const std::vector<float> x = test::SymmetricFloats(hd, 3.0f, &rng);
    std::vector<int8_t> codes(hd);
    float scale = 0.0f;
    kernels::QuantizeRowI8(x.data(), hd, codes.data(), &scale);
    std::vector<float> onehot(hd, 0.0f);
    for (size_t d = 0; d < hd; ++d) {
      SCOPED_TRACE(::testing::Message() << "hd " << hd << " d " << d);
      const float want = static_cast<float>(codes[d]) * scale;
      onehot[d] = 1.0f;
      float score = kSentinel;
      kernels::QueryKeyScores(onehot.data(), 1, hd, codes.data(), DType::kI8, hd, &scale, 1, hd,
                              &score, 1);
      onehot[d] = 0.0f;
      ASSERT_EQ(score, want);
      std::vector<float> acc(hd, 0.0f);
      const float one = 1.0f;
      kernels::AccumulateWeightedValues(&one, 1, 1, codes.data(), DType::kI8, hd, &scale, 1, hd,
                                        acc.data(), hd);
      ASSERT_EQ(acc[d], want);
    }
  }
}

// The software prefetch (kernels::SetDecodePrefetch) is a hint: on or off, both kernels give the
// same bits, for every type, row count and a key/value count with and without a tail of n % 4.
TEST_P(DecodeTargetTest, PrefetchOnOrOffGivesTheSameBits) {
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (DType type : kTypes) {
    for (size_t n : {67, 256}) {
      for (size_t rows : {1, 4}) {
        SCOPED_TRACE(::testing::Message() << TypeName(type) << " n " << n << " rows " << rows);
        const size_t hd = 64, stride = hd + 3;
        CacheRows rows_kv;
        MakeRows(type, n, stride, 1, &rng, &rows_kv);
        std::vector<float> q(rows * hd), p(rows * n);
        for (float& v : q) v = u(rng);
        for (float& v : p) v = 0.5f * (u(rng) + 1.0f);
        std::vector<float> s[2], acc[2];
        for (int on = 0; on < 2; ++on) {
          kernels::SetDecodePrefetch(on ? kernels::DecodePrefetch::kOn
                                        : kernels::DecodePrefetch::kOff);
          ASSERT_EQ(kernels::DecodePrefetchActive(), on == 1);
          s[on].assign(rows * n, 0.0f);
          acc[on].assign(rows * hd, 0.25f);
          kernels::QueryKeyScores(q.data(), rows, hd, rows_kv.data, type, stride,
                                  ScalesFrom(rows_kv, 0), n, hd, s[on].data(), n);
          kernels::AccumulateWeightedValues(p.data(), rows, n, rows_kv.data, type, stride,
                                            ScalesFrom(rows_kv, 0), n, hd, acc[on].data(), hd);
        }
        kernels::SetDecodePrefetch(kernels::DecodePrefetch::kAuto);
        ASSERT_EQ(kernels::DecodePrefetchActive(), kernels::DecodePrefetchOnThisCpu());
        ASSERT_EQ(std::memcmp(s[0].data(), s[1].data(), s[0].size() * sizeof(float)), 0);
        ASSERT_EQ(std::memcmp(acc[0].data(), acc[1].data(), acc[0].size() * sizeof(float)), 0);
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(DecodeTargetTest);

// kernels::QuantizeRowI8 (scalar: the same bytes on every target) against its contract computed
// here step by step: scale = max|x| / 127 in f32; each code the nearest integer to
// fl(x * fl(127 / max|x|)), ties to even, within [-127, 127]; code * scale within scale / 2 of x
// (plus the two quotients' roundings); zero rows give zeros, NaN a NaN scale and code 0.
TEST(DecodeTest, QuantizeRowI8FollowsItsContract) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> magnitude(-20.0f, 20.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t hd = 1 + static_cast<size_t>(trial % 70);
    std::vector<float> x = test::SymmetricFloats(hd, std::exp2(magnitude(rng)), &rng);
    std::vector<int8_t> codes(hd);
    float scale = -1.0f;
    kernels::QuantizeRowI8(x.data(), hd, codes.data(), &scale);
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    ASSERT_EQ(scale, amax / 127.0f) << "trial " << trial;
    const float inv = 127.0f / amax;
    bool reaches_127 = false;
    for (size_t d = 0; d < hd; ++d) {
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " d " << d);
      const float c = x[d] * inv;
      const int code = codes[d];
      ASSERT_LE(std::abs(code), 127);
      const float off = std::fabs(c - static_cast<float>(code));
      ASSERT_LE(off, 0.5f);
      if (off == 0.5f) {
        ASSERT_EQ(code % 2, 0) << "a tie rounds to even";
      }
      ASSERT_LE(std::fabs(code * static_cast<double>(scale) - x[d]),
                static_cast<double>(scale) * (0.5 + 1e-4));
      reaches_127 = reaches_127 || std::abs(code) == 127;
    }
    ASSERT_TRUE(reaches_127) << "the largest magnitude maps to +-127";
  }
  // Ties: with max |x| = 127 the codes are x rounded half to even.
  const float ties[5] = {127.0f, 0.5f, 1.5f, 2.5f, -2.5f};
  int8_t codes[5];
  float scale = 0.0f;
  kernels::QuantizeRowI8(ties, 5, codes, &scale);
  EXPECT_EQ(scale, 1.0f);
  const int8_t want[5] = {127, 0, 2, 2, -2};
  for (int d = 0; d < 5; ++d) EXPECT_EQ(codes[d], want[d]) << "d " << d;
  // A zero row, and a row with a NaN.
  const float zeros[3] = {0.0f, -0.0f, 0.0f};
  kernels::QuantizeRowI8(zeros, 3, codes, &scale);
  EXPECT_EQ(scale, 0.0f);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(codes[d], 0);
  // The NaN stays the row's maximum whatever follows it.
  const float nan_row[3] = {1.0f, std::nanf(""), -2.0f};
  kernels::QuantizeRowI8(nan_row, 3, codes, &scale);
  EXPECT_TRUE(std::isnan(scale));
  EXPECT_EQ(codes[1], 0);
}

TEST(DecodeTest, EmptyCallsWriteNothing) {
  float s = kSentinel;
  const float q[1] = {1.0f};
  kernels::QueryKeyScores(q, 0, 1, q, DType::kF32, 1, nullptr, 1, 1, &s, 1);
  kernels::QueryKeyScores(q, 1, 1, q, DType::kF32, 1, nullptr, 0, 1, &s, 1);
  EXPECT_EQ(s, kSentinel);
  kernels::AccumulateWeightedValues(q, 1, 1, q, DType::kBF16, 1, nullptr, 0, 1, &s, 1);
  kernels::AccumulateWeightedValues(q, 1, 1, q, DType::kI8, 1, nullptr, 0, 1, &s, 1);
  EXPECT_EQ(s, kSentinel);
}

}  // namespace
}  // namespace mha
