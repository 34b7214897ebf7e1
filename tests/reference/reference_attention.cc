#include "tests/reference/reference_attention.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace mha {
namespace reference {

namespace {

// y[rows, out] = x[rows, in] * w[out, in]^T + b[out]
std::vector<double> Linear(const std::vector<double>& x, int64_t rows, int64_t in,
                           const std::vector<double>& w, const std::vector<double>& b,
                           int64_t out) {
  std::vector<double> y(rows * out, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

// RMSNorm of x[0..n) in place: x / sqrt(mean(x^2) + eps) * w.
void RmsNorm(double* x, int64_t n, const double* w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

// RoPE of one head's x[hd] at position p.
void Rotate(const Config& c, int64_t hd, int64_t p, double* x) {
  const int64_t rd = c.rotary_dim > 0 ? c.rotary_dim : hd;
  const double theta = c.rope_theta > 0 ? c.rope_theta : 10000.0;
  const double factor = c.rope_scale > 0 ? c.rope_scale : 1.0;
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double angle =
        c.rope_inv_freq.empty()
            ? static_cast<double>(p) / factor *
                  std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd))
            : static_cast<double>(p) * c.rope_inv_freq[i];
    const double cs = std::cos(angle) * c.rope_attention, sn = std::sin(angle) * c.rope_attention;
    const int64_t ia = c.rope == Rope::kNeox ? i : 2 * i;
    const int64_t ib = c.rope == Rope::kNeox ? i + rd / 2 : 2 * i + 1;
    const double a = x[ia], b = x[ib];
    x[ia] = a * cs - b * sn;
    x[ib] = b * cs + a * sn;
  }
}

}  // namespace

std::vector<double> StandardAlibiSlopes(int64_t n) {
  int64_t cp = 1;
  while (cp * 2 <= n) cp *= 2;
  std::vector<double> slopes;
  for (int64_t h = 0; h < cp; ++h) {
    slopes.push_back(std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(cp)));
  }
  if (cp < n) {
    const std::vector<double> twice = StandardAlibiSlopes(2 * cp);
    for (int64_t i = 0; i < n - cp; ++i) slopes.push_back(twice[2 * i]);
  }
  return slopes;
}

void Attention(const Config& c, const Weights& w, const Inputs& in, Outputs* out) {
  const int64_t D = c.embed_dim, H = c.num_heads;
  const int64_t KVH = c.num_kv_heads > 0 ? c.num_kv_heads : H;
  const int64_t hd = c.head_dim > 0 ? c.head_dim : D / H;
  const int64_t E = H * hd;
  const int64_t kvE = KVH * hd;
  const int64_t qd = c.q_dim > 0 ? c.q_dim : D;
  const int64_t kd = c.kdim > 0 ? c.kdim : D;
  const int64_t vd = c.vdim > 0 ? c.vdim : D;
  const int64_t N = in.batch, L = in.tgt_len, S = in.src_len;
  const int64_t St = S + (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const double kNegInf = -std::numeric_limits<double>::infinity();

  std::vector<double> q = Linear(in.query, N * L, qd, w.wq, w.bq, E);
  std::vector<double> k = Linear(in.key, N * S, kd, w.wk, w.bk, kvE);
  const std::vector<double> v = Linear(in.value, N * S, vd, w.wv, w.bv, kvE);

  // Positions [N, L] and [N, S].
  std::vector<int64_t> qpos(N * L), kpos(N * S);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t l = 0; l < L; ++l) {
      qpos[n * L + l] = in.positions.empty() ? l : in.positions[n * L + l];
    }
    for (int64_t s = 0; s < S; ++s) {
      int64_t p = s;
      if (!in.key_positions.empty()) {
        p = in.key_positions[n * S + s];
      } else if (in.self_attention) {
        if (S != L) std::abort();  // self-attention keys are the queries
        p = qpos[n * L + s];
      }
      kpos[n * S + s] = p;
    }
  }

  // QK-norm, then RoPE, on the projected rows.
  if (!c.q_norm.empty() || !c.k_norm.empty()) {
    const double eps = c.qk_norm_eps > 0 ? c.qk_norm_eps : 1e-6;
    const int64_t group = c.qk_norm_whole ? 0 : hd;  // 0: the whole row
    for (int64_t r = 0; r < N * L; ++r) {
      const int64_t g = group ? group : E;
      for (int64_t h = 0; h < E / g; ++h) RmsNorm(&q[r * E + h * g], g, c.q_norm.data(), eps);
    }
    for (int64_t r = 0; r < N * S; ++r) {
      const int64_t g = group ? group : kvE;
      for (int64_t h = 0; h < kvE / g; ++h) RmsNorm(&k[r * kvE + h * g], g, c.k_norm.data(), eps);
    }
  }
  if (c.rope != Rope::kNone) {
    for (int64_t r = 0; r < N * L; ++r) {
      for (int64_t h = 0; h < H; ++h) Rotate(c, hd, qpos[r], &q[r * E + h * hd]);
    }
    for (int64_t r = 0; r < N * S; ++r) {
      for (int64_t h = 0; h < KVH; ++h) Rotate(c, hd, kpos[r], &k[r * kvE + h * hd]);
    }
  }
  const std::vector<double> slopes = !c.alibi                 ? std::vector<double>()
                                     : c.alibi_slopes.empty() ? StandardAlibiSlopes(H)
                                                              : c.alibi_slopes;

  out->total_src_len = St;
  out->q.assign(N * H * L * hd, 0.0);
  out->k.assign(N * KVH * St * hd, 0.0);
  out->v.assign(N * KVH * St * hd, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t d = 0; d < hd; ++d)
          out->q[((n * H + h) * L + l) * hd + d] = q[(n * L + l) * E + h * hd + d];
    for (int64_t h = 0; h < KVH; ++h) {
      for (int64_t s = 0; s < St; ++s) {
        for (int64_t d = 0; d < hd; ++d) {
          double kv = 0, vv = 0;  // the zero-attention column stays 0
          if (s < S) {
            kv = k[(n * S + s) * kvE + h * hd + d];
            vv = v[(n * S + s) * kvE + h * hd + d];
          } else if (s == S && c.add_bias_kv) {
            kv = w.bias_k[h * hd + d];
            vv = w.bias_v[h * hd + d];
          }
          out->k[((n * KVH + h) * St + s) * hd + d] = kv;
          out->v[((n * KVH + h) * St + s) * hd + d] = vv;
        }
      }
    }
  }

  out->head_weights.assign(N * H * L * St, 0.0);
  out->mean_weights.assign(N * L * St, 0.0);
  std::vector<double> concat(N * L * E, 0.0);
  std::vector<double> row(St);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / (H / KVH);
      for (int64_t l = 0; l < L; ++l) {
        double mx = kNegInf;
        for (int64_t s = 0; s < St; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += out->q[((n * H + h) * L + l) * hd + d] *
                   out->k[((n * KVH + kh) * St + s) * hd + d];
          }
          double y = dot * scale;
          if (c.softcap > 0) y = c.softcap * std::tanh(y / c.softcap);
          // Masks cover the S real keys; appended columns (bias_kv, zero_attn) are padded with
          // "not masked", as PyTorch pads attn_mask and key_padding_mask with zeros.
          if (s < S) {
            if (in.attn_mask_kind != MaskKind::kNone) {
              const int64_t base = in.attn_mask_3d ? ((n * H + h) * L + l) * S : l * S;
              const double m = in.attn_mask[base + s];
              if (in.attn_mask_kind == MaskKind::kBool) {
                if (m != 0) y = kNegInf;
              } else {
                y += m;
              }
            }
            if (in.key_padding_mask_kind != MaskKind::kNone) {
              const double m = in.key_padding_mask[n * S + s];
              if (in.key_padding_mask_kind == MaskKind::kBool) {
                if (m != 0) y = kNegInf;
              } else {
                y += m;
              }
            }
            if (c.causal && s > l) y = kNegInf;
            const int64_t pi = qpos[n * L + l], pj = kpos[n * S + s];
            if (c.alibi) y -= slopes[h] * static_cast<double>(std::llabs(pi - pj));
            if (c.window > 0) {
              const bool visible =
                  c.causal ? (pi - c.window < pj && pj <= pi) : std::llabs(pi - pj) < c.window;
              if (!visible) y = kNegInf;
            }
          }
          row[s] = y;
          if (y > mx) mx = y;
        }
        const bool all_masked = (mx == kNegInf);
        // The sink joins the row's max and denominator; its value vector is zero.
        const double sink = c.sinks.empty() ? kNegInf : c.sinks[h];
        if (sink > mx) mx = sink;
        double sum = all_masked || sink == kNegInf ? 0.0 : std::exp(sink - mx);
        for (int64_t s = 0; s < St; ++s) {
          row[s] = all_masked ? 0.0 : std::exp(row[s] - mx);
          sum += row[s];
        }
        for (int64_t s = 0; s < St; ++s) {
          const double p = all_masked ? 0.0 : row[s] / sum;
          out->head_weights[((n * H + h) * L + l) * St + s] = p;
          out->mean_weights[(n * L + l) * St + s] += p / static_cast<double>(H);
          for (int64_t d = 0; d < hd; ++d) {
            concat[(n * L + l) * E + h * hd + d] += p * out->v[((n * KVH + kh) * St + s) * hd + d];
          }
        }
      }
    }
  }
  out->output = Linear(concat, N * L, E, w.wo, w.bo, D);
}

}  // namespace reference
}  // namespace mha
