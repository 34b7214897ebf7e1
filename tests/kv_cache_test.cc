// Tests of KvCache (include/mha/kv_cache.hpp): token-by-token generation through the cache
// equals the one-shot causal forward of the same layer, for MHA, GQA and MQA layers, f32 / bf16 /
// f16 storage, ragged batches, prefill + decode, multi-token steps and contexts longer than a
// chunk, on every SIMD target; the attention variants (RoPE, ALiBi, window, softcap, sinks,
// QK-norm, alone and combined) and the ring cache of a windowed layer; results are bitwise
// identical for 1..4 threads; errors name their argument and leave the cache and the outputs
// untouched.
//
// Tolerances, per output element, |cache - forward| <= tol * (1 + |forward|):
// - f32 cache: 1e-5. Both sides are f32 computations of the same math in different summation
//   orders (BLIS GEMMs vs the decode kernels, one softmax vs chunks merged); outputs are O(0.3).
// - bf16: 2e-2. A stored element has relative error <= 2^-9 = 2e-3. A score q.k (scaled by
//   1/sqrt(hd)) then moves by <= 2^-9 * sum_d |q_d k_d| / sqrt(hd), about 2e-3 for these O(1)
//   activations; softmax turns a score error e into a relative weight error <= 2e (4e-3); the
//   value error adds 2e-3 relative, and the output projection sums E such terms with random signs
//   (growth ~ 1, bounded here by 2.5x). So about 1e-2 of the output scale; 2e-2 leaves 2x margin.
//   Measured maximum (printed by the tests as "[measured]"): 1.2e-3 over every target and
//   layout here, so the worst case derived above is not approached by random data.
// - f16: 4e-3: the same derivation with 2^-11 per element (the values stay within f16's normal
//   range), i.e. a quarter of bf16's bound plus f32 noise. Measured: 1.7e-4. f32 measured: 1.1e-7.
#include "mha/kv_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/targets.h"
#include "mha/mha.hpp"
#include "runtime/step_plan.h"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

double ToleranceOf(DType t) {
  return t == DType::kF32 ? 1e-5 : t == DType::kBF16 || t == DType::kI8 ? 2e-2 : 4e-3;
}

// The attention variants of a Problem's layer: `config`'s rope / alibi / window / softcap /
// qk_norm fields are copied into the layer's configuration; sinks and QK-norm weights are drawn.
struct Variants {
  AttentionConfig config;
  bool sinks = false;
  bool qk_norm = false;  // weights [hd], or [E] / [kvE] with config.qk_norm_whole
};

// A random self-attention layer (separate q/k/v weights, biases) and a batch of sequences x
// [N, S, E], plus the one-shot causal forward of the whole sequences.
struct Problem {
  int64_t E = 128, H = 8, KVH = 8, N = 2, S = 64;
  bool batch_first = true;  // the layer's; the cache's tensors are batch-first either way
  float q_scale = 1.0f;     // multiplies the drawn query weights (sharper softmax rows above 1)
  Variants var;
  std::vector<float> wq, wk, wv, bias, wo, bo, x, reference, sinks, q_norm, k_norm;
  std::unique_ptr<MultiheadAttention> layer;

  std::string Describe() const {
    return "E " + std::to_string(E) + " H " + std::to_string(H) + " KVH " + std::to_string(KVH) +
           " N " + std::to_string(N) + " S " + std::to_string(S);
  }
};

void MakeProblem(Problem* p, uint32_t seed) {
  std::mt19937 rng(seed);
  // A = H * hd, the attention width (E unless the variant sets head_dim).
  const AttentionConfig& v = p->var.config;
  const int64_t hd = v.head_dim != 0 ? v.head_dim : p->E / p->H, kvE = p->KVH * hd, A = p->H * hd;
  const float wb = 1.0f / std::sqrt(static_cast<float>(p->E));
  p->wq = test::SymmetricFloats(A * p->E, wb, &rng);
  for (float& w : p->wq) w *= p->q_scale;
  p->wk = test::SymmetricFloats(kvE * p->E, wb, &rng);
  p->wv = test::SymmetricFloats(kvE * p->E, wb, &rng);
  p->bias = test::SymmetricFloats(A + 2 * kvE, wb, &rng);
  p->wo = test::SymmetricFloats(p->E * A, wb, &rng);
  p->bo = test::SymmetricFloats(p->E, wb, &rng);
  p->x = test::SymmetricFloats(p->N * p->S * p->E, 1.0f, &rng);
  AttentionConfig c;
  c.embed_dim = p->E;
  c.num_heads = p->H;
  c.num_kv_heads = p->KVH;
  c.batch_first = p->batch_first;
  c.head_dim = v.head_dim;
  c.bias_projections = v.bias_projections;
  c.rope = v.rope;
  c.rope_theta = v.rope_theta;
  c.rotary_dim = v.rotary_dim;
  c.rope_scale = v.rope_scale;
  c.alibi = v.alibi;
  c.window = v.window;
  c.softcap = v.softcap;
  c.qk_norm_eps = v.qk_norm_eps;
  c.qk_norm_whole = v.qk_norm_whole;
  AttentionWeights w;
  if (p->var.sinks) {
    // Logits of the order of the scores, so that the sink takes a visible share of each row.
    std::uniform_real_distribution<float> u(-0.5f, 1.5f);
    for (int64_t h = 0; h < p->H; ++h) p->sinks.push_back(u(rng));
    w.sinks = p->sinks.data();
  }
  if (p->var.qk_norm) {
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (int64_t i = 0; i < (v.qk_norm_whole ? A : hd); ++i) p->q_norm.push_back(u(rng));
    for (int64_t i = 0; i < (v.qk_norm_whole ? kvE : hd); ++i) p->k_norm.push_back(u(rng));
    w.q_norm_weight = p->q_norm.data();
    w.k_norm_weight = p->k_norm.data();
  }
  w.q_proj_weight = p->wq.data();
  w.k_proj_weight = p->wk.data();
  w.v_proj_weight = p->wv.data();
  w.out_proj_weight = p->wo.data();
  if (v.bias_projections == 0) {
    w.in_proj_bias = p->bias.data();
    w.out_proj_bias = p->bo.data();
  } else {
    // The drawn biases of the projections the mask names (the same draws as all four).
    if (v.bias_projections & kBiasQ) w.q_proj_bias = p->bias.data();
    if (v.bias_projections & kBiasK) w.k_proj_bias = p->bias.data() + A;
    if (v.bias_projections & kBiasV) w.v_proj_bias = p->bias.data() + A + kvE;
    if (v.bias_projections & kBiasOut) w.out_proj_bias = p->bo.data();
  }
  const Status created = MultiheadAttention::Create(c, w, WeightBinding::kView, &p->layer);
  ASSERT_TRUE(created.ok()) << created.ToString();
  ContextOptions o;
  o.num_threads = 1;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(o, &ctx).ok());
  // x and the reference are [N, S, E] in memory; a sequence-first layer reads them as [S, N, E].
  const int64_t shape[3] = {p->N, p->S, p->E}, strides[3] = {p->S * p->E, p->E, 1};
  const int64_t seq_shape[3] = {p->S, p->N, p->E}, seq_strides[3] = {p->E, p->S * p->E, 1};
  AttentionInputs in;
  AttentionOutputs out;
  p->reference.assign(p->x.size(), 0.0f);
  const int64_t* sh = p->batch_first ? shape : seq_shape;
  const int64_t* st = p->batch_first ? strides : seq_strides;
  ASSERT_TRUE(TensorView::Strided(p->x.data(), DType::kF32, 3, sh, st, &in.query).ok());
  ASSERT_TRUE(TensorView::Strided(p->reference.data(), DType::kF32, 3, sh, st, &out.output).ok());
  in.causal = true;
  const Status s = p->layer->Forward(*ctx, in, out);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// How the sequences are fed: a prefill of prefill[n] tokens for entry n (one Step over the
// longest, with counts), then steps of up to `step_tokens` tokens per entry until every entry
// has all S tokens. `rewind` > 0: then every entry is truncated by `rewind` positions and its
// last `rewind` tokens are stepped again (their outputs replace the first ones). The cache has
// `capacity` positions per entry (0: S), as a ring when `ring`.
struct Schedule {
  std::vector<int64_t> prefill;  // empty: no prefill
  int64_t step_tokens = 1;
  int64_t rewind = 0;
  int64_t capacity = 0;
  bool ring = false;
};

// Runs the schedule through a cache and returns the outputs [N, S, E].
void RunIncremental(const Problem& p, DType dtype, const Schedule& sched, size_t threads,
                    std::vector<float>* out, bool int8_attention = false) {
  ContextOptions o;
  o.num_threads = threads;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(o, &ctx).ok());
  std::unique_ptr<KvCache> cache;
  KvCacheOptions options =
      KvCacheOptions::ForLayer(*p.layer, p.N, sched.capacity > 0 ? sched.capacity : p.S, dtype);
  options.ring = sched.ring;
  options.int8_attention = int8_attention;
  ASSERT_TRUE(KvCache::Create(options, &cache).ok());
  out->assign(p.x.size(), std::nanf(""));
  const int64_t E = p.E;
  std::vector<int64_t> pos(p.N, 0), counts(p.N);
  std::vector<float> in, res;
  auto step = [&](int64_t T) {
    in.assign(p.N * T * E, 0.0f);
    res.assign(p.N * T * E, -1.0f);
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t i = 0; i < counts[n]; ++i) {
        std::memcpy(&in[(n * T + i) * E], &p.x[(n * p.S + pos[n] + i) * E], E * sizeof(float));
      }
    }
    const int64_t shape[3] = {p.N, T, E};
    TensorView xv, ov;
    ASSERT_TRUE(TensorView::Dense(in.data(), DType::kF32, 3, shape, &xv).ok());
    ASSERT_TRUE(TensorView::Dense(res.data(), DType::kF32, 3, shape, &ov).ok());
    const Status s = cache->Step(*ctx, *p.layer, xv, ov, counts.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t i = 0; i < T; ++i) {
        const float* row = &res[(n * T + i) * E];
        if (i < counts[n]) {
          std::memcpy(&(*out)[(n * p.S + pos[n] + i) * E], row, E * sizeof(float));
        } else {
          for (int64_t e = 0; e < E; ++e) ASSERT_EQ(row[e], 0.0f) << "padding row not zeroed";
        }
      }
      pos[n] += counts[n];
      ASSERT_EQ(cache->length(n), pos[n]);
    }
  };
  if (!sched.prefill.empty()) {
    counts = sched.prefill;
    step(*std::max_element(counts.begin(), counts.end()));
  }
  for (;;) {
    bool any = false;
    for (int64_t n = 0; n < p.N; ++n) {
      counts[n] = std::min(sched.step_tokens, p.S - pos[n]);
      any = any || counts[n] > 0;
    }
    if (!any) break;
    step(sched.step_tokens);
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (sched.rewind > 0) {
    for (int64_t n = 0; n < p.N; ++n) {
      pos[n] -= sched.rewind;
      const Status s = cache->Truncate(n, pos[n]);
      ASSERT_TRUE(s.ok()) << s.ToString();
      counts[n] = 1;
    }
    for (int64_t i = 0; i < sched.rewind; ++i) {
      step(1);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

const char* Name(DType t) { return DTypeName(t); }

// Worst error seen per dtype (indexed by its DType value) over the whole binary, printed at the
// end of each test using it.
double g_worst[6] = {0, 0, 0, 0, 0, 0};

void CheckAgainstForward(const Problem& p, DType dtype, const Schedule& sched, const char* what) {
  std::vector<float> out;
  RunIncremental(p, dtype, sched, 2, &out);
  if (::testing::Test::HasFatalFailure()) return;
  const double err = testing_util::MaxScaledError(out, p.reference);
  double& worst = g_worst[static_cast<int>(dtype)];
  worst = std::max(worst, err);
  EXPECT_LE(err, ToleranceOf(dtype)) << what << ", " << Name(dtype) << ", " << p.Describe();
}

void PrintWorst() {
  std::printf(
      "[measured] max |cache - forward| / (1 + |forward|): f32 %.3g, bf16 %.3g, f16 %.3g, "
      "i8 %.3g\n",
      g_worst[0], g_worst[1], g_worst[2], g_worst[static_cast<int>(DType::kI8)]);
}

struct Layout {
  int64_t E, H, KVH;
};
// MHA, GQA (2 kv heads of 8), MQA, and an odd head_dim (12) with GQA for the kernels' tails.
constexpr Layout kLayouts[] = {{128, 8, 8}, {128, 8, 2}, {128, 8, 1}, {96, 8, 4}};

// Per target: the layers and their one-shot forwards are made with default dispatch, as a
// caller's are; the cache runs on the test's target.
class KvCacheTargetTest : public test::PerTargetTest {};

TEST_P(KvCacheTargetTest, TokenByTokenMatchesCausalForward) {
  std::vector<Problem> problems(std::size(kLayouts));
  WithDefaultTarget([&] {
    for (size_t i = 0; i < problems.size(); ++i) {
      problems[i].E = kLayouts[i].E;
      problems[i].H = kLayouts[i].H;
      problems[i].KVH = kLayouts[i].KVH;
      problems[i].N = 2;
      problems[i].S = 64;
      MakeProblem(&problems[i], 100 + static_cast<uint32_t>(i));
      ASSERT_FALSE(HasFatalFailure());
    }
  });
  ASSERT_FALSE(HasFatalFailure());
  for (const Problem& p : problems) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8}) {
      CheckAgainstForward(p, t, Schedule{}, "decode 64 tokens one by one");
      // Ragged: entries prefilled to 17, 5 tokens, then decoded together (they finish at
      // different steps, with counts 0 afterwards).
      CheckAgainstForward(p, t, Schedule{{17, 5}, 1}, "ragged prefill 17/5 + decode");
      CheckAgainstForward(p, t, Schedule{{}, 3}, "steps of 3 tokens");
    }
  }
  PrintWorst();
}

TEST_P(KvCacheTargetTest, LongContextAcrossChunks) {
  // 600 positions: prefill (blocked schedule) over 3 chunks of 256, then the split schedule
  // merges 3 chunks per decoded token.
  Problem p;
  p.E = 64;
  p.H = 4;
  p.KVH = 2;
  p.N = 3;
  p.S = 600;
  WithDefaultTarget([&] { MakeProblem(&p, 7); });
  ASSERT_FALSE(HasFatalFailure());
  for (DType t : {DType::kF32, DType::kBF16, DType::kI8}) {
    CheckAgainstForward(p, t, Schedule{{560, 17, 300}, 1}, "long ragged prefill + decode");
  }
  PrintWorst();
}

TEST(KvCacheTest, PrefillThenDecodeMatchesForward) {
  for (const Layout& l : kLayouts) {
    Problem p;
    p.E = l.E;
    p.H = l.H;
    p.KVH = l.KVH;
    p.N = 3;
    p.S = 64;
    MakeProblem(&p, 21);
    ASSERT_FALSE(HasFatalFailure());
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8}) {
      CheckAgainstForward(p, t, Schedule{{17, 17, 17}, 1}, "prefill 17 + decode");
      CheckAgainstForward(p, t, Schedule{{64, 0, 33}, 1}, "prefill 64/0/33 + decode");
      CheckAgainstForward(p, t, Schedule{{17, 9, 1}, 4}, "ragged prefill + steps of 4");
    }
  }
  PrintWorst();
}

TEST(KvCacheTest, BitwiseIdenticalForOneToFourThreads) {
  Problem p;
  p.E = 64;
  p.H = 8;
  p.KVH = 2;
  p.N = 3;
  p.S = 600;
  MakeProblem(&p, 5);
  ASSERT_FALSE(HasFatalFailure());
  // The last case: int8 storage with integer dot products (KvCacheOptions::int8_attention).
  for (int c = 0; c < 4; ++c) {
    const DType t = c == 0 ? DType::kF32 : c == 1 ? DType::kBF16 : DType::kI8;
    std::vector<float> first;
    for (size_t threads = 1; threads <= 4; ++threads) {
      std::vector<float> out;
      RunIncremental(p, t, Schedule{{530, 100, 9}, 1}, threads, &out, c == 3);
      ASSERT_FALSE(HasFatalFailure());
      if (threads == 1) {
        first = out;
        continue;
      }
      ASSERT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
          << Name(t) << (c == 3 ? " int8_attention" : "") << ": " << threads
          << " threads differ from 1 thread";
    }
  }
}

// Spans longer than kSpan (SplitSpan): with 16 kv heads an entry's span grows with its length,
// so decoding from 1010/1000 to 1100 merges spans of two lengths (the last one partial): f32,
// bf16 and int8 caches, steps of 4, a window with sinks (the band starts inside a long span) and
// in a ring, bitwise the same for 1 and 3 threads. head_dim 4 keeps it cheap under the
// sanitizers and qemu; the kernels' sizes are decode_test's. The spans' bounds are tuning; what
// the test needs of them is asserted: longer than kSpan, and longer at 1100 than at 1000.
TEST(KvCacheTest, LongSpansMatchForward) {
  const int64_t span_1000 = SplitSpan(1000, 16, 4, sizeof(float), 1);
  ASSERT_GT(span_1000, kSpan);
  ASSERT_GT(SplitSpan(1100, 16, 4, sizeof(float), 1), span_1000);
  ASSERT_GT(SplitSpan(1100, 16, 4, 1, 4), kSpan);  // int8 codes, 4 rows (steps of 4 tokens)
  const Schedule decode{{1010, 1000}, 1};
  for (const bool windowed : {false, true}) {
    Problem p;
    p.E = 64;
    p.H = 16;
    p.KVH = 16;
    p.N = 2;
    p.S = 1100;
    if (windowed) {
      p.var.config.window = 700;
      p.var.sinks = true;
    }
    MakeProblem(&p, windowed ? 41 : 40);
    ASSERT_FALSE(HasFatalFailure());
    const char* what =
        windowed ? "window 700 + sinks, prefill 1010/1000 + decode" : "prefill 1010/1000 + decode";
    if (windowed) {
      CheckAgainstForward(p, DType::kF32, decode, what);
      Schedule ring{{}, 4};  // a ring takes at most capacity - window + 1 tokens per call
      ring.capacity = 703;
      ring.ring = true;
      CheckAgainstForward(p, DType::kF32, ring, "ring of 703, steps of 4 tokens");
    } else {
      for (DType t : {DType::kF32, DType::kBF16, DType::kI8})
        CheckAgainstForward(p, t, decode, what);
      CheckAgainstForward(p, DType::kF32, Schedule{{1010, 1000}, 4}, "steps of 4 tokens");
    }
    std::vector<float> first, out;
    RunIncremental(p, DType::kF32, decode, 1, &first);
    RunIncremental(p, DType::kF32, decode, 3, &out);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
        << what << ": 3 threads differ from 1 thread";
  }
  PrintWorst();
}

// A prompt Step into an empty cache (every entry T >= 64 tokens, no padding) runs the layer's
// causal forward and stores the keys and values it projects: with the decode that follows it
// equals the one-shot forward (MHA and GQA, batch-first and sequence-first layers, f32 / bf16 /
// int8 caches, the long-key chunked path forced at this size), bitwise for 1-3 threads.
TEST(KvCacheTest, PromptPrefillRunsTheForward) {
  for (const bool batch_first : {true, false}) {
    for (const int64_t kv_heads : {8, 2}) {
      Problem p;
      p.E = 64;
      p.H = 8;
      p.KVH = kv_heads;
      p.N = 2;
      p.S = 100;
      p.batch_first = batch_first;
      MakeProblem(&p, 90 + static_cast<uint32_t>(kv_heads));
      ASSERT_FALSE(HasFatalFailure());
      const Schedule prompt_then_decode{{80, 80}, 1};
      for (DType t : {DType::kF32, DType::kBF16, DType::kI8}) {
        CheckAgainstForward(p, t, prompt_then_decode, "prompt of 80 + decode");
        testing_util::ScopedKeyChunking chunked(24);
        CheckAgainstForward(p, t, prompt_then_decode, "chunked prompt of 80 + decode");
      }
      std::vector<float> first, out;
      for (size_t threads = 1; threads <= 3; ++threads) {
        RunIncremental(p, DType::kF32, prompt_then_decode, threads, &out);
        ASSERT_FALSE(HasFatalFailure());
        if (threads == 1) first = out;
        ASSERT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
            << threads << " threads differ from 1 thread";
      }
    }
  }
  PrintWorst();
}

// The error of `got` against `want` (outputs [N, S, E]) over the tokens from position `first`
// of each entry: max and mean |difference| (NaN counts as infinite), and the largest |want|.
void DecodedTokensError(const Problem& p, int64_t first, const std::vector<float>& got,
                        const std::vector<float>& want, double* max_err, double* mean_err,
                        double* max_out) {
  double sum = 0;
  size_t count = 0;
  *max_err = *max_out = 0;
  for (int64_t n = 0; n < p.N; ++n) {
    for (int64_t t = first; t < p.S; ++t) {
      for (int64_t e = 0; e < p.E; ++e) {
        const size_t i = static_cast<size_t>((n * p.S + t) * p.E + e);
        const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
        *max_err = std::max(*max_err, std::isnan(err) ? INFINITY : err);
        *max_out = std::max(*max_out, std::fabs(static_cast<double>(want[i])));
        sum += err;
        ++count;
      }
    }
  }
  *mean_err = sum / static_cast<double>(count);
}

// int8 storage against an f32 cache on the same layer: 64 tokens decoded one by one after a
// prompt, random unit-scale inputs (E 256, 4 heads of 64: mha-bench --decode's head size), MHA
// and GQA, every target. Max and mean |int8 - f32| of the outputs are printed and bounded relative
// to the largest output: an element is stored within scale / 2 = max|row| / 254 of its value (4e-3
// of the row's largest), which moves scores and outputs by about that fraction of their scale (as
// bf16's 2^-9 per element does). Bounds: max 2e-2, mean 2e-3 of the output scale; measured on every
// target: max 4.9e-3, mean 7.9e-4 (max |err| 8.2e-4 and mean 1.32e-4 at an output scale of 0.167).
TEST_P(KvCacheTargetTest, Int8CacheAgainstF32CacheOver64DecodedTokens) {
  const char* const target = target_name();
  double worst_max = 0, worst_mean = 0;
  for (const int64_t kv_heads : {4, 2}) {
    Problem p;
    p.E = 256;
    p.H = 4;
    p.KVH = kv_heads;
    p.N = 2;
    p.S = 96;
    WithDefaultTarget([&] { MakeProblem(&p, 64 + static_cast<uint32_t>(kv_heads)); });
    ASSERT_FALSE(HasFatalFailure());
    std::vector<float> f32, i8;
    const Schedule prompt_then_decode{{32, 32}, 1};
    RunIncremental(p, DType::kF32, prompt_then_decode, 2, &f32);
    RunIncremental(p, DType::kI8, prompt_then_decode, 2, &i8);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    double max_err, mean_err, max_out;
    DecodedTokensError(p, 32, i8, f32, &max_err, &mean_err, &max_out);
    std::printf(
        "[measured] %s kv_heads %lld: int8 vs f32 cache, max |err| %.3g, mean |err| "
        "%.3g (max |output| %.3g)\n",
        target, static_cast<long long>(kv_heads), max_err, mean_err, max_out);
    worst_max = std::max(worst_max, max_err);
    worst_mean = std::max(worst_mean, mean_err);
    EXPECT_LE(max_err, 2e-2 * max_out) << target;
    EXPECT_LE(mean_err, 2e-3 * max_out) << target;
  }
  std::printf("[measured] %s int8 vs f32 cache over 64 decoded tokens: max %.3g, mean %.3g\n",
              target, worst_max, worst_mean);
}

// KvCacheOptions::int8_attention against an f32 cache, as the test above, and against the same
// int8 cache with f32 arithmetic: the queries' and the weights' rounding (kernels/decode_int8.h)
// on top of the storage's. Layers with 4 and 2 kv heads of head_dim 64, and the query weights
// scaled by 1 and by 4 (sharper softmax rows: a few large weights beside many small ones, the case
// where the weights' blocks lose most). Bounds: as int8 storage's (max 2e-2, mean 2e-3 of the
// output scale) against f32, and max 1e-2, mean 1e-3 against the int8 cache with f32 arithmetic;
// measured (Zen 4, every target): see the [measured] lines.
TEST_P(KvCacheTargetTest, Int8AttentionAgainstF32AndInt8CachesOver64DecodedTokens) {
  const char* const target = target_name();
  for (const int64_t kv_heads : {4, 2}) {
    for (const float sharp : {1.0f, 4.0f}) {
      Problem p;
      p.E = 256;
      p.H = 4;
      p.KVH = kv_heads;
      p.N = 2;
      p.S = 96;
      p.q_scale = sharp;
      WithDefaultTarget([&] { MakeProblem(&p, 80 + static_cast<uint32_t>(kv_heads)); });
      ASSERT_FALSE(HasFatalFailure());
      std::vector<float> f32, i8, dot;
      const Schedule prompt_then_decode{{32, 32}, 1};
      RunIncremental(p, DType::kF32, prompt_then_decode, 2, &f32);
      RunIncremental(p, DType::kI8, prompt_then_decode, 2, &i8);
      RunIncremental(p, DType::kI8, prompt_then_decode, 2, &dot, /*int8_attention=*/true);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      for (int against = 0; against < 2; ++against) {
        double max_err, mean_err, max_out;
        DecodedTokensError(p, 32, dot, against == 0 ? f32 : i8, &max_err, &mean_err, &max_out);
        std::printf(
            "[measured] %s kv_heads %lld, query weights x%g: int8_attention vs %s cache, max "
            "|err| %.3g (%.3g of the output scale), mean %.3g (%.3g)\n",
            target, static_cast<long long>(kv_heads), sharp, against == 0 ? "f32" : "int8",
            max_err, max_err / max_out, mean_err, mean_err / max_out);
        const double max_bound = against == 0 ? 2e-2 : 1e-2, mean_bound = against == 0 ? 2e-3 : 1e-3;
        EXPECT_LE(max_err, max_bound * max_out) << target << (against == 0 ? " vs f32" : " vs i8");
        EXPECT_LE(mean_err, mean_bound * max_out) << target << (against == 0 ? " vs f32" : " vs i8");
      }
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(KvCacheTargetTest);

// A small fixture for API behaviour: an f32 layer with E 32, 4 heads, 2 kv heads.
class KvCacheApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    p_.E = 32;
    p_.H = 4;
    p_.KVH = 2;
    p_.N = 2;
    p_.S = 8;
    MakeProblem(&p_, 3);
    ASSERT_FALSE(HasFatalFailure());
    ContextOptions o;
    o.num_threads = 2;
    ASSERT_TRUE(Context::Create(o, &ctx_).ok());
    ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*p_.layer, 2, 8), &cache_).ok());
  }
  TensorView View(std::vector<float>* data, int64_t n, int64_t t, int64_t f) {
    data->resize(n * t * f, 0.5f);
    const int64_t shape[3] = {n, t, f};
    TensorView v;
    EXPECT_TRUE(TensorView::Dense(data->data(), DType::kF32, 3, shape, &v).ok());
    return v;
  }
  Problem p_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(KvCacheApiTest, CapacityOverflowNamesEntryLengthCountAndCapacity) {
  std::vector<float> x, out;
  ASSERT_TRUE(cache_->Step(*ctx_, *p_.layer, View(&x, 2, 6, 32), View(&out, 2, 6, 32)).ok());
  std::vector<float> x2, out2;
  const TensorView o2 = View(&out2, 2, 3, 32);
  std::fill(out2.begin(), out2.end(), 7.0f);
  const int64_t counts[2] = {2, 3};
  const Status s = cache_->Step(*ctx_, *p_.layer, View(&x2, 2, 3, 32), o2, counts);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch entry 1 has length 6, appending 3 tokens"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("capacity 8"), std::string::npos) << s.message();
  EXPECT_EQ(cache_->length(0), 6);
  EXPECT_EQ(cache_->length(1), 6);
  for (float v : out2) ASSERT_EQ(v, 7.0f) << "output written on error";
}

TEST_F(KvCacheApiTest, ShapeAndDimensionErrors) {
  std::vector<float> a, b, c;
  // Wrong batch.
  Status s = cache_->Step(*ctx_, *p_.layer, View(&a, 3, 1, 32), View(&b, 3, 1, 32));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("x: expected [2, T, 32]"), std::string::npos) << s.message();
  // Output tokens differ from the input's.
  s = cache_->Step(*ctx_, *p_.layer, View(&a, 2, 2, 32), View(&b, 2, 1, 32));
  EXPECT_NE(s.message().find("output: expected [2, 2, 32]"), std::string::npos) << s.message();
  // Features.
  s = cache_->Append(*ctx_, *p_.layer, View(&a, 2, 1, 31), View(&b, 2, 1, 32));
  EXPECT_NE(s.message().find("key: expected [2, T, 32]"), std::string::npos) << s.message();
  s = cache_->Append(*ctx_, *p_.layer, View(&a, 2, 1, 32), View(&b, 2, 2, 32));
  EXPECT_NE(s.message().find("value: expected [2, 1, 32]"), std::string::npos) << s.message();
  // counts out of range.
  const int64_t bad[2] = {0, 2};
  s = cache_->Step(*ctx_, *p_.layer, View(&a, 2, 1, 32), View(&b, 2, 1, 32), bad);
  EXPECT_NE(s.message().find("counts[1]: expected 0..1"), std::string::npos) << s.message();
  // Forward with more query tokens than cached positions.
  s = cache_->Forward(*ctx_, *p_.layer, View(&a, 2, 1, 32), View(&b, 2, 1, 32));
  EXPECT_NE(s.message().find("batch entry 0 has length 0"), std::string::npos) << s.message();
  // A layer with other kv heads.
  Problem other;
  other.E = 32;
  other.H = 4;
  other.KVH = 4;
  other.N = 1;
  other.S = 2;
  MakeProblem(&other, 9);
  s = cache_->Step(*ctx_, *other.layer, View(&a, 2, 1, 32), View(&b, 2, 1, 32));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected num_kv_heads 2 and head_dim 8 (the cache's), got 4 and 8"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(cache_->length(0), 0);
  // Options.
  KvCacheOptions o = KvCacheOptions::ForLayer(*p_.layer, 2, 0);
  std::unique_ptr<KvCache> c2;
  s = KvCache::Create(o, &c2);
  EXPECT_NE(s.message().find("capacity: expected > 0, got 0"), std::string::npos) << s.message();
  o = KvCacheOptions::ForLayer(*p_.layer, 2, 4, DType::kU8);
  s = KvCache::Create(o, &c2);
  EXPECT_NE(s.message().find("dtype: expected f32, bf16, f16 or i8, got u8"), std::string::npos)
      << s.message();
  o = KvCacheOptions::ForLayer(*p_.layer, 2, 4, DType::kF16);
  o.int8_attention = true;
  s = KvCache::Create(o, &c2);
  EXPECT_NE(s.message().find("KvCache: int8_attention: expected dtype i8, got f16"),
            std::string::npos)
      << s.message();
  o.dtype = DType::kI8;
  o.head_dim = 1040;
  s = KvCache::Create(o, &c2);
  EXPECT_NE(s.message().find("int8_attention: expected head_dim <= 1024, got 1040"),
            std::string::npos)
      << s.message();
  o.head_dim = 1024;
  size_t bytes = 0;
  EXPECT_TRUE(KvCache::RequiredBytes(o, &bytes).ok());
}

TEST_F(KvCacheApiTest, BiasKvAndZeroAttnLayersAreUnsupported) {
  std::vector<float> bk(16, 0.1f), bv(16, 0.2f);
  AttentionConfig c;
  c.embed_dim = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.add_bias_kv = true;
  AttentionWeights w;
  w.q_proj_weight = p_.wq.data();
  w.k_proj_weight = p_.wk.data();
  w.v_proj_weight = p_.wv.data();
  w.in_proj_bias = p_.bias.data();
  w.bias_k = bk.data();
  w.bias_v = bv.data();
  w.out_proj_weight = p_.wo.data();
  w.out_proj_bias = p_.bo.data();
  std::unique_ptr<MultiheadAttention> layer;
  ASSERT_TRUE(MultiheadAttention::Create(c, w, WeightBinding::kView, &layer).ok());
  std::vector<float> a, b;
  const Status s = cache_->Step(*ctx_, *layer, View(&a, 2, 1, 32), View(&b, 2, 1, 32));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("add_bias_kv"), std::string::npos) << s.message();
}

TEST_F(KvCacheApiTest, AppendThenForwardEqualsStepAndTruncateRewinds) {
  // Entry inputs differ per token so positions matter.
  std::vector<float> x(2 * 5 * 32), out_step, out_fwd, tmp;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : x) v = u(rng);
  const int64_t shape[3] = {2, 5, 32};
  TensorView xv;
  ASSERT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, shape, &xv).ok());
  ASSERT_TRUE(cache_->Step(*ctx_, *p_.layer, xv, View(&out_step, 2, 5, 32)).ok());
  cache_->Reset();
  EXPECT_EQ(cache_->length(1), 0);
  ASSERT_TRUE(cache_->Append(*ctx_, *p_.layer, xv, xv).ok());
  ASSERT_TRUE(cache_->Forward(*ctx_, *p_.layer, xv, View(&out_fwd, 2, 5, 32)).ok());
  EXPECT_EQ(out_step, out_fwd);
  // Roll back the last 2 tokens of entry 0 and redo them: same outputs as the first time.
  ASSERT_TRUE(cache_->Truncate(0, 3).ok());
  EXPECT_EQ(cache_->Truncate(0, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->Truncate(2, 0).code(), StatusCode::kInvalidArgument);
  // Tokens 3, 4 of entry 0 as a 2-token step (entry 1 idle).
  std::vector<float> x2(2 * 2 * 32, 0.0f), out2;
  std::memcpy(x2.data(), &x[3 * 32], 2 * 32 * sizeof(float));
  const int64_t counts[2] = {2, 0};
  const int64_t shape2[3] = {2, 2, 32};
  TensorView x2v;
  ASSERT_TRUE(TensorView::Dense(x2.data(), DType::kF32, 3, shape2, &x2v).ok());
  ASSERT_TRUE(cache_->Step(*ctx_, *p_.layer, x2v, View(&out2, 2, 2, 32), counts).ok());
  EXPECT_EQ(cache_->length(0), 5);
  EXPECT_EQ(cache_->length(1), 5);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t e = 0; e < 32; ++e) {
      EXPECT_NEAR(out2[i * 32 + e], out_step[(3 + i) * 32 + e], 1e-6) << "token " << 3 + i;
    }
  }
}

TEST_F(KvCacheApiTest, AppendProjectedImportsProjectOutputs) {
  // Project's per-head k/v [N, kvH, S, hd] imported into a cache, then Forward, equals Step.
  std::vector<float> x(2 * 5 * 32), out_step, out_imp;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : x) v = u(rng);
  const int64_t shape[3] = {2, 5, 32};
  TensorView xv;
  ASSERT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, shape, &xv).ok());
  ASSERT_TRUE(cache_->Step(*ctx_, *p_.layer, xv, View(&out_step, 2, 5, 32)).ok());
  std::vector<float> q(2 * 4 * 5 * 8), k(2 * 2 * 5 * 8), v(2 * 2 * 5 * 8);
  const int64_t qs[4] = {2, 4, 5, 8}, ks[4] = {2, 2, 5, 8};
  ProjectionOutputs po;
  ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &po.q).ok());
  ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, ks, &po.k).ok());
  ASSERT_TRUE(TensorView::Dense(v.data(), DType::kF32, 4, ks, &po.v).ok());
  AttentionInputs in;
  in.query = xv;
  ASSERT_TRUE(p_.layer->Project(*ctx_, in, po).ok());
  std::unique_ptr<KvCache> c2;
  ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*p_.layer, 2, 8), &c2).ok());
  // Shape errors first: wrong kv heads.
  Status s = c2->AppendProjected(po.q, po.v);
  EXPECT_NE(s.message().find("k: expected [2, 2, 5, 8]"), std::string::npos) << s.message();
  EXPECT_EQ(c2->length(0), 0);
  ASSERT_TRUE(c2->AppendProjected(po.k, po.v).ok());
  EXPECT_EQ(c2->length(1), 5);
  ASSERT_TRUE(c2->Forward(*ctx_, *p_.layer, xv, View(&out_imp, 2, 5, 32)).ok());
  for (size_t i = 0; i < out_step.size(); ++i) ASSERT_NEAR(out_imp[i], out_step[i], 1e-6) << i;
  // Capacity: 5 + 5 > 8.
  s = c2->AppendProjected(po.k, po.v);
  EXPECT_NE(s.message().find("batch entry 0 has length 5, appending 5 tokens needs 10 positions, "
                             "capacity 8"),
            std::string::npos)
      << s.message();
}

TEST_F(KvCacheApiTest, CallerBufferHoldsTheCache) {
  KvCacheOptions o = KvCacheOptions::ForLayer(*p_.layer, 2, 8, DType::kBF16);
  size_t bytes = 0;
  ASSERT_TRUE(KvCache::RequiredBytes(o, &bytes).ok());
  EXPECT_EQ(bytes, 2u * 2 * 2 * 8 * 8 * 2);  // K+V, batch, kv heads, capacity, hd, bf16
  std::vector<uint8_t> buf(bytes + 2, 0xEE);
  o.buffer = buf.data() + 2;  // malloc'ed data is 16-byte aligned: 2 keeps bf16 alignment
  o.buffer_bytes = bytes - 1;
  std::unique_ptr<KvCache> c;
  Status s = KvCache::Create(o, &c);
  EXPECT_NE(s.message().find("buffer_bytes: expected >= " + std::to_string(bytes)),
            std::string::npos)
      << s.message();
  o.buffer_bytes = bytes;
  o.buffer = buf.data() + 1;  // misaligned for bf16
  s = KvCache::Create(o, &c);
  EXPECT_NE(s.message().find("buffer: expected an address aligned to 2 bytes"), std::string::npos)
      << s.message();
  o.buffer = buf.data() + 2;
  ASSERT_TRUE(KvCache::Create(o, &c).ok());
  EXPECT_EQ(c->keys(), buf.data() + 2);
  std::vector<float> a, b;
  ASSERT_TRUE(c->Step(*ctx_, *p_.layer, View(&a, 2, 1, 32), View(&b, 2, 1, 32)).ok());
  // Position 0 of entry 0, kv head 0 was written (K), position 1 was not.
  const uint8_t* k = buf.data() + 2;
  bool written = false;
  for (int i = 0; i < 16; ++i) written = written || k[i] != 0xEE;
  EXPECT_TRUE(written);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(k[i], 0xEE) << "byte " << i;
}

// ---- Attention variants (issue 30): decode equals the one-shot causal forward of the layer.

struct VariantCase {
  const char* name;
  int64_t KVH;  // of 4 heads (E 64, head_dim 16)
  Variants var;
};

std::vector<VariantCase> VariantCases() {
  std::vector<VariantCase> cases;
  auto add = [&](const char* name, int64_t kvh, auto set) {
    VariantCase c{name, kvh, {}};
    set(&c.var);
    cases.push_back(std::move(c));
  };
  add("neox", 4, [](Variants* v) { v->config.rope = RopeStyle::kNeox; });
  add("gptj", 4, [](Variants* v) { v->config.rope = RopeStyle::kGptj; });
  add("partial rotary 6 of 16, theta 500, scale 2", 4, [](Variants* v) {
    v->config.rope = RopeStyle::kNeox;
    v->config.rotary_dim = 6;
    v->config.rope_theta = 500.0f;
    v->config.rope_scale = 2.0f;
  });
  add("alibi", 4, [](Variants* v) { v->config.alibi = true; });
  add("window 5", 4, [](Variants* v) { v->config.window = 5; });
  add("window 17", 4, [](Variants* v) { v->config.window = 17; });
  add("softcap 0.3", 4, [](Variants* v) { v->config.softcap = 0.3f; });
  add("sinks", 4, [](Variants* v) { v->sinks = true; });
  add("qk-norm per head", 4, [](Variants* v) { v->qk_norm = true; });
  add("qk-norm whole, eps 1e-5", 2, [](Variants* v) {
    v->qk_norm = true;
    v->config.qk_norm_whole = true;
    v->config.qk_norm_eps = 1e-5f;
  });
  add("gpt-oss-like: GQA + neox + window 7 + sinks", 2, [](Variants* v) {
    v->config.rope = RopeStyle::kNeox;
    v->config.window = 7;
    v->sinks = true;
  });
  add("gemma-like: head_dim 24 (A 96 != E 64) + GQA + neox + qk-norm", 2, [](Variants* v) {
    v->config.head_dim = 24;
    v->config.rope = RopeStyle::kNeox;
    v->qk_norm = true;
  });
  add("qwen2-like: q, k, v biased, out not + GQA + neox", 2, [](Variants* v) {
    v->config.bias_projections = kBiasQ | kBiasK | kBiasV;
    v->config.rope = RopeStyle::kNeox;
  });
  add("whisper-like: k unbiased + head_dim 8 (A 32 != E 64)", 4, [](Variants* v) {
    v->config.bias_projections = kBiasQ | kBiasV | kBiasOut;
    v->config.head_dim = 8;
  });
  add("gemma2-like: neox + softcap 0.3 + window 6", 4, [](Variants* v) {
    v->config.rope = RopeStyle::kNeox;
    v->config.softcap = 0.3f;
    v->config.window = 6;
  });
  return cases;
}

Problem VariantProblem(const VariantCase& c, int64_t N, int64_t S, uint32_t seed) {
  Problem p;
  p.E = 64;
  p.H = 4;
  p.KVH = c.KVH;
  p.N = N;
  p.S = S;
  p.var = c.var;
  MakeProblem(&p, seed);
  return p;
}

// Every variant alone and the two combinations: token by token, a ragged prefill then decode,
// steps of 3 tokens, and a rewind (Truncate by 7, re-append), all against the causal forward.
TEST(KvCacheVariantsTest, DecodeMatchesCausalForward) {
  for (const VariantCase& c : VariantCases()) {
    SCOPED_TRACE(c.name);
    const Problem p = VariantProblem(c, 2, 40, 300);
    ASSERT_FALSE(HasFatalFailure());
    CheckAgainstForward(p, DType::kF32, Schedule{}, "token by token");
    CheckAgainstForward(p, DType::kF32, Schedule{{11, 5}, 1}, "ragged prefill 11/5 + decode");
    CheckAgainstForward(p, DType::kF32, Schedule{{}, 3}, "steps of 3 tokens");
    CheckAgainstForward(p, DType::kF32, Schedule{{}, 1, 7}, "decode, truncate by 7, re-append");
  }
  PrintWorst();
}

// The combinations on every target, with 16-bit and int8 caches at their bounds.
TEST_P(KvCacheTargetTest, VariantCombinationsMatchCausalForward) {
  for (const VariantCase& c : VariantCases()) {
    if (std::strchr(c.name, ':') == nullptr) continue;  // the combinations
    SCOPED_TRACE(c.name);
    Problem p;
    WithDefaultTarget([&] { p = VariantProblem(c, 2, 40, 310); });
    ASSERT_FALSE(HasFatalFailure());
    for (DType t : {DType::kF32, DType::kBF16, DType::kI8}) {
      CheckAgainstForward(p, t, Schedule{}, "token by token");
      CheckAgainstForward(p, t, Schedule{{9, 3}, 2}, "ragged prefill 9/3 + steps of 2");
    }
  }
  PrintWorst();
}

// Longer than a span: the split schedule merges spans (from the sink's state) or skips the spans
// below the window's band, the blocked schedule (a ragged prefill of 270 tokens) starts at the
// band; the prompt path runs the forward.
TEST(KvCacheVariantsTest, LongContextAcrossSpans) {
  for (const VariantCase& c : VariantCases()) {
    const Variants& v = c.var;
    if (v.config.window == 0 && !v.sinks && !v.config.alibi && v.config.softcap == 0) continue;
    SCOPED_TRACE(c.name);
    const Problem p = VariantProblem(c, 2, 300, 320);
    ASSERT_FALSE(HasFatalFailure());
    CheckAgainstForward(p, DType::kF32, Schedule{{270, 20}, 1}, "ragged prefill 270/20 + decode");
    CheckAgainstForward(p, DType::kF32, Schedule{{280, 280}, 1}, "prompt 280 + decode");
  }
  PrintWorst();
}

// A ring of `capacity` positions on windowed layers: sequences several times the capacity equal
// the windowed causal forward over the whole sequence, with the storage of `capacity` positions.
TEST(KvCacheVariantsTest, RingLongerThanCapacityMatchesWindowedForward) {
  for (const VariantCase& c : VariantCases()) {
    const int64_t W = c.var.config.window;
    if (W == 0) continue;
    SCOPED_TRACE(c.name);
    const Problem p = VariantProblem(c, 2, 70, 330);
    ASSERT_FALSE(HasFatalFailure());
    const int64_t cap = W + 3;  // steps of up to 4 tokens, truncation by up to 3
    Schedule s;
    s.capacity = cap;
    s.ring = true;
    CheckAgainstForward(p, DType::kF32, s, "ring, token by token");
    s.step_tokens = 4;
    CheckAgainstForward(p, DType::kF32, s, "ring, steps of 4");
    s.step_tokens = 1;
    s.prefill = {4, 2};
    s.rewind = 3;
    CheckAgainstForward(p, DType::kF32, s, "ring, ragged prefill 4/2, decode, rewind 3");
    s.prefill = {64, 64};
    s.rewind = 0;
    CheckAgainstForward(p, DType::kF32, s, "ring, prompt of 64 + decode");
    {
      testing_util::ScopedKeyChunking chunked(24);  // the prompt's keys reach the ring by chunks
      CheckAgainstForward(p, DType::kF32, s, "ring, key-chunked prompt of 64 + decode");
    }
    for (DType t : {DType::kBF16, DType::kI8}) {
      s.prefill.clear();
      CheckAgainstForward(p, t, s, "ring, token by token");
    }
    // The storage is that of `cap` positions, and the lengths are logical.
    KvCacheOptions o = KvCacheOptions::ForLayer(*p.layer, p.N, cap);
    o.ring = true;
    size_t bytes = 0;
    ASSERT_TRUE(KvCache::RequiredBytes(o, &bytes).ok());
    EXPECT_EQ(bytes, static_cast<size_t>(2 * p.N * p.KVH * cap * (p.E / p.H)) * sizeof(float));
  }
  // A ring larger than a span (spans and wrap-around at different places), W 200 of 260.
  VariantCase big{"ring 260, window 200, sinks", 2, {}};
  big.var.config.window = 200;
  big.var.config.rope = RopeStyle::kNeox;
  big.var.sinks = true;
  const Problem p = VariantProblem(big, 2, 600, 340);
  ASSERT_FALSE(HasFatalFailure());
  Schedule s;
  s.capacity = 260;
  s.ring = true;
  s.prefill = {61, 40};
  CheckAgainstForward(p, DType::kF32, s, "ring 260 / window 200, prefill 61/40 + decode");
  s.prefill.clear();
  s.step_tokens = 3;
  CheckAgainstForward(p, DType::kF32, s, "ring 260 / window 200, steps of 3");
  PrintWorst();
}

// AppendProjected takes keys as given: Project's k, normalized and rotated at positions 0..S-1,
// imported into an empty cache, then Forward over the same tokens equals the causal forward.
TEST(KvCacheVariantsTest, AppendProjectedTakesRotatedKeys) {
  VariantCase c{"neox + qk-norm", 2, {}};
  c.var.config.rope = RopeStyle::kNeox;
  c.var.qk_norm = true;
  const Problem p = VariantProblem(c, 2, 12, 370);
  ASSERT_FALSE(HasFatalFailure());
  const int64_t hd = p.E / p.H;
  std::vector<float> x = p.x, q(p.N * p.H * p.S * hd), k(p.N * p.KVH * p.S * hd), v(k.size());
  std::vector<float> out(x.size(), std::nanf(""));
  const int64_t xs[3] = {p.N, p.S, p.E}, qs[4] = {p.N, p.H, p.S, hd}, ks[4] = {p.N, p.KVH, p.S, hd};
  AttentionInputs in;
  ProjectionOutputs po;
  TensorView ov;
  ASSERT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, xs, &in.query).ok());
  ASSERT_TRUE(TensorView::Dense(out.data(), DType::kF32, 3, xs, &ov).ok());
  ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &po.q).ok());
  ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, ks, &po.k).ok());
  ASSERT_TRUE(TensorView::Dense(v.data(), DType::kF32, 4, ks, &po.v).ok());
  ContextOptions co;
  co.num_threads = 2;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(co, &ctx).ok());
  ASSERT_TRUE(p.layer->Project(*ctx, in, po).ok());
  std::unique_ptr<KvCache> cache;
  ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*p.layer, p.N, p.S), &cache).ok());
  ASSERT_TRUE(cache->AppendProjected(po.k, po.v).ok());
  const Status s = cache->Forward(*ctx, *p.layer, in.query, ov);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LE(testing_util::MaxScaledError(out, p.reference), 1e-5);
}

TEST(KvCacheVariantsTest, BitwiseIdenticalForOneToThreeThreads) {
  for (const bool ring : {false, true}) {
    const VariantCase c = VariantCases()[10];  // gpt-oss-like
    const Problem p = VariantProblem(c, 3, 300, 350);
    ASSERT_FALSE(HasFatalFailure());
    Schedule s{{270, 20, 3}, 1};
    if (ring) {
      s.prefill = {4, 2, 1};
      s.capacity = 10;
      s.ring = true;
    }
    std::vector<float> first, out;
    for (size_t threads = 1; threads <= 3; ++threads) {
      RunIncremental(p, DType::kF32, s, threads, &out);
      ASSERT_FALSE(HasFatalFailure());
      if (threads == 1) first = out;
      ASSERT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
          << (ring ? "ring: " : "") << threads << " threads differ from 1 thread";
    }
  }
}

// Every ring error names its arguments and leaves the cache as it was.
TEST(KvCacheVariantsTest, RingErrors) {
  VariantCase plain{"plain", 2, {}};
  VariantCase windowed{"window 5", 2, {}};
  windowed.var.config.window = 5;
  const Problem p0 = VariantProblem(plain, 1, 8, 360);
  const Problem p5 = VariantProblem(windowed, 1, 8, 360);
  ASSERT_FALSE(HasFatalFailure());
  ContextOptions co;
  co.num_threads = 2;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(co, &ctx).ok());
  auto make = [&](int64_t cap) {
    KvCacheOptions o = KvCacheOptions::ForLayer(*p5.layer, 1, cap);
    o.ring = true;
    std::unique_ptr<KvCache> c;
    EXPECT_TRUE(KvCache::Create(o, &c).ok());
    return c;
  };
  std::vector<float> xb, ob;
  auto step = [&](KvCache& c, const Problem& p, int64_t T) {
    xb.assign(T * p.E, 0.25f);
    ob.assign(T * p.E, 7.0f);
    const int64_t shape[3] = {1, T, p.E};
    TensorView x, o;
    EXPECT_TRUE(TensorView::Dense(xb.data(), DType::kF32, 3, shape, &x).ok());
    EXPECT_TRUE(TensorView::Dense(ob.data(), DType::kF32, 3, shape, &o).ok());
    return c.Step(*ctx, *p.layer, x, o);
  };
  auto expect_error = [&](const Status& s, std::initializer_list<const char*> parts) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    for (const char* part : parts) {
      EXPECT_NE(s.message().find(part), std::string::npos) << s.message() << " lacks " << part;
    }
  };
  std::unique_ptr<KvCache> ring8 = make(8);
  // A layer without a window.
  expect_error(step(*ring8, p0, 1),
               {"ring", "window > 0", "capacity >= window", "window 0", "capacity 8"});
  size_t bytes = 0;
  expect_error(ring8->Plan(*p0.layer, 1, 1, &bytes), {"ring", "window 0"});
  // capacity < window.
  std::unique_ptr<KvCache> ring4 = make(4);
  expect_error(step(*ring4, p5, 1), {"ring", "window 5", "capacity 4"});
  EXPECT_EQ(ring4->length(0), 0);
  // A step of more than capacity - window + 1 = 4 tokens.
  expect_error(step(*ring8, p5, 5),
               {"capacity - window + 1 = 4", "capacity 8", "window 5", "got 5"});
  EXPECT_EQ(ring8->length(0), 0);
  for (float v : ob) ASSERT_EQ(v, 7.0f) << "output written on error";
  // Truncate drops at most capacity - window = 3 positions.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(step(*ring8, p5, 4).ok());
  EXPECT_EQ(ring8->length(0), 12);  // beyond the capacity: lengths are logical
  expect_error(ring8->Truncate(0, 8), {"Truncate", "length", "expected 9..12", "got 8"});
  EXPECT_EQ(ring8->length(0), 12);
  EXPECT_TRUE(ring8->Truncate(0, 9).ok());
  EXPECT_TRUE(step(*ring8, p5, 1).ok());
  // At most `capacity` projected positions per call.
  std::vector<float> kv(2 * 9 * 16, 0.5f);
  const int64_t shape[4] = {1, 2, 9, 16};
  TensorView k;
  ASSERT_TRUE(TensorView::Dense(kv.data(), DType::kF32, 4, shape, &k).ok());
  expect_error(ring8->AppendProjected(k, k), {"counts[0]", "capacity 8", "got 9"});
  EXPECT_EQ(ring8->length(0), 10);
}

}  // namespace
}  // namespace mha
