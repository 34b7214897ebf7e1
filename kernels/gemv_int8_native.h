// What the per-ISA int8-activation kernels (gemv_int8_avx512vnni.cc, gemv_int8_avx2.cc,
// gemv_int8_neon_dotprod.cc) share: their call's operands and cache blocking, and their entry
// points. Internal to kernels/; the contract is GemvInt8Rows' (gemv_int8.h), and each runs only
// after Int8KernelAvailable.
#ifndef MHA_KERNELS_GEMV_INT8_NATIVE_H_
#define MHA_KERNELS_GEMV_INT8_NATIVE_H_

#include <cstddef>
#include <cstdint>

#include "kernels/gemv_int8.h"

namespace mha {
namespace kernels {

// One GemvInt8Rows call: rows of quantized activations (qa, laid out as *lay), the weights, c.
struct Int8Call {
  const uint8_t* qa;
  const Int8ActLayout* lay;
  const QuantMatrix* w;
  float* c;
  ptrdiff_t c_rs, c_cs;

  const uint8_t* Row(size_t i) const { return qa + i * lay->row_bytes; }
  float& Out(size_t i, size_t r) const {
    return c[static_cast<ptrdiff_t>(i) * c_rs + static_cast<ptrdiff_t>(r) * c_cs];
  }
};

// Activation rows per cache block: 32 quantized rows of k 4096 are 208 KiB (L2); the kernels run
// each weight tile (in L1) against a block's row tiles, so the weights come from memory once per
// block.
inline constexpr size_t kInt8BlockRows = 32;

// x86-64 only.
void GemvInt8Avx512Vnni(const uint8_t* qa, size_t rows, const QuantMatrix& w, const MatrixView& c,
                        Int8FewRows few_rows);  // never kAuto
void GemvInt8Avx2(const uint8_t* qa, size_t rows, const QuantMatrix& w, const MatrixView& c);

// aarch64 only (FEAT_DotProd: cpu_features.h's CpuHasArmDotProd).
void GemvInt8NeonDotProd(const uint8_t* qa, size_t rows, const QuantMatrix& w, const MatrixView& c);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMV_INT8_NATIVE_H_
