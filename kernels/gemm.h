// GEMM over strided f32 matrix views, a thin wrapper over BLIS's typed expert API
// (bli_sgemm_ex). Transposes are expressed by swapping a view's strides, so per-head views of a
// [tokens, heads * head_dim] buffer and K^T need no copy.
//
// BLIS is always called single-threaded (an rntm_t with one thread): mha's own thread pool owns
// the threads, and BLIS 0.9.0 would otherwise create threads on every multithreaded call.
// Thread safety: Debian's libblis4-pthread build initializes itself under pthread_once and
// guards its packing-buffer pools with mutexes, so concurrent calls from several threads are
// safe (tests/gemm_test.cc runs them concurrently, and the TSan build checks it).
#ifndef MHA_KERNELS_GEMM_H_
#define MHA_KERNELS_GEMM_H_

#include <cstddef>

namespace mha {
namespace kernels {

// A rows x cols matrix; element (i, j) at data[i * row_stride + j * col_stride]. Strides in
// elements. A view with row_stride 1 and col_stride = rows is column-major; swapping the two
// strides (and rows/cols) transposes the view.
struct MatrixView {
  float* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  ptrdiff_t row_stride = 0;
  ptrdiff_t col_stride = 1;

  MatrixView Transposed() const { return {data, cols, rows, col_stride, row_stride}; }
  // The sub-block starting at (r0, c0) of size nr x nc.
  MatrixView Block(size_t r0, size_t c0, size_t nr, size_t nc) const {
    return {data + static_cast<ptrdiff_t>(r0) * row_stride +
                static_cast<ptrdiff_t>(c0) * col_stride,
            nr, nc, row_stride, col_stride};
  }
};

// c = alpha * a * b + beta * c, single-threaded. Shapes: a [m, k], b [k, n], c [m, n].
// beta == 0 overwrites c without reading it (NaN in c does not propagate). Shape mismatches are a
// programming error in mha (callers validate): checked by debug asserts.
void Gemm(float alpha, const MatrixView& a, const MatrixView& b, float beta, const MatrixView& c);

// Makes sure BLIS is initialized (its lazy, once-only setup) on the calling thread; cheap after
// the first call. Called by contexts before a first parallel run so timing starts warm.
void GemmInit();

// The name BLIS gives the architecture configuration it selected at run time (e.g. "zen3",
// "skx", "cortexa57", "generic").
const char* GemmArchName();

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_H_
