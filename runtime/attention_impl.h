// Internal entry points of the MultiheadAttention operator for other runtime code and tests:
// the layer's resolved weights (layer_weights.h), the forward that hands its projected keys
// and values to a sink (the KV cache's prefill), and testing hooks (the key chunking of
// forward_plan.h; the workspace of one forward). Internal: not installed.
#ifndef MHA_RUNTIME_ATTENTION_IMPL_H_
#define MHA_RUNTIME_ATTENTION_IMPL_H_

#include <cstddef>
#include <memory>

#include "mha/mha.hpp"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/projections.h"

namespace mha {

// The layer's resolved weights.
const LayerWeights& LayerWeightsOf(const MultiheadAttention& layer);

// Create, the layer then holding `keep_alive` until it is destroyed: what its viewed weight
// arrays live in (CreateFromHuggingFace with WeightBinding::kView: the mapped checkpoint).
Status CreateKeepingAlive(const AttentionConfig& config, const AttentionWeights& weights,
                          WeightBinding binding, std::shared_ptr<const void> keep_alive,
                          std::unique_ptr<MultiheadAttention>* out);

// Forward that also hands its projected keys and values to `sink` (KvCache's prefill: the
// prompt runs the forward's tiled path and the cache stores the keys as they are produced).
Status ForwardWithKvSink(const MultiheadAttention& layer, Context& ctx,
                         const AttentionInputs& inputs, const AttentionOutputs& outputs,
                         KvSinkFn sink, void* user);

// This very forward's plan (its pointers decide the aliasing): the path, block sizes and
// workspace, on num_threads threads with the process's batch grouping, or as Forward on
// `context` plans it (its threads and grouping). For tests: it runs nothing.
Status ForwardPlanForTesting(const MultiheadAttention& layer, const AttentionInputs& inputs,
                             const AttentionOutputs& outputs, size_t num_threads,
                             ForwardPlan* plan);
Status ForwardPlanForTesting(const MultiheadAttention& layer, const Context& context,
                             const AttentionInputs& inputs, const AttentionOutputs& outputs,
                             ForwardPlan* plan);

// The workspace bytes this very forward, its pointers included, takes from the arena (Plan
// returns the bound over every pointer arrangement of the same shapes). For tests: it runs
// nothing.
Status ForwardWorkspaceBytesForTesting(const MultiheadAttention& layer,
                                       const AttentionInputs& inputs,
                                       const AttentionOutputs& outputs, size_t num_threads,
                                       size_t* bytes);

// The entries per group of this forward's plan (ForwardPlan::batch_group; 0: stage by stage).
// For tests: it runs nothing.
Status ForwardBatchGroupForTesting(const MultiheadAttention& layer, const AttentionInputs& inputs,
                                   const AttentionOutputs& outputs, size_t num_threads,
                                   size_t* batch_group);

}  // namespace mha

#endif  // MHA_RUNTIME_ATTENTION_IMPL_H_
