// The attention variants' shared command-line flags (variant_flags.h).
#include "tools/variant_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace mha {
namespace tools {

namespace {

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// A decimal integer in [lo, hi]: digits only (no sign, spaces or suffix).
bool ParseInteger(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                  int64_t* out, std::string* error) {
  bool digits = !text.empty();
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  errno = 0;
  const long long v = digits ? std::strtoll(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno != 0 || v < lo || v > hi) {
    *error = flag + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
             "], got " + Quoted(text);
    return false;
  }
  *out = v;
  return true;
}

// A finite number > 0, or >= 0 when `allow_zero`.
bool ParsePositive(const std::string& flag, const std::string& text, bool allow_zero, float* out,
                   std::string* error) {
  char* end = nullptr;
  errno = 0;
  const float v = text.empty() ? 0.0f : std::strtof(text.c_str(), &end);
  const bool number = !text.empty() && end == text.c_str() + text.size() && errno != ERANGE &&
                      std::isfinite(v);
  if (!number || v < 0.0f || (v == 0.0f && !allow_zero)) {
    *error = flag + ": expected a finite number " + (allow_zero ? ">= 0" : "> 0") + ", got " +
             Quoted(text);
    return false;
  }
  *out = v;
  return true;
}

constexpr int64_t kMaxHeads = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

}  // namespace

VariantFlagKind VariantFlagKindOf(const std::string& flag) {
  if (flag == "--alibi") return VariantFlagKind::kSwitch;
  for (const char* f : {"--kv-heads", "--rope", "--rope-theta", "--rope-scale", "--rotary-dim",
                        "--window", "--softcap", "--qk-norm-eps"}) {
    if (flag == f) return VariantFlagKind::kTakesValue;
  }
  return VariantFlagKind::kNotVariant;
}

bool ParseVariantFlag(const std::string& flag, const std::string& value, VariantFlags* flags,
                      std::string* error) {
  VariantFlags& v = *flags;
  if (flag == "--alibi") {
    v.alibi = true;
    return true;
  }
  if (flag == "--kv-heads") return ParseInteger(flag, value, 1, kMaxHeads, &v.kv_heads, error);
  if (flag == "--rotary-dim") {
    return ParseInteger(flag, value, 1, kMaxPositions, &v.rotary_dim, error);
  }
  if (flag == "--window") return ParseInteger(flag, value, 1, kMaxPositions, &v.window, error);
  if (flag == "--rope-theta") return ParsePositive(flag, value, false, &v.rope_theta, error);
  if (flag == "--rope-scale") return ParsePositive(flag, value, false, &v.rope_scale, error);
  if (flag == "--softcap") return ParsePositive(flag, value, false, &v.softcap, error);
  if (flag == "--qk-norm-eps") return ParsePositive(flag, value, true, &v.qk_norm_eps, error);
  if (flag == "--rope") {
    if (value == "neox" || value == "gptj") {
      v.rope = value == "neox" ? RopeStyle::kNeox : RopeStyle::kGptj;
      return true;
    }
    *error = flag + ": expected 'neox' or 'gptj', got " + Quoted(value);
    return false;
  }
  *error = flag + ": not an attention-variant flag";
  return false;
}

bool CheckVariantFlags(const VariantFlags& v, std::string* error) {
  if (v.rope == RopeStyle::kNone && (v.rope_theta > 0 || v.rotary_dim > 0 || v.rope_scale > 0)) {
    *error = "--rope-theta, --rotary-dim, --rope-scale: need --rope neox|gptj";
    return false;
  }
  return true;
}

}  // namespace tools
}  // namespace mha
