// bf16 compute products by quantized weights (kernels/gemm_bf16_quant.h): a's transpose packed
// for the block kernels, and the driver that dequantizes w's rows per k block into the kernel's
// a rows.
#include "kernels/gemm_bf16_quant.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "kernels/check.h"
#include "kernels/gemm_bf16_native.h"

namespace mha {
namespace kernels {

namespace {

// Rows of w dequantized to f32 per call of DequantizeRows (a 16 KiB stack buffer).
constexpr size_t kDequantRows = 8;

}  // namespace

PackedBf16B PackBf16Transposed(Bf16Kernel kernel, const ConstMatrixView& a, uint16_t* dst) {
  const size_t m = a.rows, k = a.cols;
  std::memset(dst, 0, PackedBf16Elements(k, m) * sizeof(uint16_t));
  const size_t panels = (m + kBf16PanelCols - 1) / kBf16PanelCols;
  uint16_t row[kBf16BlockDepth];
  uint16_t* block = dst;
  for (size_t pc = 0; pc < k; pc += kBf16BlockDepth) {
    const size_t kc = std::min(kBf16BlockDepth, k - pc);
    const size_t panel_stride = RoundUp(kc, kBf16DepthAlign) * kBf16PanelCols;
    for (size_t i = 0; i < m; ++i) {
      // Row i of a is column i of a^T: its pairs (k even, k odd) are one 32-bit word each, one
      // pair row (2 x kBf16PanelCols elements) apart.
      RoundRowsForKernel(kernel,
                         a.data + static_cast<ptrdiff_t>(i) * a.row_stride +
                             static_cast<ptrdiff_t>(pc) * a.col_stride,
                         a.row_stride, a.col_stride, 1, kc, kc, row);
      uint16_t* col = block + (i / kBf16PanelCols) * panel_stride + (i % kBf16PanelCols) * 2;
      size_t kk = 0;
      for (; kk + 1 < kc; kk += 2) std::memcpy(col + kk * kBf16PanelCols, row + kk, 4);
      if (kk < kc) col[kk * kBf16PanelCols] = row[kk];
    }
    block += panels * panel_stride;
  }
  return {dst, k, m, m, 0, k};
}

size_t GemmBf16QuantScratchBytes(size_t m) {
  return GemmBf16ScratchBytes() + RoundUp(kBf16ChunkRows * m * sizeof(float), 64);
}

void GemmBf16QuantB(Bf16Kernel kernel, const PackedBf16B& at, const QuantMatrix& w,
                    const float* bias, const MatrixView& c, void* scratch) {
  const size_t m = c.rows, n = c.cols, k = w.cols;
  assert(w.rows == n && "GemmBf16QuantB: w.rows must equal c.cols");
  assert(at.n == m && at.k == k && at.col0 == 0 && at.packed_k == k &&
         "GemmBf16QuantB: at must be a's transpose packed whole");
  assert(reinterpret_cast<uintptr_t>(scratch) % 64 == 0 && "GemmBf16QuantB: scratch alignment");
  if (m == 0 || n == 0) return;
  const auto at_c = [&](size_t i, size_t j) -> float& {
    return c.data[static_cast<ptrdiff_t>(i) * c.row_stride +
                  static_cast<ptrdiff_t>(j) * c.col_stride];
  };
  if (k == 0) {
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) at_c(i, j) = bias != nullptr ? 0.0f + bias[j] : 0.0f;
    }
    return;
  }
  MHA_CHECK(Bf16KernelAvailable(kernel), "GemmBf16QuantB: the kernel must run on this CPU");
  const Bf16BlockFn block_fn = Bf16BlockFnOf(kernel);
  // Scratch: w's rows of the chunk in bf16 [kBf16ChunkRows, depth], the kernel's own bytes, then
  // the chunk's c^T [kBf16ChunkRows, m] f32, summed in place over the k blocks.
  uint16_t* w_rows = static_cast<uint16_t*>(scratch);
  float* ct = reinterpret_cast<float*>(static_cast<char*>(scratch) + GemmBf16ScratchBytes());
  const size_t panels = (m + kBf16PanelCols - 1) / kBf16PanelCols;
  float wide[kDequantRows * kBf16BlockDepth];
  Bf16Block blk;
  blk.n = m;
  blk.c = ct;
  blk.c_rs = static_cast<ptrdiff_t>(m);
  blk.c_cs = 1;
  blk.alpha = 1.0f;
  blk.scratch = static_cast<char*>(scratch) + kBf16ChunkRowsBytes;
  for (size_t j0 = 0; j0 < n; j0 += kBf16ChunkRows) {
    const size_t rows = std::min(kBf16ChunkRows, n - j0);
    const uint16_t* packed_block = at.data;  // the current k block of a^T's packing
    for (size_t pc = 0; pc < k; pc += kBf16BlockDepth) {
      const size_t kc = std::min(kBf16BlockDepth, k - pc);
      const size_t depth = RoundUp(kc, kBf16DepthAlign);
      for (size_t r = 0; r < rows; r += kDequantRows) {
        const size_t count = std::min(kDequantRows, rows - r);
        DequantizeRows(w, j0 + r, count, pc, kc, wide, kBf16BlockDepth);
        RoundRowsForKernel(kernel, wide, static_cast<ptrdiff_t>(kBf16BlockDepth), 1, count, kc,
                           depth, w_rows + r * depth);
      }
      blk.a = w_rows;
      blk.lda = depth;
      blk.m = rows;
      blk.depth = depth;
      blk.b = packed_block;
      blk.panel_stride = depth * kBf16PanelCols;
      blk.first = pc == 0;
      blk.beta = pc == 0 ? 0.0f : 1.0f;
      block_fn(blk);
      packed_block += panels * blk.panel_stride;
    }
    // c[i, j0 + r] = c^T[r, i] (+ bias).
    for (size_t i = 0; i < m; ++i) {
      for (size_t r = 0; r < rows; ++r) {
        const float x = ct[r * m + i];
        at_c(i, j0 + r) = bias != nullptr ? x + bias[j0 + r] : x;
      }
    }
  }
}

}  // namespace kernels
}  // namespace mha
