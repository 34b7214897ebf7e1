// Masks of the attention tasks: the caller's attn_mask and key_padding_mask as they are, or
// copies padded to S' columns with the causal mask folded in (when appended key positions
// exist), the layer's score terms (softcap, ALiBi, window, sinks) and token positions, and the
// softmax kernels' view of them for a block of rows. Internal: not installed.
#ifndef MHA_RUNTIME_MASKS_H_
#define MHA_RUNTIME_MASKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/softmax.h"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/validate.h"

namespace mha {

struct MaskInput {
  MaskType type = MaskType::kNone;
  const void* data = nullptr;
  bool per_head = false;     // attn_mask [N*H, L, S or S']
  ptrdiff_t stride0 = 0;     // elements between [N*H] slices (3-D) or between batches (kpm)
  ptrdiff_t row_stride = 0;  // elements between query rows (attn_mask)
};

// The masks the attention tasks read, for a layer of H heads.
struct AttentionMasks {
  MaskInput attn, kpm;
  bool causal = false;  // false when folded into a padded attn
  int64_t H = 0;
  // The layer's score terms (LayerVariants): alibi_slopes and sinks [H] or null.
  float softcap = 0.0f;
  int64_t window = 0;
  const float* alibi_slopes = nullptr;
  const float* sinks = nullptr;
  // Explicit positions (ForwardBuffers::q_pos, k_pos), batch n's at q_pos + n * q_pos_batch
  // [L] and k_pos + n * k_pos_batch [S]; null = index positions. Self-attention given only
  // query positions reads them for the keys too.
  const int32_t* q_pos = nullptr;
  const int32_t* k_pos = nullptr;
  int64_t q_pos_batch = 0, k_pos_batch = 0;

  // True when the layer has a window over index positions: each query row sees a band of
  // consecutive keys (BandStart, BandLimit), so the tasks skip the keys outside it.
  bool banded() const { return window > 0 && q_pos == nullptr; }
  // The first key a query row q sees: q - W + 1 in a band, else 0.
  int64_t BandStart(int64_t q) const { return banded() ? WindowBandStart(q, window) : 0; }
  // One past the last key of St that some row of [q0, q0 + rows) sees: the causal limit
  // q0 + rows, the non-causal band's q0 + rows - 1 + W, or St.
  int64_t BandLimit(int64_t q0, int64_t rows, int64_t St) const {
    int64_t limit = St;
    if (causal) {
      limit = std::min(limit, q0 + rows);
    } else if (banded()) {
      limit = std::min(limit, q0 + rows - 1 + window);
    }
    return limit;
  }
};

// Fills the plan's padded mask copies when it has them (plan.padded_masks) and returns the masks
// to read, with the layer's score terms and the forward's positions.
AttentionMasks PrepareMasks(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                            const ForwardBuffers& buf);

// The masks of query rows [q0, q0 + rows) of (batch n, head h), key columns from k0. `full_row`:
// for SoftmaxRows, which takes the head's sink as a logit (the online recurrence starts from it
// instead, see OnlineTask).
kernels::SoftmaxMasks MasksFor(const AttentionMasks& masks, int64_t n, int64_t h, int64_t q0,
                               int64_t k0, bool full_row = false);

// The terms of the key-chunked path's appended key positions [S, S') (add_bias_kv,
// add_zero_attn), which no mask covers: the softcap only (layers with positional terms reject
// appended keys; the online recurrence starts from the sink).
kernels::SoftmaxMasks AppendedKeyTerms(const AttentionMasks& masks);

}  // namespace mha

#endif  // MHA_RUNTIME_MASKS_H_
