// The C API (include/mha/mha.h): NULL handling and messages for every function, configuration
// and shape errors, bitwise agreement with the C++ API, outputs untouched on error, loading from
// safetensors, and the per-thread last-error message.
#include "mha/mha.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/safetensors.h"
#include "tests/attention_test_util.h"
#include "tests/c_api_test_util.h"

namespace mha {
namespace {

using testing_util::Dense;
using testing_util::kSentinel;
using testing_util::MakeViews;
using testing_util::NewContext;
using testing_util::Problem;
using testing_util::RandomProblem;
using testing_util::Views;
using testing_util::WeightsOf;

mha_tensor ToC(const TensorView& v) {
  mha_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = v.data;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.rank = v.rank;
  for (int i = 0; i < v.rank; ++i) {
    t.shape[i] = v.shape[i];
    t.strides[i] = v.strides[i];
  }
  return t;
}

mha_layer_config ConfigOf(const AttentionConfig& c) {
  mha_layer_config r;
  mha_layer_config_init(&r);
  r.embed_dim = c.embed_dim;
  r.num_heads = c.num_heads;
  r.num_kv_heads = c.num_kv_heads;
  r.q_dim = c.q_dim;
  r.kdim = c.kdim;
  r.vdim = c.vdim;
  r.no_bias = c.bias ? 0 : 1;
  r.add_bias_kv = c.add_bias_kv;
  r.add_zero_attn = c.add_zero_attn;
  r.batch_first = c.batch_first;
  r.scale = c.scale;
  r.weight_dtype = static_cast<int32_t>(c.weight_dtype);
  r.prepack = static_cast<int32_t>(c.prepack);
  r.rope = static_cast<int32_t>(c.rope);
  r.rope_theta = c.rope_theta;
  r.rotary_dim = c.rotary_dim;
  r.rope_scale = c.rope_scale;
  r.alibi = c.alibi;
  r.window = c.window;
  r.softcap = c.softcap;
  r.qk_norm_eps = c.qk_norm_eps;
  r.qk_norm_whole = c.qk_norm_whole;
  r.head_dim = c.head_dim;
  r.bias_projections = c.bias_projections;
  r.rope_scaling = static_cast<int32_t>(c.rope_scaling);
  r.rope_factor = c.rope_factor;
  r.rope_original_max_positions = c.rope_original_max_positions;
  r.rope_low_freq_factor = c.rope_low_freq_factor;
  r.rope_high_freq_factor = c.rope_high_freq_factor;
  r.rope_beta_fast = c.rope_beta_fast;
  r.rope_beta_slow = c.rope_beta_slow;
  r.rope_attention_factor = c.rope_attention_factor;
  r.rope_no_truncate = c.rope_no_truncate ? 1 : 0;
  return r;
}

mha_layer_weights WeightsOfC(const AttentionWeights& w) {
  mha_layer_weights r;
  std::memset(&r, 0, sizeof(r));
  r.in_proj_weight = w.in_proj_weight;
  r.in_proj_bias = w.in_proj_bias;
  r.qkv_layout = static_cast<int32_t>(w.qkv_layout);
  r.q_proj_weight = w.q_proj_weight;
  r.k_proj_weight = w.k_proj_weight;
  r.v_proj_weight = w.v_proj_weight;
  r.bias_k = w.bias_k;
  r.bias_v = w.bias_v;
  r.out_proj_weight = w.out_proj_weight;
  r.out_proj_bias = w.out_proj_bias;
  r.q_proj_bias = w.q_proj_bias;
  r.k_proj_bias = w.k_proj_bias;
  r.v_proj_bias = w.v_proj_bias;
  r.dtype = static_cast<int32_t>(w.dtype);
  r.sinks = w.sinks;
  r.alibi_slopes = w.alibi_slopes;
  r.q_norm_weight = w.q_norm_weight;
  r.k_norm_weight = w.k_norm_weight;
  r.rope_short_factor = w.rope_short_factor;
  r.rope_long_factor = w.rope_long_factor;
  return r;
}

mha_attention_inputs InputsOfC(const AttentionInputs& in) {
  mha_attention_inputs r;
  std::memset(&r, 0, sizeof(r));
  r.query = ToC(in.query);
  r.key = ToC(in.key);
  r.value = ToC(in.value);
  r.attn_mask = ToC(in.attn_mask);
  r.key_padding_mask = ToC(in.key_padding_mask);
  r.positions = ToC(in.positions);
  r.key_positions = ToC(in.key_positions);
  return r;
}

uint32_t FlagsOf(const AttentionInputs& in) {
  return (in.causal ? MHA_FORWARD_CAUSAL : 0u) |
         (in.average_attn_weights ? 0u : MHA_FORWARD_PER_HEAD_WEIGHTS);
}

// A small self-attention layer (E 8, H 2, bias) with its weights and one batched input
// [L 3, N 2, E 8], plus an output buffer filled with kSentinel.
struct Small {
  static constexpr int64_t E = 8, H = 2, L = 3, N = 2;
  std::vector<float> w_in, b_in, w_out, b_out, query, output;
  mha_layer* layer = nullptr;
  mha_context* ctx = nullptr;
  mha_attention_inputs in;
  mha_tensor out;

  Small() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    auto fill = [&](std::vector<float>* v, size_t n) {
      v->resize(n);
      for (float& x : *v) x = u(rng);
    };
    fill(&w_in, 3 * E * E);
    fill(&b_in, 3 * E);
    fill(&w_out, E * E);
    fill(&b_out, E);
    fill(&query, L * N * E);
    output.assign(L * N * E, kSentinel);
    mha_layer_config c;
    mha_layer_config_init(&c);
    c.embed_dim = E;
    c.num_heads = H;
    mha_layer_weights w = Weights();
    EXPECT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &layer), MHA_STATUS_OK)
        << mha_last_error_message();
    mha_context_options o;
    std::memset(&o, 0, sizeof(o));
    o.num_threads = 2;
    EXPECT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
    std::memset(&in, 0, sizeof(in));
    in.query = Dense(query.data(), MHA_DTYPE_F32, {L, N, E});
    out = Dense(output.data(), MHA_DTYPE_F32, {L, N, E});
  }
  ~Small() {
    mha_layer_destroy(layer);
    mha_context_destroy(ctx);
  }
  mha_layer_weights Weights() {
    mha_layer_weights w;
    std::memset(&w, 0, sizeof(w));
    w.in_proj_weight = w_in.data();
    w.in_proj_bias = b_in.data();
    w.out_proj_weight = w_out.data();
    w.out_proj_bias = b_out.data();
    return w;
  }
  bool OutputUntouched() const {
    for (float x : output) {
      if (x != kSentinel) return false;
    }
    return true;
  }
};

TEST(CApiTest, LibraryInformation) {
  EXPECT_STREQ(mha_version(), Version());
  // meson.build's project version, which Version() reports (tests/meson.build sets it).
  if (const char* project = std::getenv("MHA_PROJECT_VERSION")) {
    EXPECT_STREQ(Version(), project);
  }
  EXPECT_GT(std::strlen(mha_simd_target()), 0u);
  EXPECT_GT(std::strlen(mha_blas_arch()), 0u);
  EXPECT_STREQ(mha_bf16_kernel(), Bf16Kernel());
  const std::string bf16 = mha_bf16_kernel();
  EXPECT_TRUE(bf16 == "amx" || bf16 == "avx512_bf16" || bf16 == "neon_bf16" || bf16 == "emulated")
      << bf16;
  EXPECT_STREQ(mha_status_name(MHA_STATUS_OK), "OK");
  EXPECT_STREQ(mha_status_name(MHA_STATUS_FORMAT_ERROR), "FormatError");
  EXPECT_STREQ(mha_status_name(99), "Unknown");
  EXPECT_STREQ(mha_status_name(-1), "Unknown");
}

// A zero-initialized options struct means the defaults: for the layer config it equals
// mha_layer_config_init's, field by field, and a layer made from either computes the same.
TEST(CApiTest, ZeroInitializedOptionsAreTheDefaults) {
  mha_layer_config zero;
  std::memset(&zero, 0, sizeof(zero));
  mha_layer_config init;
  std::memset(&init, 0xff, sizeof(init));
  ASSERT_EQ(mha_layer_config_init(&init), MHA_STATUS_OK);
  EXPECT_EQ(zero.embed_dim, init.embed_dim);
  EXPECT_EQ(zero.num_heads, init.num_heads);
  EXPECT_EQ(zero.num_kv_heads, init.num_kv_heads);
  EXPECT_EQ(zero.q_dim, init.q_dim);
  EXPECT_EQ(zero.kdim, init.kdim);
  EXPECT_EQ(zero.vdim, init.vdim);
  EXPECT_EQ(zero.no_bias, init.no_bias);
  EXPECT_EQ(zero.add_bias_kv, init.add_bias_kv);
  EXPECT_EQ(zero.add_zero_attn, init.add_zero_attn);
  EXPECT_EQ(zero.batch_first, init.batch_first);
  EXPECT_EQ(zero.scale, init.scale);
  EXPECT_EQ(zero.weight_dtype, init.weight_dtype);
  EXPECT_EQ(zero.prepack, init.prepack);
  EXPECT_EQ(zero.rope, init.rope);
  EXPECT_EQ(zero.rope_theta, init.rope_theta);
  EXPECT_EQ(zero.rotary_dim, init.rotary_dim);
  EXPECT_EQ(zero.rope_scale, init.rope_scale);
  EXPECT_EQ(zero.alibi, init.alibi);
  EXPECT_EQ(zero.window, init.window);
  EXPECT_EQ(zero.softcap, init.softcap);
  EXPECT_EQ(zero.qk_norm_eps, init.qk_norm_eps);
  EXPECT_EQ(zero.qk_norm_whole, init.qk_norm_whole);
  EXPECT_EQ(zero.compute, init.compute);
  EXPECT_EQ(std::memcmp(&zero, &init, sizeof(zero)), 0) << "a field the test does not list";

  // The defaults are the C++ API's (AttentionConfig{}), biases included.
  Small s;
  for (mha_layer_config* c : {&zero, &init}) {
    c->embed_dim = Small::E;
    c->num_heads = Small::H;
  }
  mha_layer_weights w = s.Weights();
  mha_layer* from_zero = nullptr;
  mha_layer* from_init = nullptr;
  ASSERT_EQ(mha_layer_create(&zero, &w, MHA_WEIGHTS_VIEW, &from_zero), MHA_STATUS_OK)
      << mha_last_error_message();
  ASSERT_EQ(mha_layer_create(&init, &w, MHA_WEIGHTS_VIEW, &from_init), MHA_STATUS_OK)
      << mha_last_error_message();
  mha_layer_config got;
  ASSERT_EQ(mha_layer_get_config(from_zero, &got), MHA_STATUS_OK);
  const AttentionConfig defaults;
  EXPECT_EQ(got.no_bias, defaults.bias ? 0 : 1);
  EXPECT_EQ(got.prepack, static_cast<int32_t>(defaults.prepack));
  EXPECT_EQ(got.compute, static_cast<int32_t>(defaults.compute));
  EXPECT_EQ(got.weight_dtype, static_cast<int32_t>(defaults.weight_dtype));
  EXPECT_EQ(got.rope, MHA_ROPE_NONE);
  EXPECT_EQ(got.alibi, 0);
  EXPECT_EQ(got.window, 0);
  EXPECT_EQ(got.softcap, 0.0f);
  EXPECT_EQ(got.qk_norm_whole, 0);

  // A zero-initialized context options struct is the same as none.
  mha_context_options zero_ctx;
  std::memset(&zero_ctx, 0, sizeof(zero_ctx));
  mha_context* ctx_zero = nullptr;
  mha_context* ctx_null = nullptr;
  ASSERT_EQ(mha_context_create(&zero_ctx, &ctx_zero), MHA_STATUS_OK);
  ASSERT_EQ(mha_context_create(nullptr, &ctx_null), MHA_STATUS_OK);
  size_t threads_zero = 0, threads_null = 0;
  ASSERT_EQ(mha_context_num_threads(ctx_zero, &threads_zero), MHA_STATUS_OK);
  ASSERT_EQ(mha_context_num_threads(ctx_null, &threads_null), MHA_STATUS_OK);
  EXPECT_EQ(threads_zero, threads_null);

  std::vector<float> out_zero(s.output.size(), kSentinel), out_init(s.output.size(), kSentinel);
  mha_tensor t_zero = Dense(out_zero.data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
  mha_tensor t_init = Dense(out_init.data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
  ASSERT_EQ(mha_layer_forward(from_zero, ctx_zero, &s.in, &t_zero, nullptr, 0), MHA_STATUS_OK)
      << mha_last_error_message();
  ASSERT_EQ(mha_layer_forward(from_init, ctx_null, &s.in, &t_init, nullptr, 0), MHA_STATUS_OK)
      << mha_last_error_message();
  EXPECT_EQ(std::memcmp(out_zero.data(), out_init.data(), out_zero.size() * sizeof(float)), 0);
  mha_layer_destroy(from_zero);
  mha_layer_destroy(from_init);
  mha_context_destroy(ctx_zero);
  mha_context_destroy(ctx_null);
}

TEST(CApiTest, NullPointersAreNamed) {
  Small s;
  ASSERT_NE(s.layer, nullptr);
  ASSERT_NE(s.ctx, nullptr);
  mha_context* ctx_out = nullptr;
  mha_layer* layer_out = nullptr;
  size_t size = 0, size2 = 0;
  mha_layer_config config;
  mha_layer_config_init(&config);
  config.embed_dim = Small::E;
  config.num_heads = Small::H;
  mha_layer_weights weights = s.Weights();
  mha_load_options load;
  std::memset(&load, 0, sizeof(load));
  load.num_heads = 2;

  EXPECT_INVALID(mha_context_create(nullptr, nullptr), "out");
  EXPECT_INVALID(mha_context_num_threads(nullptr, &size), "context");
  EXPECT_INVALID(mha_context_num_threads(s.ctx, nullptr), "num_threads");
  EXPECT_INVALID(mha_context_arena_bytes(nullptr, &size, &size2), "context");
  EXPECT_INVALID(mha_context_arena_bytes(s.ctx, nullptr, &size2), "capacity");
  EXPECT_INVALID(mha_context_arena_bytes(s.ctx, &size, nullptr), "high_water");
  EXPECT_INVALID(mha_layer_config_init(nullptr), "config");
  EXPECT_INVALID(mha_layer_create(nullptr, &weights, MHA_WEIGHTS_VIEW, &layer_out), "config");
  EXPECT_INVALID(mha_layer_create(&config, nullptr, MHA_WEIGHTS_VIEW, &layer_out), "weights");
  EXPECT_INVALID(mha_layer_create(&config, &weights, MHA_WEIGHTS_VIEW, nullptr), "out");
  EXPECT_INVALID(mha_layer_create_from_safetensors(nullptr, "", &load, &layer_out), "path");
  EXPECT_INVALID(mha_layer_create_from_safetensors("x.safetensors", "", nullptr, &layer_out),
                 "options");
  EXPECT_INVALID(mha_layer_create_from_safetensors("x.safetensors", "", &load, nullptr), "out");
  EXPECT_INVALID(mha_layer_get_config(nullptr, &config), "layer");
  EXPECT_INVALID(mha_layer_get_config(s.layer, nullptr), "config");

  EXPECT_INVALID(mha_layer_forward(nullptr, s.ctx, &s.in, &s.out, nullptr, 0), "layer");
  EXPECT_INVALID(mha_layer_forward(s.layer, nullptr, &s.in, &s.out, nullptr, 0), "context");
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, nullptr, &s.out, nullptr, 0), "inputs");
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, nullptr, nullptr, 0), "output");
  mha_attention_inputs no_query = s.in;
  no_query.query.data = nullptr;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &no_query, &s.out, nullptr, 0),
                 "inputs->query.data");
  mha_tensor no_data = s.out;
  no_data.data = nullptr;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, &no_data, nullptr, 0), "output.data");
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, &no_data, 0),
                 "attn_weights.data");
  EXPECT_TRUE(s.OutputUntouched());

  EXPECT_INVALID(mha_layer_plan(nullptr, &s.in, &s.out, nullptr, 0, 1, &size), "layer");
  EXPECT_INVALID(mha_layer_plan(s.layer, nullptr, &s.out, nullptr, 0, 1, &size), "inputs");
  EXPECT_INVALID(mha_layer_plan(s.layer, &s.in, nullptr, nullptr, 0, 1, &size), "output");
  EXPECT_INVALID(mha_layer_plan(s.layer, &s.in, &s.out, nullptr, 0, 1, nullptr),
                 "workspace_bytes");

  const int64_t hd = Small::E / Small::H;
  std::vector<float> q(Small::N * Small::H * Small::L * hd), k(q.size()), v(q.size());
  mha_tensor tq = Dense(q.data(), MHA_DTYPE_F32, {Small::N, Small::H, Small::L, hd});
  mha_tensor tk = Dense(k.data(), MHA_DTYPE_F32, {Small::N, Small::H, Small::L, hd});
  mha_tensor tv = Dense(v.data(), MHA_DTYPE_F32, {Small::N, Small::H, Small::L, hd});
  EXPECT_INVALID(mha_layer_project(nullptr, s.ctx, &s.in, &tq, &tk, &tv), "layer");
  EXPECT_INVALID(mha_layer_project(s.layer, nullptr, &s.in, &tq, &tk, &tv), "context");
  EXPECT_INVALID(mha_layer_project(s.layer, s.ctx, nullptr, &tq, &tk, &tv), "inputs");
  EXPECT_INVALID(mha_layer_project(s.layer, s.ctx, &s.in, nullptr, &tk, &tv), "q");
  EXPECT_INVALID(mha_layer_project(s.layer, s.ctx, &s.in, &tq, nullptr, &tv), "k");
  EXPECT_INVALID(mha_layer_project(s.layer, s.ctx, &s.in, &tq, &tk, nullptr), "v");
  EXPECT_EQ(mha_layer_project(s.layer, s.ctx, &s.in, &tq, &tk, &tv), MHA_STATUS_OK)
      << mha_last_error_message();
  EXPECT_STREQ(mha_last_error_message(), "");

  // Destroying NULL is a no-op; options NULL means defaults.
  mha_context_destroy(nullptr);
  mha_layer_destroy(nullptr);
  ASSERT_EQ(mha_context_create(nullptr, &ctx_out), MHA_STATUS_OK);
  EXPECT_EQ(mha_context_num_threads(ctx_out, &size), MHA_STATUS_OK);
  EXPECT_GE(size, 1u);
  mha_context_destroy(ctx_out);
  EXPECT_EQ(layer_out, nullptr);  // never written by a failed create
}

TEST(CApiTest, InvalidConfigs) {
  Small s;
  mha_layer_weights w = s.Weights();
  mha_layer* layer = nullptr;
  auto create = [&](const mha_layer_config& c) {
    return mha_layer_create(&c, &w, MHA_WEIGHTS_COPY, &layer);
  };
  mha_layer_config c;
  mha_layer_config_init(&c);
  c.embed_dim = 8;
  c.num_heads = 3;
  EXPECT_INVALID(create(c), "embed_dim: expected a multiple of num_heads (3), got 8");
  c.num_heads = 0;
  EXPECT_INVALID(create(c), "num_heads: expected > 0, got 0");
  c.num_heads = -2;
  EXPECT_INVALID(create(c), "num_heads: expected > 0, got -2");
  c.num_heads = 2;
  c.embed_dim = 0;
  EXPECT_INVALID(create(c), "embed_dim: expected > 0, got 0");
  c.embed_dim = -8;
  EXPECT_INVALID(create(c), "embed_dim: expected > 0, got -8");
  // Dimensions whose weight sizes would overflow are rejected before any size is computed.
  c.embed_dim = int64_t{1} << 40;
  EXPECT_INVALID(create(c), "embed_dim: expected 1..");
  c.embed_dim = 8;
  c.kdim = -1;
  EXPECT_INVALID(create(c), "config->kdim: expected >= 0");
  c.kdim = int64_t{1} << 62;
  EXPECT_INVALID(create(c), "kdim");
  c.kdim = 0;
  c.num_kv_heads = 3;
  EXPECT_INVALID(create(c), "num_kv_heads");
  c.num_kv_heads = 0;
  c.batch_first = 2;
  EXPECT_INVALID(create(c), "config->batch_first: expected 0 or 1, got 2");
  c.batch_first = 0;
  c.prepack = 4;
  EXPECT_INVALID(create(c),
                 "config->prepack: expected MHA_PREPACK_ON (0), MHA_PREPACK_OFF (1), "
                 "MHA_PREPACK_PLAIN (2) or MHA_PREPACK_STRASSEN (3), got 4");
  c.prepack = MHA_PREPACK_OFF;
  ASSERT_EQ(create(c), MHA_STATUS_OK) << mha_last_error_message();
  mha_layer_config got;
  ASSERT_EQ(mha_layer_get_config(layer, &got), MHA_STATUS_OK);
  EXPECT_EQ(got.prepack, MHA_PREPACK_OFF);
  mha_layer_destroy(layer);
  layer = nullptr;
  c.prepack = MHA_PREPACK_ON;
  c.compute = 3;
  EXPECT_INVALID(create(c),
                 "config->compute: expected MHA_COMPUTE_F32 (0), MHA_COMPUTE_BF16 (1) or "
                 "MHA_COMPUTE_INT8 (2), got 3");
  c.compute = MHA_COMPUTE_INT8;  // quantized weights only
  EXPECT_INVALID(create(c),
                 "compute: kInt8 (int8 activations) expects weight_dtype I8 or I4, got f32");
  c.compute = MHA_COMPUTE_BF16;
  ASSERT_EQ(create(c), MHA_STATUS_OK) << mha_last_error_message();
  ASSERT_EQ(mha_layer_get_config(layer, &got), MHA_STATUS_OK);
  EXPECT_EQ(got.compute, MHA_COMPUTE_BF16);
  mha_layer_destroy(layer);
  layer = nullptr;
  c.compute = MHA_COMPUTE_F32;
  c.scale = -1.0f;
  EXPECT_INVALID(create(c), "scale");
  c.scale = 0.0f;
  c.add_bias_kv = 1;
  EXPECT_INVALID(create(c), "add_bias_kv: expected bias_k and bias_v");
  c.add_bias_kv = 0;
  w.qkv_layout = 7;
  EXPECT_INVALID(create(c), "weights->qkv_layout");
  w.qkv_layout = MHA_QKV_LAYOUT_PYTORCH;
  EXPECT_INVALID(mha_layer_create(&c, &w, 5, &layer),
                 "binding: expected MHA_WEIGHTS_VIEW (0) or MHA_WEIGHTS_COPY (1), got 5");
  w.out_proj_weight = nullptr;
  EXPECT_INVALID(create(c), "out_proj_weight");
  EXPECT_EQ(layer, nullptr);

  // The variants' C-only checks: the enum and the booleans.
  w.out_proj_weight = s.w_out.data();
  c.rope = 3;
  EXPECT_INVALID(create(c),
                 "config->rope: expected MHA_ROPE_NONE (0), MHA_ROPE_NEOX (1) or "
                 "MHA_ROPE_GPTJ (2), got 3");
  c.rope = -1;
  EXPECT_INVALID(create(c), "config->rope: expected MHA_ROPE_NONE (0)");
  c.rope = MHA_ROPE_NONE;
  c.alibi = 2;
  EXPECT_INVALID(create(c), "config->alibi: expected 0 or 1, got 2");
  c.alibi = 0;
  c.qk_norm_whole = -1;
  EXPECT_INVALID(create(c), "config->qk_norm_whole: expected 0 or 1, got -1");
  c.qk_norm_whole = 0;
  // Range checks are the C++ API's, reached through the C fields.
  c.rope = MHA_ROPE_NEOX;
  c.rotary_dim = 3;
  EXPECT_INVALID(create(c), "rotary_dim");
  c.rotary_dim = 0;
  c.rope = MHA_ROPE_NONE;
  c.window = -1;
  EXPECT_INVALID(create(c), "window");
  c.window = 0;
  // RoPE scaling: the enum and the boolean here, the rest through the C++ checks.
  c.rope_scaling = 6;
  EXPECT_INVALID(create(c), "config->rope_scaling: expected MHA_ROPE_SCALING_NONE (0)");
  c.rope_scaling = MHA_ROPE_SCALING_YARN;
  c.rope_no_truncate = 2;
  EXPECT_INVALID(create(c), "config->rope_no_truncate: expected 0 or 1, got 2");
  c.rope_no_truncate = 0;
  c.rope_factor = 4.0f;
  c.rope_original_max_positions = 4096;
  EXPECT_STATUS(create(c), MHA_STATUS_UNSUPPORTED, "rope_scaling: yarn scales RoPE's frequencies");
  c.rope = MHA_ROPE_NEOX;
  c.rope_factor = 0.0f;
  EXPECT_INVALID(create(c), "rope_factor: expected > 0 with rope_scaling yarn, got 0");
  c.rope_scaling = MHA_ROPE_SCALING_LONGROPE;
  c.rope_factor = 4.0f;
  EXPECT_STATUS(create(c), MHA_STATUS_UNSUPPORTED,
                "rope_scaling longrope needs both [rotary_dim / 2] arrays, got neither");
  c.rope = MHA_ROPE_NONE;
  c.rope_scaling = MHA_ROPE_SCALING_NONE;
  c.rope_factor = 0.0f;
  c.rope_original_max_positions = 0;
  EXPECT_EQ(layer, nullptr);

  mha_context* ctx = nullptr;
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  o.num_threads = 5000;
  EXPECT_INVALID(mha_context_create(&o, &ctx), "num_threads: expected 0..1024, got 5000");
  EXPECT_EQ(ctx, nullptr);
}

// mha_context_options' grouped forward and bf16 kernel reach the context: invalid values are
// refused naming the field, and the context reports the kernel it runs.
TEST(CApiTest, ContextOptionsChooseGroupingAndBf16Kernel) {
  mha_context* ctx = nullptr;
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  o.grouped_forward = 2;
  EXPECT_INVALID(mha_context_create(&o, &ctx),
                 "grouped_forward: expected kAuto (0) or kOff (1), got 2");
  EXPECT_EQ(ctx, nullptr);
  o.grouped_forward = MHA_GROUPED_FORWARD_OFF;
  o.bf16_kernel = 9;
  EXPECT_INVALID(mha_context_create(&o, &ctx), "bf16_kernel: expected one of kAuto (0)");
  EXPECT_EQ(ctx, nullptr);
  o.bf16_kernel = MHA_BF16_KERNEL_EMULATED;
  o.group_rows = 64;
  o.group_max_bytes = 1 << 20;
  ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
  const char* name = nullptr;
  EXPECT_EQ(mha_context_bf16_kernel(ctx, &name), MHA_STATUS_OK);
  EXPECT_STREQ(name, "emulated");
  EXPECT_INVALID(mha_context_bf16_kernel(ctx, nullptr), "name");
  EXPECT_INVALID(mha_context_bf16_kernel(nullptr, &name), "context");
  mha_context_destroy(ctx);
  std::memset(&o, 0, sizeof(o));
  ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK);
  EXPECT_EQ(mha_context_bf16_kernel(ctx, &name), MHA_STATUS_OK);
  EXPECT_STREQ(name, mha_bf16_kernel());
  mha_context_destroy(ctx);
}

TEST(CApiTest, ShapeMismatchesLeaveOutputsUntouched) {
  Small s;
  std::vector<float> weights(Small::N * Small::L * Small::L, kSentinel);
  mha_tensor tw = Dense(weights.data(), MHA_DTYPE_F32, {Small::N, Small::L, Small::L});
  auto untouched = [&]() {
    for (float x : weights) {
      if (x != kSentinel) return false;
    }
    return s.OutputUntouched();
  };

  // A bool attn_mask of the wrong shape.
  std::vector<uint8_t> mask(Small::L * (Small::L + 1), 0);
  mha_attention_inputs in = s.in;
  in.attn_mask = Dense(mask.data(), MHA_DTYPE_BOOL, {Small::L, Small::L + 1});
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0),
                 "attn_mask: expected shape [3, 3] or [4, 3, 3]");
  EXPECT_TRUE(untouched());

  // key_padding_mask of the wrong batch.
  in = s.in;
  in.key_padding_mask = Dense(mask.data(), MHA_DTYPE_U8, {Small::N + 1, Small::L});
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0),
                 "key_padding_mask: expected shape [2, 3]");
  EXPECT_TRUE(untouched());

  // A mask dtype out of the enum.
  in = s.in;
  in.attn_mask = Dense(mask.data(), 9, {Small::L, Small::L});
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0), "inputs->attn_mask.dtype");
  EXPECT_TRUE(untouched());

  // Query with the wrong feature count, and the wrong rank.
  in = s.in;
  in.query.shape[2] = Small::E - 1;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0),
                 "query: expected last dimension 8");
  in.query.rank = 5;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0),
                 "inputs->query.rank: expected 1..4, got 5");
  in.query.rank = 1;
  in.query.shape[0] = Small::E;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0), "query: expected 3 dims");
  // Negative dimensions and strides.
  in = s.in;
  in.query.shape[0] = -3;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0), "inputs->query");
  in = s.in;
  in.query.strides[0] = -1;
  in.query.strides[1] = Small::E;
  in.query.strides[2] = 1;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0), "inputs->query");
  // Element count overflowing 64 bits.
  in = s.in;
  in.query.shape[0] = int64_t{1} << 40;
  in.query.shape[1] = int64_t{1} << 40;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0), "inputs->query");

  // Output shape and weights shape.
  mha_tensor bad_out = s.out;
  bad_out.shape[2] = Small::E + 1;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, &bad_out, &tw, 0),
                 "output: expected shape [3, 2, 8]");
  mha_tensor bad_w = tw;
  bad_w.shape[2] = Small::L + 1;
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, &bad_w, 0),
                 "attn_weights: expected shape [2, 3, 3]");
  // Per-head weights requested with an averaged buffer.
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, &tw, MHA_FORWARD_PER_HEAD_WEIGHTS),
                 "attn_weights: expected shape [2, 2, 3, 3]");
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, &tw, 0x80u), "flags");
  // Key batch mismatch.
  std::vector<float> key(4 * 3 * Small::E, 0.0f);
  in = s.in;
  in.key = Dense(key.data(), MHA_DTYPE_F32, {4, 3, Small::E});
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, &tw, 0),
                 "key: expected batch size 2");
  EXPECT_TRUE(untouched());

  // Then a valid call writes them.
  ASSERT_EQ(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, &tw, 0), MHA_STATUS_OK)
      << mha_last_error_message();
  EXPECT_STREQ(mha_last_error_message(), "");
  EXPECT_FALSE(untouched());
}

TEST(CApiTest, CallerArenaTooSmallIsOutOfMemoryAndLeavesOutputs) {
  Small s;
  size_t bytes = 0;
  // Plan needs no output data: only the shapes are checked.
  mha_tensor shape_only = s.out;
  shape_only.data = nullptr;
  ASSERT_EQ(mha_layer_plan(s.layer, &s.in, &shape_only, nullptr, 0, 1, &bytes), MHA_STATUS_OK)
      << mha_last_error_message();
  ASSERT_GT(bytes, 0u);
  std::vector<uint8_t> buffer(bytes / 2);
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  o.num_threads = 1;
  o.arena_buffer = buffer.data();
  o.arena_bytes = buffer.size();
  mha_context* ctx = nullptr;
  ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
  EXPECT_EQ(mha_layer_forward(s.layer, ctx, &s.in, &s.out, nullptr, 0), MHA_STATUS_OUT_OF_MEMORY);
  EXPECT_NE(std::string(mha_last_error_message()).find("bytes"), std::string::npos)
      << mha_last_error_message();
  EXPECT_TRUE(s.OutputUntouched());
  mha_context_destroy(ctx);

  // A buffer of the planned size suffices (tests/plan_test.cc: at any address).
  buffer.assign(bytes, 0);
  o.arena_buffer = buffer.data();
  o.arena_bytes = buffer.size();
  ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
  EXPECT_EQ(mha_layer_forward(s.layer, ctx, &s.in, &s.out, nullptr, 0), MHA_STATUS_OK)
      << mha_last_error_message();
  size_t capacity = 0, high = 0;
  EXPECT_EQ(mha_context_arena_bytes(ctx, &capacity, &high), MHA_STATUS_OK);
  EXPECT_LE(high, capacity);
  mha_context_destroy(ctx);
}

// The documented flow: plan with a NULL output, malloc the planned bytes, run the forward into a
// separate output and in place (output = query), the long-key chunked path included (forced at
// this size by chunks of 16 keys), KV-cache steps on a plan of their own.
TEST(CApiTest, MallocOfThePlannedBytesRunsEveryForward) {
  testing_util::ScopedKeyChunking chunking(16);
  std::mt19937 rng(26);
  Problem p;
  p.config.embed_dim = 32;
  p.config.num_heads = 4;
  p.config.bias = false;
  p.config.batch_first = true;
  p.L = p.S = 100;
  testing_util::FillProblem(&p, &rng);
  const mha_layer_config config = ConfigOf(p.config);
  const mha_layer_weights weights = WeightsOfC(WeightsOf(p));
  mha_layer* layer = nullptr;
  ASSERT_EQ(mha_layer_create(&config, &weights, MHA_WEIGHTS_VIEW, &layer), MHA_STATUS_OK)
      << mha_last_error_message();
  Views v;
  MakeViews(p, &v);
  mha_attention_inputs in;
  std::memset(&in, 0, sizeof(in));
  in.query = ToC(v.in.query);
  mha_tensor out = ToC(v.out.output);
  mha_tensor shape_only = out;
  shape_only.data = nullptr;
  for (const uint32_t flags : {0u, static_cast<unsigned>(MHA_FORWARD_CAUSAL)}) {
    size_t bytes = 0;
    ASSERT_EQ(mha_layer_plan(layer, &in, &shape_only, nullptr, flags, 2, &bytes), MHA_STATUS_OK)
        << mha_last_error_message();
    mha_tensor in_place = in.query;
    size_t in_place_bytes = 0;
    ASSERT_EQ(mha_layer_plan(layer, &in, &in_place, nullptr, flags, 2, &in_place_bytes),
              MHA_STATUS_OK);
    EXPECT_EQ(in_place_bytes, bytes);
    void* buffer = std::malloc(bytes);
    ASSERT_NE(buffer, nullptr);
    mha_context* ctx = testing_util::NewContext(2, buffer, bytes);
    ASSERT_NE(ctx, nullptr);
    EXPECT_EQ(mha_layer_forward(layer, ctx, &in, &out, nullptr, flags), MHA_STATUS_OK)
        << mha_last_error_message();
    const std::vector<float> separate = v.output;
    const std::vector<float> query = p.query;
    EXPECT_EQ(mha_layer_forward(layer, ctx, &in, &in_place, nullptr, flags), MHA_STATUS_OK)
        << mha_last_error_message();
    for (size_t i = 0; i < separate.size(); ++i) {
      ASSERT_NEAR(p.query[i], separate[i], 1e-5f) << "flags " << flags << " element " << i;
    }
    p.query = query;
    mha_context_destroy(ctx);
    std::free(buffer);
  }

  mha_kv_cache_options co;
  std::memset(&co, 0, sizeof(co));
  co.batch = 1;
  co.capacity = 300;
  mha_kv_cache* cache = nullptr;
  ASSERT_EQ(mha_kv_cache_create(layer, &co, &cache), MHA_STATUS_OK) << mha_last_error_message();
  size_t bytes = 0;
  EXPECT_EQ(mha_kv_cache_plan(cache, layer, 0, 2, &bytes), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message()).find("max_tokens"), std::string::npos)
      << mha_last_error_message();
  EXPECT_EQ(mha_kv_cache_plan(nullptr, layer, 1, 2, &bytes), MHA_STATUS_INVALID_ARGUMENT);
  ASSERT_EQ(mha_kv_cache_plan(cache, layer, 100, 2, &bytes), MHA_STATUS_OK)
      << mha_last_error_message();
  void* buffer = std::malloc(bytes);
  ASSERT_NE(buffer, nullptr);
  mha_context* ctx = testing_util::NewContext(2, buffer, bytes);
  ASSERT_NE(ctx, nullptr);
  mha_tensor prompt = in.query, prompt_out = out;  // [1, 100, 32] batch-first
  EXPECT_EQ(mha_kv_cache_step(cache, layer, ctx, &prompt, &prompt_out, nullptr), MHA_STATUS_OK)
      << mha_last_error_message();
  mha_tensor token = prompt, token_out = prompt_out;
  token.shape[1] = token_out.shape[1] = 1;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(mha_kv_cache_step(cache, layer, ctx, &token, &token_out, nullptr), MHA_STATUS_OK)
        << mha_last_error_message();
  }
  mha_context_destroy(ctx);
  std::free(buffer);
  mha_kv_cache_destroy(cache);
  mha_layer_destroy(layer);
}

// The C API must produce exactly what the C++ API produces: same code underneath, no copies.
TEST(CApiTest, ForwardAndProjectMatchCppApiBitwise) {
  std::mt19937 rng(2024);
  for (int iter = 0; iter < 40; ++iter) {
    Problem p = RandomProblem(&rng);
    SCOPED_TRACE(p.Describe());
    const AttentionWeights w = WeightsOf(p);
    std::unique_ptr<MultiheadAttention> cpp;
    ASSERT_TRUE(MultiheadAttention::Create(p.config, w, p.binding, &cpp).ok());
    ContextOptions co;
    co.num_threads = 2;
    std::unique_ptr<Context> cpp_ctx;
    ASSERT_TRUE(Context::Create(co, &cpp_ctx).ok());
    Views want;
    MakeViews(p, &want);
    ASSERT_TRUE(cpp->Forward(*cpp_ctx, want.in, want.out).ok());

    const mha_layer_config cc = ConfigOf(p.config);
    const mha_layer_weights cw = WeightsOfC(w);
    mha_layer* layer = nullptr;
    ASSERT_EQ(mha_layer_create(&cc, &cw, static_cast<int32_t>(p.binding), &layer),
              MHA_STATUS_OK)
        << mha_last_error_message();
    mha_context_options o;
    std::memset(&o, 0, sizeof(o));
    o.num_threads = 2;
    mha_context* ctx = nullptr;
    ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK);
    Views got;
    MakeViews(p, &got);
    std::fill(got.output.begin(), got.output.end(), kSentinel);
    const mha_attention_inputs in = InputsOfC(got.in);
    const mha_tensor out = ToC(got.out.output);
    const mha_tensor weights = ToC(got.out.attn_weights);
    ASSERT_EQ(mha_layer_forward(layer, ctx, &in, &out, p.need_weights ? &weights : nullptr,
                                FlagsOf(got.in)),
              MHA_STATUS_OK)
        << mha_last_error_message();
    ASSERT_EQ(got.output.size(), want.output.size());
    EXPECT_EQ(std::memcmp(got.output.data(), want.output.data(), got.output.size() * 4), 0);
    ASSERT_EQ(got.weights.size(), want.weights.size());
    if (!got.weights.empty()) {
      EXPECT_EQ(std::memcmp(got.weights.data(), want.weights.data(), got.weights.size() * 4), 0);
    }

    size_t cpp_bytes = 0, c_bytes = 0;
    ASSERT_TRUE(cpp->Plan(want.in, want.out, 3, &cpp_bytes).ok());
    ASSERT_EQ(mha_layer_plan(layer, &in, &out, p.need_weights ? &weights : nullptr,
                             FlagsOf(got.in), 3, &c_bytes),
              MHA_STATUS_OK);
    EXPECT_EQ(c_bytes, cpp_bytes);

    // Per-head projections.
    mha_layer_config eff;
    ASSERT_EQ(mha_layer_get_config(layer, &eff), MHA_STATUS_OK);
    EXPECT_EQ(eff.embed_dim, p.config.embed_dim);
    const int64_t hd = eff.embed_dim / eff.num_heads;
    const int64_t St = p.S + eff.add_bias_kv + eff.add_zero_attn;
    std::vector<float> q1(p.N * eff.num_heads * p.L * hd), k1(p.N * eff.num_kv_heads * St * hd),
        v1(k1.size()), q2(q1.size()), k2(k1.size()), v2(k1.size());
    auto view4 = [](std::vector<float>* d, int64_t a, int64_t b, int64_t c, int64_t e) {
      TensorView t;
      const int64_t shape[4] = {a, b, c, e};
      EXPECT_TRUE(TensorView::Dense(d->data(), DType::kF32, 4, shape, &t).ok());
      return t;
    };
    ProjectionOutputs po;
    po.q = view4(&q1, p.N, eff.num_heads, p.L, hd);
    po.k = view4(&k1, p.N, eff.num_kv_heads, St, hd);
    po.v = view4(&v1, p.N, eff.num_kv_heads, St, hd);
    ASSERT_TRUE(cpp->Project(*cpp_ctx, want.in, po).ok());
    const mha_tensor tq = Dense(q2.data(), MHA_DTYPE_F32, {p.N, eff.num_heads, p.L, hd});
    const mha_tensor tk = Dense(k2.data(), MHA_DTYPE_F32, {p.N, eff.num_kv_heads, St, hd});
    const mha_tensor tv = Dense(v2.data(), MHA_DTYPE_F32, {p.N, eff.num_kv_heads, St, hd});
    ASSERT_EQ(mha_layer_project(layer, ctx, &in, &tq, &tk, &tv), MHA_STATUS_OK)
        << mha_last_error_message();
    EXPECT_EQ(std::memcmp(q1.data(), q2.data(), q1.size() * 4), 0);
    EXPECT_EQ(std::memcmp(k1.data(), k2.data(), k1.size() * 4), 0);
    EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * 4), 0);

    mha_context_destroy(ctx);
    mha_layer_destroy(layer);
  }
}

// A grouped-query layer (E 16, H 4, KVH 2, hd 4, separate projections) with every variant
// tensor, and one batched input [L 6, N 2, E 16] with positions [N, L].
struct VariantProblem {
  static constexpr int64_t E = 16, H = 4, KVH = 2, hd = 4, L = 6, N = 2;
  std::vector<float> wq, wk, wv, b, wo, bo, sinks, slopes, q_norm, k_norm, q_norm_whole,
      k_norm_whole, query, rope_short, rope_long;
  std::vector<int32_t> pos32;
  std::vector<int64_t> pos64;

  VariantProblem() {
    std::mt19937 rng(30);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    auto fill = [&](std::vector<float>* v, size_t n, float offset) {
      v->resize(n);
      for (float& x : *v) x = offset + u(rng);
    };
    fill(&wq, E * E, 0.0f);
    fill(&wk, KVH * hd * E, 0.0f);
    fill(&wv, KVH * hd * E, 0.0f);
    fill(&b, E + 2 * KVH * hd, 0.0f);
    fill(&wo, E * E, 0.0f);
    fill(&bo, E, 0.0f);
    fill(&sinks, H, 0.0f);
    fill(&slopes, H, 0.5f);
    fill(&q_norm, hd, 1.0f);
    fill(&k_norm, hd, 1.0f);
    fill(&q_norm_whole, E, 1.0f);
    fill(&k_norm_whole, KVH * hd, 1.0f);
    fill(&query, L * N * E, 0.0f);
    fill(&rope_short, hd / 2, 1.0f);
    fill(&rope_long, hd / 2, 3.0f);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < L; ++i) {
        pos32.push_back(static_cast<int32_t>(7 * n + 2 * i));
        pos64.push_back(7 * n + 2 * i);
      }
    }
  }

  AttentionConfig Config() const {
    AttentionConfig c;
    c.embed_dim = E;
    c.num_heads = H;
    c.num_kv_heads = KVH;
    return c;
  }
  AttentionWeights Weights() const {
    AttentionWeights w;
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.in_proj_bias = b.data();
    w.out_proj_weight = wo.data();
    w.out_proj_bias = bo.data();
    return w;
  }
};

// Runs the layer through the C++ API and through the C API (created from the C structs the
// same settings give) and expects bitwise equal outputs and weights; returns the output.
std::vector<float> ExpectCMatchesCpp(const VariantProblem& p, const AttentionConfig& config,
                                     const AttentionWeights& weights, DType positions,
                                     bool causal) {
  using VP = VariantProblem;
  std::unique_ptr<MultiheadAttention> cpp;
  Status st = MultiheadAttention::Create(config, weights, WeightBinding::kView, &cpp);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return {};
  std::unique_ptr<Context> cpp_ctx;
  ContextOptions co;
  co.num_threads = 2;
  EXPECT_TRUE(Context::Create(co, &cpp_ctx).ok());
  AttentionInputs in;
  const int64_t q_shape[3] = {VP::L, VP::N, VP::E}, pos_shape[2] = {VP::N, VP::L};
  EXPECT_TRUE(
      TensorView::Dense(const_cast<float*>(p.query.data()), DType::kF32, 3, q_shape, &in.query)
          .ok());
  if (positions != DType::kF32) {
    void* data = positions == DType::kI32
                     ? static_cast<void*>(const_cast<int32_t*>(p.pos32.data()))
                     : static_cast<void*>(const_cast<int64_t*>(p.pos64.data()));
    EXPECT_TRUE(TensorView::Dense(data, positions, 2, pos_shape, &in.positions).ok());
  }
  in.causal = causal;
  in.need_weights = true;
  in.average_attn_weights = false;
  std::vector<float> want(VP::L * VP::N * VP::E), want_w(VP::N * VP::H * VP::L * VP::L);
  std::vector<float> got(want.size(), kSentinel), got_w(want_w.size(), kSentinel);
  AttentionOutputs out;
  const int64_t w_shape[4] = {VP::N, VP::H, VP::L, VP::L};
  EXPECT_TRUE(TensorView::Dense(want.data(), DType::kF32, 3, q_shape, &out.output).ok());
  EXPECT_TRUE(TensorView::Dense(want_w.data(), DType::kF32, 4, w_shape, &out.attn_weights).ok());
  st = cpp->Forward(*cpp_ctx, in, out);
  EXPECT_TRUE(st.ok()) << st.ToString();

  const mha_layer_config cc = ConfigOf(config);
  const mha_layer_weights cw = WeightsOfC(weights);
  mha_layer* layer = nullptr;
  EXPECT_EQ(mha_layer_create(&cc, &cw, MHA_WEIGHTS_COPY, &layer), MHA_STATUS_OK)
      << mha_last_error_message();
  if (layer == nullptr) return {};
  mha_layer_config back;
  EXPECT_EQ(mha_layer_get_config(layer, &back), MHA_STATUS_OK);
  EXPECT_EQ(back.rope, cc.rope);
  EXPECT_EQ(back.rope_theta, cc.rope_theta);
  EXPECT_EQ(back.rotary_dim, cc.rotary_dim);
  EXPECT_EQ(back.rope_scale, cc.rope_scale);
  EXPECT_EQ(back.alibi, cc.alibi);
  EXPECT_EQ(back.window, cc.window);
  EXPECT_EQ(back.softcap, cc.softcap);
  EXPECT_EQ(back.qk_norm_eps, cc.qk_norm_eps);
  EXPECT_EQ(back.qk_norm_whole, cc.qk_norm_whole);
  EXPECT_EQ(back.bias_projections, cc.bias_projections);
  if (cc.head_dim != 0) {
    EXPECT_EQ(back.head_dim, cc.head_dim);
  }
  EXPECT_EQ(back.rope_scaling, cc.rope_scaling);
  EXPECT_EQ(back.rope_factor, cc.rope_factor);
  EXPECT_EQ(back.rope_original_max_positions, cc.rope_original_max_positions);
  EXPECT_EQ(back.rope_low_freq_factor, cc.rope_low_freq_factor);
  EXPECT_EQ(back.rope_high_freq_factor, cc.rope_high_freq_factor);
  EXPECT_EQ(back.rope_beta_fast, cc.rope_beta_fast);
  EXPECT_EQ(back.rope_beta_slow, cc.rope_beta_slow);
  EXPECT_EQ(back.rope_attention_factor, cc.rope_attention_factor);
  EXPECT_EQ(back.rope_no_truncate, cc.rope_no_truncate);
  mha_context* ctx = NewContext(2);
  const mha_attention_inputs c_in = InputsOfC(in);
  const mha_tensor c_out = Dense(got.data(), MHA_DTYPE_F32, {VP::L, VP::N, VP::E});
  const mha_tensor c_w = Dense(got_w.data(), MHA_DTYPE_F32, {VP::N, VP::H, VP::L, VP::L});
  EXPECT_EQ(mha_layer_forward(layer, ctx, &c_in, &c_out, &c_w,
                              (causal ? MHA_FORWARD_CAUSAL : 0u) | MHA_FORWARD_PER_HEAD_WEIGHTS),
            MHA_STATUS_OK)
      << mha_last_error_message();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got_w.data(), want_w.data(), got_w.size() * 4), 0);
  mha_context_destroy(ctx);
  mha_layer_destroy(layer);
  return got;
}

// Each variant field of the C structs reaches the layer: the C layer computes bitwise what the
// C++ layer with the same settings computes, and differs from the plain layer.
TEST(CApiTest, VariantsMatchCppApiBitwise) {
  const VariantProblem p;
  const std::vector<float> plain =
      ExpectCMatchesCpp(p, p.Config(), p.Weights(), DType::kF32, /*causal=*/true);
  ASSERT_FALSE(plain.empty());
  struct Case {
    const char* name;
    void (*set)(const VariantProblem&, AttentionConfig*, AttentionWeights*);
    DType positions;
  };
  const Case cases[] = {
      {"rope_neox_theta_partial_scale",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) {
         c->rope = RopeStyle::kNeox;
         c->rope_theta = 500.0f;
         c->rotary_dim = 2;
         c->rope_scale = 3.0f;
       },
       DType::kI32},
      {"rope_gptj_i64_positions",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) {
         c->rope = RopeStyle::kGptj;
       },
       DType::kI64},
      // RoPE scaling (positions up to 17: dynamic and longrope past their original 8).
      {"rope_scaling_linear",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) {
         c->rope = RopeStyle::kNeox;
         c->rope_scaling = RopeScaling::kLinear;
         c->rope_factor = 2.0f;
       },
       DType::kI32},
      {"rope_scaling_dynamic",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) {
         c->rope = RopeStyle::kNeox;
         c->rope_scaling = RopeScaling::kDynamic;
         c->rope_factor = 2.0f;
         c->rope_original_max_positions = 8;
       },
       DType::kI64},
      {"rope_scaling_llama3",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) {
         c->rope = RopeStyle::kGptj;
         c->rope_scaling = RopeScaling::kLlama3;
         c->rope_factor = 8.0f;
         c->rope_low_freq_factor = 1.0f;
         c->rope_high_freq_factor = 4.0f;
         c->rope_original_max_positions = 64;
       },
       DType::kI32},
      {"rope_scaling_yarn_unrounded_betas_attention",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) {
         c->rope = RopeStyle::kNeox;
         c->rope_scaling = RopeScaling::kYarn;
         c->rope_factor = 4.0f;
         c->rope_original_max_positions = 64;
         c->rope_beta_fast = 16.0f;
         c->rope_beta_slow = 2.0f;
         c->rope_attention_factor = 1.2f;
         c->rope_no_truncate = true;
       },
       DType::kF32},
      {"rope_scaling_longrope",
       [](const VariantProblem& p, AttentionConfig* c, AttentionWeights* w) {
         c->rope = RopeStyle::kNeox;
         c->rope_scaling = RopeScaling::kLongRope;
         c->rope_factor = 4.0f;
         c->rope_original_max_positions = 8;
         w->rope_short_factor = p.rope_short.data();
         w->rope_long_factor = p.rope_long.data();
       },
       DType::kI32},
      {"alibi_standard",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) { c->alibi = true; },
       DType::kF32},
      {"alibi_slopes",
       [](const VariantProblem& p, AttentionConfig* c, AttentionWeights* w) {
         c->alibi = true;
         w->alibi_slopes = p.slopes.data();
       },
       DType::kI32},
      {"window",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) { c->window = 2; },
       DType::kF32},
      {"window_positions",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) { c->window = 3; },
       DType::kI64},
      {"softcap",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) { c->softcap = 0.3f; },
       DType::kF32},
      {"sinks",
       [](const VariantProblem& p, AttentionConfig*, AttentionWeights* w) {
         w->sinks = p.sinks.data();
       },
       DType::kF32},
      {"qk_norm_per_head_eps",
       [](const VariantProblem& p, AttentionConfig* c, AttentionWeights* w) {
         c->qk_norm_eps = 0.5f;
         w->q_norm_weight = p.q_norm.data();
         w->k_norm_weight = p.k_norm.data();
       },
       DType::kF32},
      {"qk_norm_whole",
       [](const VariantProblem& p, AttentionConfig* c, AttentionWeights* w) {
         c->qk_norm_whole = true;
         w->q_norm_weight = p.q_norm_whole.data();
         w->k_norm_weight = p.k_norm_whole.data();
       },
       DType::kF32},
      // A = H * head_dim = 8 != E = 16: q [8, 16], k/v [4, 16], out [16, 8] within the arrays.
      {"head_dim_2",
       [](const VariantProblem&, AttentionConfig* c, AttentionWeights*) { c->head_dim = 2; },
       DType::kF32},
      {"bias_projections_q_v_out",
       [](const VariantProblem& p, AttentionConfig* c, AttentionWeights* w) {
         c->bias_projections = kBiasQ | kBiasV | kBiasOut;
         w->in_proj_bias = nullptr;
         w->q_proj_bias = p.b.data();
         w->v_proj_bias = p.b.data() + VariantProblem::E + VariantProblem::KVH * VariantProblem::hd;
       },
       DType::kF32},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    AttentionConfig c = p.Config();
    AttentionWeights w = p.Weights();
    k.set(p, &c, &w);
    const std::vector<float> got = ExpectCMatchesCpp(p, c, w, k.positions, /*causal=*/true);
    ASSERT_EQ(got.size(), plain.size());
    EXPECT_NE(std::memcmp(got.data(), plain.data(), got.size() * 4), 0)
        << "the variant did not change the output";
  }
}

// Zero-initialized variant fields and absent positions are the layer without variants: the
// output equals the plain layer's bitwise, with explicit default positions too.
TEST(CApiTest, PositionsTensorsAndTheirErrors) {
  Small s;
  std::vector<int32_t> pos(Small::N * Small::L);
  for (int64_t n = 0; n < Small::N; ++n) {
    for (int64_t i = 0; i < Small::L; ++i) pos[n * Small::L + i] = static_cast<int32_t>(i);
  }
  std::vector<float> bad(pos.size());
  mha_attention_inputs in = s.in;
  in.positions = Dense(bad.data(), MHA_DTYPE_F32, {Small::N, Small::L});
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, nullptr, 0),
                 "inputs->positions.dtype: expected MHA_DTYPE_I32 (6) or MHA_DTYPE_I64 (7), got 0");
  in.positions = mha_tensor{};
  in.key_positions = Dense(pos.data(), 9, {Small::N, Small::L});
  EXPECT_INVALID(mha_layer_plan(s.layer, &in, &s.out, nullptr, 0, 1, nullptr), "workspace_bytes");
  size_t bytes = 0;
  EXPECT_INVALID(mha_layer_plan(s.layer, &in, &s.out, nullptr, 0, 1, &bytes),
                 "inputs->key_positions.dtype: expected MHA_DTYPE_I32 (6) or MHA_DTYPE_I64 (7), "
                 "got 9");
  EXPECT_TRUE(s.OutputUntouched());

  // A layer that uses no position rejects given positions (the C++ API's check, reached).
  in.key_positions = mha_tensor{};
  in.positions = Dense(pos.data(), MHA_DTYPE_I32, {Small::N, Small::L});
  EXPECT_INVALID(mha_layer_forward(s.layer, s.ctx, &in, &s.out, nullptr, 0), "positions");

  // A windowed layer given the default positions explicitly computes bitwise what it computes
  // without them.
  mha_layer_config c;
  mha_layer_config_init(&c);
  c.embed_dim = Small::E;
  c.num_heads = Small::H;
  c.window = 2;
  mha_layer_weights w = s.Weights();
  mha_layer* windowed = nullptr;
  ASSERT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &windowed), MHA_STATUS_OK)
      << mha_last_error_message();
  std::vector<float> a(s.output.size()), b(s.output.size());
  mha_tensor ta = Dense(a.data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
  mha_tensor tb = Dense(b.data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
  ASSERT_EQ(mha_layer_forward(windowed, s.ctx, &in, &ta, nullptr, MHA_FORWARD_CAUSAL),
            MHA_STATUS_OK)
      << mha_last_error_message();
  ASSERT_EQ(mha_layer_forward(windowed, s.ctx, &s.in, &tb, nullptr, MHA_FORWARD_CAUSAL),
            MHA_STATUS_OK)
      << mha_last_error_message();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  mha_layer_destroy(windowed);
}

// Writes a state_dict-style safetensors file and checks the loaded layer against one created
// from the same arrays.
TEST(CApiTest, CreateFromSafetensors) {
  Small s;
  const std::string path = ::testing::TempDir() + "c_api_test_" + std::to_string(getpid()) +
                           ".safetensors";
  SafeTensorsWriter writer;
  const int64_t E = Small::E;
  ASSERT_TRUE(writer.Add("blk.attn.in_proj_weight", DType::kF32, {3 * E, E}, s.w_in.data()).ok());
  ASSERT_TRUE(writer.Add("blk.attn.in_proj_bias", DType::kF32, {3 * E}, s.b_in.data()).ok());
  ASSERT_TRUE(writer.Add("blk.attn.out_proj.weight", DType::kF32, {E, E}, s.w_out.data()).ok());
  ASSERT_TRUE(writer.Add("blk.attn.out_proj.bias", DType::kF32, {E}, s.b_out.data()).ok());
  ASSERT_TRUE(writer.WriteFile(path).ok());

  mha_load_options load;
  std::memset(&load, 0, sizeof(load));
  load.num_heads = Small::H;
  mha_layer* layer = nullptr;
  ASSERT_EQ(mha_layer_create_from_safetensors(path.c_str(), "blk.attn.", &load, &layer),
            MHA_STATUS_OK)
      << mha_last_error_message();
  mha_layer_config c;
  ASSERT_EQ(mha_layer_get_config(layer, &c), MHA_STATUS_OK);
  EXPECT_EQ(c.embed_dim, E);
  EXPECT_EQ(c.num_heads, Small::H);
  EXPECT_EQ(c.no_bias, 0);
  EXPECT_EQ(c.add_bias_kv, 0);

  std::vector<float> from_file(s.output.size());
  mha_tensor out = Dense(from_file.data(), MHA_DTYPE_F32, {Small::L, Small::N, E});
  ASSERT_EQ(mha_layer_forward(layer, s.ctx, &s.in, &out, nullptr, MHA_FORWARD_CAUSAL),
            MHA_STATUS_OK);
  ASSERT_EQ(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, nullptr, MHA_FORWARD_CAUSAL),
            MHA_STATUS_OK);
  EXPECT_EQ(std::memcmp(from_file.data(), s.output.data(), from_file.size() * 4), 0);
  mha_layer_destroy(layer);
  layer = nullptr;

  // Errors: wrong prefix (missing tensors), a missing file, bad options.
  EXPECT_EQ(mha_layer_create_from_safetensors(path.c_str(), "other.", &load, &layer),
            MHA_STATUS_FORMAT_ERROR);
  EXPECT_NE(std::string(mha_last_error_message()).find("other.out_proj.weight"), std::string::npos)
      << mha_last_error_message();
  EXPECT_EQ(mha_layer_create_from_safetensors((path + ".missing").c_str(), "", &load, &layer),
            MHA_STATUS_IO_ERROR);
  EXPECT_NE(std::string(mha_last_error_message()).find(".missing"), std::string::npos);
  load.num_heads = 0;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), "blk.attn.", &load, &layer),
                 "options->num_heads: expected > 0, got 0");
  load.num_heads = 3;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), "blk.attn.", &load, &layer),
                 "embed_dim: expected a multiple of num_heads (3), got 8");
  load.num_heads = 2;
  load.add_zero_attn = 5;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), "blk.attn.", &load, &layer),
                 "options->add_zero_attn");
  load.add_zero_attn = 0;
  load.qkv_layout = 3;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), "blk.attn.", &load, &layer),
                 "options->qkv_layout");
  EXPECT_EQ(layer, nullptr);
  std::remove(path.c_str());
}

// The variants through mha_load_options and the file's tensors: the loaded layer equals the one
// created from the same arrays and settings; Gemma's qk_norm_add_one adds 1 to the stored norm
// weights; the C-only checks name the option.
TEST(CApiTest, CreateFromSafetensorsWithVariants) {
  using VP = VariantProblem;
  const VariantProblem p;
  const std::string path =
      ::testing::TempDir() + "c_api_variants_" + std::to_string(getpid()) + ".safetensors";
  std::vector<float> q_minus_one = p.q_norm_whole, k_minus_one = p.k_norm_whole;
  for (float& v : q_minus_one) v -= 1.0f;
  for (float& v : k_minus_one) v -= 1.0f;
  const std::string pre = "model.layers.0.self_attn.";
  SafeTensorsWriter writer;
  const int64_t kvE = VP::KVH * VP::hd;
  ASSERT_TRUE(writer.Add(pre + "q_proj_weight", DType::kF32, {VP::E, VP::E}, p.wq.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "k_proj_weight", DType::kF32, {kvE, VP::E}, p.wk.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "v_proj_weight", DType::kF32, {kvE, VP::E}, p.wv.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "in_proj_bias", DType::kF32, {VP::E + 2 * kvE}, p.b.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "out_proj.weight", DType::kF32, {VP::E, VP::E}, p.wo.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "out_proj.bias", DType::kF32, {VP::E}, p.bo.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "sinks", DType::kF32, {VP::H}, p.sinks.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "alibi_slopes", DType::kF32, {VP::H}, p.slopes.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "q_norm.weight", DType::kF32, {VP::E}, q_minus_one.data()).ok());
  ASSERT_TRUE(writer.Add(pre + "k_norm.weight", DType::kF32, {kvE}, k_minus_one.data()).ok());
  ASSERT_TRUE(writer.WriteFile(path).ok());

  mha_load_options load;
  std::memset(&load, 0, sizeof(load));
  load.num_heads = VP::H;
  load.rope = MHA_ROPE_GPTJ;
  load.rope_theta = 1000.0f;
  load.rotary_dim = 2;
  load.rope_scale = 2.0f;
  load.window = 3;
  load.softcap = 0.75f;
  load.qk_norm_eps = 1e-5f;
  load.qk_norm_add_one = 1;
  mha_layer* layer = nullptr;
  ASSERT_EQ(mha_layer_create_from_safetensors(path.c_str(), pre.c_str(), &load, &layer),
            MHA_STATUS_OK)
      << mha_last_error_message();
  mha_layer_config got;
  ASSERT_EQ(mha_layer_get_config(layer, &got), MHA_STATUS_OK);
  EXPECT_EQ(got.num_kv_heads, VP::KVH);
  EXPECT_EQ(got.rope, MHA_ROPE_GPTJ);
  EXPECT_EQ(got.rope_theta, 1000.0f);
  EXPECT_EQ(got.rotary_dim, 2);
  EXPECT_EQ(got.rope_scale, 2.0f);
  EXPECT_EQ(got.alibi, 1);  // set by the alibi_slopes tensor
  EXPECT_EQ(got.window, 3);
  EXPECT_EQ(got.softcap, 0.75f);
  EXPECT_EQ(got.qk_norm_eps, 1e-5f);
  EXPECT_EQ(got.qk_norm_whole, 1);  // q_norm.weight [E]

  AttentionConfig c = p.Config();
  c.rope = RopeStyle::kGptj;
  c.rope_theta = 1000.0f;
  c.rotary_dim = 2;
  c.rope_scale = 2.0f;
  c.alibi = true;
  c.window = 3;
  c.softcap = 0.75f;
  c.qk_norm_eps = 1e-5f;
  c.qk_norm_whole = true;
  AttentionWeights w = p.Weights();
  w.sinks = p.sinks.data();
  w.alibi_slopes = p.slopes.data();
  w.q_norm_weight = p.q_norm_whole.data();
  w.k_norm_weight = p.k_norm_whole.data();
  const std::vector<float> want = ExpectCMatchesCpp(p, c, w, DType::kI32, /*causal=*/true);
  std::vector<float> from_file(want.size(), kSentinel);
  mha_attention_inputs in;
  std::memset(&in, 0, sizeof(in));
  in.query = Dense(const_cast<float*>(p.query.data()), MHA_DTYPE_F32, {VP::L, VP::N, VP::E});
  in.positions = Dense(const_cast<int32_t*>(p.pos32.data()), MHA_DTYPE_I32, {VP::N, VP::L});
  mha_tensor out = Dense(from_file.data(), MHA_DTYPE_F32, {VP::L, VP::N, VP::E});
  // The same weights request as ExpectCMatchesCpp's (the path, and so the rounding, follows it).
  std::vector<float> weights_out(VP::N * VP::H * VP::L * VP::L);
  mha_tensor wt = Dense(weights_out.data(), MHA_DTYPE_F32, {VP::N, VP::H, VP::L, VP::L});
  mha_context* ctx = NewContext(2);
  ASSERT_EQ(mha_layer_forward(layer, ctx, &in, &out, &wt,
                              MHA_FORWARD_CAUSAL | MHA_FORWARD_PER_HEAD_WEIGHTS),
            MHA_STATUS_OK)
      << mha_last_error_message();
  EXPECT_EQ(std::memcmp(from_file.data(), want.data(), want.size() * 4), 0);
  mha_context_destroy(ctx);
  mha_layer_destroy(layer);
  layer = nullptr;

  load.rope = 7;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), pre.c_str(), &load, &layer),
                 "options->rope: expected MHA_ROPE_NONE (0), MHA_ROPE_NEOX (1) or MHA_ROPE_GPTJ "
                 "(2), got 7");
  load.rope = MHA_ROPE_NONE;
  load.rotary_dim = 0;
  load.rope_theta = 0.0f;
  load.rope_scale = 0.0f;
  load.alibi = 3;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), pre.c_str(), &load, &layer),
                 "options->alibi: expected 0 or 1, got 3");
  load.alibi = 0;
  load.qk_norm_add_one = 2;
  EXPECT_INVALID(mha_layer_create_from_safetensors(path.c_str(), pre.c_str(), &load, &layer),
                 "options->qk_norm_add_one: expected 0 or 1, got 2");
  EXPECT_EQ(layer, nullptr);
  std::remove(path.c_str());
}

// Each thread sees only its own last message.
// 16-bit weights through the C API: a bf16 layer (converted by MHA_WEIGHTS_COPY, or viewing the
// caller's bf16 array) computes bitwise what an f32 layer holding the rounded weights computes;
// dtype fields out of range are rejected by name.
TEST(CApiTest, SixteenBitWeights) {
  Small s;
  mha_layer_config c;
  mha_layer_config_init(&c);
  c.embed_dim = Small::E;
  c.num_heads = Small::H;
  c.weight_dtype = MHA_DTYPE_BF16;
  mha_layer_weights w = s.Weights();
  mha_layer* copied = nullptr;
  ASSERT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_COPY, &copied), MHA_STATUS_OK)
      << mha_last_error_message();
  mha_layer_config got;
  ASSERT_EQ(mha_layer_get_config(copied, &got), MHA_STATUS_OK);
  EXPECT_EQ(got.weight_dtype, MHA_DTYPE_BF16);

  // The rounded weights, as bf16 bits and widened back to f32.
  auto round = [](const std::vector<float>& x, std::vector<uint16_t>* bits) {
    std::vector<float> r(x.size());
    bits->resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // nearest even (finite inputs)
      (*bits)[i] = static_cast<uint16_t>(u >> 16);
      std::memcpy(&r[i], &u, 4);
    }
    return r;
  };
  std::vector<uint16_t> in_bits, out_bits;
  std::vector<float> in_r = round(s.w_in, &in_bits), out_r = round(s.w_out, &out_bits);
  mha_layer_config c32 = c;
  c32.weight_dtype = MHA_DTYPE_F32;
  // 16-bit layers are never prepacked: the bitwise twin is the f32 layer without prepacking.
  c32.prepack = MHA_PREPACK_OFF;
  mha_layer_weights w32 = w;
  w32.in_proj_weight = in_r.data();
  w32.out_proj_weight = out_r.data();
  mha_layer* ref = nullptr;
  ASSERT_EQ(mha_layer_create(&c32, &w32, MHA_WEIGHTS_VIEW, &ref), MHA_STATUS_OK)
      << mha_last_error_message();
  mha_layer_weights w16 = w;
  w16.dtype = MHA_DTYPE_BF16;
  w16.in_proj_weight = in_bits.data();
  w16.out_proj_weight = out_bits.data();
  mha_layer* viewed = nullptr;
  ASSERT_EQ(mha_layer_create(&c, &w16, MHA_WEIGHTS_VIEW, &viewed), MHA_STATUS_OK)
      << mha_last_error_message();

  std::vector<float> outs[3];
  mha_layer* layers[3] = {ref, copied, viewed};
  for (int i = 0; i < 3; ++i) {
    outs[i].assign(s.output.size(), kSentinel);
    mha_tensor o = Dense(outs[i].data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
    ASSERT_EQ(mha_layer_forward(layers[i], s.ctx, &s.in, &o, nullptr, 0), MHA_STATUS_OK)
        << mha_last_error_message();
  }
  EXPECT_EQ(0, std::memcmp(outs[1].data(), outs[0].data(), outs[0].size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(outs[2].data(), outs[0].data(), outs[0].size() * sizeof(float)));
  for (mha_layer* l : layers) mha_layer_destroy(l);

  mha_layer* none = nullptr;
  mha_layer_config bad = c;
  bad.weight_dtype = MHA_DTYPE_BOOL;
  EXPECT_INVALID(mha_layer_create(&bad, &w, MHA_WEIGHTS_COPY, &none),
                 "config->weight_dtype: expected MHA_DTYPE_F32 (0), MHA_DTYPE_BF16 (1), "
                 "MHA_DTYPE_F16 (2), MHA_DTYPE_I8 (5) or MHA_DTYPE_I4 (8), got 3");
  mha_layer_weights bad_w = w;
  bad_w.dtype = -1;
  EXPECT_INVALID(mha_layer_create(&c, &bad_w, MHA_WEIGHTS_COPY, &none), "weights->dtype");
  // A view cannot convert f32 arrays into a bf16 layer.
  EXPECT_INVALID(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &none),
                 "must equal config.weight_dtype (bf16), got f32");
  mha_load_options load;
  std::memset(&load, 0, sizeof(load));
  load.num_heads = Small::H;
  load.weight_dtype = 9;
  EXPECT_INVALID(mha_layer_create_from_safetensors("x.safetensors", "", &load, &none),
                 "options->weight_dtype");
  load.weight_dtype = 0;
  load.prepack = -1;
  EXPECT_INVALID(mha_layer_create_from_safetensors("x.safetensors", "", &load, &none),
                 "options->prepack: expected MHA_PREPACK_ON (0), MHA_PREPACK_OFF (1), "
                 "MHA_PREPACK_PLAIN (2) or MHA_PREPACK_STRASSEN (3), got -1");
  load.prepack = 0;
  load.num_kv_heads = -1;
  EXPECT_INVALID(mha_layer_create_from_safetensors("x.safetensors", "", &load, &none),
                 "options->num_kv_heads");
  EXPECT_EQ(none, nullptr);
}

// Quantized weights through the C API: the config round-trips (weight_block resolved), the
// output is the C++ layer's bitwise, and kView or a bad block is refused with the C++ messages.
TEST(CApiTest, QuantizedWeights) {
  Small s;
  for (const int32_t dtype : {MHA_DTYPE_I8, MHA_DTYPE_I4}) {
    mha_layer_config c;
    mha_layer_config_init(&c);
    c.embed_dim = Small::E;
    c.num_heads = Small::H;
    c.weight_dtype = dtype;
    mha_layer_weights w = s.Weights();
    mha_layer* layer = nullptr;
    ASSERT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_COPY, &layer), MHA_STATUS_OK)
        << mha_last_error_message();
    mha_layer_config got;
    ASSERT_EQ(mha_layer_get_config(layer, &got), MHA_STATUS_OK);
    EXPECT_EQ(got.weight_dtype, dtype);
    EXPECT_EQ(got.weight_block, dtype == MHA_DTYPE_I4 ? 32 : 0);
    std::vector<float> out(s.output.size(), kSentinel);
    mha_tensor o = Dense(out.data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
    ASSERT_EQ(mha_layer_forward(layer, s.ctx, &s.in, &o, nullptr, 0), MHA_STATUS_OK)
        << mha_last_error_message();
    mha_layer_destroy(layer);

    AttentionConfig cc;
    cc.embed_dim = Small::E;
    cc.num_heads = Small::H;
    cc.weight_dtype = static_cast<DType>(dtype);
    AttentionWeights cw;
    cw.in_proj_weight = s.w_in.data();
    cw.in_proj_bias = s.b_in.data();
    cw.out_proj_weight = s.w_out.data();
    cw.out_proj_bias = s.b_out.data();
    std::unique_ptr<MultiheadAttention> cpp;
    ASSERT_TRUE(MultiheadAttention::Create(cc, cw, WeightBinding::kCopy, &cpp).ok());
    std::unique_ptr<Context> ctx;
    ASSERT_TRUE(Context::Create(ContextOptions{}, &ctx).ok());
    std::vector<float> want(s.output.size());
    AttentionInputs in;
    AttentionOutputs outs;
    const int64_t shape[3] = {Small::L, Small::N, Small::E};
    ASSERT_TRUE(TensorView::Dense(s.query.data(), DType::kF32, 3, shape, &in.query).ok());
    ASSERT_TRUE(TensorView::Dense(want.data(), DType::kF32, 3, shape, &outs.output).ok());
    ASSERT_TRUE(cpp->Forward(*ctx, in, outs).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), want.data(), want.size() * sizeof(float)));

    mha_layer* none = nullptr;
    EXPECT_INVALID(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &none),
                   "quantizes the weights into the layer's own codes: expected "
                   "WeightBinding::kCopy, got kView");
    mha_layer_config bad = c;
    bad.weight_block = 64;
    EXPECT_INVALID(mha_layer_create(&bad, &w, MHA_WEIGHTS_COPY, &none), "weight_block: expected");
  }
}

TEST(CApiTest, LastErrorMessageIsPerThread) {
  mha_layer_config c;
  mha_layer_config_init(&c);
  c.embed_dim = 0;
  c.num_heads = 1;
  mha_layer_weights w;
  std::memset(&w, 0, sizeof(w));
  mha_layer* layer = nullptr;
  ASSERT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &layer), MHA_STATUS_INVALID_ARGUMENT);
  const std::string main_msg = mha_last_error_message();
  ASSERT_NE(main_msg.find("embed_dim"), std::string::npos);

  std::string other_initial, other_after;
  std::thread t([&]() {
    other_initial = mha_last_error_message();
    size_t n = 0;
    EXPECT_EQ(mha_context_num_threads(nullptr, &n), MHA_STATUS_INVALID_ARGUMENT);
    other_after = mha_last_error_message();
  });
  t.join();
  EXPECT_EQ(other_initial, "");
  EXPECT_NE(other_after.find("context"), std::string::npos) << other_after;
  EXPECT_EQ(mha_last_error_message(), main_msg);

  // Two threads failing concurrently, many times, keep their own messages.
  auto worker = [](int64_t heads, std::string* last, bool* ok) {
    mha_layer_config cfg;
    mha_layer_config_init(&cfg);
    cfg.embed_dim = 8;
    mha_layer_weights none;
    std::memset(&none, 0, sizeof(none));
    const std::string want = "got " + std::to_string(heads);
    *ok = true;
    for (int i = 0; i < 2000; ++i) {
      cfg.num_heads = heads;
      mha_layer* l = nullptr;
      mha_layer_create(&cfg, &none, MHA_WEIGHTS_VIEW, &l);
      *last = mha_last_error_message();
      if (last->find(want) == std::string::npos) *ok = false;
    }
  };
  std::string last_a, last_b;
  bool ok_a = false, ok_b = false;
  std::thread a(worker, -3, &last_a, &ok_a);
  std::thread b(worker, -7, &last_b, &ok_b);
  a.join();
  b.join();
  EXPECT_TRUE(ok_a) << last_a;
  EXPECT_TRUE(ok_b) << last_b;
}

// One layer, several threads, each with its own context: same results as one thread.
TEST(CApiTest, SharedLayerAcrossThreads) {
  Small s;
  ASSERT_EQ(mha_layer_forward(s.layer, s.ctx, &s.in, &s.out, nullptr, 0), MHA_STATUS_OK);
  const std::vector<float> want = s.output;
  std::vector<std::vector<float>> results(3, std::vector<float>(want.size()));
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&s, &r]() {
      mha_context* ctx = nullptr;
      mha_context_options o;
      std::memset(&o, 0, sizeof(o));
      o.num_threads = 1;
      if (mha_context_create(&o, &ctx) != MHA_STATUS_OK) return;
      mha_tensor out = Dense(r.data(), MHA_DTYPE_F32, {Small::L, Small::N, Small::E});
      for (int i = 0; i < 50; ++i) mha_layer_forward(s.layer, ctx, &s.in, &out, nullptr, 0);
      mha_context_destroy(ctx);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(std::memcmp(r.data(), want.data(), want.size() * 4), 0);
}

}  // namespace
}  // namespace mha
