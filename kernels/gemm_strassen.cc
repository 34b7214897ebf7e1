// One-level Strassen-Winograd product over packed operands: the block sums of b at packing
// time (plain loops, once per weight matrix), then per call a's four sums and the seven products
// on the direct micro-kernel, which also combines them (its second destination).
#include "kernels/gemm_strassen.h"

#include <cassert>

#include "kernels/elementwise.h"
#include "kernels/gemm_direct.h"

namespace mha {
namespace kernels {

namespace {

// dst [rows, cols] (row stride cols) = x - y, element-wise, for views with any strides.
void Difference(const ConstMatrixView& x, const ConstMatrixView& y, float* dst) {
  for (size_t i = 0; i < x.rows; ++i) {
    for (size_t j = 0; j < x.cols; ++j) {
      const ptrdiff_t xi =
          static_cast<ptrdiff_t>(i) * x.row_stride + static_cast<ptrdiff_t>(j) * x.col_stride;
      const ptrdiff_t yi =
          static_cast<ptrdiff_t>(i) * y.row_stride + static_cast<ptrdiff_t>(j) * y.col_stride;
      dst[i * x.cols + j] = x.data[xi] - y.data[yi];
    }
  }
}

}  // namespace

size_t StrassenPackedBFloats(size_t k, size_t n) { return 7 * PackedBFloats(k / 2, n / 2); }

size_t StrassenPackTmpFloats(size_t k, size_t n) { return 2 * (k / 2) * (n / 2); }

StrassenPackedB PackBStrassen(const ConstMatrixView& b, float* dst, float* tmp) {
  assert(b.rows % 2 == 0 && b.cols % 2 == 0 && b.rows > 0 && b.cols > 0 &&
         "PackBStrassen: b needs even, non-zero rows and columns");
  const size_t k2 = b.rows / 2, n2 = b.cols / 2;
  const ConstMatrixView b11 = b.Block(0, 0, k2, n2), b12 = b.Block(0, n2, k2, n2);
  const ConstMatrixView b21 = b.Block(k2, 0, k2, n2), b22 = b.Block(k2, n2, k2, n2);
  float* const t_a = tmp;
  float* const t_b = tmp + k2 * n2;
  const ConstMatrixView va{t_a, k2, n2, static_cast<ptrdiff_t>(n2), 1};
  const ConstMatrixView vb{t_b, k2, n2, static_cast<ptrdiff_t>(n2), 1};
  const size_t stride = PackedBFloats(k2, n2);
  StrassenPackedB s;
  s.op[0] = PackB(b11, dst + 0 * stride);
  s.op[1] = PackB(b21, dst + 1 * stride);
  s.op[2] = PackB(b22, dst + 2 * stride);
  Difference(b12, b11, t_a);  // T1
  s.op[4] = PackB(va, dst + 4 * stride);
  Difference(b22, va, t_b);  // T2 = B22 - T1
  s.op[5] = PackB(vb, dst + 5 * stride);
  Difference(vb, b21, t_a);  // T4 = T2 - B21
  s.op[3] = PackB(va, dst + 3 * stride);
  Difference(b22, b12, t_a);  // T3
  s.op[6] = PackB(va, dst + 6 * stride);
  return s;
}

size_t StrassenSumsFloats(size_t m, size_t k) { return 4 * (m / 2) * (k / 2); }

StrassenA StrassenSumsOfA(const ConstMatrixView& a, float* sums) {
  assert(a.rows % 2 == 0 && a.cols % 2 == 0 && "StrassenSumsOfA: a needs even rows and columns");
  assert(a.col_stride == 1 && "StrassenSumsOfA: a needs unit column stride");
  const size_t h = a.rows / 2, k2 = a.cols / 2;
  const ptrdiff_t lds = static_cast<ptrdiff_t>(k2);
  StrassenA s;
  s.a11 = a.Block(0, 0, h, k2);
  s.a12 = a.Block(0, k2, h, k2);
  s.a21 = a.Block(h, 0, h, k2);
  s.a22 = a.Block(h, k2, h, k2);
  float* const s1 = sums;
  float* const s2 = sums + h * k2;
  float* const s3 = sums + 2 * h * k2;
  float* const s4 = sums + 3 * h * k2;
  WinogradSums(a.data, a.row_stride, h, k2, s1, s2, s3, s4, lds);
  s.s1 = {s1, h, k2, lds, 1};
  s.s2 = {s2, h, k2, lds, 1};
  s.s3 = {s3, h, k2, lds, 1};
  s.s4 = {s4, h, k2, lds, 1};
  return s;
}

bool GemmStrassenPackedB(const StrassenA& a, const StrassenPackedB& b, const float* bias_left,
                         const float* bias_right, const MatrixView& c_left,
                         const MatrixView& c_right) {
  const size_t h = a.a11.rows, n2 = b.half_n();
  assert(a.a11.cols == b.half_k() && "GemmStrassenPackedB: a's blocks must be b.half_k() deep");
  assert(c_left.rows == 2 * h && c_right.rows == 2 * h && "GemmStrassenPackedB: c rows");
  assert(c_left.cols == n2 && c_right.cols == n2 && "GemmStrassenPackedB: c columns");
  assert(c_left.col_stride == 1 && c_right.col_stride == 1 &&
         "GemmStrassenPackedB: c needs unit column stride");
  if (!GemmDirectSupported()) return false;
  if (h == 0 || n2 == 0) return true;

  // C11 = U1 = P1 + P2, C12 = U5 = U4 + P3, C21 = U6 = U3 - P4, C22 = U7 = U3 + P5 with
  // U2 = P1 + P6, U3 = U2 + P7, U4 = U2 + P5. The c blocks hold the partial sums; a partial
  // product that two of them need is stored to both by the kernel (GemmDirectPackedBDual).
  const MatrixView x11 = c_left.Block(0, 0, h, n2), x21 = c_left.Block(h, 0, h, n2);
  const MatrixView x12 = c_right.Block(0, 0, h, n2), x22 = c_right.Block(h, 0, h, n2);
  const SecondStore kCopy = SecondStore::kCopy;
  bool ok = GemmDirectPackedBDual(1.0f, a.a11, b.op[0], 0.0f, nullptr, kCopy, x11, x12);  // P1
  ok &= GemmDirectPackedB(1.0f, a.a12, b.op[1], 1.0f, bias_left, x11);  // X11 = P1 + P2 = C11
  ok &= GemmDirectPackedBDual(1.0f, a.s2, b.op[5], 1.0f, nullptr, kCopy, x12, x21);  // U2
  ok &= GemmDirectPackedBDual(1.0f, a.s3, b.op[6], 1.0f, nullptr, kCopy, x21, x22);  // U3
  // X22 = U3 + P5 = C22 (with its bias), X12 = U2 + P5 = U4.
  ok &= GemmDirectPackedBDual(1.0f, a.s1, b.op[4], 1.0f, bias_right, SecondStore::kAdd, x22, x12);
  ok &= GemmDirectPackedB(1.0f, a.s4, b.op[2], 1.0f, bias_right, x12);   // X12 = U4 + P3 = C12
  ok &= GemmDirectPackedB(-1.0f, a.a22, b.op[3], 1.0f, bias_left, x21);  // X21 = U3 - P4 = C21
  return ok;
}

}  // namespace kernels
}  // namespace mha
