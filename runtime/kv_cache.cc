// KvCache: incremental decoding over a key/value cache (contract in include/mha/kv_cache.hpp).
//
// Data flow of Execute (Append, Forward and Step share it; E = embed_dim, hd = head_dim,
// kvE = kv_heads * hd, G = heads / kv_heads query heads per key/value head, T tokens per entry):
//   1. Projections (ParallelGemm, bias fused): Q [N*T, E], new K and V [N*T, kvE], f32, in the
//      arena, token-major (row n * T + t); then the layer's QK-norm and RoPE on Q and the new K
//      (RunQkTransform) at the tokens' positions: query i at len_n - count_n + i (len_n after
//      the append), new key t at len_n + t (before it); RoPE scaling's dynamic and longrope
//      frequencies by the step's length, max len_n after the append (keys stored earlier keep
//      the rotation of their step, as in transformers' cache).
//   2. Store: tasks over (entry, kv head) convert the new K/V rows into the cache's storage type
//      at positions len_n .. len_n + count_n - 1 (slot = position mod capacity in a ring).
//   3. Attention over the cache (cache_attention.h): split over spans of positions then merged
//      (decoding), or blocked by query rows (prefill), reading the cache in its storage type.
//   4. Output projection (ParallelGemm) into the caller's output; padding rows set to 0.
// Every partition depends on shapes and lengths only, never on the thread count, and each
// output element is reduced in a fixed order, so results are bitwise identical for any number
// of threads.
#include "mha/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "runtime/arena.h"
#include "runtime/attention_impl.h"
#include "runtime/cache_attention.h"
#include "runtime/context_internal.h"
#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/parallel_gemm.h"
#include "runtime/projections.h"
#include "runtime/qk_transform.h"
#include "runtime/thread_pool.h"
#include "runtime/validate.h"

namespace mha {

namespace {

// A Step of at least this many tokens into an empty cache (every entry, no padding) is a
// prompt: it runs MultiheadAttention's causal forward (its tiled GEMM/softmax path) and stores
// the keys and values the forward projects, instead of the decode kernels' blocked schedule.
constexpr int64_t kPrefillForwardMinTokens = 64;

// The token layout under which ProjectionJob and OutputProjectionJob (projections.h) make of a
// batch-first [N, T, ...] tensor with these strides the products the cache needs: one over all
// N * T rows when the tokens are evenly spaced (one token per entry: the entries' rows, which the
// sequence-major layout {batch, N * batch} says), else one per entry.
TokenLayout CacheLayout(int64_t N, int64_t T, ptrdiff_t batch_stride, ptrdiff_t token_stride) {
  if (T == 1) return {batch_stride, static_cast<ptrdiff_t>(N) * batch_stride};
  return {batch_stride, token_stride};
}

// x [N, T, in] times W^T [in, out] + bias into dense dst [N*T, out].
GemmJob CacheProjectionJob(const BatchFirstSeq& x, int64_t N, int64_t in, const WeightMatrix& w,
                           const float* bias, int64_t out, float* dst) {
  const SeqShape shape{x.tokens, in, CacheLayout(N, x.tokens, x.batch_stride, x.token_stride)};
  const ptrdiff_t ld = static_cast<ptrdiff_t>(out);
  return ProjectionJob(shape, x.data, static_cast<size_t>(N), w, bias, static_cast<size_t>(out),
                       dst, CacheLayout(N, x.tokens, x.tokens * ld, ld), ld);
}

// Symmetric int8 codes of one row (kv_cache.hpp: scale = max |x| / 127, codes rounded half to
// even), scalar so that every target stores the same bytes. A row with a NaN gets a NaN scale
// (the NaN reaches the rows that read it, as in the f32 cache); codes never overflow.
void QuantizeRowI8(const float* src, int64_t hd, int8_t* codes, float* scale) {
  float amax = 0.0f;
  for (int64_t d = 0; d < hd; ++d) {
    const float a = std::fabs(src[d]);
    if (!(a <= amax)) amax = a;  // keeps a NaN
  }
  *scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t d = 0; d < hd; ++d) {
    float c = src[d] * inv;
    c = c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c;
    codes[d] = static_cast<int8_t>(c == c ? std::nearbyint(c) : 0.0f);
  }
}

// One matrix (K or V) of the cache: rows of hd elements of `dtype`, row r at data + r * hd
// elements, and for int8 its scale at scales[r].
struct CacheRows {
  uint8_t* data;
  float* scales;
  DType dtype;
  int64_t hd;
};

// Writes row `row` from hd f32 values in the cache's storage type (16-bit: round to nearest
// even; int8: QuantizeRowI8).
void StoreRow(const float* src, const CacheRows& m, int64_t row) {
  uint8_t* dst = m.data + row * m.hd * static_cast<int64_t>(DTypeSize(m.dtype));
  if (m.dtype == DType::kI8) {
    QuantizeRowI8(src, m.hd, reinterpret_cast<int8_t*>(dst), m.scales + row);
  } else {
    ConvertElements(src, DType::kF32, dst, m.dtype, static_cast<size_t>(m.hd));
  }
}

// Bytes of one matrix's elements, and where the int8 scales start (after K's and V's elements,
// 4-byte aligned).
size_t MatrixBytes(const KvCacheOptions& o) {
  return static_cast<size_t>(o.batch) * static_cast<size_t>(o.num_kv_heads) *
         static_cast<size_t>(o.capacity) * static_cast<size_t>(o.head_dim) * DTypeSize(o.dtype);
}
size_t ScalesOffset(const KvCacheOptions& o) { return (2 * MatrixBytes(o) + 3) / 4 * 4; }

}  // namespace

// The cache's state: shape, storage (owned or the caller's) and per-entry lengths, with the
// path Append, Forward and Step share. Hidden: as a member of the exported KvCache it would
// otherwise put its methods among libmha.so's symbols.
struct __attribute__((visibility("hidden"))) KvCache::Impl {
  Status Execute(Context& ctx, const MultiheadAttention& layer, const TensorView* query,
                 const TensorView* key, const TensorView* value, const TensorView* output,
                 const int64_t* counts, const char* op);
  // Stores projected keys and values, f32 [N, T, kvE] (entry n's token t at k + n * batch_stride
  // + t * token_stride elements, likewise v), in the storage type: count_n tokens of entry n
  // (counts null: T) at positions lengths[n] + offset + t, in tasks over (entry, kv head) on
  // `pool`, except positions below keep_from (a ring prompt longer than the capacity keeps its
  // last `capacity` positions). Lengths are left to the caller.
  void StoreTokens(ThreadPool& pool, const float* k, const float* v, ptrdiff_t batch_stride,
                   ptrdiff_t token_stride, int64_t T, const int64_t* counts, int64_t offset,
                   int64_t keep_from = 0);
  // The slot (row within its (entry, kv head) block) of position `pos`.
  int64_t Slot(int64_t pos) const { return ring ? pos % capacity : pos; }
  // Ring: the checks of a call with `m` (window > 0, capacity >= window). Ok without a ring.
  Status CheckRing(const char* op, const LayerWeights& m) const;
  // Entry n's count of T tokens (append: stored, so within the capacity or, for a ring, at most
  // the capacity per call unless `prompt`; forward: count <= length).
  Status CheckCount(const char* op, int64_t n, int64_t count, int64_t T, bool append,
                    bool prompt = false) const;
  // Ring, a call whose queries attend the cache: entry n's count tokens must see their whole
  // window in the ring (count <= capacity - window + 1, and no position below floor).
  Status CheckRingQueries(const char* op, int64_t n, int64_t count, bool append,
                          int64_t window) const;
  // Ring: entry n's lengths move to `length` after storing up to it; floor follows.
  void Grow(int64_t n, int64_t length) {
    const size_t i = static_cast<size_t>(n);
    lengths[i] = length;
    if (ring) floor[i] = std::max(floor[i], length - capacity);
  }
  // A validated Step of T prompt tokens into an empty cache: the layer's causal forward, which
  // stores its projected keys and values here as it goes.
  Status Prefill(Context& ctx, const MultiheadAttention& layer, const TensorView& x,
                 const TensorView& output, int64_t T);

  int64_t batch = 0, capacity = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::kF32;
  void* k_data = nullptr;  // K, then V: the storage of the file comment
  void* v_data = nullptr;
  // int8 storage: one f32 scale per row, [batch, num_kv_heads, capacity] each (else null).
  float* k_scales = nullptr;
  float* v_scales = nullptr;
  std::unique_ptr<uint8_t[]> owned;
  std::vector<int64_t> lengths;  // [batch], sized at creation
  // Ring: the window of the last layer used (0 before any), and per entry the lowest position
  // whose slot still holds it (positions [floor_n, len_n) are readable).
  bool ring = false;
  int64_t window = 0;
  std::vector<int64_t> floor;
};

Status KvCache::Impl::CheckRing(const char* op, const LayerWeights& m) const {
  if (!ring) return Status::Ok();
  const int64_t w = m.variants.window;
  if (w <= 0 || capacity < w) {
    return InvalidArgument(std::string(op) +
                           "ring: expected a layer with window > 0 and capacity >= window, got "
                           "window " +
                           Str(w) + " and capacity " + Str(capacity));
  }
  return Status::Ok();
}

Status KvCache::Impl::CheckCount(const char* op, int64_t n, int64_t count, int64_t T, bool append,
                                 bool prompt) const {
  const int64_t len = lengths[static_cast<size_t>(n)];
  if (!ring) return ValidateTokenCount(op, n, count, T, len, capacity, append);
  Status s = ValidateTokenCount(op, n, count, T, len, INT64_MAX, append);
  if (s.ok() && append && !prompt && count > capacity) {
    return InvalidArgument(std::string(op) + "counts[" + Str(n) + "]: a ring of capacity " +
                           Str(capacity) + " stores at most " + Str(capacity) +
                           " tokens per call, got " + Str(count));
  }
  return s;
}

Status KvCache::Impl::CheckRingQueries(const char* op, int64_t n, int64_t count, bool append,
                                       int64_t w) const {
  if (!ring || count == 0) return Status::Ok();
  if (count > capacity - w + 1) {
    return InvalidArgument(
        std::string(op) + "counts[" + Str(n) +
        "]: a step over a ring needs at most capacity - window + 1 = " + Str(capacity - w + 1) +
        " tokens (capacity " + Str(capacity) + ", window " + Str(w) + "), got " + Str(count));
  }
  const int64_t len = lengths[static_cast<size_t>(n)] + (append ? count : 0);
  const int64_t lowest = append ? std::max(floor[static_cast<size_t>(n)], len - capacity)
                                : floor[static_cast<size_t>(n)];
  const int64_t band = std::max<int64_t>(0, len - count - w + 1);
  if (band < lowest) {
    return InvalidArgument(std::string(op) + "ring: batch entry " + Str(n) +
                           "'s first query (position " + Str(len - count) + ", window " + Str(w) +
                           ") needs positions from " + Str(band) + ", expected >= " + Str(lowest) +
                           " (the oldest position the ring still holds)");
  }
  return Status::Ok();
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;

int64_t KvCache::batch() const { return impl_->batch; }
int64_t KvCache::capacity() const { return impl_->capacity; }
int64_t KvCache::num_kv_heads() const { return impl_->kv_heads; }
int64_t KvCache::head_dim() const { return impl_->head_dim; }
DType KvCache::dtype() const { return impl_->dtype; }
int64_t KvCache::length(int64_t n) const { return impl_->lengths[static_cast<size_t>(n)]; }
const void* KvCache::keys() const { return impl_->k_data; }
const void* KvCache::values() const { return impl_->v_data; }
const float* KvCache::key_scales() const { return impl_->k_scales; }
const float* KvCache::value_scales() const { return impl_->v_scales; }

KvCacheOptions KvCacheOptions::ForLayer(const MultiheadAttention& layer, int64_t batch,
                                        int64_t capacity, DType dtype) {
  KvCacheOptions o;
  o.batch = batch;
  o.capacity = capacity;
  o.num_kv_heads =
      layer.config().num_kv_heads == 0 ? layer.config().num_heads : layer.config().num_kv_heads;
  o.head_dim = layer.head_dim();
  o.dtype = dtype;
  return o;
}

Status KvCache::RequiredBytes(const KvCacheOptions& o, size_t* bytes) {
  const char* op = "KvCache: ";
  if (bytes == nullptr) return InvalidArgument(std::string(op) + "bytes is null");
  const struct {
    const char* name;
    int64_t v;
  } dims[] = {{"batch", o.batch},
              {"capacity", o.capacity},
              {"num_kv_heads", o.num_kv_heads},
              {"head_dim", o.head_dim}};
  for (const auto& d : dims) {
    if (d.v <= 0) {
      return InvalidArgument(std::string(op) + d.name + ": expected > 0, got " + Str(d.v));
    }
  }
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16 && o.dtype != DType::kF16 &&
      o.dtype != DType::kI8) {
    return InvalidArgument(std::string(op) + "dtype: expected f32, bf16, f16 or i8, got " +
                           DTypeName(o.dtype));
  }
  // K and V: 2 * batch * kv_heads * capacity * head_dim elements, kept below 2^62 bytes.
  const double total = 2.0 * static_cast<double>(o.batch) * static_cast<double>(o.num_kv_heads) *
                       static_cast<double>(o.capacity) * static_cast<double>(o.head_dim) *
                       static_cast<double>(DTypeSize(o.dtype));
  if (total > 4.0e18) {
    return InvalidArgument(std::string(op) +
                           "size: batch * num_kv_heads * capacity * head_dim "
                           "overflows 64-bit byte counts (" +
                           std::to_string(total) + " bytes)");
  }
  *bytes = 2 * MatrixBytes(o);
  if (o.dtype == DType::kI8) {
    *bytes = ScalesOffset(o) + 2 * static_cast<size_t>(o.batch) *
                                   static_cast<size_t>(o.num_kv_heads) *
                                   static_cast<size_t>(o.capacity) * sizeof(float);
  }
  return Status::Ok();
}

Status KvCache::Create(const KvCacheOptions& o, std::unique_ptr<KvCache>* out) {
  if (out == nullptr) return InvalidArgument("KvCache::Create: out is null");
  size_t bytes = 0;
  Status s = RequiredBytes(o, &bytes);
  if (!s.ok()) return s;
  if (o.buffer != nullptr && o.buffer_bytes < bytes) {
    return InvalidArgument("KvCache::Create: buffer_bytes: expected >= " + std::to_string(bytes) +
                           " (K and V), got " + std::to_string(o.buffer_bytes));
  }
  // Elements are read as their own type (uint16_t / float; int8's scales are floats): the
  // buffer must be aligned to it.
  const size_t elem = o.dtype == DType::kI8 ? sizeof(float) : DTypeSize(o.dtype);
  if (o.buffer != nullptr && reinterpret_cast<uintptr_t>(o.buffer) % elem != 0) {
    return InvalidArgument("KvCache::Create: buffer: expected an address aligned to " +
                           std::to_string(elem) + " bytes (for " + DTypeName(o.dtype) +
                           " storage), got one " +
                           std::to_string(reinterpret_cast<uintptr_t>(o.buffer) % elem) +
                           " bytes past it");
  }
  auto c = std::make_unique<Impl>();
  c->batch = o.batch;
  c->capacity = o.capacity;
  c->kv_heads = o.num_kv_heads;
  c->head_dim = o.head_dim;
  c->dtype = o.dtype;
  uint8_t* base = static_cast<uint8_t*>(o.buffer);
  if (base == nullptr) {
    c->owned.reset(new (std::nothrow) uint8_t[bytes]());
    if (!c->owned) {
      return OutOfMemory("KvCache::Create: cannot allocate " + std::to_string(bytes) +
                         " bytes of K/V storage");
    }
    base = c->owned.get();
  }
  c->k_data = base;
  c->v_data = base + MatrixBytes(o);
  if (o.dtype == DType::kI8) {
    c->k_scales = reinterpret_cast<float*>(base + ScalesOffset(o));
    c->v_scales = c->k_scales + o.batch * o.num_kv_heads * o.capacity;
  }
  c->lengths.assign(static_cast<size_t>(o.batch), 0);
  c->ring = o.ring;
  c->floor.assign(static_cast<size_t>(o.batch), 0);
  out->reset(new KvCache(std::move(c)));
  return Status::Ok();
}

void KvCache::Reset() {
  std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0);
  std::fill(impl_->floor.begin(), impl_->floor.end(), 0);
}

namespace {

// The forward of a prompt x [N, T, E] (batch-first, as the cache takes it) as the layer reads
// it: [N, T, E] or [T, N, E] views of the same memory.
Status PromptView(const MultiheadAttention& layer, const TensorView& x, int64_t N, int64_t T,
                  TensorView* view) {
  const int64_t F = x.shape[2];
  if (layer.config().batch_first) {
    const int64_t shape[3] = {N, T, F}, strides[3] = {x.strides[0], x.strides[1], 1};
    return TensorView::Strided(x.data, DType::kF32, 3, shape, strides, view);
  }
  const int64_t shape[3] = {T, N, F}, strides[3] = {x.strides[1], x.strides[0], 1};
  return TensorView::Strided(x.data, DType::kF32, 3, shape, strides, view);
}

}  // namespace

void KvCache::Impl::StoreTokens(ThreadPool& pool, const float* k, const float* v,
                                ptrdiff_t batch_stride, ptrdiff_t token_stride, int64_t T,
                                const int64_t* counts, int64_t offset, int64_t keep_from) {
  const int64_t KVH = kv_heads, hd = head_dim;
  const CacheRows rows[2] = {{static_cast<uint8_t*>(k_data), k_scales, dtype, hd},
                             {static_cast<uint8_t*>(v_data), v_scales, dtype, hd}};
  pool.ParallelFor(static_cast<uint64_t>(batch * KVH), [&](uint64_t task, size_t /*worker*/) {
    const int64_t n = static_cast<int64_t>(task) / KVH, g = static_cast<int64_t>(task) % KVH;
    const int64_t c = counts != nullptr ? counts[n] : T;
    const int64_t pos0 = lengths[static_cast<size_t>(n)] + offset;
    const int64_t t0 = std::clamp<int64_t>(keep_from - pos0, 0, c);
    for (int mat = 0; mat < 2; ++mat) {
      const float* src = (mat == 0 ? k : v) + n * batch_stride + g * hd;
      for (int64_t t = t0; t < c; ++t) {
        StoreRow(src + t * token_stride, rows[mat], (n * KVH + g) * capacity + Slot(pos0 + t));
      }
    }
  });
}

Status KvCache::Impl::Prefill(Context& ctx, const MultiheadAttention& layer, const TensorView& x,
                              const TensorView& output, int64_t T) {
  AttentionInputs in;
  AttentionOutputs out;
  Status s = PromptView(layer, x, batch, T, &in.query);
  if (s.ok()) s = PromptView(layer, output, batch, T, &out.output);
  if (!s.ok()) return s;
  in.causal = true;
  // Keys and values go into the cache as the forward projects them, in tasks over (entry, kv
  // head); nothing else in the cache changes until the forward succeeds.
  // (Every length is 0 here: the keys of positions [begin, end) go to positions begin + t; the
  // forward has applied QK-norm and RoPE to them. A ring keeps the last `capacity` of them.)
  struct Sink {
    Impl* cache;
    int64_t keep_from;
  } sink{this, ring ? T - capacity : 0};
  auto store = [](void* user, Context& c, const ProjectedKv& kv) {
    const Sink& d = *static_cast<const Sink*>(user);
    d.cache->StoreTokens(PoolOf(c), kv.k, kv.v, kv.batch_stride, kv.token_stride, kv.end - kv.begin,
                         nullptr, kv.begin, d.keep_from);
  };
  s = ForwardWithKvSink(layer, ctx, in, out, store, &sink);
  if (!s.ok()) return s;
  for (int64_t n = 0; n < batch; ++n) Grow(n, T);
  return Status::Ok();
}

namespace {

// Arena bytes of the prompt forward of `tokens` tokens per entry (Prefill).
Status PrefillPlanBytes(const MultiheadAttention& layer, int64_t N, int64_t tokens,
                        size_t threads, size_t* bytes) {
  static float placeholder;
  const int64_t E = layer.config().embed_dim;
  const int64_t d = layer.config().q_dim != 0 ? layer.config().q_dim : E;
  const bool bf = layer.config().batch_first;
  const int64_t in_shape[3] = {bf ? N : tokens, bf ? tokens : N, d};
  const int64_t out_shape[3] = {in_shape[0], in_shape[1], E};
  AttentionInputs in;
  AttentionOutputs out;
  Status s = TensorView::Dense(&placeholder, DType::kF32, 3, in_shape, &in.query);
  if (s.ok()) s = TensorView::Dense(&placeholder, DType::kF32, 3, out_shape, &out.output);
  in.causal = true;
  if (s.ok()) s = layer.Plan(in, out, threads, bytes);
  return s;
}

}  // namespace

Status KvCache::Plan(const MultiheadAttention& layer, int64_t max_tokens, size_t num_threads,
                     size_t* bytes) const {
  const char* op = "KvCache::Plan: ";
  if (bytes == nullptr) return InvalidArgument(std::string(op) + "bytes is null");
  const LayerWeights& m = LayerWeightsOf(layer);
  Status s = ValidateCacheLayer(op, m, impl_->kv_heads, impl_->head_dim);
  if (s.ok()) s = impl_->CheckRing(op, m);
  if (!s.ok()) return s;
  if (max_tokens < 1 || max_tokens > (int64_t{1} << 31)) {
    return InvalidArgument(std::string(op) + "max_tokens: expected 1.." + Str(int64_t{1} << 31) +
                           ", got " + Str(max_tokens));
  }
  // A Step needs the most (projections, store and attention); within each schedule the
  // workspace grows with T, so the bound is the larger of the longest split call and T itself.
  const size_t threads = std::max<size_t>(num_threads, 1);
  const int64_t longest_split = std::min(max_tokens, kSplitMaxTokens);
  const size_t bound = std::max(
      PlanStep(m, impl_->batch, longest_split, impl_->capacity, impl_->ring, true, true, threads)
          .total,
      PlanStep(m, impl_->batch, max_tokens, impl_->capacity, impl_->ring, true, true, threads)
          .total);
  size_t planned = ArenaBytesFor(bound);
  // A prompt of kPrefillForwardMinTokens or more runs the forward (Prefill; layers that can
  // Step), whose workspace grows with the tokens except where the long-key chunking starts: the
  // bound is the larger of max_tokens and the longest prompt below it that is not chunked.
  if (max_tokens >= kPrefillForwardMinTokens && m.kd == m.qd && m.vd == m.qd) {
    const KeyChunking chunking = CurrentKeyChunking();
    const size_t kv_row_bytes = 2 * static_cast<size_t>(impl_->batch) * m.kvE * sizeof(float);
    const int64_t unchunked =
        chunking.min_kv_bytes == 0
            ? chunking.chunk_keys
            : std::max<int64_t>(chunking.chunk_keys,
                                static_cast<int64_t>(std::min<size_t>(
                                    (chunking.min_kv_bytes - 1) / kv_row_bytes, INT64_MAX)));
    for (const int64_t t : {max_tokens, std::clamp(unchunked, kPrefillForwardMinTokens,
                                                   max_tokens)}) {
      size_t forward_bytes = 0;
      s = PrefillPlanBytes(layer, impl_->batch, t, threads, &forward_bytes);
      if (!s.ok()) return Status(s.code(), std::string(op) + s.message());
      planned = std::max(planned, forward_bytes);
    }
  }
  *bytes = planned;
  return Status::Ok();
}

Status KvCache::Truncate(int64_t n, int64_t length) {
  if (n < 0 || n >= impl_->batch) {
    return InvalidArgument("KvCache::Truncate: n: expected a batch entry in [0, " +
                           Str(impl_->batch) + "), got " + Str(n));
  }
  const int64_t cur = impl_->lengths[static_cast<size_t>(n)];
  // A ring keeps the window of the next token readable: it drops at most capacity - window
  // positions (window: the last layer used, 1 before any).
  const int64_t window = std::max<int64_t>(impl_->window, 1);
  const int64_t lowest = impl_->ring ? std::max<int64_t>(0, cur - (impl_->capacity - window)) : 0;
  if (length < lowest || length > cur) {
    const std::string ring = impl_->ring
                                 ? "; a ring of capacity " + Str(impl_->capacity) + " and window " +
                                       Str(window) + " drops at most capacity - window positions"
                                 : std::string();
    return InvalidArgument("KvCache::Truncate: length: expected " + Str(lowest) + ".." + Str(cur) +
                           " (the current length of batch entry " + Str(n) + ring + "), got " +
                           Str(length));
  }
  impl_->lengths[static_cast<size_t>(n)] = length;
  return Status::Ok();
}

Status KvCache::Append(Context& ctx, const MultiheadAttention& layer, const TensorView& key,
                       const TensorView& value, const int64_t* counts) {
  return impl_->Execute(ctx, layer, nullptr, &key, &value, nullptr, counts, "KvCache::Append: ");
}

Status KvCache::AppendProjected(const TensorView& k, const TensorView& v, const int64_t* counts) {
  const char* op = "KvCache::AppendProjected: ";
  const TensorView* views[2] = {&k, &v};
  const char* names[2] = {"k", "v"};
  const int64_t T = k.present() && k.rank == 4 ? k.shape[2] : 0;
  for (int i = 0; i < 2; ++i) {
    const TensorView& t = *views[i];
    const bool ok = t.present() && t.rank == 4 && t.dtype == DType::kF32 &&
                    t.shape[0] == impl_->batch && t.shape[1] == impl_->kv_heads &&
                    t.shape[2] >= 1 && t.shape[2] == T && t.shape[3] == impl_->head_dim &&
                    (t.strides[3] == 1 || impl_->head_dim == 1);
    if (!ok) {
      return InvalidArgument(std::string(op) + names[i] + ": expected [" + Str(impl_->batch) +
                             ", " + Str(impl_->kv_heads) + ", " +
                             (T > 0 ? Str(T) : std::string("T")) + ", " + Str(impl_->head_dim) +
                             "] f32 with a contiguous last dimension, got " +
                             (t.present() ? t.ShapeString() : std::string("absent")));
    }
  }
  for (int64_t n = 0; n < impl_->batch; ++n) {
    const int64_t c = counts != nullptr ? counts[n] : T;
    const Status s = impl_->CheckCount(op, n, c, T, true);
    if (!s.ok()) return s;
  }
  const CacheRows rows[2] = {
      {static_cast<uint8_t*>(impl_->k_data), impl_->k_scales, impl_->dtype, impl_->head_dim},
      {static_cast<uint8_t*>(impl_->v_data), impl_->v_scales, impl_->dtype, impl_->head_dim}};
  for (int64_t n = 0; n < impl_->batch; ++n) {
    const int64_t c = counts != nullptr ? counts[n] : T;
    const int64_t len = impl_->lengths[static_cast<size_t>(n)];
    for (int64_t g = 0; g < impl_->kv_heads; ++g) {
      const int64_t row0 = (n * impl_->kv_heads + g) * impl_->capacity;
      for (int i = 0; i < 2; ++i) {
        const TensorView& t = *views[i];
        for (int64_t p = 0; p < c; ++p) {
          StoreRow(t.As<const float>() + n * t.strides[0] + g * t.strides[1] + p * t.strides[2],
                   rows[i], row0 + impl_->Slot(len + p));
        }
      }
    }
    impl_->Grow(n, len + c);
  }
  return Status::Ok();
}

Status KvCache::Forward(Context& ctx, const MultiheadAttention& layer, const TensorView& query,
                        const TensorView& output, const int64_t* counts) {
  return impl_->Execute(ctx, layer, &query, nullptr, nullptr, &output, counts,
                        "KvCache::Forward: ");
}

Status KvCache::Step(Context& ctx, const MultiheadAttention& layer, const TensorView& x,
                     const TensorView& output, const int64_t* counts) {
  return impl_->Execute(ctx, layer, &x, &x, &x, &output, counts, "KvCache::Step: ");
}

Status KvCache::Impl::Execute(Context& ctx, const MultiheadAttention& layer,
                              const TensorView* query, const TensorView* key,
                              const TensorView* value, const TensorView* output,
                              const int64_t* counts, const char* op) {
  const LayerWeights& m = LayerWeightsOf(layer);
  // ---- Validation: everything before anything is written.
  if (m.config.add_bias_kv || m.config.add_zero_attn) {
    return Unsupported(std::string(op) +
                       "layer: add_bias_kv / add_zero_attn append key positions at the end "
                       "of every sequence, which a KV cache cannot express; got add_bias_kv " +
                       (m.config.add_bias_kv ? "true" : "false") + ", add_zero_attn " +
                       (m.config.add_zero_attn ? "true" : "false"));
  }
  Status s = ValidateCacheLayer(op, m, kv_heads, head_dim);
  if (s.ok()) s = CheckRing(op, m);
  if (!s.ok()) return s;
  const bool append = key != nullptr;
  const bool forward = query != nullptr;
  const int64_t N = batch;
  BatchFirstSeq q, k, v, out;
  int64_t T = 0;
  if (forward) {
    s = ValidateBatchFirstSeq(*query, op, append ? "x" : "query", N, 0, m.qd, &q);
    if (!s.ok()) return s;
    T = q.tokens;
  }
  if (append) {
    if (forward && (m.kd != m.qd || m.vd != m.qd)) {
      return InvalidArgument(std::string(op) +
                             "layer: Step (self-attention) needs q_dim == kdim == vdim, got " +
                             Str(m.qd) + ", " + Str(m.kd) + ", " + Str(m.vd));
    }
    s = ValidateBatchFirstSeq(*key, op, forward ? "x" : "key", N, T, m.kd, &k);
    if (!s.ok()) return s;
    T = k.tokens;
    s = ValidateBatchFirstSeq(*value, op, forward ? "x" : "value", N, T, m.vd, &v);
    if (!s.ok()) return s;
  }
  if (forward) {
    s = ValidateBatchFirstSeq(*output, op, "output", N, T, m.D, &out);
    if (!s.ok()) return s;
  }
  // Lengths after the append, and the first query position of each entry.
  // A prompt into an empty cache runs the forward (a ring keeps its last `capacity` positions).
  bool prompt = forward && append && T >= kPrefillForwardMinTokens;
  for (int64_t n = 0; n < N && prompt; ++n) {
    prompt = lengths[static_cast<size_t>(n)] == 0 && (counts == nullptr || counts[n] == T);
  }
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = counts != nullptr ? counts[n] : T;
    s = CheckCount(op, n, c, T, append, prompt);
    if (!s.ok()) return s;
    // RoPE, ALiBi and the window take positions as int32 (kernels/rope.h, kernels/softmax.h).
    const int64_t end = lengths[static_cast<size_t>(n)] + (append ? c : 0);
    if (m.variants.any_position() && end > INT32_MAX) {
      return InvalidArgument(std::string(op) + "batch entry " + Str(n) +
                             ": positions of a layer with RoPE, ALiBi or a window are int32: "
                             "expected a length <= " +
                             Str(INT32_MAX) + ", got " + Str(end));
    }
  }

  for (int64_t n = 0; n < N && forward && !prompt; ++n) {
    s = CheckRingQueries(op, n, counts != nullptr ? counts[n] : T, append, m.variants.window);
    if (!s.ok()) return s;
  }
  window = m.variants.window;
  if (prompt) return Prefill(ctx, layer, *query, *output, T);

  // ---- Plan the workspace (shapes only).
  const int64_t E = m.E, kvE = m.kvE;
  const size_t threads = ctx.num_threads();
  const StepWorkspace ws = PlanStep(m, N, T, capacity, ring, append, forward, threads);
  const size_t per_worker = ws.per_worker;
  const size_t off = ws.total;
  s = ReserveArena(ctx, off);
  if (!s.ok()) return s;
  Arena& arena = ArenaOf(ctx);
  arena.Reset();
  void* base_ptr = nullptr;
  s = arena.Allocate(off, &base_ptr, "KV cache workspace");
  if (!s.ok()) return s;
  uint8_t* base = static_cast<uint8_t*>(base_ptr);
  uint8_t* scratch = base + ws.scratch;
  float* q_buf = reinterpret_cast<float*>(base + ws.q);
  float* k_new = reinterpret_cast<float*>(base + ws.k);
  float* v_new = reinterpret_cast<float*>(base + ws.v);
  ThreadPool& pool = PoolOf(ctx);

  // ---- 1. Projections.
  {
    GemmJob jobs[3];
    size_t num_jobs = 0;
    if (forward) {
      jobs[num_jobs++] = CacheProjectionJob(q, N, m.qd, m.w_q, m.b_q, E, q_buf);
    }
    if (append) {
      jobs[num_jobs++] = CacheProjectionJob(k, N, m.kd, m.w_k, m.b_k, kvE, k_new);
      jobs[num_jobs++] = CacheProjectionJob(v, N, m.vd, m.w_v, m.b_v, kvE, v_new);
    }
    ParallelGemm(pool, jobs, num_jobs, scratch, per_worker, TraceOf(ctx));
  }
  if (m.variants.qk_transform()) {
    // Positions (kv_cache.hpp): new key t of entry n at len_n + t, query i at len_n' - count_n
    // + i with len_n' the length after the append (padding rows: any valid position).
    // The step's length for RoPE scaling (rope_scaling.h): its largest real position + 1, the
    // longest entry's length after the append (padding rows and empty entries left out).
    int32_t* q_pos = reinterpret_cast<int32_t*>(base + ws.q_pos);
    int32_t* k_pos = reinterpret_cast<int32_t*>(base + ws.k_pos);
    int64_t rope_len = 0;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t len = lengths[static_cast<size_t>(n)];
      const int64_t c = counts != nullptr ? counts[n] : T;
      const int64_t q_first = len + (append ? c : 0) - c;
      if (c > 0) rope_len = std::max(rope_len, q_first + c);
      for (int64_t t = 0; t < T; ++t) {
        k_pos[n * T + t] = static_cast<int32_t>(len + std::min(t, c));
        q_pos[n * T + t] = static_cast<int32_t>(q_first + std::min(t, c));
      }
    }
    QkRows sets[2];
    size_t num_sets = 0;
    if (forward) sets[num_sets++] = {q_buf, N * T, static_cast<ptrdiff_t>(E), false, q_pos, 0};
    if (append) sets[num_sets++] = {k_new, N * T, static_cast<ptrdiff_t>(kvE), true, k_pos, 0};
    for (size_t i = 0; i < num_sets; ++i) sets[i].rope_len = rope_len;
    RunQkTransform(ctx, m, sets, num_sets, base + ws.qk_scratch);
  }

  // ---- 2. Store the new keys and values.
  if (append) {
    StoreTokens(pool, k_new, v_new, T * kvE, kvE, T, counts, 0);
    for (int64_t n = 0; n < N; ++n) {
      Grow(n, lengths[static_cast<size_t>(n)] + (counts != nullptr ? counts[n] : T));
    }
  }
  if (!forward) return TakeDispatchError(ctx);

  // ---- 3. Attention over the cache.
  CacheStorage storage;
  storage.k = k_data;
  storage.v = v_data;
  storage.k_scales = k_scales;
  storage.v_scales = v_scales;
  storage.dtype = dtype;
  storage.capacity = capacity;
  storage.ring = ring;
  storage.lengths = lengths.data();
  RunCacheAttention(pool, TraceOf(ctx), m, storage, N, T, counts, ws, base);
  float* concat = reinterpret_cast<float*>(base + ws.concat);

  // ---- 4. Output projection, then padding rows to 0.
  {
    const GemmJob job = OutputProjectionJob(m, concat, CacheLayout(N, T, T * E, E), out.data,
                                            CacheLayout(N, T, out.batch_stride, out.token_stride),
                                            static_cast<size_t>(N), static_cast<size_t>(T));
    ParallelGemm(pool, &job, 1, scratch, per_worker, TraceOf(ctx));
  }
  if (counts != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = counts[n]; i < T; ++i) {
        std::memset(out.data + n * out.batch_stride + i * out.token_stride, 0,
                    m.D * sizeof(float));
      }
    }
  }
  return TakeDispatchError(ctx);
}

}  // namespace mha
