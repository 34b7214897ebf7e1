// Dynamic dispatch of the direct micro-kernel over packed b: gemm_direct-inl.h is compiled once
// per Highway target (foreach_target); one dispatch per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_direct.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gemm_direct-inl.h"

#if HWY_ONCE
#include <cassert>

#include "kernels/gemm_direct.h"

namespace mha {
namespace kernels {

HWY_EXPORT(PackedBDirectSupported);
HWY_EXPORT(PackedBDirect);

bool GemmDirectRunsPanels(size_t nr) { return HWY_DYNAMIC_DISPATCH(PackedBDirectSupported)(nr); }

bool GemmDirectSupported() { return GemmDirectRunsPanels(GemmBlocking().nr); }

namespace {

// GemmDirectPackedB, with a second destination when c2 is not null (GemmDirectPackedBDual).
bool Direct(float alpha, const ConstMatrixView& a, const PackedB& b, float beta,
            const MatrixView& c, const float* bias, SecondStore mode, const MatrixView* c2) {
  assert(a.rows == c.rows && "GemmDirectPackedB: a.rows must equal c.rows");
  assert(b.n == c.cols && "GemmDirectPackedB: b.n must equal c.cols");
  assert(a.cols == b.k && "GemmDirectPackedB: a.cols must equal b.k");
  assert(b.col0 + b.n <= b.packed_n && "GemmDirectPackedB: columns past the packing");
  assert(b.k <= b.packed_k && "GemmDirectPackedB: rows past the packing");
  const GemmBlocks& blk = GemmBlocking();
  assert(b.col0 % blk.nr == 0 && "GemmDirectPackedB: col0 must be a multiple of NR");
  if (!GemmDirectSupported()) return false;
  if (c.rows == 0 || c.cols == 0) return true;
  if (b.k == 0 || alpha == 0.0f) {
    // The product is zero: kAdd leaves c2 as it is.
    ScaleC(beta, c);
    const bool copy = c2 != nullptr && mode == SecondStore::kCopy;
    if (bias == nullptr && !copy) return true;
    for (size_t i = 0; i < c.rows; ++i) {
      for (size_t j = 0; j < c.cols; ++j) {
        float& x = c.data[static_cast<ptrdiff_t>(i) * c.row_stride +
                          static_cast<ptrdiff_t>(j) * c.col_stride];
        if (bias != nullptr) x += bias[j];
        if (copy) {
          c2->data[static_cast<ptrdiff_t>(i) * c2->row_stride +
                   static_cast<ptrdiff_t>(j) * c2->col_stride] = x;
        }
      }
    }
    return true;
  }
  float* c2_data = nullptr;
  ptrdiff_t c2_rs = 0;
  if (c2 != nullptr) {
    assert(c2->rows == c.rows && c2->cols == c.cols && "GemmDirectPackedBDual: c2's shape");
    c2_data = c2->data;
    c2_rs = c2->row_stride;
    // The kernel steps both destinations with one column stride: where they differ (never in
    // mha's callers), run it twice with the same operations instead.
    if (c2->col_stride != c.col_stride) {
      if (mode == SecondStore::kAdd) {
        if (!Direct(alpha, a, b, 1.0f, *c2, nullptr, mode, nullptr)) return false;
        return Direct(alpha, a, b, beta, c, bias, mode, nullptr);
      }
      if (!Direct(alpha, a, b, beta, c, bias, mode, nullptr)) return false;
      for (size_t i = 0; i < c.rows; ++i) {
        for (size_t j = 0; j < c.cols; ++j) {
          c2->data[static_cast<ptrdiff_t>(i) * c2->row_stride +
                   static_cast<ptrdiff_t>(j) * c2->col_stride] =
              c.data[static_cast<ptrdiff_t>(i) * c.row_stride +
                     static_cast<ptrdiff_t>(j) * c.col_stride];
        }
      }
      return true;
    }
  }
  return HWY_DYNAMIC_DISPATCH(PackedBDirect)(
      c.rows, c.cols, b.k, alpha, a.data, a.row_stride, a.col_stride, b.data, b.col0, b.packed_n,
      b.packed_k, blk.nr, blk.packnr, blk.kc, beta, c.data, c.row_stride, c.col_stride, bias,
      c2_data, c2_rs, mode == SecondStore::kAdd);
}

}  // namespace

bool GemmDirectPackedB(float alpha, const ConstMatrixView& a, const PackedB& b, float beta,
                       const float* bias, const MatrixView& c) {
  return Direct(alpha, a, b, beta, c, bias, SecondStore::kCopy, nullptr);
}

bool GemmDirectPackedB(float alpha, const ConstMatrixView& a, const PackedB& b, float beta,
                       const MatrixView& c) {
  return Direct(alpha, a, b, beta, c, nullptr, SecondStore::kCopy, nullptr);
}

bool GemmDirectPackedBDual(float alpha, const ConstMatrixView& a, const PackedB& b, float beta,
                           const float* bias, SecondStore mode, const MatrixView& c,
                           const MatrixView& c2) {
  return Direct(alpha, a, b, beta, c, bias, mode, &c2);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
