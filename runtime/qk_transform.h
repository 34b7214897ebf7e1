// QK-norm then RoPE on projected q or k rows, in place, as a parallel pass over token blocks
// (AttentionConfig's variants; kernels in kernels/rope.h). Runs between the input projections
// and attention in the forward, the key-chunked forward, Project and the KV cache, so every
// path sees the same rotated q and k. Internal: not installed.
#ifndef MHA_RUNTIME_QK_TRANSFORM_H_
#define MHA_RUNTIME_QK_TRANSFORM_H_

#include <cstddef>
#include <cstdint>

#include "mha/mha.hpp"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/validate.h"

namespace mha {

// Rows of projected q (heads = H, QK-norm weights q_norm) or k (heads = KVH, k_norm) of
// `batches` batch entries: entry n's token t at data + n * batch_stride + t * row_stride, its
// head h at + h * head_stride (0 = head_dim: a token's heads * hd f32 values back to back, the
// projection buffers' layout; Project's [N, heads, T, hd] tensors use T * hd). Token t of entry
// n has position positions[n * positions_batch_stride + t] when positions is given, else
// pos0 + t. rope_len: the call's length (RopeCallLength), which the RoPE scaling types kDynamic
// and kLongRope choose their frequencies by (rope_scaling.h); the same in every set of a call.
struct QkRows {
  float* data = nullptr;
  int64_t rows = 0;
  ptrdiff_t row_stride = 0;
  bool is_key = false;
  const int32_t* positions = nullptr;  // [batches, rows] at positions_batch_stride, or null
  int64_t pos0 = 0;
  int64_t batches = 1;
  ptrdiff_t batch_stride = 0;
  ptrdiff_t positions_batch_stride = 0;
  ptrdiff_t head_stride = 0;
  int64_t rope_len = 0;
};

// A call's length for RoPE scaling: its largest query or key position + 1, over q_pos [N, L] and
// k_pos [N, S] (ForwardBuffers' positions), or max(L, S) for index positions (null); 0 when
// the layer's frequencies do not depend on it (RopeScalingParams::LengthDependent).
int64_t RopeCallLength(const LayerWeights& m, const ForwardShapes& sh, const int32_t* q_pos,
                       const int32_t* k_pos);

// Arena bytes RunQkTransform needs on `threads` workers (per-worker cos/sin tables of one token
// block and, for RopeScaling::kDynamic, the call's inverse frequencies [rd / 2] in double, plus
// with strided_heads a copy of one token block's rows for sets whose head_stride is not
// head_dim); 0 when the layer has neither RoPE nor QK-norm.
size_t QkTransformScratchBytes(const LayerWeights& m, size_t threads, bool strided_heads = false);

// Applies the layer's QK-norm then RoPE to each of `count` row sets (e.g. q and k) in one
// parallel dispatch over (set, batch entry, token block) on the context's pool, scratch from
// `scratch` (QkTransformScratchBytes, strided_heads when a set has a head_stride). Does nothing
// when the layer has neither. Every token is transformed on its own, with frequencies that
// depend on the sets' rope_len only: bitwise independent of the thread count and of the token
// blocks.
void RunQkTransform(Context& ctx, const LayerWeights& m, const QkRows* sets, size_t count,
                    uint8_t* scratch);

// The forward's transform in its projection buffers (ForwardBuffers' q and k at the plan's
// layouts; positions q_pos / k_pos, or index positions; the call's length buf.rope_len). keys
// null: Q [N, L], and unless the plan is key-chunked K's real keys [N, S] (the appended bias_kv
// / zero-attention keys are left as they are); else the key chunk's real keys [begin, min(end,
// S)), at positions from begin.
void RunForwardQkTransform(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                           const ForwardPlan& plan, const ForwardBuffers& buf,
                           const KeyChunk* keys);

// The grouped forward's transform on the calling worker (batch_groups.h): Q [L] and K's real
// keys [S] of batch entries [n0, n0 + count), which group_buf's q and k hold from their first
// (the plan's layouts), with worker `worker`'s part of group_buf.qk_scratch. The bits of
// RunForwardQkTransform.
void TransformGroupQk(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                      const ForwardBuffers& group_buf, int64_t n0, size_t count, size_t worker);

// Project's transform in its outputs q [N, H, L, hd] and k [N, KVH, S', hd] (the real keys
// [0, S) only), positions as RunForwardQkTransform's (null: index positions; the call's length
// from them, RopeCallLength); scratch from
// QkTransformScratchBytes(m, threads, /*strided_heads=*/true).
void RunProjectQkTransform(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                           const ProjectionOutputs& outputs, const int32_t* q_pos,
                           const int32_t* k_pos, uint8_t* scratch);

}  // namespace mha

#endif  // MHA_RUNTIME_QK_TRANSFORM_H_
