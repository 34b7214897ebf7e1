// RoPE scaling: checks, resolution and frequencies (rope_scaling.h). Each formula names the
// transformers function (src/transformers/modeling_rope_utils.py) it transcribes; mha evaluates
// them in double where transformers mostly uses f32 tensors.
#include "runtime/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/validate.h"

namespace mha {

namespace {

constexpr const char* kOp = "MultiheadAttention::Create: ";
constexpr double kTwoPi = 6.283185307179586476925286766559;

// A value as the shortest of 9 significant digits ("0", "4096", "0.5").
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// The scaling fields, which types read them, and what 0 means.
struct Field {
  const char* name;
  double value;
  const char* readers;  // for messages
  bool read;            // by the configured type
};

// The default attention factors (used when rope_attention_factor is 0).
double DefaultAttention(const RopeScalingParams& p) {
  if (p.type == RopeScaling::kYarn) {
    // _compute_yarn_parameters: get_mscale(factor) = 0.1 ln(factor) + 1, 1 when factor <= 1
    // (mscale / mscale_all_dim: the caller passes get_mscale(f, mscale) / get_mscale(f, all_dim)).
    return p.factor <= 1.0 ? 1.0 : 0.1 * std::log(p.factor) + 1.0;
  }
  if (p.type == RopeScaling::kLongRope) {
    // _compute_longrope_parameters: sqrt(1 + ln(factor) / ln(original_max_position_embeddings)),
    // 1 when factor <= 1.
    return p.factor <= 1.0 ? 1.0
                           : std::sqrt(1.0 + std::log(p.factor) /
                                                 std::log(static_cast<double>(p.original_max)));
  }
  return 1.0;
}

// Copies a longrope factor array [n] after checking its values are finite and > 0.
Status CopyFactors(const float* src, int64_t n, const char* name, std::vector<double>* dst) {
  for (int64_t i = 0; i < n; ++i) {
    if (!(src[i] > 0.0f) || std::isinf(src[i])) {
      return InvalidArgument(std::string(kOp) + "weights." + name +
                             ": expected finite values > 0, got " + Num(src[i]) + " at index " +
                             Str(i));
    }
  }
  dst->assign(src, src + n);
  return Status::Ok();
}

}  // namespace

const char* RopeScalingName(RopeScaling t) {
  switch (t) {
    case RopeScaling::kLinear:
      return "linear";
    case RopeScaling::kDynamic:
      return "dynamic";
    case RopeScaling::kLlama3:
      return "llama3";
    case RopeScaling::kYarn:
      return "yarn";
    case RopeScaling::kLongRope:
      return "longrope";
    default:
      return "none";
  }
}

Status ResolveRopeScaling(const AttentionConfig& c, const AttentionWeights& w, int64_t rotary_dim,
                          RopeScalingParams* p, std::vector<double>* inv_freq) {
  const std::string op = kOp;
  const int t = static_cast<int>(c.rope_scaling);
  if (t < 0 || t > static_cast<int>(RopeScaling::kLongRope)) {
    return InvalidArgument(op +
                           "rope_scaling: expected kNone (0), kLinear (1), kDynamic (2), kLlama3 "
                           "(3), kYarn (4) or kLongRope (5), got " +
                           Str(t));
  }
  const RopeScaling type = c.rope_scaling;
  const std::string name = RopeScalingName(type);
  const bool is_linear = type == RopeScaling::kLinear, is_dynamic = type == RopeScaling::kDynamic;
  const bool is_llama3 = type == RopeScaling::kLlama3, is_yarn = type == RopeScaling::kYarn;
  const bool is_longrope = type == RopeScaling::kLongRope;
  if (type != RopeScaling::kNone && rotary_dim == 0) {
    return Unsupported(op + "rope_scaling: " + name +
                       " scales RoPE's frequencies, but rope is kNone (expected kNeox or kGptj)");
  }
  if (type != RopeScaling::kNone && c.rope_scale != 0.0f) {
    return Unsupported(op + "rope_scale: cannot combine with rope_scaling " + name +
                       " (kLinear's rope_factor is the same interpolation), got rope_scale " +
                       Num(c.rope_scale));
  }
  const Field fields[] = {
      {"rope_factor", c.rope_factor, "linear, dynamic, llama3, yarn and longrope",
       type != RopeScaling::kNone},
      {"rope_original_max_positions", static_cast<double>(c.rope_original_max_positions),
       "dynamic, llama3, yarn and longrope", is_dynamic || is_llama3 || is_yarn || is_longrope},
      {"rope_low_freq_factor", c.rope_low_freq_factor, "llama3", is_llama3},
      {"rope_high_freq_factor", c.rope_high_freq_factor, "llama3", is_llama3},
      {"rope_beta_fast", c.rope_beta_fast, "yarn", is_yarn},
      {"rope_beta_slow", c.rope_beta_slow, "yarn", is_yarn},
      {"rope_attention_factor", c.rope_attention_factor, "yarn and longrope",
       is_yarn || is_longrope},
      {"rope_no_truncate", c.rope_no_truncate ? 1.0 : 0.0, "yarn", is_yarn},
  };
  for (const Field& f : fields) {
    if (!(f.value >= 0.0) || std::isinf(f.value)) {
      return InvalidArgument(op + f.name + ": expected a finite value >= 0, got " + Num(f.value));
    }
    if (!f.read && f.value != 0.0) {
      return InvalidArgument(op + f.name + ": expected 0 with rope_scaling " + name + " (read by " +
                             f.readers + "), got " + Num(f.value));
    }
  }
  const bool has_short = w.rope_short_factor != nullptr, has_long = w.rope_long_factor != nullptr;
  if (!is_longrope && (has_short || has_long)) {
    return InvalidArgument(
        op + "weights.rope_short_factor/rope_long_factor: given, but rope_scaling is " + name +
        " (only longrope reads them)");
  }
  if (is_longrope && !(has_short && has_long)) {
    return Unsupported(op +
                       "weights.rope_short_factor/rope_long_factor: rope_scaling longrope needs "
                       "both [rotary_dim / 2] arrays, got " +
                       (has_short  ? "only rope_short_factor"
                        : has_long ? "only rope_long_factor"
                                   : "neither"));
  }
  inv_freq->clear();
  *p = RopeScalingParams();
  if (rotary_dim == 0) return Status::Ok();

  const auto positive = [&](const char* field, double v) -> Status {
    if (v > 0.0) return Status::Ok();
    return InvalidArgument(op + field + ": expected > 0 with rope_scaling " + name + ", got " +
                           Num(v));
  };
  Status s;
  if (is_linear || is_dynamic || is_llama3 || is_yarn) s = positive("rope_factor", c.rope_factor);
  if (s.ok() && (is_dynamic || is_llama3 || is_yarn || is_longrope)) {
    s = positive("rope_original_max_positions", static_cast<double>(c.rope_original_max_positions));
  }
  if (s.ok() && is_llama3) s = positive("rope_low_freq_factor", c.rope_low_freq_factor);
  if (!s.ok()) return s;
  if (is_llama3 && !(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
    return InvalidArgument(op + "rope_high_freq_factor: expected > rope_low_freq_factor (" +
                           Num(c.rope_low_freq_factor) + ") with rope_scaling llama3, got " +
                           Num(c.rope_high_freq_factor));
  }
  if (is_longrope && c.rope_factor == 0.0f && c.rope_attention_factor == 0.0f) {
    return InvalidArgument(op +
                           "rope_factor: expected > 0 with rope_scaling longrope unless "
                           "rope_attention_factor is given (the default attention factor reads "
                           "it; transformers' max_position_embeddings / "
                           "original_max_position_embeddings), got 0");
  }
  if (is_dynamic && rotary_dim < 4) {
    return InvalidArgument(op +
                           "rotary_dim: expected >= 4 with rope_scaling dynamic (its base's "
                           "exponent is rd / (rd - 2)), got " +
                           Str(rotary_dim));
  }
  const double theta = c.rope_theta > 0.0f ? c.rope_theta : 10000.0;
  if (is_yarn && !(theta > 1.0)) {
    return InvalidArgument(op +
                           "rope_theta: expected > 1 with rope_scaling yarn (its correction range "
                           "divides by ln theta), got " +
                           Num(theta));
  }

  p->type = type;
  p->rotary_dim = rotary_dim;
  p->theta = theta;
  if (type == RopeScaling::kNone) {
    p->factor = c.rope_scale > 0.0f ? c.rope_scale : 1.0;
  } else if (c.rope_factor > 0.0f) {
    p->factor = c.rope_factor;
  }
  p->original_max = c.rope_original_max_positions;
  p->low_freq_factor = c.rope_low_freq_factor;
  p->high_freq_factor = c.rope_high_freq_factor;
  if (c.rope_beta_fast > 0.0f) p->beta_fast = c.rope_beta_fast;
  if (c.rope_beta_slow > 0.0f) p->beta_slow = c.rope_beta_slow;
  p->truncate = !c.rope_no_truncate;
  if (is_longrope) {
    s = CopyFactors(w.rope_short_factor, rotary_dim / 2, "rope_short_factor", &p->short_factor);
    if (s.ok()) {
      s = CopyFactors(w.rope_long_factor, rotary_dim / 2, "rope_long_factor", &p->long_factor);
    }
    if (!s.ok()) return s;
  }
  p->attention = c.rope_attention_factor > 0.0f ? c.rope_attention_factor : DefaultAttention(*p);

  const size_t half = static_cast<size_t>(rotary_dim / 2);
  inv_freq->resize(half);
  ComputeRopeInvFreq(*p, 0, inv_freq->data());
  // Tables a call can use, checked once: a longrope call past original_max, a dynamic call at the
  // largest length positions allow (2^31; its base grows with the length).
  std::vector<double> other(half);
  if (is_longrope) {
    ComputeRopeInvFreq(*p, p->original_max + 1, other.data());
    p->long_inv_freq = other;
  } else if (is_dynamic) {
    ComputeRopeInvFreq(*p, int64_t{1} << 31, other.data());
  }
  bool finite = std::isfinite(p->attention) && p->attention > 0.0;
  for (size_t i = 0; i < half; ++i) {
    finite = finite && std::isfinite((*inv_freq)[i]) && (*inv_freq)[i] >= 0.0;
    if (is_longrope || is_dynamic) finite = finite && std::isfinite(other[i]) && other[i] >= 0.0;
  }
  if (!finite) {
    return InvalidArgument(op + "rope_scaling " + name +
                           ": the parameters give a non-finite frequency or attention factor "
                           "(rope_theta " +
                           Num(theta) + ", rope_factor " + Num(p->factor) +
                           ", rope_original_max_positions " + Str(p->original_max) + ")");
  }
  return Status::Ok();
}

void ComputeRopeInvFreq(const RopeScalingParams& p, int64_t seq_len, double* inv_freq) {
  const int64_t half = p.rotary_dim / 2;
  const double dim = static_cast<double>(p.rotary_dim);
  const double omax = static_cast<double>(p.original_max);
  // Exponent of inv_freq_i = base^(-2i / dim): torch.arange(0, dim, 2) / dim.
  const auto x = [&](int64_t i) { return 2.0 * static_cast<double>(i) / dim; };
  switch (p.type) {
    case RopeScaling::kNone:
    case RopeScaling::kLinear:
      // _compute_linear_scaling_rope_parameters: inv_freq = base^(-2i/dim) / factor (kNone:
      // rope_scale, the same interpolation).
      for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(p.theta, -x(i)) / p.factor;
      return;
    case RopeScaling::kDynamic: {
      // _compute_dynamic_ntk_parameters: seq_len = max(seq_len, max_position_embeddings),
      // base *= (factor * seq_len / max_position_embeddings - (factor - 1))^(dim / (dim - 2)).
      double base = p.theta;
      if (seq_len > p.original_max) {
        base *= std::pow(p.factor * static_cast<double>(seq_len) / omax - (p.factor - 1.0),
                         dim / (dim - 2.0));
      }
      for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(base, -x(i));
      return;
    }
    case RopeScaling::kLlama3: {
      // _compute_llama3_parameters: wavelen = 2 pi / inv_freq; wavelen > old_context_len /
      // low_freq_factor: inv_freq / factor; wavelen < old_context_len / high_freq_factor:
      // inv_freq; between: (1 - s) inv_freq / factor + s inv_freq with s = (old_context_len /
      // wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor).
      const double low_wavelen = omax / p.low_freq_factor;
      const double high_wavelen = omax / p.high_freq_factor;
      for (int64_t i = 0; i < half; ++i) {
        const double f = std::pow(p.theta, -x(i));
        const double wavelen = kTwoPi / f;
        if (wavelen > low_wavelen) {
          inv_freq[i] = f / p.factor;
        } else if (wavelen < high_wavelen) {
          inv_freq[i] = f;
        } else {
          const double s =
              (omax / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
          inv_freq[i] = (1.0 - s) * f / p.factor + s * f;
        }
      }
      return;
    }
    case RopeScaling::kYarn: {
      // _compute_yarn_parameters, find_correction_dim: dim ln(max_pos / (n 2 pi)) / (2 ln base).
      const auto correction_dim = [&](double rotations) {
        return dim * std::log(omax / (rotations * kTwoPi)) / (2.0 * std::log(p.theta));
      };
      double low = correction_dim(p.beta_fast), high = correction_dim(p.beta_slow);
      // find_correction_range: floor(low), ceil(high) when truncate, then max(low, 0),
      // min(high, dim - 1).
      if (p.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      // linear_ramp_factor(low, high, dim // 2): clamp((i - low) / (high - low), 0, 1), high +=
      // 0.001 when equal.
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        const double pos_freq = std::pow(p.theta, x(i));
        const double extrapolation = 1.0 / pos_freq;
        const double interpolation = 1.0 / (p.factor * pos_freq);
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation_factor = 1.0 - ramp;
        // inv_freq = interpolation (1 - extrapolation_factor) + extrapolation extrapolation_factor
        inv_freq[i] =
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      return;
    }
    case RopeScaling::kLongRope: {
      // _compute_longrope_parameters (with dynamic_rope_update's longrope_frequency_update):
      // ext = long_factor when seq_len > original_max_position_embeddings, else short_factor;
      // inv_freq = 1 / (ext_i base^(2i/dim)).
      const std::vector<double>& ext = seq_len > p.original_max ? p.long_factor : p.short_factor;
      for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0 / (ext[i] * std::pow(p.theta, x(i)));
      return;
    }
  }
}

const double* RopeCallInvFreq(const RopeScalingParams& p, const std::vector<double>& inv_freq,
                              int64_t seq_len, double* buf) {
  if (!p.LengthDependent() || seq_len <= p.original_max) return inv_freq.data();
  if (p.type == RopeScaling::kLongRope) return p.long_inv_freq.data();
  // dynamic_rope_update's dynamic_frequency_update: past the original length, the frequencies of
  // this length (transformers keeps the largest length seen; each mha call stands alone).
  ComputeRopeInvFreq(p, seq_len, buf);
  return buf;
}

}  // namespace mha
