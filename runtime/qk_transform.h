// QK-norm then RoPE on projected q or k rows, in place, as a parallel pass over token blocks
// (AttentionConfig's variants; kernels in kernels/rope.h). Runs between the input projections
// and attention in the forward, the key-chunked forward, Project and the KV cache, so every
// path sees the same rotated q and k. Internal: not installed.
#ifndef MHA_RUNTIME_QK_TRANSFORM_H_
#define MHA_RUNTIME_QK_TRANSFORM_H_

#include <cstddef>
#include <cstdint>

#include "mha/mha.hpp"
#include "runtime/layer_weights.h"

namespace mha {

// Rows of projected q (heads = H, QK-norm weights q_norm) or k (heads = KVH, k_norm): `rows`
// tokens, token t at data + t * row_stride holding heads * hd f32 values (head h at h * hd).
// Token t's position is positions[t] when positions is given, else pos0 + t.
struct QkRows {
  float* data = nullptr;
  int64_t rows = 0;
  ptrdiff_t row_stride = 0;
  bool is_key = false;
  const int32_t* positions = nullptr;  // [rows] or null
  int64_t pos0 = 0;
};

// Arena bytes RunQkTransform needs on `threads` workers (per-worker cos/sin tables); 0 when the
// layer has neither RoPE nor QK-norm.
size_t QkTransformScratchBytes(const LayerWeights& m, size_t threads);

// Applies the layer's QK-norm then RoPE to each of `count` row sets (e.g. q and k) in one
// parallel dispatch on the context's pool, scratch from `scratch` (QkTransformScratchBytes).
// Does nothing when the layer has neither. Bitwise independent of the thread count.
void RunQkTransform(Context& ctx, const LayerWeights& m, const QkRows* sets, size_t count,
                    uint8_t* scratch);

}  // namespace mha

#endif  // MHA_RUNTIME_QK_TRANSFORM_H_
