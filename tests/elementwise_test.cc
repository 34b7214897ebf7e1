// Tests of kernels/elementwise.h on every Highway target this CPU supports. Everything is
// bit-exact: the f32 helpers against the same scalar f32 operation, the 16-bit conversions
// against independent scalar references (exhaustive for the 16 -> 32 bit direction; every
// rounding boundary plus a large random sample for 32 -> 16 bit).
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

constexpr float kSentinel = -777.25f;
constexpr uint16_t kSentinel16 = 0xDEAD;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Same value: identical bits, or both NaN (payload propagation through Add/Mul is the
// hardware's business, not the kernel's).
bool SameFloat(float a, float b) {
  return Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b));
}

std::string Hex(uint32_t u) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", u);
  return buf;
}

// --- Scalar references for the 16-bit formats ---------------------------------------------

// Value of a non-negative, non-NaN binary16 pattern (0..0x7C00); 0x7C00 (inf) is given the value
// 2^16, the next step after the largest finite 65504, which is what round-to-nearest compares
// against when deciding overflow.
double F16Magnitude(uint32_t h) {
  const uint32_t exp = h >> 10, mant = h & 0x3FF;
  if (exp == 0) return std::ldexp(static_cast<double>(mant), -24);
  return std::ldexp(static_cast<double>(0x400 | mant), static_cast<int>(exp) - 25);
}

// Same for bf16 patterns 0..0x7F80 (0x7F80 = inf gets 2^128).
double BF16Magnitude(uint32_t h) {
  const uint32_t exp = h >> 7, mant = h & 0x7F;
  if (exp == 0) return std::ldexp(static_cast<double>(mant), -133);
  return std::ldexp(static_cast<double>(0x80 | mant), static_cast<int>(exp) - 134);
}

// Rounds |x| (finite or inf, not NaN) to the nearest pattern in [0, max_pattern], ties to the
// even pattern, by binary search over the monotonic pattern -> magnitude map.
template <class Magnitude>
uint32_t RoundMagnitude(double ax, uint32_t max_pattern, Magnitude magnitude) {
  if (ax >= magnitude(max_pattern)) return max_pattern;
  uint32_t lo = 0, hi = max_pattern;  // magnitude(lo) <= ax < magnitude(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (magnitude(mid) <= ax ? lo : hi) = mid;
  }
  const double below = ax - magnitude(lo), above = magnitude(hi) - ax;
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1) ? hi : lo;
}

// NaN policy (documented in kernels/elementwise-inl.h, as the x86 F16C instructions): keep the
// sign and the top payload bits, set the quiet bit.
uint16_t RefF32ToF16(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7E00 | ((u >> 13) & 0x3FF));
  return static_cast<uint16_t>(sign | RoundMagnitude(std::fabs(static_cast<double>(f)), 0x7C00,
                                                     F16Magnitude));
}

uint16_t RefF32ToBF16(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040);
  return static_cast<uint16_t>(sign | RoundMagnitude(std::fabs(static_cast<double>(f)), 0x7F80,
                                                     BF16Magnitude));
}

uint32_t RefF16ToF32Bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0x1F) {
    return sign | 0x7F800000 | (mant << 13) | (mant ? 0x00400000u : 0u);  // NaN gets quieted
  }
  const float mag = static_cast<float>(F16Magnitude(h & 0x7FFF));  // exact in f32
  return sign | Bits(mag);
}

// --- Test data ------------------------------------------------------------------------------

// Inputs for the f32 -> 16 bit conversions: specials, every midpoint between adjacent 16-bit
// values of the format (and the floats just around it), and random bit patterns.
std::vector<float> ConversionSamples(bool f16) {
  std::vector<float> v;
  const float inf = std::numeric_limits<float>::infinity();
  for (const float f :
       {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::max(),
        -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
        std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
        65504.0f, 65519.0f, 65519.996f, 65520.0f, 65536.0f, 1e5f, 6.1035156e-05f, 5.9604645e-08f,
        2.9802322e-08f, 2.9802326e-08f, 1e-8f, 3.3895313e38f, 3.3961776e38f}) {
    v.push_back(f);
  }
  for (const uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu,
                             0x7FFFFFFFu, 0x7FC02000u, 0x7F802000u, 0x7F80E000u, 0xFFFFFFFFu}) {
    v.push_back(FromBits(nan));
  }
  const uint32_t max_pattern = f16 ? 0x7C00 : 0x7F80;
  for (uint32_t h = 0; h < max_pattern; ++h) {
    const double mid = f16 ? 0.5 * (F16Magnitude(h) + F16Magnitude(h + 1))
                           : 0.5 * (BF16Magnitude(h) + BF16Magnitude(h + 1));
    const float m = static_cast<float>(mid);  // exact: midpoints need <= 12 significant bits
    for (const float f : {m, std::nextafter(m, 0.0f), std::nextafter(m, inf)}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 400000; ++i) v.push_back(FromBits(static_cast<uint32_t>(rng())));
  // Values near the f16 range, where random bit patterns rarely land.
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 100000; ++i) {
    v.push_back(near(rng));
    v.push_back(tiny(rng));
  }
  return v;
}

// Lengths for the f32 helpers: all of 1..300 (every tail) and a few large ones.
std::vector<size_t> Lengths() {
  std::vector<size_t> n;
  for (size_t i = 1; i <= 300; ++i) n.push_back(i);
  for (size_t i : {1000, 4099, 8192}) n.push_back(i);
  return n;
}

// --- f32 helpers ----------------------------------------------------------------------------

class ElementwiseTargetTest : public test::PerTargetTest {};

TEST_P(ElementwiseTargetTest, AddBiasToRows) {
  const char* const target = target_name();
  std::mt19937 rng(1);
  for (const size_t cols : Lengths()) {
    if (cols > 300 && cols != 4099) continue;
    const size_t rows = 3, pad = cols % 3, offset = cols % 4, stride = cols + pad;
    std::vector<float> y(offset + rows * stride + 4, kSentinel);
    const std::vector<float> init = test::SymmetricFloats(rows * cols, 100.0f, &rng);
    std::vector<float> bias = test::SymmetricFloats(cols + 1, 100.0f, &rng);
    bias[cols / 2] = std::numeric_limits<float>::infinity();
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(&y[offset + r * stride], &init[r * cols], cols * sizeof(float));
    }
    kernels::AddBiasToRows(bias.data() + 1, y.data() + offset, rows, cols,
                           static_cast<ptrdiff_t>(stride));
    for (size_t i = 0; i < y.size(); ++i) {
      const bool inside = i >= offset && i < offset + rows * stride && (i - offset) % stride < cols;
      float want = kSentinel;
      if (inside) {
        const size_t r = (i - offset) / stride, c = (i - offset) % stride;
        want = init[r * cols + c] + bias[c + 1];
      }
      ASSERT_TRUE(SameFloat(y[i], want))
          << target << " cols=" << cols << " index " << i << ": got " << y[i] << ", want " << want;
    }
  }
}

// WinogradSums: the four block sums of a [2h, 2k2], bit-exact against the scalar f32
// operations for every width 1..300 (every tail), nothing written outside the outputs.
TEST_P(ElementwiseTargetTest, WinogradSums) {
  const char* const target = target_name();
  std::mt19937 rng(5);
  for (const size_t cols : Lengths()) {
    if (cols > 300 && cols != 4099) continue;
    const size_t rows = 3;
    // WinogradSums of a [2 * rows, 2 * cols] (row stride 2 * cols + 3, offset 1).
    const size_t h = rows, k2 = cols, lda = 2 * k2 + 3, lds = k2 + 2;
    const std::vector<float> a = test::SymmetricFloats(1 + 2 * h * lda, 100.0f, &rng);
    std::vector<float> out(4 * h * lds + 4, kSentinel);
    float* s[4] = {out.data() + 1, out.data() + 1 + h * lds, out.data() + 1 + 2 * h * lds,
                   out.data() + 1 + 3 * h * lds};
    kernels::WinogradSums(a.data() + 1, static_cast<ptrdiff_t>(lda), h, k2, s[0], s[1], s[2], s[3],
                          static_cast<ptrdiff_t>(lds));
    for (size_t r = 0; r < h; ++r) {
      for (size_t c = 0; c < lds; ++c) {
        const float a11 = a[1 + r * lda + c], a21 = a[1 + (r + h) * lda + c];
        const float a12 = a[1 + r * lda + k2 + c], a22 = a[1 + (r + h) * lda + k2 + c];
        const float s1 = a21 + a22, s2 = s1 - a11, s3 = a11 - a21, s4 = a12 - s2;
        const float want[4] = {s1, s2, s3, s4};
        for (int q = 0; q < 4; ++q) {
          const float expect = c < k2 ? want[q] : kSentinel;
          ASSERT_TRUE(SameFloat(s[q][r * lds + c], expect))
              << target << " WinogradSums k2=" << k2 << " sum " << q + 1 << " (" << r << ", " << c
              << ")";
        }
      }
    }
    ASSERT_TRUE(SameFloat(out[0], kSentinel) && SameFloat(out.back(), kSentinel)) << target;
  }
}

TEST_P(ElementwiseTargetTest, ScaleByAndAddInto) {
  const char* const target = target_name();
  std::mt19937 rng(2);
  for (const size_t n : Lengths()) {
    const size_t offset = n % 4;
    const std::vector<float> a = test::SymmetricFloats(n, 100.0f, &rng),
                             b = test::SymmetricFloats(n + 3, 100.0f, &rng);
    std::vector<float> y(offset + n + 4, kSentinel);
    std::memcpy(&y[offset], a.data(), n * sizeof(float));
    kernels::ScaleBy(0.37f, y.data() + offset, n);
    for (size_t i = 0; i < y.size(); ++i) {
      const bool inside = i >= offset && i < offset + n;
      const float want = inside ? a[i - offset] * 0.37f : kSentinel;
      ASSERT_TRUE(SameFloat(y[i], want)) << target << " ScaleBy n=" << n << " index " << i;
    }
    std::memcpy(&y[offset], a.data(), n * sizeof(float));
    kernels::AddInto(b.data() + 3, y.data() + offset, n);
    for (size_t i = 0; i < y.size(); ++i) {
      const bool inside = i >= offset && i < offset + n;
      const float want = inside ? a[i - offset] + b[i - offset + 3] : kSentinel;
      ASSERT_TRUE(SameFloat(y[i], want)) << target << " AddInto n=" << n << " index " << i;
    }
  }
  // Special values go through unchanged IEEE arithmetic.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> y = {inf, -inf, 0.0f, -0.0f, 3e38f, -1e-45f, std::nanf("")};
  kernels::ScaleBy(-2.0f, y.data(), y.size());
  EXPECT_EQ(y[0], -inf) << target;
  EXPECT_EQ(y[1], inf) << target;
  EXPECT_TRUE(std::signbit(y[2]) && y[2] == 0.0f) << target;
  EXPECT_EQ(y[4], -inf) << target;
  EXPECT_TRUE(std::isnan(y[6])) << target;
}
MHA_INSTANTIATE_PER_TARGET(ElementwiseTargetTest);

// --- 16-bit conversions ---------------------------------------------------------------------

// Runs `convert` over `in` in pieces of varying length and misalignment, so every tail length
// and offset is exercised, and checks the outputs bit for bit and the sentinels around them.
template <class In, class Out, class Convert, class Want>
void CheckConversion(const char* target, const char* name, const std::vector<In>& in,
                     Out sentinel, Convert convert, Want want) {
  size_t pos = 0, piece = 1;
  int failures = 0;
  while (pos < in.size() && failures < 5) {
    const size_t n = std::min(piece, in.size() - pos);
    const size_t offset = piece % 4;
    std::vector<In> src(offset + n);
    std::memcpy(src.data() + offset, in.data() + pos, n * sizeof(In));
    std::vector<Out> dst(offset + n + 4, sentinel);
    convert(src.data() + offset, dst.data() + offset, n);
    for (size_t i = 0; i < dst.size(); ++i) {
      const bool inside = i >= offset && i < offset + n;
      Out expected = sentinel;
      if (inside) expected = want(in[pos + i - offset]);
      if (std::memcmp(&dst[i], &expected, sizeof(Out)) != 0) {
        uint32_t got_bits = 0, want_bits = 0, in_bits = 0;
        std::memcpy(&got_bits, &dst[i], sizeof(Out));
        std::memcpy(&want_bits, &expected, sizeof(Out));
        if (inside) std::memcpy(&in_bits, &in[pos + i - offset], sizeof(In));
        ADD_FAILURE() << target << " " << name << ": input " << Hex(in_bits) << " (piece of "
                      << n << " at offset " << offset << ", index " << i << "): got "
                      << Hex(got_bits) << ", want " << Hex(want_bits);
        if (++failures >= 5) break;
      }
    }
    pos += n;
    piece = piece >= 300 ? 1 : piece + 1;  // lengths 1..300, then large chunks
    if (pos > 50000) piece = 4099;
  }
}

class ConversionTargetTest : public test::PerTargetTest {};

TEST_P(ConversionTargetTest, BF16ToF32Exhaustive) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  const char* const target = target_name();
  CheckConversion(
      target, "BF16ToF32", all, kSentinel,
      [](const uint16_t* x, float* y, size_t n) { kernels::BF16ToF32(x, y, n); },
      [](uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); });
}

TEST_P(ConversionTargetTest, F16ToF32Exhaustive) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  const char* const target = target_name();
  CheckConversion(
      target, "F16ToF32", all, kSentinel,
      [](const uint16_t* x, float* y, size_t n) { kernels::F16ToF32(x, y, n); },
      [](uint16_t h) { return FromBits(RefF16ToF32Bits(h)); });
}

TEST_P(ConversionTargetTest, F32ToBF16) {
  const std::vector<float> samples = ConversionSamples(/*f16=*/false);
  std::vector<uint16_t> want(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) want[i] = RefF32ToBF16(samples[i]);
  // Spot checks of the reference itself.
  EXPECT_EQ(RefF32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(RefF32ToBF16(FromBits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(RefF32ToBF16(FromBits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(RefF32ToBF16(std::numeric_limits<float>::max()), 0x7F80);
  const char* const target = target_name();
  CheckConversion(
      target, "F32ToBF16", samples, kSentinel16,
      [](const float* x, uint16_t* y, size_t n) { kernels::F32ToBF16(x, y, n); },
      [](float f) { return RefF32ToBF16(f); });
}

TEST_P(ConversionTargetTest, F32ToF16) {
  const std::vector<float> samples = ConversionSamples(/*f16=*/true);
  EXPECT_EQ(RefF32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(RefF32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(RefF32ToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(RefF32ToF16(65520.0f), 0x7C00);          // tie with 2^16 rounds to even: inf
  EXPECT_EQ(RefF32ToF16(5.9604645e-08f), 0x0001);    // 2^-24, smallest subnormal
  EXPECT_EQ(RefF32ToF16(2.9802322e-08f), 0x0000);    // 2^-25: tie, rounds to even 0
  EXPECT_EQ(RefF32ToF16(-2.9802326e-08f), 0x8001);   // just above the tie
  const char* const target = target_name();
  CheckConversion(
      target, "F32ToF16", samples, kSentinel16,
      [](const float* x, uint16_t* y, size_t n) { kernels::F32ToF16(x, y, n); },
      [](float f) { return RefF32ToF16(f); });
}

// Every finite f16 and bf16 value survives a round trip through f32 unchanged.
TEST_P(ConversionTargetTest, RoundTrips) {
  const char* const target = target_name();
  std::vector<uint16_t> h, back(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    if (((i >> 10) & 0x1F) != 0x1F) h.push_back(static_cast<uint16_t>(i));
  }
  std::vector<float> f(h.size());
  kernels::F16ToF32(h.data(), f.data(), h.size());
  kernels::F32ToF16(f.data(), back.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(back[i], h[i]) << target << " f16 " << Hex(h[i]);
  }
  h.clear();
  for (uint32_t i = 0; i < 65536; ++i) {
    if (((i >> 7) & 0xFF) != 0xFF) h.push_back(static_cast<uint16_t>(i));
  }
  f.resize(h.size());
  kernels::BF16ToF32(h.data(), f.data(), h.size());
  kernels::F32ToBF16(f.data(), back.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(back[i], h[i]) << target << " bf16 " << Hex(h[i]);
  }
}
MHA_INSTANTIATE_PER_TARGET(ConversionTargetTest);

}  // namespace
}  // namespace mha
