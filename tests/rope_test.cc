// Tests of kernels/rope.h: RopeAngles against long double, and ApplyRope and RmsNormRows on
// every Highway target this CPU supports against a scalar double reference, plus bitwise
// equality with the documented f32 formulas and across targets. Odd head sizes, partial rotary
// dims, misaligned and strided rows; padding must come back unchanged.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/targets.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

class ApplyRopeTest : public test::PerTargetTest {};
class RmsNormRowsTest : public test::PerTargetTest {};

constexpr float kSentinel = -12345.5f;

// Every supported target (read with none forced), then `current` forced again.
std::vector<int64_t> AllTargets(int64_t current) {
  std::vector<int64_t> targets = test::TestTargets();
  kernels::ForceTarget(current);
  return targets;
}

std::vector<double> InvFreq(size_t rotary_dim, double theta, double scale) {
  std::vector<double> f(rotary_dim / 2);
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim)) / scale;
  }
  return f;
}

// cos and sin within one f32 rounding of the exact values plus the double angle's rounding
// (rope.h), at positions up to 2^20 and at the int32 limit.
TEST(RopeAnglesTest, MatchesLongDouble) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> big(0, 1 << 20);
  for (const size_t rotary_dim : {2, 6, 64, 128}) {
    for (const double theta : {10000.0, 500000.0}) {
      for (const double scale : {1.0, 4.0, 0.5}) {
        const std::vector<double> inv_freq = InvFreq(rotary_dim, theta, scale);
        const size_t half = rotary_dim / 2, rows = 9;
        std::vector<int32_t> pos(rows);
        for (size_t r = 0; r < rows; ++r) pos[r] = big(rng);
        pos[0] = 0;
        pos[1] = 1 << 20;
        pos[2] = INT32_MAX;
        std::vector<float> c(rows * half), s(rows * half);
        kernels::RopeAngles(pos.data(), 0, rows, inv_freq.data(), half, c.data(), s.data());
        int failures = 0;
        for (size_t r = 0; r < rows && failures < 5; ++r) {
          for (size_t i = 0; i < half; ++i) {
            const long double angle =
                static_cast<long double>(pos[r]) * static_cast<long double>(inv_freq[i]);
            const double want_c = static_cast<double>(std::cos(angle));
            const double want_s = static_cast<double>(std::sin(angle));
            const double slack = static_cast<double>(std::fabs(angle)) * 0x1p-52 + 0x1p-60;
            const double tol_c = 0x1p-24 * std::fabs(want_c) + slack;
            const double tol_s = 0x1p-24 * std::fabs(want_s) + slack;
            if (std::fabs(c[r * half + i] - want_c) > tol_c ||
                std::fabs(s[r * half + i] - want_s) > tol_s) {
              ++failures;
              ADD_FAILURE() << "rd=" << rotary_dim << " theta=" << theta << " scale=" << scale
                            << " pos=" << pos[r] << " i=" << i << ": cos " << c[r * half + i]
                            << " want " << want_c << ", sin " << s[r * half + i] << " want "
                            << want_s;
            }
          }
        }
        // Null positions are pos0 + r, bitwise.
        std::vector<float> c2(rows * half), s2(rows * half);
        std::vector<int32_t> seq(rows);
        for (size_t r = 0; r < rows; ++r) seq[r] = 1000 + static_cast<int32_t>(r);
        kernels::RopeAngles(seq.data(), 0, rows, inv_freq.data(), half, c.data(), s.data());
        kernels::RopeAngles(nullptr, 1000, rows, inv_freq.data(), half, c2.data(), s2.data());
        EXPECT_EQ(std::memcmp(c.data(), c2.data(), c.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(s.data(), s2.data(), s.size() * sizeof(float)), 0);
      }
    }
  }
}

// The attention factor (RoPE scaling's) multiplies cos and sin in double before their one f32
// rounding; 1 gives the unscaled bits.
TEST(RopeAnglesTest, AttentionFactorScalesBeforeRounding) {
  const std::vector<double> inv_freq = InvFreq(64, 10000.0, 1.0);
  const size_t half = 32, rows = 3;
  const int32_t pos[rows] = {0, 77, 123456};
  std::vector<float> c(rows * half), s(rows * half), c1(rows * half), s1(rows * half);
  kernels::RopeAngles(pos, 0, rows, inv_freq.data(), half, c.data(), s.data());
  kernels::RopeAngles(pos, 0, rows, inv_freq.data(), half, c1.data(), s1.data(), 1.0);
  EXPECT_EQ(std::memcmp(c.data(), c1.data(), c.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(s.data(), s1.data(), s.size() * sizeof(float)), 0);
  const double a = 0.1 * std::log(4.0) + 1.0;  // YaRN's default at factor 4
  kernels::RopeAngles(pos, 0, rows, inv_freq.data(), half, c.data(), s.data(), a);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < half; ++i) {
      const double angle = pos[r] * inv_freq[i];
      EXPECT_EQ(c[r * half + i], static_cast<float>(std::cos(angle) * a)) << r << " " << i;
      EXPECT_EQ(s[r * half + i], static_cast<float>(std::sin(angle) * a)) << r << " " << i;
    }
  }
}

// One ApplyRope case: rows of `heads` heads, padded and misaligned.
struct RopeCase {
  size_t rows, heads, head_dim, rotary_dim;
  bool interleaved;
  size_t pad, offset;

  std::string Name() const {
    return "rows=" + std::to_string(rows) + " heads=" + std::to_string(heads) +
           " hd=" + std::to_string(head_dim) + " rd=" + std::to_string(rotary_dim) +
           (interleaved ? " gptj" : " neox") + " pad=" + std::to_string(pad) +
           " offset=" + std::to_string(offset);
  }
  size_t stride() const { return heads * head_dim + pad; }
};

std::vector<RopeCase> RopeCases() {
  std::vector<RopeCase> cases;
  const size_t dims[][2] = {{2, 2},   {6, 6},   {7, 6},     {8, 4},    {16, 16},
                            {33, 32}, {64, 64}, {128, 128}, {130, 66}, {300, 298}};
  size_t k = 0;
  for (const auto& dim : dims) {
    for (const bool interleaved : {false, true}) {
      for (const size_t heads : {1, 3}) {
        cases.push_back(
            {k % 2 ? size_t{5} : size_t{1}, heads, dim[0], dim[1], interleaved, k % 3, k % 4});
        ++k;
      }
    }
  }
  return cases;
}

// Runs ApplyRope on one case with random x and positions (seeded by the case index); returns
// the whole storage (padding included) and the inputs.
struct RopeRun {
  std::vector<float> in, out, cos, sin;
};

RopeRun RunRope(const RopeCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_int_distribution<int32_t> position(0, 1 << 20);
  RopeRun run;
  const size_t half = c.rotary_dim / 2;
  run.in.assign(c.offset + c.rows * c.stride() + 4, kSentinel);
  for (size_t r = 0; r < c.rows; ++r) {
    for (size_t e = 0; e < c.heads * c.head_dim; ++e) {
      run.in[c.offset + r * c.stride() + e] = value(rng);
    }
  }
  std::vector<int32_t> pos(c.rows);
  for (int32_t& p : pos) p = position(rng);
  const std::vector<double> inv_freq = InvFreq(c.rotary_dim, 10000.0, 1.0);
  run.cos.resize(c.rows * half);
  run.sin.resize(c.rows * half);
  kernels::RopeAngles(pos.data(), 0, c.rows, inv_freq.data(), half, run.cos.data(), run.sin.data());
  run.out = run.in;
  kernels::ApplyRope(run.out.data() + c.offset, c.rows, static_cast<ptrdiff_t>(c.stride()), c.heads,
                     c.head_dim, c.rotary_dim, c.interleaved, run.cos.data(), run.sin.data());
  return run;
}

// Against the scalar double rotation (within the f32 roundings of the products and the sum),
// bitwise against the documented f32 formula, and components >= rotary_dim and padding
// unchanged.
TEST_P(ApplyRopeTest, MatchesScalarReference) {
  const char* const target = target_name();
  const std::vector<RopeCase> cases = RopeCases();
  for (size_t k = 0; k < cases.size(); ++k) {
    const RopeCase& c = cases[k];
    const RopeRun run = RunRope(c, static_cast<uint32_t>(k));
    const size_t half = c.rotary_dim / 2;
    std::vector<float> want = run.in;  // the f32 formula, exactly as documented
    for (size_t r = 0; r < c.rows; ++r) {
      for (size_t h = 0; h < c.heads; ++h) {
        const size_t base = c.offset + r * c.stride() + h * c.head_dim;
        for (size_t i = 0; i < half; ++i) {
          const size_t ia = base + (c.interleaved ? 2 * i : i);
          const size_t ib = base + (c.interleaved ? 2 * i + 1 : half + i);
          const float a = run.in[ia], b = run.in[ib];
          const float co = run.cos[r * half + i], si = run.sin[r * half + i];
          want[ia] = a * co - b * si;
          want[ib] = b * co + a * si;
          // The double rotation: two f32 products and one sum, each rounded.
          const double da = static_cast<double>(a) * co - static_cast<double>(b) * si;
          const double db = static_cast<double>(b) * co + static_cast<double>(a) * si;
          const double tol_a = 0x1p-23 * (std::fabs(a * co) + std::fabs(b * si));
          const double tol_b = 0x1p-23 * (std::fabs(b * co) + std::fabs(a * si));
          EXPECT_LE(std::fabs(run.out[ia] - da), tol_a) << target << " " << c.Name();
          EXPECT_LE(std::fabs(run.out[ib] - db), tol_b) << target << " " << c.Name();
        }
      }
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::memcmp(&run.out[i], &want[i], sizeof(float)) != 0) {
        ADD_FAILURE() << target << " " << c.Name() << ": element " << i << " is " << run.out[i]
                      << ", not bitwise the documented f32 formula's " << want[i];
        break;
      }
    }
  }
}

// Every target gives the same bits (the rotation has no FMA).
TEST_P(ApplyRopeTest, BitwiseAcrossTargets) {
  const char* const target = target_name();
  const std::vector<RopeCase> cases = RopeCases();
  const std::vector<int64_t> targets = AllTargets(GetParam());
  for (size_t k = 0; k < cases.size(); ++k) {
    const RopeRun mine = RunRope(cases[k], static_cast<uint32_t>(k) + 100);
    for (const int64_t other : targets) {
      kernels::ForceTarget(other);
      const RopeRun theirs = RunRope(cases[k], static_cast<uint32_t>(k) + 100);
      kernels::ForceTarget(GetParam());
      EXPECT_EQ(std::memcmp(mine.out.data(), theirs.out.data(), mine.out.size() * sizeof(float)), 0)
          << target << " vs " << kernels::TargetName(other) << " " << cases[k].Name();
    }
  }
}

// RMSNorm per head (groups = heads) and over the whole row (groups = 1) against double, and
// bitwise across targets.
TEST_P(RmsNormRowsTest, MatchesDouble) {
  const char* const target = target_name();
  std::mt19937 rng(3);
  const std::vector<int64_t> targets = AllTargets(GetParam());
  size_t k = 0;
  for (const size_t group_size : {1, 3, 8, 17, 64, 129, 1000}) {
    for (const size_t groups : {1, 3}) {
      for (const float magnitude : {1.0f, 1e-15f, 1e15f}) {
        for (const float eps : {1e-6f, 1e-5f}) {
          ++k;
          const size_t rows = 4, pad = k % 3, offset = k % 4;
          const size_t stride = groups * group_size + pad;
          std::uniform_real_distribution<float> value(-2.0f, 2.0f);
          std::vector<float> in(offset + rows * stride + 4, kSentinel);
          for (size_t r = 0; r < rows; ++r) {
            for (size_t e = 0; e < groups * group_size; ++e) {
              in[offset + r * stride + e] = value(rng) * magnitude;
            }
          }
          std::vector<float> w(group_size);
          for (float& v : w) v = value(rng);
          auto run = [&] {
            std::vector<float> out = in;
            kernels::RmsNormRows(out.data() + offset, rows, static_cast<ptrdiff_t>(stride), groups,
                                 group_size, w.data(), eps);
            return out;
          };
          const std::vector<float> out = run();
          const std::string what = std::string(target) + " n=" + std::to_string(group_size) +
                                   " groups=" + std::to_string(groups) +
                                   " magnitude=" + std::to_string(magnitude);
          int failures = 0;
          for (size_t r = 0; r < rows && failures < 5; ++r) {
            for (size_t g = 0; g < groups; ++g) {
              const float* x = in.data() + offset + r * stride + g * group_size;
              double ss = 0;
              for (size_t i = 0; i < group_size; ++i) ss += static_cast<double>(x[i]) * x[i];
              const double inv = 1.0 / std::sqrt(ss / static_cast<double>(group_size) + eps);
              for (size_t i = 0; i < group_size; ++i) {
                const double want = static_cast<double>(x[i]) * inv * w[i];
                const float got = out[offset + r * stride + g * group_size + i];
                // The f32 factor and the two products: three roundings.
                if (std::fabs(got - want) > 0x1p-22 * std::fabs(want) + 1e-38) {
                  ++failures;
                  ADD_FAILURE() << what << " row " << r << " group " << g << " i " << i << ": got "
                                << got << " want " << want;
                }
              }
            }
          }
          for (size_t i = 0; i < in.size(); ++i) {
            const bool inside = i >= offset && (i - offset) % stride < groups * group_size &&
                                i < offset + rows * stride;
            if (!inside) {
              ASSERT_EQ(out[i], kSentinel) << what << ": wrote padding at " << i;
            }
          }
          for (const int64_t other : targets) {
            kernels::ForceTarget(other);
            const std::vector<float> theirs = run();
            kernels::ForceTarget(GetParam());
            EXPECT_EQ(std::memcmp(out.data(), theirs.data(), out.size() * sizeof(float)), 0)
                << what << " vs " << kernels::TargetName(other);
          }
        }
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(ApplyRopeTest);
MHA_INSTANTIATE_PER_TARGET(RmsNormRowsTest);

}  // namespace
}  // namespace mha
