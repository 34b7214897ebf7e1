// Dynamic dispatch of the int8-activation products (gemv_int8.h): gemv_int8-inl.h is compiled
// once per Highway target (foreach_target); the per-ISA kernels (gemv_int8_avx512vnni.cc,
// gemv_int8_avx2.cc, gemv_int8_neon_dotprod.cc) are chosen here after a CPU check
// (cpu_features.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemv_int8.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gemv_int8-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <cassert>

#include "kernels/check.h"
#include "kernels/cpu_features.h"
#include "kernels/gemv_int8.h"
#include "kernels/gemv_int8_native.h"
#include "kernels/targets.h"

namespace mha {
namespace kernels {

HWY_EXPORT(QuantizeActivationsInt8Impl);
HWY_EXPORT(GemvInt8PortableImpl);

namespace {

size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

Int8ActLayout Int8ActLayoutOf(DType type, size_t block, size_t k) {
  Int8ActLayout lay;
  lay.unit = kI4Group;
  lay.units = (k + lay.unit - 1) / lay.unit;
  lay.block = type == DType::kI8 ? kI4Block : block;
  lay.scales_per_unit = 4;
  lay.scales_offset = RoundUp64(lay.units * lay.unit);
  lay.sums_offset = lay.scales_offset + RoundUp64(lay.units * lay.scales_per_unit * sizeof(float));
  lay.row_bytes = lay.sums_offset + RoundUp64(lay.units * 16 * sizeof(int32_t));
  return lay;
}

void QuantizeActivationsInt8(const float* a, size_t lda, size_t rows, size_t k, DType type,
                             size_t block, uint8_t* dst) {
  HWY_DYNAMIC_DISPATCH(QuantizeActivationsInt8Impl)(a, lda, rows, k, type, block, dst);
}

bool Int8KernelAvailable(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::kAuto:
    case Int8Kernel::kPortable:
      return true;
    case Int8Kernel::kAvx2: {
      static const bool has = CpuHasAvx2();
      return has;
    }
    case Int8Kernel::kAvx512Vnni: {
      static const bool has = CpuHasAvx512Vnni();
      return has;
    }
    case Int8Kernel::kNeonDotProd: {
      static const bool has = CpuHasArmDotProd();
      return has;
    }
  }
  return false;
}

const char* Int8KernelName(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::kAuto:
      return "auto";
    case Int8Kernel::kPortable:
      return "portable";
    case Int8Kernel::kAvx2:
      return "avx2";
    case Int8Kernel::kAvx512Vnni:
      return "avx512_vnni";
    case Int8Kernel::kNeonDotProd:
      return "neon_dotprod";
  }
  return "unknown";
}

Int8Kernel Int8ActiveKernel() {
#if defined(__x86_64__)
  const int64_t target = ActiveTarget();
  if (target == HWY_AVX3_DL && Int8KernelAvailable(Int8Kernel::kAvx512Vnni)) {
    return Int8Kernel::kAvx512Vnni;
  }
  if ((target == HWY_AVX3_DL || target == HWY_AVX3 || target == HWY_AVX2) &&
      Int8KernelAvailable(Int8Kernel::kAvx2)) {
    return Int8Kernel::kAvx2;
  }
#elif defined(__aarch64__)
  // Every aarch64 Highway target, SVE's and SCALAR's too: the NEON kernel reads 128-bit halves.
  if (Int8KernelAvailable(Int8Kernel::kNeonDotProd)) return Int8Kernel::kNeonDotProd;
#endif
  return Int8Kernel::kPortable;
}

Int8FewRows Int8FewRowsOnThisCpu() {
  static const Int8FewRows choice = CpuHasAmx() ? Int8FewRows::kTiled : Int8FewRows::kOneWeightRow;
  return choice;
}

void GemvInt8Rows(Int8Kernel kernel, const uint8_t* qa, size_t rows, const QuantMatrix& w,
                  const MatrixView& c, Int8FewRows few_rows) {
  assert(c.rows == rows && c.cols == w.rows && "GemvInt8Rows: c must be [rows, w.rows]");
  if (rows == 0 || w.rows == 0) return;
  if (kernel == Int8Kernel::kAuto) kernel = Int8ActiveKernel();
  MHA_CHECK(Int8KernelAvailable(kernel), "GemvInt8Rows: the kernel must run on this CPU");
  (void)few_rows;  // the VNNI kernel's choice only
#if defined(__x86_64__)
  if (kernel == Int8Kernel::kAvx512Vnni) {
    GemvInt8Avx512Vnni(qa, rows, w, c,
                       few_rows == Int8FewRows::kAuto ? Int8FewRowsOnThisCpu() : few_rows);
    return;
  }
  if (kernel == Int8Kernel::kAvx2) {
    GemvInt8Avx2(qa, rows, w, c);
    return;
  }
#elif defined(__aarch64__)
  if (kernel == Int8Kernel::kNeonDotProd) {
    GemvInt8NeonDotProd(qa, rows, w, c);
    return;
  }
#endif
  HWY_DYNAMIC_DISPATCH(GemvInt8PortableImpl)(qa, rows, w, c.data, c.row_stride, c.col_stride);
}

void GemmInt8(const ConstMatrixView& a, const QuantMatrix& w, const MatrixView& c, void* scratch) {
  assert(a.rows == c.rows && "GemmInt8: a.rows must equal c.rows");
  assert(w.rows == c.cols && "GemmInt8: w.rows must equal c.cols");
  assert(a.cols == w.cols && "GemmInt8: a.cols must equal w.cols");
  assert(a.col_stride == 1 && "GemmInt8: needs a.col_stride == 1");
  if (c.rows == 0 || c.cols == 0) return;
  const Int8ActLayout lay = Int8ActLayoutOf(w.type, w.block, w.cols);
  const size_t block_rows = std::max<size_t>(1, GemmScratchBytes() / lay.row_bytes);
  MHA_CHECK(lay.row_bytes <= GemmScratchBytes(), "GemmInt8: a quantized row must fit the scratch");
  uint8_t* qa = static_cast<uint8_t*>(scratch);
  for (size_t i0 = 0; i0 < a.rows; i0 += block_rows) {
    const size_t rows = std::min(block_rows, a.rows - i0);
    QuantizeActivationsInt8(a.data + static_cast<ptrdiff_t>(i0) * a.row_stride,
                            static_cast<size_t>(a.row_stride), rows, a.cols, w.type, w.block, qa);
    GemvInt8Rows(Int8Kernel::kAuto, qa, rows, w, c.Block(i0, 0, rows, c.cols));
  }
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
