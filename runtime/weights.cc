// nn.MultiheadAttention weight loading (runtime/weights.h).
#include "runtime/weights.h"

#include <string>
#include <utility>
#include <vector>

namespace mha {

namespace {

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

class Loader {
 public:
  Loader(const SafeTensorsFile& file, const std::string& prefix)
      : file_(file), prefix_(prefix), where_("safetensors '" + file.path() + "': ") {}

  const TensorInfo* Find(const char* name) const { return file_.Find(prefix_ + name); }

  Status Missing(const std::string& what) const {
    return FormatError(where_ + "missing tensor " + what);
  }

  // Checks that tensor `name` has exactly `shape`.
  Status CheckShape(const TensorInfo* t, const std::vector<int64_t>& shape,
                    const std::string& meaning) const {
    if (t->shape != shape) {
      return FormatError(where_ + "tensor '" + t->name + "': expected shape " +
                         ShapeToString(shape) + " " + meaning + ", got " + ShapeToString(t->shape));
    }
    return Status::Ok();
  }

  Status Read(const TensorInfo* t, std::vector<float>* out) const {
    return file_.GetF32(t->name, out);
  }

  const std::string& prefix() const { return prefix_; }
  const std::string& where() const { return where_; }

 private:
  const SafeTensorsFile& file_;
  const std::string& prefix_;
  std::string where_;
};

}  // namespace

Status LoadMhaWeights(const SafeTensorsFile& file, const std::string& prefix, MhaWeights* out) {
  if (out == nullptr) return InvalidArgument("LoadMhaWeights: out is null");
  Loader loader(file, prefix);
  const std::string& p = loader.prefix();

  const TensorInfo* w_out = loader.Find("out_proj.weight");
  if (w_out == nullptr) return loader.Missing("'" + p + "out_proj.weight' [E, E]");
  if (w_out->rank() != 2 || w_out->shape[0] != w_out->shape[1] || w_out->shape[0] == 0) {
    return FormatError(loader.where() + "tensor '" + w_out->name +
                       "': expected shape [E, E] with E > 0, got " + ShapeToString(w_out->shape));
  }
  const int64_t E = w_out->shape[0];

  MhaWeights w;
  w.embed_dim = E;
  Status s = loader.Read(w_out, &w.w_out);
  if (!s.ok()) return s;

  const TensorInfo* packed = loader.Find("in_proj_weight");
  const TensorInfo* sep[3] = {loader.Find("q_proj_weight"), loader.Find("k_proj_weight"),
                              loader.Find("v_proj_weight")};
  const char* sep_names[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
  const bool any_sep = sep[0] || sep[1] || sep[2];
  if (packed != nullptr && any_sep) {
    return FormatError(loader.where() + "both '" + p + "in_proj_weight' and separate '" + p +
                       "{q,k,v}_proj_weight' are present, expected exactly one layout");
  }
  if (packed == nullptr && !any_sep) {
    return loader.Missing("'" + p + "in_proj_weight' [3E, E] (or '" + p + "q_proj_weight', '" + p +
                          "k_proj_weight', '" + p + "v_proj_weight')");
  }
  if (packed != nullptr) {
    // PyTorch's packed weight is [3E, E]; mha also accepts [3E, D] for inputs of D features
    // (a fused Linear(D, 3E), as in the per-head QKV layout), so only the rows are fixed.
    if (packed->rank() != 2 || packed->shape[0] != 3 * E || packed->shape[1] == 0) {
      return FormatError(loader.where() + "tensor '" + packed->name + "': expected shape [" +
                         std::to_string(3 * E) + ", D] (3E rows with E = " + std::to_string(E) +
                         ", D > 0 input features), got " + ShapeToString(packed->shape));
    }
    s = loader.Read(packed, &w.in_proj_weight);
    if (!s.ok()) return s;
    w.packed_in_proj = true;
    const int64_t D = packed->shape[1];
    w.q_dim = w.kdim = w.vdim = D;
    const size_t block = static_cast<size_t>(E) * static_cast<size_t>(D);
    const float* src = w.in_proj_weight.data();
    w.w_q.assign(src, src + block);
    w.w_k.assign(src + block, src + 2 * block);
    w.w_v.assign(src + 2 * block, src + 3 * block);
  } else {
    int64_t* dims[3] = {&w.q_dim, &w.kdim, &w.vdim};
    std::vector<float>* dst[3] = {&w.w_q, &w.w_k, &w.w_v};
    const char* dim_names[3] = {"q_dim", "kdim", "vdim"};
    for (int i = 0; i < 3; ++i) {
      const TensorInfo* t = sep[i];
      if (t == nullptr) {
        return loader.Missing("'" + p + sep_names[i] + "' [E, " + dim_names[i] +
                              "] (the other separate projection weights are present)");
      }
      if (t->rank() != 2 || t->shape[0] != E || t->shape[1] == 0) {
        return FormatError(loader.where() + "tensor '" + t->name + "': expected shape [" +
                           std::to_string(E) + ", " + dim_names[i] +
                           "] with E = " + std::to_string(E) + " and " + dim_names[i] +
                           " > 0, got " + ShapeToString(t->shape));
      }
      *dims[i] = t->shape[1];
      s = loader.Read(t, dst[i]);
      if (!s.ok()) return s;
    }
  }

  const TensorInfo* in_bias = loader.Find("in_proj_bias");
  const TensorInfo* out_bias = loader.Find("out_proj.bias");
  if ((in_bias == nullptr) != (out_bias == nullptr)) {
    return FormatError(loader.where() + "'" + p + "in_proj_bias' is " +
                       (in_bias ? "present" : "absent") + " but '" + p + "out_proj.bias' is " +
                       (out_bias ? "present" : "absent") +
                       ", expected both or neither (PyTorch's bias= sets both)");
  }
  if (in_bias != nullptr) {
    s = loader.CheckShape(in_bias, {3 * E}, "[3E] with E = " + std::to_string(E));
    if (!s.ok()) return s;
    s = loader.CheckShape(out_bias, {E}, "[E]");
    if (!s.ok()) return s;
    std::vector<float> b;
    s = loader.Read(in_bias, &b);
    if (!s.ok()) return s;
    s = loader.Read(out_bias, &w.b_out);
    if (!s.ok()) return s;
    const size_t e = static_cast<size_t>(E);
    w.b_q.assign(b.begin(), b.begin() + e);
    w.b_k.assign(b.begin() + e, b.begin() + 2 * e);
    w.b_v.assign(b.begin() + 2 * e, b.end());
    w.bias = true;
    if (w.packed_in_proj) w.in_proj_bias = std::move(b);
  }

  const TensorInfo* bk = loader.Find("bias_k");
  const TensorInfo* bv = loader.Find("bias_v");
  if ((bk == nullptr) != (bv == nullptr)) {
    return FormatError(loader.where() + "'" + p + "bias_k' is " + (bk ? "present" : "absent") +
                       " but '" + p + "bias_v' is " + (bv ? "present" : "absent") +
                       ", expected both or neither (add_bias_kv)");
  }
  if (bk != nullptr) {
    s = loader.CheckShape(bk, {1, 1, E}, "[1, 1, E]");
    if (!s.ok()) return s;
    s = loader.CheckShape(bv, {1, 1, E}, "[1, 1, E]");
    if (!s.ok()) return s;
    s = loader.Read(bk, &w.bias_k);
    if (!s.ok()) return s;
    s = loader.Read(bv, &w.bias_v);
    if (!s.ok()) return s;
    w.add_bias_kv = true;
  }

  *out = std::move(w);
  return Status::Ok();
}

}  // namespace mha
