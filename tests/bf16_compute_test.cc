// Compute::kBF16 through the whole operator (forward, Project, the KV cache) against the double
// reference on the unrounded f32 inputs: the error is the bf16 rounding of the products' inputs,
// measured relative to the output's scale (max |output|), on every bf16 kernel this CPU runs and
// with the emulated kernel on every Highway target; random configurations with masks, causal,
// GQA, variants, need_weights, long sequences and large magnitudes; bitwise determinism across
// thread counts; f32 compute unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm_bf16.h"
#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

// A dense f32 view of `data` with `shape` (test setup: asserts the view is valid).
TensorView Dense(float* data, std::initializer_list<int64_t> shape) {
  TensorView v;
  const std::vector<int64_t> dims(shape);
  EXPECT_TRUE(
      TensorView::Dense(data, DType::kF32, static_cast<int>(dims.size()), dims.data(), &v).ok());
  return v;
}

using testing_util::MakeViews;
using testing_util::MaskChoice;
using testing_util::OutputAt;
using testing_util::Problem;
using testing_util::RunForward;
using testing_util::ScopedKeyChunking;
using testing_util::Views;
using testing_util::WeightsOf;

// The bound this suite holds bf16 compute to: max |error| / max |output| over a problem's
// outputs (and max |error| of attention weights, which lie in [0, 1]). README "bf16 compute"
// states the measured figures; 2^-9 relative per rounded operand, through two products of the
// projections, the scores' softmax and P V, stays within it with a margin.
constexpr double kBf16OutputBound = 3e-2;
constexpr double kBf16WeightsBound = 5e-3;

using testing_util::Coin;
using testing_util::Pick;

struct Errors {
  double output = 0;   // max |got - want| / max |want|
  double weights = 0;  // max |got - want| over the attention weights
};

Errors Measure(const Problem& p, const Views& v) {
  reference::Outputs ref;
  testing_util::RunReference(p, &ref);
  const int64_t E = p.config.embed_dim;
  double scale = 0, err = 0;
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t l = 0; l < p.L; ++l)
      for (int64_t e = 0; e < E; ++e) {
        const double want = ref.output[(n * p.L + l) * E + e];
        scale = std::max(scale, std::abs(want));
        err = std::max(err, std::abs(OutputAt(p, v.output, n, l, e) - want));
      }
  Errors r;
  r.output = scale > 0 ? err / scale : err;
  if (p.need_weights) {
    const std::vector<double>& w = p.average ? ref.mean_weights : ref.head_weights;
    for (size_t i = 0; i < w.size() && i < v.weights.size(); ++i) {
      r.weights = std::max(r.weights, std::abs(v.weights[i] - w[i]));
    }
  }
  return r;
}

// A random problem of moderate size (head_dim up to 80, so the products cover several bf16
// panels and partial ones) with some attention variants, computed in bf16.
Problem RandomBf16Problem(std::mt19937* rng, int64_t max_len) {
  Problem p = testing_util::RandomProblem(rng, max_len);
  AttentionConfig& c = p.config;
  // Wider heads than the generic generator's: redraw the shapes that depend on them.
  const int64_t hd = Pick(rng, 1, 80);
  c.embed_dim = c.num_heads * hd;
  // Self-attention keeps the three inputs' widths equal (all E).
  if (c.q_dim && !p.self_attention) c.q_dim = Pick(rng, 1, 70);
  if (c.kdim && !p.self_attention) c.kdim = Pick(rng, 1, 70);
  if (c.vdim && !p.self_attention) c.vdim = Pick(rng, 1, 70);
  if (p.self_attention) c.q_dim = c.kdim = c.vdim = 0;
  const bool positional_ok = !c.add_bias_kv && !c.add_zero_attn;
  if (positional_ok && Coin(rng, 0.3)) c.window = Pick(rng, 1, std::max(p.L, p.S));
  if (positional_ok && hd >= 2 && Coin(rng, 0.3)) {
    c.rope = RopeStyle::kNeox;
    c.rotary_dim = hd / 2 * 2;
  }
  if (Coin(rng, 0.2)) c.softcap = 5.0f;
  if (Coin(rng, 0.2)) {
    p.sinks.assign(c.num_heads, 0.0f);
    for (float& s : p.sinks) s = static_cast<float>(Pick(rng, -20, 20)) / 10.0f;
  }
  testing_util::FillProblem(&p, rng);
  c.compute = Compute::kBF16;
  return p;
}

void ExpectWithinBf16Bound(const Problem& p, const Views& v, Errors* worst) {
  const Errors e = Measure(p, v);
  EXPECT_LE(e.output, kBf16OutputBound) << p.Describe();
  EXPECT_LE(e.weights, kBf16WeightsBound) << p.Describe();
  worst->output = std::max(worst->output, e.output);
  worst->weights = std::max(worst->weights, e.weights);
}

// Forces a bf16 kernel for one scope.
class ScopedBf16Kernel {
 public:
  explicit ScopedBf16Kernel(kernels::Bf16Kernel k) { kernels::ForceBf16Kernel(k); }
  ~ScopedBf16Kernel() { kernels::ForceBf16Kernel(kernels::Bf16DefaultKernel()); }
};

// The emulated kernel (and the softmax, conversions, RoPE) on every Highway target.
class Bf16EmulatedTest : public test::PerTargetTest {};

TEST_P(Bf16EmulatedTest, RandomProblemsWithinBound) {
  ScopedBf16Kernel kernel(kernels::Bf16Kernel::kEmulated);
  std::mt19937 rng(2024 + static_cast<unsigned>(GetParam() % 1000));
  Errors worst;
  for (int i = 0; i < 30; ++i) {
    const Problem p = RandomBf16Problem(&rng, 40);
    Views v;
    RunForward(p, 1 + i % 3, &v);
    ExpectWithinBf16Bound(p, v, &worst);
  }
  std::printf("[ %s ] emulated: max output error %.3g of the output scale, weights %.3g\n",
              target_name(), worst.output, worst.weights);
}

MHA_INSTANTIATE_PER_TARGET(Bf16EmulatedTest);

// Each bf16 kernel of the kernels, on the default target: the native ones where the CPU runs
// them (skipped with the reason elsewhere: a skip is not a pass).
class Bf16KernelTest : public testing::TestWithParam<kernels::Bf16Kernel> {
 protected:
  void SetUp() override {
    if (!kernels::Bf16KernelAvailable(GetParam())) {
      GTEST_SKIP() << "this CPU does not run the " << kernels::Bf16KernelName(GetParam())
                   << " kernel";
    }
    kernels::ForceBf16Kernel(GetParam());
  }
  void TearDown() override { kernels::ForceBf16Kernel(kernels::Bf16DefaultKernel()); }
};

TEST_P(Bf16KernelTest, RandomProblemsWithinBound) {
  std::mt19937 rng(7);
  Errors worst;
  for (int i = 0; i < 100; ++i) {
    const Problem p = RandomBf16Problem(&rng, 70);
    Views v;
    RunForward(p, 1 + i % 3, &v);
    ExpectWithinBf16Bound(p, v, &worst);
  }
  std::printf("[ %s ] max output error %.3g of the output scale, weights %.3g\n",
              kernels::Bf16KernelName(GetParam()), worst.output, worst.weights);
}

// head_dim apart from embed_dim (A = H * hd != E: the bf16 packing of out_proj is [E, A]) and
// per-projection biases, on each kernel.
TEST_P(Bf16KernelTest, HeadWidthAndProjectionBiasesWithinBound) {
  std::mt19937 rng(2027);
  Errors worst;
  for (int i = 0; i < 40; ++i) {
    Problem p = RandomBf16Problem(&rng, 40);
    const int64_t hd = Pick(&rng, 1, 70);
    if (p.config.num_heads * hd == p.config.embed_dim) continue;
    p.config.head_dim = hd;
    if (p.config.rotary_dim > hd) p.config.rotary_dim = hd / 2 * 2;
    if (p.config.rope != RopeStyle::kNone && p.config.rotary_dim < 2) {
      p.config.rope = RopeStyle::kNone;
      p.config.rotary_dim = 0;
    }
    if (Coin(&rng)) {
      p.config.bias_projections = static_cast<uint32_t>(Pick(&rng, 1, 15));
      if (p.layout == QkvLayout::kPerHead) p.layout = QkvLayout::kPyTorch;
    }
    testing_util::FillProblem(&p, &rng);
    Views v;
    RunForward(p, 1 + i % 3, &v);
    ExpectWithinBf16Bound(p, v, &worst);
  }
}

TEST_P(Bf16KernelTest, KeyChunkedPathWithinBound) {
  ScopedKeyChunking chunking(48);
  std::mt19937 rng(8);
  Errors worst;
  for (int i = 0; i < 40; ++i) {
    Problem p = RandomBf16Problem(&rng, 120);
    p.need_weights = false;
    Views v;
    RunForward(p, 2, &v);
    ExpectWithinBf16Bound(p, v, &worst);
  }
}

// A long causal self-attention with masks: several key blocks of 512 (two full, then half of
// one), long P V sums. Its cost grows with the square of the length.
TEST_P(Bf16KernelTest, LongSequenceWithMasks) {
  std::mt19937 rng(9);
  Problem p;
  p.config.embed_dim = 128;
  p.config.num_heads = 2;
  p.config.batch_first = true;
  p.config.compute = Compute::kBF16;
  p.N = 1;
  p.L = p.S = 1280;
  p.self_attention = true;
  p.causal = true;
  p.kpm = MaskChoice::kBool;
  p.attn = MaskChoice::kFloat;
  testing_util::FillProblem(&p, &rng);
  Views v;
  RunForward(p, 2, &v);
  Errors worst;
  ExpectWithinBf16Bound(p, v, &worst);
  std::printf("[ %s ] S = %lld: output error %.3g of the output scale\n",
              kernels::Bf16KernelName(GetParam()), static_cast<long long>(p.S), worst.output);
}

// Rounding is relative: activations of magnitude 1e4 against weights of 1e-4 keep the bound.
TEST_P(Bf16KernelTest, LargeMagnitudesKeepTheRelativeBound) {
  std::mt19937 rng(10);
  for (int i = 0; i < 20; ++i) {
    Problem p = RandomBf16Problem(&rng, 30);
    for (std::vector<float>* x : {&p.query, &p.key, &p.value}) {
      for (float& f : *x) f *= 1e4f;
    }
    for (std::vector<float>* w : {&p.in_proj_w, &p.wq, &p.wk, &p.wv}) {
      for (float& f : *w) f *= 1e-4f;
    }
    Views v;
    RunForward(p, 2, &v);
    Errors worst;
    ExpectWithinBf16Bound(p, v, &worst);
  }
}

TEST_P(Bf16KernelTest, BitwiseIdenticalForAnyThreadCount) {
  std::mt19937 rng(11);
  for (int i = 0; i < 10; ++i) {
    const Problem p = RandomBf16Problem(&rng, 200);
    Views one;
    RunForward(p, 1, &one);
    for (size_t threads : {2, 3, 5}) {
      Views many;
      RunForward(p, threads, &many);
      ASSERT_EQ(one.output.size(), many.output.size());
      EXPECT_EQ(
          0, std::memcmp(one.output.data(), many.output.data(), one.output.size() * sizeof(float)))
          << threads << " threads\n"
          << p.Describe();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16KernelTest,
                         testing::Values(kernels::Bf16Kernel::kEmulated,
                                         kernels::Bf16Kernel::kAvx512Bf16,
                                         kernels::Bf16Kernel::kAmx, kernels::Bf16Kernel::kNeonBf16),
                         [](const testing::TestParamInfo<kernels::Bf16Kernel>& info) {
                           return std::string(kernels::Bf16KernelName(info.param));
                         });

// Project's per-head outputs in bf16 against the f32 layer's: within the bound of the outputs'
// scale, on aligned and unaligned head offsets (head_dim 40: heads at columns 0, 40, 80, ...),
// with separate weights (GQA) and with a packed in_proj_weight (packed whole as bf16 when its
// parts start on panels: head_dim 64).
TEST(Bf16ComputeTest, ProjectWithinBoundOfF32) {
  std::mt19937 rng(12);
  for (const bool packed : {false, true})
    for (const int64_t hd : {64, 40}) {
      Problem p;
      p.config.embed_dim = 4 * hd;
      p.config.num_heads = 4;
      p.config.num_kv_heads = packed ? 0 : 2;
      p.config.batch_first = true;
      p.packed = packed;
      p.N = 2;
      p.L = 37;
      p.S = packed ? 37 : 29;
      testing_util::FillProblem(&p, &rng);
      std::vector<float> outs[2][3];
      for (const Compute compute : {Compute::kF32, Compute::kBF16}) {
        p.config.compute = compute;
        std::unique_ptr<MultiheadAttention> mha;
        ASSERT_TRUE(MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha).ok());
        Views v;
        MakeViews(p, &v);
        const int64_t H = 4, KVH = packed ? 4 : 2;
        std::vector<float>* o = outs[compute == Compute::kBF16 ? 1 : 0];
        o[0].assign(p.N * H * p.L * hd, 0.0f);
        o[1].assign(p.N * KVH * p.S * hd, 0.0f);
        o[2].assign(p.N * KVH * p.S * hd, 0.0f);
        ProjectionOutputs po;
        po.q = Dense(o[0].data(), {p.N, H, p.L, hd});
        po.k = Dense(o[1].data(), {p.N, KVH, p.S, hd});
        po.v = Dense(o[2].data(), {p.N, KVH, p.S, hd});
        std::unique_ptr<Context> ctx;
        ASSERT_TRUE(Context::Create(ContextOptions{}, &ctx).ok());
        const Status s = mha->Project(*ctx, v.in, po);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      for (int i = 0; i < 3; ++i) {
        double scale = 0, err = 0;
        for (size_t j = 0; j < outs[0][i].size(); ++j) {
          scale = std::max(scale, std::abs(static_cast<double>(outs[0][i][j])));
          err = std::max(err, std::abs(static_cast<double>(outs[1][i][j]) - outs[0][i][j]));
        }
        EXPECT_LE(err, 1e-2 * scale) << "head_dim " << hd << ", projection " << i;
        EXPECT_GT(err, 0.0) << "bf16 compute must round: head_dim " << hd << ", projection " << i;
      }
    }
}

// Decoding through the KV cache with bf16 compute stays within the bound of the double
// reference of the one-shot causal forward (the cache's projections run in bf16; its attention
// reads the cache rows as stored).
TEST(Bf16ComputeTest, KvCacheDecodeWithinBound) {
  std::mt19937 rng(13);
  for (const DType cache_type : {DType::kF32, DType::kBF16}) {
    Problem p;
    p.config.embed_dim = 128;
    p.config.num_heads = 4;
    p.config.num_kv_heads = 2;
    p.config.batch_first = true;
    p.config.compute = Compute::kBF16;
    p.packed = false;
    p.N = 2;
    p.L = p.S = 40;
    p.self_attention = true;
    p.causal = true;
    testing_util::FillProblem(&p, &rng);
    std::unique_ptr<MultiheadAttention> mha;
    ASSERT_TRUE(MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha).ok());
    std::unique_ptr<KvCache> cache;
    ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*mha, p.N, p.L, cache_type), &cache).ok());
    std::unique_ptr<Context> ctx;
    ASSERT_TRUE(Context::Create(ContextOptions{}, &ctx).ok());
    Views v;
    MakeViews(p, &v);
    const int64_t E = p.config.embed_dim;
    // Prompt of 16 tokens, then one token at a time.
    std::vector<float> out(p.N * p.L * E);
    for (int64_t t0 = 0; t0 < p.L;) {
      const int64_t T = t0 == 0 ? 16 : 1;
      std::vector<float> x(p.N * T * E);
      for (int64_t n = 0; n < p.N; ++n) {
        std::copy_n(p.query.data() + (n * p.L + t0) * E, T * E, x.data() + n * T * E);
      }
      std::vector<float> y(p.N * T * E);
      const Status s =
          cache->Step(*ctx, *mha, Dense(x.data(), {p.N, T, E}), Dense(y.data(), {p.N, T, E}));
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t n = 0; n < p.N; ++n) {
        std::copy_n(y.data() + n * T * E, T * E, out.data() + (n * p.L + t0) * E);
      }
      t0 += T;
    }
    v.output = out;
    Errors worst;
    ExpectWithinBf16Bound(p, v, &worst);
  }
}

// The C API carries the field both ways and names a bad value.
TEST(Bf16ComputeTest, ConfigRefusesAnUnknownCompute) {
  Problem p;
  p.config.embed_dim = 8;
  p.config.num_heads = 2;
  std::mt19937 rng(14);
  testing_util::FillProblem(&p, &rng);
  p.config.compute = static_cast<Compute>(7);
  std::unique_ptr<MultiheadAttention> mha;
  const Status s = MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compute: expected kF32 (0), kBF16 (1) or kInt8 (2), got 7"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace mha
