#include "tests/attention_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "kernels/gemm_route.h"
#include "mha/kv_cache.hpp"
#include "tests/random_util.h"

namespace mha {
namespace testing_util {

int64_t Pick(std::mt19937* rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(*rng);
}

bool Coin(std::mt19937* rng, double p) { return std::bernoulli_distribution(p)(*rng); }

namespace {

// Strides (elements) of an input of `tokens` tokens with `features` features (+ pad).
void SeqStrides(const Problem& p, int64_t tokens, int64_t features, int64_t* sN, int64_t* sT) {
  const int64_t row = features + p.row_pad;
  if (!p.batched) {
    *sN = 0;
    *sT = row;
  } else if (p.config.batch_first) {
    *sT = row;
    *sN = tokens * row;
  } else {
    *sN = row;
    *sT = p.N * row;
  }
}

std::vector<float> RandomSeq(const Problem& p, int64_t tokens, int64_t features,
                             std::mt19937* rng) {
  int64_t sN, sT;
  SeqStrides(p, tokens, features, &sN, &sT);
  const size_t n = static_cast<size_t>(p.N * tokens * (features + p.row_pad));
  std::vector<float> v = test::SymmetricFloats(n, 1.0f, rng);
  return v;
}

// Dense batch-first doubles [N, T, F] of a sequence stored in the problem's layout.
std::vector<double> ToBatchFirst(const Problem& p, const std::vector<float>& x, int64_t tokens,
                                 int64_t features) {
  int64_t sN, sT;
  SeqStrides(p, tokens, features, &sN, &sT);
  std::vector<double> out(p.N * tokens * features);
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t f = 0; f < features; ++f)
        out[(n * tokens + t) * features + f] = x[n * sN + t * sT + f];
  return out;
}

std::vector<double> D(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace

std::string Problem::Describe() const {
  std::ostringstream os;
  os << "E=" << config.embed_dim << " H=" << config.num_heads << " KVH=" << config.num_kv_heads
     << " qd=" << config.q_dim << " kd=" << config.kdim << " vd=" << config.vdim
     << " bias=" << config.bias << " bias_projections=" << config.bias_projections
     << " head_dim=" << config.head_dim << " bias_kv=" << config.add_bias_kv
     << " zero_attn=" << config.add_zero_attn << " batch_first=" << config.batch_first
     << " packed=" << packed << " layout=" << static_cast<int>(layout)
     << " copy=" << (binding == WeightBinding::kCopy) << " batched=" << batched
     << " self=" << self_attention << " N=" << N << " L=" << L << " S=" << S
     << " attn=" << static_cast<int>(attn) << (attn_3d ? "(3d)" : "")
     << " kpm=" << static_cast<int>(kpm) << " causal=" << causal << " weights=" << need_weights
     << " avg=" << average << " pad=" << row_pad
     << " prepack=" << static_cast<int>(config.prepack);
  if (config.weight_dtype != DType::kF32) os << " weight_dtype=" << DTypeName(config.weight_dtype);
  if (config.rope != RopeStyle::kNone) {
    os << " rope=" << static_cast<int>(config.rope) << " theta=" << config.rope_theta
       << " rd=" << config.rotary_dim << " rope_scale=" << config.rope_scale;
    if (config.rope_scaling != RopeScaling::kNone) {
      os << " rope_scaling=" << static_cast<int>(config.rope_scaling)
         << " factor=" << config.rope_factor << " original=" << config.rope_original_max_positions;
    }
  }
  if (config.alibi) os << " alibi" << (alibi_slopes.empty() ? "" : "(slopes)");
  if (config.window) os << " window=" << config.window;
  if (config.softcap > 0) os << " softcap=" << config.softcap;
  if (!sinks.empty()) os << " sinks";
  if (!q_norm.empty()) {
    os << " qk_norm(eps=" << config.qk_norm_eps << (config.qk_norm_whole ? ", whole)" : ")");
  }
  auto list = [&os](const char* name, const std::vector<int64_t>& v) {
    if (v.empty()) return;
    os << " " << name << "=[";
    for (size_t i = 0; i < v.size() && i < 12; ++i) os << (i ? "," : "") << v[i];
    os << (v.size() > 12 ? ",...]" : "]");
  };
  list(positions_shared ? "positions[L]" : "positions", positions);
  list("key_positions", key_positions);
  if (!positions.empty() || !key_positions.empty()) os << " " << DTypeName(pos_dtype);
  return os.str();
}

void FillProblem(Problem* pp, std::mt19937* rng) {
  Problem& p = *pp;
  const AttentionConfig& c = p.config;
  const int64_t D = c.embed_dim, H = c.num_heads;
  const int64_t KVH = c.num_kv_heads ? c.num_kv_heads : H;
  const int64_t hd = c.head_dim ? c.head_dim : D / H, E = H * hd, kvE = KVH * hd;
  const int64_t qd = c.q_dim ? c.q_dim : D, kd = c.kdim ? c.kdim : D, vd = c.vdim ? c.vdim : D;
  const float ws = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(qd, 1)));
  if (p.packed) {
    p.in_proj_w = test::SymmetricFloats(3 * E * qd, ws, rng);
  } else {
    p.wq = test::SymmetricFloats(E * qd, ws, rng);
    p.wk = test::SymmetricFloats(kvE * kd, 1.0f / std::sqrt(static_cast<float>(kd)), rng);
    p.wv = test::SymmetricFloats(kvE * vd, 1.0f / std::sqrt(static_cast<float>(vd)), rng);
  }
  // Per-projection biases (bias_projections) are separate arrays; else one in_proj_bias.
  const uint32_t biases = c.bias_projections;
  p.bq.clear();
  p.bk.clear();
  p.bv.clear();
  if (biases != 0) {
    if (biases & kBiasQ) p.bq = test::SymmetricFloats(E, 0.5f, rng);
    if (biases & kBiasK) p.bk = test::SymmetricFloats(kvE, 0.5f, rng);
    if (biases & kBiasV) p.bv = test::SymmetricFloats(kvE, 0.5f, rng);
  } else if (c.bias) {
    p.in_proj_b = test::SymmetricFloats(E + 2 * kvE, 0.5f, rng);
  }
  if (c.add_bias_kv) {
    p.bias_k = test::SymmetricFloats(kvE, 1.0f, rng);
    p.bias_v = test::SymmetricFloats(kvE, 1.0f, rng);
  }
  p.wo = test::SymmetricFloats(D * E, 1.0f / std::sqrt(static_cast<float>(E)), rng);
  p.bo.clear();
  if (biases != 0 ? (biases & kBiasOut) != 0 : c.bias) p.bo = test::SymmetricFloats(D, 0.5f, rng);

  p.query = RandomSeq(p, p.L, qd, rng);
  if (!p.self_attention) {
    p.key = RandomSeq(p, p.S, kd, rng);
    p.value = RandomSeq(p, p.S, vd, rng);
  }
  const int64_t slices = p.attn_3d ? p.N * H : 1;
  if (p.attn == MaskChoice::kFloat) {
    p.attn_mask_f = test::SymmetricFloats(slices * p.L * p.S, 2.0f, rng);
    for (float& x : p.attn_mask_f) {
      if (Coin(rng, 0.15)) x = -std::numeric_limits<float>::infinity();
    }
  } else if (p.attn == MaskChoice::kBool) {
    p.attn_mask_b.resize(slices * p.L * p.S);
    for (auto& x : p.attn_mask_b) x = Coin(rng, 0.3) ? 1 : 0;
    // Sometimes a fully masked query row.
    if (Coin(rng, 0.3)) {
      const int64_t l = Pick(rng, 0, p.L - 1);
      for (int64_t s = 0; s < p.S; ++s) p.attn_mask_b[l * p.S + s] = 1;
    }
  }
  if (p.kpm == MaskChoice::kFloat) {
    p.kpm_f = test::SymmetricFloats(p.N * p.S, 2.0f, rng);
  } else if (p.kpm == MaskChoice::kBool) {
    p.kpm_b.resize(p.N * p.S);
    for (auto& x : p.kpm_b) x = Coin(rng, 0.25) ? 1 : 0;
    if (Coin(rng, 0.2)) {
      for (int64_t s = 0; s < p.S; ++s) p.kpm_b[s] = 1;  // batch 0 fully padded
    }
  }
}

Problem RandomProblem(std::mt19937* rng, int64_t max_len) {
  Problem p;
  AttentionConfig& c = p.config;
  const int64_t H = Pick(rng, 1, 4);
  const int64_t hd = Coin(rng, 0.15) ? 1 : Pick(rng, 1, 8);
  c.num_heads = H;
  c.embed_dim = H * hd;
  // Grouped-query attention for some separate-weight problems.
  p.packed = Coin(rng, 0.6);
  if (!p.packed && Coin(rng, 0.3)) {
    int64_t kvh = Pick(rng, 1, H);
    while (H % kvh) --kvh;
    c.num_kv_heads = kvh;
  }
  if (!p.packed) {
    c.q_dim = Coin(rng) ? 0 : Pick(rng, 1, 11);
    c.kdim = Coin(rng) ? 0 : Pick(rng, 1, 11);
    c.vdim = Coin(rng) ? 0 : Pick(rng, 1, 11);
  }
  p.layout = p.packed && Coin(rng, 0.3) ? QkvLayout::kPerHead : QkvLayout::kPyTorch;
  p.binding = Coin(rng, 0.3) ? WeightBinding::kCopy : WeightBinding::kView;
  c.bias = Coin(rng, 0.8);
  c.add_bias_kv = Coin(rng, 0.2);
  c.add_zero_attn = Coin(rng, 0.2);
  c.batch_first = Coin(rng);
  p.batched = Coin(rng, 0.8);
  p.N = p.batched ? Pick(rng, 1, 3) : 1;
  p.L = Coin(rng, 0.15) ? 1 : Pick(rng, 1, max_len);
  const int64_t qd = c.q_dim ? c.q_dim : c.embed_dim;
  const int64_t kd = c.kdim ? c.kdim : c.embed_dim;
  const int64_t vd = c.vdim ? c.vdim : c.embed_dim;
  p.self_attention = qd == kd && kd == vd && Coin(rng, 0.4);
  p.S = p.self_attention ? p.L : (Coin(rng, 0.15) ? 1 : Pick(rng, 1, max_len));
  const int mask_pick = static_cast<int>(Pick(rng, 0, 4));
  p.attn = mask_pick == 1 ? MaskChoice::kBool : mask_pick == 2 ? MaskChoice::kFloat : MaskChoice::kNone;
  p.attn_3d = p.attn != MaskChoice::kNone && Coin(rng, 0.3);
  const int kpm_pick = static_cast<int>(Pick(rng, 0, 3));
  p.kpm = kpm_pick == 1 ? MaskChoice::kBool : kpm_pick == 2 ? MaskChoice::kFloat : MaskChoice::kNone;
  p.causal = Coin(rng, 0.3);
  p.need_weights = Coin(rng, 0.5);
  p.average = Coin(rng);
  p.row_pad = Coin(rng, 0.2) ? Pick(rng, 1, 3) : 0;
  FillProblem(&p, rng);
  // Drawn last so that the problems above stay those of the earlier suites.
  c.prepack = Coin(rng, 0.3) ? WeightPrepack::kOff : WeightPrepack::kOn;
  // About a fifth of the packed ones opt into Strassen, chosen without another draw so that the
  // random stream (and every later problem of the suites) stays as it was.
  if (c.prepack == WeightPrepack::kOn && (p.L + p.S) % 5 == 0) c.prepack = WeightPrepack::kStrassen;
  return p;
}

AttentionWeights SeparateWeights::View() const {
  AttentionWeights w;
  w.q_proj_weight = q.data();
  w.k_proj_weight = k.data();
  w.v_proj_weight = v.data();
  w.out_proj_weight = out.data();
  w.in_proj_bias = in_bias.empty() ? nullptr : in_bias.data();
  w.out_proj_bias = out_bias.empty() ? nullptr : out_bias.data();
  return w;
}

AttentionConfig LlamaLikeConfig(int64_t E, int64_t H, int64_t KVH) {
  AttentionConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  c.num_kv_heads = KVH;
  c.bias = false;
  c.batch_first = true;
  c.rope = RopeStyle::kNeox;
  return c;
}

AttentionWeights WeightsOf(const Problem& p) {
  AttentionWeights w;
  if (p.packed) {
    w.in_proj_weight = p.in_proj_w.data();
    w.qkv_layout = p.layout;
  } else {
    w.q_proj_weight = p.wq.data();
    w.k_proj_weight = p.wk.data();
    w.v_proj_weight = p.wv.data();
  }
  if (p.config.bias_projections != 0) {
    if (!p.bq.empty()) w.q_proj_bias = p.bq.data();
    if (!p.bk.empty()) w.k_proj_bias = p.bk.data();
    if (!p.bv.empty()) w.v_proj_bias = p.bv.data();
  } else if (p.config.bias) {
    w.in_proj_bias = p.in_proj_b.data();
  }
  if (!p.bo.empty()) w.out_proj_bias = p.bo.data();
  if (p.config.add_bias_kv) {
    w.bias_k = p.bias_k.data();
    w.bias_v = p.bias_v.data();
  }
  w.out_proj_weight = p.wo.data();
  if (!p.sinks.empty()) w.sinks = p.sinks.data();
  if (!p.alibi_slopes.empty()) w.alibi_slopes = p.alibi_slopes.data();
  if (!p.q_norm.empty()) w.q_norm_weight = p.q_norm.data();
  if (!p.k_norm.empty()) w.k_norm_weight = p.k_norm.data();
  if (!p.rope_short_factor.empty()) w.rope_short_factor = p.rope_short_factor.data();
  if (!p.rope_long_factor.empty()) w.rope_long_factor = p.rope_long_factor.data();
  return w;
}

void RunReference(const Problem& p, reference::Outputs* out) {
  const AttentionConfig& c = p.config;
  const int64_t Dm = c.embed_dim, H = c.num_heads;
  const int64_t KVH = c.num_kv_heads ? c.num_kv_heads : H;
  const int64_t hd = c.head_dim ? c.head_dim : Dm / H, E = H * hd, kvE = KVH * hd;
  const int64_t qd = c.q_dim ? c.q_dim : Dm, kd = c.kdim ? c.kdim : Dm, vd = c.vdim ? c.vdim : Dm;
  reference::Config rc;
  rc.embed_dim = Dm;
  rc.head_dim = hd;
  rc.num_heads = H;
  rc.num_kv_heads = KVH;
  rc.q_dim = qd;
  rc.kdim = kd;
  rc.vdim = vd;
  rc.bias = c.bias;
  rc.add_bias_kv = c.add_bias_kv;
  rc.add_zero_attn = c.add_zero_attn;
  rc.causal = p.causal;
  rc.scale = c.scale;
  rc.rope = c.rope == RopeStyle::kNeox   ? reference::Rope::kNeox
            : c.rope == RopeStyle::kGptj ? reference::Rope::kGptj
                                         : reference::Rope::kNone;
  rc.rope_theta = c.rope_theta;
  rc.rotary_dim = c.rotary_dim;
  rc.rope_scale = c.rope_scale;
  rc.rope_inv_freq = p.ref_rope_inv_freq;
  rc.rope_attention = p.ref_rope_attention;
  rc.alibi = c.alibi;
  rc.alibi_slopes = D(p.alibi_slopes);
  rc.window = c.window;
  rc.softcap = c.softcap;
  rc.sinks = D(p.sinks);
  rc.q_norm = D(p.q_norm);
  rc.k_norm = D(p.k_norm);
  rc.qk_norm_whole = c.qk_norm_whole;
  rc.qk_norm_eps = c.qk_norm_eps;
  reference::Weights w;
  std::vector<double> bias(E + 2 * kvE, 0.0);
  if (c.bias && c.bias_projections == 0) bias = D(p.in_proj_b);
  if (p.packed) {
    // Bring the per-head interleaved rows into q, k, v order.
    std::vector<double> rows(3 * E * qd);
    std::vector<double> brows(3 * E);
    for (int64_t r = 0; r < 3 * E; ++r) {
      int64_t src = r;
      if (p.layout == QkvLayout::kPerHead) {
        const int64_t part = r / E, h = (r % E) / hd, d = r % hd;
        src = (h * 3 + part) * hd + d;
      }
      for (int64_t i = 0; i < qd; ++i) rows[r * qd + i] = p.in_proj_w[src * qd + i];
      brows[r] = bias[src];
    }
    w.wq.assign(rows.begin(), rows.begin() + E * qd);
    w.wk.assign(rows.begin() + E * qd, rows.begin() + 2 * E * qd);
    w.wv.assign(rows.begin() + 2 * E * qd, rows.end());
    bias = brows;
  } else {
    w.wq = D(p.wq);
    w.wk = D(p.wk);
    w.wv = D(p.wv);
  }
  if (c.bias_projections != 0) {
    w.bq = D(p.bq);
    w.bk = D(p.bk);
    w.bv = D(p.bv);
  } else if (c.bias) {
    w.bq.assign(bias.begin(), bias.begin() + E);
    w.bk.assign(bias.begin() + E, bias.begin() + E + kvE);
    w.bv.assign(bias.begin() + E + kvE, bias.end());
  }
  w.bo = D(p.bo);
  w.wo = D(p.wo);
  if (c.add_bias_kv) {
    w.bias_k = D(p.bias_k);
    w.bias_v = D(p.bias_v);
  }
  reference::Inputs in;
  in.batch = p.N;
  in.tgt_len = p.L;
  in.src_len = p.S;
  in.query = ToBatchFirst(p, p.query, p.L, qd);
  in.key = p.self_attention ? in.query : ToBatchFirst(p, p.key, p.S, kd);
  in.value = p.self_attention ? in.query : ToBatchFirst(p, p.value, p.S, vd);
  if (p.attn == MaskChoice::kFloat) {
    in.attn_mask_kind = reference::MaskKind::kFloat;
    in.attn_mask = D(p.attn_mask_f);
  } else if (p.attn == MaskChoice::kBool) {
    in.attn_mask_kind = reference::MaskKind::kBool;
    in.attn_mask.assign(p.attn_mask_b.begin(), p.attn_mask_b.end());
  }
  in.attn_mask_3d = p.attn_3d;
  if (p.kpm == MaskChoice::kFloat) {
    in.key_padding_mask_kind = reference::MaskKind::kFloat;
    in.key_padding_mask = D(p.kpm_f);
  } else if (p.kpm == MaskChoice::kBool) {
    in.key_padding_mask_kind = reference::MaskKind::kBool;
    in.key_padding_mask.assign(p.kpm_b.begin(), p.kpm_b.end());
  }
  in.self_attention = p.self_attention;
  if (!p.positions.empty()) {
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t l = 0; l < p.L; ++l)
        in.positions.push_back(p.positions[(p.positions_shared ? 0 : n * p.L) + l]);
  }
  in.key_positions = p.key_positions;
  reference::Attention(rc, w, in, out);
}

void MakeViews(const Problem& p, Views* v) {
  const AttentionConfig& c = p.config;
  const int64_t E = c.embed_dim, H = c.num_heads;
  const int64_t qd = c.q_dim ? c.q_dim : E, kd = c.kdim ? c.kdim : E, vd = c.vdim ? c.vdim : E;
  auto seq_view = [&](const std::vector<float>& data, int64_t tokens, int64_t features) {
    int64_t sN, sT;
    SeqStrides(p, tokens, features, &sN, &sT);
    TensorView t;
    if (!p.batched) {
      const int64_t shape[2] = {tokens, features};
      const int64_t strides[2] = {sT, 1};
      EXPECT_TRUE(
          TensorView::Strided(const_cast<float*>(data.data()), DType::kF32, 2, shape, strides, &t)
              .ok());
    } else if (c.batch_first) {
      const int64_t shape[3] = {p.N, tokens, features};
      const int64_t strides[3] = {sN, sT, 1};
      EXPECT_TRUE(
          TensorView::Strided(const_cast<float*>(data.data()), DType::kF32, 3, shape, strides, &t)
              .ok());
    } else {
      const int64_t shape[3] = {tokens, p.N, features};
      const int64_t strides[3] = {sT, sN, 1};
      EXPECT_TRUE(
          TensorView::Strided(const_cast<float*>(data.data()), DType::kF32, 3, shape, strides, &t)
              .ok());
    }
    return t;
  };
  v->in = AttentionInputs();
  v->in.query = seq_view(p.query, p.L, qd);
  if (!p.self_attention) {
    v->in.key = seq_view(p.key, p.S, kd);
    v->in.value = seq_view(p.value, p.S, vd);
  }
  const int64_t slices = p.attn_3d ? p.N * H : 1;
  if (p.attn != MaskChoice::kNone) {
    const bool f = p.attn == MaskChoice::kFloat;
    void* data = f ? static_cast<void*>(const_cast<float*>(p.attn_mask_f.data()))
                   : static_cast<void*>(const_cast<uint8_t*>(p.attn_mask_b.data()));
    const int64_t shape3[3] = {slices, p.L, p.S};
    EXPECT_TRUE(TensorView::Dense(data, f ? DType::kF32 : DType::kBool, p.attn_3d ? 3 : 2,
                                  p.attn_3d ? shape3 : shape3 + 1, &v->in.attn_mask)
                    .ok());
  }
  if (p.kpm != MaskChoice::kNone) {
    const bool f = p.kpm == MaskChoice::kFloat;
    void* data = f ? static_cast<void*>(const_cast<float*>(p.kpm_f.data()))
                   : static_cast<void*>(const_cast<uint8_t*>(p.kpm_b.data()));
    const int64_t shape[2] = {p.N, p.S};
    EXPECT_TRUE(TensorView::Dense(data, f ? DType::kF32 : DType::kBool, p.batched ? 2 : 1,
                                  p.batched ? shape : shape + 1, &v->in.key_padding_mask)
                    .ok());
  }
  // Positions: [N, L] / [N, S]; rank 1 when shared by the batch or unbatched.
  auto pos_view = [&](const std::vector<int64_t>& pos, std::vector<int32_t>* pos32, int64_t len,
                      bool shared, TensorView* t) {
    if (pos.empty()) return;
    void* data = const_cast<int64_t*>(pos.data());
    if (p.pos_dtype == DType::kI32) {
      pos32->assign(pos.begin(), pos.end());
      data = pos32->data();
    }
    const int64_t shape[2] = {p.N, len};
    const bool rank1 = shared || !p.batched;
    EXPECT_TRUE(
        TensorView::Dense(data, p.pos_dtype, rank1 ? 1 : 2, rank1 ? shape + 1 : shape, t).ok());
  };
  pos_view(p.positions, &v->pos32, p.L, p.positions_shared, &v->in.positions);
  pos_view(p.key_positions, &v->key_pos32, p.S, false, &v->in.key_positions);
  v->in.causal = p.causal;
  v->in.need_weights = p.need_weights;
  v->in.average_attn_weights = p.average;

  // Output in the query's layout, dense.
  v->output.assign(p.N * p.L * E, std::numeric_limits<float>::quiet_NaN());
  v->out = AttentionOutputs();
  if (!p.batched) {
    const int64_t shape[2] = {p.L, E};
    EXPECT_TRUE(TensorView::Dense(v->output.data(), DType::kF32, 2, shape, &v->out.output).ok());
  } else if (c.batch_first) {
    const int64_t shape[3] = {p.N, p.L, E};
    EXPECT_TRUE(TensorView::Dense(v->output.data(), DType::kF32, 3, shape, &v->out.output).ok());
  } else {
    const int64_t shape[3] = {p.L, p.N, E};
    EXPECT_TRUE(TensorView::Dense(v->output.data(), DType::kF32, 3, shape, &v->out.output).ok());
  }
  if (p.need_weights) {
    const int64_t St = p.S + c.add_bias_kv + c.add_zero_attn;
    int64_t shape[4];
    int rank = 0;
    if (p.batched) shape[rank++] = p.N;
    if (!p.average) shape[rank++] = H;
    shape[rank++] = p.L;
    shape[rank++] = St;
    v->weights.assign(p.N * (p.average ? 1 : H) * p.L * St, std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(
        TensorView::Dense(v->weights.data(), DType::kF32, rank, shape, &v->out.attn_weights).ok());
  }
}

double MaxScaledError(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]) / (1.0 + std::fabs(want[i]));
    worst = std::max(worst, std::isnan(e) ? INFINITY : e);
  }
  return worst;
}

bool Close(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::abs(got - want) <= kAtol + kRtol * std::abs(want);
}

void RunForward(const Problem& p, size_t threads, Views* v) {
  RunLayerForward(p.config, WeightsOf(p), p.binding, p, threads, v);
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ < 3) {
      ADD_FAILURE() << what << ": element " << i << " = " << got[i] << ", want " << want[i];
    }
  }
}

OutputError MaxError(const std::vector<float>& got, const std::vector<float>& want) {
  OutputError e;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    e.scale = std::max(e.scale, std::abs(static_cast<double>(want[i])));
    e.err = std::max(e.err, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return e;
}

void RunForwardWith(const Problem& p, const ContextOptions& options, Views* v) {
  std::unique_ptr<MultiheadAttention> mha;
  Status s = MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  RunLayerOn(*mha, p, options, v);
}

void RunLayerForward(const AttentionConfig& config, const AttentionWeights& weights,
                     WeightBinding binding, const Problem& p, size_t threads, Views* v) {
  std::unique_ptr<MultiheadAttention> mha;
  Status s = MultiheadAttention::Create(config, weights, binding, &mha);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  ContextOptions opts;
  opts.num_threads = threads;
  RunLayerOn(*mha, p, opts, v);
}

void RunLayerOn(const MultiheadAttention& layer, const Problem& p, const ContextOptions& options,
                Views* v) {
  const MultiheadAttention* mha = &layer;
  std::unique_ptr<Context> ctx;
  Status s = Context::Create(options, &ctx);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const size_t threads = ctx->num_threads();
  MakeViews(p, v);
  size_t bytes = 0;
  s = mha->Plan(v->in, v->out, threads, &bytes);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  s = mha->Forward(*ctx, v->in, v->out);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  EXPECT_LE(ctx->arena_high_water(), bytes + 64) << p.Describe();
}

void ExpectMatchesReference(const Problem& p, const Views& v) {
  reference::Outputs ref;
  RunReference(p, &ref);
  const int64_t E = p.config.embed_dim;
  int bad = 0;
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t l = 0; l < p.L; ++l)
      for (int64_t e = 0; e < E; ++e) {
        const double want = ref.output[(n * p.L + l) * E + e];
        const double got = OutputAt(p, v.output, n, l, e);
        if (!Close(got, want) && bad++ < 5) {
          ADD_FAILURE() << "output[n=" << n << ", l=" << l << ", e=" << e << "] = " << got
                        << ", want " << want << "\n"
                        << p.Describe();
        }
      }
  if (!p.need_weights) return;
  const int64_t St = ref.total_src_len;
  const std::vector<double>& want_w = p.average ? ref.mean_weights : ref.head_weights;
  ASSERT_EQ(v.weights.size(), want_w.size()) << p.Describe();
  for (size_t i = 0; i < want_w.size(); ++i) {
    if (!Close(v.weights[i], want_w[i]) && bad++ < 5) {
      ADD_FAILURE() << "weights[" << i << "] (row " << i / St << ", col " << i % St
                    << ") = " << v.weights[i] << ", want " << want_w[i] << "\n"
                    << p.Describe();
    }
  }
  for (size_t row = 0; row * St < want_w.size(); ++row) {
    double got = 0, want = 0;
    for (int64_t j = 0; j < St; ++j) {
      got += v.weights[row * St + j];
      want += want_w[row * St + j];
    }
    if (std::abs(got - want) > 1e-5 && bad++ < 5) {
      ADD_FAILURE() << "weights row " << row << " sums to " << got << ", want " << want << "\n"
                    << p.Describe();
    }
  }
}

float OutputAt(const Problem& p, const std::vector<float>& out, int64_t n, int64_t l, int64_t e) {
  const int64_t E = p.config.embed_dim;
  if (!p.batched) return out[l * E + e];
  if (p.config.batch_first) return out[(n * p.L + l) * E + e];
  return out[(l * p.N + n) * E + e];
}

bool GroupingPossible() { return kernels::WeightsPrepackable(DType::kF32); }

size_t ForwardBatchGroup(const Problem& p, size_t threads) {
  std::unique_ptr<MultiheadAttention> mha;
  EXPECT_TRUE(MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha).ok());
  Views v;
  MakeViews(p, &v);
  size_t group = 0;
  EXPECT_TRUE(ForwardBatchGroupForTesting(*mha, v.in, v.out, threads, &group).ok());
  return group;
}

bool RunsGrouped(const Problem& p, size_t rows, size_t threads) {
  ScopedBatchGrouping forced(rows);
  return ForwardBatchGroup(p, threads) > 0;
}

void ExpectGroupedGivesStagedBits(const Problem& p, size_t threads, size_t rows) {
  Views staged, grouped;
  {
    ScopedBatchGrouping never(0);
    RunForward(p, threads, &staged);
  }
  {
    ScopedBatchGrouping forced(rows);
    RunForward(p, threads, &grouped);
  }
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(0, std::memcmp(staged.output.data(), grouped.output.data(),
                           staged.output.size() * sizeof(float)))
      << "grouped (" << rows << " rows per group) and staged outputs differ on " << threads
      << " threads\n"
      << p.Describe();
  ExpectMatchesReference(p, grouped);
}

void DecodeAndCausalForward(Context& ctx, const MultiheadAttention& layer,
                            const std::vector<float>& x, int64_t T, int64_t E,
                            std::vector<float>* steps, std::vector<float>* full) {
  std::unique_ptr<KvCache> cache;
  ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(layer, 1, T), &cache).ok());
  steps->assign(T * E, 0.0f);
  full->assign(T * E, 0.0f);
  float* in_data = const_cast<float*>(x.data());
  const int64_t one[3] = {1, 1, E};
  for (int64_t i = 0; i < T; ++i) {
    TensorView xi, yi;
    ASSERT_TRUE(TensorView::Dense(in_data + i * E, DType::kF32, 3, one, &xi).ok());
    ASSERT_TRUE(TensorView::Dense(steps->data() + i * E, DType::kF32, 3, one, &yi).ok());
    const Status s = cache->Step(ctx, layer, xi, yi);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  AttentionInputs in;
  AttentionOutputs out;
  const int64_t seq[3] = {1, T, E};
  ASSERT_TRUE(TensorView::Dense(in_data, DType::kF32, 3, seq, &in.query).ok());
  ASSERT_TRUE(TensorView::Dense(full->data(), DType::kF32, 3, seq, &out.output).ok());
  in.causal = true;
  const Status s = layer.Forward(ctx, in, out);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

}  // namespace testing_util
}  // namespace mha
