// Tests of the int8-activation products (kernels/gemv_int8.h), on every target against the
// test's own scalar reading of the definition (input order, codes through quant.h's RowCode):
// - the activation quantization: codes at their layout positions, scales, lane sums, bitwise;
//   ties, non-finite and tiny blocks;
// - every kernel (portable on each target; AVX2, AVX-512 VNNI, Arm SDOT where the CPU has them,
//   the kernels run printed per target): bitwise the reference, odd depths (1..300, across units
//   and blocks), 1..9 and 33 rows (two row blocks), odd weight row counts, misaligned a, codes and
//   scales, strided c; the VNNI kernel both ways of reading the weights for few rows;
// - which kernels this CPU reports: SDOT exactly where Linux reports FEAT_DotProd, and always
//   under qemu's `max` CPU (so an aarch64 run cannot pass without testing it);
// - GemmInt8: a row gives the same bits alone and among many (decode == prefill);
// - the error against the double product of the dequantized weights and f32 activations.
#include "kernels/gemv_int8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "tests/kernel_test_util.h"
#include "tests/quant_test_util.h"
#include "tests/random_util.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)  // Linux arch/arm64 uapi hwcap.h
#endif
#endif

namespace mha {
namespace kernels {
namespace {

// w [rows, cols] quantized (misaligned by `offset`), for int8-activation products.
QuantStorage QuantizeWeights(const std::vector<float>& w, size_t rows, size_t cols, const Format& f,
                             size_t offset) {
  QuantStorage q = Quantize(w, rows, cols, f, offset);
  q.m.int8_activations = true;
  return q;
}

// The reference quantization of one row: codes in input order (padded with zeros to whole
// units) and one scale per activation block.
struct RefRow {
  std::vector<int> codes;
  std::vector<float> scales;
};

RefRow QuantizeRef(const float* a, size_t k, size_t unit, size_t block) {
  const size_t padded = (k + unit - 1) / unit * unit;
  RefRow r;
  r.codes.assign(padded, 0);
  for (size_t b0 = 0; b0 < padded; b0 += block) {
    float amax = 0.0f;
    bool finite = true;
    for (size_t p = b0; p < b0 + block && p < k; ++p) {
      if (!std::isfinite(a[p])) finite = false;
      amax = std::max(amax, std::fabs(a[p]));
    }
    if (!finite) {
      r.scales.push_back(std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (!(amax >= kInt8MinAmax)) {
      r.scales.push_back(0.0f);
      continue;
    }
    r.scales.push_back(amax / 127.0f);
    const float inv = 127.0f / amax;
    for (size_t p = b0; p < b0 + block && p < k; ++p) {
      const float x = a[p] * inv;
      r.codes[p] = std::max(-127, std::min(127, static_cast<int>(std::nearbyint(x))));
    }
  }
  return r;
}

size_t ActBlockOf(const Format& f) { return f.type == DType::kI8 ? 32 : f.block; }

// The definition's output for one reference row and weight row r.
float DotRef(const RefRow& a, const QuantMatrix& w, size_t r) {
  const size_t unit = kI4Group;
  const size_t ablock = w.type == DType::kI8 ? 32 : w.block;
  const uint8_t* row = w.codes + r * w.row_bytes;
  const float* ws = w.scales + r * w.scales_per_row;
  const auto wcode = [&](size_t p) { return p < w.cols ? RowCode(row, w.type, p) : 0; };
  float acc[16] = {};
  for (size_t u = 0; u * unit < a.codes.size(); ++u) {
    for (size_t l = 0; l < 16; ++l) {
      int32_t s = 0;
      const size_t first = 128 * u + 32 * (l % 4) + 4 * (l / 4);  // the lane's first input
      for (size_t i = 0; i < 4; ++i) {
        s +=
            a.codes[first + i] * wcode(first + i) + a.codes[first + 16 + i] * wcode(first + 16 + i);
      }
      float f = a.scales[first / ablock];
      if (w.type == DType::kI4) {
        const size_t wb = first / w.block;
        f = f * (wb < w.scales_per_row ? ws[wb] : 0.0f);
      }
      acc[l] = acc[l] + static_cast<float>(s) * f;
    }
  }
  float t8[8], t4[4], t2[2];
  for (size_t l = 0; l < 8; ++l) t8[l] = acc[l] + acc[l + 8];
  for (size_t l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  for (size_t l = 0; l < 2; ++l) t2[l] = t4[l] + t4[l + 2];
  const float y = t2[0] + t2[1];
  return w.type == DType::kI8 ? y * ws[0] : y;
}

// Rows of activations with a few exact ties (x.5 after scaling) and a spread of magnitudes.
std::vector<float> Activations(size_t rows, size_t k, std::mt19937* rng) {
  std::vector<float> a = test::SymmetricFloats(rows * k, 3.0f, rng);
  for (size_t i = 0; i < a.size(); i += 7) a[i] *= 0.01f;
  for (size_t i = 0; i < rows; ++i) {
    // A block whose largest element is 127: codes equal the values, so 2.5 is a tie (to 2).
    if (k >= 4) {
      a[i * k] = 127.0f;
      a[i * k + 1] = 2.5f;
      a[i * k + 2] = -3.5f;
    }
  }
  return a;
}

class GemvInt8Test : public test::PerTargetTest {};

TEST_P(GemvInt8Test, QuantizationMatchesTheDefinition) {
  std::mt19937 rng(11);
  for (const Format& f : kFormats) {
    for (size_t k : {1, 4, 31, 33, 64, 100, 128, 129, 300}) {
      std::vector<float> a = Activations(2, k, &rng);
      if (k > 40) a[k + 40] = std::numeric_limits<float>::infinity();  // row 1's second block
      if (k > 70) {
        for (size_t p = 64; p < std::min<size_t>(k, 96); ++p) a[p] = 1e-31f;  // row 0, tiny block
      }
      const Int8ActLayout lay = Int8ActLayoutOf(f.type, f.block, k);
      std::vector<uint8_t> buf(2 * lay.row_bytes + 64);
      uint8_t* dst = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
      QuantizeActivationsInt8(a.data(), k, 2, k, f.type, f.block, dst);
      for (size_t i = 0; i < 2; ++i) {
        SCOPED_TRACE(std::string(target_name()) + " k " + std::to_string(k) + " block " +
                     std::to_string(f.block) + " row " + std::to_string(i));
        const RefRow ref = QuantizeRef(a.data() + i * k, k, kI4Group, ActBlockOf(f));
        const uint8_t* row = dst + i * lay.row_bytes;
        const int8_t* codes = reinterpret_cast<const int8_t*>(row);
        const float* scales = reinterpret_cast<const float*>(row + lay.scales_offset);
        const int32_t* sums = reinterpret_cast<const int32_t*>(row + lay.sums_offset);
        std::vector<int32_t> lane_sums(16 * lay.units, 0);
        for (size_t p = 0; p < ref.codes.size(); ++p) {
          const size_t u = p / lay.unit, e = p % lay.unit;
          // e = 32j + 16h + 4l + i
          const size_t j = e / 32, h = e % 32 / 16, l = e % 16 / 4, ii = e % 4;
          const size_t at = 128 * u + 64 * h + 16 * l + 4 * j + ii, lane = 4 * l + j;
          ASSERT_EQ(codes[at], ref.codes[p]) << "input " << p;
          lane_sums[16 * u + lane] += ref.codes[p];
        }
        for (size_t u = 0; u < lay.units; ++u) {
          for (size_t l = 0; l < 16; ++l) {
            ASSERT_EQ(sums[16 * u + l], (f.type == DType::kI8 ? -128 : -8) * lane_sums[16 * u + l]);
          }
          for (size_t s = 0; s < lay.scales_per_unit; ++s) {
            const float want = ref.scales[(128 * u + 32 * s) / ActBlockOf(f)];
            ASSERT_EQ(test::Bits(scales[lay.scales_per_unit * u + s]), test::Bits(want))
                << "unit " << u << " scale " << s;
          }
        }
      }
      if (k >= 4) {
        EXPECT_EQ(reinterpret_cast<const int8_t*>(dst)[0], 127);
        EXPECT_EQ(reinterpret_cast<const int8_t*>(dst)[1], 2);  // 2.5: ties to even
      }
    }
  }
}

// Every kernel, bitwise the reference, on odd shapes and misaligned operands.
TEST_P(GemvInt8Test, KernelsMatchTheReferenceBitwise) {
  std::mt19937 rng(5);
  std::vector<Int8Kernel> kernels = {Int8Kernel::kPortable};
  std::string names = Int8KernelName(Int8Kernel::kPortable);
  for (Int8Kernel k : {Int8Kernel::kAvx2, Int8Kernel::kAvx512Vnni, Int8Kernel::kNeonDotProd}) {
    if (Int8KernelAvailable(k)) {
      kernels.push_back(k);
      names = names + " " + Int8KernelName(k);
    }
  }
  std::printf("int8 kernels on %s: %s\n", target_name(), names.c_str());
  for (const Format& f : kFormats) {
    for (size_t k : {1, 7, 32, 63, 65, 127, 160, 256, 257, 300}) {
      for (size_t n : {1, 2, 5}) {
        for (size_t m : {1, 2, 3, 4, 9, 33}) {
          const size_t lda = k + 1;  // misaligned rows from row 1 on
          std::vector<float> a = Activations(m, lda, &rng);
          const std::vector<float> wf = test::SymmetricFloats(n * k, 0.5f, &rng);
          const QuantStorage w = QuantizeWeights(wf, n, k, f, /*offset=*/(k + n) % 3);
          const Int8ActLayout lay = Int8ActLayoutOf(f.type, f.block, k);
          std::vector<uint8_t> buf(m * lay.row_bytes + 64);
          uint8_t* qa = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
          QuantizeActivationsInt8(a.data() + 1, lda, m, k, f.type, f.block, qa);
          for (Int8Kernel kernel : kernels) {
            // The VNNI kernel both ways of reading the weights for few rows, whichever this
            // CPU's choice is.
            for (Int8FewRows few : {Int8FewRows::kOneWeightRow, Int8FewRows::kTiled}) {
              std::vector<float> c(m * n * 2, -7.0f);  // column-major with a padded stride
              GemvInt8Rows(kernel, qa, m, w.m, {c.data(), m, n, 1, static_cast<ptrdiff_t>(2 * m)},
                           few);
              for (size_t i = 0; i < m; ++i) {
                const RefRow ref = QuantizeRef(a.data() + 1 + i * lda, k, kI4Group, ActBlockOf(f));
                for (size_t r = 0; r < n; ++r) {
                  ASSERT_EQ(test::Bits(c[i + r * 2 * m]), test::Bits(DotRef(ref, w.m, r)))
                      << target_name() << " " << Int8KernelName(kernel)
                      << (few == Int8FewRows::kTiled ? " tiled" : " one weight row") << " block "
                      << f.block << " k " << k << " n " << n << " m " << m << " (" << i << ", " << r
                      << ")";
                }
              }
            }
          }
        }
      }
    }
  }
}

// A row's bits do not depend on the rows around it (decode == prefill); the error against the
// double product of the dequantized weights and the f32 activations stays within the
// activations' rounding: per element at most scale / 2, so |y - exact| <= sum_p |w_p| *
// amax_block(p) / 254 plus f32 rounding.
TEST_P(GemvInt8Test, RowsAreIndependentAndWithinTheActivationBound) {
  std::mt19937 rng(9);
  for (const Format& f : kFormats) {
    const size_t k = 200, n = 7, m = 21;
    const std::vector<float> a = Activations(m, k, &rng);
    const std::vector<float> wf = test::SymmetricFloats(n * k, 0.5f, &rng);
    const QuantStorage w = QuantizeWeights(wf, n, k, f, 0);
    std::vector<uint8_t> scratch_buf(GemmScratchBytes() + 64);
    void* scratch =
        scratch_buf.data() + (64 - reinterpret_cast<uintptr_t>(scratch_buf.data()) % 64) % 64;
    const ptrdiff_t ks = static_cast<ptrdiff_t>(k), ns = static_cast<ptrdiff_t>(n);
    std::vector<float> all(m * n), one(n);
    GemmInt8({a.data(), m, k, ks, 1}, w.m, {all.data(), m, n, ns, 1}, scratch);
    for (size_t i = 0; i < m; ++i) {
      GemmInt8({a.data() + i * k, 1, k, ks, 1}, w.m, {one.data(), 1, n, ns, 1}, scratch);
      for (size_t r = 0; r < n; ++r) {
        ASSERT_EQ(test::Bits(one[r]), test::Bits(all[i * n + r])) << target_name() << " row " << i;
        double exact = 0.0, bound = 0.0;
        const size_t ab = ActBlockOf(f);
        for (size_t p = 0; p < k; ++p) {
          const double wp = DequantizedWeight(w.m, r, p);
          exact += wp * a[i * k + p];
          float amax = 0.0f;
          for (size_t q = p / ab * ab; q < std::min(k, p / ab * ab + ab); ++q) {
            amax = std::max(amax, std::fabs(a[i * k + q]));
          }
          bound += std::fabs(wp) * (amax / 254.0 + std::fabs(a[i * k + p]) * 1e-6);
        }
        EXPECT_LE(std::fabs(all[i * n + r] - exact), bound * 1.01 + 1e-6)
            << target_name() << " block " << f.block << " (" << i << ", " << r << ")";
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(GemvInt8Test);

// Int8KernelAvailable(kNeonDotProd) follows the CPU: the HWCAP bit on aarch64 Linux, false
// elsewhere. qemu's default `max` CPU has FEAT_DotProd, so the emulated runs (QEMU_CPU, seen by
// the guest, starting with "max") must report it.
TEST(GemvInt8KernelsTest, NeonDotProdWhereTheCpuHasIt) {
  const bool available = Int8KernelAvailable(Int8Kernel::kNeonDotProd);
#if defined(__aarch64__) && defined(__linux__)
  EXPECT_EQ(available, (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0);
  const char* qemu_cpu = std::getenv("QEMU_CPU");
  if (qemu_cpu != nullptr && std::strncmp(qemu_cpu, "max", 3) == 0) {
    EXPECT_TRUE(available) << "QEMU_CPU=" << qemu_cpu << " emulates FEAT_DotProd";
  }
#else
  EXPECT_FALSE(available);
#endif
  std::printf("neon_dotprod available: %s\n", available ? "yes" : "no");
}

}  // namespace
}  // namespace kernels
}  // namespace mha
