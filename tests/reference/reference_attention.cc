#include "tests/reference/reference_attention.h"

#include <cmath>
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

}  // namespace

void Attention(const Config& c, const Weights& w, const Inputs& in, Outputs* out) {
  const int64_t E = c.embed_dim, H = c.num_heads;
  const int64_t KVH = c.num_kv_heads > 0 ? c.num_kv_heads : H;
  const int64_t hd = E / H;
  const int64_t kvE = KVH * hd;
  const int64_t qd = c.q_dim > 0 ? c.q_dim : E;
  const int64_t kd = c.kdim > 0 ? c.kdim : E;
  const int64_t vd = c.vdim > 0 ? c.vdim : E;
  const int64_t N = in.batch, L = in.tgt_len, S = in.src_len;
  const int64_t St = S + (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const double kNegInf = -std::numeric_limits<double>::infinity();

  const std::vector<double> q = Linear(in.query, N * L, qd, w.wq, w.bq, E);
  const std::vector<double> k = Linear(in.key, N * S, kd, w.wk, w.bk, kvE);
  const std::vector<double> v = Linear(in.value, N * S, vd, w.wv, w.bv, kvE);

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
          }
          row[s] = y;
          if (y > mx) mx = y;
        }
        double sum = 0;
        const bool all_masked = (mx == kNegInf);
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
  out->output = Linear(concat, N * L, E, w.wo, w.bo, E);
}

}  // namespace reference
}  // namespace mha
