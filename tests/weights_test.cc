// nn.MultiheadAttention weight loading: files are written from C++ with SafeTensorsWriter in
// PyTorch's state_dict layout (no torch needed), then loaded and compared value by value.
#include "runtime/weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/safetensors.h"

namespace mha {
namespace {

// Distinct, exactly representable (also in bf16/f16) values: tag + i / 8 for small i.
std::vector<float> Values(int64_t n, float tag) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = tag + static_cast<float>(i % 64) / 8;
  return v;
}

int64_t Count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Collects named f32 tensors, optionally stores them as F16/BF16, and parses the result.
class ModelBuilder {
 public:
  explicit ModelBuilder(DType storage = DType::kF32) : storage_(storage) {}

  // Adds tensor `name` with the given shape, filled by Values(); returns the f32 values.
  std::vector<float> Add(const std::string& name, const std::vector<int64_t>& shape) {
    std::vector<float> v = Values(Count(shape), static_cast<float>(tag_++));
    Status s;
    if (storage_ == DType::kF32) {
      s = writer_.Add(name, DType::kF32, shape, v.data());
    } else {
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        bits[i] = storage_ == DType::kBF16 ? ToBF16(v[i]) : ToF16(v[i]);
      s = writer_.Add(name, storage_, shape, bits.data());
    }
    EXPECT_TRUE(s.ok()) << s.ToString();
    return v;
  }

  void AddRaw(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
              size_t element_size) {
    std::vector<uint8_t> bytes(static_cast<size_t>(Count(shape)) * element_size, 0);
    EXPECT_TRUE(writer_.AddRaw(name, dtype, shape, bytes.data(), bytes.size()).ok());
  }

  const SafeTensorsFile& Build() {
    Status s = writer_.Serialize(&bytes_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = SafeTensorsFile::FromBuffer(bytes_.data(), bytes_.size(), &file_, "model.safetensors");
    EXPECT_TRUE(s.ok()) << s.ToString();
    return file_;
  }

  SafeTensorsWriter& writer() { return writer_; }

 private:
  // Exact for the values Values() produces (few mantissa bits).
  static uint16_t ToBF16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return static_cast<uint16_t>(b >> 16);
  }
  static uint16_t ToF16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000u;
    const int32_t exp = static_cast<int32_t>((b >> 23) & 0xFF) - 127 + 15;
    if ((b & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
    return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | ((b >> 13) & 0x3FFu));
  }

  DType storage_;
  int tag_ = 1;
  SafeTensorsWriter writer_;
  std::vector<uint8_t> bytes_;
  SafeTensorsFile file_;
};

// A model written to a temporary file, removed when this goes out of scope.
struct TempModelFile {
  TempModelFile(ModelBuilder& m, const std::string& tag)
      : path("/tmp/mha_weights_" + std::to_string(getpid()) + "_" + tag + ".safetensors") {
    EXPECT_TRUE(m.writer().WriteFile(path).ok()) << path;
  }
  ~TempModelFile() { std::remove(path.c_str()); }
  const std::string path;
};

// Loading options of the layer tests: batch-first inputs, `heads` heads.
LoadOptions BatchFirst(int64_t heads) {
  LoadOptions o;
  o.num_heads = heads;
  o.batch_first = true;
  return o;
}

std::vector<float> Slice(const std::vector<float>& v, size_t begin, size_t count) {
  return std::vector<float>(v.begin() + static_cast<long>(begin),
                            v.begin() + static_cast<long>(begin + count));
}

Status Load(const SafeTensorsFile& f, const std::string& prefix, MhaWeights* w) {
  return LoadMhaWeights(f, prefix, w);
}

TEST(WeightsTest, PackedInProjWithBias) {
  const int64_t E = 8;
  ModelBuilder m;
  const auto in_w = m.Add("in_proj_weight", {3 * E, E});
  const auto in_b = m.Add("in_proj_bias", {3 * E});
  const auto out_w = m.Add("out_proj.weight", {E, E});
  const auto out_b = m.Add("out_proj.bias", {E});
  MhaWeights w;
  Status s = Load(m.Build(), "", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(w.embed_dim, E);
  EXPECT_EQ(w.q_dim, E);
  EXPECT_EQ(w.kdim, E);
  EXPECT_EQ(w.vdim, E);
  EXPECT_TRUE(w.bias);
  EXPECT_FALSE(w.add_bias_kv);
  EXPECT_TRUE(w.packed_in_proj);
  const size_t b = static_cast<size_t>(E * E);
  EXPECT_EQ(w.w_q.f32, Slice(in_w, 0, b));  // rows [0, E)
  EXPECT_EQ(w.w_k.f32, Slice(in_w, b, b));  // rows [E, 2E)
  EXPECT_EQ(w.w_v.f32, Slice(in_w, 2 * b, b));
  EXPECT_EQ(w.b_q, Slice(in_b, 0, 8));
  EXPECT_EQ(w.b_k, Slice(in_b, 8, 8));
  EXPECT_EQ(w.b_v, Slice(in_b, 16, 8));
  EXPECT_EQ(w.w_out.f32, out_w);
  EXPECT_EQ(w.b_out, out_b);
  EXPECT_EQ(w.in_proj_weight.f32, in_w);
  EXPECT_EQ(w.in_proj_bias, in_b);
  EXPECT_TRUE(w.bias_k.empty());
  EXPECT_TRUE(w.bias_v.empty());
}

// A fused Linear(D, 3E) with D != E (mha's extension): q_dim = kdim = vdim = D.
TEST(WeightsTest, PackedInProjWithOtherInputDim) {
  const int64_t E = 4, D = 6;
  ModelBuilder m;
  const auto in_w = m.Add("in_proj_weight", {3 * E, D});
  m.Add("out_proj.weight", {E, E});
  MhaWeights w;
  Status s = Load(m.Build(), "", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(w.embed_dim, E);
  EXPECT_EQ(w.q_dim, D);
  EXPECT_EQ(w.kdim, D);
  EXPECT_EQ(w.vdim, D);
  EXPECT_FALSE(w.bias);
  const size_t b = static_cast<size_t>(E * D);
  EXPECT_EQ(w.w_q.f32, Slice(in_w, 0, b));
  EXPECT_EQ(w.w_k.f32, Slice(in_w, b, b));
  EXPECT_EQ(w.w_v.f32, Slice(in_w, 2 * b, b));
}

TEST(WeightsTest, PackedWithoutBiasFromAFile) {
  const int64_t E = 4;
  ModelBuilder m;
  const auto in_w = m.Add("in_proj_weight", {3 * E, E});
  const auto out_w = m.Add("out_proj.weight", {E, E});
  const std::string path = "/tmp/mha_weights_" + std::to_string(getpid()) + "_nobias.safetensors";
  ASSERT_TRUE(m.writer().WriteFile(path).ok());
  SafeTensorsFile f;
  ASSERT_TRUE(SafeTensorsFile::Open(path, &f).ok());
  std::remove(path.c_str());
  MhaWeights w;
  Status s = Load(f, "", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(w.bias);
  EXPECT_TRUE(w.b_q.empty());
  EXPECT_TRUE(w.b_k.empty());
  EXPECT_TRUE(w.b_v.empty());
  EXPECT_TRUE(w.b_out.empty());
  EXPECT_TRUE(w.in_proj_bias.empty());
  EXPECT_EQ(w.w_v.f32, Slice(in_w, 32, 16));
  EXPECT_EQ(w.w_out.f32, out_w);
}

TEST(WeightsTest, SeparateProjectionsWithDistinctDims) {
  const int64_t E = 6, q_dim = 3, kdim = 5, vdim = 7;
  ModelBuilder m;
  const auto wq = m.Add("q_proj_weight", {E, q_dim});
  const auto wk = m.Add("k_proj_weight", {E, kdim});
  const auto wv = m.Add("v_proj_weight", {E, vdim});
  const auto in_b = m.Add("in_proj_bias", {3 * E});
  m.Add("out_proj.weight", {E, E});
  const auto out_b = m.Add("out_proj.bias", {E});
  MhaWeights w;
  Status s = Load(m.Build(), "", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(w.packed_in_proj);
  EXPECT_EQ(w.embed_dim, E);
  EXPECT_EQ(w.q_dim, q_dim);
  EXPECT_EQ(w.kdim, kdim);
  EXPECT_EQ(w.vdim, vdim);
  EXPECT_EQ(w.w_q.f32, wq);
  EXPECT_EQ(w.w_k.f32, wk);
  EXPECT_EQ(w.w_v.f32, wv);
  EXPECT_EQ(w.b_k, Slice(in_b, 6, 6));
  EXPECT_EQ(w.b_out, out_b);
  EXPECT_EQ(w.in_proj_weight.size(), 0u);
  EXPECT_TRUE(w.in_proj_bias.empty());
}

TEST(WeightsTest, AddBiasKv) {
  const int64_t E = 4;
  ModelBuilder m;
  m.Add("in_proj_weight", {3 * E, E});
  m.Add("in_proj_bias", {3 * E});
  m.Add("out_proj.weight", {E, E});
  m.Add("out_proj.bias", {E});
  const auto bk = m.Add("bias_k", {1, 1, E});
  const auto bv = m.Add("bias_v", {1, 1, E});
  MhaWeights w;
  Status s = Load(m.Build(), "", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(w.add_bias_kv);
  EXPECT_EQ(w.bias_k, bk);
  EXPECT_EQ(w.bias_v, bv);
}

TEST(WeightsTest, PrefixInsideAWholeModel) {
  const int64_t E = 4;
  ModelBuilder m;
  m.Add("embed.weight", {10, E});
  std::vector<float> layer3_in, layer3_out;
  for (int layer = 0; layer < 5; ++layer) {
    const std::string p = "encoder.layers." + std::to_string(layer) + ".";
    auto in_w = m.Add(p + "self_attn.in_proj_weight", {3 * E, E});
    m.Add(p + "self_attn.in_proj_bias", {3 * E});
    auto out_w = m.Add(p + "self_attn.out_proj.weight", {E, E});
    m.Add(p + "self_attn.out_proj.bias", {E});
    m.Add(p + "linear1.weight", {2 * E, E});
    m.Add(p + "norm1.weight", {E});
    if (layer == 3) {
      layer3_in = in_w;
      layer3_out = out_w;
    }
  }
  // Lookalike names that must not be picked up.
  m.Add("encoder.layers.3.self_attn.in_proj_weight_extra", {2});
  m.Add("encoder.layers.3.self_attn.bias_k_", {1, 1, E});
  const SafeTensorsFile& f = m.Build();
  MhaWeights w;
  Status s = Load(f, "encoder.layers.3.self_attn.", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(w.in_proj_weight.f32, layer3_in);
  EXPECT_EQ(w.w_out.f32, layer3_out);
  EXPECT_TRUE(w.bias);
  EXPECT_FALSE(w.add_bias_kv);

  s = Load(f, "", &w);
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("missing tensor 'out_proj.weight'"), std::string::npos) << s.message();
  s = Load(f, "encoder.layers.9.self_attn.", &w);
  EXPECT_NE(s.message().find("missing tensor 'encoder.layers.9.self_attn.out_proj.weight'"),
            std::string::npos)
      << s.message();
}

TEST(WeightsTest, HalfPrecisionWeightsAreWidened) {
  for (DType storage : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(storage));
    const int64_t E = 4;
    ModelBuilder m(storage);
    const auto in_w = m.Add("m.in_proj_weight", {3 * E, E});
    const auto in_b = m.Add("m.in_proj_bias", {3 * E});
    const auto out_w = m.Add("m.out_proj.weight", {E, E});
    const auto out_b = m.Add("m.out_proj.bias", {E});
    const SafeTensorsFile& f = m.Build();
    EXPECT_EQ(f.Find("m.in_proj_weight")->dtype, storage);
    MhaWeights w;
    Status s = Load(f, "m.", &w);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(w.in_proj_weight.f32, in_w);
    EXPECT_EQ(w.w_k.f32, Slice(in_w, 16, 16));
    EXPECT_EQ(w.in_proj_bias, in_b);
    EXPECT_EQ(w.w_out.f32, out_w);
    EXPECT_EQ(w.b_out, out_b);
    EXPECT_EQ(w.w_out.f32[5], 3.0f + 5.0f / 8);  // tag 3 + i/8: exact after widening
  }
}

TEST(WeightsTest, HalfPrecisionWeightsKeptWhenAsked) {
  for (DType storage : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(storage));
    const int64_t E = 4;
    ModelBuilder m(storage);
    const auto in_w = m.Add("m.in_proj_weight", {3 * E, E});
    const auto in_b = m.Add("m.in_proj_bias", {3 * E});
    const auto out_w = m.Add("m.out_proj.weight", {E, E});
    m.Add("m.out_proj.bias", {E});
    const SafeTensorsFile& f = m.Build();
    MhaWeights w;
    Status s = LoadMhaWeights(f, "m.", &w, storage);
    ASSERT_TRUE(s.ok()) << s.ToString();
    // The weights keep the file's 16-bit values (compared after exact widening); biases are f32.
    for (const auto& [t, expected] :
         {std::pair<const WeightTensor*, std::vector<float>>{&w.in_proj_weight, in_w},
          {&w.w_k, Slice(in_w, 16, 16)},
          {&w.w_out, out_w}}) {
      ASSERT_EQ(t->dtype, storage);
      EXPECT_TRUE(t->f32.empty());
      ASSERT_EQ(t->bits.size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        uint32_t bits = 0;
        float widened = 0.0f;
        if (storage == DType::kBF16) {
          bits = static_cast<uint32_t>(t->bits[i]) << 16;
          std::memcpy(&widened, &bits, 4);
        } else {
          widened = std::ldexp(1.0f + (t->bits[i] & 0x3FF) / 1024.0f,
                               static_cast<int>((t->bits[i] >> 10) & 0x1F) - 15) *
                    ((t->bits[i] & 0x8000) ? -1.0f : 1.0f);
        }
        EXPECT_EQ(widened, expected[i]) << "element " << i;
      }
    }
    EXPECT_EQ(w.in_proj_bias, in_b);
    // Asking to keep the other 16-bit type widens instead.
    const DType other = storage == DType::kBF16 ? DType::kF16 : DType::kBF16;
    s = LoadMhaWeights(f, "m.", &w, other);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(w.w_out.dtype, DType::kF32);
    EXPECT_EQ(w.w_out.f32, out_w);
  }
}

TEST(WeightsTest, GroupedQueryProjections) {
  // E = 8, k/v with R = 4 rows (e.g. 4 heads of head_dim 2 sharing 2 kv heads).
  const int64_t E = 8, R = 4;
  ModelBuilder m;
  const auto wq = m.Add("q_proj_weight", {E, E});
  const auto wk = m.Add("k_proj_weight", {R, E});
  const auto wv = m.Add("v_proj_weight", {R, E});
  const auto b = m.Add("in_proj_bias", {E + 2 * R});
  m.Add("out_proj.weight", {E, E});
  m.Add("out_proj.bias", {E});
  const auto bk = m.Add("bias_k", {1, 1, R});
  m.Add("bias_v", {1, 1, R});
  MhaWeights w;
  Status s = Load(m.Build(), "", &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(w.kv_rows, R);
  EXPECT_EQ(w.w_q.f32, wq);
  EXPECT_EQ(w.w_k.f32, wk);
  EXPECT_EQ(w.w_v.f32, wv);
  EXPECT_EQ(w.b_q, Slice(b, 0, E));
  EXPECT_EQ(w.b_k, Slice(b, E, R));
  EXPECT_EQ(w.b_v, Slice(b, E + R, R));
  EXPECT_EQ(w.bias_k, bk);
}

struct ErrorCase {
  const char* what;
  void (*build)(ModelBuilder&);
  StatusCode code;
  const char* expected;
};

TEST(WeightsTest, RejectsInconsistentWeights) {
  constexpr int64_t E = 4;
  const ErrorCase cases[] = {
      {"missing out_proj.weight",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
       },
       StatusCode::kFormatError, "missing tensor 'p.out_proj.weight' [E, E]"},
      {"out_proj not square",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.out_proj.weight", {E, E + 1});
       },
       StatusCode::kFormatError,
       "'p.out_proj.weight': expected shape [E, E] with E > 0, got [4, 5]"},
      {"no projections",
       [](ModelBuilder& m) {
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError, "missing tensor 'p.in_proj_weight' [3E, E] (or 'p.q_proj_weight'"},
      {"in_proj wrong shape",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E + 1, E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError,
       "tensor 'p.in_proj_weight': expected shape [12, D] (3E rows with E = 4, D > 0 input "
       "features), got [13, 4]"},
      {"in_proj rank 1",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E * E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError,
       "expected shape [12, D] (3E rows with E = 4, D > 0 input features), got [48]"},
      {"both packed and separate",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.k_proj_weight", {E, E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError,
       "both 'p.in_proj_weight' and separate 'p.{q,k,v}_proj_weight' are present"},
      {"partial separate",
       [](ModelBuilder& m) {
         m.Add("p.q_proj_weight", {E, E});
         m.Add("p.k_proj_weight", {E, E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError, "missing tensor 'p.v_proj_weight' [R, vdim]"},
      {"q_proj wrong rows",
       [](ModelBuilder& m) {
         m.Add("p.q_proj_weight", {E + 1, E});
         m.Add("p.k_proj_weight", {E, 3});
         m.Add("p.v_proj_weight", {E, E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError,
       "tensor 'p.q_proj_weight': expected shape [4, q_dim] with E = 4 and q_dim > 0, got [5, 4]"},
      {"v_proj rows differ from k_proj",
       [](ModelBuilder& m) {
         m.Add("p.q_proj_weight", {E, E});
         m.Add("p.k_proj_weight", {E + 1, 3});
         m.Add("p.v_proj_weight", {E, E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError,
       "tensor 'p.v_proj_weight': expected shape [5, vdim] (as many rows as k_proj_weight) and "
       "vdim > 0, got [4, 4]"},
      {"grouped-query in_proj_bias wrong size",
       [](ModelBuilder& m) {
         m.Add("p.q_proj_weight", {E, E});
         m.Add("p.k_proj_weight", {2, E});
         m.Add("p.v_proj_weight", {2, E});
         m.Add("p.in_proj_bias", {3 * E});
         m.Add("p.out_proj.weight", {E, E});
         m.Add("p.out_proj.bias", {E});
       },
       StatusCode::kFormatError,
       "tensor 'p.in_proj_bias': expected shape [8] [E + 2R] with E = 4, R = 2 (rows of "
       "k_proj_weight), got [12]"},
      {"bias_k without bias_v",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.out_proj.weight", {E, E});
         m.Add("p.bias_k", {1, 1, E});
       },
       StatusCode::kFormatError,
       "'p.bias_k' is present but 'p.bias_v' is absent, expected both or neither"},
      {"bias_v wrong shape",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.out_proj.weight", {E, E});
         m.Add("p.bias_k", {1, 1, E});
         m.Add("p.bias_v", {E});
       },
       StatusCode::kFormatError, "tensor 'p.bias_v': expected shape [1, 1, 4] [1, 1, E], got [4]"},
      {"in_proj_bias without out_proj.bias",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.in_proj_bias", {3 * E});
         m.Add("p.out_proj.weight", {E, E});
       },
       StatusCode::kFormatError,
       "'p.in_proj_bias' is present but 'p.out_proj.bias' is absent, expected both or neither"},
      {"in_proj_bias wrong size",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.in_proj_bias", {2 * E});
         m.Add("p.out_proj.weight", {E, E});
         m.Add("p.out_proj.bias", {E});
       },
       StatusCode::kFormatError,
       "tensor 'p.in_proj_bias': expected shape [12] [3E] with E = 4, got [8]"},
      {"out_proj.bias wrong size",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.Add("p.in_proj_bias", {3 * E});
         m.Add("p.out_proj.weight", {E, E});
         m.Add("p.out_proj.bias", {E, 1});
       },
       StatusCode::kFormatError, "tensor 'p.out_proj.bias': expected shape [4] [E], got [4, 1]"},
      {"integer weights",
       [](ModelBuilder& m) {
         m.Add("p.in_proj_weight", {3 * E, E});
         m.AddRaw("p.out_proj.weight", "I64", {E, E}, 8);
       },
       StatusCode::kUnsupported, "tensor 'p.out_proj.weight' has dtype I64"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.what);
    ModelBuilder m;
    c.build(m);
    MhaWeights w;
    w.embed_dim = -7;  // untouched on failure
    Status s = Load(m.Build(), "p.", &w);
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
    EXPECT_EQ(w.embed_dim, -7);
  }
}

// Runs `layer` on a fixed batch-first input [2, 3, E]; returns the output.
std::vector<float> RunLayer(const MultiheadAttention& layer, int64_t E) {
  std::vector<float> x(2 * 3 * E), y(2 * 3 * E, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  const int64_t shape[3] = {2, 3, E};
  AttentionInputs in;
  AttentionOutputs out;
  EXPECT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, shape, &in.query).ok());
  EXPECT_TRUE(TensorView::Dense(y.data(), DType::kF32, 3, shape, &out.output).ok());
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  const Status s = layer.Forward(*ctx, in, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return y;
}

// The C++ loading entry point: a layer created from a file under a prefix runs, and its errors
// name the file and the prefix.
TEST(WeightsTest, CreateLayerFromSafeTensors) {
  const int64_t E = 8;
  ModelBuilder m;
  m.Add("enc.attn.in_proj_weight", {3 * E, E});
  m.Add("enc.attn.in_proj_bias", {3 * E});
  m.Add("enc.attn.out_proj.weight", {E, E});
  m.Add("enc.attn.out_proj.bias", {E});
  const TempModelFile file(m, "layer");
  const std::string& path = file.path;
  LoadOptions options = BatchFirst(2);
  std::unique_ptr<MultiheadAttention> layer;
  Status s = MultiheadAttention::CreateFromSafeTensors(path, "enc.attn.", options, &layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(layer->config().embed_dim, E);
  EXPECT_EQ(layer->head_dim(), 4);
  EXPECT_TRUE(layer->config().batch_first);

  for (float v : RunLayer(*layer, E)) ASSERT_TRUE(std::isfinite(v));

  options.num_heads = 3;  // does not divide E = 8
  s = MultiheadAttention::CreateFromSafeTensors(path, "enc.attn.", options, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("embed_dim: expected a multiple of num_heads (3), got 8"),
            std::string::npos)
      << s.message();
  options.num_heads = 2;
  s = MultiheadAttention::CreateFromSafeTensors(path, "dec.attn.", options, &layer);
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("dec.attn.out_proj.weight"), std::string::npos) << s.message();
  s = MultiheadAttention::CreateFromSafeTensors("/nonexistent/w.safetensors", "", options, &layer);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  options.weight_dtype = DType::kBool;
  s = MultiheadAttention::CreateFromSafeTensors(path, "enc.attn.", options, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.weight_dtype: expected F32, BF16, F16, I8 or I4, got bool"),
            std::string::npos)
      << s.message();
}

// A bf16/f16 file loaded as a 16-bit layer computes bitwise what the same file loaded as an f32
// layer without prepacked weights computes (the 16-bit values widen exactly, and the products
// widen them exactly); the prepacked f32 layer agrees to rounding.
TEST(WeightsTest, CreateSixteenBitLayerFromSafeTensors) {
  const int64_t E = 8;
  for (DType storage : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(storage));
    ModelBuilder m(storage);
    m.Add("in_proj_weight", {3 * E, E});
    m.Add("in_proj_bias", {3 * E});
    m.Add("out_proj.weight", {E, E});
    m.Add("out_proj.bias", {E});
    const TempModelFile file(m, "half");
    const std::string& path = file.path;
    LoadOptions options = BatchFirst(2);
    std::unique_ptr<MultiheadAttention> f32_layer, prepacked_layer, half_layer, other_layer;
    ASSERT_TRUE(
        MultiheadAttention::CreateFromSafeTensors(path, "", options, &prepacked_layer).ok());
    EXPECT_EQ(prepacked_layer->config().prepack, WeightPrepack::kOn);
    options.prepack = WeightPrepack::kOff;
    ASSERT_TRUE(MultiheadAttention::CreateFromSafeTensors(path, "", options, &f32_layer).ok());
    EXPECT_EQ(f32_layer->config().prepack, WeightPrepack::kOff);
    options.prepack = WeightPrepack::kOn;  // ignored for 16-bit storage
    options.weight_dtype = storage;
    Status s = MultiheadAttention::CreateFromSafeTensors(path, "", options, &half_layer);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(half_layer->config().weight_dtype, storage);
    // The other 16-bit type: converted (these test values are exact in both types).
    options.weight_dtype = storage == DType::kBF16 ? DType::kF16 : DType::kBF16;
    s = MultiheadAttention::CreateFromSafeTensors(path, "", options, &other_layer);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<float> ref = RunLayer(*f32_layer, E);
    EXPECT_EQ(RunLayer(*half_layer, E), ref);
    EXPECT_EQ(RunLayer(*other_layer, E), ref);
    const std::vector<float> prepacked = RunLayer(*prepacked_layer, E);
    ASSERT_EQ(prepacked.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(prepacked[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-6) << "element " << i;
    }
  }
}

TEST(WeightsTest, CreateGroupedQueryLayerFromSafeTensors) {
  const int64_t E = 8, R = 4;  // 4 heads of head_dim 2, 2 kv heads
  ModelBuilder m;
  m.Add("q_proj_weight", {E, E});
  m.Add("k_proj_weight", {R, E});
  m.Add("v_proj_weight", {R, E});
  m.Add("in_proj_bias", {E + 2 * R});
  m.Add("out_proj.weight", {E, E});
  m.Add("out_proj.bias", {E});
  const TempModelFile file(m, "gqa");
  const std::string& path = file.path;
  LoadOptions options = BatchFirst(4);
  std::unique_ptr<MultiheadAttention> layer;
  Status s = MultiheadAttention::CreateFromSafeTensors(path, "", options, &layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(layer->config().num_kv_heads, 2);
  for (float v : RunLayer(*layer, E)) ASSERT_TRUE(std::isfinite(v));
  options.num_kv_heads = 2;  // stated and consistent
  EXPECT_TRUE(MultiheadAttention::CreateFromSafeTensors(path, "", options, &layer).ok());
  options.num_kv_heads = 4;
  s = MultiheadAttention::CreateFromSafeTensors(path, "", options, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.num_kv_heads: expected 2 (k_proj_weight has 4 rows) or 0, "
                             "got 4"),
            std::string::npos)
      << s.message();
  options.num_kv_heads = 0;
  options.num_heads = 8;  // head_dim 1: 4 kv heads, fine; 3 heads do not divide E
  EXPECT_TRUE(MultiheadAttention::CreateFromSafeTensors(path, "", options, &layer).ok());
  EXPECT_EQ(layer->config().num_kv_heads, 4);
  options.num_heads = 1;  // head_dim 8: 4 rows are not a whole head
  s = MultiheadAttention::CreateFromSafeTensors(path, "", options, &layer);
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("'k_proj_weight': expected a multiple of head_dim (embed_dim 8 / "
                             "num_heads 1) rows, got 4"),
            std::string::npos)
      << s.message();
}

// The base tensors of a grouped-query layer (E 8, H 4, hd 2, KVH 2) under `prefix`.
void AddGroupedQueryLayer(ModelBuilder* m, const std::string& prefix) {
  const int64_t E = 8, R = 4;
  m->Add(prefix + "q_proj_weight", {E, E});
  m->Add(prefix + "k_proj_weight", {R, E});
  m->Add(prefix + "v_proj_weight", {R, E});
  m->Add(prefix + "out_proj.weight", {E, E});
}

AttentionConfig GroupedQueryConfig() {
  AttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  return c;
}

// LoadVariants for the grouped-query layer, with the options `o` (num_heads 4 preset).
struct VariantLoad {
  LoadOptions o;
  AttentionConfig c = GroupedQueryConfig();
  AttentionWeights w;
  VariantTensors t;

  VariantLoad() { o.num_heads = 4; }
  Status Load(const SafeTensorsFile& f, const std::string& prefix) {
    return LoadVariants(f, prefix, o, &t, &c, &w);
  }
};

TEST(WeightsTest, VariantTensorsPerHeadAndOptions) {
  for (DType storage : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(storage));
    ModelBuilder m(storage);
    const std::string p = "model.layers.0.self_attn.";
    AddGroupedQueryLayer(&m, p);
    const std::vector<float> sinks = m.Add(p + "sinks", {4});
    const std::vector<float> slopes = m.Add(p + "alibi_slopes", {4});
    const std::vector<float> qn = m.Add(p + "q_norm.weight", {2});
    const std::vector<float> kn = m.Add(p + "k_norm.weight", {2});
    const SafeTensorsFile& f = m.Build();
    VariantLoad v;
    LoadOptions& o = v.o;
    o.rope = RopeStyle::kNeox;
    o.rope_theta = 1e6f;
    o.rotary_dim = 2;
    o.rope_scale = 4.0f;
    o.window = 128;
    o.softcap = 30.0f;
    o.qk_norm_eps = 1e-5f;
    o.qk_norm_add_one = true;
    const Status s = v.Load(f, p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const AttentionConfig& c = v.c;
    const AttentionWeights& w = v.w;
    const VariantTensors& t = v.t;
    EXPECT_EQ(c.rope, RopeStyle::kNeox);
    EXPECT_EQ(c.rope_theta, 1e6f);
    EXPECT_EQ(c.rotary_dim, 2);
    EXPECT_EQ(c.rope_scale, 4.0f);
    EXPECT_TRUE(c.alibi);  // the slopes tensor turns ALiBi on
    EXPECT_EQ(c.window, 128);
    EXPECT_EQ(c.softcap, 30.0f);
    EXPECT_EQ(c.qk_norm_eps, 1e-5f);
    EXPECT_FALSE(c.qk_norm_whole);
    EXPECT_EQ(t.sinks, sinks);
    EXPECT_EQ(t.alibi_slopes, slopes);
    ASSERT_EQ(t.q_norm.size(), 2u);
    ASSERT_EQ(t.k_norm.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(t.q_norm[i], qn[i] + 1.0f);  // Gemma's (1 + w)
      EXPECT_EQ(t.k_norm[i], kn[i] + 1.0f);
    }
    EXPECT_EQ(w.sinks, t.sinks.data());
    EXPECT_EQ(w.alibi_slopes, t.alibi_slopes.data());
    EXPECT_EQ(w.q_norm_weight, t.q_norm.data());
    EXPECT_EQ(w.k_norm_weight, t.k_norm.data());
  }
}

TEST(WeightsTest, VariantTensorsAbsentLeaveTheLayerPlain) {
  ModelBuilder m;
  AddGroupedQueryLayer(&m, "");
  const SafeTensorsFile& f = m.Build();
  VariantLoad v;
  ASSERT_TRUE(v.Load(f, "").ok());
  EXPECT_EQ(v.c.rope, RopeStyle::kNone);
  EXPECT_FALSE(v.c.alibi);
  EXPECT_EQ(v.c.window, 0);
  EXPECT_EQ(v.w.sinks, nullptr);
  EXPECT_EQ(v.w.alibi_slopes, nullptr);
  EXPECT_EQ(v.w.q_norm_weight, nullptr);
  EXPECT_EQ(v.w.k_norm_weight, nullptr);
  v.o.alibi = true;  // standard slopes: ALiBi on without a tensor
  ASSERT_TRUE(v.Load(f, "").ok());
  EXPECT_TRUE(v.c.alibi);
  EXPECT_EQ(v.w.alibi_slopes, nullptr);
}

TEST(WeightsTest, VariantNormWeightsOverTheWholeProjection) {
  ModelBuilder m;
  AddGroupedQueryLayer(&m, "");
  const std::vector<float> qn = m.Add("q_norm.weight", {8});  // [E]: OLMo 2
  const std::vector<float> kn = m.Add("k_norm.weight", {4});  // [kvE]
  const SafeTensorsFile& f = m.Build();
  VariantLoad v;
  const Status s = v.Load(f, "");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(v.c.qk_norm_whole);
  EXPECT_EQ(v.t.q_norm, qn);
  EXPECT_EQ(v.t.k_norm, kn);
}

TEST(WeightsTest, RejectsBadVariantTensors) {
  struct Case {
    const char* label;
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"sinks_shape",
       {{"sinks", {3}}},
       StatusCode::kFormatError,
       "tensor 'p.sinks': expected shape [4] [H] with H = 4, got [3]"},
      {"slopes_rank",
       {{"alibi_slopes", {1, 4}}},
       StatusCode::kFormatError,
       "tensor 'p.alibi_slopes': expected shape [4] [H] with H = 4, got [1, 4]"},
      {"q_norm_alone",
       {{"q_norm.weight", {2}}},
       StatusCode::kFormatError,
       "'p.q_norm.weight' is present but 'p.k_norm.weight' is absent, expected both or neither"},
      {"k_norm_alone",
       {{"k_norm.weight", {2}}},
       StatusCode::kFormatError,
       "'p.q_norm.weight' is absent but 'p.k_norm.weight' is present"},
      {"q_norm_size",
       {{"q_norm.weight", {3}}, {"k_norm.weight", {2}}},
       StatusCode::kFormatError,
       "tensor 'p.q_norm.weight': expected shape [2] [head_dim] or [E] (head_dim = 2, E = 8, "
       "kvE = 4), got [3]"},
      {"k_norm_per_head_mismatch",
       {{"q_norm.weight", {2}}, {"k_norm.weight", {4}}},
       StatusCode::kFormatError,
       "tensor 'p.k_norm.weight': expected shape [2] [head_dim] (q_norm.weight is [head_dim])"},
      {"k_norm_whole_mismatch",
       {{"q_norm.weight", {8}}, {"k_norm.weight", {2}}},
       StatusCode::kFormatError,
       "tensor 'p.k_norm.weight': expected shape [4] [kvE] (q_norm.weight is [E])"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.label);
    ModelBuilder m;
    AddGroupedQueryLayer(&m, "p.");
    for (const auto& t : k.tensors) m.Add("p." + t.first, t.second);
    const SafeTensorsFile& f = m.Build();
    const Status s = VariantLoad().Load(f, "p.");
    EXPECT_EQ(s.code(), k.code) << s.ToString();
    EXPECT_NE(s.message().find(k.message), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
  }
  // A non-float dtype is Unsupported, naming the tensor.
  ModelBuilder m;
  AddGroupedQueryLayer(&m, "");
  m.AddRaw("sinks", "I32", {4}, 4);
  const SafeTensorsFile& f = m.Build();
  const Status s = VariantLoad().Load(f, "");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("tensor 'sinks' has dtype I32"), std::string::npos) << s.message();
}

// The loaded variants reach the layer: a layer loaded with them equals one created from the
// same arrays and settings, bitwise.
TEST(WeightsTest, CreateLayerWithVariantsFromSafeTensors) {
  const int64_t E = 8, R = 4;
  ModelBuilder m;
  AddGroupedQueryLayer(&m, "");
  const std::vector<float> sinks = m.Add("sinks", {4});
  const std::vector<float> qn = m.Add("q_norm.weight", {2});
  const std::vector<float> kn = m.Add("k_norm.weight", {2});
  const TempModelFile file(m, "variants");
  LoadOptions options = BatchFirst(4);
  options.rope = RopeStyle::kGptj;
  options.window = 2;
  std::unique_ptr<MultiheadAttention> layer;
  Status s = MultiheadAttention::CreateFromSafeTensors(file.path, "", options, &layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(layer->config().rope, RopeStyle::kGptj);
  EXPECT_EQ(layer->config().window, 2);

  // ModelBuilder's values in insertion order (tags 1..): q, k, v, out, sinks, q_norm, k_norm.
  AttentionConfig c = GroupedQueryConfig();
  c.bias = false;
  c.batch_first = true;
  c.rope = RopeStyle::kGptj;
  c.window = 2;
  const std::vector<float> wq = Values(E * E, 1), wk = Values(R * E, 2), wv = Values(R * E, 3),
                           wo = Values(E * E, 4);
  AttentionWeights w;
  w.q_proj_weight = wq.data();
  w.k_proj_weight = wk.data();
  w.v_proj_weight = wv.data();
  w.out_proj_weight = wo.data();
  w.sinks = sinks.data();
  w.q_norm_weight = qn.data();
  w.k_norm_weight = kn.data();
  std::unique_ptr<MultiheadAttention> direct;
  s = MultiheadAttention::Create(c, w, WeightBinding::kCopy, &direct);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::vector<float> a = RunLayer(*layer, E), b = RunLayer(*direct, E);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace mha
