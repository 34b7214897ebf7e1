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

bool GemmPackedBDirectSupported() {
  return HWY_DYNAMIC_DISPATCH(PackedBDirectSupported)(GemmBlocking().nr);
}

bool GemmPackedBDirect(float alpha, const MatrixView& a, const PackedB& b, float beta,
                       const MatrixView& c, const float* bias) {
  assert(a.rows == c.rows && "GemmPackedBDirect: a.rows must equal c.rows");
  assert(b.n == c.cols && "GemmPackedBDirect: b.n must equal c.cols");
  assert(a.cols == b.k && "GemmPackedBDirect: a.cols must equal b.k");
  assert(b.col0 + b.n <= b.packed_n && "GemmPackedBDirect: columns past the packing");
  assert(b.k <= b.packed_k && "GemmPackedBDirect: rows past the packing");
  const GemmBlocks& blk = GemmBlocking();
  assert(b.col0 % blk.nr == 0 && "GemmPackedBDirect: col0 must be a multiple of NR");
  if (!GemmPackedBDirectSupported()) return false;
  if (c.rows == 0 || c.cols == 0) return true;
  if (b.k == 0 || alpha == 0.0f) {
    ScaleC(beta, c);
    if (bias != nullptr) {
      for (size_t i = 0; i < c.rows; ++i) {
        for (size_t j = 0; j < c.cols; ++j) {
          c.data[static_cast<ptrdiff_t>(i) * c.row_stride +
                 static_cast<ptrdiff_t>(j) * c.col_stride] += bias[j];
        }
      }
    }
    return true;
  }
  return HWY_DYNAMIC_DISPATCH(PackedBDirect)(
      c.rows, c.cols, b.k, alpha, a.data, a.row_stride, a.col_stride, b.data, b.col0, b.packed_n,
      b.packed_k, blk.nr, blk.packnr, blk.kc, beta, c.data, c.row_stride, c.col_stride, bias);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
