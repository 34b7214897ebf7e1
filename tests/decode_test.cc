// Tests of kernels/decode.h on every Highway target this CPU supports, against a double
// reference over the exactly widened cache values, on odd sizes (hd and n not multiples of any
// vector length), padded strides and misaligned pointers; plus the documented independence of
// each output from how rows and keys are split into calls.
#include "kernels/decode.h"

#include <gtest/gtest.h>

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

MHA_INSTANTIATE_PER_TARGET(DecodeTargetTest);

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
