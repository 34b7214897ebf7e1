// The resolved configuration and bound weights of a MultiheadAttention layer: configuration
// checks, weight binding (views or owned copies), the per-head packed layout's reorder, element
// type conversion and prepacking. Shared by the operator's rooms and the KV-cache decoder.
// Internal: not installed.
#ifndef MHA_RUNTIME_LAYER_WEIGHTS_H_
#define MHA_RUNTIME_LAYER_WEIGHTS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/large_buffer.h"
#include "runtime/parallel_gemm.h"
#include "runtime/rope_scaling.h"

namespace mha {

// The attention variants of a layer, resolved (AttentionConfig's fields with defaults applied,
// and AttentionWeights' variant tensors copied). Every member empty/zero = off.
struct LayerVariants {
  RopeStyle rope = RopeStyle::kNone;
  int64_t rotary_dim = 0;             // resolved (head_dim when 0 was given); 0 without RoPE
  // [rotary_dim / 2]: theta^(-2i / rotary_dim) / rope_scale, or rope_scaling's frequencies
  // (kDynamic, kLongRope: those of calls up to rope_original_max_positions; rope_scaling.h).
  std::vector<double> inv_freq;
  RopeScalingParams rope_scaling;     // resolved; its attention factor scales cos and sin
  std::vector<float> alibi_slopes;    // [H], given or the ALiBi paper's; empty without ALiBi
  std::vector<float> sinks;           // [H] or empty
  std::vector<float> q_norm, k_norm;  // [hd] ([E] / [kvE] when qk_norm_whole) or empty
  float qk_norm_eps = 1e-6f;
  bool qk_norm_whole = false;
  int64_t window = 0;
  float softcap = 0.0f;

  bool any_position() const {
    return rope != RopeStyle::kNone || !alibi_slopes.empty() || window > 0;
  }
  bool qk_transform() const { return rope != RopeStyle::kNone || !q_norm.empty(); }
};

// The first key position a causal query at position q sees through a window of W positions
// (p_q - W < p_k <= p_q): q - W + 1, at least 0; 0 without a window (W = 0).
inline int64_t WindowBandStart(int64_t q, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, q - window + 1) : 0;
}

// Dimensions: D = embed_dim (the output's features), H heads, KVH key/value heads, hd the head
// width (config.head_dim, or D / H), E = H * hd the attention width (q's and the attention
// results' features: D unless head_dim says otherwise), kvE = KVH * hd; qd, kd, vd the input
// features of query, key, value (resolved: never 0).
struct LayerWeights {
  // Unique per layer in the process, never reused (BindLayerWeights): the plan caches' key
  // (plan_cache.h) for everything a plan reads from the layer.
  uint64_t id = 0;
  AttentionConfig config;
  int64_t D = 0, E = 0, H = 0, KVH = 0, hd = 0, kvE = 0, qd = 0, kd = 0, vd = 0;
  uint32_t biases = 0;  // resolved ProjectionBias mask: which projections add a bias
  float scale = 1.0f;  // resolved score scale
  size_t block = 0;    // kI4 weights: inputs per scale (resolved weight_block); else 0
  // Weights in nn.Linear layout ([out, in], row-major, config.weight_dtype): the caller's
  // arrays (kView) or owned copies (kCopy, and always for the per-head packed layout,
  // reordered to q, k, v rows): `owned` holds f32 weights, `owned16` 16-bit weights,
  // `owned_biases` every bias. A copy keeps only its packings when every product reads one
  // (KeepOnlyPackings): the matrices' `data` are then null.
  LargeArray<float> owned;
  LargeArray<uint16_t> owned16;
  std::vector<float> owned_biases;
  // Separate q/k/v biases gathered as one [E + 2 kvE] array (zeros for an unbiased part).
  std::vector<float> qkv_bias;
  // w_q, w_k, w_v are adjacent rows of one [E + 2 kvE, qd] matrix (same input dims): the
  // self-attention projections may run as one product (w_packed).
  bool qkv_adjacent = false;
  WeightMatrix w_packed;            // [E + 2 kvE, qd], rows q, k, v, when qkv_adjacent
  const float* b_packed = nullptr;  // [E + 2 kvE] or null
  WeightMatrix w_q;                 // [E, qd]
  WeightMatrix w_k;                 // [kvE, kd]
  WeightMatrix w_v;                 // [kvE, vd]
  const float* b_q = nullptr;       // [E] or null
  const float* b_k = nullptr;       // [kvE] or null
  const float* b_v = nullptr;       // [kvE] or null
  const float* bias_k = nullptr;    // [kvE] when add_bias_kv
  const float* bias_v = nullptr;
  WeightMatrix w_o;            // [D, E]
  const float* b_o = nullptr;  // [D] or null
  LayerVariants variants;
  // Quantized weights (config.weight_dtype kI8 / kI4, always owned): the codes and scales of
  // [w_q | w_k | w_v] as one matrix when qkv_adjacent (w_packed's `quant`, whose row ranges
  // w_q, w_k, w_v take), else of each, then of w_o (their `quant` members point here, 64-byte
  // aligned; kernels/quant.h's layout). The matrices' `data` are null.
  LargeArray<uint8_t> quantized;
  // config.prepack: the packings of w_q, w_k, w_v and w_o (their `packed` members point here;
  // empty when nothing is packed). w_packed is never prepacked: with prepacked weights the
  // fused projection runs as three products into the column ranges of its buffer.
  LargeArray<float> prepacked;
  // Compute::kBF16: w_q, w_k, w_v and w_o packed as bf16 (their `bf16` members point here;
  // empty otherwise), or w_packed whole with w_q, w_k, w_v its column ranges when they start on
  // bf16 panels; the f32 prepacking is then not made.
  LargeArray<uint16_t> bf16_packed;
  // config.prepack kOn: the Strassen operands of the matrices StrassenPacks() takes (their
  // `strassen` members point here; empty when none).
  LargeArray<float> strassen_packed;

  // Key/value positions appended after the S real ones (add_bias_kv, add_zero_attn): S' - S.
  int64_t Extra() const { return (config.add_bias_kv ? 1 : 0) + (config.add_zero_attn ? 1 : 0); }

  // Fills `prepacked`, `strassen_packed` and the matrices' `packed` / `strassen` when
  // config.prepack applies (f32 weights, a micro-kernel that prefers row-major C), or
  // `bf16_packed` and the matrices' `bf16` with Compute::kBF16. Called once by BindLayerWeights
  // after the weights are bound.
  void Prepack();

  // Whether every product by w_q, w_k, w_v and w_o reads a packing, on every route and for every
  // row count, head and column range the operator multiplies: the f32 prepacking where the
  // direct kernel takes every prepacked product (kernels::PrepackedMinRows() == 1) and heads
  // start on its micro-panels (hd a multiple of NR), or the bf16 packing (Compute::kBF16) with
  // heads on its panels (hd a multiple of kBf16PanelCols). From the configuration alone: known
  // before the weights are bound.
  bool PackingsServeEveryProduct() const;

  // For a kCopy layer after Prepack, when PackingsServeEveryProduct(): keeps only the packings
  // (and the owned biases), freeing `owned` / `owned16` or forgetting the caller's arrays they
  // were packed from; the matrices' `data` are then null. Called once by BindLayerWeights.
  void KeepOnlyPackings();
};

// Checks `config` and `weights` (messages prefixed "MultiheadAttention::Create: "), resolves the
// configuration into `m` and binds the weights as `binding` says, then prepacks them.
Status BindLayerWeights(const AttentionConfig& config, const AttentionWeights& weights,
                        WeightBinding binding, LayerWeights* m);

// Whether a weight dtype is a quantized one (kI8, kI4).
inline bool IsQuantized(DType dtype) { return dtype == DType::kI8 || dtype == DType::kI4; }

// Copies n elements of type `from` at src into dst as type `to` (each kF32, kBF16 or kF16):
// f32 -> 16-bit rounds to nearest even, 16-bit -> f32 is exact, bf16 <-> f16 goes through f32
// (exact, then rounded once; a temporary, so creation-time only for 16-bit sources).
void ConvertElements(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace mha

#endif  // MHA_RUNTIME_LAYER_WEIGHTS_H_
