// libFuzzer target for the safetensors reader and the nn.MultiheadAttention loader.
//
// Each input is treated as a whole .safetensors file: FromBuffer validates it, then every
// accessor runs on every tensor (so the byte ranges the validator accepted are actually read
// under ASan), then the weight loader runs with an empty prefix and with "m.". Errors are the
// expected outcome for most inputs; only crashes, leaks, UB and timeouts are findings.
// Built and run by tools/fuzz/run-fuzz (clang++ -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/safetensors.h"
#include "runtime/weights.h"

namespace {

// Touches every value so that reads of bytes outside the validated range are reported.
uint32_t Checksum(const std::vector<float>& v) {
  uint32_t h = 0;
  for (float f : v) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    h = h * 31 + b;
  }
  return h;
}

void CheckOrAbort(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mha::SafeTensorsFile file;
  mha::Status s = mha::SafeTensorsFile::FromBuffer(data, size, &file, "fuzz");
  if (!s.ok()) {
    CheckOrAbort(!s.message().empty(), "failed Status without a message");
    return 0;
  }
  volatile uint32_t sink = 0;
  for (const mha::TensorInfo& t : file.tensors()) {
    CheckOrAbort(t.data >= data && t.data + t.nbytes <= data + size, "tensor outside the buffer");
    CheckOrAbort(file.Find(t.name) == &t, "Find disagrees with tensors()");
    std::vector<float> f;
    if (file.GetF32(t.name, &f).ok()) {
      CheckOrAbort(f.size() == t.num_elements, "GetF32 element count");
      sink = sink + Checksum(f);
    }
    std::vector<uint8_t> b;
    if (file.GetBool(t.name, &b).ok()) {
      CheckOrAbort(b.size() == t.num_elements, "GetBool element count");
      for (uint8_t x : b) sink = sink + x;
    }
    std::vector<int64_t> ints;
    if (file.GetInt64(t.name, &ints).ok()) {
      CheckOrAbort(ints.size() == t.num_elements, "GetInt64 element count");
      for (int64_t x : ints) sink = sink + static_cast<uint64_t>(x);
    }
    mha::TensorView view;
    if (file.ViewF32(t.name, &view).ok()) {
      const int64_t n = view.NumElements();
      const float* p = view.As<const float>();
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, p + i, 4);
        sink = sink + bits;
      }
    }
  }
  // Both loading modes: every weight widened to f32, and bf16 weights kept 16-bit.
  for (const mha::DType keep : {mha::DType::kF32, mha::DType::kBF16}) {
    for (const char* prefix : {"", "m."}) {
      mha::MhaWeights w;
      if (mha::LoadMhaWeights(file, prefix, &w, keep).ok()) {
        const size_t e = static_cast<size_t>(w.embed_dim);
        const size_t r = static_cast<size_t>(w.kv_rows);
        CheckOrAbort(w.w_out.size() == e * e, "w_out size");
        CheckOrAbort(w.w_q.size() == e * static_cast<size_t>(w.q_dim), "w_q size");
        CheckOrAbort(w.w_k.size() == r * static_cast<size_t>(w.kdim), "w_k size");
        CheckOrAbort(w.w_v.size() == r * static_cast<size_t>(w.vdim), "w_v size");
        CheckOrAbort(
            w.bias ? w.b_q.size() == e && w.b_k.size() == r && w.b_out.size() == e : w.b_q.empty(),
            "bias");
        CheckOrAbort(
            w.add_bias_kv ? w.bias_k.size() == r && w.bias_v.size() == r : w.bias_k.empty(),
            "bias_kv");
        for (const mha::WeightTensor* t : {&w.w_q, &w.w_out}) {
          CheckOrAbort(t->dtype == mha::DType::kF32 || t->dtype == keep, "weight dtype");
          sink = sink + (t->dtype == mha::DType::kF32 ? Checksum(t->f32) : t->bits.size());
        }
        // The variant tensors for a few head counts (those dividing E and not): sizes as the
        // loader promises, pointers into its vectors.
        for (const int64_t heads : {int64_t{1}, int64_t{2}, int64_t{3}}) {
          mha::AttentionConfig c;
          c.embed_dim = w.embed_dim;
          c.num_heads = heads;
          c.num_kv_heads = w.embed_dim % heads == 0 && w.kv_rows % (w.embed_dim / heads) == 0
                               ? w.kv_rows / (w.embed_dim / heads)
                               : 0;
          mha::LoadOptions o;
          o.num_heads = heads;
          o.qk_norm_add_one = heads == 2;
          mha::VariantTensors vt;
          mha::AttentionWeights aw;
          if (!mha::LoadVariants(file, prefix, o, &vt, &c, &aw).ok()) continue;
          const size_t h = static_cast<size_t>(heads);
          CheckOrAbort(vt.sinks.empty() || vt.sinks.size() == h, "sinks size");
          CheckOrAbort(vt.alibi_slopes.empty() || vt.alibi_slopes.size() == h, "slopes size");
          CheckOrAbort(vt.q_norm.empty() == vt.k_norm.empty(), "norm weights both or neither");
          CheckOrAbort(c.alibi == !vt.alibi_slopes.empty(), "alibi from the slopes");
          CheckOrAbort((aw.sinks != nullptr) == !vt.sinks.empty(), "sinks pointer");
          sink = sink + Checksum(vt.sinks) + Checksum(vt.q_norm) + Checksum(vt.k_norm);
        }
      }
    }
  }
  (void)sink;
  return 0;
}
