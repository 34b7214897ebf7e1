#include "kernels/gemm.h"

#include <blis.h>

#include <cassert>

namespace mha {
namespace kernels {

namespace {

// One-thread runtime for every BLIS call: our pool owns the threads.
struct SingleThreadRuntime {
  rntm_t rntm;
  SingleThreadRuntime() {
    bli_rntm_init(&rntm);
    bli_rntm_set_num_threads(1, &rntm);
  }
};

}  // namespace

void Gemm(float alpha, const MatrixView& a, const MatrixView& b, float beta,
          const MatrixView& c) {
  assert(a.rows == c.rows && "Gemm: a.rows must equal c.rows");
  assert(b.cols == c.cols && "Gemm: b.cols must equal c.cols");
  assert(a.cols == b.rows && "Gemm: a.cols must equal b.rows");
  if (c.rows == 0 || c.cols == 0) return;
  // rntm_t is per call: BLIS writes into it while partitioning, so it must not be shared.
  SingleThreadRuntime rt;
  float alpha_v = alpha;
  float beta_v = beta;
  // BLIS handles k == 0 as c = beta * c.
  bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, static_cast<dim_t>(c.rows),
               static_cast<dim_t>(c.cols), static_cast<dim_t>(a.cols), &alpha_v, a.data,
               a.row_stride, a.col_stride, b.data, b.row_stride, b.col_stride, &beta_v, c.data,
               c.row_stride, c.col_stride, /*cntx=*/nullptr, &rt.rntm);
}

void GemmInit() { bli_init(); }

const char* GemmArchName() {
  bli_init();
  return bli_arch_string(bli_arch_query_id());
}

}  // namespace kernels
}  // namespace mha
