// The resolved configuration and bound weights of a MultiheadAttention layer, shared by the
// operator (attention.cc) and other runtime code that runs the same layer differently (the
// KV-cache decoder). Internal: not installed.
#ifndef MHA_RUNTIME_ATTENTION_IMPL_H_
#define MHA_RUNTIME_ATTENTION_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/parallel_gemm.h"

namespace mha {

// Dimensions: E = embed_dim, H heads, KVH key/value heads, hd = E / H, kvE = KVH * hd; qd, kd,
// vd the input features of query, key, value (resolved: never 0).
struct LayerWeights {
  AttentionConfig config;
  int64_t E = 0, H = 0, KVH = 0, hd = 0, kvE = 0, qd = 0, kd = 0, vd = 0;
  float scale = 1.0f;  // resolved score scale
  // Weights in nn.Linear layout ([out, in], row-major, config.weight_dtype): the caller's
  // arrays (kView) or owned copies (kCopy, and always for the per-head packed layout,
  // reordered to q, k, v rows): `owned` holds f32 weights and every bias, `owned16` 16-bit
  // weights.
  std::vector<float> owned;
  std::vector<uint16_t> owned16;
  WeightMatrix w_packed;            // [E + 2 kvE, qd], rows q, k, v; data null when not packed
  const float* b_packed = nullptr;  // [E + 2 kvE] or null
  WeightMatrix w_q;                 // [E, qd]
  WeightMatrix w_k;                 // [kvE, kd]
  WeightMatrix w_v;                 // [kvE, vd]
  const float* b_q = nullptr;       // [E] or null
  const float* b_k = nullptr;       // [kvE] or null
  const float* b_v = nullptr;       // [kvE] or null
  const float* bias_k = nullptr;    // [kvE] when add_bias_kv
  const float* bias_v = nullptr;
  WeightMatrix w_o;            // [E, E]
  const float* b_o = nullptr;  // [E] or null
  // config.prepack: the packings of w_q, w_k, w_v and w_o (their `packed` members point here;
  // empty when nothing is packed). w_packed is never prepacked: with prepacked weights the
  // fused projection runs as three products into the column ranges of its buffer.
  std::vector<float> prepacked;
  // config.prepack kOn: the Strassen operands of the matrices StrassenPacks() takes (their
  // `strassen` members point here; empty when none).
  std::vector<float> strassen_packed;

  // Fills `prepacked`, `strassen_packed` and the matrices' `packed` / `strassen` when
  // config.prepack applies (f32 weights, a micro-kernel that prefers row-major C). Called once by
  // Create after the weights are bound.
  void Prepack();
};

// The layer's resolved weights (defined in attention.cc, where Impl is complete).
const LayerWeights& LayerWeightsOf(const MultiheadAttention& layer);

// When Forward splits the keys into chunks (the chunked path of attention.cc): no attention
// weights requested, more than `chunk_keys` keys, and K and V buffers of all keys (N x S' x kvE
// f32 each) of at least `min_kv_bytes` together. The defaults are kChunkKeys and
// kChunkMinKvBytes in attention.cc.
struct KeyChunking {
  size_t min_kv_bytes = 0;
  int64_t chunk_keys = 0;
};
KeyChunking CurrentKeyChunking();
// Testing hook: replaces the process-wide setting (so small shapes reach the chunked path) and
// returns the previous one. Not for concurrent use with forwards or plans.
KeyChunking SetKeyChunkingForTesting(const KeyChunking& chunking);

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
// them, or one chunk at a time on the long-sequence path) before attention reads them.
using KvSinkFn = void (*)(void* user, Context& ctx, const ProjectedKv& kv);

// Forward that also hands its projected keys and values to `sink` (KvCache's prefill: the
// prompt runs the forward's tiled path and the cache stores the keys as they are produced).
Status ForwardWithKvSink(const MultiheadAttention& layer, Context& ctx,
                         const AttentionInputs& inputs, const AttentionOutputs& outputs,
                         KvSinkFn sink, void* user);

// The workspace bytes this very forward, its pointers included, takes from the arena (Plan
// returns the bound over every pointer arrangement of the same shapes). For tests: it runs
// nothing.
Status ForwardWorkspaceBytesForTesting(const MultiheadAttention& layer,
                                       const AttentionInputs& inputs,
                                       const AttentionOutputs& outputs, size_t num_threads,
                                       size_t* bytes);

}  // namespace mha

#endif  // MHA_RUNTIME_ATTENTION_IMPL_H_
