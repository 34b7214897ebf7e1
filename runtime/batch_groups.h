// The grouped forward (ForwardPlan::batch_group > 0): a batch of short sequences runs as groups
// of whole batch entries, one task per group, each on one worker from its input to its output
// rows: the group's Q, K and V projections into the worker's own buffers (then QK-norm / RoPE
// there), its attention tasks, its output projection. A group's Q, K, V and attention results (a
// few MiB) then stay in the worker's L2 from one stage to the next instead of a round trip through
// memory, the stages need no barrier between them, and the workspace holds `threads` groups'
// buffers instead of every entry's. Same bits as the forward stage by stage (each product's route
// is a packed one either way, and the attention tasks' results do not depend on their query
// blocks). Internal: not installed.
#ifndef MHA_RUNTIME_BATCH_GROUPS_H_
#define MHA_RUNTIME_BATCH_GROUPS_H_

#include "mha/mha.hpp"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/validate.h"

namespace mha {

// Runs every group of a plan with batch_group > 0 on the context's pool, writing args.out.
void RunBatchGroups(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                    const ForwardPlan& plan, const ForwardBuffers& buf);

}  // namespace mha

#endif  // MHA_RUNTIME_BATCH_GROUPS_H_
