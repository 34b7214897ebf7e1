// The KV cache's error contract (include/mha/kv_cache.hpp: "on error neither the cache nor any
// output is modified"), tested by failing each step of a call on purpose: validation (a bad
// shape, a layer of other heads, a count past the capacity in a later batch entry, a ring step
// whose window the ring no longer holds), the workspace (a caller-provided arena too small, on
// the decode path and on the prompt's forward) and the plan. After each failure the cache must
// be exactly as before: every length, the storage's bytes (K, V and int8 scales), the window a
// ring remembers from its last layer (seen through Truncate's message and its limit), and the
// caller's output.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"

namespace mha {
namespace {

constexpr int64_t kE = 32, kH = 4, kKvHeads = 2;

// A layer of kE features, kH heads of which kv_heads key/value heads, RoPE, causal window
// `window` (0: none), random weights copied into the layer (testing_util's problem).
std::unique_ptr<MultiheadAttention> MakeLayer(int64_t window, int64_t kv_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  testing_util::Problem p;
  p.config.embed_dim = kE;
  p.config.num_heads = kH;
  p.config.num_kv_heads = kv_heads;
  p.config.batch_first = true;
  p.config.window = window;
  p.config.rope = RopeStyle::kNeox;
  p.packed = false;
  p.self_attention = true;
  testing_util::FillProblem(&p, &rng);
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::Create(p.config, testing_util::WeightsOf(p),
                                              WeightBinding::kCopy, &layer);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return layer;
}

// Random tokens x [N, T, kE] and an output buffer of the same shape filled with a sentinel.
struct Tokens {
  std::vector<float> x, out;
  TensorView xv, ov;
  Tokens(int64_t N, int64_t T, uint32_t seed, int64_t out_tokens = 0) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    x.resize(N * T * kE);
    for (float& v : x) v = u(rng);
    const int64_t ot = out_tokens > 0 ? out_tokens : T;
    out.assign(N * ot * kE, -7.25f);
    const int64_t shape[3] = {N, T, kE}, out_shape[3] = {N, ot, kE};
    EXPECT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, shape, &xv).ok());
    EXPECT_TRUE(TensorView::Dense(out.data(), DType::kF32, 3, out_shape, &ov).ok());
  }
};

// Everything of a cache a failed call must leave alone: lengths, storage bytes, and for a ring
// Truncate's message for an impossible length, which names the remembered window.
struct Snapshot {
  std::vector<int64_t> lengths;
  std::vector<uint8_t> storage;
  std::string truncate_message;

  static Snapshot Of(KvCache& cache, const KvCacheOptions& o) {
    Snapshot s;
    for (int64_t n = 0; n < cache.batch(); ++n) s.lengths.push_back(cache.length(n));
    size_t bytes = 0;
    EXPECT_TRUE(KvCache::RequiredBytes(o, &bytes).ok());
    const uint8_t* base = static_cast<const uint8_t*>(cache.keys());
    s.storage.assign(base, base + bytes);
    s.truncate_message = cache.Truncate(0, cache.length(0) + 1).message();
    return s;
  }
  bool operator==(const Snapshot& o) const {
    return lengths == o.lengths && storage == o.storage && truncate_message == o.truncate_message;
  }
};

// Expects `call` to fail with `code` naming `needle`, leaving `cache` and `output` unchanged.
template <typename Call>
void ExpectFailsUntouched(KvCache& cache, const KvCacheOptions& o, const std::vector<float>& output,
                          StatusCode code, const std::string& needle, const Call& call) {
  const Snapshot before = Snapshot::Of(cache, o);
  const std::vector<float> out_before = output;
  const Status s = call();
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  EXPECT_TRUE(Snapshot::Of(cache, o) == before) << needle << ": the cache changed";
  EXPECT_TRUE(output == out_before) << needle << ": the output changed";
}

std::unique_ptr<Context> OwnArena() {
  ContextOptions co;
  co.num_threads = 2;
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(co, &ctx).ok());
  return ctx;
}

// A context over a caller buffer far too small for any call.
std::unique_ptr<Context> TinyArena(std::vector<uint8_t>* buffer) {
  buffer->assign(512, 0);
  ContextOptions co;
  co.num_threads = 2;
  co.arena_buffer = buffer->data();
  co.arena_bytes = buffer->size();
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(co, &ctx).ok());
  return ctx;
}

// Every failing step of Step, Append, Forward and AppendProjected on a plain cache (f32 and
// int8 storage), after a prefill and a decode step filled it.
TEST(KvCacheContractTest, FailedCallsLeaveThePlainCacheUntouched) {
  for (const DType dtype : {DType::kF32, DType::kI8}) {
    SCOPED_TRACE(DTypeName(dtype));
    const auto layer = MakeLayer(0, kKvHeads, 1);
    const auto other_heads = MakeLayer(0, kH, 2);
    constexpr int64_t N = 3, kCapacity = 74;
    KvCacheOptions o = KvCacheOptions::ForLayer(*layer, N, kCapacity, dtype);
    std::unique_ptr<KvCache> cache;
    ASSERT_TRUE(KvCache::Create(o, &cache).ok());
    auto ctx = OwnArena();
    Tokens prompt(N, 70, 3), token(N, 1, 4), step(N, 5, 5);
    ASSERT_TRUE(cache->Step(*ctx, *layer, prompt.xv, prompt.ov).ok());
    ASSERT_TRUE(cache->Step(*ctx, *layer, token.xv, token.ov).ok());

    // Validation: an output of the wrong token count; a layer of other kv heads.
    Tokens bad_out(N, 1, 6, /*out_tokens=*/2);
    ExpectFailsUntouched(*cache, o, bad_out.out, StatusCode::kInvalidArgument, "output",
                         [&] { return cache->Step(*ctx, *layer, bad_out.xv, bad_out.ov); });
    ExpectFailsUntouched(*cache, o, token.out, StatusCode::kInvalidArgument, "num_kv_heads",
                         [&] { return cache->Step(*ctx, *other_heads, token.xv, token.ov); });
    // Capacity: entries 0 and 2 fit (71 + 1), entry 1 (validated after entry 0) does not
    // (71 + 5 > 74).
    const int64_t counts[N] = {1, 5, 1};
    ExpectFailsUntouched(*cache, o, step.out, StatusCode::kInvalidArgument, "capacity exceeded",
                         [&] { return cache->Step(*ctx, *layer, step.xv, step.ov, counts); });
    ExpectFailsUntouched(*cache, o, step.out, StatusCode::kInvalidArgument, "capacity exceeded",
                         [&] { return cache->Append(*ctx, *layer, step.xv, step.xv, counts); });
    // The workspace: a caller arena too small, for a decode step and for Append alone.
    std::vector<uint8_t> small;
    auto tiny = TinyArena(&small);
    ExpectFailsUntouched(*cache, o, token.out, StatusCode::kOutOfMemory, "arena",
                         [&] { return cache->Step(*tiny, *layer, token.xv, token.ov); });
    ExpectFailsUntouched(*cache, o, token.out, StatusCode::kOutOfMemory, "arena",
                         [&] { return cache->Append(*tiny, *layer, token.xv, token.xv); });
    ExpectFailsUntouched(*cache, o, token.out, StatusCode::kOutOfMemory, "arena",
                         [&] { return cache->Forward(*tiny, *layer, token.xv, token.ov); });
    // AppendProjected past the capacity in entry 1.
    const int64_t hd = kE / kH;
    std::vector<float> kv(N * kKvHeads * 5 * hd, 0.5f);
    const int64_t kv_shape[4] = {N, kKvHeads, 5, hd};
    TensorView kview;
    ASSERT_TRUE(TensorView::Dense(kv.data(), DType::kF32, 4, kv_shape, &kview).ok());
    ExpectFailsUntouched(*cache, o, token.out, StatusCode::kInvalidArgument, "capacity exceeded",
                         [&] { return cache->AppendProjected(kview, kview, counts); });
    // A prompt into the emptied cache whose forward cannot get its workspace.
    cache->Reset();
    ExpectFailsUntouched(*cache, o, prompt.out, StatusCode::kOutOfMemory, "arena",
                         [&] { return cache->Step(*tiny, *layer, prompt.xv, prompt.ov); });
    // And the cache still works.
    EXPECT_TRUE(cache->Step(*ctx, *layer, prompt.xv, prompt.ov).ok());
    EXPECT_EQ(cache->length(2), 70);
  }
}

// A ring remembers the window of its last layer (Truncate's limit follows it). A call with a
// layer of another window that fails at its workspace, or at the ring's own check, must not
// replace it: Truncate's limit and message stay those of the first layer.
TEST(KvCacheContractTest, FailedCallsKeepTheRingsWindow) {
  const auto narrow = MakeLayer(4, kKvHeads, 7);
  const auto wide = MakeLayer(12, kKvHeads, 8);
  constexpr int64_t N = 2, kCapacity = 16;
  KvCacheOptions o = KvCacheOptions::ForLayer(*narrow, N, kCapacity, DType::kBF16);
  o.ring = true;
  std::unique_ptr<KvCache> cache;
  ASSERT_TRUE(KvCache::Create(o, &cache).ok());
  auto ctx = OwnArena();
  Tokens prompt(N, 64, 9), token(N, 1, 10), steps(N, 6, 11);
  ASSERT_TRUE(cache->Step(*ctx, *narrow, prompt.xv, prompt.ov).ok());
  ASSERT_TRUE(cache->Step(*ctx, *narrow, token.xv, token.ov).ok());
  // Truncate's message for a length it cannot take names the ring's window.
  auto window_note = [&] { return cache->Truncate(0, cache->length(0) + 1).message(); };
  ASSERT_NE(window_note().find("window 4"), std::string::npos) << window_note();

  std::vector<uint8_t> small;
  auto tiny = TinyArena(&small);
  ExpectFailsUntouched(*cache, o, token.out, StatusCode::kOutOfMemory, "arena",
                       [&] { return cache->Step(*tiny, *wide, token.xv, token.ov); });
  // The wide layer's ring check: 6 tokens need capacity - window + 1 >= 6.
  ExpectFailsUntouched(*cache, o, steps.out, StatusCode::kInvalidArgument, "capacity - window + 1",
                       [&] { return cache->Step(*ctx, *wide, steps.xv, steps.ov); });
  // The prompt's forward without its workspace, into the emptied ring.
  cache->Reset();
  ExpectFailsUntouched(*cache, o, prompt.out, StatusCode::kOutOfMemory, "arena",
                       [&] { return cache->Step(*tiny, *wide, prompt.xv, prompt.ov); });
  EXPECT_NE(window_note().find("window 4"), std::string::npos) << window_note();
  // A successful call with the wide layer does take its window.
  ASSERT_TRUE(cache->Step(*ctx, *wide, prompt.xv, prompt.ov).ok());
  EXPECT_NE(window_note().find("window 12"), std::string::npos) << window_note();
}

// Plan validates without touching the cache; Truncate out of range changes nothing.
TEST(KvCacheContractTest, PlanAndTruncateErrorsLeaveTheCacheUntouched) {
  const auto layer = MakeLayer(0, kKvHeads, 12);
  const auto other_heads = MakeLayer(0, kH, 13);
  KvCacheOptions o = KvCacheOptions::ForLayer(*layer, 2, 40, DType::kF16);
  std::unique_ptr<KvCache> cache;
  ASSERT_TRUE(KvCache::Create(o, &cache).ok());
  auto ctx = OwnArena();
  Tokens t(2, 3, 14);
  ASSERT_TRUE(cache->Step(*ctx, *layer, t.xv, t.ov).ok());
  size_t bytes = 0;
  ExpectFailsUntouched(*cache, o, t.out, StatusCode::kInvalidArgument, "num_kv_heads",
                       [&] { return cache->Plan(*other_heads, 4, 2, &bytes); });
  ExpectFailsUntouched(*cache, o, t.out, StatusCode::kInvalidArgument, "max_tokens",
                       [&] { return cache->Plan(*layer, 0, 2, &bytes); });
  ExpectFailsUntouched(*cache, o, t.out, StatusCode::kInvalidArgument, "length",
                       [&] { return cache->Truncate(1, 4); });
  ExpectFailsUntouched(*cache, o, t.out, StatusCode::kInvalidArgument, "batch entry",
                       [&] { return cache->Truncate(2, 0); });
}

}  // namespace
}  // namespace mha
