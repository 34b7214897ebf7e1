// Steady-state decoding through a KvCache performs no heap allocation: operator new and malloc
// (and friends) are interposed in this test binary and counted while the decode steps run, on
// every thread (the pool's workers included). Same technique as tests/alloc_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"

#include "tests/alloc_counter.h"

namespace mha {
namespace {

// Steps `prompt` [N, P, E] into the empty `cache`, then 3 warm-up tokens (the arena grows to the
// plan once), then counts the heap allocations of `steps` decode steps and of `append_forward`
// Append + Forward pairs of one token. *ok: whether every call succeeded.
int64_t DecodeAllocations(Context& ctx, const MultiheadAttention& layer, KvCache& cache,
                          std::vector<float>& prompt, int64_t N, int64_t E, int steps,
                          int append_forward, bool* ok) {
  const int64_t P = static_cast<int64_t>(prompt.size()) / (N * E);
  std::vector<float> prompt_out(prompt.size()), token(N * E, 0.5f), out(N * E);
  const int64_t p_shape[3] = {N, P, E}, t_shape[3] = {N, 1, E};
  TensorView pv, pov, tv, ov;
  *ok = TensorView::Dense(prompt.data(), DType::kF32, 3, p_shape, &pv).ok() &&
        TensorView::Dense(prompt_out.data(), DType::kF32, 3, p_shape, &pov).ok() &&
        TensorView::Dense(token.data(), DType::kF32, 3, t_shape, &tv).ok() &&
        TensorView::Dense(out.data(), DType::kF32, 3, t_shape, &ov).ok() &&
        cache.Step(ctx, layer, pv, pov).ok();
  for (int i = 0; i < 3 && *ok; ++i) *ok = cache.Step(ctx, layer, tv, ov).ok();
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < steps && *ok; ++i) *ok = cache.Step(ctx, layer, tv, ov).ok();
  for (int i = 0; i < append_forward && *ok; ++i) {
    *ok = cache.Append(ctx, layer, tv, tv).ok() && cache.Forward(ctx, layer, tv, ov).ok();
  }
  g_counting = false;
  return g_allocations.load();
}

// One layer per head layout, batch 2, bf16 and f32 caches: after a prefill and a few warm-up
// steps (the arena grows to the plan once), decode steps, and Append / Forward separately,
// allocate nothing.
TEST(KvAllocTest, DecodeAllocatesNothingInSteadyState) {
#ifdef MHA_SANITIZED
  GTEST_SKIP() << "allocation counting interposes malloc, which the sanitizers own";
#endif
  constexpr int64_t E = 64, H = 8, N = 2, kPrefill = 500, kCapacity = 600;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  ContextOptions opts;
  opts.num_threads = 2;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(opts, &ctx).ok());
  for (int64_t kvh : {8, 2, 1}) {
    const int64_t kvE = kvh * (E / H);
    std::vector<float> wq(E * E), wk(kvE * E), wv(kvE * E), b(E + 2 * kvE), wo(E * E), bo(E);
    for (auto* w : {&wq, &wk, &wv, &b, &wo, &bo}) {
      for (float& x : *w) x = u(rng);
    }
    AttentionConfig c;
    c.embed_dim = E;
    c.num_heads = H;
    c.num_kv_heads = kvh;
    AttentionWeights w;
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.in_proj_bias = b.data();
    w.out_proj_weight = wo.data();
    w.out_proj_bias = bo.data();
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(MultiheadAttention::Create(c, w, WeightBinding::kView, &layer).ok());
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      std::unique_ptr<KvCache> cache;
      ASSERT_TRUE(
          KvCache::Create(KvCacheOptions::ForLayer(*layer, N, kCapacity, dtype), &cache).ok());
      std::vector<float> prompt(N * kPrefill * E);
      for (float& x : prompt) x = u(rng);
      // 503 -> 528 positions: crosses the chunk boundary at 512 (2 -> 3 chunks of 256); the
      // workspace is planned for the capacity, so the arena does not grow.
      bool ok = false;
      const int64_t allocations = DecodeAllocations(*ctx, *layer, *cache, prompt, N, E, 20, 5, &ok);
      ASSERT_TRUE(ok);
      EXPECT_EQ(allocations, 0) << "num_kv_heads " << kvh << ", " << DTypeName(dtype);
    }
  }
}

// A ring on a windowed layer with RoPE, QK-norm and sinks: decoding through the wrap-around
// (lengths past the capacity, spans that wrap) allocates nothing either.
TEST(KvAllocTest, RingDecodeWithVariantsAllocatesNothing) {
#ifdef MHA_SANITIZED
  GTEST_SKIP() << "allocation counting interposes malloc, which the sanitizers own";
#endif
  constexpr int64_t E = 64, H = 4, KVH = 2, N = 2, kPrompt = 80, kCapacity = 300;
  const int64_t hd = E / H, kvE = KVH * hd;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> wq(E * E), wk(kvE * E), wv(kvE * E), wo(E * E), sinks(H), norm(hd);
  for (auto* w : {&wq, &wk, &wv, &wo, &sinks}) {
    for (float& x : *w) x = u(rng);
  }
  for (float& x : norm) x = 1.0f + u(rng);
  AttentionConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  c.num_kv_heads = KVH;
  c.rope = RopeStyle::kNeox;
  c.window = 100;
  c.bias = false;
  AttentionWeights w;
  w.q_proj_weight = wq.data();
  w.k_proj_weight = wk.data();
  w.v_proj_weight = wv.data();
  w.out_proj_weight = wo.data();
  w.sinks = sinks.data();
  w.q_norm_weight = norm.data();
  w.k_norm_weight = norm.data();
  std::unique_ptr<MultiheadAttention> layer;
  const Status created = MultiheadAttention::Create(c, w, WeightBinding::kView, &layer);
  ASSERT_TRUE(created.ok()) << created.ToString();
  ContextOptions opts;
  opts.num_threads = 2;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(opts, &ctx).ok());
  KvCacheOptions o = KvCacheOptions::ForLayer(*layer, N, kCapacity, DType::kBF16);
  o.ring = true;
  std::unique_ptr<KvCache> cache;
  ASSERT_TRUE(KvCache::Create(o, &cache).ok());
  std::vector<float> prompt(N * kPrompt * E, 0.25f);
  // 83 -> 383 positions: past the capacity of 300, over the span boundary at 256.
  bool ok = false;
  const int64_t allocations = DecodeAllocations(*ctx, *layer, *cache, prompt, N, E, 300, 0, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(cache->length(0), 383);
  EXPECT_EQ(allocations, 0);
}

TEST(KvAllocTest, CounterSeesAllocations) {
#ifdef MHA_SANITIZED
  GTEST_SKIP() << "allocation counting interposes malloc, which the sanitizers own";
#endif
  g_allocations = 0;
  g_counting = true;
  void* p = std::malloc(100);
  int* q = new int(3);
  g_counting = false;
  std::free(p);
  delete q;
  EXPECT_EQ(g_allocations.load(), 2);
}

}  // namespace
}  // namespace mha
