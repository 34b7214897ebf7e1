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

CheckResult FullReference(const Workload& w) {
  const Shape& s = w.shape();
  const size_t e = static_cast<size_t>(s.embed), ee = e * e;
  const float* in_w = w.in_proj_weight().data();
  const float* in_b = w.in_proj_bias().data();
  reference::Config config;
  config.embed_dim = s.embed;
  config.num_heads = s.heads;
  config.causal = s.causal;
  reference::Weights weights;
  weights.wq = ToDouble(in_w, ee);
  weights.wk = ToDouble(in_w + ee, ee);
  weights.wv = ToDouble(in_w + 2 * ee, ee);
  weights.bq = ToDouble(in_b, e);
  weights.bk = ToDouble(in_b + e, e);
  weights.bv = ToDouble(in_b + 2 * e, e);
  weights.wo = ToDouble(w.out_proj_weight().data(), ee);
  weights.bo = ToDouble(w.out_proj_bias().data(), e);
  reference::Inputs inputs;
  inputs.batch = s.batch;
  inputs.tgt_len = s.seq;
  inputs.src_len = s.kv_seq;
  inputs.query = ToDouble(w.query().data(), w.query().size());
  inputs.key = ToDouble(w.key().data(), w.key().size());
  inputs.value = ToDouble(w.value().data(), w.value().size());
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

// y[rows, E] = x[rows, E] * weight[E, E]^T + bias[E], in double with BLIS on `threads` threads.
void LinearDgemm(const std::vector<double>& x, size_t rows, const std::vector<double>& weight,
                 const float* bias, size_t e, size_t threads, std::vector<double>* y) {
  y->assign(rows * e, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < e; ++o) (*y)[r * e + o] = bias[o];
  }
  rntm_t rntm;
  bli_rntm_init(&rntm);
  bli_rntm_set_num_threads(static_cast<dim_t>(threads), &rntm);
  double alpha = 1.0, beta = 1.0;
  const inc_t ld = static_cast<inc_t>(e);
  // weight^T as a strided view: element (k, n) = weight[n * E + k].
  bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, static_cast<dim_t>(rows),
               static_cast<dim_t>(e), static_cast<dim_t>(e), &alpha, const_cast<double*>(x.data()),
               ld, 1, const_cast<double*>(weight.data()), 1, ld, &beta, y->data(), ld, 1,
               /*cntx=*/nullptr, &rntm);
}

CheckResult RowSubset(const Workload& w, size_t threads) {
  const Shape& s = w.shape();
  const size_t n = static_cast<size_t>(s.batch), l = static_cast<size_t>(s.seq),
               kv = static_cast<size_t>(s.kv_seq), e = static_cast<size_t>(s.embed),
               h_count = static_cast<size_t>(s.heads), hd = e / h_count, ee = e * e;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const float* in_w = w.in_proj_weight().data();
  const float* in_b = w.in_proj_bias().data();
  const float* out_w = w.out_proj_weight().data();
  const float* out_b = w.out_proj_bias().data();
  const std::vector<double> wk = ToDouble(in_w + ee, ee);
  const std::vector<double> wv = ToDouble(in_w + 2 * ee, ee);

  std::vector<size_t> batches = {0, n - 1};
  std::vector<size_t> rows = {0, l / 2, l - 1};
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());

  CheckResult r;
  std::vector<double> k, v, q(e), attn(e), probs(kv), mean_probs(kv);
  for (size_t b : batches) {
    LinearDgemm(ToDouble(w.key().data() + b * kv * e, kv * e), kv, wk, in_b + e, e, threads, &k);
    LinearDgemm(ToDouble(w.value().data() + b * kv * e, kv * e), kv, wv, in_b + 2 * e, e, threads,
                &v);
    for (size_t i : rows) {
      const float* x = w.query().data() + (b * l + i) * e;
      for (size_t o = 0; o < e; ++o) {
        double acc = in_b[o];
        for (size_t c = 0; c < e; ++c) acc += static_cast<double>(in_w[o * e + c]) * x[c];
        q[o] = acc;
      }
      // Keys j > i are masked when causal (top-left aligned); key 0 is always allowed, so no
      // row is fully masked here.
      const size_t allowed = s.causal ? std::min(kv, i + 1) : kv;
      std::fill(mean_probs.begin(), mean_probs.end(), 0.0);
      for (size_t h = 0; h < h_count; ++h) {
        double max_score = -std::numeric_limits<double>::infinity();
        for (size_t j = 0; j < allowed; ++j) {
          double dot = 0;
          for (size_t d = 0; d < hd; ++d) dot += q[h * hd + d] * k[j * e + h * hd + d];
          probs[j] = dot * scale;
          max_score = std::max(max_score, probs[j]);
        }
        double sum = 0;
        for (size_t j = 0; j < allowed; ++j) {
          probs[j] = std::exp(probs[j] - max_score);
          sum += probs[j];
        }
        for (size_t d = 0; d < hd; ++d) attn[h * hd + d] = 0;
        for (size_t j = 0; j < allowed; ++j) {
          probs[j] /= sum;
          mean_probs[j] += probs[j] / static_cast<double>(h_count);
          for (size_t d = 0; d < hd; ++d) attn[h * hd + d] += probs[j] * v[j * e + h * hd + d];
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
  const double full_macs = n * (2 * l * e * e + 2 * kv * e * e + 2 * l * kv * e);
  return full_macs <= kFullReferenceMaxMacs ? FullReference(w) : RowSubset(w, threads);
}

}  // namespace bench
}  // namespace mha
