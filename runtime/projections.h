// Projections of the attention layer: inputs into Q, K and V (with the appended key/value
// positions), the attention results into the output, and Project's per-head products, all as
// GemmJobs run by ParallelGemm. The KV cache builds its projections with the same jobs.
// Internal: not installed.
#ifndef MHA_RUNTIME_PROJECTIONS_H_
#define MHA_RUNTIME_PROJECTIONS_H_

#include <cstddef>
#include <cstdint>

#include "mha/mha.hpp"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/parallel_gemm.h"
#include "runtime/validate.h"

namespace mha {

// The projection of input x (at x_data) into dst (row stride ld, token layout dst_layout):
// x W^T + bias for w [out_cols, x.features], rows of all N batches in one product when the
// buffer is in the input's order with a uniform token stride, else one product per batch.
GemmJob ProjectionJob(const SeqShape& x, const float* x_data, size_t N, const WeightMatrix& w,
                      const float* bias, size_t out_cols, float* dst, TokenLayout dst_layout,
                      ptrdiff_t ld);

// The output projection: concat [N x L tokens, E] x W_o^T + b_o into out, one product over all
// rows when both are in the same token order, else one per batch.
GemmJob OutputProjectionJob(const LayerWeights& m, const float* concat, TokenLayout concat_layout,
                            float* out, TokenLayout out_layout, size_t N, size_t L);

// Q, K and V into the plan's buffers, then the appended key/value positions. Key-chunked: Q
// alone when keys is null, else K and V of the key chunk `keys`.
void RunInputProjections(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                         const ForwardPlan& plan, const ForwardBuffers& buf, const KeyChunk* keys);

// The appended key/value positions of entries [0, N) of k_buf and v_buf (`layout`, the first
// at row pos): bias_k / bias_v at pos, then zeros for add_zero_attn.
void AppendKeyValuePositions(const LayerWeights& m, float* k_buf, float* v_buf,
                             const TokenLayout& layout, size_t N, int64_t pos);

// The grouped forward's input projections on the calling thread: Q, K and V of batch entries
// [n0, n0 + count) into q, k, v, which hold those entries from their first (plan.q_layout,
// plan.kv_layout), then their appended key/value positions. Prepacked weights only
// (MultiplyPrepackedJob); the bits of RunInputProjections.
void ProjectGroupInputs(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                        float* q, float* k, float* v, int64_t n0, size_t count, void* scratch);

// Project's tasks over (q/k/v, n, head): out[n, h] [T, hd] = X_n [T, in] x W_h^T + b_h, then the
// appended positions of k and v. Worker w's GEMM scratch at scratch + w * scratch_stride.
void RunHeadProjections(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                        const ProjectionOutputs& outputs, uint8_t* scratch, size_t scratch_stride);

// Keys and values a forward has projected, for positions [begin, end) of every batch entry n:
// K of position p at k + n * batch_stride + (p - begin) * token_stride (elements), kvE =
// num_kv_heads * head_dim f32 values with head g at columns [g * head_dim, (g + 1) * head_dim);
// V likewise at v.
struct ProjectedKv {
  const float* k = nullptr;
  const float* v = nullptr;
  ptrdiff_t batch_stride = 0, token_stride = 0;
  int64_t begin = 0, end = 0;
};
// Called on the forward's calling thread with each block of projected keys and values (all of
// them, or one key chunk at a time on the key-chunked path) before attention reads them.
using KvSinkFn = void (*)(void* user, Context& ctx, const ProjectedKv& kv);

// Hands the K and V rows of key positions [begin, end) in the projection buffers to `sink`
// (nothing when null).
void SinkProjectedKv(Context& ctx, const ForwardPlan& plan, const ForwardBuffers& buf,
                     int64_t begin, int64_t end, KvSinkFn sink, void* user);

}  // namespace mha

#endif  // MHA_RUNTIME_PROJECTIONS_H_
