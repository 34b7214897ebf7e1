// A checkpoint folder's safetensors files (runtime/hf_checkpoint.h).
#include "runtime/hf_checkpoint.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "runtime/hf_config.h"

namespace mha {

namespace {

using Json = nlohmann::json;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Why `shard` (an index entry) may not be opened, or "" when it is a plain relative path inside
// the folder.
std::string UnsafeShardPath(const std::string& shard) {
  if (shard.empty()) return "is empty";
  if (shard[0] == '/') return "is absolute";
  for (unsigned char ch : shard) {
    if (ch < 0x20 || ch == 0x7f) return "holds a control character";
  }
  size_t begin = 0;
  while (begin <= shard.size()) {
    size_t end = shard.find('/', begin);
    if (end == std::string::npos) end = shard.size();
    if (shard.compare(begin, end - begin, "..") == 0 && end - begin == 2) {
      return "has a \"..\" component";
    }
    begin = end + 1;
  }
  if (shard.back() == '/') return "names a folder";
  return "";
}

}  // namespace

Status HfCheckpoint::Open(const std::string& dir, HfCheckpoint* out) {
  if (out == nullptr) return InvalidArgument("HfCheckpoint::Open: out is null");
  HfCheckpoint c;
  c.dir_ = dir;
  c.label_ = "checkpoint '" + dir + "'";
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  if (Exists(single)) {
    auto file = std::make_shared<SafeTensorsFile>();
    Status s = SafeTensorsFile::Open(single, file.get());
    if (!s.ok()) return s;
    for (const TensorInfo& t : file->tensors()) c.names_.push_back(t.name);
    c.files_["model.safetensors"] = std::move(file);
    *out = std::move(c);
    return Status::Ok();
  }
  if (!Exists(index)) {
    if (Exists(dir + "/pytorch_model.bin") || Exists(dir + "/pytorch_model.bin.index.json")) {
      return Unsupported(c.label_ + ": holds PyTorch pickle weights (pytorch_model.bin) only; " +
                         "mha reads safetensors (convert with transformers' save_pretrained)");
    }
    return IoError(c.label_ + ": no model.safetensors or model.safetensors.index.json" +
                   (Exists(dir) ? std::string() : " (the folder does not exist)"));
  }
  std::string text;
  Status s = ReadHfTextFile(index, kHfMaxIndexBytes, &text);
  if (!s.ok()) return s;
  Json root;
  s = ParseHfJson(text, index, &root);
  if (!s.ok()) return s;
  const auto map = root.is_object() ? root.find("weight_map") : root.end();
  if (map == root.end() || !map->is_object()) {
    return FormatError(index + ": expected an object with a \"weight_map\" object");
  }
  std::set<std::string> checked;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return FormatError(index + ": weight_map[\"" + it.key() + "\"]: expected a file name, got " +
                         it->dump(-1, ' ', false, Json::error_handler_t::replace).substr(0, 80));
    }
    const std::string shard = it->get<std::string>();
    if (checked.insert(shard).second) {
      const std::string why = UnsafeShardPath(shard);
      if (!why.empty()) {
        return FormatError(index + ": weight_map[\"" + it.key() + "\"]: shard path \"" + shard +
                           "\" " + why + "; shards must be files inside the checkpoint folder");
      }
    }
    c.names_.push_back(it.key());
    c.shard_of_[it.key()] = shard;
  }
  c.index_path_ = index;
  *out = std::move(c);
  return Status::Ok();
}

Status HfCheckpoint::Find(const std::string& name, const TensorInfo** out) {
  *out = nullptr;
  if (index_path_.empty()) {
    *out = files_.begin()->second->Find(name);
    return Status::Ok();
  }
  const auto entry = shard_of_.find(name);
  if (entry == shard_of_.end()) return Status::Ok();
  const std::string& shard = entry->second;
  auto file = files_.find(shard);
  if (file == files_.end()) {
    auto opened = std::make_shared<SafeTensorsFile>();
    const std::string path = dir_ + "/" + shard;
    Status s = SafeTensorsFile::Open(path, opened.get());
    if (!s.ok()) {
      return Status(s.code(), index_path_ + ": shard \"" + shard + "\" (holding '" + name +
                                  "'): " + s.message());
    }
    file = files_.emplace(shard, std::move(opened)).first;
  }
  *out = file->second->Find(name);
  if (*out == nullptr) {
    return FormatError(index_path_ + ": weight_map puts '" + name + "' in shard \"" + shard +
                       "\", which does not hold it");
  }
  return Status::Ok();
}

std::vector<std::shared_ptr<const SafeTensorsFile>> HfCheckpoint::Opened() const {
  std::vector<std::shared_ptr<const SafeTensorsFile>> v;
  for (const auto& f : files_) v.push_back(f.second);
  return v;
}

}  // namespace mha
