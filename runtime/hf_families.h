// The Hugging Face families mha reads: one table row per model_type, naming what a checkpoint of
// that family holds (the attention modules' state_dict names and fused layouts), which settings
// its config.json carries (and their defaults when absent), and the rules transformers applies
// to them. Each row follows transformers' configuration_<family>.py (defaults) and
// modeling_<family>.py (names, layouts, scaling, norms, masks); README "Hugging Face checkpoints"
// is the user's view of the same table. Read by hf_config (settings) and hf_weights (tensors).
// Internal: not installed.
#ifndef MHA_RUNTIME_HF_FAMILIES_H_
#define MHA_RUNTIME_HF_FAMILIES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mha {

// How the q, k and v projections are stored.
enum class HfLayout : int {
  kSeparate,       // q, k, v: nn.Linear weights [out, in] of their own
  kFusedRows,      // one nn.Linear [A + 2 kvE, D]: all q rows, then k, then v (Phi-3 qkv_proj)
  kConv1D,         // GPT-2's Conv1D: c_attn [D, 3E] = [in, out] (q | k | v columns), c_proj [E, E]
                   // transposed likewise
  kConv1DCross,    // GPT-2's cross-attention: q_attn [D, E], c_attn [D, 2E] (k | v columns)
  kPerHead,        // one nn.Linear [3E, D] whose rows are [H, 3, hd] (GPT-NeoX, BLOOM)
  kFalcon,         // Falcon's query_key_value: resolved from the config (the three below)
  kFalconGrouped,  // new_decoder_architecture: rows [kvH, H / kvH + 2, hd] (q heads, k, v)
  kFalconMultiQuery,  // multi_query: rows [H + 2, hd] (H q heads, one k, one v)
};

// What a module's keys and values are, and whether it is causal.
enum class HfRole : int {
  kDecoderSelf,     // causal self-attention
  kEncoderSelf,     // bidirectional self-attention
  kSelfFromConfig,  // causal iff config.json's is_decoder (BERT, RoBERTa)
  kCross,           // queries from the decoder, keys and values from the encoder
};

// State_dict names relative to the module's prefix, without ".weight" / ".bias"; null = absent.
struct HfTensorNames {
  const char* q = nullptr;  // separate projections
  const char* k = nullptr;
  const char* v = nullptr;
  const char* qkv = nullptr;     // fused projection (kFusedRows, kConv1D, kPerHead, kFalcon*)
  const char* kv = nullptr;      // fused k | v (kConv1DCross)
  const char* out = nullptr;     // output projection
  const char* q_norm = nullptr;  // QK-norm weights
  const char* k_norm = nullptr;
  const char* sinks = nullptr;  // a parameter: the name is the tensor's, no suffix
};

// One attention module of a layer, found by the tail of its state_dict prefix. `pattern` holds
// "{i}" where the layer index goes: "layers.{i}.self_attn." matches
// "model.layers.3.self_attn." (the leading part is whatever the model class put there).
struct HfModuleKind {
  const char* pattern = nullptr;
  HfRole role = HfRole::kDecoderSelf;
  // Chosen by a layer index (the first such kind whose tensors the checkpoint holds), or only
  // through HfOptions::prefix.
  bool by_layer_index = true;
  const char* heads_key = "num_attention_heads";  // its head count's config key
  const char* layers_key = "num_hidden_layers";   // its stack's layer count's config key
  HfLayout layout = HfLayout::kSeparate;
  HfTensorNames names;
};

// How the score scale is chosen.
enum class HfScale : int {
  kDefault,             // 1 / sqrt(head_dim)
  kQueryPreAttnScalar,  // query_pre_attn_scalar^-0.5 (Gemma 2, Gemma 3)
  kGpt2,                // 1 / sqrt(hd) if scale_attn_weights else 1, / (layer + 1) if
                        // scale_attn_by_inverse_layer_idx
};

enum class HfRope : int {
  kNone,
  kNeox,             // rotate_half pairs (x_i, x_{i + rd/2})
  kGptj,             // rotate_every_two pairs (x_2i, x_2i+1); theta 10000, rotary_dim from config
  kNeoxUnlessAlibi,  // Falcon: RoPE when config.alibi is false
};

// Which layers have a sliding window (of config.sliding_window positions).
enum class HfWindow : int {
  kNone,
  kAllLayers,   // every layer (Mistral, Mixtral, Phi-3)
  kLayerTypes,  // the layers layer_types names "sliding_attention"; absent layer_types follow
                // `default_types`
};

// layer_types when config.json has none (each family's configuration __post_init__).
enum class HfDefaultTypes : int {
  kAllFull,
  kEveryOther,       // sliding iff (i + 1) % 2 != 0 (Gemma 2, gpt-oss)
  kPattern,          // sliding iff (i + 1) % sliding_window_pattern != 0 (Gemma 3; default 6)
  kMaxWindowLayers,  // sliding iff sliding_window is set and i >= max_window_layers (Qwen2, Qwen3)
};

enum class HfQkNorm : int {
  kNone,
  kPerHead,         // RMSNorm over each head, weight w (Qwen3)
  kPerHeadPlusOne,  // RMSNorm over each head, weight 1 + w (Gemma 3)
  kWhole,           // RMSNorm over the whole projection (OLMo 2)
};

enum class HfAlibi : int {
  kNone,
  kAlways,        // BLOOM: the ALiBi paper's slopes
  kFalconConfig,  // Falcon with config.alibi: (q.k + slope * j) / sqrt(hd), so slopes / sqrt(hd)
};

// A setting whose value mha cannot honour: config key `key` holding anything but `accepted`
// (a JSON literal, e.g. "false", "\"absolute\"") is Unsupported with `reason`. Absent and null
// are accepted.
struct HfRefusal {
  const char* key;
  const char* accepted;
  const char* reason;
};

struct HfFamily {
  const char* model_type = nullptr;
  // The configuration class's defaults as a JSON object (keys absent from config.json take
  // these; explicit nulls in config.json stay null, as in transformers).
  const char* defaults = "{}";
  // attribute_map: config.json may name a setting by `first`; it is read as `second`.
  std::vector<std::pair<const char*, const char*>> key_aliases;
  // Multimodal configs: the text model's settings are config.json's text_config (Gemma 3).
  bool text_config = false;
  std::vector<HfModuleKind> modules;

  // Biases: `bias_key` (a boolean setting) switches all four projections; null = the fixed
  // mask `fixed_biases` (a ProjectionBias mask).
  const char* bias_key = nullptr;
  uint32_t fixed_biases = 0;

  // num_key_value_heads (null or absent = the head count); null = no grouped-query setting.
  const char* kv_heads_key = nullptr;
  bool head_dim_key = false;  // head_dim from config.json (else hidden_size / heads)
  HfScale scale = HfScale::kDefault;

  HfRope rope = HfRope::kNone;
  double default_theta = 10000.0;       // default_theta of the configuration class
  double default_local_theta = 0.0;     // > 0: sliding layers' own base (Gemma 3:
                                        // rope_local_base_freq, 10000)
  const char* theta_alias = nullptr;    // legacy top-level key for rope_theta (GPT-NeoX)
  bool partial_rotary = false;          // honours partial_rotary_factor (else RoPE is full-width)
  const char* partial_alias = nullptr;  // legacy top-level key for it (GPT-NeoX rotary_pct)
  double default_partial = 1.0;         // when absent (Phi 0.5, GPT-NeoX 0.25)
  // rope_type names mapped to another (Phi-3: "su" and "yarn" are longrope).
  std::vector<std::pair<const char*, const char*>> rope_type_aliases;
  // Top-level original_max_position_embeddings overrides the RoPE dict's (Phi-3's attribute).
  bool original_max_top_level = false;
  // rope_parameters when config.json has none (gpt-oss: YaRN), a JSON object or null.
  const char* default_rope = nullptr;

  HfWindow window = HfWindow::kNone;
  HfDefaultTypes default_types = HfDefaultTypes::kAllFull;
  const char* window_gate = nullptr;  // a boolean that must be true for any window (Qwen2/3:
                                      // use_sliding_window)

  HfQkNorm qk_norm = HfQkNorm::kNone;
  const char* norm_eps_key = "rms_norm_eps";
  const char* softcap_key = nullptr;  // attn_logit_softcapping (Gemma 2, Gemma 3)
  bool sinks = false;                 // per-head sink logits (gpt-oss)
  HfAlibi alibi = HfAlibi::kNone;
  // Gemma 3's use_bidirectional_attention: no causal mask, sliding windows become
  // |i - j| < sliding_window / 2 + 1 (transformers' Gemma3TextConfig).
  bool bidirectional_key = false;
  std::vector<HfRefusal> refusals;
};

// The row of `model_type`, or null.
const HfFamily* FindHfFamily(const std::string& model_type);
// "bert, bloom, falcon, ..." (sorted), for error messages and the README.
std::string SupportedHfModelTypes();
// Every row (tests and the fuzz target walk them).
const std::vector<HfFamily>& HfFamilies();

}  // namespace mha

#endif  // MHA_RUNTIME_HF_FAMILIES_H_
