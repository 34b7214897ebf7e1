// The attention variants' command-line flags that mha-run and mha-bench share, parsed once with
// one set of messages:
//   --kv-heads K      key/value heads of a grouped-query layer (1..2^24)
//   --rope S          rotary embedding: neox or gptj
//   --rope-theta F    RoPE base (> 0)            --rope-scale F   linear interpolation (> 0)
//   --rotary-dim N    rotated features (1..2^40) --window W       sliding window (1..2^40)
//   --softcap F       score cap (> 0)            --qk-norm-eps F  QK-norm epsilon (>= 0)
//   --alibi           ALiBi (no value)
// Each tool checks what depends on its own settings (head_dim, heads) after parsing.
#ifndef MHA_TOOLS_VARIANT_FLAGS_H_
#define MHA_TOOLS_VARIANT_FLAGS_H_

#include <cstdint>
#include <string>

#include "mha/mha.hpp"

namespace mha {
namespace tools {

// The flags' values; 0 / kNone / false = not given.
struct VariantFlags {
  int64_t kv_heads = 0;
  RopeStyle rope = RopeStyle::kNone;
  float rope_theta = 0.0f;
  int64_t rotary_dim = 0;
  float rope_scale = 0.0f;
  bool alibi = false;
  int64_t window = 0;
  float softcap = 0.0f;
  float qk_norm_eps = 0.0f;
};

enum class VariantFlagKind { kNotVariant, kTakesValue, kSwitch };
// Whether `flag` ("--window") is one of the flags above, and whether it takes a value.
VariantFlagKind VariantFlagKindOf(const std::string& flag);

// Parses `flag` (kTakesValue: with `value`; kSwitch: value ignored) into *flags. On a bad value
// returns false with *error naming the flag, what it expects and the value given
// ("--window: expected an integer in [1, 1099511627776], got '0'").
bool ParseVariantFlag(const std::string& flag, const std::string& value, VariantFlags* flags,
                      std::string* error);

// The checks between flags: --rope-theta, --rotary-dim and --rope-scale need --rope. False with
// *error otherwise.
bool CheckVariantFlags(const VariantFlags& flags, std::string* error);

}  // namespace tools
}  // namespace mha

#endif  // MHA_TOOLS_VARIANT_FLAGS_H_
