// bf16 compute products (kernels/gemm_bf16.h): packing, the driver that rounds a's rows into
// the scratch per k block, the kernel choice, and dynamic dispatch of the emulated block kernel
// (gemm_bf16-inl.h, compiled once per Highway target by foreach_target). The native block
// kernels are in gemm_bf16_avx512.cc, gemm_bf16_amx.cc (x86-64) and gemm_bf16_neon.cc (aarch64).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_bf16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gemm_bf16-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/check.h"
#include "kernels/cpu_features.h"
#include "kernels/elementwise.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"
#include "kernels/pack_bf16.h"
#include "kernels/targets.h"

namespace mha {
namespace kernels {

HWY_EXPORT(Bf16BlockEmulated);

namespace {

// ---------------------------------------------------------------------------------------------
// Kernel choice.

// The NEON kernel exists in aarch64 builds whose compiler takes +bf16 (kernels/meson.build).
bool CpuHasNeonBf16() {
#if defined(MHA_HAVE_BF16_NEON)
  return CpuHasArmBf16();
#else
  return false;
#endif
}

constexpr Bf16Kernel kAllKernels[] = {Bf16Kernel::kEmulated, Bf16Kernel::kAvx512Bf16,
                                      Bf16Kernel::kAmx, Bf16Kernel::kNeonBf16};

// -1: no kernel forced (Bf16DefaultKernel), else a Bf16Kernel.
std::atomic<int> g_forced{-1};

void EmulatedBlock(const Bf16Block& blk) { HWY_DYNAMIC_DISPATCH(Bf16BlockEmulated)(blk); }

// ---------------------------------------------------------------------------------------------
// Rounding and packing.

// f32 -> bf16 through kernels::F32ToBF16 (nearest even, NaN quieted), `n` elements `stride`
// apart (n <= kBf16BlockDepth when strided: gathered into a stack buffer first).
void RoundRow(const float* x, ptrdiff_t stride, size_t n, uint16_t* y) {
  if (stride == 1) {
    F32ToBF16(x, y, n);
    return;
  }
  float buf[kBf16BlockDepth];
  for (size_t done = 0; done < n; done += kBf16BlockDepth) {
    const size_t len = std::min(kBf16BlockDepth, n - done);
    for (size_t j = 0; j < len; ++j) buf[j] = x[static_cast<ptrdiff_t>(done + j) * stride];
    F32ToBF16(buf, y + done, len);
  }
}

// Packs a b [k, n] into dst in the layout of gemm_bf16.h: zeroes the whole packing (the padding
// past k and n), then calls pack_block(pc, kc, block, panel_stride) for each k block: rows
// [pc, pc + kc) into `block`, whose panels are panel_stride elements apart.
template <class PackBlockFn>
PackedBf16B PackBlocks(size_t k, size_t n, uint16_t* dst, const PackBlockFn& pack_block) {
  const size_t panels = (n + kBf16PanelCols - 1) / kBf16PanelCols;
  std::memset(dst, 0, PackedBf16Elements(k, n) * sizeof(uint16_t));
  uint16_t* block = dst;
  for (size_t pc = 0; pc < k; pc += kBf16BlockDepth) {
    const size_t kc = std::min(kBf16BlockDepth, k - pc);
    const size_t panel_stride = RoundUp(kc, kBf16DepthAlign) * kBf16PanelCols;
    pack_block(pc, kc, block, panel_stride);
    block += panels * panel_stride;
  }
  return {dst, k, n, n, 0, k};
}

// Columns of a 16-bit row converted per call in PackBf16BHalf.
constexpr size_t kRowChunk = 256;

}  // namespace

// ---------------------------------------------------------------------------------------------

size_t PackedBf16Elements(size_t k, size_t n) {
  const size_t panels = (n + kBf16PanelCols - 1) / kBf16PanelCols;
  size_t rows = 0;  // every block's aligned depth
  for (size_t pc = 0; pc < k; pc += kBf16BlockDepth) {
    rows += RoundUp(std::min(kBf16BlockDepth, k - pc), kBf16DepthAlign);
  }
  return panels * kBf16PanelCols * rows;  // a multiple of 32 x 32
}

PackedBf16B PackBf16B(const ConstMatrixView& b, uint16_t* dst) {
  return PackBlocks(b.rows, b.cols, dst,
                    [&](size_t pc, size_t kc, uint16_t* block, size_t panel_stride) {
                      PackBF16Block(b.data + static_cast<ptrdiff_t>(pc) * b.row_stride,
                                    b.row_stride, b.col_stride, kc, b.cols, block, panel_stride);
                    });
}

// Creation-time only (16-bit weights of a bf16 layer): a row at a time, element by element.
PackedBf16B PackBf16BHalf(const HalfMatrixView& b, uint16_t* dst) {
  const size_t n = b.cols;
  return PackBlocks(
      b.rows, n, dst, [&](size_t pc, size_t kc, uint16_t* block, size_t panel_stride) {
        uint16_t out[kRowChunk];
        uint16_t half[kRowChunk];
        float wide[kRowChunk];
        for (size_t kk = 0; kk < kc; ++kk) {
          uint16_t* pair_row = block + (kk / 2) * 2 * kBf16PanelCols + kk % 2;
          const uint16_t* row = b.data + static_cast<ptrdiff_t>(pc + kk) * b.row_stride;
          for (size_t j0 = 0; j0 < n; j0 += kRowChunk) {
            const size_t len = std::min(kRowChunk, n - j0);
            const uint16_t* src = row + static_cast<ptrdiff_t>(j0) * b.col_stride;
            if (b.type == DType::kBF16) {
              for (size_t j = 0; j < len; ++j)
                out[j] = src[static_cast<ptrdiff_t>(j) * b.col_stride];
            } else {
              // f16: widened exactly (kernels::F16ToF32), then rounded once.
              for (size_t j = 0; j < len; ++j)
                half[j] = src[static_cast<ptrdiff_t>(j) * b.col_stride];
              F16ToF32(half, wide, len);
              F32ToBF16(wide, out, len);
            }
            for (size_t j = 0; j < len; ++j) {
              const size_t col = j0 + j;
              pair_row[(col / kBf16PanelCols) * panel_stride + (col % kBf16PanelCols) * 2] = out[j];
            }
          }
        }
      });
}

const char* Bf16KernelName(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::kEmulated:
      return "emulated";
    case Bf16Kernel::kAvx512Bf16:
      return "avx512_bf16";
    case Bf16Kernel::kAmx:
      return "amx";
    case Bf16Kernel::kNeonBf16:
      return "neon_bf16";
  }
  return "unknown";
}

bool Bf16KernelAvailable(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::kEmulated:
      return true;
    case Bf16Kernel::kAvx512Bf16: {
      static const bool has = CpuHasAvx512Bf16();
      return has;
    }
    case Bf16Kernel::kAmx: {
#if defined(__x86_64__)  // AmxPermitted is in gemm_bf16_amx.cc, an x86-64 file
      static const bool has = CpuHasAmx() && AmxPermitted();
      return has;
#else
      return false;
#endif
    }
    case Bf16Kernel::kNeonBf16: {
      static const bool has = CpuHasNeonBf16();
      return has;
    }
  }
  return false;
}

Bf16Kernel Bf16DefaultKernel() {
  static const Bf16Kernel kernel = [] {
    if (const char* env = std::getenv("MHA_BF16_KERNEL"); env != nullptr && *env != '\0') {
      for (Bf16Kernel k : kAllKernels) {
        if (std::strcmp(env, Bf16KernelName(k)) != 0) continue;
        if (Bf16KernelAvailable(k)) return k;
        std::fprintf(stderr, "mha: MHA_BF16_KERNEL=%s: this CPU does not run it; ignored\n", env);
        env = nullptr;
        break;
      }
      if (env != nullptr) {
        std::fprintf(stderr,
                     "mha: MHA_BF16_KERNEL=%s: unknown (emulated, avx512_bf16, amx, neon_bf16); "
                     "ignored\n",
                     env);
      }
    }
    for (Bf16Kernel k : {Bf16Kernel::kAmx, Bf16Kernel::kAvx512Bf16, Bf16Kernel::kNeonBf16}) {
      if (Bf16KernelAvailable(k)) return k;
    }
    return Bf16Kernel::kEmulated;
  }();
  return kernel;
}

Bf16Kernel Bf16ActiveKernel() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Bf16Kernel>(forced) : Bf16DefaultKernel();
}

void ForceBf16Kernel(Bf16Kernel kernel) {
  assert(Bf16KernelAvailable(kernel) && "ForceBf16Kernel: kernel not available");
  g_forced.store(kernel == Bf16DefaultKernel() ? -1 : static_cast<int>(kernel),
                 std::memory_order_relaxed);
  AdvanceDispatchEpoch();
}

Bf16BlockFn Bf16BlockFnOf(Bf16Kernel kernel) {
  switch (kernel) {
#if defined(__x86_64__)
    case Bf16Kernel::kAvx512Bf16:
      return &Bf16BlockAvx512;
    case Bf16Kernel::kAmx:
      return &Bf16BlockAmx;
#endif
#if defined(__aarch64__) && defined(MHA_HAVE_BF16_NEON)
    case Bf16Kernel::kNeonBf16:
      return &Bf16BlockNeon;
#endif
    default:
      return &EmulatedBlock;
  }
}

void RoundRowsForKernel(Bf16Kernel kernel, const float* x, ptrdiff_t row_stride,
                        ptrdiff_t col_stride, size_t rows, size_t kc, size_t depth, uint16_t* dst) {
  if (col_stride != 1) {
    for (size_t i = 0; i < rows; ++i) {
      uint16_t* y = dst + i * depth;
      RoundRow(x + static_cast<ptrdiff_t>(i) * row_stride, col_stride, kc, y);
      std::memset(y + kc, 0, (depth - kc) * sizeof(uint16_t));
    }
    return;
  }
#if defined(__x86_64__)
  // The x86 kernels read bf16 subnormals as zero: their rows may round with the instruction.
  if (kernel == Bf16Kernel::kAmx || kernel == Bf16Kernel::kAvx512Bf16) {
    RoundRowsToBF16Flushed(x, row_stride, rows, kc, depth, dst, depth);
    return;
  }
#else
  (void)kernel;
#endif
  RoundRowsToBF16(x, row_stride, rows, kc, depth, dst, depth);
}

size_t GemmBf16ScratchBytes() { return kBf16ChunkRowsBytes + kBf16BlockScratchBytes; }

void GemmBf16PackedB(Bf16Kernel kernel, float alpha, const ConstMatrixView& a, const PackedBf16B& b,
                     float beta, const float* bias, const MatrixView& c, void* scratch) {
  assert(a.rows == c.rows && "GemmBf16PackedB: a.rows must equal c.rows");
  assert(b.n == c.cols && "GemmBf16PackedB: b.n must equal c.cols");
  assert(a.cols == b.k && "GemmBf16PackedB: a.cols must equal b.k");
  assert(b.col0 + b.n <= b.packed_n && "GemmBf16PackedB: columns past the packing");
  assert(b.col0 % kBf16PanelCols == 0 && "GemmBf16PackedB: col0 must be a multiple of 32");
  assert(reinterpret_cast<uintptr_t>(scratch) % 64 == 0 && "GemmBf16PackedB: scratch alignment");
  const size_t m = c.rows, n = c.cols, k = b.k;
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    ScaleC(beta, c);
    if (bias == nullptr) return;
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) {
        float& x = c.data[static_cast<ptrdiff_t>(i) * c.row_stride +
                          static_cast<ptrdiff_t>(j) * c.col_stride];
        x = x + bias[j];
      }
    }
    return;
  }
  MHA_CHECK(Bf16KernelAvailable(kernel), "GemmBf16PackedB: the kernel must run on this CPU");
  const Bf16BlockFn block_fn = Bf16BlockFnOf(kernel);
  // The AMX kernel starts its tiles from the bias (gemm_bf16.h, Numerics): it takes the bias
  // with the first k block where it does so, the others with the last.
  const bool bias_first =
      kernel == Bf16Kernel::kAmx && alpha == 1.0f && beta == 0.0f && c.col_stride == 1;
  uint16_t* a_rows = static_cast<uint16_t*>(scratch);
  const size_t panels = (b.packed_n + kBf16PanelCols - 1) / kBf16PanelCols;
  Bf16Block blk;
  blk.n = n;
  blk.c_cs = c.col_stride;
  blk.c_rs = c.row_stride;
  blk.alpha = alpha;
  blk.beta = beta;
  blk.scratch = static_cast<char*>(scratch) + kBf16ChunkRowsBytes;
  for (size_t i0 = 0; i0 < m; i0 += kBf16ChunkRows) {
    const size_t rows = std::min(kBf16ChunkRows, m - i0);
    const uint16_t* packed_block = b.data;  // the current k block of the packing
    for (size_t pc = 0; pc < k; pc += kBf16BlockDepth) {
      const size_t kc = std::min(kBf16BlockDepth, k - pc);
      const size_t depth = RoundUp(kc, kBf16DepthAlign);
      // The packing's depth of this block (a Rows view: the whole one-block packing's).
      const size_t packed_depth = RoundUp(
          std::min(kBf16BlockDepth, b.packed_k - std::min(pc, b.packed_k)), kBf16DepthAlign);
      assert(packed_depth >= depth && "GemmBf16PackedB: rows past the packing");
      const size_t panel_stride = packed_depth * kBf16PanelCols;
      const float* a_block = a.data + static_cast<ptrdiff_t>(i0) * a.row_stride +
                             static_cast<ptrdiff_t>(pc) * a.col_stride;
      RoundRowsForKernel(kernel, a_block, a.row_stride, a.col_stride, rows, kc, depth, a_rows);
      blk.a = a_rows;
      blk.lda = depth;
      blk.m = rows;
      blk.depth = depth;
      blk.b = packed_block + (b.col0 / kBf16PanelCols) * panel_stride;
      blk.panel_stride = panel_stride;
      blk.c = c.data + static_cast<ptrdiff_t>(i0) * c.row_stride;
      blk.first = pc == 0;
      blk.beta = pc == 0 ? beta : 1.0f;
      blk.bias = (bias_first ? pc == 0 : pc + kc == k) ? bias : nullptr;
      block_fn(blk);
      packed_block += panels * panel_stride;
    }
  }
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
