// Rounding f32 operands to bf16 for the bf16 compute products (gemm_bf16.h): rows of a into
// bf16 rows, and one k block of b into the packed pair-row layout. Every value is rounded as
// kernels::F32ToBF16 rounds it (nearest even, NaN quieted), bitwise the same on every target.
// Plain declarations; per-target code in pack_bf16-inl.h, dispatch in pack_bf16.cc.
//
// Why a kernel of its own: the products round a on every call and the attention core packs K^T
// and V of every key block, so rounding runs as often as the products; element by element with
// a dispatch per row it took a third of a bf16 forward's time (perf, (8, 512, 768, 12)).
#ifndef MHA_KERNELS_PACK_BF16_H_
#define MHA_KERNELS_PACK_BF16_H_

#include <cstddef>
#include <cstdint>

namespace mha {
namespace kernels {

// dst row i (dst_stride elements apart) = bf16(a row i)[0, cols), then zeros up to `padded`
// (>= cols). a's rows are contiguous, row_stride elements apart.
void RoundRowsToBF16(const float* a, ptrdiff_t row_stride, size_t rows, size_t cols, size_t padded,
                     uint16_t* dst, size_t dst_stride);

// One k block of a bf16 packing (gemm_bf16.h's layout): b [kc, n] with element (kk, j) at
// b[kk * row_stride + j * col_stride], rounded into `block`, whose panels are panel_stride
// elements apart (pair rows of kBf16PanelCols x 2). Writes only b's elements: the padding (past
// kc or n) must already be zero.
void PackBF16Block(const float* b, ptrdiff_t row_stride, ptrdiff_t col_stride, size_t kc, size_t n,
                   uint16_t* block, size_t panel_stride);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_PACK_BF16_H_
