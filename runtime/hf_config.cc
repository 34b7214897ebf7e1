// config.json -> one attention module's settings (runtime/hf_config.h). The rules follow
// transformers 5.x: configuration_<family>.py for defaults and derived settings,
// modeling_rope_utils.py (RotaryEmbeddingConfigMixin.standardize_rope_params and the
// _compute_*_parameters functions) for RoPE.
#include "runtime/hf_config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace mha {

namespace {

using Json = nlohmann::json;

// Deeper nesting than any configuration has is refused while parsing (hostile input).
constexpr int kMaxJsonDepth = 32;
struct TooDeep {};

std::string Show(const Json* v) {
  if (v == nullptr) return "nothing (the key is absent)";
  std::string s = v->dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string Str(int64_t v) { return std::to_string(v); }

// mha's settings are floats: every number read lies in float's range (kAny, kNoMax: no other
// bound), so narrowing it is exact-or-rounded, never undefined.
constexpr double kAny = -static_cast<double>(std::numeric_limits<float>::max());
constexpr double kNoMax = std::numeric_limits<float>::max();

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Typed, strictly checked reads from one JSON object; messages name `label: prefix + key`.
class Fields {
 public:
  Fields(const Json* obj, const std::string& label, std::string prefix,
         const std::map<std::string, std::string>* sources = nullptr)
      : obj_(obj), label_(label), prefix_(std::move(prefix)), sources_(sources) {}

  const Json* Get(const std::string& key) const {
    if (obj_ == nullptr || !obj_->is_object()) return nullptr;
    const auto it = obj_->find(key);
    return it == obj_->end() ? nullptr : &*it;
  }
  // Present and not null.
  bool Has(const std::string& key) const {
    const Json* v = Get(key);
    return v != nullptr && !v->is_null();
  }
  std::string Name(const std::string& key) const {
    if (sources_ != nullptr) {
      const auto it = sources_->find(key);
      if (it != sources_->end()) return prefix_ + it->second;
    }
    return prefix_ + key;
  }
  Status Error(const std::string& key, const std::string& expected) const {
    return FormatError(label_ + ": " + Name(key) + ": expected " + expected + ", got " +
                       Show(Get(key)));
  }
  Status Refuse(const std::string& key, const std::string& what) const {
    return Unsupported(label_ + ": " + Name(key) + ": " + what);
  }

  // An integer in [lo, hi]; absent or null is an error.
  Status Int(const std::string& key, int64_t lo, int64_t hi, int64_t* out) const {
    const Json* v = Get(key);
    const std::string expected = lo == 1   ? "a positive integer"
                                 : lo == 0 ? "a non-negative integer"
                                           : "an integer";
    if (v == nullptr || !(v->is_number_integer() || v->is_number_unsigned())) {
      return Error(key, expected);
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Error(key, "an integer in [" + Str(lo) + ", " + Str(hi) + "]");
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo) return Error(key, expected);
    if (x > hi) return Error(key, "an integer in [" + Str(lo) + ", " + Str(hi) + "]");
    *out = x;
    return Status::Ok();
  }
  // As Int, but absent or null leaves *set false.
  Status OptInt(const std::string& key, int64_t lo, int64_t hi, bool* set, int64_t* out) const {
    *set = Has(key);
    return *set ? Int(key, lo, hi, out) : Status::Ok();
  }
  // A finite number (integer or float) in [lo, hi] (`lo_open`: > lo); kAny / kNoMax: no bound.
  Status Number(const std::string& key, double lo, double hi, bool lo_open, double* out) const {
    const Json* v = Get(key);
    std::string expected = "a number";
    if (lo == 0.0) {
      expected = lo_open ? "a positive number" : "a non-negative number";
    } else if (lo != kAny) {
      expected += std::string(lo_open ? " > " : " >= ") + Num(lo);
    }
    if (hi != kNoMax) expected += " <= " + Num(hi);
    if (v == nullptr || !v->is_number()) return Error(key, expected);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) return Error(key, expected);
    *out = x;
    return Status::Ok();
  }
  Status OptNumber(const std::string& key, double lo, double hi, bool lo_open, bool* set,
                   double* out) const {
    *set = Has(key);
    return *set ? Number(key, lo, hi, lo_open, out) : Status::Ok();
  }
  // A boolean; absent or null reads as `absent` (None is falsy where transformers tests it).
  Status Bool(const std::string& key, bool absent, bool* out) const {
    const Json* v = Get(key);
    if (v == nullptr || v->is_null()) {
      *out = absent;
      return Status::Ok();
    }
    if (!v->is_boolean()) return Error(key, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(const std::string& key, std::string* out) const {
    const Json* v = Get(key);
    if (v == nullptr || !v->is_string()) return Error(key, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  // An object, or absent / null (*out null).
  Status OptObject(const std::string& key, const Json** out) const {
    const Json* v = Get(key);
    *out = nullptr;
    if (v == nullptr || v->is_null()) return Status::Ok();
    if (!v->is_object()) return Error(key, "an object or null");
    *out = v;
    return Status::Ok();
  }

  const std::string& label() const { return label_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const Json* obj_;
  const std::string& label_;
  std::string prefix_;
  const std::map<std::string, std::string>* sources_;
};

// The ALiBi paper's slopes (get_slopes, also BLOOM's _get_alibi_slopes), in double.
std::vector<double> AlibiSlopes(int64_t heads) {
  int64_t p = 1;
  while (p * 2 <= heads) p *= 2;
  auto pow2_slopes = [](int64_t n, int64_t count, int64_t step, std::vector<double>* out) {
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(n)) - 3)));
    for (int64_t i = 0; i < count; ++i) {
      out->push_back(std::pow(start, static_cast<double>(1 + i * step)));
    }
  };
  std::vector<double> s;
  pow2_slopes(p, p, 1, &s);
  if (p != heads) pow2_slopes(2 * p, heads - p, 2, &s);
  return s;
}

// `x` rounded to the nearest bf16 value (ties to even), as torch's .bfloat16().
double RoundToBf16(double x) {
  const float f = static_cast<float>(x);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &bits, 4);
  return r;
}

// YaRN's default attention factor (_compute_yarn_parameters' get_mscale).
double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

constexpr const char* kSupportedRopeTypes = "default, linear, dynamic, llama3, yarn, longrope";

// The RoPE part of ModuleSettings: `rope` is the selected rope dict (one layer type's), `top`
// the dict it came from (transformers reads yarn's "truncate" from the top level),
// `settings` the config object. The base is the dict's rope_theta, else `theta` when
// `theta_given`, else the top-level rope_theta (or the family's legacy key), else the
// configuration class's default. Fills s->config's RoPE fields.
Status ReadRope(const Fields& settings, const Fields& rope, const Fields& top, const HfFamily& f,
                bool theta_given, double theta, HfModuleSettings* s) {
  AttentionConfig& c = s->config;
  std::string type = "default";
  if (rope.Has("rope_type")) {
    Status st = rope.String("rope_type", &type);
    if (!st.ok()) return st;
  } else if (rope.Has("type")) {
    Status st = rope.String("type", &type);
    if (!st.ok()) return st;
  }
  for (const auto& alias : f.rope_type_aliases) {
    if (type == alias.first) type = alias.second;
  }
  if (rope.Has("mrope_section")) {
    return rope.Refuse("mrope_section", "multimodal RoPE (mrope_section) is not supported");
  }

  bool set = false;
  Status st = rope.OptNumber("rope_theta", 0.0, kNoMax, true, &set, &theta);
  if (!st.ok()) return st;
  if (!set && !theta_given) {
    theta = f.default_theta;
    st = settings.OptNumber("rope_theta", 0.0, kNoMax, true, &set, &theta);
    if (!st.ok()) return st;
    if (!set && f.theta_alias != nullptr) {
      st = settings.OptNumber(f.theta_alias, 0.0, kNoMax, true, &set, &theta);
      if (!st.ok()) return st;
    }
  }

  // Rotated width: int(head_dim * partial_rotary_factor), as the rotary embeddings compute it.
  double partial = 1.0;
  if (f.partial_rotary) {
    partial = f.default_partial;
    st = rope.OptNumber("partial_rotary_factor", 0.0, 1.0, true, &set, &partial);
    if (!st.ok()) return st;
    if (!set) {
      st = settings.OptNumber("partial_rotary_factor", 0.0, 1.0, true, &set, &partial);
      if (!st.ok()) return st;
      if (!set && f.partial_alias != nullptr) {
        st = settings.OptNumber(f.partial_alias, 0.0, 1.0, true, &set, &partial);
        if (!st.ok()) return st;
      }
    }
  }
  const int64_t rd = static_cast<int64_t>(static_cast<double>(s->head_dim) * partial);
  if (rd < 2 || rd % 2 != 0) {
    return Unsupported(settings.label() + ": RoPE over " + Str(rd) + " components (head_dim " +
                       Str(s->head_dim) + " x partial_rotary_factor " + Num(partial) +
                       "): mha rotates an even number >= 2");
  }
  c.rope = RopeStyle::kNeox;
  c.rope_theta = static_cast<float>(theta);
  c.rotary_dim = rd == s->head_dim ? 0 : rd;

  if (type == "default") return Status::Ok();

  // The pre-training length: original_max_position_embeddings in the dict (Phi-3: the
  // top-level attribute first), else max_position_embeddings (standardize_rope_params).
  auto original_max = [&](int64_t* out) -> Status {
    bool has = false;
    if (f.original_max_top_level) {
      Status e =
          settings.OptInt("original_max_position_embeddings", 1, int64_t{1} << 40, &has, out);
      if (!e.ok() || has) return e;
    }
    Status e = rope.OptInt("original_max_position_embeddings", 1, int64_t{1} << 40, &has, out);
    if (!e.ok() || has) return e;
    return settings.Int("max_position_embeddings", 1, int64_t{1} << 40, out);
  };
  auto factor = [&](double* out) { return rope.Number("factor", 0.0, kNoMax, true, out); };
  double fac = 0.0;

  if (type == "linear") {
    // _compute_linear_scaling_rope_parameters: inv_freq / factor, i.e. positions / factor.
    st = factor(&fac);
    if (!st.ok()) return st;
    c.rope_scale = static_cast<float>(fac);
    return Status::Ok();
  }
  if (type == "dynamic") {
    // _compute_dynamic_ntk_parameters scales the base against max_position_embeddings.
    st = factor(&fac);
    if (st.ok())
      st = settings.Int("max_position_embeddings", 1, int64_t{1} << 40,
                        &c.rope_original_max_positions);
    if (!st.ok()) return st;
    c.rope_scaling = RopeScaling::kDynamic;
    c.rope_factor = static_cast<float>(fac);
    return Status::Ok();
  }
  if (type == "llama3") {
    double low = 0.0, high = 0.0;
    st = factor(&fac);
    if (st.ok()) st = rope.Number("low_freq_factor", 0.0, kNoMax, true, &low);
    if (st.ok()) st = rope.Number("high_freq_factor", 0.0, kNoMax, true, &high);
    if (st.ok()) st = original_max(&c.rope_original_max_positions);
    if (!st.ok()) return st;
    if (!(high > low)) {
      return rope.Error("high_freq_factor", "a number > low_freq_factor (" + Num(low) + ")");
    }
    c.rope_scaling = RopeScaling::kLlama3;
    c.rope_factor = static_cast<float>(fac);
    c.rope_low_freq_factor = static_cast<float>(low);
    c.rope_high_freq_factor = static_cast<float>(high);
    return Status::Ok();
  }
  if (type == "yarn") {
    int64_t original = 0;
    st = original_max(&original);
    if (!st.ok()) return st;
    bool has_factor = false;
    st = rope.OptNumber("factor", 0.0, kNoMax, true, &has_factor, &fac);
    if (!st.ok()) return st;
    if (!has_factor) {
      // _compute_yarn_parameters: factor = max_position_embeddings / original.
      int64_t max_pos = 0;
      st = settings.Int("max_position_embeddings", 1, int64_t{1} << 40, &max_pos);
      if (!st.ok()) return st;
      fac = static_cast<double>(max_pos) / static_cast<double>(original);
    }
    double attention = 0.0, mscale = 0.0, mscale_all = 0.0, beta_fast = 0.0, beta_slow = 0.0;
    bool has_attention = false, has_mscale = false, has_mscale_all = false, b = false;
    st = rope.OptNumber("attention_factor", 0.0, kNoMax, true, &has_attention, &attention);
    if (st.ok()) st = rope.OptNumber("mscale", kAny, kNoMax, false, &has_mscale, &mscale);
    if (st.ok()) {
      st = rope.OptNumber("mscale_all_dim", kAny, kNoMax, false, &has_mscale_all, &mscale_all);
    }
    // `get("beta_fast") or 32`: absent, null and 0 all mean the default (0 in AttentionConfig).
    if (st.ok()) st = rope.OptNumber("beta_fast", kAny, kNoMax, false, &b, &beta_fast);
    if (st.ok()) st = rope.OptNumber("beta_slow", kAny, kNoMax, false, &b, &beta_slow);
    bool truncate = true;
    if (st.ok()) st = top.Bool("truncate", true, &truncate);
    if (!st.ok()) return st;
    if (!has_attention) {
      attention = has_mscale && has_mscale_all && mscale != 0.0 && mscale_all != 0.0
                      ? YarnMscale(fac, mscale) / YarnMscale(fac, mscale_all)
                      : YarnMscale(fac, 1.0);
      if (!(attention > 0.0 && attention <= kNoMax)) {
        return rope.Error("mscale", "values giving a positive attention factor (get_mscale(" +
                                        Num(fac) + ", mscale) / get_mscale(" + Num(fac) +
                                        ", mscale_all_dim) = " + Num(attention) + ")");
      }
    }
    if ((beta_fast != 0.0 ? beta_fast : 32.0) < (beta_slow != 0.0 ? beta_slow : 1.0)) {
      return rope.Error("beta_fast", "a number >= beta_slow");
    }
    c.rope_scaling = RopeScaling::kYarn;
    c.rope_factor = static_cast<float>(fac);
    c.rope_original_max_positions = original;
    c.rope_beta_fast = static_cast<float>(beta_fast);
    c.rope_beta_slow = static_cast<float>(beta_slow);
    c.rope_attention_factor = static_cast<float>(attention);
    c.rope_no_truncate = !truncate;
    return Status::Ok();
  }
  if (type == "longrope") {
    int64_t original = 0;
    st = original_max(&original);
    if (!st.ok()) return st;
    bool has_factor = false, has_attention = false;
    double attention = 0.0;
    st = rope.OptNumber("factor", 0.0, kNoMax, true, &has_factor, &fac);
    if (st.ok())
      st = rope.OptNumber("attention_factor", 0.0, kNoMax, true, &has_attention, &attention);
    if (!st.ok()) return st;
    if (!has_factor) {
      int64_t max_pos = 0;
      st = settings.Int("max_position_embeddings", 1, int64_t{1} << 40, &max_pos);
      if (!st.ok()) return st;
      fac = static_cast<double>(max_pos) / static_cast<double>(original);
    }
    if (!has_attention) {
      // _compute_longrope_parameters' default.
      attention = fac <= 1.0
                      ? 1.0
                      : std::sqrt(1.0 + std::log(fac) / std::log(static_cast<double>(original)));
      if (!(attention <= kNoMax)) {  // transformers divides by log(1) = 0 here
        return Unsupported(settings.label() + ": longrope with original_max_position_embeddings " +
                           Str(original) + " has no attention factor (log(original) = 0)");
      }
    }
    const size_t n = static_cast<size_t>(rd / 2);
    for (const char* key : {"short_factor", "long_factor"}) {
      const Json* v = rope.Get(key);
      const std::string expected =
          "a list of " + Str(rd / 2) + " positive numbers (rotary_dim / 2)";
      if (v == nullptr || !v->is_array() || v->size() != n) return rope.Error(key, expected);
      std::vector<float>& dst =
          std::strcmp(key, "short_factor") == 0 ? s->rope_short_factor : s->rope_long_factor;
      dst.clear();
      for (const Json& x : *v) {
        if (!x.is_number() || !(x.get<double>() > 0.0 && x.get<double>() <= kNoMax)) {
          return rope.Error(key, expected);
        }
        dst.push_back(static_cast<float>(x.get<double>()));
      }
    }
    c.rope_scaling = RopeScaling::kLongRope;
    c.rope_factor = static_cast<float>(fac);
    c.rope_original_max_positions = original;
    c.rope_attention_factor = static_cast<float>(attention);
    return Status::Ok();
  }
  const std::string key = rope.Has("rope_type") ? "rope_type" : "type";
  return rope.Refuse(
      key, "rope_type \"" + type + "\" is not supported (supported: " + kSupportedRopeTypes + ")");
}

bool IsLayerTypeKey(const std::string& k) {
  return k == "full_attention" || k == "sliding_attention";
}

}  // namespace

Status ReadHfTextFile(const std::string& path, size_t max_bytes, std::string* out) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return IoError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (fstat(fileno(file), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(file);
    return IoError(path + ": not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    std::fclose(file);
    return FormatError(path + ": " + std::to_string(st.st_size) + " bytes, expected at most " +
                       std::to_string(max_bytes));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  const size_t got = text.empty() ? 0 : std::fread(&text[0], 1, text.size(), file);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed || got != text.size()) return IoError(path + ": cannot read");
  *out = std::move(text);
  return Status::Ok();
}

Status ParseHfJson(const std::string& text, const std::string& label, nlohmann::json* out) {
  try {
    *out = Json::parse(text, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) throw TooDeep();
      return true;
    });
  } catch (const Json::exception& e) {
    return FormatError(label + ": not valid JSON: " + e.what());
  } catch (const TooDeep&) {
    return FormatError(label + ": JSON nested deeper than " + Str(kMaxJsonDepth) + " levels");
  }
  return Status::Ok();
}

Status HfConfig::Parse(const std::string& text, const std::string& label, HfConfig* out) {
  if (out == nullptr) return InvalidArgument("HfConfig::Parse: out is null");
  auto root = std::make_shared<Json>();
  Status s = ParseHfJson(text, label, root.get());
  if (!s.ok()) return s;
  if (!root->is_object()) {
    return FormatError(label + ": expected a JSON object, got " + Show(root.get()));
  }
  const Fields top(root.get(), label, "");
  HfConfig c;
  c.label_ = label;
  s = top.String("model_type", &c.model_type_);
  if (!s.ok()) return s;
  c.family_ = FindHfFamily(c.model_type_);
  if (c.family_ == nullptr) {
    return Unsupported(label + ": model_type \"" + c.model_type_ +
                       "\" is not supported (supported: " + SupportedHfModelTypes() + ")");
  }
  // The object that holds the text model's settings.
  const Json* source = root.get();
  if (c.family_->text_config) {
    const Json* text_config = nullptr;
    s = top.OptObject("text_config", &text_config);
    if (!s.ok()) return s;
    static const Json kEmpty = Json::object();
    source = text_config != nullptr ? text_config : &kEmpty;
    c.key_prefix_ = "text_config.";
  }
  auto merged = std::make_shared<Json>(Json::parse(c.family_->defaults));
  for (auto it = source->begin(); it != source->end(); ++it) (*merged)[it.key()] = it.value();
  for (const auto& alias : c.family_->key_aliases) {
    const auto it = source->find(alias.first);
    if (it != source->end()) {
      (*merged)[alias.second] = *it;
      c.source_keys_[alias.second] = alias.first;
    }
  }
  c.settings_ = std::move(merged);
  *out = std::move(c);
  return Status::Ok();
}

Status HfConfig::Load(const std::string& path, HfConfig* out) {
  if (out == nullptr) return InvalidArgument("HfConfig::Load: out is null");
  std::string text;
  const Status s = ReadHfTextFile(path, kHfMaxConfigBytes, &text);
  return s.ok() ? Parse(text, path, out) : s;
}

Status HfConfig::NumLayers(const HfModuleKind& kind, int64_t* out) const {
  const Fields f(settings_.get(), label_, key_prefix_, &source_keys_);
  return f.Int(kind.layers_key, 1, kHfMaxLayers, out);
}

Status HfConfig::ModuleSettings(const HfModuleKind& kind, int64_t layer,
                                HfModuleSettings* out) const {
  if (out == nullptr) return InvalidArgument("HfConfig::ModuleSettings: out is null");
  const HfFamily& f = *family_;
  const Fields cfg(settings_.get(), label_, key_prefix_, &source_keys_);
  HfModuleSettings s;
  s.family = family_;
  s.kind = &kind;
  s.layer = layer;
  s.layout = kind.layout;
  AttentionConfig& c = s.config;

  for (const HfRefusal& r : f.refusals) {
    const Json* v = cfg.Get(r.key);
    if (v != nullptr && !v->is_null() && *v != Json::parse(r.accepted)) {
      return cfg.Refuse(r.key, std::string(r.reason) + " is not supported, got " + Show(v));
    }
  }

  // Dimensions.
  int64_t num_layers = 0;
  Status st = cfg.Int("hidden_size", 1, kHfMaxHidden, &s.hidden_size);
  if (st.ok()) st = cfg.Int(kind.heads_key, 1, kHfMaxHeads, &s.num_heads);
  if (st.ok()) st = cfg.Int(kind.layers_key, 1, kHfMaxLayers, &num_layers);
  if (!st.ok()) return st;
  if (layer < 0 || layer >= num_layers) {
    return InvalidArgument(label_ + ": layer index " + Str(layer) + " is out of range: " +
                           cfg.Name(kind.layers_key) + " is " + Str(num_layers));
  }
  const int64_t H = s.num_heads;
  bool set = false;
  if (f.head_dim_key) {
    st = cfg.OptInt("head_dim", 1, kHfMaxHeadDim, &set, &s.head_dim);
    if (!st.ok()) return st;
  }
  if (!set) {
    if (s.hidden_size % H != 0) {
      return FormatError(label_ + ": " + cfg.Name("hidden_size") + " (" + Str(s.hidden_size) +
                         ") is not a multiple of " + cfg.Name(kind.heads_key) + " (" + Str(H) +
                         ")" + (f.head_dim_key ? " and head_dim is not given" : ""));
    }
    s.head_dim = s.hidden_size / H;
  }
  if (H * s.head_dim > kHfMaxHidden) {
    return FormatError(label_ + ": the attention width " + cfg.Name(kind.heads_key) +
                       " x head_dim = " + Str(H) + " x " + Str(s.head_dim) + " exceeds " +
                       Str(kHfMaxHidden));
  }
  s.num_kv_heads = H;
  if (f.kv_heads_key != nullptr) {
    st = cfg.OptInt(f.kv_heads_key, 1, H, &set, &s.num_kv_heads);
    if (!st.ok()) return st;
    if (!set) s.num_kv_heads = H;
  }
  if (s.layout == HfLayout::kFalcon) {
    bool new_arch = false, multi_query = false;
    st = cfg.Bool("new_decoder_architecture", false, &new_arch);
    if (st.ok()) st = cfg.Bool("multi_query", false, &multi_query);
    if (!st.ok()) return st;
    if (new_arch) {
      s.layout = HfLayout::kFalconGrouped;
      st = cfg.OptInt("num_kv_heads", 1, H, &set, &s.num_kv_heads);
      if (!st.ok()) return st;
      if (!set) s.num_kv_heads = H;
    } else if (multi_query) {
      s.layout = HfLayout::kFalconMultiQuery;
      s.num_kv_heads = 1;
    } else {
      s.layout = HfLayout::kPerHead;
    }
  }
  if (H % s.num_kv_heads != 0) {
    const char* key = s.layout == HfLayout::kFalconGrouped ? "num_kv_heads" : f.kv_heads_key;
    return cfg.Error(key, "a divisor of " + cfg.Name(kind.heads_key) + " (" + Str(H) + ")");
  }

  // Biases.
  if (f.bias_key != nullptr) {
    bool on = false;
    st = cfg.Bool(f.bias_key, false, &on);
    if (!st.ok()) return st;
    s.biases = on ? uint32_t{kBiasAll} : uint32_t{0};
  } else {
    s.biases = f.fixed_biases;
  }

  // Role.
  bool is_decoder = false;
  if (kind.role == HfRole::kSelfFromConfig) {
    st = cfg.Bool("is_decoder", false, &is_decoder);
    if (!st.ok()) return st;
  }
  s.causal =
      kind.role == HfRole::kDecoderSelf || (kind.role == HfRole::kSelfFromConfig && is_decoder);
  s.cross_attention = kind.role == HfRole::kCross;
  bool bidirectional = false;
  if (f.bidirectional_key && kind.role != HfRole::kCross) {
    st = cfg.Bool("use_bidirectional_attention", false, &bidirectional);
    if (!st.ok()) return st;
    if (bidirectional) s.causal = false;
  }

  // Score scale.
  if (f.scale == HfScale::kQueryPreAttnScalar) {
    double q = 0.0;
    st = cfg.Number("query_pre_attn_scalar", 0.0, kNoMax, true, &q);
    if (!st.ok()) return st;
    if (!(1.0 / std::sqrt(q) <= kNoMax)) {
      return cfg.Error("query_pre_attn_scalar", "a number whose ^-1/2 is a float");
    }
    c.scale = static_cast<float>(1.0 / std::sqrt(q));
  } else if (f.scale == HfScale::kGpt2) {
    bool by_weights = true, by_layer = false;
    st = cfg.Bool("scale_attn_weights", false, &by_weights);
    if (st.ok()) st = cfg.Bool("scale_attn_by_inverse_layer_idx", false, &by_layer);
    if (!st.ok()) return st;
    double scale = by_weights ? 1.0 / std::sqrt(static_cast<double>(s.head_dim)) : 1.0;
    if (by_layer) scale /= static_cast<double>(layer + 1);
    c.scale = static_cast<float>(scale);
  }

  // Layer type and sliding window.
  if (f.window == HfWindow::kLayerTypes) {
    const Json* types = cfg.Get("layer_types");
    if (types != nullptr && !types->is_null()) {
      if (!types->is_array() || types->size() != static_cast<size_t>(num_layers)) {
        return cfg.Error("layer_types", "a list of " + Str(num_layers) + " layer type names (" +
                                            cfg.Name(kind.layers_key) + ")");
      }
      const Json& t = (*types)[static_cast<size_t>(layer)];
      if (!t.is_string()) {
        return cfg.Error("layer_types", "a list of strings (entry " + Str(layer) + ")");
      }
      s.layer_type = t.get<std::string>();
      if (!IsLayerTypeKey(s.layer_type)) {
        return cfg.Refuse("layer_types", "layer type \"" + s.layer_type + "\" of layer " +
                                             Str(layer) +
                                             " is not supported (supported: full_attention, "
                                             "sliding_attention)");
      }
    } else {
      bool sliding = false;
      switch (f.default_types) {
        case HfDefaultTypes::kAllFull:
          break;
        case HfDefaultTypes::kEveryOther:
          sliding = (layer + 1) % 2 != 0;
          break;
        case HfDefaultTypes::kPattern: {
          int64_t pattern = 6;
          st = cfg.OptInt("sliding_window_pattern", 1, kHfMaxLayers, &set, &pattern);
          if (!st.ok()) return st;
          if (!set) pattern = 6;
          sliding = (layer + 1) % pattern != 0;
          break;
        }
        case HfDefaultTypes::kMaxWindowLayers: {
          bool gate = true;
          if (f.window_gate != nullptr) {
            st = cfg.Bool(f.window_gate, false, &gate);
            if (!st.ok()) return st;
          }
          if (gate && cfg.Has("sliding_window")) {
            int64_t max_window_layers = 0;
            st = cfg.Int("max_window_layers", 0, kHfMaxLayers, &max_window_layers);
            if (!st.ok()) return st;
            sliding = layer >= max_window_layers;
          }
          break;
        }
      }
      s.layer_type = sliding ? "sliding_attention" : "full_attention";
    }
  }
  bool windowed = f.window == HfWindow::kAllLayers ||
                  (f.window == HfWindow::kLayerTypes && s.layer_type == "sliding_attention");
  if (windowed && f.window_gate != nullptr) {
    st = cfg.Bool(f.window_gate, false, &windowed);
    if (!st.ok()) return st;
  }
  if (windowed && kind.role != HfRole::kCross) {
    int64_t window = 0;
    st = cfg.OptInt("sliding_window", 1, int64_t{1} << 40, &set, &window);
    if (!st.ok()) return st;
    // Gemma3TextConfig: bidirectional windows are |i - j| < sliding_window // 2 + 1.
    if (set) c.window = bidirectional ? window / 2 + 1 : window;
  }

  // RoPE.
  bool alibi_on = f.alibi == HfAlibi::kAlways;
  if (f.alibi == HfAlibi::kFalconConfig) {
    st = cfg.Bool("alibi", false, &alibi_on);
    if (!st.ok()) return st;
  }
  const bool rope_on = f.rope == HfRope::kNeox || f.rope == HfRope::kGptj ||
                       (f.rope == HfRope::kNeoxUnlessAlibi && !alibi_on);
  if (rope_on && f.rope == HfRope::kGptj) {
    // GPT-J: create_sinusoidal_positions with base 10000 over rotary_dim components (the whole
    // head when null).
    int64_t rd = s.head_dim;
    st = cfg.OptInt("rotary_dim", 1, s.head_dim, &set, &rd);
    if (!st.ok()) return st;
    if (!set) rd = s.head_dim;
    if (rd % 2 != 0) return cfg.Error("rotary_dim", "an even number");
    c.rope = RopeStyle::kGptj;
    c.rope_theta = 10000.0f;
    c.rotary_dim = rd == s.head_dim ? 0 : rd;
  } else if (rope_on) {
    const Json* scaling = nullptr;
    const Json* params = nullptr;
    st = cfg.OptObject("rope_scaling", &scaling);
    if (st.ok()) st = cfg.OptObject("rope_parameters", &params);
    if (!st.ok()) return st;
    const Json empty = Json::object();
    if (f.default_local_theta > 0.0) {
      // Gemma3TextConfig.convert_rope_params_to_dict: one dict per layer type (defaults
      // {"rope_type": "default"}), rope_scaling merged into the full-attention one, bases
      // rope_theta (global) and rope_local_base_freq (sliding).
      const bool local = s.layer_type == "sliding_attention";
      Json entry = Json::object({{"rope_type", "default"}});
      const std::string type_key = local ? "sliding_attention" : "full_attention";
      std::string where = "rope_parameters." + type_key + ".";
      if (params != nullptr) {
        const auto it = params->find(type_key);
        if (it != params->end() && !it->is_null()) {
          if (!it->is_object()) {
            return Fields(params, label_, key_prefix_ + "rope_parameters.")
                .Error(type_key, "an object or null");
          }
          entry = *it;
        }
      }
      if (!local && scaling != nullptr) {
        entry.update(*scaling);
        where = "rope_scaling / " + where;
      }
      double theta = local ? f.default_local_theta : f.default_theta;
      st = cfg.OptNumber(local ? "rope_local_base_freq" : "rope_theta", 0.0, kNoMax, true, &set,
                         &theta);
      if (!st.ok()) return st;
      const Fields rope(&entry, label_, key_prefix_ + where);
      const Fields top(params != nullptr ? params : &empty, label_,
                       key_prefix_ + "rope_parameters.");
      st = ReadRope(cfg, rope, top, f, /*theta_given=*/true, theta, &s);
      if (!st.ok()) return st;
    } else {
      // RotaryEmbeddingConfigMixin: rope_scaling (a non-empty dict) over rope_parameters over
      // the class's default.
      Json default_rope;
      const Json* dict = &empty;
      std::string where = "rope_parameters.";
      if (scaling != nullptr && !scaling->empty()) {
        dict = scaling;
        where = "rope_scaling.";
      } else if (params != nullptr) {
        dict = params;
      } else if (f.default_rope != nullptr && cfg.Get("rope_parameters") == nullptr) {
        default_rope = Json::parse(f.default_rope);
        dict = &default_rope;
      }
      const Json* entry = dict;
      std::string entry_where = where;
      bool nested = false;
      for (auto it = dict->begin(); it != dict->end(); ++it) nested |= IsLayerTypeKey(it.key());
      if (nested) {
        if (f.window != HfWindow::kLayerTypes) {
          return Unsupported(label_ + ": " + key_prefix_ + where +
                             " holds per-layer-type entries, but " + f.model_type +
                             " has no layer types");
        }
        const auto it = dict->find(s.layer_type);
        if (it == dict->end() || it->is_null()) {
          return Unsupported(label_ + ": " + key_prefix_ + where + ": no RoPE entry for layer " +
                             Str(layer) + "'s type \"" + s.layer_type +
                             "\" (layers without RoPE are not supported)");
        }
        if (!it->is_object()) {
          return Fields(dict, label_, key_prefix_ + where).Error(s.layer_type, "an object");
        }
        entry = &*it;
        entry_where = where + s.layer_type + ".";
      }
      const Fields rope(entry, label_, key_prefix_ + entry_where);
      const Fields top(dict, label_, key_prefix_ + where);
      st = ReadRope(cfg, rope, top, f, /*theta_given=*/false, 0.0, &s);
      if (!st.ok()) return st;
    }
  }

  // ALiBi.
  if (alibi_on) {
    c.alibi = true;
    if (f.alibi == HfAlibi::kFalconConfig) {
      // FalconModel adds alibi / sqrt(hd) to the scores, its slopes rounded to bf16 first
      // (build_alibi_tensor: slopes.bfloat16() * key index).
      const double inv_norm = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
      for (double m : AlibiSlopes(H)) {
        s.alibi_slopes.push_back(static_cast<float>(RoundToBf16(m) * inv_norm));
      }
    }
  }

  // QK-norm, softcap, sinks.
  s.qk_norm = f.qk_norm;
  if (f.qk_norm != HfQkNorm::kNone) {
    double eps = 0.0;
    st = cfg.Number(f.norm_eps_key, 0.0, 1.0, true, &eps);
    if (!st.ok()) return st;
    c.qk_norm_eps = static_cast<float>(eps);
    c.qk_norm_whole = f.qk_norm == HfQkNorm::kWhole;
  }
  if (f.softcap_key != nullptr) {
    double cap = 0.0;
    st = cfg.OptNumber(f.softcap_key, 0.0, kNoMax, true, &set, &cap);
    if (!st.ok()) return st;
    if (set) c.softcap = static_cast<float>(cap);
  }
  s.sinks = f.sinks;

  // The operator's dimensions and biases.
  c.embed_dim = s.hidden_size;
  c.num_heads = H;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = H * s.head_dim == s.hidden_size ? 0 : s.head_dim;
  c.bias = s.biases == kBiasAll;
  c.bias_projections = s.biases == 0 || s.biases == kBiasAll ? 0 : s.biases;
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace mha
