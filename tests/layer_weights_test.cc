// Tests of the layer's weight binding (runtime/layer_weights.cc): a WeightBinding::kCopy layer
// whose every product reads a packing keeps only its packings (LayerWeights::KeepOnlyPackings:
// packed straight from the caller's arrays, or from its copy when it reorders or converts them),
// never reads the caller's arrays after Create, and computes bitwise what a kView layer of the
// same weights (the same packings) computes on every path that multiplies the weights: the
// forward (fused self-attention projection, cross-attention, key chunks, Strassen),
// MultiheadAttention::Project (per-head column ranges), and the KV cache's prefill and decode
// steps (few rows); on every target. A layer whose heads do not start on the packing's
// micro-panels keeps its copy, with the same results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gemm_route.h"
#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "runtime/attention_impl.h"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

// A layer's configuration and weights (uniform in [-0.2, 0.2]); in_proj_weight when `fused`,
// else separate q/k/v weights of input dims qd, kvd.
struct Layer {
  AttentionConfig config;
  bool fused = true;
  QkvLayout layout = QkvLayout::kPyTorch;
  std::vector<float> in_w, in_b, wq, wk, wv, wo, bo, bias_k, bias_v;

  Layer(const AttentionConfig& c, bool fused_in, std::mt19937* rng) : config(c), fused(fused_in) {
    const int64_t E = c.embed_dim;
    const int64_t kvE = E / c.num_heads * (c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads);
    const int64_t qd = c.q_dim > 0 ? c.q_dim : E, kd = c.kdim > 0 ? c.kdim : E;
    const int64_t vd = c.vdim > 0 ? c.vdim : E;
    auto fill = [rng](std::vector<float>* v, int64_t n) {
      *v = test::SymmetricFloats(static_cast<size_t>(n), 0.2f, rng);
    };
    if (fused) {
      fill(&in_w, (E + 2 * kvE) * qd);
    } else {
      fill(&wq, E * qd);
      fill(&wk, kvE * kd);
      fill(&wv, kvE * vd);
    }
    fill(&in_b, E + 2 * kvE);
    fill(&wo, E * E);
    fill(&bo, E);
    fill(&bias_k, kvE);
    fill(&bias_v, kvE);
  }

  AttentionWeights Weights() const {
    AttentionWeights w;
    if (fused) {
      w.in_proj_weight = in_w.data();
      w.qkv_layout = layout;
    } else {
      w.q_proj_weight = wq.data();
      w.k_proj_weight = wk.data();
      w.v_proj_weight = wv.data();
    }
    if (config.bias) {
      w.in_proj_bias = in_b.data();
      w.out_proj_bias = bo.data();
    }
    if (config.add_bias_kv) {
      w.bias_k = bias_k.data();
      w.bias_v = bias_v.data();
    }
    w.out_proj_weight = wo.data();
    return w;
  }

  std::unique_ptr<MultiheadAttention> Create(WeightBinding binding) const {
    std::unique_ptr<MultiheadAttention> layer;
    const Status s = MultiheadAttention::Create(config, Weights(), binding, &layer);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return layer;
  }
};

TensorView View(std::vector<float>* v, std::vector<int64_t> shape) {
  TensorView t;
  const Status s =
      TensorView::Dense(v->data(), DType::kF32, static_cast<int>(shape.size()), shape.data(), &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return t;
}

// Every result a layer computes from `inputs`: the forwards (self-attention, causal, when the
// input dims agree; cross-attention with attention weights), Project's q, k, v, and the KV
// cache's prefill then two decode steps (self-attention layers without appended keys).
struct Inputs {
  int64_t N = 2, L = 24, S = 33;
  std::vector<float> x, q, k, v, step;
};

std::vector<std::vector<float>> Results(const MultiheadAttention& layer, const Inputs& in) {
  const AttentionConfig& c = layer.config();
  const int64_t E = c.embed_dim, H = c.num_heads, hd = E / H;
  const int64_t KVH = c.num_kv_heads > 0 ? c.num_kv_heads : H;
  const int64_t qd = c.q_dim > 0 ? c.q_dim : E, kd = c.kdim > 0 ? c.kdim : E;
  const int64_t vd = c.vdim > 0 ? c.vdim : E;
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  std::vector<std::vector<float>> out;
  const bool self = qd == kd && kd == vd;
  std::vector<float> x = in.x, q = in.q, k = in.k, v = in.v, step = in.step;
  if (self) {
    out.emplace_back(static_cast<size_t>(in.N * in.L * E));
    AttentionInputs a;
    a.query = View(&x, {in.N, in.L, qd});
    a.causal = true;
    AttentionOutputs o;
    o.output = View(&out.back(), {in.N, in.L, E});
    const Status s = layer.Forward(*ctx, a, o);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  const int64_t St = in.S + (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
  {
    out.emplace_back(static_cast<size_t>(in.N * in.L * E));
    std::vector<float> weights(static_cast<size_t>(in.N * in.L * St));
    AttentionInputs a;
    a.query = View(&q, {in.N, in.L, qd});
    a.key = View(&k, {in.N, in.S, kd});
    a.value = View(&v, {in.N, in.S, vd});
    a.need_weights = true;
    AttentionOutputs o;
    o.output = View(&out.back(), {in.N, in.L, E});
    o.attn_weights = View(&weights, {in.N, in.L, St});
    const Status s = layer.Forward(*ctx, a, o);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.push_back(weights);
  }
  {
    std::vector<float> pq(static_cast<size_t>(in.N * H * in.L * hd));
    std::vector<float> pk(static_cast<size_t>(in.N * KVH * St * hd)), pv(pk.size());
    AttentionInputs a;
    a.query = View(&q, {in.N, in.L, qd});
    a.key = View(&k, {in.N, in.S, kd});
    a.value = View(&v, {in.N, in.S, vd});
    ProjectionOutputs po;
    po.q = View(&pq, {in.N, H, in.L, hd});
    po.k = View(&pk, {in.N, KVH, St, hd});
    po.v = View(&pv, {in.N, KVH, St, hd});
    const Status s = layer.Project(*ctx, a, po);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.push_back(pq);
    out.push_back(pk);
    out.push_back(pv);
  }
  if (self && !c.add_bias_kv && !c.add_zero_attn) {
    std::unique_ptr<KvCache> cache;
    EXPECT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(layer, in.N, in.L + 2), &cache).ok());
    out.emplace_back(static_cast<size_t>(in.N * in.L * E));
    Status s =
        cache->Step(*ctx, layer, View(&x, {in.N, in.L, E}), View(&out.back(), {in.N, in.L, E}));
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (int t = 0; t < 2; ++t) {
      out.emplace_back(static_cast<size_t>(in.N * E));
      s = cache->Step(*ctx, layer, View(&step, {in.N, 1, E}), View(&out.back(), {in.N, 1, E}));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  }
  return out;
}

// A copy of `l` keeps only its packings exactly when `released`, and computes the bits of a view
// of `view_of` (the same weights in PyTorch's layout).
void ExpectCopyMatchesView(const Layer& l, const Layer& view_of, bool released, int64_t L,
                           int64_t S, uint32_t seed) {
  std::mt19937 rng(seed);
  const AttentionConfig& c = l.config;
  const int64_t E = c.embed_dim;
  const int64_t qd = c.q_dim > 0 ? c.q_dim : E, kd = c.kdim > 0 ? c.kdim : E;
  const int64_t vd = c.vdim > 0 ? c.vdim : E;
  Inputs in;
  in.L = L;
  in.S = S;
  in.x = test::SymmetricFloats(static_cast<size_t>(in.N * L * qd), 1.0f, &rng);
  in.q = test::SymmetricFloats(static_cast<size_t>(in.N * L * qd), 1.0f, &rng);
  in.k = test::SymmetricFloats(static_cast<size_t>(in.N * S * kd), 1.0f, &rng);
  in.v = test::SymmetricFloats(static_cast<size_t>(in.N * S * vd), 1.0f, &rng);
  in.step = test::SymmetricFloats(static_cast<size_t>(in.N * qd), 1.0f, &rng);
  const std::unique_ptr<MultiheadAttention> view = view_of.Create(WeightBinding::kView);
  ASSERT_TRUE(view);
  EXPECT_NE(LayerWeightsOf(*view).w_q.data, nullptr);  // a view keeps the caller's arrays
  const std::vector<std::vector<float>> a = Results(*view, in);
  // The copy from arrays that are overwritten right after Create: it must not read them again.
  Layer scratch = l;
  const std::unique_ptr<MultiheadAttention> copy = scratch.Create(WeightBinding::kCopy);
  ASSERT_TRUE(copy);
  for (std::vector<float>* v : {&scratch.in_w, &scratch.in_b, &scratch.wq, &scratch.wk, &scratch.wv,
                                &scratch.wo, &scratch.bo, &scratch.bias_k, &scratch.bias_v}) {
    std::fill(v->begin(), v->end(), std::numeric_limits<float>::quiet_NaN());
  }
  const LayerWeights& w = LayerWeightsOf(*copy);
  EXPECT_EQ(w.owned.empty() && w.owned16.empty(), released);
  EXPECT_EQ(w.w_q.data == nullptr, released);
  EXPECT_EQ(w.w_o.data == nullptr, released);
  const std::vector<std::vector<float>> b = Results(*copy, in);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << "result " << i << " differs (forward, cross forward, weights, q, k, v, prefill, steps)";
  }
}

// Whether an f32 layer of head_dim hd keeps only its prepacking on the active target.
bool F32Releases(int64_t hd) {
  return kernels::GemmBlocking().prefers_rows && kernels::PrepackedMinRows() == 1 &&
         hd % static_cast<int64_t>(kernels::GemmBlocking().nr) == 0;
}

AttentionConfig Config(int64_t E, int64_t H) {
  AttentionConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  c.batch_first = true;
  return c;
}

class LayerWeightsTest : public test::PerTargetTest {};

TEST_P(LayerWeightsTest, FusedProjectionCopyKeepsOnlyThePacking) {
  std::mt19937 rng(1);
  const Layer l(Config(64, 4), true, &rng);  // head_dim 16
  ExpectCopyMatchesView(l, l, F32Releases(16), 24, 33, 2);
}

// The per-head interleaved layout is reordered into a copy first, which is then freed.
TEST_P(LayerWeightsTest, PerHeadLayoutCopyKeepsOnlyThePacking) {
  std::mt19937 rng(19);
  const Layer torch(Config(64, 4), true, &rng);
  Layer per_head = torch;
  per_head.layout = QkvLayout::kPerHead;
  const int64_t E = 64, H = 4, hd = 16;
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t part = 0; part < 3; ++part) {
      for (int64_t d = 0; d < hd; ++d) {
        const int64_t src = part * E + h * hd + d, dst = (h * 3 + part) * hd + d;
        std::copy_n(torch.in_w.begin() + src * E, E, per_head.in_w.begin() + dst * E);
        per_head.in_b[static_cast<size_t>(dst)] = torch.in_b[static_cast<size_t>(src)];
      }
    }
  }
  ExpectCopyMatchesView(per_head, torch, F32Releases(16), 24, 33, 20);
}

TEST_P(LayerWeightsTest, GroupedQueryCrossAttentionWithOtherInputDims) {
  std::mt19937 rng(3);
  AttentionConfig c = Config(64, 4);
  c.num_kv_heads = 2;
  c.q_dim = 40;
  c.kdim = c.vdim = 48;
  c.add_bias_kv = true;
  const Layer l(c, false, &rng);
  ExpectCopyMatchesView(l, l, F32Releases(16), 21, 30, 4);
}

TEST_P(LayerWeightsTest, GroupedQuerySelfAttentionWithoutBias) {
  std::mt19937 rng(5);
  AttentionConfig c = Config(128, 2);  // head_dim 64
  c.num_kv_heads = 1;
  c.bias = false;
  const Layer l(c, false, &rng);
  ExpectCopyMatchesView(l, l, F32Releases(64), 40, 40, 6);
}

TEST_P(LayerWeightsTest, KeyChunkedForward) {
  testing_util::ScopedKeyChunking chunks(8);
  std::mt19937 rng(7);
  const Layer l(Config(64, 4), true, &rng);
  ExpectCopyMatchesView(l, l, F32Releases(16), 20, 29, 8);
}

TEST_P(LayerWeightsTest, StrassenOperands) {
  std::mt19937 rng(9);
  AttentionConfig c = Config(512, 8);
  c.prepack = WeightPrepack::kStrassen;
  const Layer l(c, true, &rng);
  ExpectCopyMatchesView(l, l, F32Releases(64), 70, 66, 10);
}

TEST_P(LayerWeightsTest, Bf16ComputeCopyKeepsOnlyTheBf16Packing) {
  std::mt19937 rng(11);
  AttentionConfig c = Config(64, 2);  // head_dim 32: one bf16 panel
  c.compute = Compute::kBF16;
  const Layer l(c, true, &rng);
  ExpectCopyMatchesView(l, l, true, 24, 33, 12);
}

// bf16 storage, converted from f32 at Create: the 16-bit copy is freed too. Its bits are those of
// an f32-stored view of the same weights rounded to bf16 (both pack the same bf16 values).
TEST_P(LayerWeightsTest, Bf16StorageCopyKeepsOnlyTheBf16Packing) {
  std::mt19937 rng(21);
  AttentionConfig c = Config(64, 2);
  c.compute = Compute::kBF16;
  Layer rounded(c, true, &rng);
  for (std::vector<float>* v : {&rounded.in_w, &rounded.wo}) {  // to bf16 and back, as Create does
    std::vector<uint16_t> bf16(v->size());
    ConvertElements(v->data(), DType::kF32, bf16.data(), DType::kBF16, v->size());
    ConvertElements(bf16.data(), DType::kBF16, v->data(), DType::kF32, v->size());
  }
  Layer stored = rounded;
  stored.config.weight_dtype = DType::kBF16;
  ExpectCopyMatchesView(stored, rounded, true, 24, 33, 22);
}

TEST_P(LayerWeightsTest, HeadsOffTheMicroPanelsKeepTheCopy) {
  std::mt19937 rng(13);
  const Layer f32(Config(32, 4), true, &rng);  // head_dim 8 < NR
  ExpectCopyMatchesView(f32, f32, false, 24, 33, 14);
  AttentionConfig c = Config(64, 4);  // head_dim 16 < the bf16 panels' 32 columns
  c.compute = Compute::kBF16;
  const Layer bf16(c, true, &rng);
  ExpectCopyMatchesView(bf16, bf16, false, 24, 33, 15);
}

TEST_P(LayerWeightsTest, UnpackedLayerKeepsTheCopy) {
  std::mt19937 rng(17);
  AttentionConfig c = Config(64, 4);
  c.prepack = WeightPrepack::kOff;
  const Layer l(c, true, &rng);
  ExpectCopyMatchesView(l, l, false, 24, 33, 18);
}

MHA_INSTANTIATE_PER_TARGET(LayerWeightsTest);

}  // namespace
}  // namespace mha
