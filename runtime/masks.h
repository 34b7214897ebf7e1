// Masks of the attention tasks: the caller's attn_mask and key_padding_mask as they are, or
// copies padded to S' columns with the causal mask folded in (when appended key positions
// exist), and the softmax kernels' view of them for a block of rows. Internal: not installed.
#ifndef MHA_RUNTIME_MASKS_H_
#define MHA_RUNTIME_MASKS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/softmax.h"
#include "runtime/forward_plan.h"
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
};

// Fills the plan's padded mask copies when it has them (plan.padded_masks) and returns the masks
// to read.
AttentionMasks PrepareMasks(int64_t H, const ForwardArgs& args, const ForwardPlan& plan,
                            const ForwardBuffers& buf);

// The masks of query rows [q0, q0 + rows) of (batch n, head h), key columns from k0.
kernels::SoftmaxMasks MasksFor(const AttentionMasks& masks, int64_t n, int64_t h, int64_t q0,
                               int64_t k0);

}  // namespace mha

#endif  // MHA_RUNTIME_MASKS_H_
