// Tests of the KV cache's C API (the "KV cache" section of include/mha/mha.h): decoding through
// it gives bitwise the outputs of the C++ KvCache fed the same way, and the one-shot causal
// forward (mha_layer_forward with MHA_FORWARD_CAUSAL) within the tolerances of
// tests/kv_cache_test.cc (f32 1e-5, bf16 2e-2, f16 4e-3, relative to 1 + |forward|), for MHA,
// GQA and MQA layers, ragged batches, append + forward, projected appends, truncate and reset,
// caller buffers, a ring on a windowed layer with RoPE and sinks; every NULL pointer and bad value
// gives the right status and a message naming the argument, and leaves the cache, the outputs and
// the out-parameters untouched; steady-state decoding allocates nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.h"
#include "mha/mha.hpp"
#include "runtime/c_api_internal.h"
#include "tests/alloc_counter.h"
#include "tests/c_api_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

using testing_util::Dense;
using testing_util::kSentinel;
using testing_util::NewContext;

// As tests/kv_cache_test.cc derives them.
double ToleranceOf(int32_t dtype) {
  return dtype == MHA_DTYPE_F32 ? 1e-5 : dtype == MHA_DTYPE_F16 ? 4e-3 : 2e-2;
}

// Attention variants of a Fixture's layer, set through mha_layer_config / mha_layer_weights.
struct Variant {
  int32_t rope = MHA_ROPE_NONE;
  int64_t window = 0;
  bool sinks = false;
};

// A random self-attention layer (separate q/k/v weights, biases, batch_first) and a context,
// created through the C API, and sequences x [N, S, E]. The C++ side of the comparisons uses
// the same objects, reached through the handles (runtime/c_api_internal.h).
struct Fixture {
  int64_t E, H, KVH, N, S;
  std::vector<float> wq, wk, wv, bias, wo, bo, x, sinks;
  mha_layer* layer = nullptr;
  mha_context* ctx = nullptr;
  bool int8_attention = false;  // the caches' (C and C++) int8_attention option

  Fixture(int64_t e, int64_t h, int64_t kvh, int64_t n, int64_t s, uint32_t seed,
          const Variant& variant = Variant())
      : E(e), H(h), KVH(kvh), N(n), S(s) {
    std::mt19937 rng(seed);
    const int64_t kvE = KVH * (E / H);
    const float wb = 1.0f / std::sqrt(static_cast<float>(E));
    wq = test::SymmetricFloats(E * E, wb, &rng);
    wk = test::SymmetricFloats(kvE * E, wb, &rng);
    wv = test::SymmetricFloats(kvE * E, wb, &rng);
    bias = test::SymmetricFloats(E + 2 * kvE, wb, &rng);
    wo = test::SymmetricFloats(E * E, wb, &rng);
    bo = test::SymmetricFloats(E, wb, &rng);
    x = test::SymmetricFloats(N * S * E, 1.0f, &rng);
    mha_layer_config c;
    mha_layer_config_init(&c);
    c.embed_dim = E;
    c.num_heads = H;
    c.num_kv_heads = KVH;
    c.batch_first = 1;
    c.rope = variant.rope;
    c.window = variant.window;
    mha_layer_weights w;
    std::memset(&w, 0, sizeof(w));
    if (variant.sinks) {
      sinks = test::SymmetricFloats(H, 1.0f, &rng);
      w.sinks = sinks.data();
    }
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.in_proj_bias = bias.data();
    w.out_proj_weight = wo.data();
    w.out_proj_bias = bo.data();
    EXPECT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &layer), MHA_STATUS_OK)
        << mha_last_error_message();
    ctx = NewContext(2);
  }
  ~Fixture() {
    mha_layer_destroy(layer);
    mha_context_destroy(ctx);
  }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  std::string Describe() const {
    return "E " + std::to_string(E) + " H " + std::to_string(H) + " KVH " + std::to_string(KVH) +
           " N " + std::to_string(N) + " S " + std::to_string(S);
  }

  // The one-shot causal forward of sequences `seq` [N, S, E] through the C API.
  std::vector<float> Reference(const std::vector<float>& seq) const {
    std::vector<float> seq_copy = seq, out(seq.size(), kSentinel);
    mha_attention_inputs in;
    std::memset(&in, 0, sizeof(in));
    in.query = Dense(seq_copy.data(), MHA_DTYPE_F32, {N, S, E});
    const mha_tensor o = Dense(out.data(), MHA_DTYPE_F32, {N, S, E});
    EXPECT_EQ(mha_layer_forward(layer, ctx, &in, &o, nullptr, MHA_FORWARD_CAUSAL), MHA_STATUS_OK)
        << mha_last_error_message();
    return out;
  }

  mha_kv_cache_options Options(int32_t dtype, int64_t capacity, bool ring = false) const {
    mha_kv_cache_options o;
    std::memset(&o, 0, sizeof(o));
    o.batch = N;
    o.capacity = capacity;
    o.dtype = dtype;
    o.ring = ring ? 1 : 0;
    o.int8_attention = int8_attention ? 1 : 0;
    return o;
  }

  mha_kv_cache* NewCache(int32_t dtype, int64_t capacity, bool ring = false) const {
    const mha_kv_cache_options o = Options(dtype, capacity, ring);
    mha_kv_cache* cache = nullptr;
    EXPECT_EQ(mha_kv_cache_create(layer, &o, &cache), MHA_STATUS_OK) << mha_last_error_message();
    return cache;
  }

  const MultiheadAttention& cpp() const { return *layer->impl; }
  Context& cpp_ctx() const { return *ctx->impl; }

  std::unique_ptr<KvCache> NewCppCache(int32_t dtype, int64_t capacity, bool ring = false) const {
    std::unique_ptr<KvCache> cache;
    KvCacheOptions o = KvCacheOptions::ForLayer(cpp(), N, capacity, static_cast<DType>(dtype));
    o.ring = ring;
    o.int8_attention = int8_attention;
    EXPECT_TRUE(KvCache::Create(o, &cache).ok());
    return cache;
  }
};

struct CacheDeleter {
  void operator()(mha_kv_cache* c) const { mha_kv_cache_destroy(c); }
};
using CachePtr = std::unique_ptr<mha_kv_cache, CacheDeleter>;

// One call of a feeding schedule: T tokens per entry, of which counts[n] are used (empty:
// counts NULL, all T).
struct Call {
  int64_t T = 1;
  std::vector<int64_t> counts;
};

// A prefill of `prefill` tokens, then one token per call until every entry has S tokens.
std::vector<Call> PrefillThenDecode(int64_t S, int64_t prefill) {
  std::vector<Call> calls;
  if (prefill > 0) calls.push_back({prefill, {}});
  for (int64_t p = prefill; p < S; ++p) calls.push_back({1, {}});
  return calls;
}

// Ragged: a prefill with a different count per entry, then calls of 1..3 tokens with random
// counts (some 0) until every entry has S tokens.
std::vector<Call> RaggedSchedule(int64_t N, int64_t S, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Call> calls;
  std::vector<int64_t> left(N, S);
  Call prefill{7, std::vector<int64_t>(N)};
  for (int64_t n = 0; n < N; ++n) prefill.counts[n] = std::min<int64_t>(S, (n * 3) % 8);
  for (int64_t n = 0; n < N; ++n) left[n] -= prefill.counts[n];
  calls.push_back(prefill);
  for (bool done = false; !done;) {
    Call c{1 + static_cast<int64_t>(rng() % 3), std::vector<int64_t>(N)};
    done = true;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t want = rng() % 4 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % c.T);
      c.counts[n] = std::min(left[n], want);
      left[n] -= c.counts[n];
      done = done && left[n] == 0;
    }
    calls.push_back(c);
  }
  return calls;
}

// step(input [N, T, E], output [N, T, E], T, counts or nullptr) runs one call and returns
// whether it succeeded.
using StepFn = std::function<bool(float*, float*, int64_t, const int64_t*)>;

// Feeds entry n the tokens of seq[n] from position start[n] on, as `calls` say, and returns the
// outputs [N, S, E] by position (positions before start[n]: NaN). Padding rows of every
// output must be 0.
std::vector<float> Feed(const Fixture& f, const std::vector<float>& seq,
                        const std::vector<Call>& calls, const std::vector<int64_t>& start,
                        const StepFn& step) {
  const int64_t N = f.N, S = f.S, E = f.E;
  std::vector<float> result(seq.size(), std::nanf(""));
  std::vector<int64_t> pos = start;
  for (const Call& call : calls) {
    const int64_t T = call.T;
    std::vector<float> in(N * T * E, 3.0f), out(N * T * E, kSentinel);  // 3: padding tokens
    for (int64_t n = 0; n < N; ++n) {
      const int64_t c = call.counts.empty() ? T : call.counts[n];
      std::memcpy(&in[n * T * E], &seq[(n * S + pos[n]) * E], c * E * sizeof(float));
    }
    if (!step(in.data(), out.data(), T, call.counts.empty() ? nullptr : call.counts.data())) {
      ADD_FAILURE() << "step failed: " << mha_last_error_message();
      return result;
    }
    for (int64_t n = 0; n < N; ++n) {
      const int64_t c = call.counts.empty() ? T : call.counts[n];
      std::memcpy(&result[(n * S + pos[n]) * E], &out[n * T * E], c * E * sizeof(float));
      for (int64_t i = c * E; i < T * E; ++i) {
        EXPECT_EQ(out[n * T * E + i], 0.0f) << "padding row of entry " << n;
      }
      pos[n] += c;
    }
  }
  return result;
}

StepFn CStep(const Fixture& f, mha_kv_cache* cache) {
  return [&f, cache](float* in, float* out, int64_t T, const int64_t* counts) {
    const mha_tensor x = Dense(in, MHA_DTYPE_F32, {f.N, T, f.E});
    const mha_tensor o = Dense(out, MHA_DTYPE_F32, {f.N, T, f.E});
    return mha_kv_cache_step(cache, f.layer, f.ctx, &x, &o, counts) == MHA_STATUS_OK &&
           std::string(mha_last_error_message()).empty();
  };
}

StepFn CppStep(const Fixture& f, KvCache* cache) {
  return [&f, cache](float* in, float* out, int64_t T, const int64_t* counts) {
    const int64_t shape[3] = {f.N, T, f.E};
    TensorView x, o;
    return TensorView::Dense(in, DType::kF32, 3, shape, &x).ok() &&
           TensorView::Dense(out, DType::kF32, 3, shape, &o).ok() &&
           cache->Step(f.cpp_ctx(), f.cpp(), x, o, counts).ok();
  };
}

// Expects every position from start[n] on within `tol` * (1 + |want|) of want.
void ExpectClose(const Fixture& f, const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<int64_t>& start, double tol) {
  double worst = 0.0;
  for (int64_t n = 0; n < f.N; ++n) {
    for (int64_t i = start[n] * f.E; i < f.S * f.E; ++i) {
      const size_t k = static_cast<size_t>(n * f.S * f.E + i);
      const double err =
          std::fabs(static_cast<double>(got[k]) - want[k]) / (1.0 + std::fabs(want[k]));
      if (!(err <= worst)) worst = err;  // NaN sticks
    }
  }
  EXPECT_LE(worst, tol) << f.Describe();
}

void ExpectLengths(mha_kv_cache* cache, const std::vector<int64_t>& want) {
  for (size_t n = 0; n < want.size(); ++n) {
    int64_t len = -1;
    ASSERT_EQ(mha_kv_cache_length(cache, static_cast<int64_t>(n), &len), MHA_STATUS_OK)
        << mha_last_error_message();
    EXPECT_EQ(len, want[n]) << "entry " << n;
  }
}

// Runs `calls` through a C cache and a C++ cache of `dtype` (capacity S, or a ring of
// ring_capacity positions): bitwise equal outputs, within the dtype's tolerance of the causal
// forward, every entry at length S.
void CheckDecode(const Fixture& f, int32_t dtype, const std::vector<Call>& calls,
                 int64_t ring_capacity = 0) {
  SCOPED_TRACE(f.Describe() + " dtype " + std::to_string(dtype));
  const std::vector<int64_t> zero(f.N, 0);
  const bool ring = ring_capacity > 0;
  const int64_t capacity = ring ? ring_capacity : f.S;
  CachePtr cache(f.NewCache(dtype, capacity, ring));
  ASSERT_NE(cache, nullptr);
  const std::vector<float> got = Feed(f, f.x, calls, zero, CStep(f, cache.get()));
  std::unique_ptr<KvCache> cpp = f.NewCppCache(dtype, capacity, ring);
  ASSERT_NE(cpp, nullptr);
  const std::vector<float> want = Feed(f, f.x, calls, zero, CppStep(f, cpp.get()));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  ExpectClose(f, got, f.Reference(f.x), zero, ToleranceOf(dtype));
  ExpectLengths(cache.get(), std::vector<int64_t>(f.N, f.S));
}

TEST(CApiKvCacheTest, DecodeMatchesCppCacheBitwiseAndCausalForward) {
  Fixture f(32, 4, 4, 2, 40, 1);
  CheckDecode(f, MHA_DTYPE_F32, PrefillThenDecode(f.S, 5));
  CheckDecode(f, MHA_DTYPE_F32, PrefillThenDecode(f.S, 0));  // token by token from the start
}

TEST(CApiKvCacheTest, SixteenBitAndInt8Caches) {
  Fixture f(32, 4, 4, 2, 40, 2);
  CheckDecode(f, MHA_DTYPE_BF16, PrefillThenDecode(f.S, 5));
  CheckDecode(f, MHA_DTYPE_F16, PrefillThenDecode(f.S, 5));
  CheckDecode(f, MHA_DTYPE_I8, PrefillThenDecode(f.S, 5));
}

// int8 storage with integer dot products (options.int8_attention): the C API gives the C++
// cache's bits; the option's errors name it.
TEST(CApiKvCacheTest, Int8AttentionCaches) {
  Fixture f(32, 4, 2, 2, 40, 4);
  f.int8_attention = true;
  CheckDecode(f, MHA_DTYPE_I8, PrefillThenDecode(f.S, 5));
  CheckDecode(f, MHA_DTYPE_I8, PrefillThenDecode(f.S, 0));
  mha_kv_cache* cache = nullptr;
  mha_kv_cache_options o = f.Options(MHA_DTYPE_BF16, 8);
  EXPECT_EQ(mha_kv_cache_create(f.layer, &o, &cache), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message())
                .find("options->int8_attention: expected options->dtype MHA_DTYPE_I8 (5), got 1"),
            std::string::npos)
      << mha_last_error_message();
  o = f.Options(MHA_DTYPE_I8, 8);
  o.int8_attention = 3;
  EXPECT_EQ(mha_kv_cache_create(f.layer, &o, &cache), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message())
                .find("options->int8_attention: expected 0 or 1, got 3"),
            std::string::npos)
      << mha_last_error_message();
  EXPECT_EQ(cache, nullptr);
}

TEST(CApiKvCacheTest, GroupedAndMultiQueryLayers) {
  for (int64_t kvh : {2, 1}) {
    Fixture f(32, 4, kvh, 2, 36, 3);
    CheckDecode(f, MHA_DTYPE_F32, PrefillThenDecode(f.S, 4));
    CheckDecode(f, MHA_DTYPE_BF16, PrefillThenDecode(f.S, 4));
    CheckDecode(f, MHA_DTYPE_I8, PrefillThenDecode(f.S, 4));
  }
}

// A windowed layer with RoPE and sinks (gpt-oss-like, GQA) through the C API: a ring of 9
// positions holds sequences of 60 tokens, equal to the C++ ring and the windowed causal forward.
TEST(CApiKvCacheTest, RingOnAWindowedLayerWithRopeAndSinks) {
  Variant v;
  v.rope = MHA_ROPE_NEOX;
  v.window = 6;
  v.sinks = true;
  Fixture f(32, 4, 2, 2, 60, 11, v);
  CheckDecode(f, MHA_DTYPE_F32, PrefillThenDecode(f.S, 4), 9);
  CheckDecode(f, MHA_DTYPE_BF16, PrefillThenDecode(f.S, 0), 9);
  size_t bytes = 0;
  const mha_kv_cache_options o = f.Options(MHA_DTYPE_F32, 9, true);
  ASSERT_EQ(mha_kv_cache_required_bytes(f.layer, &o, &bytes), MHA_STATUS_OK);
  EXPECT_EQ(bytes, 2u * 2 * 2 * 9 * 8 * sizeof(float));  // K+V, batch, kv heads, ring, hd
}

TEST(CApiKvCacheTest, RingErrors) {
  Fixture plain(32, 4, 2, 1, 8, 12);
  mha_kv_cache_options o = plain.Options(MHA_DTYPE_F32, 8, true);
  o.ring = 2;
  mha_kv_cache* cache = nullptr;
  EXPECT_EQ(mha_kv_cache_create(plain.layer, &o, &cache), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message()).find("options->ring: expected 0 or 1, got 2"),
            std::string::npos)
      << mha_last_error_message();
  EXPECT_EQ(cache, nullptr);
  // A ring on a layer without a window fails at its first use.
  CachePtr ring(plain.NewCache(MHA_DTYPE_F32, 8, true));
  ASSERT_NE(ring, nullptr);
  std::vector<float> in(plain.E, 0.5f), out(plain.E, kSentinel);
  const mha_tensor x = Dense(in.data(), MHA_DTYPE_F32, {1, 1, plain.E});
  const mha_tensor y = Dense(out.data(), MHA_DTYPE_F32, {1, 1, plain.E});
  EXPECT_EQ(mha_kv_cache_step(ring.get(), plain.layer, plain.ctx, &x, &y, nullptr),
            MHA_STATUS_INVALID_ARGUMENT);
  const std::string message = mha_last_error_message();
  EXPECT_NE(message.find("ring: expected a layer with window > 0 and capacity >= window, got "
                         "window 0 and capacity 8"),
            std::string::npos)
      << message;
  for (float e : out) EXPECT_EQ(e, kSentinel);
  ExpectLengths(ring.get(), {0});
}

TEST(CApiKvCacheTest, RaggedCounts) {
  Fixture f(32, 4, 2, 3, 30, 4);
  const std::vector<Call> calls = RaggedSchedule(f.N, f.S, 5);
  CheckDecode(f, MHA_DTYPE_F32, calls);
  CheckDecode(f, MHA_DTYPE_BF16, calls);
}

// Append then forward of the whole sequences (the blocked schedule), and projected keys and
// values from mha_layer_project, ragged: each equals its C++ counterpart bitwise and the causal
// forward.
TEST(CApiKvCacheTest, AppendForwardAndAppendProjected) {
  Fixture f(32, 4, 2, 2, 24, 6);
  const int64_t N = f.N, S = f.S, E = f.E, hd = f.E / f.H;
  const std::vector<float> reference = f.Reference(f.x);
  std::vector<float> x = f.x, got(x.size(), kSentinel), want(x.size(), kSentinel);
  const mha_tensor tx = Dense(x.data(), MHA_DTYPE_F32, {N, S, E});
  const mha_tensor tgot = Dense(got.data(), MHA_DTYPE_F32, {N, S, E});
  const int64_t shape[3] = {N, S, E};
  TensorView vx, vwant;
  ASSERT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, shape, &vx).ok());
  ASSERT_TRUE(TensorView::Dense(want.data(), DType::kF32, 3, shape, &vwant).ok());

  CachePtr cache(f.NewCache(MHA_DTYPE_F32, S));
  ASSERT_EQ(mha_kv_cache_append(cache.get(), f.layer, f.ctx, &tx, &tx, nullptr), MHA_STATUS_OK)
      << mha_last_error_message();
  ExpectLengths(cache.get(), {S, S});
  ASSERT_EQ(mha_kv_cache_forward(cache.get(), f.layer, f.ctx, &tx, &tgot, nullptr), MHA_STATUS_OK)
      << mha_last_error_message();
  std::unique_ptr<KvCache> cpp = f.NewCppCache(MHA_DTYPE_F32, S);
  ASSERT_TRUE(cpp->Append(f.cpp_ctx(), f.cpp(), vx, vx).ok());
  ASSERT_TRUE(cpp->Forward(f.cpp_ctx(), f.cpp(), vx, vwant).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  ExpectClose(f, got, reference, {0, 0}, 1e-5);

  // Per-head K and V of the whole sequences; entry 0 imports only its first S - 3 positions.
  std::vector<float> q(N * f.H * S * hd), k(N * f.KVH * S * hd), v(k.size());
  mha_attention_inputs in;
  std::memset(&in, 0, sizeof(in));
  in.query = tx;
  const mha_tensor tq = Dense(q.data(), MHA_DTYPE_F32, {N, f.H, S, hd});
  const mha_tensor tk = Dense(k.data(), MHA_DTYPE_F32, {N, f.KVH, S, hd});
  const mha_tensor tv = Dense(v.data(), MHA_DTYPE_F32, {N, f.KVH, S, hd});
  ASSERT_EQ(mha_layer_project(f.layer, f.ctx, &in, &tq, &tk, &tv), MHA_STATUS_OK)
      << mha_last_error_message();
  const int64_t counts[2] = {S - 3, S};
  CachePtr imported(f.NewCache(MHA_DTYPE_F32, S));
  ASSERT_EQ(mha_kv_cache_append_projected(imported.get(), &tk, &tv, counts), MHA_STATUS_OK)
      << mha_last_error_message();
  ExpectLengths(imported.get(), {S - 3, S});
  std::fill(got.begin(), got.end(), kSentinel);
  ASSERT_EQ(mha_kv_cache_forward(imported.get(), f.layer, f.ctx, &tx, &tgot, counts), MHA_STATUS_OK)
      << mha_last_error_message();
  const int64_t kshape[4] = {N, f.KVH, S, hd};
  TensorView vk, vv;
  ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, kshape, &vk).ok());
  ASSERT_TRUE(TensorView::Dense(v.data(), DType::kF32, 4, kshape, &vv).ok());
  cpp->Reset();
  ASSERT_TRUE(cpp->AppendProjected(vk, vv, counts).ok());
  ASSERT_TRUE(cpp->Forward(f.cpp_ctx(), f.cpp(), vx, vwant, counts).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  for (int64_t i = (S - 3) * E; i < S * E; ++i) ASSERT_EQ(got[i], 0.0f) << "padding row";
  std::vector<float> ref0 = reference;
  std::fill(ref0.begin() + (S - 3) * E, ref0.begin() + S * E, 0.0f);
  ExpectClose(f, got, ref0, {0, 0}, 1e-5);
}

// Speculative decoding's rollback: after the whole sequences, entry 0 is truncated to 10
// positions and entry 1 to 0, then both continue with other tokens; the outputs are those of
// the new sequences. Reset empties everything; decoding again reproduces a fresh cache bitwise.
TEST(CApiKvCacheTest, TruncateAndReset) {
  Fixture f(32, 4, 2, 2, 24, 7);
  const int64_t S = f.S, E = f.E;
  const std::vector<int64_t> zero(f.N, 0);
  CachePtr cache(f.NewCache(MHA_DTYPE_F32, S));
  Feed(f, f.x, PrefillThenDecode(S, 3), zero, CStep(f, cache.get()));
  ExpectLengths(cache.get(), {S, S});

  // Errors leave the lengths alone.
  EXPECT_INVALID(mha_kv_cache_truncate(cache.get(), 2, 0),
                 "n: expected a batch entry in [0, 2), got 2");
  EXPECT_INVALID(mha_kv_cache_truncate(cache.get(), -1, 0),
                 "n: expected a batch entry in [0, 2), got -1");
  EXPECT_INVALID(mha_kv_cache_truncate(cache.get(), 0, S + 1),
                 "length: expected 0..24 (the current length of batch entry 0), got 25");
  EXPECT_INVALID(mha_kv_cache_truncate(cache.get(), 1, -1), "length: expected 0..24");
  ExpectLengths(cache.get(), {S, S});

  ASSERT_EQ(mha_kv_cache_truncate(cache.get(), 0, 10), MHA_STATUS_OK) << mha_last_error_message();
  ASSERT_EQ(mha_kv_cache_truncate(cache.get(), 1, 0), MHA_STATUS_OK);
  EXPECT_STREQ(mha_last_error_message(), "");
  ExpectLengths(cache.get(), {10, 0});

  // New sequences: entry 0 keeps x's first 10 tokens, the rest is y.
  std::mt19937 rng(8);
  std::vector<float> y = test::SymmetricFloats(f.x.size(), 1.0f, &rng);
  std::copy(f.x.begin(), f.x.begin() + 10 * E, y.begin());
  std::vector<Call> calls;
  for (int64_t p = 0; p < S; ++p) calls.push_back({1, {p < S - 10 ? 1 : 0, 1}});
  const std::vector<int64_t> start = {10, 0};
  const std::vector<float> reference = f.Reference(y);
  ExpectClose(f, Feed(f, y, calls, start, CStep(f, cache.get())), reference, start, 1e-5);
  ExpectLengths(cache.get(), {S, S});

  ASSERT_EQ(mha_kv_cache_reset(cache.get()), MHA_STATUS_OK);
  ExpectLengths(cache.get(), {0, 0});
  const std::vector<Call> decode = PrefillThenDecode(S, 2);
  const std::vector<float> again = Feed(f, y, decode, zero, CStep(f, cache.get()));
  CachePtr fresh(f.NewCache(MHA_DTYPE_F32, S));
  const std::vector<float> want = Feed(f, y, decode, zero, CStep(f, fresh.get()));
  EXPECT_EQ(std::memcmp(again.data(), want.data(), want.size() * sizeof(float)), 0);
  ExpectClose(f, again, reference, zero, 1e-5);
}

// Caller-provided storage: required_bytes agrees with the C++ API and the layout; too small or
// misaligned buffers are rejected (nothing written to out); a buffer of exactly the required
// size holds the cache, which decodes bitwise like an owned one.
TEST(CApiKvCacheTest, CallerBuffer) {
  Fixture f(32, 4, 2, 2, 20, 9);
  const int64_t hd = f.E / f.H;
  for (int32_t dtype : {MHA_DTYPE_F32, MHA_DTYPE_BF16, MHA_DTYPE_F16, MHA_DTYPE_I8}) {
    SCOPED_TRACE("dtype " + std::to_string(dtype));
    mha_kv_cache_options o = f.Options(dtype, f.S);
    size_t bytes = 0, cpp_bytes = 0;
    ASSERT_EQ(mha_kv_cache_required_bytes(f.layer, &o, &bytes), MHA_STATUS_OK)
        << mha_last_error_message();
    ASSERT_TRUE(
        KvCache::RequiredBytes(
            KvCacheOptions::ForLayer(f.cpp(), f.N, f.S, static_cast<DType>(dtype)), &cpp_bytes)
            .ok());
    EXPECT_EQ(bytes, cpp_bytes);
    // K and V elements; int8: codes (to a 4-byte boundary), then one f32 scale per row.
    const size_t rows = static_cast<size_t>(2 * f.N * f.KVH * f.S);
    const size_t want_bytes = dtype == MHA_DTYPE_I8
                                  ? (rows * hd + 3) / 4 * 4 + rows * sizeof(float)
                                  : rows * hd * (dtype == MHA_DTYPE_F32 ? 4 : 2);
    EXPECT_EQ(bytes, want_bytes);

    void* storage = std::aligned_alloc(64, bytes + 64);
    ASSERT_NE(storage, nullptr);
    std::memset(storage, 0, bytes + 64);
    mha_kv_cache* const untouched = reinterpret_cast<mha_kv_cache*>(&o);
    mha_kv_cache* out = untouched;
    o.buffer = storage;
    o.buffer_bytes = bytes - 1;
    EXPECT_INVALID(mha_kv_cache_create(f.layer, &o, &out),
                   "mha_kv_cache_create: buffer_bytes: expected >= " + std::to_string(bytes));
    o.buffer = static_cast<uint8_t*>(storage) + 1;
    o.buffer_bytes = bytes + 32;
    EXPECT_INVALID(mha_kv_cache_create(f.layer, &o, &out),
                   "buffer: expected an address aligned to");
    EXPECT_EQ(out, untouched);

    o.buffer = storage;
    o.buffer_bytes = bytes;
    ASSERT_EQ(mha_kv_cache_create(f.layer, &o, &out), MHA_STATUS_OK) << mha_last_error_message();
    CachePtr borrowed(out);
    const std::vector<Call> calls = PrefillThenDecode(f.S, 4);
    const std::vector<int64_t> zero(f.N, 0);
    const std::vector<float> got = Feed(f, f.x, calls, zero, CStep(f, borrowed.get()));
    CachePtr owned(f.NewCache(dtype, f.S));
    const std::vector<float> want = Feed(f, f.x, calls, zero, CStep(f, owned.get()));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    // The cache lives in the buffer: its last bytes (the end of V) are written, the slack after
    // it is not.
    const uint8_t* s = static_cast<const uint8_t*>(storage);
    bool tail_written = false, slack_clean = true;
    for (size_t i = bytes - 16; i < bytes; ++i) tail_written = tail_written || s[i] != 0;
    for (size_t i = bytes; i < bytes + 64; ++i) slack_clean = slack_clean && s[i] == 0;
    EXPECT_TRUE(tail_written);
    EXPECT_TRUE(slack_clean);
    borrowed.reset();  // destroying the cache leaves the buffer to its owner
    std::free(storage);
  }
}

// A small layer and a cache holding 3 tokens per entry, with sentinel outputs, for the error
// tests.
struct ErrorFixture : Fixture {
  static constexpr int64_t kT = 2;
  CachePtr cache;
  std::vector<float> in, out;
  mha_tensor x, o;
  int64_t counts[2] = {1, 2};
  mha_kv_cache_options opts;  // valid options for the layer
  // Stands in *out for the create calls: a failed create must not change it.
  mha_kv_cache* const untouched = reinterpret_cast<mha_kv_cache*>(&opts);
  mha_kv_cache* out_cache = untouched;

  ErrorFixture() : Fixture(32, 4, 4, 2, 8, 10) {
    opts = Options(MHA_DTYPE_F32, S);
    cache.reset(NewCache(MHA_DTYPE_F32, S));
    std::vector<float> prompt(N * 3 * E, 0.25f), prompt_out(prompt.size());
    const mha_tensor p = Dense(prompt.data(), MHA_DTYPE_F32, {N, 3, E});
    const mha_tensor po = Dense(prompt_out.data(), MHA_DTYPE_F32, {N, 3, E});
    EXPECT_EQ(mha_kv_cache_step(cache.get(), layer, ctx, &p, &po, nullptr), MHA_STATUS_OK);
    in.assign(N * kT * E, 0.5f);
    out.assign(in.size(), kSentinel);
    x = Dense(in.data(), MHA_DTYPE_F32, {N, kT, E});
    o = Dense(out.data(), MHA_DTYPE_F32, {N, kT, E});
  }
  // Nothing was written: the output holds its sentinels and every entry still has 3 tokens.
  void ExpectUntouched() {
    for (float v : out) ASSERT_EQ(v, kSentinel);
    ExpectLengths(cache.get(), {3, 3});
  }
};

TEST(CApiKvCacheTest, NullArgumentsAreNamed) {
  ErrorFixture e;
  mha_kv_cache* c = e.cache.get();
  mha_kv_cache_options& opts = e.opts;
  size_t bytes = 12345;
  int64_t len = -7;
  mha_kv_cache*& out = e.out_cache;

  EXPECT_INVALID(mha_kv_cache_required_bytes(nullptr, &opts, &bytes),
                 "layer: expected a non-NULL pointer, got NULL");
  EXPECT_INVALID(mha_kv_cache_required_bytes(e.layer, nullptr, &bytes),
                 "options: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_required_bytes(e.layer, &opts, nullptr),
                 "bytes: expected a non-NULL");
  EXPECT_EQ(bytes, 12345u);
  EXPECT_INVALID(mha_kv_cache_create(nullptr, &opts, &out),
                 "mha_kv_cache_create: layer: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_create(e.layer, nullptr, &out), "options: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_create(e.layer, &opts, nullptr), "out: expected a non-NULL");
  EXPECT_EQ(out, e.untouched);
  EXPECT_INVALID(mha_kv_cache_reset(nullptr), "cache: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_truncate(nullptr, 0, 0), "cache: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_length(nullptr, 0, &len), "cache: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_length(c, 0, nullptr), "length: expected a non-NULL");
  EXPECT_EQ(len, -7);

  EXPECT_INVALID(mha_kv_cache_append(nullptr, e.layer, e.ctx, &e.x, &e.x, nullptr),
                 "cache: expected");
  EXPECT_INVALID(mha_kv_cache_append(c, nullptr, e.ctx, &e.x, &e.x, nullptr), "layer: expected");
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, nullptr, &e.x, &e.x, nullptr),
                 "context: expected");
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, e.ctx, nullptr, &e.x, nullptr), "key: expected");
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, e.ctx, &e.x, nullptr, nullptr), "value: expected");
  mha_tensor no_data = e.x;
  no_data.data = nullptr;
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, e.ctx, &no_data, &e.x, nullptr),
                 "key.data: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, e.ctx, &e.x, &no_data, nullptr), "value.data");

  const int64_t hd = e.E / e.H;
  std::vector<float> kv(e.N * e.KVH * e.kT * hd, 1.0f);
  const mha_tensor tk = Dense(kv.data(), MHA_DTYPE_F32, {e.N, e.KVH, e.kT, hd});
  EXPECT_INVALID(mha_kv_cache_append_projected(nullptr, &tk, &tk, nullptr), "cache: expected");
  EXPECT_INVALID(mha_kv_cache_append_projected(c, nullptr, &tk, nullptr), "k: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_append_projected(c, &tk, nullptr, nullptr), "v: expected a non-NULL");

  EXPECT_INVALID(mha_kv_cache_forward(nullptr, e.layer, e.ctx, &e.x, &e.o, nullptr),
                 "cache: expected");
  EXPECT_INVALID(mha_kv_cache_forward(c, nullptr, e.ctx, &e.x, &e.o, nullptr), "layer: expected");
  EXPECT_INVALID(mha_kv_cache_forward(c, e.layer, nullptr, &e.x, &e.o, nullptr),
                 "context: expected");
  EXPECT_INVALID(mha_kv_cache_forward(c, e.layer, e.ctx, nullptr, &e.o, nullptr),
                 "query: expected");
  EXPECT_INVALID(mha_kv_cache_forward(c, e.layer, e.ctx, &e.x, nullptr, nullptr),
                 "output: expected");
  EXPECT_INVALID(mha_kv_cache_forward(c, e.layer, e.ctx, &no_data, &e.o, nullptr), "query.data");
  no_data = e.o;
  no_data.data = nullptr;
  EXPECT_INVALID(mha_kv_cache_forward(c, e.layer, e.ctx, &e.x, &no_data, nullptr), "output.data");

  EXPECT_INVALID(mha_kv_cache_step(nullptr, e.layer, e.ctx, &e.x, &e.o, nullptr),
                 "mha_kv_cache_step: cache: expected");
  EXPECT_INVALID(mha_kv_cache_step(c, nullptr, e.ctx, &e.x, &e.o, nullptr), "layer: expected");
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, nullptr, &e.x, &e.o, nullptr), "context: expected");
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, nullptr, &e.o, nullptr),
                 "x: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, &e.x, nullptr, nullptr),
                 "output: expected a non-NULL");
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, &e.x, &no_data, nullptr), "output.data");
  e.ExpectUntouched();

  mha_kv_cache_destroy(nullptr);  // a no-op
  // A success clears the message.
  ASSERT_EQ(mha_kv_cache_step(c, e.layer, e.ctx, &e.x, &e.o, e.counts), MHA_STATUS_OK);
  EXPECT_STREQ(mha_last_error_message(), "");
  ExpectLengths(c, {4, 5});
}

TEST(CApiKvCacheTest, BadValuesLeaveCacheAndOutputsUntouched) {
  ErrorFixture e;
  mha_kv_cache* c = e.cache.get();
  mha_kv_cache_options& opts = e.opts;
  size_t bytes = 12345;
  mha_kv_cache*& out = e.out_cache;

  // Options.
  for (int32_t dtype : std::vector<int32_t>{MHA_DTYPE_BOOL, MHA_DTYPE_U8, -1, 7}) {
    opts.dtype = dtype;
    const std::string want =
        "options->dtype: expected MHA_DTYPE_F32 (0), MHA_DTYPE_BF16 (1), MHA_DTYPE_F16 (2) or "
        "MHA_DTYPE_I8 (5), got " +
        std::to_string(dtype);
    EXPECT_INVALID(mha_kv_cache_required_bytes(e.layer, &opts, &bytes), want);
    EXPECT_INVALID(mha_kv_cache_create(e.layer, &opts, &out), want);
  }
  opts.dtype = MHA_DTYPE_BF16;
  opts.batch = 0;
  EXPECT_INVALID(mha_kv_cache_create(e.layer, &opts, &out),
                 "mha_kv_cache_create: batch: expected > 0, got 0");
  opts.batch = 2;
  opts.capacity = -5;
  EXPECT_INVALID(mha_kv_cache_required_bytes(e.layer, &opts, &bytes),
                 "mha_kv_cache_required_bytes: capacity: expected > 0, got -5");
  opts.capacity = int64_t{1} << 60;
  EXPECT_INVALID(mha_kv_cache_required_bytes(e.layer, &opts, &bytes), "overflows");
  EXPECT_INVALID(mha_kv_cache_create(e.layer, &opts, &out), "overflows");
  EXPECT_EQ(bytes, 12345u);
  EXPECT_EQ(out, e.untouched);

  // Entries.
  int64_t len = -7;
  EXPECT_INVALID(mha_kv_cache_length(c, 2, &len),
                 "mha_kv_cache_length: n: expected a batch entry in [0, 2), got 2");
  EXPECT_INVALID(mha_kv_cache_length(c, -1, &len), "n: expected a batch entry in [0, 2), got -1");
  EXPECT_EQ(len, -7);

  // Tensors: x changed, with the message each change gives.
  const struct {
    std::function<void(mha_tensor*)> change;
    const char* needle;
  } bad_x[] = {
      {[](mha_tensor* t) { t->shape[2] = 31; },
       "mha_kv_cache_step: x: expected [2, T, 32] f32 (batch-first, contiguous last dimension), "
       "got [2, 2, 31] f32"},
      {[](mha_tensor* t) { t->dtype = MHA_DTYPE_BF16; }, "x: expected [2, T, 32] f32"},
      {[](mha_tensor* t) { t->dtype = 9; },
       "x.dtype: expected MHA_DTYPE_F32..MHA_DTYPE_U8 (0..4), got 9"},
      {[](mha_tensor* t) { t->rank = 5; }, "x.rank: expected 1..4, got 5"},
      {[](mha_tensor* t) { t->rank = 2; }, "x: expected [2, T, 32]"},
      {[](mha_tensor* t) { t->shape[1] = -1; }, "x: expected dimension 1 to be >= 0"},
      {[](mha_tensor* t) {  // a non-contiguous last dimension
         t->strides[0] = 2 * 32 * 2;
         t->strides[1] = 2 * 32;
         t->strides[2] = 2;
       },
       "with last stride 2"},
  };
  for (const auto& b : bad_x) {
    mha_tensor bad = e.x;
    b.change(&bad);
    EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, &bad, &e.o, nullptr), b.needle);
  }
  mha_tensor bad = e.x;
  bad.shape[2] = e.E - 1;
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, e.ctx, &e.x, &bad, nullptr),
                 "value: expected [2, 2, 32]");
  EXPECT_INVALID(mha_kv_cache_forward(c, e.layer, e.ctx, &bad, &e.o, nullptr),
                 "query: expected [2, T, 32]");
  bad = e.o;
  bad.shape[1] = 3;
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, &e.x, &bad, nullptr),
                 "output: expected [2, 2, 32]");
  const int64_t hd = e.E / e.H;
  std::vector<float> kv(e.N * e.KVH * e.kT * hd, 1.0f);
  const mha_tensor tk = Dense(kv.data(), MHA_DTYPE_F32, {e.N, e.KVH, e.kT, hd});
  const mha_tensor tk_bad = Dense(kv.data(), MHA_DTYPE_F32, {e.N, e.KVH, e.kT, hd - 1});
  EXPECT_INVALID(mha_kv_cache_append_projected(c, &tk_bad, &tk, nullptr),
                 "mha_kv_cache_append_projected: k: expected [2, 4, 2, 8] f32 with a contiguous "
                 "last dimension, got [2, 4, 2, 7] f32");
  EXPECT_INVALID(mha_kv_cache_append_projected(c, &tk, &tk_bad, nullptr),
                 "v: expected [2, 4, 2, 8]");

  // Counts and capacity.
  int64_t counts[2] = {1, e.kT + 1};
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, &e.x, &e.o, counts),
                 "counts[1]: expected 0..2 (tokens per entry), got 3");
  counts[0] = -1;
  EXPECT_INVALID(mha_kv_cache_append(c, e.layer, e.ctx, &e.x, &e.x, counts),
                 "counts[0]: expected 0..2");
  EXPECT_INVALID(mha_kv_cache_append_projected(c, &tk, &tk, counts), "counts[0]: expected 0..2");
  std::vector<float> long_in(e.N * 6 * e.E, 0.5f), long_out(long_in.size(), kSentinel);
  const mha_tensor long_x = Dense(long_in.data(), MHA_DTYPE_F32, {e.N, 6, e.E});
  const mha_tensor long_o = Dense(long_out.data(), MHA_DTYPE_F32, {e.N, 6, e.E});
  EXPECT_INVALID(mha_kv_cache_step(c, e.layer, e.ctx, &long_x, &long_o, nullptr),
                 "capacity exceeded: batch entry 0 has length 3, appending 6 tokens needs 9 "
                 "positions, capacity 8");
  for (float v : long_out) ASSERT_EQ(v, kSentinel);
  // Forward's query tokens must be cached already.
  CachePtr empty(e.NewCache(MHA_DTYPE_F32, e.S));
  EXPECT_INVALID(mha_kv_cache_forward(empty.get(), e.layer, e.ctx, &e.x, &e.o, nullptr),
                 "counts[0]: query tokens sit at the last 2 cached positions, but batch entry 0 "
                 "has length 0");

  // A layer of another shape (2 kv heads instead of 4).
  Fixture gqa(32, 4, 2, 2, 8, 11);
  EXPECT_INVALID(mha_kv_cache_step(c, gqa.layer, e.ctx, &e.x, &e.o, nullptr),
                 "layer: expected num_kv_heads 4 and head_dim 8 (the cache's), got 2 and 8");
  e.ExpectUntouched();

  // Errors changed nothing in the cache: it decodes bitwise like one that never saw them.
  ErrorFixture twin;
  ASSERT_EQ(mha_kv_cache_step(c, e.layer, e.ctx, &e.x, &e.o, e.counts), MHA_STATUS_OK);
  ASSERT_EQ(
      mha_kv_cache_step(twin.cache.get(), twin.layer, twin.ctx, &twin.x, &twin.o, twin.counts),
      MHA_STATUS_OK);
  EXPECT_EQ(std::memcmp(e.out.data(), twin.out.data(), e.out.size() * sizeof(float)), 0);
}

// add_bias_kv / add_zero_attn layers: the cache is created (it only needs num_kv_heads and
// head_dim) but every call that runs the layer is UNSUPPORTED and changes nothing.
TEST(CApiKvCacheTest, BiasKvAndZeroAttnLayersAreUnsupported) {
  ErrorFixture e;
  const int64_t E = e.E;
  std::vector<float> w_in(3 * E * E, 0.01f), b_in(3 * E, 0.0f), bk(E, 0.1f), bv(E, 0.2f),
      w_out(E * E, 0.01f), b_out(E, 0.0f);
  for (int variant = 0; variant < 2; ++variant) {
    mha_layer_config c;
    mha_layer_config_init(&c);
    c.embed_dim = E;
    c.num_heads = e.H;
    c.add_bias_kv = variant == 0;
    c.add_zero_attn = variant == 1;
    mha_layer_weights w;
    std::memset(&w, 0, sizeof(w));
    w.in_proj_weight = w_in.data();
    w.in_proj_bias = b_in.data();
    w.bias_k = variant == 0 ? bk.data() : nullptr;
    w.bias_v = variant == 0 ? bv.data() : nullptr;
    w.out_proj_weight = w_out.data();
    w.out_proj_bias = b_out.data();
    mha_layer* layer = nullptr;
    ASSERT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &layer), MHA_STATUS_OK)
        << mha_last_error_message();
    EXPECT_STATUS(mha_kv_cache_step(e.cache.get(), layer, e.ctx, &e.x, &e.o, nullptr),
                  MHA_STATUS_UNSUPPORTED, "mha_kv_cache_step: layer: add_bias_kv / add_zero_attn");
    EXPECT_STATUS(mha_kv_cache_append(e.cache.get(), layer, e.ctx, &e.x, &e.x, nullptr),
                  MHA_STATUS_UNSUPPORTED, variant == 0 ? "add_bias_kv true" : "add_zero_attn true");
    EXPECT_STATUS(mha_kv_cache_forward(e.cache.get(), layer, e.ctx, &e.x, &e.o, nullptr),
                  MHA_STATUS_UNSUPPORTED, "add_bias_kv");
    mha_layer_destroy(layer);
  }
  e.ExpectUntouched();
}

// A context over a caller arena too small for the step: OUT_OF_MEMORY naming the bytes, and
// nothing stored or written.
TEST(CApiKvCacheTest, CallerArenaTooSmallIsOutOfMemory) {
  ErrorFixture e;
  std::vector<uint8_t> arena(256);
  mha_context* small = NewContext(1, arena.data(), arena.size());
  ASSERT_NE(small, nullptr);
  EXPECT_STATUS(mha_kv_cache_step(e.cache.get(), e.layer, small, &e.x, &e.o, nullptr),
                MHA_STATUS_OUT_OF_MEMORY, "bytes of workspace, which a caller-provided buffer of");
  EXPECT_STATUS(mha_kv_cache_append(e.cache.get(), e.layer, small, &e.x, &e.x, nullptr),
                MHA_STATUS_OUT_OF_MEMORY, "mha_kv_cache_append: context arena");
  mha_context_destroy(small);
  e.ExpectUntouched();
}

// Once the context's arena has grown, decode steps through the C API (and length queries)
// allocate nothing.
TEST(CApiKvCacheTest, DecodeAllocatesNothingInSteadyState) {
#ifdef MHA_SANITIZED
  GTEST_SKIP() << "allocation counting interposes malloc, which the sanitizers own";
#endif
  Fixture f(64, 8, 2, 2, 300, 12);
  CachePtr cache(f.NewCache(MHA_DTYPE_BF16, f.S));
  std::vector<float> token(f.N * f.E, 0.5f), out(token.size());
  const mha_tensor x = Dense(token.data(), MHA_DTYPE_F32, {f.N, 1, f.E});
  const mha_tensor o = Dense(out.data(), MHA_DTYPE_F32, {f.N, 1, f.E});
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(mha_kv_cache_step(cache.get(), f.layer, f.ctx, &x, &o, nullptr), MHA_STATUS_OK);
  }
  const int64_t counts[2] = {1, 0};
  int64_t len = 0;
  bool ok = true;
  g_allocations = 0;
  g_counting = true;
  // 3 -> 283 positions: crosses the chunk boundary at 256.
  for (int i = 0; i < 280 && ok; ++i) {
    ok = mha_kv_cache_step(cache.get(), f.layer, f.ctx, &x, &o, i % 2 == 0 ? nullptr : counts) ==
             MHA_STATUS_OK &&
         mha_kv_cache_length(cache.get(), 0, &len) == MHA_STATUS_OK;
  }
  g_counting = false;
  ASSERT_TRUE(ok) << mha_last_error_message();
  EXPECT_EQ(len, 283);
  EXPECT_EQ(g_allocations.load(), 0);
}

}  // namespace
}  // namespace mha
