// mha-bench --hf: the attention layer of a Hugging Face checkpoint as the case to time, with
// the shapes of its config.json (MultiheadAttention::CreateFromHuggingFace).
#ifndef MHA_TOOLS_BENCH_HF_H_
#define MHA_TOOLS_BENCH_HF_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "mha/mha.hpp"
#include "tools/bench_args.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {

// What the report says about the checkpoint's layer.
struct HfModel {
  std::string dir;
  std::string model_type;  // config.json's
  std::string prefix;      // the state_dict prefix of the module read
  int64_t layer = -1;      // --layer, or -1 with --prefix
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false, cross_attention = false;
  DType weights = DType::kF32;  // the layer's weight storage (--weights-dtype)
  Compute compute = Compute::kF32;
  bool view = false;     // WeightBinding::kView (--binding view)
  std::string settings;  // " rope=neox theta=500000 rope_scaling=llama3 window=4096 ..."
  double load_ms = 0;    // wall time of CreateFromHuggingFace
};

// Loads the layer `o` names (--hf, --layer or --prefix, --weights-dtype, --compute,
// --no-prepack/--strassen, --binding). Errors carry "--hf DIR: " and the loader's message.
Status LoadHfLayer(const BenchOptions& o, std::unique_ptr<MultiheadAttention>* layer,
                   HfModel* model);

// The forward case of a loaded layer: batch, seq, need_weights and the prepack flags from `o`
// (kv_seq too for a cross-attention module, default seq), the rest from the layer. False with
// a one-line *error (a usage error) for --kv-seq on a self-attention layer or a tensor above
// 2^31 elements.
bool HfShape(const BenchOptions& o, const MultiheadAttention& layer, const HfModel& model,
             Shape* shape, std::string* error);

// --decode --hf: false with a one-line *error when the layer cannot decode through a KV cache
// (a bidirectional or cross-attention module).
bool HfCanDecode(const HfModel& model, std::string* error);

// "checkpoint DIR: llama, layer 1 (model.layers.1.self_attn.): hidden 64, 4 heads, 2 kv heads,
// head_dim 16, causal, rope=neox theta=10000 | weights bf16 | loaded in 1.23 ms"
std::string HfModelLine(const HfModel& model);
// The same as a JSON object (the header's "hf").
nlohmann::ordered_json HfModelJson(const HfModel& model);

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_HF_H_
