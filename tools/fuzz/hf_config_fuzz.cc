// libFuzzer target for the Hugging Face config.json reader (runtime/hf_config.{h,cc}).
//
// Each input is a config.json's bytes. HfConfig::Parse runs on them; when it succeeds, every
// module kind of the family is read for layers 0..3 (and the last layer), so the defaults, the
// key aliases, the layer-type rules and both RoPE forms run on whatever the mutator produced.
// Errors are the expected outcome for most inputs; crashes, leaks, UB, timeouts and broken
// invariants of the settings returned (below) are findings.
// Built and run by tools/fuzz/run-fuzz (clang++ -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/hf_config.h"

namespace {

void CheckOrAbort(bool ok, const char* what, const std::string& context) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n%s\n", what, context.c_str());
    std::abort();
  }
}

// What ModuleSettings promises of a success.
void CheckSettings(const mha::HfModuleSettings& s, const std::string& context) {
  const mha::AttentionConfig& c = s.config;
  CheckOrAbort(s.hidden_size > 0 && s.hidden_size <= mha::kHfMaxHidden, "hidden_size", context);
  CheckOrAbort(s.num_heads > 0 && s.num_heads <= mha::kHfMaxHeads, "num_heads", context);
  CheckOrAbort(s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0, "num_kv_heads", context);
  CheckOrAbort(s.head_dim > 0 && s.num_heads * s.head_dim <= mha::kHfMaxHidden, "head_dim",
               context);
  CheckOrAbort(c.embed_dim == s.hidden_size && c.num_heads == s.num_heads &&
                   c.num_kv_heads == s.num_kv_heads,
               "config dimensions", context);
  CheckOrAbort(
      c.head_dim == 0 ? s.num_heads * s.head_dim == s.hidden_size : c.head_dim == s.head_dim,
      "config head_dim", context);
  CheckOrAbort(c.rotary_dim >= 0 && c.rotary_dim <= s.head_dim && c.rotary_dim % 2 == 0,
               "rotary_dim", context);
  const int64_t rd = c.rotary_dim == 0 ? s.head_dim : c.rotary_dim;
  CheckOrAbort(c.rope_scaling != mha::RopeScaling::kLongRope ||
                   (s.rope_short_factor.size() == static_cast<size_t>(rd / 2) &&
                    s.rope_long_factor.size() == static_cast<size_t>(rd / 2)),
               "longrope factors", context);
  CheckOrAbort(s.alibi_slopes.empty() || s.alibi_slopes.size() == static_cast<size_t>(s.num_heads),
               "alibi slopes", context);
  CheckOrAbort(c.window >= 0 && c.softcap >= 0.0f && c.scale >= 0.0f, "window/softcap/scale",
               context);
  CheckOrAbort(!(s.causal && s.cross_attention), "causal cross-attention", context);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mha::HfConfig config;
  mha::Status s = mha::HfConfig::Parse(text, "config.json", &config);
  if (!s.ok()) {
    CheckOrAbort(!s.message().empty(), "failed Status without a message", text);
    return 0;
  }
  for (const mha::HfModuleKind& kind : config.family().modules) {
    int64_t layers = 0;
    if (!config.NumLayers(kind, &layers).ok()) continue;
    for (int64_t layer : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, layers - 1, layers}) {
      mha::HfModuleSettings settings;
      s = config.ModuleSettings(kind, layer, &settings);
      if (!s.ok()) {
        CheckOrAbort(!s.message().empty(), "failed Status without a message", text);
        CheckOrAbort(layer < layers || s.code() == mha::StatusCode::kInvalidArgument ||
                         s.code() == mha::StatusCode::kFormatError ||
                         s.code() == mha::StatusCode::kUnsupported,
                     "out-of-range layer error code", text);
        continue;
      }
      CheckOrAbort(layer >= 0 && layer < layers, "a layer out of range was accepted", text);
      CheckSettings(settings, text);
    }
  }
  return 0;
}
