// Hugging Face checkpoints, end to end: every case of tests/data/hf (tiny random models written by
// transformers' save_pretrained, with their attention modules' outputs; tools/gen_hf_fixtures.py,
// tests/data/hf/README.md) loaded with MultiheadAttention::CreateFromHuggingFace from the
// unchanged folder, run forward and token by token through a KV cache, on every SIMD target,
// against transformers' own outputs within 1e-4 + 1e-4 |x|.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "runtime/safetensors.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

constexpr double kAtol = 1e-4;
constexpr double kRtol = 1e-4;

std::string HfDataDir() {
  const char* dir = std::getenv("MHA_TEST_DATA");
  return std::string(dir ? dir : "tests/data") + "/hf";
}

std::vector<std::string> Cases() {
  std::vector<std::string> cases;
  DIR* d = opendir(HfDataDir().c_str());
  if (d == nullptr) return cases;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name[0] != '.' && name != "README.md") cases.push_back(name);
  }
  closedir(d);
  std::sort(cases.begin(), cases.end());
  return cases;
}

struct Module {
  std::string name, prefix;
  int64_t layer = 0;
  bool causal = false, cross = false;
};

struct Case {
  std::string dir;
  std::vector<Module> modules;
  SafeTensorsFile inputs, expected;
  std::vector<float> query, key;
  std::vector<int64_t> query_shape, key_shape, positions;
  std::vector<uint8_t> key_padding_mask;
};

void LoadCase(const std::string& name, Case* c) {
  c->dir = HfDataDir() + "/" + name;
  std::ifstream f(c->dir + "/case.json");
  ASSERT_TRUE(f.good()) << c->dir;
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& m : j.at("modules")) {
    Module mod;
    mod.name = m.at("name").get<std::string>();
    mod.layer = m.at("layer").get<int64_t>();
    if (!m.at("prefix").is_null()) mod.prefix = m.at("prefix").get<std::string>();
    mod.causal = m.at("causal").get<bool>();
    mod.cross = m.at("cross").get<bool>();
    c->modules.push_back(mod);
  }
  ASSERT_TRUE(SafeTensorsFile::Open(c->dir + "/inputs.safetensors", &c->inputs).ok());
  ASSERT_TRUE(SafeTensorsFile::Open(c->dir + "/expected.safetensors", &c->expected).ok());
  ASSERT_TRUE(c->inputs.GetF32("query", &c->query).ok());
  c->query_shape = c->inputs.Find("query")->shape;
  if (c->inputs.Find("key") != nullptr) {
    ASSERT_TRUE(c->inputs.GetF32("key", &c->key).ok());
    c->key_shape = c->inputs.Find("key")->shape;
  }
  if (c->inputs.Find("positions") != nullptr) {
    ASSERT_TRUE(c->inputs.GetInt64("positions", &c->positions).ok());
  }
  if (c->inputs.Find("key_padding_mask") != nullptr) {
    ASSERT_TRUE(c->inputs.GetBool("key_padding_mask", &c->key_padding_mask).ok());
  }
}

// Max over elements of |got - want| / (atol + rtol |want|): <= 1 passes.
double WorstRatio(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double r = std::fabs(static_cast<double>(got[i]) - want[i]) /
                     (kAtol + kRtol * std::fabs(static_cast<double>(want[i])));
    worst = std::max(worst, std::isnan(r) ? 1e30 : r);
  }
  return worst;
}

Status Load(const Case& c, const Module& m, DType weight_dtype,
            std::unique_ptr<MultiheadAttention>* layer, HfLayerInfo* info,
            int64_t weight_block = 0) {
  HfOptions o;
  o.weight_dtype = weight_dtype;
  o.weight_block = weight_block;
  o.prefix = m.prefix;
  return MultiheadAttention::CreateFromHuggingFace(c.dir + "/checkpoint", m.layer, o, layer, info);
}

// The storage dtype of the checkpoint's weights (the dtype of its first tensor ending in
// ".weight" with two dims is enough for these single-dtype fixtures).
DType StoredDtype(const Case& c) {
  const std::string single = c.dir + "/checkpoint/model.safetensors";
  SafeTensorsFile f;
  if (!SafeTensorsFile::Open(single, &f).ok()) return DType::kBF16;  // the sharded case
  for (const TensorInfo& t : f.tensors()) {
    if (t.rank() == 2 && t.supported) return t.dtype;
  }
  return DType::kF32;
}

// The module's forward on the case's inputs into *got, and transformers' output into *want.
void Forward(const Case& c, const Module& m, DType weight_dtype, int64_t weight_block,
             size_t threads, std::vector<float>* got, std::vector<float>* want) {
  std::unique_ptr<MultiheadAttention> layer;
  HfLayerInfo info;
  const Status s = Load(c, m, weight_dtype, &layer, &info, weight_block);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(info.causal, m.causal);
  EXPECT_EQ(info.cross_attention, m.cross);
  EXPECT_EQ(info.hidden_size, c.query_shape[2]);
  std::unique_ptr<Context> ctx;
  ContextOptions co;
  co.num_threads = threads;
  ASSERT_TRUE(Context::Create(co, &ctx).ok());
  AttentionInputs in;
  ASSERT_TRUE(TensorView::Dense(const_cast<float*>(c.query.data()), DType::kF32, 3,
                                c.query_shape.data(), &in.query)
                  .ok());
  if (m.cross) {
    ASSERT_FALSE(c.key.empty());
    ASSERT_TRUE(TensorView::Dense(const_cast<float*>(c.key.data()), DType::kF32, 3,
                                  c.key_shape.data(), &in.key)
                    .ok());
  }
  const int64_t nl[2] = {c.query_shape[0], c.query_shape[1]};
  if (!c.positions.empty() && !m.cross) {
    ASSERT_TRUE(TensorView::Dense(const_cast<int64_t*>(c.positions.data()), DType::kI64, 2, nl,
                                  &in.positions)
                    .ok());
  }
  if (!c.key_padding_mask.empty()) {
    ASSERT_TRUE(TensorView::Dense(const_cast<uint8_t*>(c.key_padding_mask.data()), DType::kU8, 2,
                                  nl, &in.key_padding_mask)
                    .ok());
  }
  in.causal = info.causal;
  got->assign(c.query.size(), std::nanf(""));
  AttentionOutputs out;
  ASSERT_TRUE(
      TensorView::Dense(got->data(), DType::kF32, 3, c.query_shape.data(), &out.output).ok());
  const Status f = layer->Forward(*ctx, in, out);
  ASSERT_TRUE(f.ok()) << f.ToString();
  ASSERT_TRUE(c.expected.GetF32(m.name + ".attn_output", want).ok());
  ASSERT_EQ(got->size(), want->size());
}

void RunForwardCase(const Case& c, const Module& m, DType weight_dtype, size_t threads) {
  SCOPED_TRACE(c.dir + " " + m.name + " weights " + DTypeName(weight_dtype));
  std::vector<float> got, want;
  Forward(c, m, weight_dtype, 0, threads, &got, &want);
  if (!::testing::Test::HasFatalFailure()) {
    EXPECT_LE(WorstRatio(got, want), 1.0);
  }
}

// Whether entry n's positions are 0..L-1 (the KV cache's positions are token indices).
bool DefaultPositions(const Case& c, int64_t n) {
  if (c.positions.empty()) return true;
  const int64_t L = c.query_shape[1];
  for (int64_t l = 0; l < L; ++l) {
    if (c.positions[n * L + l] != l) return false;
  }
  return true;
}

// Token by token through a KV cache against transformers' own token-by-token run
// (`<module>.decode_output`). The cache places token t at position t: entries whose positions
// start elsewhere are compared too where the layer's attention depends only on p_i - p_j
// (RoPE without a length-dependent scaling, ALiBi, windows). A length-dependent scaling
// (dynamic, longrope) takes its length from the whole batch's largest position, in
// transformers as in mha, so its decode is compared only when every entry starts at 0.
// Returns whether anything was compared.
bool RunDecodeCase(const Case& c, const Module& m) {
  SCOPED_TRACE(c.dir + " " + m.name + " decode");
  std::unique_ptr<MultiheadAttention> layer;
  EXPECT_TRUE(Load(c, m, DType::kF32, &layer, nullptr).ok());
  if (layer == nullptr) return true;
  const RopeScaling scaling = layer->config().rope_scaling;
  const bool shift_invariant =
      scaling != RopeScaling::kDynamic && scaling != RopeScaling::kLongRope;
  for (int64_t n = 0; n < c.query_shape[0]; ++n) {
    if (!shift_invariant && !DefaultPositions(c, n)) return false;
  }
  const int64_t N = c.query_shape[0], L = c.query_shape[1], D = c.query_shape[2];
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Context> ctx;
  if (!KvCache::Create(KvCacheOptions::ForLayer(*layer, N, L), &cache).ok() ||
      !Context::Create(ContextOptions{}, &ctx).ok()) {
    ADD_FAILURE() << "cache or context";
    return true;
  }
  std::vector<float> got(c.query.size()), x(N * D), y(N * D);
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      std::copy_n(c.query.data() + (n * L + t) * D, D, x.data() + n * D);
    }
    const int64_t shape[3] = {N, 1, D};
    TensorView xv, yv;
    Status s = TensorView::Dense(x.data(), DType::kF32, 3, shape, &xv);
    if (s.ok()) s = TensorView::Dense(y.data(), DType::kF32, 3, shape, &yv);
    if (s.ok()) s = cache->Step(*ctx, *layer, xv, yv);
    if (!s.ok()) {
      ADD_FAILURE() << s.ToString();
      return true;
    }
    for (int64_t n = 0; n < N; ++n) {
      std::copy_n(y.data() + n * D, D, got.data() + (n * L + t) * D);
    }
  }
  std::vector<float> want;
  EXPECT_TRUE(c.expected.GetF32(m.name + ".decode_output", &want).ok());
  EXPECT_EQ(want.size(), got.size());
  if (want.size() != got.size()) return true;
  int compared = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (!shift_invariant && !DefaultPositions(c, n)) continue;
    const std::vector<float> g(got.begin() + n * L * D, got.begin() + (n + 1) * L * D);
    const std::vector<float> w(want.begin() + n * L * D, want.begin() + (n + 1) * L * D);
    EXPECT_LE(WorstRatio(g, w), 1.0) << "entry " << n;
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no entry with positions the cache can place";
  return true;
}

class HfFixturesTest : public test::PerTargetTest {};

TEST_P(HfFixturesTest, ForwardAndDecodeMatchTransformers) {
  const std::vector<std::string> cases = Cases();
  ASSERT_GE(cases.size(), 25u) << "fixtures missing under " << HfDataDir();
  int forwards = 0, decodes = 0, decodes_skipped = 0;
  for (const std::string& name : cases) {
    Case c;
    LoadCase(name, &c);
    ASSERT_FALSE(HasFatalFailure());
    const DType stored = StoredDtype(c);
    for (const Module& m : c.modules) {
      // f32 weights (16-bit checkpoints widened exactly), and the stored 16-bit dtype kept as it
      // is: the same values, so the same bound.
      RunForwardCase(c, m, DType::kF32, 1 + forwards % 2);
      if (stored != DType::kF32) RunForwardCase(c, m, stored, 2);
      ++forwards;
      if (c.expected.Find(m.name + ".decode_output") != nullptr) {
        if (RunDecodeCase(c, m)) {
          ++decodes;
        } else {
          ++decodes_skipped;
        }
      }
      if (HasFailure()) {
        ADD_FAILURE() << "case " << name << " module " << m.name << " on " << target_name();
        return;
      }
    }
  }
  EXPECT_GE(forwards, 30);
  EXPECT_GE(decodes, 20);
  EXPECT_LE(decodes_skipped, 1);  // llama_dynamic: its entries start at 3 and 0
  std::printf("[ %s ] %zu cases: %d modules forward (f32 and stored 16-bit weights), %d decoded\n",
              target_name(), cases.size(), forwards, decodes);
}

MHA_INSTANTIATE_PER_TARGET(HfFixturesTest);

// Quantized weights (HfOptions::weight_dtype i8 / i4, from the stored tensors) against
// transformers' outputs of the unquantized modules: the error is the quantization's, measured
// relative to each module's output scale (max |want|). The fixtures are tiny random models
// (hidden 32-64, in several families): i4's blocks of 32 span whole rows of most of them.
// Measured over the 37 modules (printed), median / worst: i8 0.0096 / 0.021, i4 0.16 / 0.31,
// i4-128 0.18 / 0.35; bounds about twice the worst.
TEST(HfFixturesQuantTest, ErrorAgainstTransformers) {
  const std::vector<std::string> cases = Cases();
  ASSERT_GE(cases.size(), 25u) << "fixtures missing under " << HfDataDir();
  const struct {
    DType type;
    int64_t block;
    const char* name;
    double bound;
  } quants[] = {
      {DType::kI8, 0, "i8", 0.05}, {DType::kI4, 0, "i4", 0.7}, {DType::kI4, 128, "i4-128", 0.7}};
  for (const auto& q : quants) {
    std::vector<double> errors;
    for (const std::string& name : cases) {
      Case c;
      LoadCase(name, &c);
      ASSERT_FALSE(HasFatalFailure());
      for (const Module& m : c.modules) {
        SCOPED_TRACE(c.dir + " " + m.name + " weights " + q.name);
        std::vector<float> got, want;
        Forward(c, m, q.type, q.block, 2, &got, &want);
        ASSERT_FALSE(HasFatalFailure());
        double err = 0, scale = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
          err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
        }
        errors.push_back(err / scale);
        EXPECT_LE(err, q.bound * scale);
      }
    }
    std::sort(errors.begin(), errors.end());
    std::printf(
        "[ %s ] %zu modules: error / output scale against transformers: median %.3g, "
        "worst %.3g (bound %.3g)\n",
        q.name, errors.size(), errors[errors.size() / 2], errors.back(), q.bound);
  }
  // Quantized weights are the layer's own codes: a view of the mapped checkpoint is refused.
  Case c;
  LoadCase(cases[0], &c);
  HfOptions o;
  o.weight_dtype = DType::kI8;
  o.binding = WeightBinding::kView;
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::CreateFromHuggingFace(c.dir + "/checkpoint",
                                                             c.modules[0].layer, o, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("HfOptions::binding: weight_dtype i8 quantizes the weights"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace mha
