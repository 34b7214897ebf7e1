// The attention tasks of a forward, between the input and output projections: per (batch,
// head, query block) the scores Q K^T, the masked softmax and the weighted sum P V, written
// into the head's columns of concat. Paths (ForwardPlan::path): the full-row path computes
// whole score rows (into the caller's attention weights, or scratch to average them over the
// heads); the online path runs each query block in strips over key blocks with the online
// softmax, keeping a strip's scores in L1/L2. A window over index positions limits both paths
// to each block's band of keys: keys outside it are never packed or multiplied (work O(L W)).
// Internal: not installed.
#ifndef MHA_RUNTIME_ATTENTION_TASKS_H_
#define MHA_RUNTIME_ATTENTION_TASKS_H_

#include "mha/mha.hpp"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/masks.h"
#include "runtime/trace.h"
#include "runtime/validate.h"

namespace mha {

// Runs the attention tasks over the keys `keys` (all S' of them unless key-chunked) on the
// context's pool. Key-chunked: the online-softmax state persists in the plan's row max and sum
// and in concat between calls, unnormalized (the key-chunked output projection normalizes).
void RunAttentionTasks(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                       const ForwardPlan& plan, const ForwardBuffers& buf, const KeyChunk& keys);

// The grouped forward's attention tasks on the calling thread: every (head, query block) of batch
// entries [n0, n0 + count), online path, whose q, k, v and concat in `group_buf` hold those
// entries from their first (plan's layouts); masks from PrepareMasks.
void RunGroupAttentionTasks(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                            const ForwardBuffers& group_buf, const AttentionMasks& masks,
                            TraceRecorder* trace, int64_t n0, size_t count, size_t worker);

}  // namespace mha

#endif  // MHA_RUNTIME_ATTENTION_TASKS_H_
