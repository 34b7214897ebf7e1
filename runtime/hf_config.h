// config.json of a Hugging Face checkpoint -> the settings of one attention module.
//
// Reading is strict: every value mha uses must have the JSON type transformers expects (an
// integer where it takes an int, a boolean where it takes a bool; a float is accepted for an
// integer-valued number setting only where transformers takes a float), and every error is a
// FormatError naming the file, the key, what was expected and what was found:
//   "/m/config.json: num_attention_heads: expected a positive integer, got \"4\""
// Keys absent from config.json take the family's defaults (transformers' configuration class);
// an explicit null keeps transformers' meaning of None (sliding_window null = no window,
// num_key_value_heads null = num_attention_heads, ...).
//
// RoPE settings come from either form transformers reads (its RotaryEmbeddingConfigMixin):
//   classic:          rope_theta, partial_rotary_factor (GPT-NeoX: rotary_emb_base,
//                     rotary_pct), rope_scaling {"type" | "rope_type", "factor", ...}
//   transformers 5:   rope_parameters {"rope_type", "rope_theta", "factor", ...}, or one such
//                     dict per layer type {"full_attention": {...}, "sliding_attention": {...}}
// rope_scaling, when a non-empty object, takes precedence over rope_parameters, as in
// transformers. Types: default, linear (AttentionConfig::rope_scale), dynamic, llama3, yarn
// (its attention factor computed here, including the mscale / mscale_all_dim form), longrope
// (short/long factors). Any other type, and any setting mha cannot honour, is Unsupported
// naming it; nothing is approximated.
//
// Internal: not installed. The fuzz target tools/fuzz/hf_config_fuzz.cc runs it on any bytes.
#ifndef MHA_RUNTIME_HF_CONFIG_H_
#define MHA_RUNTIME_HF_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/hf_families.h"

namespace mha {

// Bounds that keep every size product far inside 64 bits (and inside the operator's limits).
inline constexpr int64_t kHfMaxHidden = int64_t{1} << 24;
inline constexpr int64_t kHfMaxHeads = int64_t{1} << 16;
inline constexpr int64_t kHfMaxHeadDim = int64_t{1} << 16;
inline constexpr int64_t kHfMaxLayers = int64_t{1} << 20;
// config.json larger than this is not a configuration.
inline constexpr size_t kHfMaxConfigBytes = size_t{16} << 20;

// Everything config.json decides about one attention module.
struct HfModuleSettings {
  const HfFamily* family = nullptr;
  const HfModuleKind* kind = nullptr;
  int64_t layer = 0;  // index in its stack
  int64_t hidden_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  HfLayout layout = HfLayout::kSeparate;  // resolved (Falcon's variant)
  uint32_t biases = 0;                    // ProjectionBias mask of the biased projections
  bool causal = false;
  bool cross_attention = false;
  std::string layer_type;  // "full_attention" / "sliding_attention", or "" (no layer types)
  // The operator's settings: dimensions, biases, scale, RoPE (and its scaling), ALiBi, window,
  // softcap, QK-norm eps and form. The caller sets weight storage, compute and layout options.
  AttentionConfig config;
  std::vector<float> rope_short_factor, rope_long_factor;  // longrope: [rotary_dim / 2]
  std::vector<float> alibi_slopes;  // explicit slopes (Falcon's scaled ones); empty = default
  HfQkNorm qk_norm = HfQkNorm::kNone;
  bool sinks = false;
};

// Reads a whole small file (a JSON file of the checkpoint). IoError naming `path` when it cannot
// be read; FormatError when it holds more than `max_bytes`.
Status ReadHfTextFile(const std::string& path, size_t max_bytes, std::string* out);
// Parses JSON text (nesting bounded, so hostile depth cannot exhaust anything); FormatError
// naming `label` and the parser's position.
Status ParseHfJson(const std::string& text, const std::string& label, nlohmann::json* out);

class HfConfig {
 public:
  // Parses config.json's text; `label` (the file's path) starts every message. FormatError for
  // malformed JSON, a non-object, a missing or non-string model_type; Unsupported for a
  // model_type outside the family table (the message lists the supported ones).
  static Status Parse(const std::string& text, const std::string& label, HfConfig* out);
  // Reads and parses the file. IoError when it cannot be read (or is larger than
  // kHfMaxConfigBytes: FormatError).
  static Status Load(const std::string& path, HfConfig* out);

  const std::string& model_type() const { return model_type_; }
  const HfFamily& family() const { return *family_; }
  const std::string& label() const { return label_; }

  // The layer count of `kind`'s stack (num_hidden_layers, Whisper's decoder_layers, ...).
  Status NumLayers(const HfModuleKind& kind, int64_t* out) const;
  // The settings of `kind`'s module in layer `layer` (checked against NumLayers: InvalidArgument
  // when out of range).
  Status ModuleSettings(const HfModuleKind& kind, int64_t layer, HfModuleSettings* out) const;

 private:
  std::string label_;
  std::string model_type_;
  const HfFamily* family_ = nullptr;
  std::string key_prefix_;  // "text_config." when the settings are a text_config
  // The settings object (config.json's, or its text_config) over the family's defaults.
  std::shared_ptr<const nlohmann::json> settings_;
  // Canonical key -> the key config.json used (attribute_map aliases), for messages.
  std::map<std::string, std::string> source_keys_;
};

}  // namespace mha

#endif  // MHA_RUNTIME_HF_CONFIG_H_
