// Reference multi-head attention in double precision, written for clarity, not speed. It is the
// oracle the kernels and the operator are tested against. Semantics are those of
// torch.nn.MultiheadAttention.forward in eval mode, with mha's documented differences:
// fully-masked query rows get all-zero attention weights (PyTorch: NaN), so their attention
// output before the output projection is zero; `causal` masks key j > query i (top-left
// aligned, as torch's scaled_dot_product_attention(is_causal=True)) over the S real keys;
// num_kv_heads < num_heads repeats each K/V head for num_heads / num_kv_heads query heads.
//
// Attention variants (issue #30 "Exact conventions"), all in double, per head, in this order:
//   QK-norm: x <- x / sqrt(mean(x^2) + eps) * w on the projected q and k (bias included), over
//            one head's hd values, or over the whole row ([E] for q, [kvE] for k) when whole;
//   RoPE:    on q and k (not v), angle_i = p / rope_scale * theta^(-2i/rd) for i < rd/2 (or
//            p * rope_inv_freq[i] when given: a RoPE scaling's frequencies, which the tests
//            compute); neox rotates the pairs (x_i, x_{i+rd/2}), gptj (x_{2i}, x_{2i+1});
//            components >= rd stay; (a, b) <- (a cos - b sin, b cos + a sin), cos and sin
//            multiplied by rope_attention (a scaling's attention factor; 1 by default);
//   s = scale * q.k; softcap c: s <- c * tanh(s / c); ALiBi: s <- s - m_h * |p_i - p_j|;
//   additive masks; bool masks, causal (index based: j <= i) and the window give -inf; the
//   window with causal keeps p_i - W < p_j <= p_i, without causal |p_i - p_j| < W;
//   softmax over the visible keys plus the sink logit sinks[h] (its value vector is zero; the
//   returned weights omit it and sum to 1 - p_sink). A row with no visible key gets zero
//   weights, also with a sink.
// Positions: queries Inputs::positions [N, L] or 0..L-1; keys Inputs::key_positions [N, S], else
// the query positions when Inputs::self_attention (then S == L), else 0..S-1. The keys appended
// by add_bias_kv / add_zero_attn get no QK-norm, no RoPE, no ALiBi and no window (mha rejects
// the positional variants with them); softcap and the sink cover every column.
//
// Layouts are batch-first and dense: query [N, L, q_dim], key [N, S, kdim], value [N, S, vdim];
// weights follow nn.Linear ([out_features, in_features], row-major).
#ifndef MHA_TESTS_REFERENCE_REFERENCE_ATTENTION_H_
#define MHA_TESTS_REFERENCE_REFERENCE_ATTENTION_H_

#include <cstdint>
#include <vector>

namespace mha {
namespace reference {

enum class MaskKind { kNone, kBool, kFloat };
enum class Rope { kNone, kNeox, kGptj };

// The ALiBi paper's get_slopes(H) (ofirpress/attention_with_linear_biases): for H a power of
// two m_h = 2^(-8(h+1)/H); otherwise the slopes of the closest power of two cp below H followed
// by every other slope of 2cp, [0::2][:H - cp].
std::vector<double> StandardAlibiSlopes(int64_t num_heads);

struct Config {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  int64_t num_kv_heads = 0;  // 0 = num_heads
  int64_t q_dim = 0;         // 0 = embed_dim
  int64_t kdim = 0;          // 0 = embed_dim
  int64_t vdim = 0;          // 0 = embed_dim
  int64_t head_dim = 0;      // 0 = embed_dim / num_heads; E = num_heads * head_dim
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  bool causal = false;
  double scale = 0;  // <= 0: 1 / sqrt(head_dim)

  // Variants (see the top of this file); every field at its default is off.
  Rope rope = Rope::kNone;
  double rope_theta = 0;   // <= 0: 10000
  int64_t rotary_dim = 0;  // 0: head_dim
  double rope_scale = 0;   // <= 0: 1
  std::vector<double> rope_inv_freq;  // [rd / 2]; non-empty: replaces theta and rope_scale
  double rope_attention = 1;          // cos and sin multiplied by it
  bool alibi = false;
  std::vector<double> alibi_slopes;    // [H]; empty: StandardAlibiSlopes(H)
  int64_t window = 0;                  // 0: none
  double softcap = 0;                  // 0: off
  std::vector<double> sinks;           // [H]; empty: none
  std::vector<double> q_norm, k_norm;  // [hd] each, or [E] and [kvE] when qk_norm_whole
  bool qk_norm_whole = false;
  double qk_norm_eps = 0;  // <= 0: 1e-6
};

struct Weights {
  std::vector<double> wq, wk, wv;  // [E, q_dim], [kvE, kdim], [kvE, vdim]; kvE = kv_heads * hd
  std::vector<double> bq, bk, bv;  // [E], [kvE], [kvE] (each empty when unbiased)
  std::vector<double> wo, bo;      // [D, E], [D] (D = embed_dim)
  std::vector<double> bias_k, bias_v;  // [kvE] when add_bias_kv
};

struct Inputs {
  int64_t batch = 1, tgt_len = 1, src_len = 1;  // N, L, S
  std::vector<double> query, key, value;        // dense batch-first
  MaskKind attn_mask_kind = MaskKind::kNone;
  bool attn_mask_3d = false;                     // [N * H, L, S] instead of [L, S]
  std::vector<double> attn_mask;                 // bool: nonzero = masked out
  MaskKind key_padding_mask_kind = MaskKind::kNone;
  std::vector<double> key_padding_mask;          // [N, S]; bool: nonzero = ignore
  std::vector<int64_t> positions;                // [N, L]; empty: 0..L-1
  std::vector<int64_t> key_positions;            // [N, S]; empty: see self_attention
  // The keys are the queries (mha's absent key): keys take the query positions when
  // key_positions is empty (requires S == L); otherwise keys default to 0..S-1.
  bool self_attention = false;
};

struct Outputs {
  std::vector<double> output;        // [N, L, E]
  std::vector<double> head_weights;  // [N, H, L, S_total]
  std::vector<double> mean_weights;  // [N, L, S_total]
  // Projected per head after QK-norm and RoPE: [N, H, L, hd], [N, kvH, S_total, hd].
  std::vector<double> q, k, v;
  int64_t total_src_len = 0;         // S + add_bias_kv + add_zero_attn
};

void Attention(const Config& config, const Weights& weights, const Inputs& inputs,
               Outputs* outputs);

}  // namespace reference
}  // namespace mha

#endif  // MHA_TESTS_REFERENCE_REFERENCE_ATTENTION_H_
