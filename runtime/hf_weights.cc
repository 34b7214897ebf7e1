// A checkpoint module's tensors -> AttentionWeights (runtime/hf_weights.h). Layouts follow the
// families' modeling files (the split each attention class does in forward) and the fused
// layouts llama.cpp's convert_hf_to_gguf.py documents (Falcon's grouped query_key_value,
// GPT-2's transposed Conv1D).
#include "runtime/hf_weights.h"

#include <cstring>
#include <utility>

#include "runtime/layer_weights.h"
#include "runtime/safetensors_format.h"

namespace mha {

namespace {

using safetensors::ShapeToString;

// A projection matrix [rows, cols] as the layer will get it, in the checkpoint's mapping or in
// a temporary of the stored dtype.
struct Matrix {
  const uint8_t* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  std::string tensor;    // the checkpoint tensor it comes from
  std::string not_view;  // why the layer cannot view it in place ("" = it can)

  size_t elements() const { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }
  size_t row_bytes() const { return static_cast<size_t>(cols) * DTypeSize(dtype); }
};

bool IsFloat(const TensorInfo& t) {
  return t.supported &&
         (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16);
}

class Reader {
 public:
  Reader(HfCheckpoint& checkpoint, const std::string& prefix, const std::string& dims,
         HfStorage* storage)
      : checkpoint_(checkpoint), prefix_(prefix), dims_(dims), storage_(storage) {}

  // Tensor prefix + rel with exactly `shape` ("[A, E]": what the dims mean) and a float dtype.
  Status Get(const std::string& rel, const std::vector<int64_t>& shape, const char* meaning,
             const TensorInfo** out) {
    const std::string name = prefix_ + rel;
    Status s = checkpoint_.Find(name, out);
    if (!s.ok()) return s;
    const TensorInfo* t = *out;
    if (t == nullptr) {
      return FormatError(checkpoint_.label() + ": missing tensor '" + name + "' " +
                         ShapeToString(shape) + " (" + meaning + "; " + dims_ + ")");
    }
    if (t->shape != shape) {
      return FormatError(checkpoint_.label() + ": tensor '" + name + "': expected shape " +
                         ShapeToString(shape) + " (" + meaning + "; " + dims_ + "), got " +
                         ShapeToString(t->shape));
    }
    if (!IsFloat(*t)) {
      return Unsupported(checkpoint_.label() + ": tensor '" + name + "' has dtype " +
                         t->dtype_name + ", expected F32, BF16 or F16");
    }
    return Status::Ok();
  }

  // A vector or small tensor widened to f32 (exact for F16 and BF16), kept in the storage.
  Status Floats(const std::string& rel, const std::vector<int64_t>& shape, const char* meaning,
                std::vector<float>* out) {
    const TensorInfo* t = nullptr;
    Status s = Get(rel, shape, meaning, &t);
    if (!s.ok()) return s;
    const size_t n = static_cast<size_t>(t->num_elements);
    out->resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (t->dtype == DType::kF32) {
        std::memcpy(&(*out)[i], t->data + 4 * i, 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, t->data + 2 * i, 2);
        (*out)[i] = t->dtype == DType::kBF16 ? BF16BitsToF32(bits) : F16BitsToF32(bits);
      }
    }
    return Status::Ok();
  }

  // Rows [r0, r0 + n) of tensor t [R, C], where they lie (copied only when misaligned).
  Matrix Rows(const TensorInfo* t, int64_t r0, int64_t n) {
    Matrix m = Of(t);
    m.data += static_cast<size_t>(r0) * m.row_bytes();
    m.rows = n;
    const size_t es = DTypeSize(m.dtype);
    if (reinterpret_cast<uintptr_t>(m.data) % es != 0) {
      std::vector<uint8_t>& copy = NewBytes(m.elements() * es);
      std::memcpy(copy.data(), m.data, copy.size());
      m.data = copy.data();
      m.not_view = "is not aligned to its element size in the file";
    }
    return m;
  }
  Matrix Whole(const TensorInfo* t) { return Rows(t, 0, t->shape[0]); }

  // Row blocks {first row, count} of t gathered in order into a temporary.
  Matrix Gather(const TensorInfo* t, const std::vector<std::pair<int64_t, int64_t>>& blocks,
                const char* why) {
    Matrix m = Of(t);
    int64_t rows = 0;
    for (const auto& b : blocks) rows += b.second;
    std::vector<uint8_t>& dst = NewBytes(static_cast<size_t>(rows) * m.row_bytes());
    uint8_t* p = dst.data();
    for (const auto& b : blocks) {
      const size_t bytes = static_cast<size_t>(b.second) * m.row_bytes();
      std::memcpy(p, m.data + static_cast<size_t>(b.first) * m.row_bytes(), bytes);
      p += bytes;
    }
    m.data = dst.data();
    m.rows = rows;
    m.not_view = why;
    return m;
  }

  // The transpose [C, R] of t [R, C] (GPT-2's Conv1D [in, out] -> nn.Linear's [out, in]).
  Matrix Transpose(const TensorInfo* t) {
    Matrix m = Of(t);
    const size_t es = DTypeSize(m.dtype), R = static_cast<size_t>(m.rows),
                 C = static_cast<size_t>(m.cols);
    std::vector<uint8_t>& dst = NewBytes(R * C * es);
    for (size_t r = 0; r < R; ++r) {
      for (size_t c = 0; c < C; ++c)
        std::memcpy(&dst[(c * R + r) * es], m.data + (r * C + c) * es, es);
    }
    m.data = dst.data();
    m.rows = static_cast<int64_t>(C);
    m.cols = static_cast<int64_t>(R);
    m.not_view = "is a Conv1D weight stored [in, out], which the layer needs transposed";
    return m;
  }

  // Rows [r0, r0 + n) of a matrix already built (a transposed temporary).
  static Matrix Slice(const Matrix& whole, int64_t r0, int64_t n) {
    Matrix m = whole;
    m.data += static_cast<size_t>(r0) * m.row_bytes();
    m.rows = n;
    return m;
  }

  std::vector<uint8_t>& NewBytes(size_t n) {
    storage_->bytes.emplace_back(n);
    return storage_->bytes.back();
  }
  const float* Keep(std::vector<float> v) {
    storage_->floats.push_back(std::move(v));
    return storage_->floats.back().data();
  }

 private:
  static Matrix Of(const TensorInfo* t) {
    Matrix m;
    m.data = t->data;
    m.dtype = t->dtype;
    m.rows = t->shape[0];
    m.cols = t->shape[1];
    m.tensor = t->name;
    return m;
  }

  HfCheckpoint& checkpoint_;
  const std::string& prefix_;
  const std::string& dims_;
  HfStorage* storage_;
};

std::string W(const char* name) { return std::string(name) + ".weight"; }
std::string B(const char* name) { return std::string(name) + ".bias"; }

// Elements [begin, begin + n) of v.
std::vector<float> Part(const std::vector<float>& v, int64_t begin, int64_t n) {
  return std::vector<float>(v.begin() + begin, v.begin() + begin + n);
}

}  // namespace

Status ReadHfWeights(HfCheckpoint& checkpoint, const std::string& prefix, const HfModuleSettings& s,
                     DType weight_dtype, WeightBinding binding, HfWeights* out) {
  if (out == nullptr || s.kind == nullptr) return InvalidArgument("ReadHfWeights: null argument");
  auto storage = std::make_shared<HfStorage>();
  const int64_t E = s.hidden_size, H = s.num_heads, hd = s.head_dim, KVH = s.num_kv_heads;
  const int64_t A = H * hd, kvE = KVH * hd;
  std::string dims = "E = hidden_size " + std::to_string(E) + ", A = " + std::to_string(H) +
                     " heads x head_dim " + std::to_string(hd);
  if (kvE != A) {
    dims += ", kvE = " + std::to_string(KVH) + " kv heads x " + std::to_string(hd);
  }
  Reader r(checkpoint, prefix, dims, storage.get());
  const HfTensorNames& n = s.kind->names;
  const uint32_t biases = s.biases;
  const bool any_qkv_bias = (biases & (kBiasQ | kBiasK | kBiasV)) != 0;

  Matrix q, k, v, o, packed;
  bool per_head = false;
  std::vector<float> bq, bk, bv, bo, b_packed;
  const TensorInfo* t = nullptr;
  Status st;
  switch (s.layout) {
    case HfLayout::kSeparate: {
      const TensorInfo *tq = nullptr, *tk = nullptr, *tv = nullptr;
      st = r.Get(W(n.q), {A, E}, "[A, E]", &tq);
      if (st.ok()) st = r.Get(W(n.k), {kvE, E}, "[kvE, E]", &tk);
      if (st.ok()) st = r.Get(W(n.v), {kvE, E}, "[kvE, E]", &tv);
      if (st.ok() && (biases & kBiasQ)) st = r.Floats(B(n.q), {A}, "[A]", &bq);
      if (st.ok() && (biases & kBiasK)) st = r.Floats(B(n.k), {kvE}, "[kvE]", &bk);
      if (st.ok() && (biases & kBiasV)) st = r.Floats(B(n.v), {kvE}, "[kvE]", &bv);
      if (!st.ok()) return st;
      q = r.Whole(tq);
      k = r.Whole(tk);
      v = r.Whole(tv);
      break;
    }
    case HfLayout::kFusedRows:
    case HfLayout::kFalconMultiQuery: {
      // q rows, then k, then v (multi-query: one k and one v head).
      st = r.Get(W(n.qkv), {A + 2 * kvE, E}, "[A + 2 kvE, E]: q, k, v rows", &t);
      if (st.ok() && any_qkv_bias) st = r.Floats(B(n.qkv), {A + 2 * kvE}, "[A + 2 kvE]", &bq);
      if (!st.ok()) return st;
      q = r.Rows(t, 0, A);
      k = r.Rows(t, A, kvE);
      v = r.Rows(t, A + kvE, kvE);
      if (any_qkv_bias) {
        bk = Part(bq, A, kvE);
        bv = Part(bq, A + kvE, kvE);
        bq.resize(static_cast<size_t>(A));
      }
      break;
    }
    case HfLayout::kFalconGrouped: {
      // [kvH, H / kvH + 2, hd]: each group's q heads, then its k head, then its v head.
      const int64_t rep = H / KVH;
      st = r.Get(W(n.qkv), {A + 2 * kvE, E},
                 "[A + 2 kvE, E]: per kv group, its q heads, one k head, one v head", &t);
      std::vector<float> all;
      if (st.ok() && any_qkv_bias) st = r.Floats(B(n.qkv), {A + 2 * kvE}, "[A + 2 kvE]", &all);
      if (!st.ok()) return st;
      std::vector<std::pair<int64_t, int64_t>> qb, kb, vb;
      for (int64_t g = 0; g < KVH; ++g) {
        const int64_t base = g * (rep + 2) * hd;
        qb.emplace_back(base, rep * hd);
        kb.emplace_back(base + rep * hd, hd);
        vb.emplace_back(base + (rep + 1) * hd, hd);
      }
      const char* why = "interleaves q, k and v rows per kv group (new_decoder_architecture)";
      q = r.Gather(t, qb, why);
      k = r.Gather(t, kb, why);
      v = r.Gather(t, vb, why);
      if (any_qkv_bias) {
        for (const auto& b : qb)
          bq.insert(bq.end(), all.begin() + b.first, all.begin() + b.first + b.second);
        for (const auto& b : kb)
          bk.insert(bk.end(), all.begin() + b.first, all.begin() + b.first + b.second);
        for (const auto& b : vb)
          bv.insert(bv.end(), all.begin() + b.first, all.begin() + b.first + b.second);
      }
      break;
    }
    case HfLayout::kPerHead: {
      // [H, 3, hd] rows: the operator's QkvLayout::kPerHead, reordered by the layer into a copy.
      if (kvE != E || A != E) return Internal("per-head fused layout with A or kvE != E");
      st = r.Get(W(n.qkv), {3 * E, E}, "[3E, E]: rows [heads, 3, head_dim]", &t);
      if (st.ok() && any_qkv_bias) st = r.Floats(B(n.qkv), {3 * E}, "[3E]", &b_packed);
      if (!st.ok()) return st;
      packed = r.Whole(t);
      packed.not_view =
          "interleaves q, k and v rows per head, which the layer reorders into a copy";
      per_head = true;
      break;
    }
    case HfLayout::kConv1D: {
      // c_attn.weight [E, 3E] = [in, out] with q | k | v columns.
      st = r.Get(W(n.qkv), {E, 3 * E}, "[E, 3E]: Conv1D [in, out], q | k | v columns", &t);
      if (st.ok() && any_qkv_bias) st = r.Floats(B(n.qkv), {3 * E}, "[3E]", &bq);
      if (!st.ok()) return st;
      const Matrix all = r.Transpose(t);
      q = Reader::Slice(all, 0, E);
      k = Reader::Slice(all, E, E);
      v = Reader::Slice(all, 2 * E, E);
      if (any_qkv_bias) {
        bk = Part(bq, E, E);
        bv = Part(bq, 2 * E, E);
        bq.resize(static_cast<size_t>(E));
      }
      break;
    }
    case HfLayout::kConv1DCross: {
      // q_attn.weight [E, E], c_attn.weight [E, 2E] (k | v columns), both [in, out].
      const TensorInfo* tkv = nullptr;
      st = r.Get(W(n.q), {E, E}, "[E, E]: Conv1D [in, out]", &t);
      if (st.ok())
        st = r.Get(W(n.kv), {E, 2 * E}, "[E, 2E]: Conv1D [in, out], k | v columns", &tkv);
      if (st.ok() && (biases & kBiasQ)) st = r.Floats(B(n.q), {E}, "[E]", &bq);
      if (st.ok() && (biases & kBiasK)) st = r.Floats(B(n.kv), {2 * E}, "[2E]", &bk);
      if (!st.ok()) return st;
      q = r.Transpose(t);
      const Matrix kv = r.Transpose(tkv);
      k = Reader::Slice(kv, 0, E);
      v = Reader::Slice(kv, E, E);
      if (biases & kBiasK) {
        bv = Part(bk, E, E);
        bk.resize(static_cast<size_t>(E));
      }
      break;
    }
    case HfLayout::kFalcon:
      return Internal("ReadHfWeights: Falcon's layout was not resolved");
  }

  // The output projection [E, A] (GPT-2: Conv1D [A, E]).
  const bool conv = s.layout == HfLayout::kConv1D || s.layout == HfLayout::kConv1DCross;
  st = conv ? r.Get(W(n.out), {A, E}, "[A, E]: Conv1D [in, out]", &t)
            : r.Get(W(n.out), {E, A}, "[E, A]", &t);
  if (st.ok() && (biases & kBiasOut)) st = r.Floats(B(n.out), {E}, "[E]", &bo);
  if (!st.ok()) return st;
  o = conv ? r.Transpose(t) : r.Whole(t);

  // One element type for the four matrices: the stored one when they agree, else the layer's.
  std::vector<Matrix*> mats =
      per_head ? std::vector<Matrix*>{&packed, &o} : std::vector<Matrix*>{&q, &k, &v, &o};
  DType dtype = mats[0]->dtype;
  for (const Matrix* m : mats) {
    if (m->dtype != dtype) dtype = weight_dtype;
  }
  if (binding == WeightBinding::kView) {
    for (const Matrix* m : mats) {
      std::string why = m->not_view;
      if (why.empty() && m->dtype != weight_dtype) {
        why = std::string("is stored as ") + DTypeName(m->dtype) +
              " and the layer's weight_dtype is " + DTypeName(weight_dtype);
      }
      if (!why.empty()) {
        return InvalidArgument(checkpoint.label() + ": binding kView: tensor '" + m->tensor + "' " +
                               why + "; use WeightBinding::kCopy");
      }
    }
  }
  for (Matrix* m : mats) {
    if (m->dtype == dtype) continue;
    std::vector<uint8_t>& dst = r.NewBytes(m->elements() * DTypeSize(dtype));
    ConvertElements(m->data, m->dtype, dst.data(), dtype, m->elements());
    m->data = dst.data();
    m->dtype = dtype;
  }

  AttentionWeights w;
  w.dtype = dtype;
  if (per_head) {
    w.in_proj_weight = packed.data;
    w.qkv_layout = QkvLayout::kPerHead;
    if (!b_packed.empty()) w.in_proj_bias = r.Keep(std::move(b_packed));
  } else {
    w.q_proj_weight = q.data;
    w.k_proj_weight = k.data;
    w.v_proj_weight = v.data;
    if (biases == kBiasAll) {
      // All four biased: PyTorch's one in_proj_bias [A + 2 kvE] with separate weights.
      std::vector<float> all = bq;
      all.insert(all.end(), bk.begin(), bk.end());
      all.insert(all.end(), bv.begin(), bv.end());
      w.in_proj_bias = r.Keep(std::move(all));
    } else {
      if (biases & kBiasQ) w.q_proj_bias = r.Keep(std::move(bq));
      if (biases & kBiasK) w.k_proj_bias = r.Keep(std::move(bk));
      if (biases & kBiasV) w.v_proj_bias = r.Keep(std::move(bv));
    }
  }
  w.out_proj_weight = o.data;
  if (biases & kBiasOut) w.out_proj_bias = r.Keep(std::move(bo));

  // Variant tensors, f32.
  if (s.qk_norm != HfQkNorm::kNone) {
    const bool whole = s.qk_norm == HfQkNorm::kWhole;
    std::vector<float> qn, kn;
    st = r.Floats(W(n.q_norm), {whole ? A : hd}, whole ? "[A]" : "[head_dim]", &qn);
    if (st.ok())
      st = r.Floats(W(n.k_norm), {whole ? kvE : hd}, whole ? "[kvE]" : "[head_dim]", &kn);
    if (!st.ok()) return st;
    if (s.qk_norm == HfQkNorm::kPerHeadPlusOne) {
      // Gemma's RMSNorm multiplies by (1 + w).
      for (float& x : qn) x += 1.0f;
      for (float& x : kn) x += 1.0f;
    }
    w.q_norm_weight = r.Keep(std::move(qn));
    w.k_norm_weight = r.Keep(std::move(kn));
  }
  if (s.sinks) {
    std::vector<float> sinks;
    st = r.Floats(n.sinks, {H}, "[heads]", &sinks);
    if (!st.ok()) return st;
    w.sinks = r.Keep(std::move(sinks));
  }
  if (!s.alibi_slopes.empty()) w.alibi_slopes = r.Keep(s.alibi_slopes);
  if (!s.rope_short_factor.empty()) {
    w.rope_short_factor = r.Keep(s.rope_short_factor);
    w.rope_long_factor = r.Keep(s.rope_long_factor);
  }

  storage->files = checkpoint.Opened();
  out->weights = w;
  out->storage = std::move(storage);
  return Status::Ok();
}

}  // namespace mha
