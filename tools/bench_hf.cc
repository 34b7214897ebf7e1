// mha-bench --hf (tools/bench_hf.h).
#include "tools/bench_hf.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "runtime/rope_scaling.h"

namespace mha {
namespace bench {

namespace {

std::string Number(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g", x);
  return b;
}

// The variants of the layer's config that the table's label shows (the FLOP count needs only
// the window among them).
Variants VariantsOf(const AttentionConfig& c) {
  Variants v;
  v.kv_heads = c.num_kv_heads > 0 && c.num_kv_heads != c.num_heads ? c.num_kv_heads : 0;
  v.rope = c.rope;
  v.rope_theta = c.rope_theta;
  v.rotary_dim = c.rotary_dim;
  v.rope_scale = c.rope_scale;
  v.alibi = c.alibi;
  v.window = c.window;
  v.softcap = c.softcap;
  return v;
}

}  // namespace

Status LoadHfLayer(const BenchOptions& o, std::unique_ptr<MultiheadAttention>* layer,
                   HfModel* model) {
  HfOptions options;
  options.weight_dtype = o.decode_weights;
  options.weight_block = o.decode_weight_block;
  options.compute = o.bf16_compute   ? Compute::kBF16
                    : o.int8_compute ? Compute::kInt8
                                     : Compute::kF32;
  options.prepack = o.no_prepack ? WeightPrepack::kOff
                    : o.strassen ? WeightPrepack::kStrassen
                                 : WeightPrepack::kOn;
  options.prefix = o.hf_prefix;
  options.binding = o.hf_view ? WeightBinding::kView : WeightBinding::kCopy;
  HfLayerInfo info;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = MultiheadAttention::CreateFromHuggingFace(
      o.hf_dir, o.hf_prefix_given ? 0 : o.hf_layer, options, layer, &info);
  const auto t1 = std::chrono::steady_clock::now();
  if (!s.ok()) return Status(s.code(), "--hf " + o.hf_dir + ": " + s.message());
  const AttentionConfig& c = (*layer)->config();
  HfModel& m = *model;
  m.dir = o.hf_dir;
  m.model_type = info.model_type;
  m.prefix = info.prefix;
  m.layer = o.hf_prefix_given ? -1 : o.hf_layer;
  m.hidden = info.hidden_size;
  m.heads = c.num_heads;
  m.kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  m.head_dim = (*layer)->head_dim();
  m.causal = info.causal;
  m.cross_attention = info.cross_attention;
  m.weights = c.weight_dtype;
  m.compute = c.compute;
  m.view = o.hf_view;
  Shape label;  // only for VariantsLabel's wording
  label.embed = m.hidden;
  label.heads = m.heads;
  label.variants = VariantsOf(c);
  label.variants.kv_heads = 0;  // named on its own
  m.settings = VariantsLabel(label);
  if (c.rope_scaling != RopeScaling::kNone) {
    m.settings += std::string(" rope_scaling=") + RopeScalingName(c.rope_scaling);
    if (c.rope_factor > 0) m.settings += " factor=" + Number(c.rope_factor);
  }
  if (c.scale > 0) m.settings += " scale=" + Number(c.scale);
  m.load_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  return Status::Ok();
}

bool HfShape(const BenchOptions& o, const MultiheadAttention& layer, const HfModel& m, Shape* shape,
             std::string* error) {
  if (o.kv_seq_given && !m.cross_attention) {
    *error = "--kv-seq: not with the self-attention module '" + m.prefix +
             "' (its keys are the query's tokens); --kv-seq is for a cross-attention --prefix";
    return false;
  }
  Shape s = o.shape;  // batch, seq, kv_seq (= seq unless --kv-seq), need_weights, prepack
  s.embed = m.hidden;
  s.heads = m.heads;
  s.head_dim = m.head_dim;
  s.cross = m.cross_attention;
  s.causal = m.causal;
  s.variants = VariantsOf(layer.config());
  const double n = static_cast<double>(s.batch), l = static_cast<double>(s.seq),
               kv = static_cast<double>(s.kv_seq), e = static_cast<double>(s.embed);
  const struct {
    const char* name;
    double elements;
  } tensors[] = {{"query [batch, seq, hidden]", n * l * e},
                 {"key/value [batch, kv_seq, hidden]", s.cross ? n * kv * e : 0},
                 {"attn_weights [batch, seq, kv_seq]", s.need_weights ? n * l * kv : 0}};
  for (const auto& t : tensors) {
    if (t.elements > 2147483648.0) {
      *error = "shape: expected at most 2^31 elements per tensor, got " + Number(t.elements) +
               " in " + t.name;
      return false;
    }
  }
  *shape = s;
  return true;
}

bool HfCanDecode(const HfModel& m, std::string* error) {
  if (m.causal && !m.cross_attention) return true;
  *error = "--decode: the module '" + m.prefix + "' of this " + m.model_type + " checkpoint is " +
           (m.cross_attention ? "cross-attention" : "bidirectional self-attention") +
           "; a KV cache decodes a causal self-attention layer (time it without --decode)";
  return false;
}

std::string HfModelLine(const HfModel& m) {
  char load[32];
  std::snprintf(load, sizeof(load), "%.2f", m.load_ms);
  std::string line = "checkpoint " + m.dir + ": " + m.model_type;
  line += m.layer >= 0 ? ", layer " + std::to_string(m.layer) + " (" + m.prefix + ")"
                       : ", module " + m.prefix;
  line += ": hidden " + std::to_string(m.hidden) + ", " + std::to_string(m.heads) + " heads, " +
          std::to_string(m.kv_heads) + " kv heads, head_dim " + std::to_string(m.head_dim);
  line += m.cross_attention ? ", cross-attention" : m.causal ? ", causal" : ", bidirectional";
  if (!m.settings.empty()) line += ";" + m.settings;
  line += std::string("  |  weights ") + DTypeName(m.weights);
  if (m.view) line += ", viewed in place";
  if (m.compute == Compute::kBF16) line += ", compute bf16";
  line += "  |  loaded in " + std::string(load) + " ms";
  return line;
}

nlohmann::ordered_json HfModelJson(const HfModel& m) {
  nlohmann::ordered_json j;
  j["dir"] = m.dir;
  j["model_type"] = m.model_type;
  j["prefix"] = m.prefix;
  j["layer"] = m.layer >= 0 ? nlohmann::ordered_json(m.layer) : nlohmann::ordered_json(nullptr);
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["kv_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim;
  j["causal"] = m.causal;
  j["cross_attention"] = m.cross_attention;
  j["settings"] = m.settings.empty() ? std::string() : m.settings.substr(1);
  j["weights_dtype"] = DTypeName(m.weights);
  j["compute"] = m.compute == Compute::kBF16 ? "bf16" : "f32";
  j["binding"] = m.view ? "view" : "copy";
  j["load_ms"] = m.load_ms;
  return j;
}

}  // namespace bench
}  // namespace mha
