// MultiheadAttention::CreateFromHuggingFace: find the module, read its settings and tensors,
// create the layer (runtime/hf_loader.h).
#include "runtime/hf_loader.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "runtime/attention_impl.h"
#include "runtime/hf_checkpoint.h"

namespace mha {

namespace {

// Name segments of model parts whose attention is not the text model's (Gemma 3's SigLIP
// tower, Whisper-style audio towers of multimodal models, projectors).
bool InOtherTower(const std::string& prefix) {
  static const char* const kTowers[] = {"vision_tower", "vision_model", "visual",
                                        "audio_tower",  "audio_model",  "multi_modal_projector"};
  size_t begin = 0;
  while (begin < prefix.size()) {
    size_t end = prefix.find('.', begin);
    if (end == std::string::npos) end = prefix.size();
    const std::string seg = prefix.substr(begin, end - begin);
    for (const char* t : kTowers) {
      if (seg == t) return true;
    }
    begin = end + 1;
  }
  return false;
}

// `pattern` with every "{i}" replaced by `layer`.
std::string Expand(const std::string& pattern, int64_t layer) {
  std::string p = pattern;
  for (size_t at = p.find("{i}"); at != std::string::npos; at = p.find("{i}", at)) {
    p.replace(at, 3, std::to_string(layer));
  }
  return p;
}

// The tensor that tells a module is there: its first projection weight.
std::string Probe(const HfModuleKind& kind) {
  const HfTensorNames& n = kind.names;
  return std::string(n.qkv != nullptr ? n.qkv : n.q) + ".weight";
}

// Whether `prefix` ends with `pattern` at a name boundary; *layer = the index it holds.
bool MatchPattern(const std::string& prefix, const char* pattern, int64_t* layer) {
  const std::string p = pattern;
  const size_t at = p.find("{i}");
  const std::string head = p.substr(0, at), tail = p.substr(at + 3);
  if (prefix.size() < head.size() + tail.size() + 1) return false;
  if (prefix.compare(prefix.size() - tail.size(), tail.size(), tail) != 0) return false;
  size_t end = prefix.size() - tail.size(), begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(prefix[begin - 1]))) --begin;
  const size_t digits = end - begin;
  if (digits == 0 || digits > 9 || begin < head.size()) return false;
  if (digits > 1 && prefix[begin] == '0') return false;
  const size_t h = begin - head.size();
  if (prefix.compare(h, head.size(), head) != 0) return false;
  if (h > 0 && prefix[h - 1] != '.') return false;
  *layer = std::stoll(prefix.substr(begin, digits));
  return true;
}

// Prefixes of the modules `kind` names for `layer` in the checkpoint.
std::vector<std::string> Candidates(const HfCheckpoint& ckpt, const HfModuleKind& kind,
                                    int64_t layer) {
  const std::string tail = Expand(kind.pattern, layer);
  const std::string end = tail + Probe(kind);
  std::vector<std::string> found;
  for (const std::string& name : ckpt.names()) {
    if (name.size() < end.size() || name.compare(name.size() - end.size(), end.size(), end) != 0) {
      continue;
    }
    const size_t lead = name.size() - end.size();
    if (lead > 0 && name[lead - 1] != '.') continue;
    const std::string prefix = name.substr(0, lead) + tail;
    if (!InOtherTower(prefix)) found.push_back(prefix);
  }
  return found;
}

std::string Patterns(const HfFamily& f, bool by_index_only) {
  std::string s;
  for (const HfModuleKind& k : f.modules) {
    if (by_index_only && !k.by_layer_index) continue;
    s += (s.empty() ? "" : ", ") + std::string(k.pattern) + Probe(k);
  }
  return s;
}

// The module of `layer_index` (or of options.prefix): its kind, layer and prefix.
Status FindModule(const HfConfig& config, const HfCheckpoint& ckpt, int64_t layer_index,
                  const std::string& given_prefix, const HfModuleKind** kind, int64_t* layer,
                  std::string* prefix) {
  const HfFamily& f = config.family();
  if (!given_prefix.empty()) {
    std::string p = given_prefix;
    if (p.back() != '.') p += '.';
    if (InOtherTower(p)) {
      // Its settings are not in the text model's config: refused rather than misread.
      return InvalidArgument("HfOptions::prefix \"" + given_prefix +
                             "\" is in a vision or audio tower; mha reads the text model's "
                             "attention modules");
    }
    for (const HfModuleKind& k : f.modules) {
      if (MatchPattern(p, k.pattern, layer)) {
        *kind = &k;
        *prefix = p;
        return Status::Ok();
      }
    }
    std::string forms;
    for (const HfModuleKind& k : f.modules)
      forms += (forms.empty() ? "" : ", ") + std::string(k.pattern);
    return InvalidArgument("HfOptions::prefix \"" + given_prefix +
                           "\" is not an attention module of a " + config.model_type() +
                           " checkpoint (expected a prefix ending in one of: " + forms + ")");
  }
  for (const HfModuleKind& k : f.modules) {
    if (!k.by_layer_index) continue;
    const std::vector<std::string> found = Candidates(ckpt, k, layer_index);
    if (found.size() > 1) {
      std::string list;
      for (const std::string& c : found) list += (list.empty() ? "\"" : ", \"") + c + "\"";
      return InvalidArgument(ckpt.label() + ": several attention modules match layer " +
                             std::to_string(layer_index) + ": " + list +
                             "; choose one with HfOptions::prefix");
    }
    if (found.size() == 1) {
      *kind = &k;
      *layer = layer_index;
      *prefix = found[0];
      return Status::Ok();
    }
  }
  // Nothing found: an index beyond the stack, or a checkpoint without the family's names.
  for (const HfModuleKind& k : f.modules) {
    if (!k.by_layer_index) continue;
    int64_t layers = 0;
    Status s = config.NumLayers(k, &layers);
    if (!s.ok()) return s;
    if (layer_index >= layers) {
      return InvalidArgument(config.label() + ": layer index " + std::to_string(layer_index) +
                             " is out of range: " + k.layers_key + " is " + std::to_string(layers));
    }
    break;
  }
  return FormatError(ckpt.label() + ": no tensor of layer " + std::to_string(layer_index) +
                     "'s attention for model_type " + config.model_type() +
                     " (expected a name ending in " +
                     Expand(Patterns(f, /*by_index_only=*/true), layer_index) + ")");
}

}  // namespace

Status ReadHfLayer(const std::string& dir, int64_t layer_index, const HfOptions& options,
                   HfLayer* out) {
  if (out == nullptr) return InvalidArgument("ReadHfLayer: out is null");
  if (options.prefix.empty() && layer_index < 0) {
    return InvalidArgument("layer_index: expected >= 0, got " + std::to_string(layer_index));
  }
  const DType st = options.weight_dtype;
  if (st != DType::kF32 && st != DType::kBF16 && st != DType::kF16 && !IsQuantized(st)) {
    return InvalidArgument(
        std::string("HfOptions::weight_dtype: expected F32, BF16, F16, I8 or I4, got ") +
        DTypeName(st));
  }
  if (options.binding != WeightBinding::kView && options.binding != WeightBinding::kCopy) {
    return InvalidArgument("HfOptions::binding: expected kView (0) or kCopy (1), got " +
                           std::to_string(static_cast<int>(options.binding)));
  }
  if (IsQuantized(st) && options.binding == WeightBinding::kView) {
    return InvalidArgument(std::string("HfOptions::binding: weight_dtype ") + DTypeName(st) +
                           " quantizes the weights into the layer's own codes: expected kCopy, "
                           "got kView");
  }
  HfConfig config;
  Status s = HfConfig::Load(dir + "/config.json", &config);
  if (!s.ok()) return s;
  HfCheckpoint ckpt;
  s = HfCheckpoint::Open(dir, &ckpt);
  if (!s.ok()) return s;
  const HfModuleKind* kind = nullptr;
  int64_t layer = 0;
  std::string prefix;
  s = FindModule(config, ckpt, layer_index, options.prefix, &kind, &layer, &prefix);
  if (!s.ok()) return s;
  HfLayer l;
  s = config.ModuleSettings(*kind, layer, &l.settings);
  if (!s.ok()) return s;
  HfWeights w;
  // Quantized storage reads the matrices as stored (f32 if they disagree); Create quantizes them
  // one row at a time.
  s = ReadHfWeights(ckpt, prefix, l.settings, IsQuantized(st) ? DType::kF32 : st, options.binding,
                    &w);
  if (!s.ok()) return s;
  l.config = l.settings.config;
  l.config.weight_dtype = st;
  l.config.weight_block = options.weight_block;
  l.config.compute = options.compute;
  l.config.prepack = options.prepack;
  l.config.batch_first = options.batch_first;
  l.weights = w.weights;
  l.storage = std::move(w.storage);
  l.info.model_type = config.model_type();
  l.info.prefix = prefix;
  l.info.hidden_size = l.settings.hidden_size;
  l.info.causal = l.settings.causal;
  l.info.cross_attention = l.settings.cross_attention;
  *out = std::move(l);
  return Status::Ok();
}

Status MultiheadAttention::CreateFromHuggingFace(const std::string& dir, int64_t layer_index,
                                                 const HfOptions& options,
                                                 std::unique_ptr<MultiheadAttention>* out,
                                                 HfLayerInfo* info) {
  if (out == nullptr) return InvalidArgument("CreateFromHuggingFace: out is null");
  HfLayer l;
  Status s = ReadHfLayer(dir, layer_index, options, &l);
  if (!s.ok()) return s;
  // A viewing layer keeps the mapped files (and the f32 biases it points at) alive; a copy
  // needs nothing once created.
  std::shared_ptr<const void> keep;
  if (options.binding == WeightBinding::kView) keep = l.storage;
  std::unique_ptr<MultiheadAttention> layer;
  s = CreateKeepingAlive(l.config, l.weights, options.binding, std::move(keep), &layer);
  if (!s.ok()) {
    return Status(s.code(), "checkpoint '" + dir + "' (" + l.info.prefix + "): " + s.message());
  }
  *out = std::move(layer);
  if (info != nullptr) *info = std::move(l.info);
  return Status::Ok();
}

}  // namespace mha
