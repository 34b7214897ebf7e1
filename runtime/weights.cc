// nn.MultiheadAttention weight loading (runtime/weights.h).
#include "runtime/weights.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/safetensors_format.h"

namespace mha {

namespace {

using safetensors::ShapeToString;

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

  // A weight matrix: its 16-bit values when it is stored in `keep` (kI8 / kI4: in either 16-bit
  // dtype), else widened to f32.
  Status ReadWeight(const TensorInfo* t, DType keep, WeightTensor* out) const {
    const bool half = t->dtype == DType::kBF16 || t->dtype == DType::kF16;
    const bool quantized = keep == DType::kI8 || keep == DType::kI4;
    if (t->supported && half && (t->dtype == keep || quantized)) {
      out->dtype = t->dtype;
      out->f32.clear();
      out->bits.resize(t->num_elements);
      if (t->num_elements != 0) {
        std::memcpy(out->bits.data(), t->data, t->num_elements * sizeof(uint16_t));
      }
      return Status::Ok();
    }
    out->dtype = DType::kF32;
    out->bits.clear();
    return Read(t, &out->f32);
  }

  const std::string& prefix() const { return prefix_; }
  const std::string& where() const { return where_; }

 private:
  const SafeTensorsFile& file_;
  const std::string& prefix_;
  std::string where_;
};

}  // namespace

WeightTensor WeightTensor::Slice(size_t begin, size_t n) const {
  WeightTensor s;
  s.dtype = dtype;
  if (dtype == DType::kF32) {
    s.f32.assign(f32.begin() + static_cast<ptrdiff_t>(begin),
                 f32.begin() + static_cast<ptrdiff_t>(begin + n));
  } else {
    s.bits.assign(bits.begin() + static_cast<ptrdiff_t>(begin),
                  bits.begin() + static_cast<ptrdiff_t>(begin + n));
  }
  return s;
}

Status LoadMhaWeights(const SafeTensorsFile& file, const std::string& prefix, MhaWeights* out,
                      DType keep) {
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
  Status s = loader.ReadWeight(w_out, keep, &w.w_out);
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
    s = loader.ReadWeight(packed, keep, &w.in_proj_weight);
    if (!s.ok()) return s;
    w.packed_in_proj = true;
    const int64_t D = packed->shape[1];
    w.q_dim = w.kdim = w.vdim = D;
    w.kv_rows = E;
    const size_t block = static_cast<size_t>(E) * static_cast<size_t>(D);
    w.w_q = w.in_proj_weight.Slice(0, block);
    w.w_k = w.in_proj_weight.Slice(block, block);
    w.w_v = w.in_proj_weight.Slice(2 * block, block);
  } else {
    int64_t* dims[3] = {&w.q_dim, &w.kdim, &w.vdim};
    WeightTensor* dst[3] = {&w.w_q, &w.w_k, &w.w_v};
    const char* dim_names[3] = {"q_dim", "kdim", "vdim"};
    for (int i = 0; i < 3; ++i) {
      const TensorInfo* t = sep[i];
      if (t == nullptr) {
        return loader.Missing("'" + p + sep_names[i] + "' [" + (i == 0 ? "E" : "R") + ", " +
                              dim_names[i] +
                              "] (the other separate projection weights are present)");
      }
      // q has E rows; k and v the same R rows (R = kvE < E for grouped-query layers), R taken
      // from k.
      const int64_t rows = i == 0 ? E : i == 1 ? (t->rank() == 2 ? t->shape[0] : 0) : w.kv_rows;
      if (t->rank() != 2 || t->shape[0] != rows || rows == 0 || t->shape[1] == 0) {
        const std::string rows_text =
            i == 0 ? std::to_string(E) + ", " + dim_names[i] + "] with E = " + std::to_string(E)
            : i == 1
                ? std::string("R, ") + dim_names[i] + "] with R > 0 (kvE)"
                : std::to_string(rows) + ", " + dim_names[i] + "] (as many rows as k_proj_weight)";
        return FormatError(loader.where() + "tensor '" + t->name + "': expected shape [" +
                           rows_text + " and " + dim_names[i] + " > 0, got " +
                           ShapeToString(t->shape));
      }
      if (i == 1) w.kv_rows = rows;
      *dims[i] = t->shape[1];
      s = loader.ReadWeight(t, keep, dst[i]);
      if (!s.ok()) return s;
    }
  }
  const int64_t R = w.kv_rows;

  const TensorInfo* in_bias = loader.Find("in_proj_bias");
  const TensorInfo* out_bias = loader.Find("out_proj.bias");
  if ((in_bias == nullptr) != (out_bias == nullptr)) {
    return FormatError(loader.where() + "'" + p + "in_proj_bias' is " +
                       (in_bias ? "present" : "absent") + " but '" + p + "out_proj.bias' is " +
                       (out_bias ? "present" : "absent") +
                       ", expected both or neither (PyTorch's bias= sets both)");
  }
  if (in_bias != nullptr) {
    s = loader.CheckShape(in_bias, {E + 2 * R},
                          R == E ? "[3E] with E = " + std::to_string(E)
                                 : "[E + 2R] with E = " + std::to_string(E) +
                                       ", R = " + std::to_string(R) + " (rows of k_proj_weight)");
    if (!s.ok()) return s;
    s = loader.CheckShape(out_bias, {E}, "[E]");
    if (!s.ok()) return s;
    std::vector<float> b;
    s = loader.Read(in_bias, &b);
    if (!s.ok()) return s;
    s = loader.Read(out_bias, &w.b_out);
    if (!s.ok()) return s;
    const ptrdiff_t e = static_cast<ptrdiff_t>(E), r = static_cast<ptrdiff_t>(R);
    w.b_q.assign(b.begin(), b.begin() + e);
    w.b_k.assign(b.begin() + e, b.begin() + e + r);
    w.b_v.assign(b.begin() + e + r, b.end());
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
    const char* kv_shape = R == E ? "[1, 1, E]" : "[1, 1, R] (R = rows of k_proj_weight)";
    s = loader.CheckShape(bk, {1, 1, R}, kv_shape);
    if (!s.ok()) return s;
    s = loader.CheckShape(bv, {1, 1, R}, kv_shape);
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

Status LoadVariants(const SafeTensorsFile& file, const std::string& prefix,
                    const LoadOptions& options, VariantTensors* tensors, AttentionConfig* config,
                    AttentionWeights* weights) {
  if (tensors == nullptr || config == nullptr || weights == nullptr) {
    return InvalidArgument("LoadVariants: tensors, config and weights must be non-null");
  }
  Loader loader(file, prefix);
  const std::string& p = loader.prefix();
  const int64_t E = config->embed_dim, H = config->num_heads;
  const int64_t KVH = config->num_kv_heads > 0 ? config->num_kv_heads : H;
  VariantTensors t;
  Status s;

  // An optional [n] tensor into *dst.
  auto read_vector = [&](const char* name, int64_t n, const std::string& meaning,
                         std::vector<float>* dst) -> Status {
    const TensorInfo* info = loader.Find(name);
    if (info == nullptr) return Status::Ok();
    Status st = loader.CheckShape(info, {n}, meaning);
    return st.ok() ? loader.Read(info, dst) : st;
  };
  const std::string heads = "[H] with H = " + std::to_string(H);
  s = read_vector("sinks", H, heads, &t.sinks);
  if (s.ok()) s = read_vector("alibi_slopes", H, heads, &t.alibi_slopes);
  if (!s.ok()) return s;

  const TensorInfo* qn = loader.Find("q_norm.weight");
  const TensorInfo* kn = loader.Find("k_norm.weight");
  if ((qn == nullptr) != (kn == nullptr)) {
    return FormatError(loader.where() + "'" + p + "q_norm.weight' is " +
                       (qn ? "present" : "absent") + " but '" + p + "k_norm.weight' is " +
                       (kn ? "present" : "absent") + ", expected both or neither (QK-norm)");
  }
  // A head count that does not divide E is reported by the layer's creation.
  if (qn != nullptr && H > 0 && E % H == 0) {
    const int64_t hd = E / H;
    t.qk_norm_whole = qn->shape == std::vector<int64_t>{E} && E != hd;
    const std::string dims = "(head_dim = " + std::to_string(hd) + ", E = " + std::to_string(E) +
                             ", kvE = " + std::to_string(KVH * hd) + ")";
    s = t.qk_norm_whole ? Status::Ok() : loader.CheckShape(qn, {hd}, "[head_dim] or [E] " + dims);
    if (s.ok()) {
      s = t.qk_norm_whole
              ? loader.CheckShape(kn, {KVH * hd}, "[kvE] (q_norm.weight is [E]) " + dims)
              : loader.CheckShape(kn, {hd}, "[head_dim] (q_norm.weight is [head_dim]) " + dims);
    }
    if (s.ok()) s = loader.Read(qn, &t.q_norm);
    if (s.ok()) s = loader.Read(kn, &t.k_norm);
    if (!s.ok()) return s;
    if (options.qk_norm_add_one) {
      for (float& v : t.q_norm) v += 1.0f;
      for (float& v : t.k_norm) v += 1.0f;
    }
  }

  config->rope = options.rope;
  config->rope_theta = options.rope_theta;
  config->rotary_dim = options.rotary_dim;
  config->rope_scale = options.rope_scale;
  config->alibi = options.alibi || !t.alibi_slopes.empty();
  config->window = options.window;
  config->softcap = options.softcap;
  config->qk_norm_eps = options.qk_norm_eps;
  config->qk_norm_whole = t.qk_norm_whole;
  *tensors = std::move(t);
  auto ptr = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
  weights->sinks = ptr(tensors->sinks);
  weights->alibi_slopes = ptr(tensors->alibi_slopes);
  weights->q_norm_weight = ptr(tensors->q_norm);
  weights->k_norm_weight = ptr(tensors->k_norm);
  return Status::Ok();
}

}  // namespace mha
