// Argument validation of the attention operator and the KV cache: shapes, dtypes, strides and
// aliasing of inputs, masks and outputs, checked before anything is written, with messages that
// name the argument, what was expected and what was given. Validation splits a call's
// arguments into their shapes (ForwardShapes, all a plan may read) and their pointers.
// Internal: not installed.
#ifndef MHA_RUNTIME_VALIDATE_H_
#define MHA_RUNTIME_VALIDATE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "mha/mha.hpp"
#include "runtime/layer_weights.h"

namespace mha {

// A number as the validation messages write it.
std::string Str(int64_t v);

// Row layout of a buffer of tokens: element offset of token (n, t) = n * batch + t * token.
struct TokenLayout {
  ptrdiff_t batch = 0;
  ptrdiff_t token = 0;

  // Whether the rows of n > 1 entries interleave token by token (sequence-major: token t of
  // every entry, then t + 1), so that they form one matrix of row stride `batch`.
  bool SequenceMajor(int64_t n) const { return n > 1 && token == n * batch; }
  // Whether the rows of n entries of `tokens` tokens follow entry by entry (batch-major; any
  // layout when n is 1), so that they form one matrix of row stride `token`.
  bool BatchMajor(int64_t n, int64_t tokens) const { return n == 1 || batch == tokens * token; }
};

// A validated input sequence: N batches of `tokens` tokens of `features` floats each, at
// element offsets `layout` from its data.
struct SeqShape {
  int64_t tokens = 0;
  int64_t features = 0;
  TokenLayout layout;  // in elements
};

enum class MaskType { kNone, kBool, kFloat };

struct MaskShape {
  MaskType type = MaskType::kNone;
  bool per_head = false;     // attn_mask [N*H, L, S]
  ptrdiff_t stride0 = 0;     // elements between [N*H] slices (3-D) or between batches (kpm)
  ptrdiff_t row_stride = 0;  // elements between query rows (attn_mask)
};

// Everything of a forward's arguments except their addresses: what the plan reads.
struct ForwardShapes {
  bool batched = false;
  int64_t N = 0, L = 0, S = 0, St = 0;  // St = S' = S + LayerWeights::Extra()
  SeqShape q, k, v;
  // Key and value (or their absence) have the query's shape: the same shapes may come as
  // self-attention (the query's view) or not, so the plan covers both.
  bool self_possible = false;
  MaskShape attn, kpm;
  bool causal = false;
  bool need_weights = false;
  bool average = true;
  TokenLayout out_layout;
  ptrdiff_t w_stride[3] = {0, 0, 0};  // attn_weights, averaged: n, l; per head: n, h, l
  // AttentionInputs::positions or key_positions given: the forward holds int32 positions of
  // every query and key (ForwardBuffers::q_pos [N, L], k_pos [N, S]).
  bool has_positions = false;
};

// What the addresses of a forward's arguments decide; the plan is the bound over both values
// of each (PlanForwardBound), so one plan fits every forward with the same shapes.
struct Aliasing {
  bool self_attention = false;  // key and value are the query's view
  // The output's rows are disjoint and share no memory with any input or mask, so the chunked
  // path keeps its running sums there instead of in a workspace buffer.
  bool out_private = false;
};

// Field-by-field equality (the plan caches' keys, plan_cache.h): extend with the structs.
inline bool operator==(const TokenLayout& a, const TokenLayout& b) {
  return a.batch == b.batch && a.token == b.token;
}
inline bool operator==(const SeqShape& a, const SeqShape& b) {
  return a.tokens == b.tokens && a.features == b.features && a.layout == b.layout;
}
inline bool operator==(const MaskShape& a, const MaskShape& b) {
  return a.type == b.type && a.per_head == b.per_head && a.stride0 == b.stride0 &&
         a.row_stride == b.row_stride;
}
inline bool operator==(const ForwardShapes& a, const ForwardShapes& b) {
  return a.batched == b.batched && a.N == b.N && a.L == b.L && a.S == b.S && a.St == b.St &&
         a.q == b.q && a.k == b.k && a.v == b.v && a.self_possible == b.self_possible &&
         a.attn == b.attn && a.kpm == b.kpm && a.causal == b.causal &&
         a.need_weights == b.need_weights && a.average == b.average &&
         a.out_layout == b.out_layout && a.w_stride[0] == b.w_stride[0] &&
         a.w_stride[1] == b.w_stride[1] && a.w_stride[2] == b.w_stride[2] &&
         a.has_positions == b.has_positions;
}
inline bool operator==(const Aliasing& a, const Aliasing& b) {
  return a.self_attention == b.self_attention && a.out_private == b.out_private;
}

// A validated forward (or Project) call.
struct ForwardArgs {
  ForwardShapes shapes;
  Aliasing aliasing;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const void* attn_mask = nullptr;
  const void* key_padding_mask = nullptr;
  float* out = nullptr;      // null for Project
  float* weights = nullptr;  // attn_weights when need_weights
  // AttentionInputs::positions / key_positions as given (kI32 or kI64; absent: rank 0), checked:
  // [N, L] or [L] ([N, S] or [S]), values in [0, 2^31); key_positions never in self-attention.
  TensorView positions;
  TensorView key_positions;
};

// Validates a forward's inputs, masks and (unless null) outputs against layer m.
Status ValidateForward(const LayerWeights& m, const AttentionInputs& in,
                       const AttentionOutputs* out, ForwardArgs* args);

// Writes validated positions t ([N, len] or [len], i32 or i64) as dense int32 [N, len] to dst.
void PositionsToInt32(const TensorView& t, int64_t N, int64_t len, int32_t* dst);

// Validates inputs and outputs of Project/PlanProject (masks and weights are ignored there).
Status ValidateProject(const LayerWeights& m, const AttentionInputs& inputs,
                       const ProjectionOutputs& outputs, ForwardArgs* args);

// A validated [N, T, F] f32 tensor of the KV cache (batch-first whatever the layer's layout):
// element (n, t, f) at data[n * batch_stride + t * token_stride + f].
struct BatchFirstSeq {
  float* data = nullptr;
  int64_t tokens = 0;
  ptrdiff_t batch_stride = 0;
  ptrdiff_t token_stride = 0;
};

// Checks t is [batch, tokens (any when <= 0), features] f32 with a contiguous last dimension;
// messages are prefixed op + name.
Status ValidateBatchFirstSeq(const TensorView& t, const char* op, const char* name, int64_t batch,
                             int64_t tokens, int64_t features, BatchFirstSeq* seq);

// A KV cache's shape and state as the validation of its calls reads them (KvCache::Impl's).
struct CacheState {
  int64_t batch = 0, capacity = 0, kv_heads = 0, head_dim = 0;
  // Ring (KvCacheOptions::ring): `floor` [batch] holds each entry's lowest position still in
  // the ring (positions [floor_n, length_n) are readable); `window` is the last layer's.
  bool ring = false;
  int64_t window = 0;
  const int64_t* lengths = nullptr;  // [batch]
  const int64_t* floor = nullptr;    // [batch]
};

// Checks a layer against a cache: its key/value heads and head size, and for a ring a window
// with 0 < window <= capacity.
Status ValidateCacheLayer(const char* op, const LayerWeights& m, const CacheState& cache);

// Checks count (tokens of batch entry n, of T given) against the entry's cached length: an
// append must fit the capacity (a ring: at most `capacity` tokens per call unless `prompt`, the
// prompt Step that keeps its last `capacity` positions), a query without append sits at the last
// cached positions.
Status ValidateTokenCount(const char* op, const CacheState& cache, int64_t n, int64_t count,
                          int64_t T, bool append, bool prompt = false);

// A validated KvCache call: Append (key, value), Forward (query, output) or Step (all four, one
// tensor x). Tensors batch-first [N, T, features]; count_n tokens of entry n are real.
struct CacheCallArgs {
  bool append = false, forward = false;
  // A Step of >= kPrefillForwardMinTokens tokens into an empty cache, every entry full: it runs
  // the layer's causal forward (step_plan.h).
  bool prompt = false;
  int64_t N = 0, T = 0;
  BatchFirstSeq q, k, v, out;
  const int64_t* counts = nullptr;  // [N] or null (T each)
  int64_t Count(int64_t n) const { return counts != nullptr ? counts[n] : T; }
};

// Validates a KvCache call against layer m and the cache (null tensors: the parts that do not
// run): the layer (no appended key positions, the cache's heads and window), the tensors, the
// counts against the lengths and capacity, int32 positions for layers that use positions, and
// for a ring that every query's window is still held.
Status ValidateCacheCall(const char* op, const LayerWeights& m, const CacheState& cache,
                         const TensorView* query, const TensorView* key, const TensorView* value,
                         const TensorView* output, const int64_t* counts, CacheCallArgs* args);

}  // namespace mha

#endif  // MHA_RUNTIME_VALIDATE_H_
