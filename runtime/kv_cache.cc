// KvCache (contract in include/mha/kv_cache.hpp): the cache object (shape, storage, lengths),
// its storage's row stores (kv_storage.h), and the public calls. A call validates
// (ValidateCacheCall, validate.h), takes its plan (step_plan.h) and workspace, runs
// (decode_step.h) and only then commits the new lengths, so that a failed call changes nothing.
#include "mha/kv_cache.hpp"

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "kernels/decode.h"
#include "kernels/decode_int8.h"
#include "kernels/elementwise.h"
#include "runtime/attention_impl.h"
#include "runtime/context_internal.h"
#include "runtime/decode_step.h"
#include "runtime/kv_storage.h"
#include "runtime/large_buffer.h"
#include "runtime/layer_weights.h"
#include "runtime/plan_cache.h"
#include "runtime/step_plan.h"
#include "runtime/task_grid.h"
#include "runtime/thread_pool.h"
#include "runtime/validate.h"

namespace mha {

namespace {

// Bytes of one matrix's elements, and where the int8 scales start (after K's and V's elements,
// 4-byte aligned).
size_t MatrixBytes(const KvCacheOptions& o) {
  return static_cast<size_t>(o.batch) * static_cast<size_t>(o.num_kv_heads) *
         static_cast<size_t>(o.capacity) * static_cast<size_t>(o.head_dim) * DTypeSize(o.dtype);
}
size_t ScalesOffset(const KvCacheOptions& o) { return (2 * MatrixBytes(o) + 3) / 4 * 4; }

// Writes one row of head_dim f32 values into K or V (data, scales) at `row`.
void StoreRow(const CacheStorage& c, uint8_t* data, float* scales, int64_t row, const float* src) {
  uint8_t* dst = data + row * c.RowBytes();
  if (c.dtype == DType::kI8) {
    kernels::QuantizeRowI8(src, static_cast<size_t>(c.head_dim), reinterpret_cast<int8_t*>(dst),
                           scales + row);
  } else {
    ConvertElements(src, DType::kF32, dst, c.dtype, static_cast<size_t>(c.head_dim));
  }
}

}  // namespace

void StoreCacheRows(const CacheStorage& cache, int64_t n, int64_t g, int64_t pos0, const float* k,
                    ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, int64_t t0,
                    int64_t count) {
  for (int64_t t = t0; t < count; ++t) {
    StoreRow(cache, cache.k, cache.k_scales, cache.Row(n, g, cache.Slot(pos0 + t)),
             k + t * k_stride);
  }
  for (int64_t t = t0; t < count; ++t) {
    StoreRow(cache, cache.v, cache.v_scales, cache.Row(n, g, cache.Slot(pos0 + t)),
             v + t * v_stride);
  }
}

void StoreCacheTokens(ThreadPool& pool, const CacheStorage& cache, int64_t N,
                      const int64_t* lengths, const ProjectedKv& kv, const int64_t* counts,
                      int64_t keep_from) {
  const int64_t KVH = cache.kv_heads, hd = cache.head_dim;
  pool.ParallelFor(static_cast<uint64_t>(N * KVH), [&](uint64_t task, size_t /*worker*/) {
    const TaskPair ng = SplitTask(task, KVH);  // (entry, kv head)
    const int64_t n = ng.outer, g = ng.inner;
    const int64_t c = counts != nullptr ? counts[n] : kv.end - kv.begin;
    const int64_t pos0 = (lengths != nullptr ? lengths[n] : 0) + kv.begin;
    const int64_t t0 = std::clamp<int64_t>(keep_from - pos0, 0, c);
    const ptrdiff_t off = n * kv.batch_stride + g * hd;
    StoreCacheRows(cache, n, g, pos0, kv.k + off, kv.token_stride, kv.v + off, kv.token_stride, t0,
                   c);
  });
}

// The cache's state: shape, storage (owned or the caller's) and per-entry lengths. Hidden: as a
// member of the exported KvCache it would otherwise put its methods among libmha.so's symbols.
struct __attribute__((visibility("hidden"))) KvCache::Impl {
  // Validate, plan, take the workspace, run, commit: Append, Forward and Step.
  Status Execute(Context& ctx, const MultiheadAttention& layer, const TensorView* query,
                 const TensorView* key, const TensorView* value, const TensorView* output,
                 const int64_t* counts, const char* op);
  CacheState State() const {
    CacheState c;
    c.batch = batch;
    c.capacity = storage.capacity;
    c.kv_heads = storage.kv_heads;
    c.head_dim = storage.head_dim;
    c.ring = storage.ring;
    c.window = window;
    c.lengths = lengths.data();
    c.floor = floor.data();
    return c;
  }
  // After a call succeeded: the entries' new lengths (a ring's floors follow) and the layer's
  // window.
  void Commit(const int64_t* new_lengths, int64_t layer_window) {
    for (int64_t n = 0; n < batch; ++n) {
      const size_t i = static_cast<size_t>(n);
      lengths[i] = new_lengths[n];
      if (storage.ring) floor[i] = std::max(floor[i], lengths[i] - storage.capacity);
    }
    window = layer_window;
  }

  int64_t batch = 0;
  CacheStorage storage;  // K, then V: the layout of the file comment
  LargeBuffer owned;     // huge pages from kHugePageBytes (large_buffer.h)
  std::vector<int64_t> lengths;  // [batch], sized at creation
  std::vector<int64_t> ends;     // [batch]: a call's lengths after it, until it commits
  // Ring: the window of the last layer used (0 before any), and per entry the lowest position
  // whose slot still holds it (positions [floor_n, len_n) are readable).
  int64_t window = 0;
  std::vector<int64_t> floor;
  StepPlanCache plans;  // the plans of the calls made so far, reused (plan_cache.h)
};

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;

int64_t KvCache::batch() const { return impl_->batch; }
int64_t KvCache::capacity() const { return impl_->storage.capacity; }
int64_t KvCache::num_kv_heads() const { return impl_->storage.kv_heads; }
int64_t KvCache::head_dim() const { return impl_->storage.head_dim; }
DType KvCache::dtype() const { return impl_->storage.dtype; }
int64_t KvCache::length(int64_t n) const { return impl_->lengths[static_cast<size_t>(n)]; }
const void* KvCache::keys() const { return impl_->storage.k; }
const void* KvCache::values() const { return impl_->storage.v; }
const float* KvCache::key_scales() const { return impl_->storage.k_scales; }
const float* KvCache::value_scales() const { return impl_->storage.v_scales; }

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
  if (o.int8_attention && o.dtype != DType::kI8) {
    return InvalidArgument(std::string(op) + "int8_attention: expected dtype i8, got " +
                           DTypeName(o.dtype));
  }
  if (o.int8_attention && o.head_dim > static_cast<int64_t>(kernels::kDotMaxHeadDim)) {
    return InvalidArgument(std::string(op) + "int8_attention: expected head_dim <= " +
                           Str(static_cast<int64_t>(kernels::kDotMaxHeadDim)) + ", got " +
                           Str(o.head_dim));
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
    return InvalidArgument(
        "KvCache::Create: buffer: expected an address aligned to " + std::to_string(elem) +
        " bytes (for " + DTypeName(o.dtype) + " storage), got one " +
        std::to_string(reinterpret_cast<uintptr_t>(o.buffer) % elem) + " bytes past it");
  }
  auto c = std::make_unique<Impl>();
  c->batch = o.batch;
  CacheStorage& st = c->storage;
  st.dtype = o.dtype;
  st.kv_heads = o.num_kv_heads;
  st.head_dim = o.head_dim;
  st.capacity = o.capacity;
  st.ring = o.ring;
  st.int8_dot = o.int8_attention;
  uint8_t* base = static_cast<uint8_t*>(o.buffer);
  if (base == nullptr) {
    c->owned = AllocateLargeBuffer(bytes);
    if (!c->owned) {
      return OutOfMemory("KvCache::Create: cannot allocate " + std::to_string(bytes) +
                         " bytes of K/V storage");
    }
    base = c->owned.get();
  }
  st.k = base;
  st.v = base + MatrixBytes(o);
  if (o.dtype == DType::kI8) {
    st.k_scales = reinterpret_cast<float*>(base + ScalesOffset(o));
    st.v_scales = st.k_scales + o.batch * o.num_kv_heads * o.capacity;
  }
  c->lengths.assign(static_cast<size_t>(o.batch), 0);
  c->ends.assign(static_cast<size_t>(o.batch), 0);
  c->floor.assign(static_cast<size_t>(o.batch), 0);
  out->reset(new KvCache(std::move(c)));
  return Status::Ok();
}

void KvCache::Reset() {
  std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0);
  std::fill(impl_->floor.begin(), impl_->floor.end(), 0);
}

Status KvCache::Plan(const MultiheadAttention& layer, int64_t max_tokens, size_t num_threads,
                     size_t* bytes) const {
  const char* op = "KvCache::Plan: ";
  if (bytes == nullptr) return InvalidArgument(std::string(op) + "bytes is null");
  const LayerWeights& m = LayerWeightsOf(layer);
  const Status s = ValidateCacheLayer(op, m, impl_->State());
  if (!s.ok()) return s;
  if (max_tokens < 1 || max_tokens > (int64_t{1} << 31)) {
    return InvalidArgument(std::string(op) + "max_tokens: expected 1.." + Str(int64_t{1} << 31) +
                           ", got " + Str(max_tokens));
  }
  const CacheStorage& st = impl_->storage;
  size_t planned = 0;
  const Status p = PlanCacheCallBound(layer, m, impl_->batch, st.capacity, st.ring, max_tokens,
                                      std::max<size_t>(num_threads, 1), &planned);
  if (!p.ok()) return Status(p.code(), std::string(op) + p.message());
  *bytes = planned;
  return Status::Ok();
}

Status KvCache::Truncate(int64_t n, int64_t length) {
  if (n < 0 || n >= impl_->batch) {
    return InvalidArgument("KvCache::Truncate: n: expected a batch entry in [0, " +
                           Str(impl_->batch) + "), got " + Str(n));
  }
  const int64_t cur = impl_->lengths[static_cast<size_t>(n)];
  const int64_t capacity = impl_->storage.capacity;
  const bool ring = impl_->storage.ring;
  // A ring keeps the window of the next token readable: it drops at most capacity - window
  // positions (window: the last layer used, 1 before any).
  const int64_t window = std::max<int64_t>(impl_->window, 1);
  const int64_t lowest = ring ? std::max<int64_t>(0, cur - (capacity - window)) : 0;
  if (length < lowest || length > cur) {
    const std::string note = ring ? "; a ring of capacity " + Str(capacity) + " and window " +
                                        Str(window) + " drops at most capacity - window positions"
                                  : std::string();
    return InvalidArgument("KvCache::Truncate: length: expected " + Str(lowest) + ".." + Str(cur) +
                           " (the current length of batch entry " + Str(n) + note + "), got " +
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
  const CacheStorage& st = impl_->storage;
  const int64_t N = impl_->batch;
  const TensorView* views[2] = {&k, &v};
  const char* names[2] = {"k", "v"};
  const int64_t T = k.present() && k.rank == 4 ? k.shape[2] : 0;
  for (int i = 0; i < 2; ++i) {
    const TensorView& t = *views[i];
    const bool ok = t.present() && t.rank == 4 && t.dtype == DType::kF32 && t.shape[0] == N &&
                    t.shape[1] == st.kv_heads && t.shape[2] >= 1 && t.shape[2] == T &&
                    t.shape[3] == st.head_dim && (t.strides[3] == 1 || st.head_dim == 1);
    if (!ok) {
      return InvalidArgument(std::string(op) + names[i] + ": expected [" + Str(N) + ", " +
                             Str(st.kv_heads) + ", " + (T > 0 ? Str(T) : std::string("T")) + ", " +
                             Str(st.head_dim) + "] f32 with a contiguous last dimension, got " +
                             (t.present() ? t.ShapeString() : std::string("absent")));
    }
  }
  const CacheState state = impl_->State();
  for (int64_t n = 0; n < N; ++n) {
    const Status s = ValidateTokenCount(op, state, n, counts != nullptr ? counts[n] : T, T, true);
    if (!s.ok()) return s;
  }
  const float* kd = k.As<const float>();
  const float* vd = v.As<const float>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = counts != nullptr ? counts[n] : T;
    const int64_t len = impl_->lengths[static_cast<size_t>(n)];
    for (int64_t g = 0; g < st.kv_heads; ++g) {
      StoreCacheRows(st, n, g, len, kd + n * k.strides[0] + g * k.strides[1], k.strides[2],
                     vd + n * v.strides[0] + g * v.strides[1], v.strides[2], 0, c);
    }
    impl_->ends[static_cast<size_t>(n)] = len + c;
  }
  impl_->Commit(impl_->ends.data(), impl_->window);
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
  CacheCallArgs args;
  Status s = ValidateCacheCall(op, m, State(), query, key, value, output, counts, &args);
  if (!s.ok()) return s;
  for (int64_t n = 0; n < batch; ++n) {
    ends[static_cast<size_t>(n)] =
        lengths[static_cast<size_t>(n)] + (args.append ? args.Count(n) : 0);
  }
  if (args.prompt) {
    s = RunPromptForward(ctx, layer, storage, batch, *query, *output, args.T);
    if (!s.ok()) return s;
    Commit(ends.data(), m.variants.window);
    return Status::Ok();
  }
  // The plan of these shapes: made once, then reused (plan_cache.h).
  StepPlanKey plan_key;
  plan_key.layer = m.id;
  plan_key.epoch = PlanSettingsEpoch();
  plan_key.shapes.N = batch;
  plan_key.shapes.T = args.T;
  plan_key.shapes.capacity = storage.capacity;
  plan_key.shapes.ring = storage.ring;
  plan_key.shapes.append = args.append;
  plan_key.shapes.forward = args.forward;
  plan_key.threads = ctx.num_threads();
  const StepPlan& plan =
      plans.Get(plan_key, [&] { return PlanStep(m, plan_key.shapes, plan_key.threads); });
  uint8_t* base = nullptr;
  s = TakeWorkspace(ctx, plan.total, "KV cache workspace", &base);
  if (!s.ok()) return s;
  RunDecodeStep(ctx, m, storage, lengths.data(), ends.data(), args, plan, base);
  Commit(ends.data(), m.variants.window);
  return TakeDispatchError(ctx);
}

}  // namespace mha
