// Reference multi-head attention in double precision, written for clarity, not speed. It is the
// oracle the kernels and the operator are tested against. Semantics are those of
// torch.nn.MultiheadAttention.forward in eval mode, with mha's documented differences:
// fully-masked query rows get all-zero attention weights (PyTorch: NaN), so their attention
// output before the output projection is zero; `causal` masks key j > query i (top-left
// aligned, as torch's scaled_dot_product_attention(is_causal=True)) over the S real keys;
// num_kv_heads < num_heads repeats each K/V head for num_heads / num_kv_heads query heads.
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

struct Config {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  int64_t num_kv_heads = 0;  // 0 = num_heads
  int64_t q_dim = 0;         // 0 = embed_dim
  int64_t kdim = 0;          // 0 = embed_dim
  int64_t vdim = 0;          // 0 = embed_dim
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  bool causal = false;
  double scale = 0;  // <= 0: 1 / sqrt(head_dim)
};

struct Weights {
  std::vector<double> wq, wk, wv;  // [E, q_dim], [kvE, kdim], [kvE, vdim]; kvE = kv_heads * hd
  std::vector<double> bq, bk, bv;  // [E], [kvE], [kvE] (empty when !bias)
  std::vector<double> wo, bo;      // [E, E], [E]
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
};

struct Outputs {
  std::vector<double> output;        // [N, L, E]
  std::vector<double> head_weights;  // [N, H, L, S_total]
  std::vector<double> mean_weights;  // [N, L, S_total]
  std::vector<double> q, k, v;       // projected per head: [N, H, L, hd], [N, kvH, S_total, hd]
  int64_t total_src_len = 0;         // S + add_bias_kv + add_zero_attn
};

void Attention(const Config& config, const Weights& weights, const Inputs& inputs,
               Outputs* outputs);

}  // namespace reference
}  // namespace mha

#endif  // MHA_TESTS_REFERENCE_REFERENCE_ATTENTION_H_
