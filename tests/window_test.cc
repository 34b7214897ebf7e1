// The forward's window skipping and sinks (runtime/attention_tasks.cc, key_chunks.cc): a
// windowed forward equals the same forward with an equivalent additive -inf attn_mask and no
// window on every path (online, full-row with weights, key-chunked), causal and not, GQA; sinks
// against a hand computation in double; bitwise the same for 1, 2 and 3 threads; key blocks
// before the band are never multiplied (trace counts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/context_internal.h"
#include "runtime/trace.h"
#include "tests/attention_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

using testing_util::ScopedKeyChunking;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A GQA layer with random weights and no biases: E = 32, H = 4, 2 key/value heads (head_dim 8).
struct Layer {
  AttentionConfig config;
  std::vector<float> wq, wk, wv, wo, sinks;

  explicit Layer(std::mt19937* rng, int64_t E = 32, int64_t H = 4, int64_t KVH = 2) {
    config.embed_dim = E;
    config.num_heads = H;
    config.num_kv_heads = KVH;
    config.batch_first = true;
    config.bias = false;  // keeps the hand computation in SinksMatchDouble short
    const int64_t kvE = E / H * KVH;
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    auto fill = [&](std::vector<float>* v, int64_t n) {
      v->resize(n);
      for (float& x : *v) x = u(*rng);
    };
    fill(&wq, E * E);
    fill(&wk, kvE * E);
    fill(&wv, kvE * E);
    fill(&wo, E * E);
    sinks.resize(H);
    for (int64_t h = 0; h < H; ++h) sinks[h] = 0.5f * static_cast<float>(h) - 0.5f;
  }

  AttentionWeights Weights(bool with_sinks) const {
    AttentionWeights w;
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.out_proj_weight = wo.data();
    if (with_sinks) w.sinks = sinks.data();
    return w;
  }
};

// Problem: self-attention (S == L) unless `cross`, batch N, queries x [N, L, E], keys/values
// kv [N, S, E].
struct Problem {
  int64_t N = 1, L = 0, S = 0;
  bool cross = false;
  bool causal = false;
  int64_t window = 0;
  bool need_weights = false;
  bool average = true;
  bool sinks = false;
  std::vector<float> attn_mask;    // [L, S] float, or empty
  std::vector<int32_t> positions;  // [L] query (and self-attention key) positions, or empty
  size_t threads = 1;
};

struct Result {
  std::vector<float> out, weights;
};

Status Forward(const Layer& layer, const std::vector<float>& x, const std::vector<float>& kv,
               const Problem& r, Result* res, TraceRecorder* trace = nullptr) {
  AttentionConfig config = layer.config;
  config.window = r.window;
  std::unique_ptr<MultiheadAttention> mha;
  Status s = MultiheadAttention::Create(config, layer.Weights(r.sinks), WeightBinding::kView, &mha);
  if (!s.ok()) return s;
  ContextOptions opts;
  opts.num_threads = r.threads;
  std::unique_ptr<Context> ctx;
  s = Context::Create(opts, &ctx);
  if (!s.ok()) return s;
  const int64_t E = config.embed_dim, H = config.num_heads;
  AttentionInputs in;
  const int64_t qshape[3] = {r.N, r.L, E};
  const int64_t kshape[3] = {r.N, r.S, E};
  s = TensorView::Dense(const_cast<float*>(x.data()), DType::kF32, 3, qshape, &in.query);
  if (!s.ok()) return s;
  if (r.cross) {
    s = TensorView::Dense(const_cast<float*>(kv.data()), DType::kF32, 3, kshape, &in.key);
    if (!s.ok()) return s;
    in.value = in.key;
  }
  if (!r.attn_mask.empty()) {
    const int64_t mshape[2] = {r.L, r.S};
    s = TensorView::Dense(const_cast<float*>(r.attn_mask.data()), DType::kF32, 2, mshape,
                          &in.attn_mask);
    if (!s.ok()) return s;
  }
  if (!r.positions.empty()) {
    const int64_t pshape[1] = {r.L};
    s = TensorView::Dense(const_cast<int32_t*>(r.positions.data()), DType::kI32, 1, pshape,
                          &in.positions);
    if (!s.ok()) return s;
  }
  in.causal = r.causal;
  in.need_weights = r.need_weights;
  in.average_attn_weights = r.average;
  AttentionOutputs out;
  res->out.assign(r.N * r.L * E, std::nanf(""));
  s = TensorView::Dense(res->out.data(), DType::kF32, 3, qshape, &out.output);
  if (!s.ok()) return s;
  if (r.need_weights) {
    if (r.average) {
      const int64_t wshape[3] = {r.N, r.L, r.S};
      res->weights.assign(r.N * r.L * r.S, std::nanf(""));
      s = TensorView::Dense(res->weights.data(), DType::kF32, 3, wshape, &out.attn_weights);
    } else {
      const int64_t wshape[4] = {r.N, H, r.L, r.S};
      res->weights.assign(r.N * H * r.L * r.S, std::nanf(""));
      s = TensorView::Dense(res->weights.data(), DType::kF32, 4, wshape, &out.attn_weights);
    }
    if (!s.ok()) return s;
  }
  SetTrace(*ctx, trace);
  return mha->Forward(*ctx, in, out);
}

// The additive mask equivalent to window W: -inf where key j is outside query i's window
// (causal: p_i - W < p_j <= p_i; else |p_i - p_j| < W), with p the positions (self-attention)
// or the indices. Causal itself stays a flag.
std::vector<float> WindowMask(int64_t L, int64_t S, int64_t W, bool causal,
                              const std::vector<int32_t>& positions) {
  std::vector<float> m(L * S, 0.0f);
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j < S; ++j) {
      const int64_t d = positions.empty() ? i - j : int64_t{positions[i]} - positions[j];
      const bool visible = causal ? 0 <= d && d < W : std::abs(d) < W;
      if (!visible) m[i * S + j] = kNegInf;
    }
  }
  return m;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = 1e-5f * std::max(1.0f, std::abs(want[i]));
    if (!(std::abs(got[i] - want[i]) <= tol) && bad++ < 5) {
      ADD_FAILURE() << what << ": [" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
}

void ExpectBitwise(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ < 5) {
      ADD_FAILURE() << what << ": [" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
}

enum class Path { kOnline, kFullRows, kChunked };

std::string Name(Path p) {
  return p == Path::kOnline ? "online" : p == Path::kFullRows ? "full-row" : "key-chunked";
}

// Windowed forward == masked forward without a window, on path `path`.
void CheckWindowEqualsMask(Path path, Problem r, int64_t chunk_keys, uint32_t seed) {
  std::mt19937 rng(seed);
  const Layer layer(&rng);
  const int64_t E = layer.config.embed_dim;
  const std::vector<float> x = test::SymmetricFloats(r.N * r.L * E, 1.0f, &rng);
  const std::vector<float> kv =
      r.cross ? test::SymmetricFloats(r.N * r.S * E, 1.0f, &rng) : std::vector<float>();
  if (!r.cross) r.S = r.L;
  r.need_weights = path == Path::kFullRows;
  const ScopedKeyChunking chunking(path == Path::kChunked ? chunk_keys : 0);
  Problem masked = r;
  masked.window = 0;
  masked.positions.clear();  // a layer without a window takes no positions
  masked.attn_mask = WindowMask(r.L, r.S, r.window, r.causal, r.positions);
  Result got, want;
  const std::string what = Name(path) + " W=" + std::to_string(r.window) +
                           " causal=" + std::to_string(r.causal) + " L=" + std::to_string(r.L) +
                           " S=" + std::to_string(r.S) + " sinks=" + std::to_string(r.sinks) +
                           " average=" + std::to_string(r.average) +
                           " positions=" + std::to_string(!r.positions.empty());
  Status s = Forward(layer, x, kv, r, &got);
  ASSERT_TRUE(s.ok()) << s.ToString() << " " << what;
  s = Forward(layer, x, kv, masked, &want);
  ASSERT_TRUE(s.ok()) << s.ToString() << " " << what;
  ExpectClose(got.out, want.out, what + " output");
  if (r.need_weights) ExpectClose(got.weights, want.weights, what + " weights");
}

const int64_t kWindows[] = {1, 7, 64, 511, 512, 513, 1024, 4096};

TEST(WindowTest, OnlineEqualsMask) {
  for (bool causal : {true, false}) {
    for (int64_t w : kWindows) {
      Problem r;
      r.L = 1100;  // three key blocks of 512
      r.causal = causal;
      r.window = w;
      r.threads = 2;
      CheckWindowEqualsMask(Path::kOnline, r, 0, 1000 + static_cast<uint32_t>(w));
    }
  }
}

TEST(WindowTest, FullRowsEqualsMask) {
  for (bool causal : {true, false}) {
    for (bool average : {true, false}) {
      for (int64_t w : kWindows) {
        Problem r;
        r.N = 2;
        r.L = 600;
        r.causal = causal;
        r.average = average;
        r.window = w;
        r.threads = 2;
        CheckWindowEqualsMask(Path::kFullRows, r, 0, 2000 + static_cast<uint32_t>(w));
      }
    }
  }
}

TEST(WindowTest, KeyChunkedEqualsMask) {
  for (int64_t chunk : {300, 512}) {
    for (bool causal : {true, false}) {
      for (int64_t w : kWindows) {
        Problem r;
        r.L = 1100;
        r.causal = causal;
        r.window = w;
        r.threads = 2;
        CheckWindowEqualsMask(Path::kChunked, r, chunk, 3000 + static_cast<uint32_t>(w));
      }
    }
  }
}

// Cross-attention, more queries than keys: with causal, rows past S + W - 1 see no key at all
// (zeros), and on the key-chunked path their blocks' bands lie past every chunk.
TEST(WindowTest, CrossAttentionEqualsMask) {
  for (Path path : {Path::kOnline, Path::kFullRows, Path::kChunked}) {
    for (bool causal : {true, false}) {
      for (int64_t w : {int64_t{1}, int64_t{40}, int64_t{300}}) {
        Problem r;
        r.cross = true;
        r.L = 700;
        r.S = 150;
        r.causal = causal;
        r.window = w;
        r.threads = 2;
        CheckWindowEqualsMask(path, r, 64, 4000 + static_cast<uint32_t>(w));
        r.L = 150;
        r.S = 700;
        CheckWindowEqualsMask(path, r, 64, 5000 + static_cast<uint32_t>(w));
      }
    }
  }
}

TEST(WindowTest, SinksWithWindowEqualsMask) {
  for (Path path : {Path::kOnline, Path::kFullRows, Path::kChunked}) {
    for (bool causal : {true, false}) {
      for (int64_t w : {int64_t{7}, int64_t{513}}) {
        Problem r;
        r.L = 1100;
        r.causal = causal;
        r.window = w;
        r.sinks = true;
        r.threads = 2;
        CheckWindowEqualsMask(path, r, 300, 6000 + static_cast<uint32_t>(w));
      }
    }
  }
}

// Explicit positions: the window follows them (per element, nothing skipped). Offset positions
// give the index positions' band; packed sequences (positions restarting at 0) and a
// non-monotone order restrict it further.
TEST(WindowTest, ExplicitPositionsEqualMask) {
  for (Path path : {Path::kOnline, Path::kFullRows, Path::kChunked}) {
    for (bool causal : {true, false}) {
      for (int mode = 0; mode < 3; ++mode) {
        Problem r;
        r.L = 700;
        r.causal = causal;
        r.window = 40;
        r.sinks = mode == 1;
        r.threads = 2;
        r.positions.resize(r.L);
        for (int64_t l = 0; l < r.L; ++l) {
          r.positions[l] = static_cast<int32_t>(mode == 0   ? 70000 + l
                                                : mode == 1 ? l % 300
                                                            : (l * 37) % r.L);
        }
        CheckWindowEqualsMask(path, r, 256, 7000 + static_cast<uint32_t>(mode));
      }
    }
  }
}

// Bitwise the same results for 1, 2 and 3 threads (the online path's query blocks follow the
// thread count; a row's key blocks must not).
TEST(WindowTest, BitwiseAcrossThreads) {
  std::mt19937 rng(77);
  const Layer layer(&rng);
  const int64_t E = layer.config.embed_dim;
  for (Path path : {Path::kOnline, Path::kFullRows, Path::kChunked}) {
    for (bool causal : {true, false}) {
      for (int64_t w : {int64_t{7}, int64_t{130}, int64_t{600}}) {
        Problem r;
        r.N = 2;
        r.L = r.S = 1100;
        r.causal = causal;
        r.window = w;
        r.sinks = w == 130;
        r.need_weights = path == Path::kFullRows;
        r.average = false;
        const ScopedKeyChunking chunking(path == Path::kChunked ? 300 : 0);
        const std::vector<float> x = test::SymmetricFloats(r.N * r.L * E, 1.0f, &rng);
        Result base;
        ASSERT_TRUE(Forward(layer, x, {}, r, &base).ok());
        for (size_t threads : {2, 3}) {
          r.threads = threads;
          Result got;
          ASSERT_TRUE(Forward(layer, x, {}, r, &got).ok());
          const std::string what = Name(path) + " W=" + std::to_string(w) +
                                   " causal=" + std::to_string(causal) +
                                   " threads=" + std::to_string(threads);
          ExpectBitwise(got.out, base.out, what + " output");
          ExpectBitwise(got.weights, base.weights, what + " weights");
        }
      }
    }
  }
}

// Sinks against a hand computation in double: one head's softmax over its visible keys plus
// the sink logit (value zero); returned weights omit the sink and sum to less than one.
TEST(WindowTest, SinksMatchDouble) {
  std::mt19937 rng(5);
  const int64_t E = 8, H = 2, KVH = 1, hd = E / H, L = 6;
  const Layer layer(&rng, E, H, KVH);
  const std::vector<float> x = test::SymmetricFloats(L * E, 1.0f, &rng);
  // Projections in double: q [L, E], k and v [L, hd].
  std::vector<double> q(L * E), k(L * hd), v(L * hd);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t o = 0; o < E; ++o) {
      double aq = 0;
      for (int64_t i = 0; i < E; ++i) aq += double(layer.wq[o * E + i]) * x[l * E + i];
      q[l * E + o] = aq;
    }
    for (int64_t o = 0; o < hd; ++o) {
      double ak = 0, av = 0;
      for (int64_t i = 0; i < E; ++i) {
        ak += double(layer.wk[o * E + i]) * x[l * E + i];
        av += double(layer.wv[o * E + i]) * x[l * E + i];
      }
      k[l * hd + o] = ak;
      v[l * hd + o] = av;
    }
  }
  const double scale = 1.0 / std::sqrt(double(hd));
  for (bool causal : {false, true}) {
    for (int64_t w : {int64_t{0}, int64_t{2}}) {
      // Expected per-head weights [H, L, L] and output [L, E].
      std::vector<double> weights(H * L * L, 0.0), concat(L * E, 0.0), out(L * E, 0.0);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < L; ++i) {
          std::vector<double> s(L, -INFINITY);
          double mx = layer.sinks[h];
          for (int64_t j = 0; j < L; ++j) {
            const bool visible =
                (!causal || j <= i) && (w == 0 || (causal ? i - j < w : std::abs(i - j) < w));
            if (!visible) continue;
            double dot = 0;
            for (int64_t c = 0; c < hd; ++c) dot += q[i * E + h * hd + c] * k[j * hd + c];
            s[j] = dot * scale;
            mx = std::max(mx, s[j]);
          }
          double sum = std::exp(double(layer.sinks[h]) - mx);
          for (int64_t j = 0; j < L; ++j) sum += std::exp(s[j] - mx);
          for (int64_t j = 0; j < L; ++j) {
            const double p = std::exp(s[j] - mx) / sum;
            weights[(h * L + i) * L + j] = p;
            for (int64_t c = 0; c < hd; ++c) concat[i * E + h * hd + c] += p * v[j * hd + c];
          }
        }
      }
      for (int64_t i = 0; i < L; ++i) {
        for (int64_t o = 0; o < E; ++o) {
          double a = 0;
          for (int64_t c = 0; c < E; ++c) a += double(layer.wo[o * E + c]) * concat[i * E + c];
          out[i * E + o] = a;
        }
      }
      for (Path path : {Path::kOnline, Path::kFullRows, Path::kChunked}) {
        const ScopedKeyChunking chunking(path == Path::kChunked ? 2 : 0);
        Problem r;
        r.L = r.S = L;
        r.causal = causal;
        r.window = w;
        r.sinks = true;
        r.need_weights = path == Path::kFullRows;
        r.average = false;
        Result got;
        const Status s = Forward(layer, x, {}, r, &got);
        ASSERT_TRUE(s.ok()) << s.ToString();
        const std::string what =
            Name(path) + " causal=" + std::to_string(causal) + " W=" + std::to_string(w);
        for (int64_t i = 0; i < L * E; ++i) {
          EXPECT_NEAR(got.out[i], out[i], 1e-5 * std::max(1.0, std::abs(out[i])))
              << what << " " << i;
        }
        if (r.need_weights) {
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < L; ++i) {
              double row = 0;
              for (int64_t j = 0; j < L; ++j) {
                const int64_t e = (h * L + i) * L + j;
                EXPECT_NEAR(got.weights[e], weights[e], 1e-6) << what << " weight " << e;
                row += got.weights[e];
              }
              EXPECT_LT(row, 1.0) << what << " row " << i;
            }
          }
        }
      }
    }
  }
}

// The windowed online path packs and multiplies only the key blocks that meet the band: with
// W = 64 over 2048 causal keys, a strip runs one or two key blocks; with W >= S every block up
// to its diagonal. Counts the scores events (one per packed key block, one per strip product)
// on one thread, unchunked and key-chunked. The ratio follows the window's key block (one KC
// block of BLIS's configuration, at most kKeyBlock): over 3x with x86's 256 keys, 2.1x on
// aarch64 under qemu, where KC reaches 512; without skipping it would be 1.
TEST(WindowTest, SkipsBlocksBeforeTheBand) {
  std::mt19937 rng(9);
  const Layer layer(&rng, 16, 1, 1);
  Problem r;
  r.L = r.S = 2048;
  r.causal = true;
  const std::vector<float> x = test::SymmetricFloats(r.L * 16, 1.0f, &rng);
  for (int64_t chunk : {0, 256}) {
    const ScopedKeyChunking chunking(chunk);
    auto count_scores = [&](int64_t window) {
      TraceRecorder trace(1 << 16);
      Problem run = r;
      run.window = window;
      Result res;
      EXPECT_TRUE(Forward(layer, x, {}, run, &res, &trace).ok());
      EXPECT_EQ(trace.dropped.load(), 0u);
      size_t scores = 0;
      for (size_t i = 0; i < trace.size(); ++i) {
        if (trace.events[i].stage == Stage::kScores) ++scores;
      }
      return scores;
    };
    const size_t whole = count_scores(4096);
    const size_t banded = count_scores(64);
    EXPECT_LT(banded * 2, whole) << "chunk " << chunk << ", W = 64: " << banded
                                 << ", W >= S: " << whole;
  }
}

}  // namespace
}  // namespace mha
