// The safetensors of a Hugging Face checkpoint folder: model.safetensors, or the shards that
// model.safetensors.index.json's weight_map names (transformers looks for model.safetensors
// first, as here). Nothing is read in proportion to the checkpoint: opening maps the single file
// and validates its header, or parses the index; a shard is mapped (header validated, no data
// read) the first time one of its tensors is asked for, so loading one layer of a sharded
// checkpoint touches only the shards holding that layer.
//
// Shard paths in the index must stay inside the folder: relative, no ".." component, no
// control characters (FormatError naming the index entry). Symbolic links are followed, as in
// the Hugging Face cache, whose snapshot folders link every file to ../../blobs/.
//
// Internal: not installed.
#ifndef MHA_RUNTIME_HF_CHECKPOINT_H_
#define MHA_RUNTIME_HF_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mha/types.hpp"
#include "runtime/safetensors.h"

namespace mha {

// An index larger than this is not an index.
inline constexpr size_t kHfMaxIndexBytes = size_t{256} << 20;

class HfCheckpoint {
 public:
  // IoError when the folder holds neither file (or a shard cannot be opened later); FormatError
  // for a malformed file or index; Unsupported for a folder holding only PyTorch .bin weights.
  static Status Open(const std::string& dir, HfCheckpoint* out);

  // Every tensor name of the checkpoint (the header's, or the index's weight_map keys).
  const std::vector<std::string>& names() const { return names_; }
  // *out = tensor `name` (mapping its shard on first use), or null when the checkpoint has no
  // such tensor. IoError for a shard that cannot be opened, FormatError for a malformed shard
  // or one that lacks a tensor the index assigns to it.
  Status Find(const std::string& name, const TensorInfo** out);
  // The files mapped so far; a layer that views tensors keeps them alive.
  std::vector<std::shared_ptr<const SafeTensorsFile>> Opened() const;
  // "checkpoint '<dir>'" for messages.
  const std::string& label() const { return label_; }

 private:
  std::string dir_;
  std::string label_;
  std::string index_path_;  // empty: a single model.safetensors
  std::vector<std::string> names_;
  std::map<std::string, std::string> shard_of_;  // tensor -> shard path (relative to dir_)
  std::map<std::string, std::shared_ptr<const SafeTensorsFile>> files_;  // by relative path
};

}  // namespace mha

#endif  // MHA_RUNTIME_HF_CHECKPOINT_H_
