// The key-chunked path of the forward (long keys, no attention weights; ForwardPath::
// kKeyChunked): Q is projected whole, then for each key chunk of plan.chunk_keys keys its K and
// V are projected and the attention tasks continue the online-softmax recurrence over them;
// finally each block of output rows is normalized and projected. Full K, V (and concat, when
// the caller's output rows can hold the running sums) never exist. Internal: not installed.
#ifndef MHA_RUNTIME_KEY_CHUNKS_H_
#define MHA_RUNTIME_KEY_CHUNKS_H_

#include "mha/mha.hpp"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/projections.h"
#include "runtime/validate.h"

namespace mha {

// Runs every key chunk after Q's projection, then the output projection. `sink` (optional)
// gets each key chunk's projected keys and values.
void RunKeyChunks(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                  const ForwardPlan& plan, const ForwardBuffers& buf, KvSinkFn sink, void* user);

}  // namespace mha

#endif  // MHA_RUNTIME_KEY_CHUNKS_H_
