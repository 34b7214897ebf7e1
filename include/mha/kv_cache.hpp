// mha C++ API: incremental (autoregressive) decoding with a key/value cache.
//
// A KvCache holds the projected keys and values of one attention layer for a batch of
// sequences, so that each new token costs one projection of that token plus one pass over the
// cached positions instead of a forward over the whole prefix.
//
//   KvCacheOptions o = KvCacheOptions::ForLayer(*layer, /*batch=*/4, /*capacity=*/4096,
//                                              DType::kBF16);
//   std::unique_ptr<KvCache> cache;
//   KvCache::Create(o, &cache);
//   cache->Step(ctx, *layer, prompt, out);    // prefill: prompt [N, T, E], out [N, T, E]
//   cache->Step(ctx, *layer, token, out1);    // decode:  token [N, 1, E], out1 [N, 1, E]
//
// Layout (owned or caller memory, allocated once at creation, never resized): K then V, each
// [batch, num_kv_heads, capacity, head_dim] elements of the storage dtype, dense row-major:
// element (n, g, p, d) of K at index ((n * num_kv_heads + g) * capacity + p) * head_dim + d, V
// right after the batch * num_kv_heads * capacity * head_dim elements of K. Each head's
// positions are contiguous rows, which is what a decode step streams.
//
// Storage dtype: f32, bf16, f16 or int8, chosen at creation. 16-bit values are rounded to
// nearest even from the f32 projections; every computation is f32. int8 stores each row (one
// position of one kv head, head_dim values) as symmetric codes with one f32 scale:
// scale = max_d |x_d| / 127, code_d = round_half_even(x_d * 127 / max_d |x_d|) in [-127, 127];
// the scales follow V's codes, K's [batch, num_kv_heads, capacity] f32 then V's, at the first
// 4-byte boundary (caller buffers must be 4-byte aligned). A row costs head_dim + 4 bytes: at
// head_dim 64, 27% of f32's bytes. Its error: each element within scale / 2 of its f32 value. Error
// of a 16-bit cache: each stored element has relative error <= 2^-9 (bf16) or 2^-11 (f16, inside
// its normal range [6.1e-5, 65504]; larger magnitudes become inf). For layers with O(1) activations
// the outputs differ from an f32 cache by about 1e-2 (bf16) and 1e-3 (f16) relative to the output
// scale; tests/kv_cache_test.cc checks 2e-2 and 4e-3 against the full causal forward.
//
// Positions and causality: entry n of the batch has its own length len_n (ragged batches).
// Inputs carry T tokens per entry; `counts` (optional, [batch]) says how many of them entry n
// really uses (the rest are padding: never stored, their output rows are set to 0). Append
// stores entry n's tokens at positions len_n .. len_n + count_n - 1. Forward attends query
// token i < count_n of entry n, which sits at position len_n - count_n + i, to cached positions
// 0 .. len_n - count_n + i (causal: itself included, later ones not); it needs
// count_n <= len_n, i.e. the query tokens' keys are in the cache. Step = Append, then Forward,
// on the same input (self-attention): prefill is Step with T prompt tokens, decode is Step with
// T = 1. The result equals MultiheadAttention::Forward with causal = true over the whole
// sequence (the same layer, up to f32 rounding, for an f32 cache).
//
// Attention variants (AttentionConfig): a cache position is the token's position p (the
// forward's default positions 0..L-1 of the whole sequence). QK-norm and RoPE are applied to the
// new tokens' projected q and k before anything is stored: new key t of entry n at position
// len_n + t, query token i at len_n - count_n + i, so the cache holds normalized, rotated keys
// (values as projected). Truncate keeps positions consistent: tokens appended after it get the
// positions of the ones dropped, and the rotated keys still cached sit at their own positions.
// AppendProjected stores keys as given: pass them already normalized and rotated at their
// positions (as MultiheadAttention::Project returns k for those positions). Softcap, ALiBi
// (s -= m_h * |p_i - p_j|), the window (p_i - W < p_j <= p_i) and sinks apply in decode exactly
// as in the causal forward; a window's decode reads only the W positions of each query's band.
// Layers with RoPE, ALiBi or a window need every position below 2^31.
//
// Ring (KvCacheOptions::ring, for layers with a window W): position p lives in slot
// p mod capacity, so the cache keeps the last `capacity` positions of each entry. Lengths stay
// logical (they may exceed the capacity; Append's capacity limit becomes `capacity` tokens per
// call) and memory is the capacity's, O(W) instead of O(sequence). Every call with a layer
// checks window > 0 and capacity >= window (InvalidArgument naming both). A Step or Forward of
// count_n tokens needs count_n <= capacity - W + 1, so that the first query's band (W positions)
// is still in the ring after the append; the prompt Step (into an empty cache, every entry
// T >= 64 tokens, no padding) runs the forward and may be longer, keeping its last `capacity`
// positions. Truncate may drop at most capacity - W positions from the current length (W: the
// last layer used). A ring whose slots no longer hold a query's band (after truncations, or with
// a layer of a larger window) is reported as InvalidArgument, never read.
//
// Tensors: f32, batch-first [N, T, features] regardless of the layer's batch_first, each with
// a contiguous last dimension (other strides free). key [N, T, kdim], value [N, T, vdim],
// query [N, T, q_dim], output [N, T, E].
//
// Layers: grouped-query (num_kv_heads < num_heads) and multi-query (num_kv_heads = 1) layers
// cache num_kv_heads heads only. Layers with add_bias_kv or add_zero_attn are rejected
// (Unsupported): their extra key positions belong at the end of every sequence, which a cache
// that grows in place cannot express; masks and attention weights are not offered either.
//
// Memory and threads: every temporary comes from the context's arena (the plan grows an owned
// arena once; afterwards Append, Forward and Step perform no heap allocation). Work runs on the
// context's pool; results are bitwise identical for any thread count. A cache is not
// thread-safe: one thread at a time may call its methods. A layer may serve several caches.
//
// Errors: every call validates all of its arguments first and returns a Status naming the
// argument, the expected and the actual value; on error neither the cache nor any output is
// modified.
#ifndef MHA_KV_CACHE_HPP_
#define MHA_KV_CACHE_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mha/mha.hpp"
#include "mha/types.hpp"

namespace mha {

struct MHA_API KvCacheOptions {
  int64_t batch = 1;          // N: sequences (batch entries)
  int64_t capacity = 0;       // positions per entry (max sequence length)
  int64_t num_kv_heads = 0;   // the layer's key/value heads
  int64_t head_dim = 0;       // the layer's head_dim
  DType dtype = DType::kF32;  // storage: kF32, kBF16, kF16 or kI8 (see the file comment)
  // Caller-provided storage (not owned; must outlive the cache), at least RequiredBytes(),
  // aligned to the storage element size (64 bytes recommended). Null: the cache allocates and
  // owns its storage (zeroed); from 32 MiB on Linux it asks for transparent huge pages (a
  // decode step streams the whole cache: fewer TLB misses) and rounds the bytes up to 2 MiB.
  void* buffer = nullptr;
  size_t buffer_bytes = 0;
  // For a layer with a sliding window W: the capacity holds the last `capacity` positions of
  // each entry as a ring (slot p mod capacity) instead of positions 0..capacity-1, so an entry's
  // length may grow without bound while memory stays O(capacity); capacity >= W, and a step of
  // T tokens needs T <= capacity - W + 1. Truncate may drop at most capacity - W positions. The
  // layout of the file comment holds with slots in place of positions. See the file comment.
  bool ring = false;
  // kI8 storage only (else InvalidArgument), head_dim <= 1024: the steps' attention over the
  // cache takes integer dot products instead of f32 arithmetic. Each query row is quantized to
  // int8 (symmetric, one scale per row, as the cache's rows are) for its scores against the
  // cached keys, and the softmax's probabilities, times the value rows' scales, are quantized to
  // u8 per block of 32 positions (one scale per block, the block's largest weight mapped to 255)
  // for the sums over the cached values; the integer sums are exact, then scaled in f32
  // (kernels/decode_int8.h defines it). For CPUs with AVX512_VNNI (VPDPBUSD; used where an
  // AVX-512 Highway target runs), where grouped-query layers, whose query heads share each cached
  // row, then read an int8 cache near memory speed instead of being bound by f32 multiply-adds;
  // elsewhere a portable kernel computes the same bits, slower than the default (README
  // "Incremental decoding" gives both as measured). The two products over the cache give the
  // same bits on every CPU and target (the rest of the step, projections and softmax, varies by
  // target as without the option); outputs are bitwise the same for any thread count. Error:
  // the queries' and the weights' rounding on top of the int8 storage's (README "Incremental
  // decoding", measured).
  // A prompt Step into an empty cache (every entry T >= 64 tokens, no padding) runs the layer's
  // causal forward, whose attention stays f32; the Steps after it read the cache this way.
  bool int8_attention = false;

  // Options matching `layer`'s num_kv_heads and head_dim.
  static KvCacheOptions ForLayer(const MultiheadAttention& layer, int64_t batch, int64_t capacity,
                                 DType dtype = DType::kF32);
};

class MHA_API KvCache {
 public:
  // Bytes of storage a cache with these options needs (K and V).
  static Status RequiredBytes(const KvCacheOptions& options, size_t* bytes);
  static Status Create(const KvCacheOptions& options, std::unique_ptr<KvCache>* out);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t batch() const;
  int64_t capacity() const;
  int64_t num_kv_heads() const;
  int64_t head_dim() const;
  DType dtype() const;
  // Current length (cached positions) of entry n, 0 <= n < batch (unchecked).
  int64_t length(int64_t n) const;
  // Storage of K (V follows at keys() + batch * num_kv_heads * capacity * head_dim elements),
  // in the layout of the file comment; for int8 storage the codes, with their per-row scales
  // [batch, num_kv_heads, capacity] f32 at key_scales() and value_scales() (null otherwise).
  const void* keys() const;
  const void* values() const;
  const float* key_scales() const;
  const float* value_scales() const;

  // Context arena bytes that every Append, Forward and Step with `layer` of up to `max_tokens`
  // tokens per entry needs on `num_threads` threads, for sizing a caller-provided arena
  // (ContextOptions::arena_buffer). From shapes alone: it holds for any lengths, counts and
  // pointers, and a buffer of that many bytes works at any address, as MultiheadAttention::Plan.
  Status Plan(const MultiheadAttention& layer, int64_t max_tokens, size_t num_threads,
              size_t* bytes) const;
  // Empties every entry (lengths 0); the storage is kept.
  void Reset();
  // Shortens entry n to `length` positions (0 <= length <= length(n); a ring: length >= length(n)
  // - (capacity - window)); later appends overwrite the dropped positions.
  Status Truncate(int64_t n, int64_t length);

  // Projects key [N, T, kdim] and value [N, T, vdim] with the layer's k/v weights and biases
  // and stores count_n of them per entry (counts null: T each). Fails with InvalidArgument if an
  // entry would exceed the capacity (naming the entry, its length, the count and the capacity).
  Status Append(Context& ctx, const MultiheadAttention& layer, const TensorView& key,
                const TensorView& value, const int64_t* counts = nullptr);
  // Stores keys and values that are already projected, per head: k and v [N, num_kv_heads, T,
  // head_dim] f32 (MultiheadAttention::Project's k/v layout, last dimension contiguous), count_n
  // positions per entry (counts null: T). For importing a cache computed elsewhere (a prompt
  // prefix shared by several requests, cross-attention memory) without a projection; same
  // capacity errors as Append. Keys are stored as given: with QK-norm or RoPE they must already
  // be normalized and rotated at their positions length(n) + t (as MultiheadAttention::Project
  // returns them for those positions).
  Status AppendProjected(const TensorView& k, const TensorView& v, const int64_t* counts = nullptr);
  // Attends query [N, T, q_dim] over the cache (see the file comment for positions), then the
  // output projection into output [N, T, E]. Rows i >= count_n of entry n are set to 0.
  Status Forward(Context& ctx, const MultiheadAttention& layer, const TensorView& query,
                 const TensorView& output, const int64_t* counts = nullptr);
  // Self-attention step: Append(x, x), then Forward(x). x [N, T, E] (q_dim == kdim == vdim).
  Status Step(Context& ctx, const MultiheadAttention& layer, const TensorView& x,
              const TensorView& output, const int64_t* counts = nullptr);

 private:
  struct Impl;  // runtime/kv_cache.cc: shape, storage, lengths and the shared Execute path
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mha

#endif  // MHA_KV_CACHE_HPP_
