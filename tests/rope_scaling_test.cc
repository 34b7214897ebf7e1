// RoPE scaling (runtime/rope_scaling.h, README "RoPE scaling"): each type's inverse frequencies
// and attention factor against a transcription of transformers' modeling_rope_utils.py written
// here from the Python (namespace hf, double precision, torch's vector steps kept); the checks
// of the parameters; the forward of each type against the double reference operator
// (tests/reference, with the transcription's frequencies) on the staged, key-chunked and grouped
// paths and Project; bitwise determinism over thread counts; and KV-cache decoding, equal to
// the causal forward for the static types and following the per-step rule (the step's largest
// position + 1) for dynamic and longrope, against a double decoding reference.
#include "runtime/rope_scaling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "runtime/attention_impl.h"
#include "runtime/layer_weights.h"
#include "tests/attention_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

constexpr double kPi = 3.14159265358979323846264338327950288;

// ---- transformers' formulas, transcribed (src/transformers/modeling_rope_utils.py). A
// Python None is a negative or zero argument where noted.
namespace hf {

// torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
std::vector<double> ArangeOverDim(int64_t dim) {
  std::vector<double> r;
  for (int64_t j = 0; j < dim; j += 2) r.push_back(static_cast<double>(j) / dim);
  return r;
}

// _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2) / dim))
std::vector<double> DefaultInvFreq(double base, int64_t dim) {
  std::vector<double> inv;
  for (double e : ArangeOverDim(dim)) inv.push_back(1.0 / std::pow(base, e));
  return inv;
}

// _compute_linear_scaling_rope_parameters: inv_freq /= factor
std::vector<double> Linear(double base, int64_t dim, double factor) {
  std::vector<double> inv = DefaultInvFreq(base, dim);
  for (double& f : inv) f /= factor;
  return inv;
}

// _compute_dynamic_ntk_parameters (seq_len <= 0: None).
std::vector<double> Dynamic(double base, int64_t dim, int64_t max_position_embeddings,
                            double factor, int64_t seq_len) {
  // seq_len: default to max_position_embeddings, e.g. at init time
  const double sl = static_cast<double>(seq_len > 0 ? std::max(seq_len, max_position_embeddings)
                                                    : max_position_embeddings);
  base = base * std::pow((factor * sl / max_position_embeddings) - (factor - 1),
                         static_cast<double>(dim) / (dim - 2));
  return DefaultInvFreq(base, dim);
}

// _compute_llama3_parameters
std::vector<double> Llama3(double base, int64_t dim, double factor, double low_freq_factor,
                           double high_freq_factor, double old_context_len) {
  const std::vector<double> inv_freq = DefaultInvFreq(base, dim);
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  std::vector<double> out;
  for (double f : inv_freq) {
    const double wavelen = 2 * kPi / f;
    // inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    const double llama = wavelen > low_freq_wavelen ? f / factor : f;
    const double smooth_factor =
        (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth_factor) * llama / factor + smooth_factor * llama;
    const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    out.push_back(is_medium_freq ? smoothed : llama);
  }
  return out;
}

struct InvFreqAndAttention {
  std::vector<double> inv_freq;
  double attention_factor = 1;
};

// _compute_yarn_parameters; arguments <= 0 are None (beta_fast, beta_slow, attention_factor,
// mscale, mscale_all_dim).
InvFreqAndAttention Yarn(double base, int64_t dim, double factor, double original_max,
                         double attention_factor, double mscale, double mscale_all_dim,
                         double beta_fast_in, double beta_slow_in, bool truncate) {
  const auto get_mscale = [](double scale, double m) {
    if (scale <= 1) return 1.0;
    return 0.1 * m * std::log(scale) + 1.0;
  };
  if (!(attention_factor > 0)) {
    if (mscale > 0 && mscale_all_dim > 0) {
      attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);
    } else {
      attention_factor = get_mscale(factor, 1);
    }
  }
  const double beta_fast = beta_fast_in > 0 ? beta_fast_in : 32;
  const double beta_slow = beta_slow_in > 0 ? beta_slow_in : 1;
  const auto find_correction_dim = [&](double num_rotations) {
    return (dim * std::log(original_max / (num_rotations * 2 * kPi))) / (2 * std::log(base));
  };
  double low = find_correction_dim(beta_fast);
  double high = find_correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  // linear_ramp_factor(low, high, dim // 2)
  if (low == high) high += 0.001;
  InvFreqAndAttention r;
  r.attention_factor = attention_factor;
  const std::vector<double> e = ArangeOverDim(dim);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double pos_freqs = std::pow(base, e[i]);
    const double inv_freq_extrapolation = 1.0 / pos_freqs;
    const double inv_freq_interpolation = 1.0 / (factor * pos_freqs);
    const double ramp = std::min(std::max((i - low) / (high - low), 0.0), 1.0);
    const double inv_freq_extrapolation_factor = 1 - ramp;
    r.inv_freq.push_back(inv_freq_interpolation * (1 - inv_freq_extrapolation_factor) +
                         inv_freq_extrapolation * inv_freq_extrapolation_factor);
  }
  return r;
}

// _compute_longrope_parameters with longrope_frequency_update's choice (seq_len <= 0: None);
// attention_factor <= 0: None.
InvFreqAndAttention LongRope(double base, int64_t dim, const std::vector<float>& short_factor,
                             const std::vector<float>& long_factor, double factor,
                             int64_t original_max, double attention_factor, int64_t seq_len) {
  InvFreqAndAttention r;
  if (!(attention_factor > 0)) {
    attention_factor =
        factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(original_max));
  }
  r.attention_factor = attention_factor;
  const std::vector<float>& ext =
      seq_len > 0 && seq_len > original_max ? long_factor : short_factor;
  const std::vector<double> e = ArangeOverDim(dim);
  for (int64_t i = 0; i < dim / 2; ++i) {
    r.inv_freq.push_back(1.0 / (ext[i] * std::pow(base, e[i])));
  }
  return r;
}

}  // namespace hf

// ---- The layer's resolved frequencies.

// The variants of a layer with `config` (num_heads and rope settings given; embed_dim set from
// head_dim) and the longrope factors.
LayerVariants VariantsOf(AttentionConfig config, int64_t head_dim, const float* short_factor,
                         const float* long_factor, Status* status = nullptr) {
  config.embed_dim = head_dim * config.num_heads;
  std::vector<float> dummy(static_cast<size_t>(3 * config.embed_dim * config.embed_dim));
  AttentionWeights w;
  w.in_proj_weight = dummy.data();
  w.out_proj_weight = dummy.data();
  w.in_proj_bias = dummy.data();
  w.out_proj_bias = dummy.data();
  w.rope_short_factor = short_factor;
  w.rope_long_factor = long_factor;
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::Create(config, w, WeightBinding::kView, &layer);
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return layer ? LayerWeightsOf(*layer).variants : LayerVariants();
}

// The frequencies a call of length seq_len rotates with.
std::vector<double> CallFreqs(const LayerVariants& v, int64_t seq_len) {
  std::vector<double> buf(v.inv_freq.size());
  const double* f = RopeCallInvFreq(v.rope_scaling, v.inv_freq, seq_len, buf.data());
  return std::vector<double>(f, f + v.inv_freq.size());
}

// Every frequency within a few double roundings of the transcription's (the formulas differ
// only in the order of exact-to-rounding operations).
void ExpectFreqs(const std::vector<double>& got, const std::vector<double>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-13 * want[i]) << what << ", i " << i;
  }
}

AttentionConfig RopeConfig(RopeScaling type, float theta, int64_t heads = 2) {
  AttentionConfig c;
  c.num_heads = heads;
  c.rope = RopeStyle::kNeox;
  c.rope_theta = theta;
  c.rope_scaling = type;
  return c;
}

TEST(RopeScalingFrequenciesTest, Linear) {
  AttentionConfig c = RopeConfig(RopeScaling::kLinear, 10000.0f);
  c.rope_factor = 4.0f;
  const LayerVariants v = VariantsOf(c, 64, nullptr, nullptr);
  ExpectFreqs(v.inv_freq, hf::Linear(10000.0, 64, 4.0), "linear 4");
  EXPECT_EQ(v.rope_scaling.attention, 1.0);
  // The same interpolation as rope_scale.
  AttentionConfig plain = RopeConfig(RopeScaling::kNone, 10000.0f);
  plain.rope_scale = 4.0f;
  EXPECT_EQ(VariantsOf(plain, 64, nullptr, nullptr).inv_freq, v.inv_freq);
}

// Llama 3.1's parameters (factor 8, low 1, high 4, original 8192, theta 500000, head_dim 128):
// every band is present.
TEST(RopeScalingFrequenciesTest, Llama3) {
  AttentionConfig c = RopeConfig(RopeScaling::kLlama3, 500000.0f);
  c.rope_factor = 8.0f;
  c.rope_low_freq_factor = 1.0f;
  c.rope_high_freq_factor = 4.0f;
  c.rope_original_max_positions = 8192;
  const LayerVariants v = VariantsOf(c, 128, nullptr, nullptr);
  const std::vector<double> want = hf::Llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
  ExpectFreqs(v.inv_freq, want, "llama3");
  const std::vector<double> plain = hf::DefaultInvFreq(500000.0, 128);
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double r = want[i] / plain[i];
    kept += r == 1.0;
    divided += std::fabs(r - 0.125) < 1e-15;
    smoothed += r > 0.125 + 1e-12 && r < 1.0 - 1e-12;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
  EXPECT_EQ(v.rope_scaling.attention, 1.0);
  // Partial rotary: dim = rotary_dim.
  c.rotary_dim = 64;
  ExpectFreqs(VariantsOf(c, 128, nullptr, nullptr).inv_freq,
              hf::Llama3(500000.0, 64, 8.0, 1.0, 4.0, 8192.0), "llama3, rd 64");
}

// YaRN: factor 4, original 4096, beta 32/1 given and defaulted, truncated and not, full and
// partial rotary, two thetas; the attention factor by default, given, and as a caller derives it
// from mscale / mscale_all_dim.
TEST(RopeScalingFrequenciesTest, Yarn) {
  for (const float theta : {10000.0f, 1000000.0f}) {
    for (const int64_t rd : {128, 64}) {
      for (const bool truncate : {true, false}) {
        for (const bool defaults : {true, false}) {
          AttentionConfig c = RopeConfig(RopeScaling::kYarn, theta);
          c.rotary_dim = rd;
          c.rope_factor = 4.0f;
          c.rope_original_max_positions = 4096;
          c.rope_beta_fast = defaults ? 0.0f : 32.0f;
          c.rope_beta_slow = defaults ? 0.0f : 1.0f;
          c.rope_no_truncate = !truncate;
          const std::string what = "yarn theta " + std::to_string(theta) + " rd " +
                                   std::to_string(rd) + (truncate ? " truncated" : "");
          const LayerVariants v = VariantsOf(c, 128, nullptr, nullptr);
          const hf::InvFreqAndAttention want =
              hf::Yarn(theta, rd, 4.0, 4096.0, 0, 0, 0, 0, 0, truncate);
          ExpectFreqs(v.inv_freq, want.inv_freq, what);
          EXPECT_NEAR(v.rope_scaling.attention, want.attention_factor, 1e-15) << what;
          EXPECT_NEAR(v.rope_scaling.attention, 0.1 * std::log(4.0) + 1.0, 1e-15) << what;
        }
      }
    }
  }
  // Truncation changes the frequencies (the ramp's ends move).
  AttentionConfig c = RopeConfig(RopeScaling::kYarn, 10000.0f);
  c.rope_factor = 4.0f;
  c.rope_original_max_positions = 4096;
  const std::vector<double> truncated = VariantsOf(c, 128, nullptr, nullptr).inv_freq;
  c.rope_no_truncate = true;
  EXPECT_NE(VariantsOf(c, 128, nullptr, nullptr).inv_freq, truncated);
  // Other betas, and a given attention factor: DeepSeek's mscale 1 / mscale_all_dim 0.707 the
  // caller turns into get_mscale(f, mscale) / get_mscale(f, mscale_all_dim).
  c.rope_beta_fast = 16.0f;
  c.rope_beta_slow = 2.0f;
  const double derived =
      hf::Yarn(10000.0, 128, 4.0, 4096.0, 0, 1.0, 0.707, 16, 2, false).attention_factor;
  c.rope_attention_factor = static_cast<float>(derived);
  const LayerVariants v = VariantsOf(c, 128, nullptr, nullptr);
  const hf::InvFreqAndAttention want =
      hf::Yarn(10000.0, 128, 4.0, 4096.0, c.rope_attention_factor, 0, 0, 16, 2, false);
  ExpectFreqs(v.inv_freq, want.inv_freq, "yarn betas 16/2");
  EXPECT_EQ(v.rope_scaling.attention, static_cast<double>(c.rope_attention_factor));
  EXPECT_NEAR(v.rope_scaling.attention, derived, 1e-7);
}

// LongRoPE (Phi-3-like: head_dim 96, original 4096, factor 131072 / 4096 = 32): short factors up
// to the original length, long ones past it; the attention factor from factor and the original
// length unless given.
TEST(RopeScalingFrequenciesTest, LongRope) {
  std::mt19937 rng(70);
  const std::vector<float> short_f = test::UniformFloats(48, 1.0f, 1.2f, &rng);
  const std::vector<float> long_f = test::UniformFloats(48, 1.0f, 60.0f, &rng);
  AttentionConfig c = RopeConfig(RopeScaling::kLongRope, 10000.0f);
  c.rope_factor = 32.0f;
  c.rope_original_max_positions = 4096;
  const LayerVariants v = VariantsOf(c, 96, short_f.data(), long_f.data());
  for (const int64_t seq_len :
       {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{4097}, int64_t{131072}}) {
    const hf::InvFreqAndAttention want =
        hf::LongRope(10000.0, 96, short_f, long_f, 32.0, 4096, 0, seq_len);
    ExpectFreqs(seq_len == 0 ? v.inv_freq : CallFreqs(v, seq_len), want.inv_freq,
                "longrope seq_len " + std::to_string(seq_len));
    EXPECT_NEAR(v.rope_scaling.attention, want.attention_factor, 1e-15);
  }
  EXPECT_NEAR(v.rope_scaling.attention, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-15);
  EXPECT_NE(CallFreqs(v, 4097), CallFreqs(v, 4096));
  // A given attention factor (and none derived: factor 0 is then allowed); factor <= 1 gives 1.
  c.rope_factor = 0.0f;
  c.rope_attention_factor = 1.5f;
  EXPECT_EQ(VariantsOf(c, 96, short_f.data(), long_f.data()).rope_scaling.attention, 1.5);
  c.rope_factor = 1.0f;
  c.rope_attention_factor = 0.0f;
  EXPECT_EQ(VariantsOf(c, 96, short_f.data(), long_f.data()).rope_scaling.attention, 1.0);
}

// Dynamic NTK: unscaled up to the original length (the plain layer's very frequencies), the base
// grown by the call's length past it.
TEST(RopeScalingFrequenciesTest, Dynamic) {
  AttentionConfig c = RopeConfig(RopeScaling::kDynamic, 10000.0f);
  c.rope_factor = 2.0f;
  c.rope_original_max_positions = 2048;
  const LayerVariants v = VariantsOf(c, 64, nullptr, nullptr);
  const LayerVariants plain =
      VariantsOf(RopeConfig(RopeScaling::kNone, 10000.0f), 64, nullptr, nullptr);
  EXPECT_EQ(v.inv_freq, plain.inv_freq);
  for (const int64_t seq_len : {int64_t{1}, int64_t{1000}, int64_t{2048}, int64_t{2049},
                                int64_t{5000}, int64_t{1} << 20, int64_t{1} << 31}) {
    ExpectFreqs(CallFreqs(v, seq_len), hf::Dynamic(10000.0, 64, 2048, 2.0, seq_len),
                "dynamic seq_len " + std::to_string(seq_len));
  }
  EXPECT_EQ(CallFreqs(v, 2048), plain.inv_freq);
  EXPECT_LT(CallFreqs(v, 5000)[1], plain.inv_freq[1]);
  EXPECT_EQ(v.rope_scaling.attention, 1.0);
}

// ---- Checks: each names the field, the type and the value.
TEST(RopeScalingFrequenciesTest, ParameterErrors) {
  const float short_f[4] = {1, 1, 1, 1}, long_f[4] = {2, 0, 2, 2};
  struct Case {
    const char* what;
    std::function<void(AttentionConfig*)> set;
    const float* short_factor;
    const float* long_factor;
    StatusCode code;
    const char* message;
  };
  const auto yarn = [](AttentionConfig* c) {
    c->rope_scaling = RopeScaling::kYarn;
    c->rope_factor = 4.0f;
    c->rope_original_max_positions = 4096;
  };
  const auto longrope = [](AttentionConfig* c) {
    c->rope_scaling = RopeScaling::kLongRope;
    c->rope_factor = 4.0f;
    c->rope_original_max_positions = 16;
  };
  const Case cases[] = {
      {"enum", [](AttentionConfig* c) { c->rope_scaling = static_cast<RopeScaling>(7); }, nullptr,
       nullptr, StatusCode::kInvalidArgument,
       "rope_scaling: expected kNone (0), kLinear (1), kDynamic (2), kLlama3 (3), kYarn (4) or "
       "kLongRope (5), got 7"},
      {"no rope",
       [&](AttentionConfig* c) {
         yarn(c);
         c->rope = RopeStyle::kNone;
       },
       nullptr, nullptr, StatusCode::kUnsupported,
       "rope_scaling: yarn scales RoPE's frequencies, but rope is kNone"},
      {"rope_scale too",
       [](AttentionConfig* c) {
         c->rope_scaling = RopeScaling::kLinear;
         c->rope_factor = 2.0f;
         c->rope_scale = 2.0f;
       },
       nullptr, nullptr, StatusCode::kUnsupported,
       "rope_scale: cannot combine with rope_scaling linear"},
      {"llama3 factor 0",
       [](AttentionConfig* c) {
         c->rope_scaling = RopeScaling::kLlama3;
         c->rope_original_max_positions = 8192;
         c->rope_low_freq_factor = 1.0f;
         c->rope_high_freq_factor = 4.0f;
       },
       nullptr, nullptr, StatusCode::kInvalidArgument,
       "MultiheadAttention::Create: rope_factor: expected > 0 with rope_scaling llama3, got 0"},
      {"llama3 high <= low",
       [](AttentionConfig* c) {
         c->rope_scaling = RopeScaling::kLlama3;
         c->rope_factor = 8.0f;
         c->rope_original_max_positions = 8192;
         c->rope_low_freq_factor = 4.0f;
         c->rope_high_freq_factor = 1.0f;
       },
       nullptr, nullptr, StatusCode::kInvalidArgument,
       "rope_high_freq_factor: expected > rope_low_freq_factor (4) with rope_scaling llama3, got "
       "1"},
      {"yarn original 0",
       [&](AttentionConfig* c) {
         yarn(c);
         c->rope_original_max_positions = 0;
       },
       nullptr, nullptr, StatusCode::kInvalidArgument,
       "rope_original_max_positions: expected > 0 with rope_scaling yarn, got 0"},
      {"yarn theta 1",
       [&](AttentionConfig* c) {
         yarn(c);
         c->rope_theta = 1.0f;
       },
       nullptr, nullptr, StatusCode::kInvalidArgument,
       "rope_theta: expected > 1 with rope_scaling yarn"},
      {"negative", [](AttentionConfig* c) { c->rope_factor = -1.0f; }, nullptr, nullptr,
       StatusCode::kInvalidArgument, "rope_factor: expected a finite value >= 0, got -1"},
      {"not read by none", [](AttentionConfig* c) { c->rope_factor = 2.0f; }, nullptr, nullptr,
       StatusCode::kInvalidArgument,
       "rope_factor: expected 0 with rope_scaling none (read by linear, dynamic, llama3, yarn and "
       "longrope), got 2"},
      {"not read by linear",
       [](AttentionConfig* c) {
         c->rope_scaling = RopeScaling::kLinear;
         c->rope_factor = 2.0f;
         c->rope_beta_fast = 32.0f;
       },
       nullptr, nullptr, StatusCode::kInvalidArgument,
       "rope_beta_fast: expected 0 with rope_scaling linear (read by yarn), got 32"},
      {"dynamic rd 2",
       [](AttentionConfig* c) {
         c->rope_scaling = RopeScaling::kDynamic;
         c->rope_factor = 2.0f;
         c->rope_original_max_positions = 16;
         c->rotary_dim = 2;
       },
       nullptr, nullptr, StatusCode::kInvalidArgument,
       "rotary_dim: expected >= 4 with rope_scaling dynamic"},
      {"longrope without arrays", longrope, nullptr, nullptr, StatusCode::kUnsupported,
       "rope_scaling longrope needs both [rotary_dim / 2] arrays, got neither"},
      {"longrope short only", longrope, short_f, nullptr, StatusCode::kUnsupported,
       "got only rope_short_factor"},
      {"longrope bad value", longrope, short_f, long_f, StatusCode::kInvalidArgument,
       "weights.rope_long_factor: expected finite values > 0, got 0 at index 1"},
      {"longrope no factor",
       [&](AttentionConfig* c) {
         longrope(c);
         c->rope_factor = 0.0f;
       },
       short_f, short_f, StatusCode::kInvalidArgument,
       "rope_factor: expected > 0 with rope_scaling longrope unless rope_attention_factor is "
       "given"},
      {"arrays without longrope", yarn, short_f, short_f, StatusCode::kInvalidArgument,
       "weights.rope_short_factor/rope_long_factor: given, but rope_scaling is yarn"},
  };
  for (const Case& k : cases) {
    AttentionConfig c = RopeConfig(RopeScaling::kNone, 0.0f);  // head_dim 8: rd/2 = 4
    k.set(&c);
    Status s;
    VariantsOf(c, 8, k.short_factor, k.long_factor, &s);
    EXPECT_EQ(s.code(), k.code) << k.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(k.message), std::string::npos)
        << k.what << ": \"" << s.message() << "\" lacks \"" << k.message << "\"";
  }
}

// ---- The operator against the double reference.

// One scaling type on a layer with head_dim 8 (positions of a few tens: the original lengths
// are 16 for the length-dependent types, 64 for llama3 / yarn so that every band and ramp step
// shows at rd 8).
struct Scaling {
  const char* name;
  AttentionConfig config;  // the rope fields
  std::vector<float> short_factor, long_factor;
  // The transcription's frequencies and attention factor for a call of length seq_len.
  std::function<hf::InvFreqAndAttention(int64_t seq_len)> expected;
};

std::vector<Scaling> Scalings(int64_t rd) {
  std::vector<Scaling> out;
  auto add = [&](const char* name, RopeScaling type, RopeStyle style, float theta,
                 std::function<void(Scaling*)> set) {
    Scaling s;
    s.name = name;
    s.config.rope = style;
    s.config.rope_theta = theta;
    s.config.rotary_dim = rd == 8 ? 0 : rd;
    s.config.rope_scaling = type;
    set(&s);
    out.push_back(std::move(s));
  };
  const double th = 10000.0;
  add("linear 3", RopeScaling::kLinear, RopeStyle::kNeox, 0.0f, [=](Scaling* s) {
    s->config.rope_factor = 3.0f;
    s->expected = [=](int64_t) { return hf::InvFreqAndAttention{hf::Linear(th, rd, 3.0), 1.0}; };
  });
  add("llama3 8/1/4/64", RopeScaling::kLlama3, RopeStyle::kGptj, 0.0f, [=](Scaling* s) {
    s->config.rope_factor = 8.0f;
    s->config.rope_low_freq_factor = 1.0f;
    s->config.rope_high_freq_factor = 4.0f;
    s->config.rope_original_max_positions = 64;
    s->expected = [=](int64_t) {
      return hf::InvFreqAndAttention{hf::Llama3(th, rd, 8.0, 1.0, 4.0, 64.0), 1.0};
    };
  });
  for (const bool truncate : {true, false}) {
    add(truncate ? "yarn 4/64 truncated" : "yarn 4/64 unrounded", RopeScaling::kYarn,
        RopeStyle::kNeox, 0.0f, [=](Scaling* s) {
          s->config.rope_factor = 4.0f;
          s->config.rope_original_max_positions = 64;
          s->config.rope_no_truncate = !truncate;
          s->expected = [=](int64_t) {
            return hf::Yarn(th, rd, 4.0, 64.0, 0, 0, 0, 0, 0, truncate);
          };
        });
  }
  add("yarn betas 8/2, attention 1.3", RopeScaling::kYarn, RopeStyle::kGptj, 500.0f,
      [=](Scaling* s) {
        s->config.rope_factor = 8.0f;
        s->config.rope_original_max_positions = 32;
        s->config.rope_beta_fast = 8.0f;
        s->config.rope_beta_slow = 2.0f;
        s->config.rope_attention_factor = 1.3f;
        s->expected = [=](int64_t) {
          return hf::Yarn(500.0, rd, 8.0, 32.0, 1.3f, 0, 0, 8, 2, true);
        };
      });
  add("dynamic 2/16", RopeScaling::kDynamic, RopeStyle::kNeox, 0.0f, [=](Scaling* s) {
    s->config.rope_factor = 2.0f;
    s->config.rope_original_max_positions = 16;
    s->expected = [=](int64_t seq_len) {
      return hf::InvFreqAndAttention{hf::Dynamic(th, rd, 16, 2.0, seq_len), 1.0};
    };
  });
  add("longrope 4/16", RopeScaling::kLongRope, RopeStyle::kNeox, 0.0f, [=](Scaling* s) {
    s->config.rope_factor = 4.0f;
    s->config.rope_original_max_positions = 16;
    std::mt19937 rng(71);
    s->short_factor = test::UniformFloats(rd / 2, 1.0f, 1.5f, &rng);
    s->long_factor = test::UniformFloats(rd / 2, 2.0f, 8.0f, &rng);
    const std::vector<float> sf = s->short_factor, lf = s->long_factor;
    s->expected = [=](int64_t seq_len) {
      return hf::LongRope(th, rd, sf, lf, 4.0, 16, 0, seq_len);
    };
  });
  return out;
}

// A causal self-attention problem (E 32, H 4, KVH 2, head_dim 8, N 2, L 9) with the scaling and
// positions drawn in [0, max_pos] (one of them max_pos), the reference's frequencies from the
// transcription at the call's length max_pos + 1.
testing_util::Problem ScaledProblem(const Scaling& sc, int64_t max_pos, uint32_t seed,
                                    int64_t L = 9) {
  std::mt19937 rng(seed);
  testing_util::Problem p;
  AttentionConfig& c = p.config;
  c = sc.config;
  c.embed_dim = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.batch_first = true;
  p.packed = false;
  p.self_attention = true;
  p.causal = true;
  p.N = 2;
  p.L = L;
  p.S = L;
  testing_util::FillProblem(&p, &rng);
  p.positions.resize(p.N * p.L);
  for (int64_t& x : p.positions) x = testing_util::Pick(&rng, 0, max_pos);
  p.positions[testing_util::Pick(&rng, 0, p.N * p.L - 1)] = max_pos;
  p.rope_short_factor = sc.short_factor;
  p.rope_long_factor = sc.long_factor;
  const hf::InvFreqAndAttention e = sc.expected(max_pos + 1);
  p.ref_rope_inv_freq = e.inv_freq;
  p.ref_rope_attention = e.attention_factor;
  return p;
}

// Each type, full and partial rotary, at calls shorter and longer than the original lengths.
TEST(RopeScalingForwardTest, EachTypeMatchesReference) {
  uint32_t seed = 100;
  for (const int64_t rd : {8, 6}) {
    for (const Scaling& sc : Scalings(rd)) {
      for (const int64_t max_pos : {10, 40, 5000}) {
        SCOPED_TRACE(std::string(sc.name) + ", rd " + std::to_string(rd) + ", max position " +
                     std::to_string(max_pos));
        const testing_util::Problem p = ScaledProblem(sc, max_pos, ++seed);
        testing_util::Views v;
        testing_util::RunForward(p, 2, &v);
        ASSERT_FALSE(HasFatalFailure());
        testing_util::ExpectMatchesReference(p, v);
        if (HasFailure()) return;
      }
    }
  }
}

// The frequencies matter: the reference with the unscaled (or the other length's) frequencies
// disagrees with the operator.
TEST(RopeScalingForwardTest, WrongFrequenciesAreCaught) {
  for (const Scaling& sc : Scalings(8)) {
    SCOPED_TRACE(sc.name);
    testing_util::Problem p = ScaledProblem(sc, 40, 200);
    testing_util::Views v;
    testing_util::RunForward(p, 1, &v);
    ASSERT_FALSE(HasFatalFailure());
    reference::Outputs ref;
    p.ref_rope_inv_freq = sc.expected(10).inv_freq;  // the length below the original
    if (sc.config.rope_scaling != RopeScaling::kDynamic &&
        sc.config.rope_scaling != RopeScaling::kLongRope) {
      p.ref_rope_inv_freq =
          hf::DefaultInvFreq(sc.config.rope_theta > 0 ? sc.config.rope_theta : 10000.0, 8);
    }
    testing_util::RunReference(p, &ref);
    double worst = 0;
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t l = 0; l < p.L; ++l) {
        for (int64_t e = 0; e < 32; ++e) {
          worst = std::max(worst, std::fabs(testing_util::OutputAt(p, v.output, n, l, e) -
                                            ref.output[(n * p.L + l) * 32 + e]));
        }
      }
    }
    EXPECT_GT(worst, 1e-3);
  }
}

// Bitwise the same for 1, 2 and 3 threads; the key-chunked path (the call's length spans the
// chunks) and the grouped forward (it spans the groups) against the reference and the staged
// bits; Project's rotated q and k against the reference's.
TEST(RopeScalingForwardTest, EveryPathUsesTheCallsLength) {
  uint32_t seed = 300;
  for (const Scaling& sc : Scalings(8)) {
    SCOPED_TRACE(sc.name);
    testing_util::Problem p = ScaledProblem(sc, 40, ++seed, 70);
    testing_util::Views first, v;
    for (size_t threads = 1; threads <= 3; ++threads) {
      testing_util::RunForward(p, threads, threads == 1 ? &first : &v);
      ASSERT_FALSE(HasFatalFailure());
      if (threads > 1) {
        ASSERT_EQ(std::memcmp(first.output.data(), v.output.data(), v.output.size() * 4), 0)
            << threads << " threads";
      }
    }
    testing_util::ExpectMatchesReference(p, first);
    {
      testing_util::ScopedKeyChunking chunks(16);
      testing_util::RunForward(p, 2, &v);
      ASSERT_FALSE(HasFatalFailure());
      testing_util::ExpectMatchesReference(p, v);
    }
    p.need_weights = false;
    p.config.prepack = WeightPrepack::kOn;
    // One group of both entries (groups need two entries or more and one per worker).
    testing_util::ExpectGroupedGivesStagedBits(p, 1, static_cast<size_t>(2 * p.L));
    if (testing_util::GroupingPossible()) {
      EXPECT_TRUE(testing_util::RunsGrouped(p, static_cast<size_t>(2 * p.L), 1));
    }

    reference::Outputs ref;
    testing_util::RunReference(p, &ref);
    std::unique_ptr<MultiheadAttention> mha;
    ASSERT_TRUE(
        MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &mha).ok());
    std::unique_ptr<Context> ctx;
    ContextOptions opts;
    opts.num_threads = 2;
    ASSERT_TRUE(Context::Create(opts, &ctx).ok());
    testing_util::MakeViews(p, &v);
    std::vector<float> q(p.N * 4 * p.L * 8), k(p.N * 2 * p.S * 8), val(k.size());
    const int64_t qs[4] = {p.N, 4, p.L, 8}, ks[4] = {p.N, 2, p.S, 8};
    ProjectionOutputs po;
    ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &po.q).ok());
    ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, ks, &po.k).ok());
    ASSERT_TRUE(TensorView::Dense(val.data(), DType::kF32, 4, ks, &po.v).ok());
    const Status s = mha->Project(*ctx, v.in, po);
    ASSERT_TRUE(s.ok()) << s.ToString();
    int bad = 0;
    for (size_t j = 0; j < q.size(); ++j) {
      if (!testing_util::Close(q[j], ref.q[j]) && bad++ < 5) {
        ADD_FAILURE() << "Project q[" << j << "] = " << q[j] << ", want " << ref.q[j];
      }
    }
    for (size_t j = 0; j < k.size(); ++j) {
      if (!testing_util::Close(k[j], ref.k[j]) && bad++ < 5) {
        ADD_FAILURE() << "Project k[" << j << "] = " << k[j] << ", want " << ref.k[j];
      }
    }
    if (HasFailure()) return;
  }
}

// Dynamic calls within the original length rotate as the plain layer does, bit for bit.
TEST(RopeScalingForwardTest, DynamicWithinOriginalLengthIsThePlainLayer) {
  const Scaling sc = Scalings(8)[5];
  ASSERT_EQ(sc.config.rope_scaling, RopeScaling::kDynamic);
  testing_util::Problem p = ScaledProblem(sc, 15, 400);
  testing_util::Views scaled, plain;
  testing_util::RunForward(p, 2, &scaled);
  p.config.rope_scaling = RopeScaling::kNone;
  p.config.rope_factor = 0.0f;
  p.config.rope_original_max_positions = 0;
  testing_util::RunForward(p, 2, &plain);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(std::memcmp(scaled.output.data(), plain.output.data(), plain.output.size() * 4), 0);
}

// ---- KV-cache decoding.

// A self-attention layer (E 32, H 4, KVH 2, head_dim 8, separate weights, biases) with a
// scaling, and sequences x [N, S, E].
struct DecodeProblem {
  static constexpr int64_t E = 32, H = 4, KVH = 2, hd = 8, kvE = KVH * hd;
  int64_t N = 2, S = 40;
  Scaling sc;
  std::vector<float> wq, wk, wv, b, wo, bo, x;
  std::unique_ptr<MultiheadAttention> layer;
};

void MakeDecodeProblem(DecodeProblem* p, uint32_t seed) {
  std::mt19937 rng(seed);
  const float wb = 1.0f / std::sqrt(static_cast<float>(DecodeProblem::E));
  p->wq = test::SymmetricFloats(32 * 32, wb, &rng);
  p->wk = test::SymmetricFloats(16 * 32, wb, &rng);
  p->wv = test::SymmetricFloats(16 * 32, wb, &rng);
  p->b = test::SymmetricFloats(32 + 2 * 16, wb, &rng);
  p->wo = test::SymmetricFloats(32 * 32, wb, &rng);
  p->bo = test::SymmetricFloats(32, wb, &rng);
  p->x = test::SymmetricFloats(p->N * p->S * 32, 1.0f, &rng);
  AttentionConfig c = p->sc.config;
  c.embed_dim = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.batch_first = true;
  AttentionWeights w;
  w.q_proj_weight = p->wq.data();
  w.k_proj_weight = p->wk.data();
  w.v_proj_weight = p->wv.data();
  w.in_proj_bias = p->b.data();
  w.out_proj_weight = p->wo.data();
  w.out_proj_bias = p->bo.data();
  if (!p->sc.short_factor.empty()) {
    w.rope_short_factor = p->sc.short_factor.data();
    w.rope_long_factor = p->sc.long_factor.data();
  }
  const Status s = MultiheadAttention::Create(c, w, WeightBinding::kView, &p->layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// The sequences through a cache in steps of steps[i] tokens (every entry alike): outputs
// [N, S, E].
void Decode(const DecodeProblem& p, const std::vector<int64_t>& steps, size_t threads,
            std::vector<float>* out) {
  ContextOptions o;
  o.num_threads = threads;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(o, &ctx).ok());
  std::unique_ptr<KvCache> cache;
  ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*p.layer, p.N, p.S), &cache).ok());
  const int64_t E = DecodeProblem::E;
  out->assign(p.x.size(), std::nanf(""));
  int64_t pos = 0;
  for (const int64_t T : steps) {
    std::vector<float> in(p.N * T * E), res(p.N * T * E);
    for (int64_t n = 0; n < p.N; ++n) {
      std::memcpy(&in[n * T * E], &p.x[(n * p.S + pos) * E], T * E * sizeof(float));
    }
    const int64_t shape[3] = {p.N, T, E};
    TensorView xv, ov;
    ASSERT_TRUE(TensorView::Dense(in.data(), DType::kF32, 3, shape, &xv).ok());
    ASSERT_TRUE(TensorView::Dense(res.data(), DType::kF32, 3, shape, &ov).ok());
    const Status s = cache->Step(*ctx, *p.layer, xv, ov);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int64_t n = 0; n < p.N; ++n) {
      std::memcpy(&(*out)[(n * p.S + pos) * E], &res[n * T * E], T * E * sizeof(float));
    }
    pos += T;
  }
  ASSERT_EQ(pos, p.S);
}

// The layer's causal forward over the whole sequences.
std::vector<float> CausalForward(const DecodeProblem& p) {
  ContextOptions o;
  o.num_threads = 2;
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(o, &ctx).ok());
  std::vector<float> out(p.x.size());
  const int64_t shape[3] = {p.N, p.S, DecodeProblem::E};
  AttentionInputs in;
  AttentionOutputs outs;
  EXPECT_TRUE(
      TensorView::Dense(const_cast<float*>(p.x.data()), DType::kF32, 3, shape, &in.query).ok());
  EXPECT_TRUE(TensorView::Dense(out.data(), DType::kF32, 3, shape, &outs.output).ok());
  in.causal = true;
  const Status s = p.layer->Forward(*ctx, in, outs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// Decoding in double by the per-step rule: the tokens of a step that ends at position `end`
// (exclusive) rotate with the frequencies of a call of length `end` (the cache keeps each key's
// rotation), then attend causally to every key so far.
std::vector<double> DecodeReference(const DecodeProblem& p, const std::vector<int64_t>& steps) {
  constexpr int64_t E = DecodeProblem::E, H = DecodeProblem::H, hd = DecodeProblem::hd;
  constexpr int64_t kvE = DecodeProblem::kvE, G = H / DecodeProblem::KVH;
  const int64_t rd = p.sc.config.rotary_dim > 0 ? p.sc.config.rotary_dim : hd;
  const bool gptj = p.sc.config.rope == RopeStyle::kGptj;
  std::vector<double> out(p.x.size());
  for (int64_t n = 0; n < p.N; ++n) {
    std::vector<double> K(p.S * kvE), V(p.S * kvE), Q(p.S * E);
    int64_t pos = 0;
    for (const int64_t T : steps) {
      const hf::InvFreqAndAttention f = p.sc.expected(pos + T);
      auto rotate = [&](double* head, int64_t t) {
        for (int64_t i = 0; i < rd / 2; ++i) {
          const double angle = static_cast<double>(t) * f.inv_freq[i];
          const double c = std::cos(angle) * f.attention_factor;
          const double s = std::sin(angle) * f.attention_factor;
          const int64_t ia = gptj ? 2 * i : i, ib = gptj ? 2 * i + 1 : i + rd / 2;
          const double a = head[ia], bb = head[ib];
          head[ia] = a * c - bb * s;
          head[ib] = bb * c + a * s;
        }
      };
      for (int64_t t = pos; t < pos + T; ++t) {
        const float* xt = &p.x[(n * p.S + t) * E];
        for (int64_t o = 0; o < E; ++o) {
          double acc = p.b[o];
          for (int64_t i = 0; i < E; ++i) acc += static_cast<double>(p.wq[o * E + i]) * xt[i];
          Q[t * E + o] = acc;
        }
        for (int64_t o = 0; o < kvE; ++o) {
          double ak = p.b[E + o], av = p.b[E + kvE + o];
          for (int64_t i = 0; i < E; ++i) {
            ak += static_cast<double>(p.wk[o * E + i]) * xt[i];
            av += static_cast<double>(p.wv[o * E + i]) * xt[i];
          }
          K[t * kvE + o] = ak;
          V[t * kvE + o] = av;
        }
        for (int64_t h = 0; h < H; ++h) rotate(&Q[t * E + h * hd], t);
        for (int64_t g = 0; g < DecodeProblem::KVH; ++g) rotate(&K[t * kvE + g * hd], t);
      }
      for (int64_t t = pos; t < pos + T; ++t) {
        std::vector<double> concat(E, 0.0);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / G;
          std::vector<double> sc(t + 1);
          double mx = -INFINITY;
          for (int64_t j = 0; j <= t; ++j) {
            double d = 0;
            for (int64_t e = 0; e < hd; ++e) d += Q[t * E + h * hd + e] * K[j * kvE + g * hd + e];
            sc[j] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (double& s : sc) sum += (s = std::exp(s - mx));
          for (int64_t j = 0; j <= t; ++j) {
            for (int64_t e = 0; e < hd; ++e) {
              concat[h * hd + e] += sc[j] / sum * V[j * kvE + g * hd + e];
            }
          }
        }
        for (int64_t o = 0; o < E; ++o) {
          double acc = p.bo[o];
          for (int64_t i = 0; i < E; ++i) acc += static_cast<double>(p.wo[o * E + i]) * concat[i];
          out[(n * p.S + t) * E + o] = acc;
        }
      }
      pos += T;
    }
  }
  return out;
}

void ExpectMatchesDecodeReference(const std::vector<float>& got, const std::vector<double>& want,
                                  const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!testing_util::Close(got[i], want[i]) && bad++ < 5) {
      ADD_FAILURE() << what << ": out[" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
}

std::vector<int64_t> Steps(std::vector<int64_t> head, int64_t each, int64_t total) {
  int64_t done = 0;
  for (int64_t t : head) done += t;
  while (done < total) {
    head.push_back(std::min(each, total - done));
    done += head.back();
  }
  return head;
}

// Token by token, a prefill then tokens, steps of 3, and (S 72) a 64-token prompt, which runs the
// forward, then tokens across the original length of the dynamic and longrope layers (66 there).
// Every type: the cache follows the per-step reference. Static types, and longrope when every
// step ends past the original length: the cache equals the causal forward; otherwise the
// length-dependent types differ from it (the rule is exercised). Bitwise the same on 1 and 3
// threads.
TEST(RopeScalingDecodeTest, CacheFollowsThePerStepRule) {
  uint32_t seed = 500;
  for (const Scaling& base : Scalings(8)) {
    for (const int64_t S : {40, 72}) {
      Scaling sc = base;
      const bool dependent = sc.config.rope_scaling == RopeScaling::kDynamic ||
                             sc.config.rope_scaling == RopeScaling::kLongRope;
      if (S == 72 && !dependent) continue;
      if (S == 72) {
        // Original 66: the prompt (64) and the next two tokens short, the rest long.
        sc.config.rope_original_max_positions = 66;
        if (sc.config.rope_scaling == RopeScaling::kDynamic) {
          sc.expected = [](int64_t len) {
            return hf::InvFreqAndAttention{hf::Dynamic(10000.0, 8, 66, 2.0, len), 1.0};
          };
        } else {
          const std::vector<float> sf = sc.short_factor, lf = sc.long_factor;
          sc.expected = [=](int64_t len) {
            return hf::LongRope(10000.0, 8, sf, lf, 4.0, 66, 0, len);
          };
        }
      }
      SCOPED_TRACE(std::string(sc.name) + ", S " + std::to_string(S));
      DecodeProblem p;
      p.S = S;
      p.sc = sc;
      MakeDecodeProblem(&p, ++seed);
      ASSERT_FALSE(HasFatalFailure());
      const std::vector<float> forward = CausalForward(p);
      std::vector<std::vector<int64_t>> schedules;
      if (S == 40) {
        schedules = {Steps({}, 1, S), Steps({20}, 1, S), Steps({}, 3, S)};
      } else {
        schedules = {Steps({64}, 1, S), Steps({}, 5, S)};
      }
      for (const std::vector<int64_t>& steps : schedules) {
        const std::string what = "first step " + std::to_string(steps[0]) + ", then " +
                                 std::to_string(steps.size() > 1 ? steps[1] : 0);
        std::vector<float> got;
        Decode(p, steps, 3, &got);
        ASSERT_FALSE(HasFatalFailure()) << what;
        ExpectMatchesDecodeReference(got, DecodeReference(p, steps), what);
        // The forward's single call rotates every token as the cache does unless the type is
        // length-dependent and a step ends at other frequencies than the whole sequence's: for
        // dynamic any step ending past the original length short of S, for longrope a step
        // ending within it.
        const int64_t original = sc.config.rope_original_max_positions;
        const bool same_as_forward =
            !dependent || (sc.config.rope_scaling == RopeScaling::kLongRope && steps[0] > original);
        if (same_as_forward) {
          EXPECT_LE(testing_util::MaxScaledError(got, forward), 1e-5) << what;
        } else {
          EXPECT_GT(testing_util::MaxScaledError(got, forward), 1e-3) << what << ": the rule is not exercised";
        }
        if (dependent) {
          std::vector<float> one;
          Decode(p, steps, 1, &one);
          ASSERT_FALSE(HasFatalFailure());
          EXPECT_EQ(std::memcmp(one.data(), got.data(), got.size() * 4), 0) << what;
        }
        if (HasFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace mha
