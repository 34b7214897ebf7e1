// The four configurations mha started from (shared/seeds), each at its exact size, against the
// double-precision reference. (The PyTorch fixtures seed_*.safetensors cover them against torch
// in golden_test; seed_fused_qkv there uses batch 4 to keep the file small, so batch 30 is
// checked here.) Then the attention variants' configuration as the layer resolves it: ALiBi
// slopes, RoPE frequencies, and settings at their defaults computing exactly what a layer
// without them computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "mha/mha.hpp"
#include "runtime/attention_impl.h"
#include "tests/attention_test_util.h"

namespace mha {
namespace {

using testing_util::MaskChoice;
using testing_util::Problem;

void RunAndCompare(const Problem& p, size_t threads, testing_util::Views* v) {
  std::unique_ptr<MultiheadAttention> mha;
  Status s = MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &mha);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ContextOptions opts;
  opts.num_threads = threads;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(opts, &ctx).ok());
  testing_util::MakeViews(p, v);
  s = mha->Forward(*ctx, v->in, v->out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  reference::Outputs ref;
  testing_util::RunReference(p, &ref);
  const int64_t E = p.config.embed_dim;
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t l = 0; l < p.L; ++l)
      for (int64_t e = 0; e < E; ++e) {
        const double want = ref.output[(n * p.L + l) * E + e];
        ASSERT_NEAR(testing_util::OutputAt(p, v->output, n, l, e), want, 2e-5 + 2e-4 * std::abs(want))
            << "n=" << n << " l=" << l << " e=" << e;
      }
  if (p.need_weights) {
    const auto& w = p.average ? ref.mean_weights : ref.head_weights;
    ASSERT_EQ(v->weights.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(v->weights[i], w[i], 1e-5) << i;
  }
}

// Seed 000: cross-attention with query dim 4, key dim 3, value dim 2, embed 6, 2 heads, batch 2,
// 3 queries, 4 keys: output and per-head attention weights.
TEST(SeedConfigsTest, CrossAttentionWithDifferentInputDims) {
  std::mt19937 rng(0);
  Problem p;
  p.config.embed_dim = 6;
  p.config.num_heads = 2;
  p.config.q_dim = 4;
  p.config.kdim = 3;
  p.config.vdim = 2;
  p.config.batch_first = true;
  p.packed = false;
  p.N = 2;
  p.L = 3;
  p.S = 4;
  p.need_weights = true;
  p.average = false;
  testing_util::FillProblem(&p, &rng);
  testing_util::Views v;
  RunAndCompare(p, 2, &v);
  ASSERT_EQ(v.weights.size(), 2u * 2 * 3 * 4);  // [N, H, L, S]
  // Each per-head weight row is a distribution over the 4 keys.
  for (size_t row = 0; row < 2 * 2 * 3; ++row) {
    double sum = 0;
    for (int s = 0; s < 4; ++s) sum += v.weights[row * 4 + s];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

// Seed 001: self-attention, d_model 512, 8 heads, batch 2, sequence 10: projections split into
// per-head Q, K, V of shape [2, 8, 10, 64].
TEST(SeedConfigsTest, SelfAttentionPerHeadProjections) {
  std::mt19937 rng(1);
  Problem p;
  p.config.embed_dim = 512;
  p.config.num_heads = 8;
  p.config.batch_first = true;
  p.N = 2;
  p.L = p.S = 10;
  p.self_attention = true;
  testing_util::FillProblem(&p, &rng);
  testing_util::Views v;
  RunAndCompare(p, 2, &v);

  std::unique_ptr<MultiheadAttention> mha;
  ASSERT_TRUE(MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &mha).ok());
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  std::vector<float> q(2 * 8 * 10 * 64), k(q.size()), vv(q.size());
  const int64_t shape[4] = {2, 8, 10, 64};
  ProjectionOutputs po;
  ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, shape, &po.q).ok());
  ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, shape, &po.k).ok());
  ASSERT_TRUE(TensorView::Dense(vv.data(), DType::kF32, 4, shape, &po.v).ok());
  Status s = mha->Project(*ctx, v.in, po);
  ASSERT_TRUE(s.ok()) << s.ToString();
  reference::Outputs ref;
  testing_util::RunReference(p, &ref);
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_NEAR(q[i], ref.q[i], 1e-4) << i;
    ASSERT_NEAR(k[i], ref.k[i], 1e-4) << i;
    ASSERT_NEAR(vv[i], ref.v[i], 1e-4) << i;
  }
}

// Seed 002: fused QKV Linear(1024, 3 * 512) with the per-head interleaved layout, 8 heads,
// batch 30, sequence 5, additive float mask, output projection 512 -> 512.
TEST(SeedConfigsTest, FusedQkvPerHeadLayoutWithFloatMask) {
  std::mt19937 rng(2);
  Problem p;
  p.config.embed_dim = 512;
  p.config.num_heads = 8;
  p.config.q_dim = p.config.kdim = p.config.vdim = 1024;
  p.config.batch_first = true;
  p.packed = true;
  p.layout = QkvLayout::kPerHead;
  p.N = 30;
  p.L = p.S = 5;
  p.self_attention = true;
  p.attn = MaskChoice::kFloat;
  testing_util::FillProblem(&p, &rng);
  testing_util::Views v;
  RunAndCompare(p, 2, &v);
}

// Seed 003: unbatched cross-attention, one query of dim 20, 10 keys/values of dim 20, 4 heads:
// output and per-head attention weights.
TEST(SeedConfigsTest, UnbatchedCrossAttention) {
  std::mt19937 rng(3);
  Problem p;
  p.config.embed_dim = 20;
  p.config.num_heads = 4;
  p.batched = false;
  p.N = 1;
  p.L = 1;
  p.S = 10;
  p.need_weights = true;
  p.average = false;
  testing_util::FillProblem(&p, &rng);
  testing_util::Views v;
  RunAndCompare(p, 2, &v);
  EXPECT_EQ(v.out.attn_weights.rank, 3);  // [H, L, S]
  EXPECT_EQ(v.out.output.rank, 2);        // [L, E]
}

// The layer's resolved variants for `config` (8 x num_heads wide) and `weights`' variant tensors.
LayerVariants VariantsOf(AttentionConfig config, AttentionWeights weights) {
  config.embed_dim = 8 * config.num_heads;
  // The layer views them only until this function returns (the variants are copied out).
  std::vector<float> dummy(static_cast<size_t>(3 * config.embed_dim * config.embed_dim));
  weights.in_proj_weight = dummy.data();
  weights.out_proj_weight = dummy.data();
  weights.in_proj_bias = dummy.data();
  weights.out_proj_bias = dummy.data();
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::Create(config, weights, WeightBinding::kView, &layer);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return layer ? LayerWeightsOf(*layer).variants : LayerVariants();
}

// The ALiBi paper's get_slopes: 2^(-8 (h + 1) / H) for H a power of two, else the closest
// power of two's slopes then every other slope of twice that many (BLOOM's build_alibi_tensor).
TEST(VariantConfigTest, AlibiSlopesFollowThePaper) {
  AttentionConfig c;
  c.alibi = true;
  const struct {
    int64_t heads;
    std::vector<double> log2_slopes;
  } cases[] = {
      {1, {-8}},
      {2, {-4, -8}},
      {3, {-4, -8, -2}},
      {8, {-1, -2, -3, -4, -5, -6, -7, -8}},
      {12, {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5}},
  };
  for (const auto& t : cases) {
    c.num_heads = t.heads;
    const LayerVariants v = VariantsOf(c, AttentionWeights());
    ASSERT_EQ(v.alibi_slopes.size(), t.log2_slopes.size()) << t.heads;
    for (size_t h = 0; h < t.log2_slopes.size(); ++h) {
      EXPECT_EQ(v.alibi_slopes[h], static_cast<float>(std::exp2(t.log2_slopes[h])))
          << "H " << t.heads << " h " << h;
    }
  }
  // Given slopes replace them.
  c.num_heads = 2;
  const float given[2] = {0.75f, -0.5f};
  AttentionWeights w;
  w.alibi_slopes = given;
  const LayerVariants v = VariantsOf(c, w);
  EXPECT_EQ(v.alibi_slopes, std::vector<float>(given, given + 2));
}

TEST(VariantConfigTest, RopeFrequenciesAndDefaults) {
  AttentionConfig c;
  c.num_heads = 2;  // head_dim 8
  c.rope = RopeStyle::kGptj;
  LayerVariants v = VariantsOf(c, AttentionWeights());
  EXPECT_EQ(v.rotary_dim, 8);
  ASSERT_EQ(v.inv_freq.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v.inv_freq[i], std::pow(10000.0, -2.0 * i / 8)) << i;
  EXPECT_EQ(v.qk_norm_eps, 1e-6f);

  c.rotary_dim = 4;
  c.rope_theta = 500.0f;
  c.rope_scale = 2.0f;
  c.qk_norm_eps = 1e-5f;
  v = VariantsOf(c, AttentionWeights());
  EXPECT_EQ(v.rotary_dim, 4);
  ASSERT_EQ(v.inv_freq.size(), 2u);
  EXPECT_EQ(v.inv_freq[0], 0.5);
  EXPECT_EQ(v.inv_freq[1], std::pow(500.0, -0.5) / 2.0);
  EXPECT_EQ(v.qk_norm_eps, 1e-5f);
  EXPECT_TRUE(v.qk_transform());

  // Everything off: nothing resolved, no position used.
  v = VariantsOf(AttentionConfig{0, 2}, AttentionWeights());
  EXPECT_FALSE(v.any_position());
  EXPECT_FALSE(v.qk_transform());
  EXPECT_TRUE(v.inv_freq.empty() && v.alibi_slopes.empty() && v.sinks.empty());
}

// Settings that change nothing (QK-norm eps and layout without weights; RoPE at position 0,
// where every angle is 0 and each rotation is exact) give a plain layer's bits, on every path.
TEST(VariantConfigTest, NeutralSettingsGiveThePlainLayersBits) {
  for (const int64_t chunk : {int64_t{0}, int64_t{2}}) {
    testing_util::ScopedKeyChunking chunking(chunk);
    for (const bool self : {true, false}) {
      std::mt19937 rng(30);
      Problem p;
      p.config.embed_dim = 16;
      p.config.num_heads = 2;
      p.config.batch_first = true;
      p.N = 2;
      p.L = 5;
      p.S = self ? 5 : 7;
      p.self_attention = self;
      p.causal = true;
      testing_util::FillProblem(&p, &rng);
      testing_util::Views plain_v, v;
      RunAndCompare(p, 2, &plain_v);

      AttentionConfig c = p.config;
      c.qk_norm_eps = 1e-5f;
      c.qk_norm_whole = true;
      c.rope = RopeStyle::kNeox;
      c.rope_theta = 1000.0f;
      std::unique_ptr<MultiheadAttention> layer;
      ASSERT_TRUE(
          MultiheadAttention::Create(c, testing_util::WeightsOf(p), p.binding, &layer).ok());
      testing_util::MakeViews(p, &v);
      std::vector<int32_t> zeros(p.N * std::max(p.L, p.S), 0);
      const int64_t qshape[2] = {p.N, p.L}, kshape[2] = {p.N, p.S};
      ASSERT_TRUE(TensorView::Dense(zeros.data(), DType::kI32, 2, qshape, &v.in.positions).ok());
      if (!self) {
        ASSERT_TRUE(
            TensorView::Dense(zeros.data(), DType::kI32, 2, kshape, &v.in.key_positions).ok());
      }
      std::unique_ptr<Context> ctx;
      ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
      const Status s = layer->Forward(*ctx, v.in, v.out);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(
          0, std::memcmp(v.output.data(), plain_v.output.data(), v.output.size() * sizeof(float)))
          << "chunk " << chunk << " self " << self;
    }
  }
}

}  // namespace
}  // namespace mha
