#include "tools/bench_check.h"

#include <blis.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/reference/reference_attention.h"

namespace mha {
namespace bench {

namespace {

// Cases whose full reference costs at most this many multiply-adds (about a quarter of a second
// of scalar double code) are checked in full.
constexpr double kFullReferenceMaxMacs = 1e8;

std::vector<double> ToDouble(const float* data, size_t count) {
  return std::vector<double>(data, data + count);
}

void UpdateMax(double a, double b, double* max_err) {
  const double d = std::fabs(a - b);
  // A NaN from mha must fail the check, so it counts as an infinite error.
  *max_err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(*max_err, d);
}

std::vector<double> ToDouble(const std::vector<float>& v) { return ToDouble(v.data(), v.size()); }

CheckResult FullReference(const Workload& w) {
  const Shape& s = w.shape();
  const Variants& var = s.variants;
  const size_t e = static_cast<size_t>(s.embed), ee = e * e,
               kve = static_cast<size_t>(s.kv_embed());
  const float* in_w = w.in_proj_weight().data();
  const float* in_b = w.in_proj_bias().data();
  reference::Config config;
  config.embed_dim = s.embed;
  config.num_heads = s.heads;
  config.num_kv_heads = s.kv_heads();
  config.causal = s.causal;
  config.rope = var.rope == RopeStyle::kNeox   ? reference::Rope::kNeox
                : var.rope == RopeStyle::kGptj ? reference::Rope::kGptj
                                               : reference::Rope::kNone;
  config.rope_theta = var.rope_theta;
  config.rotary_dim = var.rotary_dim;
  config.rope_scale = var.rope_scale;
  config.alibi = var.alibi;
  config.window = var.window;
  config.softcap = var.softcap;
  config.sinks = ToDouble(w.sinks());
  config.q_norm = ToDouble(w.q_norm());
  config.k_norm = ToDouble(w.k_norm());
  config.qk_norm_eps = var.qk_norm_eps;
  reference::Weights weights;
  weights.wq = ToDouble(in_w, ee);
  weights.wk = ToDouble(in_w + ee, kve * e);
  weights.wv = ToDouble(in_w + ee + kve * e, kve * e);
  weights.bq = ToDouble(in_b, e);
  weights.bk = ToDouble(in_b + e, kve);
  weights.bv = ToDouble(in_b + e + kve, kve);
  weights.wo = ToDouble(w.out_proj_weight().data(), ee);
  weights.bo = ToDouble(w.out_proj_bias().data(), e);
  reference::Inputs inputs;
  inputs.batch = s.batch;
  inputs.tgt_len = s.seq;
  inputs.src_len = s.kv_seq;
  inputs.query = ToDouble(w.query().data(), w.query().size());
  inputs.key = ToDouble(w.key().data(), w.key().size());
  inputs.value = ToDouble(w.value().data(), w.value().size());
  inputs.self_attention = s.self_attention();
  reference::Outputs expected;
  reference::Attention(config, weights, inputs, &expected);

  CheckResult r;
  r.full = true;
  r.rows_checked = s.batch * s.seq;
  for (size_t i = 0; i < w.output().size(); ++i) {
    UpdateMax(w.output()[i], expected.output[i], &r.max_abs_err);
  }
  if (s.need_weights) {
    for (size_t i = 0; i < w.attn_weights().size(); ++i) {
      UpdateMax(w.attn_weights()[i], expected.mean_weights[i], &r.max_abs_err);
    }
  }
  return r;
}

// y[rows, out] = x[rows, E] * weight[out, E]^T + bias[out], in double with BLIS on `threads`
// threads.
void LinearDgemm(const std::vector<double>& x, size_t rows, const std::vector<double>& weight,
                 const float* bias, size_t e, size_t out, size_t threads, std::vector<double>* y) {
  y->assign(rows * out, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < out; ++o) (*y)[r * out + o] = bias[o];
  }
  rntm_t rntm;
  bli_rntm_init(&rntm);
  bli_rntm_set_num_threads(static_cast<dim_t>(threads), &rntm);
  double alpha = 1.0, beta = 1.0;
  const inc_t ld = static_cast<inc_t>(e);
  // weight^T as a strided view: element (k, n) = weight[n * E + k].
  bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, static_cast<dim_t>(rows),
               static_cast<dim_t>(out), static_cast<dim_t>(e), &alpha,
               const_cast<double*>(x.data()), ld, 1, const_cast<double*>(weight.data()), 1, ld,
               &beta, y->data(), static_cast<inc_t>(out), 1,
               /*cntx=*/nullptr, &rntm);
}

// The case's QK-norm and RoPE on `rows` projected rows of `heads` heads of hd values each
// ([rows, heads * hd]), row r at position first + r; the README's order and formulas, in double.
void TransformRows(const Shape& s, const std::vector<float>& norm, std::vector<double>* x,
                   size_t rows, size_t heads, size_t first) {
  const Variants& v = s.variants;
  const size_t hd = static_cast<size_t>(s.embed / s.heads), width = heads * hd;
  const double eps = v.qk_norm_eps > 0 ? v.qk_norm_eps : 1e-6;
  const size_t rd = v.rotary_dim > 0 ? static_cast<size_t>(v.rotary_dim) : hd;
  const double theta = v.rope_theta > 0 ? v.rope_theta : 10000.0;
  const double factor = v.rope_scale > 0 ? v.rope_scale : 1.0;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < heads; ++h) {
      double* y = x->data() + r * width + h * hd;
      if (!norm.empty()) {
        double ss = 0;
        for (size_t d = 0; d < hd; ++d) ss += y[d] * y[d];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hd) + eps);
        for (size_t d = 0; d < hd; ++d) y[d] = y[d] * inv * norm[d];
      }
      if (v.rope == RopeStyle::kNone) continue;
      for (size_t i = 0; i < rd / 2; ++i) {
        const double angle =
            static_cast<double>(first + r) / factor *
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
        const size_t a = v.rope == RopeStyle::kNeox ? i : 2 * i;
        const size_t b = v.rope == RopeStyle::kNeox ? i + rd / 2 : 2 * i + 1;
        const double c = std::cos(angle), sn = std::sin(angle), x1 = y[a], x2 = y[b];
        y[a] = x1 * c - x2 * sn;
        y[b] = x2 * c + x1 * sn;
      }
    }
  }
}

CheckResult RowSubset(const Workload& w, size_t threads) {
  const Shape& s = w.shape();
  const Variants& var = s.variants;
  const size_t n = static_cast<size_t>(s.batch), l = static_cast<size_t>(s.seq),
               kv = static_cast<size_t>(s.kv_seq), e = static_cast<size_t>(s.embed),
               h_count = static_cast<size_t>(s.heads), hd = e / h_count, ee = e * e,
               kvh = static_cast<size_t>(s.kv_heads()), kve = kvh * hd, group = h_count / kvh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const float* in_w = w.in_proj_weight().data();
  const float* in_b = w.in_proj_bias().data();
  const float* out_w = w.out_proj_weight().data();
  const float* out_b = w.out_proj_bias().data();
  const std::vector<double> wk = ToDouble(in_w + ee, kve * e);
  const std::vector<double> wv = ToDouble(in_w + ee + kve * e, kve * e);
  const std::vector<double> slopes =
      var.alibi ? reference::StandardAlibiSlopes(s.heads) : std::vector<double>();
  const int64_t window = var.window;

  std::vector<size_t> batches = {0, n - 1};
  std::vector<size_t> rows = {0, l / 2, l - 1};
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());

  CheckResult r;
  std::vector<double> k, v, q(e), attn(e), probs(kv), mean_probs(kv);
  for (size_t b : batches) {
    LinearDgemm(ToDouble(w.key().data() + b * kv * e, kv * e), kv, wk, in_b + e, e, kve, threads,
                &k);
    LinearDgemm(ToDouble(w.value().data() + b * kv * e, kv * e), kv, wv, in_b + e + kve, e, kve,
                threads, &v);
    // Keys at positions 0..S-1 (self-attention: the query positions, the same).
    TransformRows(s, w.k_norm(), &k, kv, kvh, 0);
    for (size_t i : rows) {
      const float* x = w.query().data() + (b * l + i) * e;
      for (size_t o = 0; o < e; ++o) {
        double acc = in_b[o];
        for (size_t c = 0; c < e; ++c) acc += static_cast<double>(in_w[o * e + c]) * x[c];
        q[o] = acc;
      }
      TransformRows(s, w.q_norm(), &q, 1, h_count, i);
      // Keys j > i are masked when causal (top-left aligned), and the window keeps
      // i - W < j <= i (causal) or |i - j| < W; key i (or 0) is always visible, so no row is
      // fully masked here.
      size_t first = 0, last = s.causal ? std::min(kv, i + 1) : kv;  // visible [first, last)
      if (window > 0) {
        first = i + 1 > static_cast<size_t>(window) ? i + 1 - static_cast<size_t>(window) : 0;
        if (!s.causal) last = std::min(kv, i + static_cast<size_t>(window));
      }
      std::fill(mean_probs.begin(), mean_probs.end(), 0.0);
      for (size_t h = 0; h < h_count; ++h) {
        const size_t g = h / group;
        double max_score = w.sinks().empty() ? -std::numeric_limits<double>::infinity()
                                             : static_cast<double>(w.sinks()[h]);
        for (size_t j = first; j < last; ++j) {
          double dot = 0;
          for (size_t d = 0; d < hd; ++d) dot += q[h * hd + d] * k[j * kve + g * hd + d];
          double y = dot * scale;
          if (var.softcap > 0) y = var.softcap * std::tanh(y / var.softcap);
          if (var.alibi)
            y -= slopes[h] * std::fabs(static_cast<double>(i) - static_cast<double>(j));
          probs[j] = y;
          max_score = std::max(max_score, probs[j]);
        }
        double sum = w.sinks().empty() ? 0.0 : std::exp(w.sinks()[h] - max_score);
        for (size_t j = first; j < last; ++j) {
          probs[j] = std::exp(probs[j] - max_score);
          sum += probs[j];
        }
        for (size_t d = 0; d < hd; ++d) attn[h * hd + d] = 0;
        for (size_t j = first; j < last; ++j) {
          probs[j] /= sum;
          mean_probs[j] += probs[j] / static_cast<double>(h_count);
          for (size_t d = 0; d < hd; ++d) attn[h * hd + d] += probs[j] * v[j * kve + g * hd + d];
        }
      }
      for (size_t o = 0; o < e; ++o) {
        double acc = out_b[o];
        for (size_t c = 0; c < e; ++c) acc += static_cast<double>(out_w[o * e + c]) * attn[c];
        UpdateMax(w.output()[(b * l + i) * e + o], acc, &r.max_abs_err);
      }
      if (s.need_weights) {
        for (size_t j = 0; j < kv; ++j) {
          UpdateMax(w.attn_weights()[(b * l + i) * kv + j], mean_probs[j], &r.max_abs_err);
        }
      }
      ++r.rows_checked;
    }
  }
  return r;
}

}  // namespace

CheckResult CheckAccuracy(const Workload& w, size_t threads) {
  const Shape& s = w.shape();
  const double n = static_cast<double>(s.batch), l = static_cast<double>(s.seq),
               kv = static_cast<double>(s.kv_seq), e = static_cast<double>(s.embed);
  const double kve = static_cast<double>(s.kv_embed());
  const double full_macs = n * (2 * l * e * e + 2 * kv * e * kve + 2 * l * kv * e);
  return full_macs <= kFullReferenceMaxMacs ? FullReference(w) : RowSubset(w, threads);
}

}  // namespace bench
}  // namespace mha
