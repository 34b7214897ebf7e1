// The four configurations mha started from (shared/seeds), each at its exact size, against the
// double-precision reference. (The PyTorch fixtures seed_*.safetensors cover them against torch
// in golden_test; seed_fused_qkv there uses batch 4 to keep the file small, so batch 30 is
// checked here.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "mha/mha.hpp"
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

}  // namespace
}  // namespace mha
