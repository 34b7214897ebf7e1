// The operator's QK-norm and RoPE pass (runtime/qk_transform.h) where it runs: Project's q and
// k, and the keys every forward path hands on (full rows, online, key-chunked), against the
// plain projections transformed by hand in double; bitwise the same for any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/attention_impl.h"
#include "tests/attention_test_util.h"

namespace mha {
namespace {

using testing_util::Problem;

struct Variant {
  RopeStyle rope = RopeStyle::kNeox;
  int64_t rotary_dim = 0;
  float theta = 0.0f, scale = 0.0f;
  bool norm = true, whole = false;
  float eps = 0.0f;
};

// A problem with its layer's variant weights (QK-norm weights random around 1).
struct Case {
  Problem p;
  Variant var;
  std::vector<float> q_norm, k_norm;
  std::vector<int32_t> positions, key_positions;  // [N, L], [N, S]; empty = default
};

Case MakeCase(const Variant& var, bool self, int64_t kv_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c;
  c.var = var;
  Problem& p = c.p;
  p.config.embed_dim = 24;
  p.config.num_heads = 3;  // head_dim 8
  p.config.num_kv_heads = kv_heads;
  p.config.batch_first = true;
  p.packed = kv_heads == 3;
  p.N = 2;
  p.L = 6;
  p.S = self ? 6 : 9;
  p.self_attention = self;
  testing_util::FillProblem(&p, &rng);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  const int64_t hd = 8, kvE = kv_heads * hd;
  c.q_norm.resize(var.whole ? 24 : hd);
  c.k_norm.resize(var.whole ? kvE : hd);
  for (float& x : c.q_norm) x = u(rng);
  for (float& x : c.k_norm) x = u(rng);
  std::uniform_int_distribution<int32_t> pos(0, 5000);
  c.positions.resize(p.N * p.L);
  for (int32_t& x : c.positions) x = pos(rng);
  if (!self) {
    c.key_positions.resize(p.N * p.S);
    for (int32_t& x : c.key_positions) x = pos(rng);
  }
  return c;
}

std::unique_ptr<MultiheadAttention> CreateLayer(const Case& c, bool variants) {
  AttentionConfig cfg = c.p.config;
  AttentionWeights w = testing_util::WeightsOf(c.p);
  if (variants) {
    cfg.rope = c.var.rope;
    cfg.rotary_dim = c.var.rotary_dim;
    cfg.rope_theta = c.var.theta;
    cfg.rope_scale = c.var.scale;
    cfg.qk_norm_whole = c.var.whole;
    cfg.qk_norm_eps = c.var.eps;
    if (c.var.norm) {
      w.q_norm_weight = c.q_norm.data();
      w.k_norm_weight = c.k_norm.data();
    }
  }
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::Create(cfg, w, c.p.binding, &layer);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return layer;
}

void AddPositions(Case& c, AttentionInputs* in) {
  const int64_t qs[2] = {c.p.N, c.p.L}, ks[2] = {c.p.N, c.p.S};
  ASSERT_TRUE(TensorView::Dense(c.positions.data(), DType::kI32, 2, qs, &in->positions).ok());
  if (!c.key_positions.empty()) {
    ASSERT_TRUE(
        TensorView::Dense(c.key_positions.data(), DType::kI32, 2, ks, &in->key_positions).ok());
  }
}

// One token's heads [heads * hd] transformed in double: RMSNorm (per head, or whole), then
// RoPE at position pos, as the README states them.
std::vector<double> Transform(const Case& c, std::vector<double> x, bool is_key, int64_t pos) {
  const int64_t hd = 8, heads = static_cast<int64_t>(x.size()) / hd;
  const Variant& var = c.var;
  if (var.norm) {
    const std::vector<float>& w = is_key ? c.k_norm : c.q_norm;
    const double eps = var.eps > 0 ? var.eps : 1e-6;
    const int64_t group = var.whole ? heads * hd : hd;
    for (int64_t g0 = 0; g0 < heads * hd; g0 += group) {
      double ss = 0;
      for (int64_t i = 0; i < group; ++i) ss += x[g0 + i] * x[g0 + i];
      const double f = 1.0 / std::sqrt(ss / group + eps);
      for (int64_t i = 0; i < group; ++i) x[g0 + i] *= f * w[var.whole ? g0 + i : i];
    }
  }
  if (var.rope == RopeStyle::kNone) return x;
  const int64_t rd = var.rotary_dim ? var.rotary_dim : hd;
  const double theta = var.theta > 0 ? var.theta : 10000.0;
  const double scale = var.scale > 0 ? var.scale : 1.0;
  for (int64_t h = 0; h < heads; ++h) {
    double* y = x.data() + h * hd;
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double angle = pos / scale * std::pow(theta, -2.0 * i / rd);
      const int64_t a = var.rope == RopeStyle::kGptj ? 2 * i : i;
      const int64_t b = var.rope == RopeStyle::kGptj ? 2 * i + 1 : i + rd / 2;
      const double ya = y[a], yb = y[b];
      y[a] = ya * std::cos(angle) - yb * std::sin(angle);
      y[b] = yb * std::cos(angle) + ya * std::sin(angle);
    }
  }
  return x;
}

// Project's per-head tensors [N, heads, rows_total, hd] for a case.
struct Projected {
  std::vector<float> q, k, v;
  ProjectionOutputs out;
};
void MakeProjected(const Problem& p, Projected* pr) {
  const int64_t H = 3, KVH = p.config.num_kv_heads ? p.config.num_kv_heads : 3, hd = 8;
  pr->q.assign(p.N * H * p.L * hd, NAN);
  pr->k.assign(p.N * KVH * p.S * hd, NAN);
  pr->v.assign(pr->k.size(), NAN);
  const int64_t qs[4] = {p.N, H, p.L, hd}, ks[4] = {p.N, KVH, p.S, hd};
  ASSERT_TRUE(TensorView::Dense(pr->q.data(), DType::kF32, 4, qs, &pr->out.q).ok());
  ASSERT_TRUE(TensorView::Dense(pr->k.data(), DType::kF32, 4, ks, &pr->out.k).ok());
  ASSERT_TRUE(TensorView::Dense(pr->v.data(), DType::kF32, 4, ks, &pr->out.v).ok());
}

// Token t of batch entry n of a [N, heads, T, hd] tensor as one row [heads * hd] in double.
std::vector<double> TokenRow(const std::vector<float>& x, int64_t heads, int64_t T, int64_t n,
                             int64_t t) {
  std::vector<double> row(heads * 8);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t d = 0; d < 8; ++d) row[h * 8 + d] = x[((n * heads + h) * T + t) * 8 + d];
  return row;
}

std::vector<Variant> Variants() {
  std::vector<Variant> vs(4);
  vs[0].norm = false;  // RoPE only, neox
  vs[1].rope = RopeStyle::kGptj;
  vs[1].rotary_dim = 6;
  vs[1].theta = 500.0f;
  vs[1].scale = 2.0f;
  vs[1].eps = 1e-5f;
  vs[2].rotary_dim = 4;  // per-head norm, partial neox
  vs[3].whole = true;    // QK-norm over the whole projection, no RoPE
  vs[3].rope = RopeStyle::kNone;
  return vs;
}

// A case's layers (plain and with the variants), views, the inputs with positions, and the
// plain layer's Project outputs (`base`), to be transformed by hand.
struct CaseLayers {
  std::unique_ptr<MultiheadAttention> plain, layer;
  testing_util::Views v;
  AttentionInputs in;
  Projected base;
};
void MakeCaseLayers(Case& c, CaseLayers* s) {
  s->plain = CreateLayer(c, false);
  s->layer = CreateLayer(c, true);
  ASSERT_NE(s->layer, nullptr);
  testing_util::MakeViews(c.p, &s->v);
  s->in = s->v.in;
  if (c.var.rope != RopeStyle::kNone) AddPositions(c, &s->in);
  MakeProjected(c.p, &s->base);
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  ASSERT_TRUE(s->plain->Project(*ctx, s->v.in, s->base.out).ok());
}

// Token t of entry n of q (is_key false) or k, transformed by hand from the plain projection.
std::vector<double> Expected(const Case& c, const Projected& base, bool is_key, int64_t n,
                             int64_t t) {
  const Problem& p = c.p;
  int64_t pos = t;
  if (c.var.rope != RopeStyle::kNone) {
    pos = !is_key || p.self_attention ? c.positions[n * p.L + t] : c.key_positions[n * p.S + t];
  }
  const int64_t heads = is_key ? (p.config.num_kv_heads ? p.config.num_kv_heads : 3) : 3;
  return Transform(c, TokenRow(is_key ? base.k : base.q, heads, is_key ? p.S : p.L, n, t), is_key,
                   pos);
}

TEST(QkTransformTest, ProjectReturnsTransformedQAndK) {
  uint32_t seed = 1;
  const std::vector<Variant> variants = Variants();
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    for (const int64_t kv_heads : {int64_t{3}, int64_t{1}}) {
      for (const bool self : {true, false}) {
        Case c = MakeCase(variants[vi], self, kv_heads, seed++);
        CaseLayers su;
        MakeCaseLayers(c, &su);
        if (HasFatalFailure()) return;
        Projected got, got1;
        MakeProjected(c.p, &got);
        MakeProjected(c.p, &got1);
        std::unique_ptr<Context> ctx3, ctx1;
        ContextOptions o;
        o.num_threads = 3;
        ASSERT_TRUE(Context::Create(o, &ctx3).ok());
        o.num_threads = 1;
        ASSERT_TRUE(Context::Create(o, &ctx1).ok());
        const Status s = su.layer->Project(*ctx3, su.in, got.out);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ASSERT_TRUE(su.layer->Project(*ctx1, su.in, got1.out).ok());
        EXPECT_EQ(0, std::memcmp(got.q.data(), got1.q.data(), got.q.size() * 4));
        EXPECT_EQ(0, std::memcmp(got.k.data(), got1.k.data(), got.k.size() * 4));
        EXPECT_EQ(0, std::memcmp(got.v.data(), su.base.v.data(), got.v.size() * 4));
        const Problem& p = c.p;
        for (int64_t n = 0; n < p.N; ++n) {
          for (const bool is_key : {false, true}) {
            const int64_t T = is_key ? p.S : p.L, heads = is_key ? kv_heads : 3;
            for (int64_t t = 0; t < T; ++t) {
              const std::vector<double> want = Expected(c, su.base, is_key, n, t);
              const std::vector<double> have = TokenRow(is_key ? got.k : got.q, heads, T, n, t);
              for (size_t i = 0; i < want.size(); ++i) {
                ASSERT_NEAR(have[i], want[i], 2e-5 * (1 + std::abs(want[i])))
                    << "variant " << vi << " key " << is_key << " n " << n << " t " << t << " i "
                    << i << " " << p.Describe();
              }
            }
          }
        }
      }
    }
  }
}

// What a forward hands its KV sink: K after the transform, on every path.
struct SinkCapture {
  int64_t N = 0, S = 0, kvE = 0;
  std::vector<float> k;  // [N, S, kvE]
};
void Capture(void* user, Context&, const ProjectedKv& kv) {
  SinkCapture* c = static_cast<SinkCapture*>(user);
  for (int64_t n = 0; n < c->N; ++n)
    for (int64_t p = kv.begin; p < kv.end; ++p)
      std::memcpy(c->k.data() + (n * c->S + p) * c->kvE,
                  kv.k + n * kv.batch_stride + (p - kv.begin) * kv.token_stride,
                  c->kvE * sizeof(float));
}

TEST(QkTransformTest, ForwardPathsHandOnTransformedKeys) {
  uint32_t seed = 100;
  const std::vector<Variant> variants = Variants();
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    for (const int64_t chunk : {int64_t{0}, int64_t{4}}) {
      testing_util::ScopedKeyChunking chunking(chunk);
      for (const bool self : {true, false}) {
        for (const bool weights : {false, true}) {
          Case c = MakeCase(variants[vi], self, 1, seed++);
          c.p.need_weights = weights;
          CaseLayers su;
          MakeCaseLayers(c, &su);
          if (HasFatalFailure()) return;
          SinkCapture cap;
          cap.N = c.p.N;
          cap.S = c.p.S;
          cap.kvE = 8;
          cap.k.assign(cap.N * cap.S * cap.kvE, NAN);
          std::unique_ptr<Context> ctx;
          ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
          const Status s = ForwardWithKvSink(*su.layer, *ctx, su.in, su.v.out, Capture, &cap);
          ASSERT_TRUE(s.ok()) << s.ToString();
          for (int64_t n = 0; n < c.p.N; ++n) {
            for (int64_t t = 0; t < c.p.S; ++t) {
              const std::vector<double> want = Expected(c, su.base, true, n, t);
              for (int64_t i = 0; i < 8; ++i) {
                ASSERT_NEAR(cap.k[(n * c.p.S + t) * 8 + i], want[i], 2e-5 * (1 + std::abs(want[i])))
                    << "variant " << vi << " chunk " << chunk << " self " << self << " weights "
                    << weights << " n " << n << " t " << t << " i " << i;
              }
            }
          }
        }
      }
    }
  }
}

// Positions as i64 or i32, and [L] shared by the batch or repeated per entry [N, L], are the
// same positions: the same bits.
TEST(QkTransformTest, PositionDtypesAndBroadcastAgree) {
  Variant var;
  var.rotary_dim = 6;
  Case c = MakeCase(var, /*self=*/false, 3, 7);
  const auto layer = CreateLayer(c, true);
  ASSERT_NE(layer, nullptr);
  testing_util::Views v;
  testing_util::MakeViews(c.p, &v);
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  const int64_t N = c.p.N, L = c.p.L, S = c.p.S;
  // Every entry gets entry 0's positions.
  std::vector<int32_t> q32(N * L), k32(N * S);
  std::vector<int64_t> q64(L), k64(S);
  for (int64_t i = 0; i < N * L; ++i) q32[i] = c.positions[i % L];
  for (int64_t i = 0; i < N * S; ++i) k32[i] = c.key_positions[i % S];
  for (int64_t i = 0; i < L; ++i) q64[i] = c.positions[i];
  for (int64_t i = 0; i < S; ++i) k64[i] = c.key_positions[i];
  const int64_t qs[2] = {N, L}, ks[2] = {N, S};
  AttentionInputs full = v.in, shared = v.in;
  ASSERT_TRUE(TensorView::Dense(q32.data(), DType::kI32, 2, qs, &full.positions).ok());
  ASSERT_TRUE(TensorView::Dense(k32.data(), DType::kI32, 2, ks, &full.key_positions).ok());
  ASSERT_TRUE(TensorView::Dense(q64.data(), DType::kI64, 1, qs + 1, &shared.positions).ok());
  ASSERT_TRUE(TensorView::Dense(k64.data(), DType::kI64, 1, ks + 1, &shared.key_positions).ok());
  ASSERT_TRUE(layer->Forward(*ctx, full, v.out).ok());
  const std::vector<float> want = v.output;
  ASSERT_TRUE(layer->Forward(*ctx, shared, v.out).ok());
  EXPECT_EQ(0, std::memcmp(v.output.data(), want.data(), want.size() * sizeof(float)));
}

}  // namespace
}  // namespace mha
