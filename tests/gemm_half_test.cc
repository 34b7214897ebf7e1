// Tests of 16-bit weights in the products (kernels::GemmHalfB, kernels::GemvHalf), on every
// Highway target this CPU supports: for bf16 and f16 weights w [n, k] (b = w^T), odd sizes on both
// sides of the GEMV threshold (m 1..9 and up to 300 rows, k and n odd and across the BLIS block
// sizes), padded strides, misaligned pointers and row- and column-stored c, the result must be
// bitwise the result of the f32 product on the exactly widened weights (gemm.h's contract), and
// nothing outside c's view may be written. The f32 products themselves are tested against a double
// reference in gemm_test.cc and gemv_test.cc, so bitwise equality carries that accuracy over.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace kernels {
namespace {

constexpr float kSentinel = -12345.5f;

struct AlignedScratch {
  explicit AlignedScratch(size_t bytes)
      : raw(new uint8_t[bytes + kGemmScratchAlignment]),
        data(raw.get() + (kGemmScratchAlignment -
                          reinterpret_cast<uintptr_t>(raw.get()) % kGemmScratchAlignment)) {}
  std::unique_ptr<uint8_t[]> raw;
  uint8_t* data;
};

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// One case: a [m, k] (rows at a_stride, starting `offset` floats in), w [n, k] in 16 bits (rows
// at w_stride, starting `offset` elements in) and its exact f32 widening, c [m, n] row- or
// column-stored inside a sentinel-filled buffer.
void CheckCase(DType type, size_t m, size_t n, size_t k, bool c_col_major, size_t offset,
               std::mt19937* rng, void* scratch) {
  SCOPED_TRACE("type " + std::string(type == DType::kBF16 ? "bf16" : "f16") + " m " +
               std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
               (c_col_major ? " c col-major" : " c row-major") + " offset " +
               std::to_string(offset));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t a_stride = k + 3, w_stride = k + 1;
  std::vector<float> a = test::SymmetricFloats(offset + m * a_stride, 1.0f, rng);
  const std::vector<float> w_src = test::SymmetricFloats(offset + n * w_stride, 1.0f, rng);
  std::vector<uint16_t> w16(w_src.size());
  std::vector<float> w32(w_src.size());
  if (type == DType::kBF16) {
    F32ToBF16(w_src.data(), w16.data(), w_src.size());
    BF16ToF32(w16.data(), w32.data(), w16.size());
  } else {
    F32ToF16(w_src.data(), w16.data(), w_src.size());
    F16ToF32(w16.data(), w32.data(), w16.size());
  }
  const MatrixView av{a.data() + offset, m, k, static_cast<ptrdiff_t>(a_stride), 1};
  // b = w^T: element (p, j) at w[j * w_stride + p].
  const MatrixView b32{w32.data() + offset, k, n, 1, static_cast<ptrdiff_t>(w_stride)};
  const HalfMatrixView b16{w16.data() + offset, type, k, n, 1, static_cast<ptrdiff_t>(w_stride)};

  const size_t ld = (c_col_major ? m : n) + 2;
  const size_t c_size = offset + ld * (c_col_major ? n : m) + 3;
  std::vector<float> c_ref(c_size, kSentinel), c_half(c_size, kSentinel);
  auto view = [&](std::vector<float>& buf) {
    return c_col_major ? MatrixView{buf.data() + offset, m, n, 1, static_cast<ptrdiff_t>(ld)}
                       : MatrixView{buf.data() + offset, m, n, static_cast<ptrdiff_t>(ld), 1};
  };
  // beta 0.5 on a c that holds the same values in both: reads c in both products alike.
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const float x = u(*rng);
      const MatrixView r = view(c_ref), h = view(c_half);
      r.data[static_cast<ptrdiff_t>(i) * r.row_stride + static_cast<ptrdiff_t>(j) * r.col_stride] =
          x;
      h.data[static_cast<ptrdiff_t>(i) * h.row_stride + static_cast<ptrdiff_t>(j) * h.col_stride] =
          x;
    }
  }
  Gemm(0.75f, av, b32, 0.5f, view(c_ref), scratch);
  GemmHalfB(0.75f, av, b16, 0.5f, view(c_half), scratch);
  size_t mismatches = 0;
  for (size_t i = 0; i < c_size; ++i) {
    if (Bits(c_ref[i]) != Bits(c_half[i]) && ++mismatches <= 5) {
      ADD_FAILURE() << "element " << i << ": f32 product " << c_ref[i] << ", 16-bit product "
                    << c_half[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
  if (m <= kGemvMaxRows) {
    // The GEMV path directly, beta 0: c is overwritten (the sentinel inside the view is not read).
    std::vector<float> g_ref(c_size, kSentinel), g_half(c_size, kSentinel);
    Gemv(1.0f, av, b32, 0.0f, view(g_ref));
    GemvHalf(1.0f, av, b16, 0.0f, view(g_half));
    EXPECT_EQ(0, std::memcmp(g_ref.data(), g_half.data(), c_size * sizeof(float)));
  }
}

class GemmHalfTargetTest : public test::PerTargetTest {};

TEST_P(GemmHalfTargetTest, BitwiseEqualToWidenedF32) {
  AlignedScratch scratch(GemmScratchBytes());
  std::mt19937 rng(7);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const size_t shapes[][3] = {{1, 1, 1},     {1, 37, 33},    {3, 70, 129}, {8, 17, 300},
                                {9, 33, 65},   {13, 40, 257},  {64, 48, 64}, {127, 67, 513},
                                {300, 29, 31}, {200, 260, 96}, {5, 1030, 17}};
    for (const auto& s : shapes) {
      for (bool col : {false, true}) {
        CheckCase(type, s[0], s[1], s[2], col, /*offset=*/s[0] % 2 ? 1 : 3, &rng, scratch.data);
      }
    }
  }
}
MHA_INSTANTIATE_PER_TARGET(GemmHalfTargetTest);

}  // namespace
}  // namespace kernels
}  // namespace mha
