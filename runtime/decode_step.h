// The run of a validated KV-cache call (Append, Forward or Step) on its plan (step_plan.h), in
// the order the data passes (E = q width, kvE = kv_heads * head_dim, T tokens per entry):
//   1. ProjectStepInputs: Q [N*T, E], new K and V [N*T, kvE], f32, in the workspace,
//      token-major (row n * T + t), bias fused (ParallelGemm); then the layer's QK-norm and RoPE
//      on Q and the new K (TransformStepRows) at the tokens' positions: query i at len_n' -
//      count_n + i (len_n' the length after the append), new key t at len_n + t (before it);
//      RoPE scaling's dynamic and longrope frequencies by the step's length, max len_n' (keys
//      stored earlier keep the rotation of their step, as in transformers' cache).
//   2. StoreCacheTokens (kv_storage.h): the new K/V rows in the cache's storage type at
//      positions len_n .. len_n + count_n - 1 (slot = position mod capacity in a ring).
//   3. RunCacheAttention (cache_attention.h): split over spans then merged (decoding), or
//      blocked by query rows (prefill), reading the cache in its storage type.
//   4. ProjectStepOutput: concat x W_o^T + b_o into the caller's output; padding rows set to 0.
// A prompt Step into an empty cache runs RunPromptForward instead: the layer's causal forward,
// storing the keys and values it projects as it goes.
// Every partition depends on shapes and lengths only, never on the thread count, and each output
// element is reduced in a fixed order, so results are bitwise identical for any number of
// threads. The run cannot fail: the caller validated, planned and took the workspace; it leaves
// the cache's lengths to the caller. Internal: not installed.
#ifndef MHA_RUNTIME_DECODE_STEP_H_
#define MHA_RUNTIME_DECODE_STEP_H_

#include <cstdint>

#include "mha/mha.hpp"
#include "runtime/kv_storage.h"
#include "runtime/layer_weights.h"
#include "runtime/step_plan.h"
#include "runtime/validate.h"

namespace mha {

// Steps 1-4 above for `args` on the workspace at `base` laid out by `plan`. lengths [N]: the
// entries' lengths before the call; ends [N]: after it (lengths + counts when appending, else
// lengths).
void RunDecodeStep(Context& ctx, const LayerWeights& m, const CacheStorage& cache,
                   const int64_t* lengths, const int64_t* ends, const CacheCallArgs& args,
                   const StepPlan& plan, uint8_t* base);

// A prompt Step (CacheCallArgs::prompt; every length 0): the layer's causal forward of x into
// output, whose projected keys and values (QK-norm and RoPE applied) go to positions 0..T-1 of
// every entry as the forward produces them (a ring keeps the last `capacity`). Errors: the
// forward's (before any key is stored).
Status RunPromptForward(Context& ctx, const MultiheadAttention& layer, const CacheStorage& cache,
                        int64_t N, const TensorView& x, const TensorView& output, int64_t T);

}  // namespace mha

#endif  // MHA_RUNTIME_DECODE_STEP_H_
