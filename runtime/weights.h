// Loading torch.nn.MultiheadAttention weights from a safetensors file by state_dict name.
//
// Names (each preceded by `prefix`, which includes its trailing dot, e.g.
// "encoder.layers.3.self_attn."; "" for a bare module):
//   in_proj_weight   [3E, D]    packed q, k, v projections (PyTorch uses it when
//                               kdim == vdim == embed_dim, D = E; mha accepts any D, a
//                               fused Linear(D, 3E), and then q_dim = kdim = vdim = D)
//   q_proj_weight    [E, q_dim] separate projections (PyTorch uses them when kdim or vdim
//   k_proj_weight    [R, kdim]  differ from embed_dim; PyTorch's q_dim is always E, mha accepts
//   v_proj_weight    [R, vdim]  any q_dim). R = E for PyTorch; R = kvE = num_kv_heads *
//                               head_dim < E for a grouped-query layer
//   in_proj_bias     [E + 2R]   q, k, v biases, packed in both layouts (bias=True)
//   out_proj.weight  [E, E]
//   out_proj.bias    [E]        (bias=True)
//   bias_k, bias_v   [1, 1, R]  (add_bias_kv=True)
// Rules, each violation an error naming the full tensor name, the expected and actual shape:
//   - E is taken from out_proj.weight, which must be present, rank 2, square and non-empty;
//   - exactly one layout: in_proj_weight, or all three of q/k/v_proj_weight (never both, never
//     a partial set); q has E rows, k and v the same number R > 0 of rows, all at least one
//     column (whether R suits the head count is checked where the head count is known);
//   - in_proj_bias is present iff out_proj.bias is (PyTorch ties both to `bias=`);
//   - bias_k and bias_v are both present or both absent;
//   - every tensor is F32, F16 or BF16; other dtypes are Unsupported. Biases are widened
//     exactly to f32; weight matrices too, except that those stored in the `keep` dtype (BF16
//     or F16, when the caller asks) are kept as their 16-bit values.
// The attention variants' tensors (LoadVariants), each optional, F32/F16/BF16 widened to f32:
//   sinks            [H]        one softmax sink logit per head (gpt-oss `self_attn.sinks`)
//   alibi_slopes     [H]        ALiBi slopes; present = ALiBi on
//   q_norm.weight    [hd] or [E]    QK-norm weights: [hd] per head (Qwen3, Gemma 3), or the
//   k_norm.weight    [hd] or [kvE]  whole projection (OLMo 2; q [E] with E != hd selects it)
// q_norm.weight and k_norm.weight are both present or both absent.
// Tensors under other names (the rest of a model) are ignored.
//
// The packed [3E, D] matrix is split in PyTorch's order: rows [0, E) are q, [E, 2E) k,
// [2E, 3E) v. Other packings (e.g. per-head interleaved q/k/v rows) are a caller option of the
// attention operator, not of the loader: the raw packed tensors are kept in in_proj_weight /
// in_proj_bias so the operator can reinterpret them.
#ifndef MHA_RUNTIME_WEIGHTS_H_
#define MHA_RUNTIME_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "mha/types.hpp"
#include "runtime/safetensors.h"

namespace mha {

// One weight matrix as loaded, row-major: f32 values, or the 16-bit values as stored.
struct WeightTensor {
  DType dtype = DType::kF32;   // kF32, or the kept kBF16 / kF16
  std::vector<float> f32;      // when dtype == kF32
  std::vector<uint16_t> bits;  // when dtype is kBF16 or kF16

  const void* data() const {
    return dtype == DType::kF32 ? static_cast<const void*>(f32.data())
                                : static_cast<const void*>(bits.data());
  }
  size_t size() const { return dtype == DType::kF32 ? f32.size() : bits.size(); }
  // Elements [begin, begin + n) as a tensor of the same dtype.
  WeightTensor Slice(size_t begin, size_t n) const;
};

// Row-major like nn.Linear ([out_features, in_features]); biases f32.
struct MhaWeights {
  // Inferred from the shapes.
  int64_t embed_dim = 0, q_dim = 0, kdim = 0, vdim = 0;
  // in_proj_bias and out_proj.bias present.
  bool bias = false;
  // bias_k and bias_v present.
  bool add_bias_kv = false;
  // in_proj_weight was present (then q_dim == kdim == vdim == embed_dim).
  bool packed_in_proj = false;
  // Rows of k_proj_weight / v_proj_weight (R above; E when packed).
  int64_t kv_rows = 0;
  WeightTensor w_q, w_k, w_v;         // [E, q_dim], [R, kdim], [R, vdim]
  std::vector<float> b_q, b_k, b_v;   // [E], [R], [R]; empty when !bias
  WeightTensor w_out;                 // [E, E]
  std::vector<float> b_out;           // [E]; empty when !bias
  std::vector<float> bias_k, bias_v;  // [R] each when add_bias_kv, else empty
  // The raw packed tensors, only when packed_in_proj: [3E, D] and [3E] (the latter empty when
  // !bias). Empty otherwise.
  WeightTensor in_proj_weight;
  std::vector<float> in_proj_bias;
};

// Fills *out (replaced only on success). `keep`: kF32 (widen every weight), kBF16 / kF16
// (weight matrices stored in that dtype stay 16-bit), or kI8 / kI4 (a layer that quantizes
// them: matrices stored in either 16-bit dtype stay as stored). FormatError for missing or
// inconsistent tensors, Unsupported for a non-float dtype.
Status LoadMhaWeights(const SafeTensorsFile& file, const std::string& prefix, MhaWeights* out,
                      DType keep = DType::kF32);

// The variant tensors as loaded (f32, Gemma's +1 applied); empty = absent.
struct VariantTensors {
  std::vector<float> sinks;         // [H]
  std::vector<float> alibi_slopes;  // [H]
  std::vector<float> q_norm;        // [hd], or [E] when whole
  std::vector<float> k_norm;        // [hd], or [kvE] when whole
  bool qk_norm_whole = false;
};

// Reads the variant tensors for a layer of config->embed_dim, num_heads and num_kv_heads (set
// by the caller) and sets the variant fields of *config (options' scalars; alibi when slopes
// are present or options.alibi; qk_norm_whole from the norm shapes) and of *weights (pointers
// into *tensors, which must outlive the layer's creation). options.qk_norm_add_one adds 1 to the
// norm weights. FormatError naming the tensor for a bad shape or a lone q/k norm weight,
// Unsupported for a non-float dtype.
Status LoadVariants(const SafeTensorsFile& file, const std::string& prefix,
                    const LoadOptions& options, VariantTensors* tensors, AttentionConfig* config,
                    AttentionWeights* weights);

}  // namespace mha

#endif  // MHA_RUNTIME_WEIGHTS_H_
