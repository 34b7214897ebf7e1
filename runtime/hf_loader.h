// MultiheadAttention::CreateFromHuggingFace, split in two so that tests can see what the
// operator is given: ReadHfLayer finds the module (layer index or state_dict prefix), reads its
// settings (hf_config) and tensors (hf_weights) into an AttentionConfig + AttentionWeights;
// CreateFromHuggingFace hands them to MultiheadAttention::Create.
//
// Module discovery does not assume a model class: for a layer index, the first of the family's
// module patterns (hf_families.h, e.g. "layers.{i}.self_attn.") whose probe tensor
// ("...q_proj.weight") some checkpoint name ends with, at a name boundary, gives the prefix
// (the leading part is whatever the class put there: "model.", "model.language_model.",
// "transformer.", none). Tensors of vision or audio towers are not candidates. Several
// matches are an InvalidArgument listing them (HfOptions::prefix then picks one). A given
// prefix must end with one of the family's patterns; its layer index is read from it.
//
// Internal: not installed.
#ifndef MHA_RUNTIME_HF_LOADER_H_
#define MHA_RUNTIME_HF_LOADER_H_

#include <memory>
#include <string>

#include "mha/mha.hpp"
#include "runtime/hf_config.h"
#include "runtime/hf_weights.h"

namespace mha {

struct HfLayer {
  AttentionConfig config;
  AttentionWeights weights;  // pointers into storage
  std::shared_ptr<HfStorage> storage;
  HfModuleSettings settings;
  HfLayerInfo info;
};

// Everything CreateFromHuggingFace does but the creation. Argument errors are InvalidArgument.
Status ReadHfLayer(const std::string& dir, int64_t layer_index, const HfOptions& options,
                   HfLayer* out);

}  // namespace mha

#endif  // MHA_RUNTIME_HF_LOADER_H_
