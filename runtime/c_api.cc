// The C API (include/mha/mha.h): a thin, exception-free layer over the C++ API. Each entry point
// checks its pointers, converts mha_tensor descriptions to TensorViews, calls the C++ API and
// records the outcome in a thread-local message.
#include "mha/mha.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/c_api_internal.h"
#include "runtime/safetensors.h"
#include "runtime/weights.h"

namespace mha {
namespace {

static_assert(static_cast<int>(MHA_STATUS_INTERNAL) == static_cast<int>(StatusCode::kInternal),
              "mha_status values must equal mha::StatusCode values");
static_assert(static_cast<int>(MHA_DTYPE_U8) == static_cast<int>(DType::kU8) &&
                  static_cast<int>(MHA_DTYPE_I8) == static_cast<int>(DType::kI8),
              "mha_dtype values must equal mha::DType values");
static_assert(static_cast<int>(MHA_DTYPE_I32) == static_cast<int>(DType::kI32) &&
                  static_cast<int>(MHA_DTYPE_I64) == static_cast<int>(DType::kI64) &&
                  static_cast<int>(MHA_DTYPE_I4) == static_cast<int>(DType::kI4),
              "mha_dtype values must equal mha::DType values");
static_assert(static_cast<int>(MHA_ROPE_NEOX) == static_cast<int>(RopeStyle::kNeox) &&
                  static_cast<int>(MHA_ROPE_GPTJ) == static_cast<int>(RopeStyle::kGptj),
              "mha_rope values must equal mha::RopeStyle values");
static_assert(
    static_cast<int>(MHA_ROPE_SCALING_LINEAR) == static_cast<int>(RopeScaling::kLinear) &&
        static_cast<int>(MHA_ROPE_SCALING_DYNAMIC) == static_cast<int>(RopeScaling::kDynamic) &&
        static_cast<int>(MHA_ROPE_SCALING_LLAMA3) == static_cast<int>(RopeScaling::kLlama3) &&
        static_cast<int>(MHA_ROPE_SCALING_YARN) == static_cast<int>(RopeScaling::kYarn) &&
        static_cast<int>(MHA_ROPE_SCALING_LONGROPE) == static_cast<int>(RopeScaling::kLongRope),
    "mha_rope_scaling values must equal mha::RopeScaling values");
static_assert(static_cast<int>(MHA_QKV_LAYOUT_PER_HEAD) == static_cast<int>(QkvLayout::kPerHead),
              "mha_qkv_layout values must equal mha::QkvLayout values");
static_assert(static_cast<int>(MHA_GROUPED_FORWARD_OFF) == static_cast<int>(GroupedForward::kOff) &&
                  static_cast<int>(MHA_BF16_KERNEL_EMULATED) ==
                      static_cast<int>(Bf16KernelChoice::kEmulated) &&
                  static_cast<int>(MHA_BF16_KERNEL_AVX512_BF16) ==
                      static_cast<int>(Bf16KernelChoice::kAvx512Bf16) &&
                  static_cast<int>(MHA_BF16_KERNEL_AMX) ==
                      static_cast<int>(Bf16KernelChoice::kAmx) &&
                  static_cast<int>(MHA_BF16_KERNEL_NEON_BF16) ==
                      static_cast<int>(Bf16KernelChoice::kNeonBf16),
              "mha_grouped_forward / mha_bf16_kernel values must equal mha's enums");
static_assert(MHA_MAX_RANK == kMaxRank, "MHA_MAX_RANK must equal mha::kMaxRank");

// The calling thread's message for its last call. Thread-local so concurrent callers (one
// context per thread) never overwrite each other's message.
thread_local std::string last_error;

static_assert(std::is_same<mha_task_fn, Executor::TaskFn>::value,
              "mha_task_fn must be mha::Executor::TaskFn");

// A C host's mha_executor (copied) as an mha::Executor.
class CExecutor final : public Executor {
 public:
  explicit CExecutor(const mha_executor& e) : e_(e) {}
  size_t num_workers() const override { return e_.num_workers; }
  void ParallelFor(uint64_t num_tasks, TaskFn task_fn, void* task_arg) override {
    e_.parallel_for(e_.user, num_tasks, task_fn, task_arg);
  }

 private:
  const mha_executor e_;
};

}  // namespace

// Shared with runtime/c_api_kv.cc through runtime/c_api_internal.h.
namespace c_api {

mha_status Record(const Status& s) {
  if (s.ok()) {
    last_error.clear();
  } else {
    last_error = s.message();
  }
  return static_cast<mha_status>(s.code());
}

mha_status Fail(StatusCode code, std::string message) {
  return Record(Status(code, std::move(message)));
}

Status NullArg(const char* name) {
  return InvalidArgument(std::string(name) + ": expected a non-NULL pointer, got NULL");
}

namespace {

// The element types a tensor argument may have: the general ones (F32..U8) or positions (I32,
// I64); the operator checks which of them each argument accepts.
enum class TensorKind { kGeneral, kPositions };

Status ToViewOfKind(const mha_tensor* t, const char* name, bool required, TensorKind kind,
                    TensorView* out) {
  if (t == nullptr) {
    if (required) return NullArg(name);
    *out = TensorView();
    return Status::Ok();
  }
  if (t->data == nullptr) {
    if (required) {
      return InvalidArgument(std::string(name) + ".data: expected a non-NULL pointer, got NULL");
    }
    *out = TensorView();
    return Status::Ok();
  }
  const int32_t dtype = t->dtype;
  if (kind == TensorKind::kPositions) {
    if (dtype != MHA_DTYPE_I32 && dtype != MHA_DTYPE_I64) {
      return InvalidArgument(std::string(name) +
                             ".dtype: expected MHA_DTYPE_I32 (6) or MHA_DTYPE_I64 (7), got " +
                             std::to_string(dtype));
    }
  } else if (dtype < static_cast<int>(MHA_DTYPE_F32) || dtype > static_cast<int>(MHA_DTYPE_U8)) {
    return InvalidArgument(std::string(name) + ".dtype: expected MHA_DTYPE_F32..MHA_DTYPE_U8 (0..4), got " +
                           std::to_string(dtype));
  }
  if (t->rank < 1 || t->rank > kMaxRank) {
    return InvalidArgument(std::string(name) + ".rank: expected 1..4, got " +
                           std::to_string(t->rank));
  }
  bool dense = true;
  for (int i = 0; i < t->rank; ++i) dense = dense && t->strides[i] == 0;
  // Zero-sized dimensions pass here; the operator then reports them with the expected shape.
  if (dense) {
    return TensorView::Dense(t->data, static_cast<DType>(dtype), t->rank, t->shape, out, name,
                             /*allow_empty=*/true);
  }
  return TensorView::Strided(t->data, static_cast<DType>(dtype), t->rank, t->shape, t->strides,
                             out, name, /*allow_empty=*/true);
}

}  // namespace

Status ToView(const mha_tensor* t, const char* name, bool required, TensorView* out) {
  return ToViewOfKind(t, name, required, TensorKind::kGeneral, out);
}

Status ToPositionsView(const mha_tensor* t, const char* name, TensorView* out) {
  return ToViewOfKind(t, name, /*required=*/false, TensorKind::kPositions, out);
}

}  // namespace c_api

namespace {

using c_api::NullArg;
using c_api::ToPositionsView;
using c_api::ToView;

Status ToInputs(const mha_attention_inputs* in, AttentionInputs* out) {
  if (in == nullptr) return NullArg("inputs");
  Status s = ToView(&in->query, "inputs->query", /*required=*/true, &out->query);
  if (s.ok()) s = ToView(&in->key, "inputs->key", false, &out->key);
  if (s.ok()) s = ToView(&in->value, "inputs->value", false, &out->value);
  if (s.ok()) s = ToView(&in->attn_mask, "inputs->attn_mask", false, &out->attn_mask);
  if (s.ok()) {
    s = ToView(&in->key_padding_mask, "inputs->key_padding_mask", false, &out->key_padding_mask);
  }
  if (s.ok()) s = ToPositionsView(&in->positions, "inputs->positions", &out->positions);
  if (s.ok()) {
    s = ToPositionsView(&in->key_positions, "inputs->key_positions", &out->key_positions);
  }
  return s;
}

constexpr uint32_t kKnownFlags = MHA_FORWARD_CAUSAL | MHA_FORWARD_PER_HEAD_WEIGHTS;

// Fills everything a forward or plan call shares. `output_data_optional`: mha_layer_plan only
// checks shapes, so output data may be NULL there.
Status ToForwardArgs(const mha_attention_inputs* inputs, const mha_tensor* output,
                     const mha_tensor* attn_weights, uint32_t flags, bool output_data_optional,
                     AttentionInputs* in, AttentionOutputs* out) {
  if ((flags & ~kKnownFlags) != 0) {
    return InvalidArgument("flags: expected a combination of MHA_FORWARD_CAUSAL (1) and "
                           "MHA_FORWARD_PER_HEAD_WEIGHTS (2), got " + std::to_string(flags));
  }
  Status s = ToInputs(inputs, in);
  if (!s.ok()) return s;
  if (output == nullptr) return NullArg("output");
  // Plan validates shapes only and never touches data: any non-null address stands in.
  static char placeholder;
  mha_tensor o = *output;
  if (output_data_optional && o.data == nullptr) o.data = &placeholder;
  s = ToView(&o, "output", /*required=*/true, &out->output);
  if (!s.ok()) return s;
  if (attn_weights != nullptr) {
    mha_tensor w = *attn_weights;
    if (output_data_optional && w.data == nullptr) w.data = &placeholder;
    s = ToView(&w, "attn_weights", /*required=*/true, &out->attn_weights);
    if (!s.ok()) return s;
  }
  in->causal = (flags & MHA_FORWARD_CAUSAL) != 0;
  in->need_weights = attn_weights != nullptr;
  in->average_attn_weights = (flags & MHA_FORWARD_PER_HEAD_WEIGHTS) == 0;
  return Status::Ok();
}

Status CheckBool(int32_t v, const char* name) {
  if (v != 0 && v != 1) {
    return InvalidArgument(std::string(name) + ": expected 0 or 1, got " + std::to_string(v));
  }
  return Status::Ok();
}

Status CheckPrepack(int32_t v, const char* name) {
  if (v != MHA_PREPACK_ON && v != MHA_PREPACK_OFF && v != MHA_PREPACK_PLAIN &&
      v != MHA_PREPACK_STRASSEN) {
    return InvalidArgument(std::string(name) +
                           ": expected MHA_PREPACK_ON (0), MHA_PREPACK_OFF (1), "
                           "MHA_PREPACK_PLAIN (2) or MHA_PREPACK_STRASSEN (3), got " +
                           std::to_string(v));
  }
  return Status::Ok();
}

Status CheckCompute(int32_t v, const char* name) {
  if (v != MHA_COMPUTE_F32 && v != MHA_COMPUTE_BF16 && v != MHA_COMPUTE_INT8) {
    return InvalidArgument(std::string(name) +
                           ": expected MHA_COMPUTE_F32 (0), MHA_COMPUTE_BF16 (1) or "
                           "MHA_COMPUTE_INT8 (2), got " +
                           std::to_string(v));
  }
  return Status::Ok();
}

Status CheckWeightDtype(int32_t v, const char* name) {
  if (v != MHA_DTYPE_F32 && v != MHA_DTYPE_BF16 && v != MHA_DTYPE_F16 && v != MHA_DTYPE_I8 &&
      v != MHA_DTYPE_I4) {
    return InvalidArgument(std::string(name) +
                           ": expected MHA_DTYPE_F32 (0), MHA_DTYPE_BF16 (1), "
                           "MHA_DTYPE_F16 (2), MHA_DTYPE_I8 (5) or MHA_DTYPE_I4 (8), got " +
                           std::to_string(v));
  }
  return Status::Ok();
}

Status CheckRope(int32_t v, const char* name) {
  if (v != MHA_ROPE_NONE && v != MHA_ROPE_NEOX && v != MHA_ROPE_GPTJ) {
    return InvalidArgument(std::string(name) +
                           ": expected MHA_ROPE_NONE (0), MHA_ROPE_NEOX (1) "
                           "or MHA_ROPE_GPTJ (2), got " +
                           std::to_string(v));
  }
  return Status::Ok();
}

// The variant fields mha_layer_config and mha_load_options share (their C names are equal, so
// one template serves both). Values are range-checked by the C++ API; only the enum and the
// booleans, which C cannot type, are checked here.
template <typename CStruct, typename Out>
Status ToVariants(const CStruct& c, const char* owner, Out* out) {
  const std::string o(owner);
  Status s = CheckRope(c.rope, (o + "->rope").c_str());
  if (s.ok()) s = CheckBool(c.alibi, (o + "->alibi").c_str());
  if (!s.ok()) return s;
  out->rope = static_cast<RopeStyle>(c.rope);
  out->rope_theta = c.rope_theta;
  out->rotary_dim = c.rotary_dim;
  out->rope_scale = c.rope_scale;
  out->alibi = c.alibi != 0;
  out->window = c.window;
  out->softcap = c.softcap;
  out->qk_norm_eps = c.qk_norm_eps;
  return Status::Ok();
}

// mha_layer_config's RoPE scaling fields (values range-checked by the C++ API; the enum and
// the boolean here).
Status ToRopeScaling(const mha_layer_config& c, AttentionConfig* out) {
  if (c.rope_scaling < MHA_ROPE_SCALING_NONE || c.rope_scaling > MHA_ROPE_SCALING_LONGROPE) {
    return InvalidArgument(
        "config->rope_scaling: expected MHA_ROPE_SCALING_NONE (0), _LINEAR (1), _DYNAMIC (2), "
        "_LLAMA3 (3), _YARN (4) or _LONGROPE (5), got " +
        std::to_string(c.rope_scaling));
  }
  const Status s = CheckBool(c.rope_no_truncate, "config->rope_no_truncate");
  if (!s.ok()) return s;
  out->rope_scaling = static_cast<RopeScaling>(c.rope_scaling);
  out->rope_factor = c.rope_factor;
  out->rope_original_max_positions = c.rope_original_max_positions;
  out->rope_low_freq_factor = c.rope_low_freq_factor;
  out->rope_high_freq_factor = c.rope_high_freq_factor;
  out->rope_beta_fast = c.rope_beta_fast;
  out->rope_beta_slow = c.rope_beta_slow;
  out->rope_attention_factor = c.rope_attention_factor;
  out->rope_no_truncate = c.rope_no_truncate != 0;
  return Status::Ok();
}

Status ToConfig(const mha_layer_config& c, AttentionConfig* out) {
  const std::pair<int32_t, const char*> flags[] = {{c.no_bias, "config->no_bias"},
                                                   {c.add_bias_kv, "config->add_bias_kv"},
                                                   {c.add_zero_attn, "config->add_zero_attn"},
                                                   {c.batch_first, "config->batch_first"},
                                                   {c.qk_norm_whole, "config->qk_norm_whole"}};
  for (const auto& f : flags) {
    Status s = CheckBool(f.first, f.second);
    if (!s.ok()) return s;
  }
  // Negative optional dims would silently mean "default" nowhere; they are rejected by name.
  const std::pair<int64_t, const char*> dims[] = {{c.num_kv_heads, "config->num_kv_heads"},
                                                   {c.q_dim, "config->q_dim"},
                                                   {c.kdim, "config->kdim"},
                                                   {c.vdim, "config->vdim"},
                                                   {c.head_dim, "config->head_dim"}};
  for (const auto& d : dims) {
    if (d.first < 0) {
      return InvalidArgument(std::string(d.second) + ": expected >= 0 (0 = default), got " +
                             std::to_string(d.first));
    }
  }
  out->embed_dim = c.embed_dim;
  out->num_heads = c.num_heads;
  out->num_kv_heads = c.num_kv_heads;
  out->q_dim = c.q_dim;
  out->kdim = c.kdim;
  out->vdim = c.vdim;
  out->head_dim = c.head_dim;
  out->bias = c.no_bias == 0;
  out->bias_projections = c.bias_projections;
  out->add_bias_kv = c.add_bias_kv != 0;
  out->add_zero_attn = c.add_zero_attn != 0;
  out->batch_first = c.batch_first != 0;
  out->scale = c.scale;
  Status s = CheckWeightDtype(c.weight_dtype, "config->weight_dtype");
  if (!s.ok()) return s;
  out->weight_dtype = static_cast<DType>(c.weight_dtype);
  out->weight_block = c.weight_block;
  s = CheckPrepack(c.prepack, "config->prepack");
  if (!s.ok()) return s;
  out->prepack = static_cast<WeightPrepack>(c.prepack);
  s = CheckCompute(c.compute, "config->compute");
  if (!s.ok()) return s;
  out->compute = static_cast<Compute>(c.compute);
  out->qk_norm_whole = c.qk_norm_whole != 0;
  s = ToRopeScaling(c, out);
  if (!s.ok()) return s;
  return ToVariants(c, "config", out);
}

Status CheckLayout(int32_t v, const char* name) {
  if (v != MHA_QKV_LAYOUT_PYTORCH && v != MHA_QKV_LAYOUT_PER_HEAD) {
    return InvalidArgument(std::string(name) + ": expected MHA_QKV_LAYOUT_PYTORCH (0) or "
                           "MHA_QKV_LAYOUT_PER_HEAD (1), got " + std::to_string(v));
  }
  return Status::Ok();
}

}  // namespace
}  // namespace mha

using mha::Status;
using mha::c_api::Guard;
using mha::c_api::NullArg;

extern "C" {

const char* mha_version(void) { return mha::Version(); }
const char* mha_simd_target(void) { return mha::SimdTarget(); }
const char* mha_blas_arch(void) { return mha::BlasArch(); }
const char* mha_bf16_kernel(void) { return mha::Bf16Kernel(); }

const char* mha_status_name(int32_t status) {
  if (status < MHA_STATUS_OK || status > MHA_STATUS_INTERNAL) return "Unknown";
  return mha::StatusCodeName(static_cast<mha::StatusCode>(status));
}

const char* mha_last_error_message(void) { return mha::last_error.c_str(); }

mha_status mha_context_create(const mha_context_options* options, mha_context** out) {
  return Guard("mha_context_create", [&]() -> Status {
    if (out == nullptr) return NullArg("out");
    mha::ContextOptions o;
    if (options != nullptr) {
      o.num_threads = options->num_threads;
      o.arena_buffer = options->arena_buffer;
      o.arena_bytes = options->arena_bytes;
      o.grouped_forward = static_cast<mha::GroupedForward>(options->grouped_forward);
      o.group_rows = options->group_rows;
      o.group_max_bytes = options->group_max_bytes;
      o.bf16_kernel = static_cast<mha::Bf16KernelChoice>(options->bf16_kernel);
    }
    auto handle = std::make_unique<mha_context>();
    if (options != nullptr && options->executor != nullptr) {
      const mha_executor& e = *options->executor;
      if (e.parallel_for == nullptr) {
        return mha::InvalidArgument(
            "options->executor->parallel_for: expected a function, got NULL (for a pool of the "
            "context's own, set options->executor to NULL)");
      }
      // Context::Create checks num_workers.
      handle->executor = std::make_unique<mha::CExecutor>(e);
      o.executor = handle->executor.get();
    }
    Status s = mha::Context::Create(o, &handle->impl);
    if (!s.ok()) return s;
    *out = handle.release();
    return Status::Ok();
  });
}

void mha_context_destroy(mha_context* context) { delete context; }

mha_status mha_context_num_threads(const mha_context* context, size_t* num_threads) {
  return Guard("mha_context_num_threads", [&]() -> Status {
    if (context == nullptr) return NullArg("context");
    if (num_threads == nullptr) return NullArg("num_threads");
    *num_threads = context->impl->num_threads();
    return Status::Ok();
  });
}

mha_status mha_context_bf16_kernel(const mha_context* context, const char** name) {
  return Guard("mha_context_bf16_kernel", [&]() -> Status {
    if (context == nullptr) return NullArg("context");
    if (name == nullptr) return NullArg("name");
    *name = context->impl->bf16_kernel();
    return Status::Ok();
  });
}

mha_status mha_context_arena_bytes(const mha_context* context, size_t* capacity,
                                   size_t* high_water) {
  return Guard("mha_context_arena_bytes", [&]() -> Status {
    if (context == nullptr) return NullArg("context");
    if (capacity == nullptr) return NullArg("capacity");
    if (high_water == nullptr) return NullArg("high_water");
    *capacity = context->impl->arena_capacity();
    *high_water = context->impl->arena_high_water();
    return Status::Ok();
  });
}

mha_status mha_layer_config_init(mha_layer_config* config) {
  return Guard("mha_layer_config_init", [&]() -> Status {
    if (config == nullptr) return NullArg("config");
    std::memset(config, 0, sizeof(*config));
    return Status::Ok();
  });
}

mha_status mha_layer_create(const mha_layer_config* config, const mha_layer_weights* weights,
                            int32_t binding, mha_layer** out) {
  return Guard("mha_layer_create", [&]() -> Status {
    if (config == nullptr) return NullArg("config");
    if (weights == nullptr) return NullArg("weights");
    if (out == nullptr) return NullArg("out");
    mha::AttentionConfig c;
    Status s = mha::ToConfig(*config, &c);
    if (!s.ok()) return s;
    s = mha::CheckLayout(weights->qkv_layout, "weights->qkv_layout");
    if (!s.ok()) return s;
    const int32_t b = binding;
    if (b != MHA_WEIGHTS_VIEW && b != MHA_WEIGHTS_COPY) {
      return mha::InvalidArgument("binding: expected MHA_WEIGHTS_VIEW (0) or MHA_WEIGHTS_COPY (1), got " +
                                  std::to_string(b));
    }
    mha::AttentionWeights w;
    w.in_proj_weight = weights->in_proj_weight;
    w.in_proj_bias = weights->in_proj_bias;
    w.qkv_layout = static_cast<mha::QkvLayout>(weights->qkv_layout);
    w.q_proj_weight = weights->q_proj_weight;
    w.k_proj_weight = weights->k_proj_weight;
    w.v_proj_weight = weights->v_proj_weight;
    w.bias_k = weights->bias_k;
    w.bias_v = weights->bias_v;
    w.out_proj_weight = weights->out_proj_weight;
    w.out_proj_bias = weights->out_proj_bias;
    s = mha::CheckWeightDtype(weights->dtype, "weights->dtype");
    if (!s.ok()) return s;
    w.dtype = static_cast<mha::DType>(weights->dtype);
    w.sinks = weights->sinks;
    w.alibi_slopes = weights->alibi_slopes;
    w.q_norm_weight = weights->q_norm_weight;
    w.k_norm_weight = weights->k_norm_weight;
    w.q_proj_bias = weights->q_proj_bias;
    w.k_proj_bias = weights->k_proj_bias;
    w.v_proj_bias = weights->v_proj_bias;
    w.rope_short_factor = weights->rope_short_factor;
    w.rope_long_factor = weights->rope_long_factor;
    auto handle = std::make_unique<mha_layer>();
    s = mha::MultiheadAttention::Create(c, w, static_cast<mha::WeightBinding>(b), &handle->impl);
    if (!s.ok()) return s;
    *out = handle.release();
    return Status::Ok();
  });
}

mha_status mha_layer_create_from_safetensors(const char* path, const char* prefix,
                                             const mha_load_options* options, mha_layer** out) {
  return Guard("mha_layer_create_from_safetensors", [&]() -> Status {
    if (path == nullptr) return NullArg("path");
    if (options == nullptr) return NullArg("options");
    if (out == nullptr) return NullArg("out");
    if (options->num_heads <= 0) {
      return mha::InvalidArgument("options->num_heads: expected > 0, got " +
                                  std::to_string(options->num_heads));
    }
    Status s = mha::CheckBool(options->add_zero_attn, "options->add_zero_attn");
    if (s.ok()) s = mha::CheckBool(options->batch_first, "options->batch_first");
    if (s.ok()) s = mha::CheckLayout(options->qkv_layout, "options->qkv_layout");
    if (s.ok()) s = mha::CheckWeightDtype(options->weight_dtype, "options->weight_dtype");
    if (s.ok()) s = mha::CheckPrepack(options->prepack, "options->prepack");
    if (s.ok()) s = mha::CheckBool(options->qk_norm_add_one, "options->qk_norm_add_one");
    if (s.ok()) s = mha::CheckCompute(options->compute, "options->compute");
    if (s.ok() && options->num_kv_heads < 0) {
      s = mha::InvalidArgument("options->num_kv_heads: expected >= 0 (0 = from the file), got " +
                               std::to_string(options->num_kv_heads));
    }
    if (!s.ok()) return s;
    mha::LoadOptions lo;
    lo.num_heads = options->num_heads;
    lo.add_zero_attn = options->add_zero_attn != 0;
    lo.batch_first = options->batch_first != 0;
    lo.scale = options->scale;
    lo.qkv_layout = static_cast<mha::QkvLayout>(options->qkv_layout);
    lo.weight_dtype = static_cast<mha::DType>(options->weight_dtype);
    lo.weight_block = options->weight_block;
    lo.num_kv_heads = options->num_kv_heads;
    lo.prepack = static_cast<mha::WeightPrepack>(options->prepack);
    lo.compute = static_cast<mha::Compute>(options->compute);
    s = mha::ToVariants(*options, "options", &lo);
    if (!s.ok()) return s;
    lo.qk_norm_add_one = options->qk_norm_add_one != 0;
    auto handle = std::make_unique<mha_layer>();
    s = mha::MultiheadAttention::CreateFromSafeTensors(path, prefix == nullptr ? "" : prefix, lo,
                                                       &handle->impl);
    if (!s.ok()) return s;
    *out = handle.release();
    return Status::Ok();
  });
}

mha_status mha_layer_create_from_hf(const char* dir, int64_t layer_index,
                                    const mha_hf_options* options, mha_layer** out,
                                    mha_hf_layer_info* info) {
  return Guard("mha_layer_create_from_hf", [&]() -> Status {
    if (dir == nullptr) return NullArg("dir");
    if (out == nullptr) return NullArg("out");
    mha::HfOptions o;
    if (options != nullptr) {
      Status s = mha::CheckWeightDtype(options->weight_dtype, "options->weight_dtype");
      if (s.ok()) s = mha::CheckCompute(options->compute, "options->compute");
      if (s.ok()) s = mha::CheckPrepack(options->prepack, "options->prepack");
      if (s.ok()) s = mha::CheckBool(options->view, "options->view");
      if (s.ok()) s = mha::CheckBool(options->sequence_first, "options->sequence_first");
      if (!s.ok()) return s;
      o.weight_dtype = static_cast<mha::DType>(options->weight_dtype);
      o.weight_block = options->weight_block;
      o.compute = static_cast<mha::Compute>(options->compute);
      o.prepack = static_cast<mha::WeightPrepack>(options->prepack);
      o.binding = options->view != 0 ? mha::WeightBinding::kView : mha::WeightBinding::kCopy;
      o.batch_first = options->sequence_first == 0;
      if (options->prefix != nullptr) o.prefix = options->prefix;
    }
    auto handle = std::make_unique<mha_layer>();
    mha::HfLayerInfo found;
    Status s = mha::MultiheadAttention::CreateFromHuggingFace(dir, layer_index, o, &handle->impl,
                                                              &found);
    if (!s.ok()) return s;
    if (info != nullptr) {
      // Strings truncated to the arrays, always NUL-terminated.
      auto copy = [](const std::string& from, char* to, size_t size) {
        const size_t n = std::min(from.size(), size - 1);
        std::memcpy(to, from.data(), n);
        std::memset(to + n, 0, size - n);
      };
      copy(found.model_type, info->model_type, sizeof(info->model_type));
      copy(found.prefix, info->prefix, sizeof(info->prefix));
      info->hidden_size = found.hidden_size;
      info->causal = found.causal ? 1 : 0;
      info->cross_attention = found.cross_attention ? 1 : 0;
    }
    *out = handle.release();
    return Status::Ok();
  });
}

void mha_layer_destroy(mha_layer* layer) { delete layer; }

mha_status mha_layer_get_config(const mha_layer* layer, mha_layer_config* config) {
  return Guard("mha_layer_get_config", [&]() -> Status {
    if (layer == nullptr) return NullArg("layer");
    if (config == nullptr) return NullArg("config");
    const mha::AttentionConfig& c = layer->impl->config();
    mha_layer_config r;
    std::memset(&r, 0, sizeof(r));
    r.embed_dim = c.embed_dim;
    r.num_heads = c.num_heads;
    r.num_kv_heads = c.num_kv_heads;
    r.q_dim = c.q_dim;
    r.kdim = c.kdim;
    r.vdim = c.vdim;
    r.head_dim = c.head_dim;
    r.no_bias = c.bias ? 0 : 1;
    r.bias_projections = c.bias_projections;
    r.add_bias_kv = c.add_bias_kv ? 1 : 0;
    r.add_zero_attn = c.add_zero_attn ? 1 : 0;
    r.batch_first = c.batch_first ? 1 : 0;
    r.scale = c.scale;
    r.weight_dtype = static_cast<int32_t>(c.weight_dtype);
    r.weight_block = c.weight_block;
    r.prepack = static_cast<int32_t>(c.prepack);
    r.rope = static_cast<int32_t>(c.rope);
    r.rope_theta = c.rope_theta;
    r.rotary_dim = c.rotary_dim;
    r.rope_scale = c.rope_scale;
    r.alibi = c.alibi ? 1 : 0;
    r.window = c.window;
    r.softcap = c.softcap;
    r.qk_norm_eps = c.qk_norm_eps;
    r.qk_norm_whole = c.qk_norm_whole ? 1 : 0;
    r.compute = static_cast<int32_t>(c.compute);
    r.rope_scaling = static_cast<int32_t>(c.rope_scaling);
    r.rope_factor = c.rope_factor;
    r.rope_original_max_positions = c.rope_original_max_positions;
    r.rope_low_freq_factor = c.rope_low_freq_factor;
    r.rope_high_freq_factor = c.rope_high_freq_factor;
    r.rope_beta_fast = c.rope_beta_fast;
    r.rope_beta_slow = c.rope_beta_slow;
    r.rope_attention_factor = c.rope_attention_factor;
    r.rope_no_truncate = c.rope_no_truncate ? 1 : 0;
    *config = r;
    return Status::Ok();
  });
}

mha_status mha_layer_forward(const mha_layer* layer, mha_context* context,
                             const mha_attention_inputs* inputs, const mha_tensor* output,
                             const mha_tensor* attn_weights, uint32_t flags) {
  return Guard("mha_layer_forward", [&]() -> Status {
    if (layer == nullptr) return NullArg("layer");
    if (context == nullptr) return NullArg("context");
    mha::AttentionInputs in;
    mha::AttentionOutputs out;
    Status s = mha::ToForwardArgs(inputs, output, attn_weights, flags,
                                  /*output_data_optional=*/false, &in, &out);
    if (!s.ok()) return s;
    return layer->impl->Forward(*context->impl, in, out);
  });
}

mha_status mha_layer_plan(const mha_layer* layer, const mha_attention_inputs* inputs,
                          const mha_tensor* output, const mha_tensor* attn_weights,
                          uint32_t flags, size_t num_threads, size_t* workspace_bytes) {
  return Guard("mha_layer_plan", [&]() -> Status {
    if (layer == nullptr) return NullArg("layer");
    if (workspace_bytes == nullptr) return NullArg("workspace_bytes");
    mha::AttentionInputs in;
    mha::AttentionOutputs out;
    Status s = mha::ToForwardArgs(inputs, output, attn_weights, flags,
                                  /*output_data_optional=*/true, &in, &out);
    if (!s.ok()) return s;
    size_t bytes = 0;
    s = layer->impl->Plan(in, out, num_threads, &bytes);
    if (!s.ok()) return s;
    *workspace_bytes = bytes;
    return Status::Ok();
  });
}

mha_status mha_layer_project(const mha_layer* layer, mha_context* context,
                             const mha_attention_inputs* inputs, const mha_tensor* q,
                             const mha_tensor* k, const mha_tensor* v) {
  return Guard("mha_layer_project", [&]() -> Status {
    if (layer == nullptr) return NullArg("layer");
    if (context == nullptr) return NullArg("context");
    mha::AttentionInputs in;
    Status s = mha::ToInputs(inputs, &in);
    if (!s.ok()) return s;
    mha::ProjectionOutputs out;
    s = mha::c_api::ToView(q, "q", /*required=*/true, &out.q);
    if (s.ok()) s = mha::c_api::ToView(k, "k", /*required=*/true, &out.k);
    if (s.ok()) s = mha::c_api::ToView(v, "v", /*required=*/true, &out.v);
    if (!s.ok()) return s;
    return layer->impl->Project(*context->impl, in, out);
  });
}

}  // extern "C"
