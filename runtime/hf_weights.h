// One attention module's tensors in a Hugging Face checkpoint -> AttentionWeights, by the
// module's layout (runtime/hf_families.h): separate nn.Linear weights are used where they lie
// in the mapping; fused ones are split by row ranges (views too), reordered (Falcon's grouped
// layout) or transposed (GPT-2's Conv1D) into temporaries in their stored dtype, never widened
// to f32 here (the layer converts at creation when its weight_dtype differs). The per-head
// fused layout ([H, 3, hd] rows: GPT-NeoX, BLOOM, classic Falcon) is handed to the operator as
// in_proj_weight with QkvLayout::kPerHead. Biases, norm weights and sinks are widened to f32
// (Gemma 3's norms as 1 + w). Every tensor's shape is checked against the settings
// (FormatError naming the tensor, the expected and the actual shape); non-float dtypes are
// Unsupported.
//
// WeightBinding::kView: every projection matrix must be usable in place (stored in the
// layer's weight_dtype, aligned, neither transposed nor reordered), else InvalidArgument
// naming the tensor and the reason; the mapped files are then kept in the storage.
//
// Internal: not installed.
#ifndef MHA_RUNTIME_HF_WEIGHTS_H_
#define MHA_RUNTIME_HF_WEIGHTS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/hf_checkpoint.h"
#include "runtime/hf_config.h"

namespace mha {

// What AttentionWeights' pointers reach: the mapped files and the temporaries.
struct HfStorage {
  std::vector<std::shared_ptr<const SafeTensorsFile>> files;
  std::deque<std::vector<uint8_t>> bytes;  // deque: elements never move
  std::deque<std::vector<float>> floats;
};

struct HfWeights {
  AttentionWeights weights;
  std::shared_ptr<HfStorage> storage;
};

// Reads the module whose state_dict prefix is `prefix` (with its trailing dot) as `s`
// describes. `weight_dtype` and `binding` are the layer's (HfOptions').
Status ReadHfWeights(HfCheckpoint& checkpoint, const std::string& prefix, const HfModuleSettings& s,
                     DType weight_dtype, WeightBinding binding, HfWeights* out);

}  // namespace mha

#endif  // MHA_RUNTIME_HF_WEIGHTS_H_
