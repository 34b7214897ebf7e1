// Layers with int8 activations (Compute::kInt8 with weight_dtype kI8 / kI4, README "Quantized
// weights"): the projections quantize each activation row to int8 per block and multiply by
// integer dot products (kernels/gemv_int8.h); attention stays f32.
// - against the same quantized layer with f32 activations (Compute::kF32): the only difference
//   is the activations' rounding, bounded here for random configurations (packed, per-head,
//   separate, GQA, biases, masks), measured and printed;
// - a row's bits do not depend on the rows around it (one token alone or among many, decode's
//   few rows or prefill's many), on the thread count, nor on the SIMD target;
// - token-by-token KV-cache decode against the one-shot causal forward;
// - refused without quantized weights.
// The error of a Llama-shaped layer against its f32 weights is quant_weights_test's
// LlamaShapedLayerError (both computes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gemv_int8.h"
#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/quant_test_util.h"

namespace mha {
namespace {

using kernels::Format;
using kernels::kFormats;
using testing_util::ExpectSameBits;
using testing_util::Problem;
using testing_util::WeightsOf;

AttentionConfig Int8Config(AttentionConfig c, const Format& f, Compute compute = Compute::kInt8) {
  c.weight_dtype = f.type;
  c.weight_block = static_cast<int64_t>(f.block);
  c.compute = compute;
  return c;
}

// Output error of int8 activations against f32 activations on the same quantized weights,
// relative to the output's largest magnitude. Each activation is within scale / 2 = amax / 254
// of its block's largest magnitude; two projections compound it. Measured worst over the 40
// random problems (printed): i8 1.5e-2, i4 (32 and 128) 1.3e-2; the bound is about 2.5 times.
constexpr double kBound = 4e-2;

TEST(Int8ComputeTest, CloseToF32ActivationsOnTheSameWeights) {
  std::mt19937 rng(21);
  double worst[3] = {0, 0, 0};
  for (int i = 0; i < 40; ++i) {
    const Problem p = testing_util::RandomProblem(&rng);
    for (int qi = 0; qi < 3; ++qi) {
      const Format& q = kFormats[qi];
      SCOPED_TRACE(p.Describe() + " weight_dtype " + q.Name());
      testing_util::Views int8, f32;
      testing_util::RunLayerForward(Int8Config(p.config, q), WeightsOf(p), WeightBinding::kCopy, p,
                                    2, &int8);
      testing_util::RunLayerForward(Int8Config(p.config, q, Compute::kF32), WeightsOf(p),
                                    WeightBinding::kCopy, p, 2, &f32);
      if (::testing::Test::HasFatalFailure()) return;
      const testing_util::OutputError e = testing_util::MaxError(int8.output, f32.output);
      EXPECT_LE(e.err, kBound * std::max(e.scale, 1e-3));
      if (e.scale > 0) worst[qi] = std::max(worst[qi], e.err / e.scale);
      // Attention weights see int8 only through q and k.
      if (!f32.weights.empty()) {
        const testing_util::OutputError w = testing_util::MaxError(int8.weights, f32.weights);
        EXPECT_LE(w.err, kBound) << "attention weights";
      }
    }
  }
  for (int qi = 0; qi < 3; ++qi) {
    std::printf("[%s] int8 vs f32 activations, worst over 40 problems: %.3g of the max output\n",
                kFormats[qi].Name().c_str(), worst[qi]);
  }
}

// Tokens as a batch of one-token sequences: each output row is out_proj(v_proj(x)) of its own
// token (softmax over one key), so row i must be the same bits alone, among 37 rows (the
// projections' many-row path), on 1, 2 or 3 threads, and on every target.
class Int8ComputeTargetTest : public test::PerTargetTest {};

TEST_P(Int8ComputeTargetTest, RowsGiveTheSameBitsAloneOrAmongMany) {
  const int64_t E = 192, H = 3, N = 37;
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> w_in(3 * E * E), b_in(3 * E), w_out(E * E), b_out(E), x(N * E);
  for (auto* v : {&w_in, &b_in, &w_out, &b_out, &x}) {
    for (float& f : *v) f = d(rng);
  }
  AttentionWeights w;
  w.in_proj_weight = w_in.data();
  w.in_proj_bias = b_in.data();
  w.out_proj_weight = w_out.data();
  w.out_proj_bias = b_out.data();
  for (const Format& q : kFormats) {
    SCOPED_TRACE(std::string(target_name()) + " " + q.Name());
    AttentionConfig c;
    c.embed_dim = E;
    c.num_heads = H;
    c.batch_first = true;
    std::unique_ptr<MultiheadAttention> layer;
    WithDefaultTarget([&] {
      ASSERT_TRUE(
          MultiheadAttention::Create(Int8Config(c, q), w, WeightBinding::kCopy, &layer).ok());
    });
    const auto run = [&](int64_t n, const float* in, size_t threads, std::vector<float>* out) {
      ContextOptions o;
      o.num_threads = threads;
      std::unique_ptr<Context> ctx;
      ASSERT_TRUE(Context::Create(o, &ctx).ok());
      out->assign(static_cast<size_t>(n * E), 0.0f);
      AttentionInputs ai;
      AttentionOutputs ao;
      const int64_t shape[3] = {n, 1, E};
      ASSERT_TRUE(TensorView::Dense(const_cast<float*>(in), DType::kF32, 3, shape, &ai.query).ok());
      ASSERT_TRUE(TensorView::Dense(out->data(), DType::kF32, 3, shape, &ao.output).ok());
      const Status s = layer->Forward(*ctx, ai, ao);
      ASSERT_TRUE(s.ok()) << s.ToString();
    };
    std::vector<float> all, other, one;
    run(N, x.data(), 2, &all);
    // And the same bits on every target (the first one run keeps its outputs for the others).
    static std::map<std::string, std::vector<float>> first_target;
    if (!first_target.emplace(q.Name(), all).second) {
      ExpectSameBits(all, first_target[q.Name()], "against the first target");
    }
    for (size_t threads : {1, 3}) {
      run(N, x.data(), threads, &other);
      ExpectSameBits(other, all, std::to_string(threads) + " threads");
    }
    for (int64_t i : {0, 17, 36}) {
      run(1, x.data() + i * E, 1, &one);
      ExpectSameBits(one, std::vector<float>(all.begin() + i * E, all.begin() + (i + 1) * E),
                     "row " + std::to_string(i) + " alone");
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(Int8ComputeTargetTest);

// Token-by-token decode through a KV cache against the causal forward of the same layer: the
// projections give the same bits either way (above); the attention of a step and of the
// forward differ in f32 rounding only.
TEST(Int8ComputeTest, KvCacheDecodeMatchesForward) {
  const int64_t E = 256, H = 4, KVH = 2, T = 10;
  std::mt19937 rng(12);
  std::normal_distribution<float> d(0.0f, 0.3f);
  const auto draw = [&] { return d(rng); };
  const testing_util::SeparateWeights weights =
      testing_util::DrawSeparateWeights(E, H, KVH, /*bias=*/false, draw);
  std::vector<float> x(T * E);
  for (float& f : x) f = draw();
  const AttentionWeights w = weights.View();
  const AttentionConfig c = testing_util::LlamaLikeConfig(E, H, KVH);
  for (const Format& q : kFormats) {
    SCOPED_TRACE(q.Name());
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(MultiheadAttention::Create(Int8Config(c, q), w, WeightBinding::kCopy, &layer).ok());
    std::unique_ptr<Context> ctx;
    ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
    std::vector<float> steps, full;
    testing_util::DecodeAndCausalForward(*ctx, *layer, x, T, E, &steps, &full);
    if (::testing::Test::HasFatalFailure()) return;
    // The first token attends to itself only: its projections are the forward's bits.
    ExpectSameBits(std::vector<float>(steps.begin(), steps.begin() + E),
                   std::vector<float>(full.begin(), full.begin() + E), "first token");
    EXPECT_LE(testing_util::MaxScaledError(steps, full), 1e-4);
  }
}

TEST(Int8ComputeTest, RefusedWithoutQuantizedWeights) {
  std::mt19937 rng(5);
  const Problem p = testing_util::RandomProblem(&rng);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    AttentionConfig c = p.config;
    c.weight_dtype = dtype;
    c.compute = Compute::kInt8;
    std::unique_ptr<MultiheadAttention> layer;
    const Status s = MultiheadAttention::Create(c, WeightsOf(p), WeightBinding::kCopy, &layer);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(std::string("compute: kInt8 (int8 activations) expects "
                                           "weight_dtype I8 or I4, got ") +
                               DTypeName(dtype)),
              std::string::npos)
        << s.message();
  }
}

// An input too wide for one quantized row in the GEMM scratch is refused at create, naming the
// dimension, before any weight is read (the weights here are absent).
TEST(Int8ComputeTest, RefusesAnInputWiderThanTheScratch) {
  const size_t room = kernels::GemmScratchBytes();
  int64_t in = 128;
  while (kernels::Int8ActLayoutOf(DType::kI8, 0, static_cast<size_t>(in)).row_bytes <= room) {
    in *= 2;
  }
  AttentionConfig c;
  c.embed_dim = 64;
  c.num_heads = 2;
  c.kdim = in;
  c.weight_dtype = DType::kI8;
  c.compute = Compute::kInt8;
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::Create(c, AttentionWeights{}, WeightBinding::kCopy, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("kdim: expected an input whose int8 row fits the GEMM scratch"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("got " + std::to_string(in) + " features"), std::string::npos)
      << s.message();
  c.compute = Compute::kF32;  // the same width with f32 activations is no concern of this check
  const Status f32 =
      MultiheadAttention::Create(c, AttentionWeights{}, WeightBinding::kCopy, &layer);
  EXPECT_EQ(f32.message().find("GEMM scratch"), std::string::npos) << f32.message();
}

}  // namespace
}  // namespace mha
