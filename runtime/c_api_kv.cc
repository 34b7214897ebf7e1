// The C API of the KV cache (the "KV cache" section of include/mha/mha.h): a thin,
// exception-free layer over mha::KvCache (include/mha/kv_cache.hpp), in the style of
// runtime/c_api.cc, whose helpers it shares through runtime/c_api_internal.h.
#include <cstdint>
#include <memory>
#include <string>

#include "mha/kv_cache.hpp"
#include "mha/mha.h"
#include "mha/mha.hpp"
#include "runtime/c_api_internal.h"

struct mha_kv_cache {
  std::unique_ptr<mha::KvCache> impl;
};

namespace mha {
namespace {

using c_api::NullArg;
using c_api::ToView;

// KvCache's messages start with the C++ function ("KvCache::Step: ", "KvCache: "); Guard puts
// the C function's name first, which replaces it.
Status WithoutCppPrefix(const Status& s) {
  const std::string& m = s.message();
  const size_t colon = m.find(": ");
  if (s.ok() || m.compare(0, 7, "KvCache") != 0 || colon == std::string::npos) return s;
  return Status(s.code(), m.substr(colon + 2));
}

Status ToCacheOptions(const mha_layer* layer, const mha_kv_cache_options* options,
                      KvCacheOptions* out) {
  if (layer == nullptr) return NullArg("layer");
  if (options == nullptr) return NullArg("options");
  const int32_t dtype = options->dtype;
  if (dtype != MHA_DTYPE_F32 && dtype != MHA_DTYPE_BF16 && dtype != MHA_DTYPE_F16 &&
      dtype != MHA_DTYPE_I8) {
    return InvalidArgument(
        "options->dtype: expected MHA_DTYPE_F32 (0), MHA_DTYPE_BF16 (1), MHA_DTYPE_F16 (2) or "
        "MHA_DTYPE_I8 (5), got " +
        std::to_string(dtype));
  }
  *out = KvCacheOptions::ForLayer(*layer->impl, options->batch, options->capacity,
                                  static_cast<DType>(dtype));
  out->buffer = options->buffer;
  out->buffer_bytes = options->buffer_bytes;
  if (options->ring != 0 && options->ring != 1) {
    return InvalidArgument("options->ring: expected 0 or 1, got " + std::to_string(options->ring));
  }
  out->ring = options->ring != 0;
  if (options->int8_attention != 0 && options->int8_attention != 1) {
    return InvalidArgument("options->int8_attention: expected 0 or 1, got " +
                           std::to_string(options->int8_attention));
  }
  if (options->int8_attention == 1 && dtype != MHA_DTYPE_I8) {
    return InvalidArgument(
        "options->int8_attention: expected options->dtype MHA_DTYPE_I8 (5), got " +
        std::to_string(dtype));
  }
  out->int8_attention = options->int8_attention != 0;
  return Status::Ok();
}

// Append, Forward and Step: KvCache members taking the context, the layer, two tensors and
// the counts.
using LayerOp = Status (KvCache::*)(Context&, const MultiheadAttention&, const TensorView&,
                                    const TensorView&, const int64_t*);

// Runs `op` as the C function `fn` after checking the handles and converting the two tensors
// (both required), which the message calls a_name and b_name.
mha_status LayerCall(const char* fn, LayerOp op, mha_kv_cache* cache, const mha_layer* layer,
                     mha_context* context, const mha_tensor* a, const char* a_name,
                     const mha_tensor* b, const char* b_name, const int64_t* counts) {
  return c_api::Guard(fn, [&]() -> Status {
    if (cache == nullptr) return NullArg("cache");
    if (layer == nullptr) return NullArg("layer");
    if (context == nullptr) return NullArg("context");
    TensorView va, vb;
    Status s = ToView(a, a_name, /*required=*/true, &va);
    if (s.ok()) s = ToView(b, b_name, /*required=*/true, &vb);
    if (!s.ok()) return s;
    return WithoutCppPrefix((*cache->impl.*op)(*context->impl, *layer->impl, va, vb, counts));
  });
}

Status CheckEntry(const mha_kv_cache& cache, int64_t n) {
  const int64_t batch = cache.impl->batch();
  if (n < 0 || n >= batch) {
    return InvalidArgument("n: expected a batch entry in [0, " + std::to_string(batch) + "), got " +
                           std::to_string(n));
  }
  return Status::Ok();
}

}  // namespace
}  // namespace mha

using mha::Status;
using mha::c_api::Guard;
using mha::c_api::NullArg;

extern "C" {

mha_status mha_kv_cache_required_bytes(const mha_layer* layer, const mha_kv_cache_options* options,
                                       size_t* bytes) {
  return Guard("mha_kv_cache_required_bytes", [&]() -> Status {
    mha::KvCacheOptions o;
    Status s = mha::ToCacheOptions(layer, options, &o);
    if (!s.ok()) return s;
    if (bytes == nullptr) return NullArg("bytes");
    size_t b = 0;
    s = mha::WithoutCppPrefix(mha::KvCache::RequiredBytes(o, &b));
    if (!s.ok()) return s;
    *bytes = b;
    return Status::Ok();
  });
}

mha_status mha_kv_cache_create(const mha_layer* layer, const mha_kv_cache_options* options,
                               mha_kv_cache** out) {
  return Guard("mha_kv_cache_create", [&]() -> Status {
    mha::KvCacheOptions o;
    Status s = mha::ToCacheOptions(layer, options, &o);
    if (!s.ok()) return s;
    if (out == nullptr) return NullArg("out");
    auto handle = std::make_unique<mha_kv_cache>();
    s = mha::WithoutCppPrefix(mha::KvCache::Create(o, &handle->impl));
    if (!s.ok()) return s;
    *out = handle.release();
    return Status::Ok();
  });
}

void mha_kv_cache_destroy(mha_kv_cache* cache) { delete cache; }

mha_status mha_kv_cache_plan(const mha_kv_cache* cache, const mha_layer* layer,
                             int64_t max_tokens, size_t num_threads, size_t* bytes) {
  return Guard("mha_kv_cache_plan", [&]() -> Status {
    if (cache == nullptr) return NullArg("cache");
    if (layer == nullptr) return NullArg("layer");
    if (bytes == nullptr) return NullArg("bytes");
    size_t b = 0;
    Status s = mha::WithoutCppPrefix(cache->impl->Plan(*layer->impl, max_tokens, num_threads, &b));
    if (!s.ok()) return s;
    *bytes = b;
    return Status::Ok();
  });
}

mha_status mha_kv_cache_reset(mha_kv_cache* cache) {
  return Guard("mha_kv_cache_reset", [&]() -> Status {
    if (cache == nullptr) return NullArg("cache");
    cache->impl->Reset();
    return Status::Ok();
  });
}

mha_status mha_kv_cache_truncate(mha_kv_cache* cache, int64_t n, int64_t length) {
  return Guard("mha_kv_cache_truncate", [&]() -> Status {
    if (cache == nullptr) return NullArg("cache");
    return mha::WithoutCppPrefix(cache->impl->Truncate(n, length));
  });
}

mha_status mha_kv_cache_length(const mha_kv_cache* cache, int64_t n, int64_t* length) {
  return Guard("mha_kv_cache_length", [&]() -> Status {
    if (cache == nullptr) return NullArg("cache");
    if (length == nullptr) return NullArg("length");
    Status s = mha::CheckEntry(*cache, n);
    if (!s.ok()) return s;
    *length = cache->impl->length(n);
    return Status::Ok();
  });
}

mha_status mha_kv_cache_append(mha_kv_cache* cache, const mha_layer* layer, mha_context* context,
                               const mha_tensor* key, const mha_tensor* value,
                               const int64_t* counts) {
  return mha::LayerCall("mha_kv_cache_append", &mha::KvCache::Append, cache, layer, context, key,
                        "key", value, "value", counts);
}

mha_status mha_kv_cache_append_projected(mha_kv_cache* cache, const mha_tensor* k,
                                         const mha_tensor* v, const int64_t* counts) {
  return Guard("mha_kv_cache_append_projected", [&]() -> Status {
    if (cache == nullptr) return NullArg("cache");
    mha::TensorView k_view, v_view;
    Status s = mha::c_api::ToView(k, "k", /*required=*/true, &k_view);
    if (s.ok()) s = mha::c_api::ToView(v, "v", /*required=*/true, &v_view);
    if (!s.ok()) return s;
    return mha::WithoutCppPrefix(cache->impl->AppendProjected(k_view, v_view, counts));
  });
}

mha_status mha_kv_cache_forward(mha_kv_cache* cache, const mha_layer* layer, mha_context* context,
                                const mha_tensor* query, const mha_tensor* output,
                                const int64_t* counts) {
  return mha::LayerCall("mha_kv_cache_forward", &mha::KvCache::Forward, cache, layer, context,
                        query, "query", output, "output", counts);
}

mha_status mha_kv_cache_step(mha_kv_cache* cache, const mha_layer* layer, mha_context* context,
                             const mha_tensor* x, const mha_tensor* output, const int64_t* counts) {
  return mha::LayerCall("mha_kv_cache_step", &mha::KvCache::Step, cache, layer, context, x, "x",
                        output, "output", counts);
}

}  // extern "C"
