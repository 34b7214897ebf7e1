// Layers with quantized weights (AttentionConfig::weight_dtype kI8 / kI4, README "Quantized
// weights").
//
// The contract (mha.hpp): the weights are quantized once at creation and the arithmetic stays
// f32, the weights dequantized exactly as code * scale inside the products, so a quantized layer
// computes what an f32 layer holding the DEQUANTIZED weights computes with prepack kOff:
// - against the double reference given the dequantized weights (the test quantizes the problem's
//   weights with kernels::QuantizeRow itself), within the usual f32 bound, for random
//   configurations (packed, per-head, separate, GQA, q_dim/kdim/vdim, biases, bias_kv, masks,
//   attention weights), the key-chunked path, Project's per-head products, and token-by-token
//   KV-cache decode;
// - bitwise equal to that f32 layer (same projections on the same values: GEMV and the blocked
//   driver), on every SIMD target (but SVE wider than 512 bits: within the bound), and bitwise
//   the same for 1, 2 and 3 threads;
// - from bf16 weights as from their f32 widening; kView, bad blocks and non-finite weights
//   refused.
// With Compute::kBF16 the products of more than 16 rows multiply bf16(activations) by bf16(the
// dequantized weights) (kernels/gemm_bf16_quant.h), on every bf16 kernel this CPU runs:
// - bitwise the kBF16 layer holding the dequantized weights in f32 (its bf16 packing holds the
//   same bf16 values, and the products sum alike) where every product has more than 16 rows and
//   no projection adds a bias, and within 1e-4 of the output's scale of it with biases (added
//   after the sums, where AMX starts its tiles from them);
// - bitwise the same for 1, 2 and 3 threads, with rows in several groups (600 rows);
// - token-by-token decode (one-row products read the codes in f32) within the bf16 bound of the
//   layer's causal forward.
// Against the f32 weights themselves the error is the quantization's, measured and bounded here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemv_quant.h"
#include "kernels/quant.h"
#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

using testing_util::ExpectSameBits;
using testing_util::MakeViews;
using testing_util::MaxError;
using testing_util::Problem;
using testing_util::RandomProblem;
using testing_util::RunLayerForward;
using testing_util::Views;
using testing_util::WeightsOf;

// A quantized storage: dtype and kI4 block.
struct Quant {
  DType type;
  int64_t block;
  std::string Name() const {
    return type == DType::kI8 ? "i8" : "i4/" + std::to_string(block == 0 ? 32 : block);
  }
};
const Quant kQuants[] = {{DType::kI8, 0}, {DType::kI4, 0}, {DType::kI4, 128}};

// The dequantized values of a matrix of `rows` rows (row length size / rows), each row
// quantized as the layer does (kernels::QuantizeRow) and read back as code * scale.
std::vector<float> Dequantize(const std::vector<float>& w, int64_t rows, const Quant& q) {
  if (w.empty()) return w;
  const size_t in = w.size() / static_cast<size_t>(rows);
  const size_t block = q.type == DType::kI4 ? (q.block == 0 ? 32 : q.block) : 0;
  std::vector<uint8_t> codes(kernels::QuantRowBytes(q.type, block, in));
  std::vector<float> scales(kernels::QuantScalesPerRow(q.type, block, in));
  const kernels::QuantMatrix m{codes.data(), scales.data(), q.type,       block, 1,
                               in,           codes.size(),  scales.size()};
  std::vector<float> out(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    kernels::QuantizeRow(w.data() + r * in, in, q.type, block, codes.data(), scales.data());
    for (size_t p = 0; p < in; ++p) out[r * in + p] = kernels::DequantizedWeight(m, 0, p);
  }
  return out;
}

// The problem with its weight matrices replaced by their dequantized values.
Problem Dequantized(Problem p, const Quant& q) {
  const AttentionConfig& c = p.config;
  const int64_t H = c.num_heads, KVH = c.num_kv_heads ? c.num_kv_heads : H;
  const int64_t hd = c.head_dim ? c.head_dim : c.embed_dim / H;
  p.in_proj_w = Dequantize(p.in_proj_w, (H + 2 * KVH) * hd, q);
  p.wq = Dequantize(p.wq, H * hd, q);
  p.wk = Dequantize(p.wk, KVH * hd, q);
  p.wv = Dequantize(p.wv, KVH * hd, q);
  p.wo = Dequantize(p.wo, c.embed_dim, q);
  return p;
}

// The quantized layer's outputs against its f32 twin's (prepack kOff, dequantized weights):
// bitwise where GemvQuant orders its sums as Gemv does (kernels::GemvQuantOrdersAsGemv: every
// target but SVE wider than 512 bits), else within the f32 bound.
void ExpectTwin(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what) {
  if (kernels::GemvQuantOrdersAsGemv()) return ExpectSameBits(got, want, what);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(testing_util::Close(got[i], want[i])) << what << ": element " << i;
  }
}

AttentionConfig QuantConfig(AttentionConfig c, const Quant& q) {
  c.weight_dtype = q.type;
  c.weight_block = q.block;
  return c;
}

// Output error against the f32 weights, relative to the output's largest magnitude. Each
// dequantized weight is within scale / 2 of the original: 1 / 254 of its row's largest magnitude
// for i8, 1 / 14 of its block's for i4; two projections and the softmax compound it, and tiny
// layers (E = 1..8, RandomProblem) cancel. Measured worst over MatchesReferenceOnDequantized-
// Weights' 150 problems (printed by the test): i8 1.3e-2, i4 0.13 (blocks 32 and 128 alike: the
// rows are at most 11 wide); bounds about twice that. README "Quantized weights" gives the
// error of real-sized layers.
double Bound(const Quant& q) { return q.type == DType::kI8 ? 3e-2 : 0.3; }

// The quantized layer against the reference and the f32 layer of the dequantized weights;
// *worst collects the error against the f32 weights.
void CheckProblem(const Problem& p, const Quant& q, size_t threads, double* worst) {
  SCOPED_TRACE(p.Describe() + " weight_dtype " + q.Name());
  const Problem deq = Dequantized(p, q);
  Views quant;
  RunLayerForward(QuantConfig(p.config, q), WeightsOf(p), WeightBinding::kCopy, p, threads, &quant);
  if (::testing::Test::HasFatalFailure()) return;
  testing_util::ExpectMatchesReference(deq, quant);
  // The bitwise twin: f32 weights as dequantized, owned (the same fused q/k/v product), not
  // prepacked (quantized weights never are).
  AttentionConfig c32 = deq.config;
  c32.prepack = WeightPrepack::kOff;
  Views twin;
  RunLayerForward(c32, WeightsOf(deq), WeightBinding::kCopy, deq, threads, &twin);
  ExpectTwin(quant.output, twin.output, "output");
  ExpectTwin(quant.weights, twin.weights, "attention weights");
  Views exact;  // the f32 layer on the original weights
  RunLayerForward(p.config, WeightsOf(p), p.binding, p, threads, &exact);
  const testing_util::OutputError e = MaxError(quant.output, exact.output);
  EXPECT_LE(e.err, Bound(q) * std::max(e.scale, 1e-3));
  if (e.scale > 0) *worst = std::max(*worst, e.err / e.scale);
}

TEST(QuantWeightsTest, MatchesReferenceOnDequantizedWeights) {
  for (const Quant& q : kQuants) {
    std::mt19937 rng(2027);
    double worst = 0;
    for (int i = 0; i < 150; ++i) CheckProblem(RandomProblem(&rng), q, 2, &worst);
    std::printf("[%s] worst output error / output scale vs f32 weights: %.3g (bound %.3g)\n",
                q.Name().c_str(), worst, Bound(q));
  }
}

// Longer inputs (the blocked driver's dequantizing packing, several row panels, wider layers)
// on 1, 2 and 3 threads: bitwise the same for every thread count, so checked against the
// references once (on 3 threads).
TEST(QuantWeightsTest, ThreadCountsGiveTheSameBits) {
  std::mt19937 rng(41);
  for (const Quant& q : kQuants) {
    for (int i = 0; i < 4; ++i) {
      Problem p = RandomProblem(&rng);
      p.config.num_heads = 4;
      p.config.num_kv_heads = 0;
      p.config.head_dim = 0;
      p.config.embed_dim = 4 * (i % 2 ? 24 : 40);
      p.config.q_dim = p.config.kdim = p.config.vdim = 0;
      p.config.bias_projections = 0;
      p.L = 150;
      p.S = p.self_attention ? p.L : 90;
      testing_util::FillProblem(&p, &rng);
      double worst = 0;
      Views outs[3];
      CheckProblem(p, q, 3, &worst);
      for (size_t threads = 1; threads <= 3; ++threads) {
        RunLayerForward(QuantConfig(p.config, q), WeightsOf(p), WeightBinding::kCopy, p, threads,
                        &outs[threads - 1]);
      }
      ExpectSameBits(outs[1].output, outs[0].output, q.Name() + " 2 threads vs 1");
      ExpectSameBits(outs[2].output, outs[0].output, q.Name() + " 3 threads vs 1");
    }
  }
}

// The key-chunked path (K and V projected per key chunk, output projection by row blocks).
TEST(QuantWeightsTest, ChunkedLongSequencePath) {
  testing_util::ScopedKeyChunking chunking(3);
  for (const Quant& q : kQuants) {
    std::mt19937 rng(31);
    double worst = 0;
    for (int i = 0; i < 30; ++i) {
      Problem p = RandomProblem(&rng);
      p.need_weights = false;  // the chunked path serves forwards without weights
      CheckProblem(p, q, 2, &worst);
    }
  }
}

// CheckProblem on each target's kernels (GEMV for few rows, the dequantizing driver for more).
class QuantWeightsTargetTest : public test::PerTargetTest {};

TEST_P(QuantWeightsTargetTest, MatchesReferenceOnDequantizedWeights) {
  std::mt19937 rng(99);
  double worst = 0;
  for (int i = 0; i < 12; ++i) {
    Problem p = RandomProblem(&rng);
    if (i % 3 == 0) p.L = p.S = 40;
    testing_util::FillProblem(&p, &rng);
    CheckProblem(p, kQuants[i % 3], 2, &worst);
  }
}

MHA_INSTANTIATE_PER_TARGET(QuantWeightsTargetTest);

// Project's per-head products: bitwise the f32 layer's on the dequantized weights; with
// Compute::kBF16 (21 and 29 rows, no biases) bitwise the kBF16 layer's on them.
TEST(QuantWeightsTest, ProjectEqualsF32OnDequantizedWeights) {
  std::mt19937 rng(12);
  for (const Quant& q : kQuants) {
    for (const int variant : {0, 1, 2}) {
      const bool packed = variant == 1;
      const bool bf16 = variant == 2;
      Problem p;
      p.config.bias = !bf16;
      p.config.compute = bf16 ? Compute::kBF16 : Compute::kF32;
      // bf16: heads on the bf16 packing's 32-column panels, as the twin's per-head products need.
      p.config.embed_dim = 4 * (bf16 ? 32 : 24);
      p.config.num_heads = 4;
      p.config.num_kv_heads = packed ? 0 : 2;
      p.config.batch_first = true;
      p.packed = packed;
      p.N = 2;
      p.L = 21;
      p.S = packed ? 21 : 29;
      testing_util::FillProblem(&p, &rng);
      const Problem deq = Dequantized(p, q);
      const int64_t H = 4, KVH = packed ? 4 : 2, hd = bf16 ? 32 : 24;
      std::vector<float> outs[2][3];
      for (int l = 0; l < 2; ++l) {
        AttentionConfig c = l == 0 ? QuantConfig(p.config, q) : deq.config;
        if (l == 1) c.prepack = WeightPrepack::kOff;
        std::unique_ptr<MultiheadAttention> mha;
        ASSERT_TRUE(
            MultiheadAttention::Create(c, WeightsOf(l == 0 ? p : deq), WeightBinding::kCopy, &mha)
                .ok());
        Views v;
        MakeViews(p, &v);
        std::vector<float>* o = outs[l];
        o[0].assign(p.N * H * p.L * hd, 0.0f);
        o[1].assign(p.N * KVH * p.S * hd, 0.0f);
        o[2].assign(p.N * KVH * p.S * hd, 0.0f);
        const int64_t q_shape[4] = {p.N, H, p.L, hd}, kv_shape[4] = {p.N, KVH, p.S, hd};
        ProjectionOutputs po;
        ASSERT_TRUE(TensorView::Dense(o[0].data(), DType::kF32, 4, q_shape, &po.q).ok());
        ASSERT_TRUE(TensorView::Dense(o[1].data(), DType::kF32, 4, kv_shape, &po.k).ok());
        ASSERT_TRUE(TensorView::Dense(o[2].data(), DType::kF32, 4, kv_shape, &po.v).ok());
        std::unique_ptr<Context> ctx;
        ASSERT_TRUE(Context::Create(ContextOptions{}, &ctx).ok());
        const Status s = mha->Project(*ctx, v.in, po);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      for (int i = 0; i < 3; ++i) {
        const std::string what = q.Name() + (bf16 ? " bf16" : "") + " projection " +
                                 std::to_string(i);
        if (bf16) {
          ExpectSameBits(outs[0][i], outs[1][i], what);
        } else {
          ExpectTwin(outs[0][i], outs[1][i], what);
        }
      }
    }
  }
}

// A decode test's layer: separate weights with biases, drawn from `seed` in [-0.5, 0.5], and
// T tokens x [T, E].
testing_util::SeparateWeights DrawDecodeProblem(unsigned seed, int64_t E, int64_t H, int64_t KVH,
                                                int64_t T, std::vector<float>* x) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  const auto draw = [&] { return u(rng); };
  testing_util::SeparateWeights weights =
      testing_util::DrawSeparateWeights(E, H, KVH, /*bias=*/true, draw);
  x->resize(T * E);
  for (float& f : *x) f = draw();
  return weights;
}

// Its configuration: batch-first, biases, no RoPE.
AttentionConfig DecodeConfig(int64_t E, int64_t H, int64_t KVH) {
  AttentionConfig c = testing_util::LlamaLikeConfig(E, H, KVH);
  c.bias = true;
  c.rope = RopeStyle::kNone;
  return c;
}

// Token-by-token decode through the KV cache: bitwise the f32 layer's on the dequantized
// weights, and within the f32 bound of the quantized layer's own one-shot causal forward.
TEST(QuantWeightsTest, KvCacheDecode) {
  const int64_t E = 64, H = 4, KVH = 2, T = 12;
  const int64_t kvE = E / H * KVH;
  std::vector<float> x;
  const testing_util::SeparateWeights weights = DrawDecodeProblem(11, E, H, KVH, T, &x);
  for (const Quant& q : kQuants) {
    SCOPED_TRACE(q.Name());
    const AttentionConfig c = DecodeConfig(E, H, KVH);
    const AttentionWeights w = weights.View();
    const std::vector<float> dq = Dequantize(weights.q, E, q), dk = Dequantize(weights.k, kvE, q),
                             dv = Dequantize(weights.v, kvE, q),
                             dout = Dequantize(weights.out, E, q);
    AttentionWeights wd = w;
    wd.q_proj_weight = dq.data();
    wd.k_proj_weight = dk.data();
    wd.v_proj_weight = dv.data();
    wd.out_proj_weight = dout.data();
    std::unique_ptr<MultiheadAttention> f32_layer, quant_layer;
    AttentionConfig c32 = c;
    c32.prepack = WeightPrepack::kOff;
    ASSERT_TRUE(MultiheadAttention::Create(c32, wd, WeightBinding::kCopy, &f32_layer).ok());
    ASSERT_TRUE(
        MultiheadAttention::Create(QuantConfig(c, q), w, WeightBinding::kCopy, &quant_layer).ok());
    std::unique_ptr<Context> ctx;
    ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
    const int64_t shape[3] = {1, 1, E};
    std::vector<float> outs[2];
    const MultiheadAttention* layers[2] = {f32_layer.get(), quant_layer.get()};
    for (int l = 0; l < 2; ++l) {
      std::unique_ptr<KvCache> cache;
      ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*layers[l], 1, T), &cache).ok());
      outs[l].assign(T * E, 0.0f);
      for (int64_t i = 0; i < T; ++i) {
        TensorView xi, yi;
        ASSERT_TRUE(
            TensorView::Dense(const_cast<float*>(x.data()) + i * E, DType::kF32, 3, shape, &xi)
                .ok());
        ASSERT_TRUE(TensorView::Dense(outs[l].data() + i * E, DType::kF32, 3, shape, &yi).ok());
        const Status s = cache->Step(*ctx, *layers[l], xi, yi);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
    }
    ExpectTwin(outs[1], outs[0], "decode output");
    // The one-shot causal forward of the quantized layer over the T tokens.
    std::vector<float> full(T * E, 0.0f);
    AttentionInputs in;
    AttentionOutputs out;
    const int64_t seq[3] = {1, T, E};
    ASSERT_TRUE(
        TensorView::Dense(const_cast<float*>(x.data()), DType::kF32, 3, seq, &in.query).ok());
    ASSERT_TRUE(TensorView::Dense(full.data(), DType::kF32, 3, seq, &out.output).ok());
    in.causal = true;
    ASSERT_TRUE(quant_layer->Forward(*ctx, in, out).ok());
    for (size_t i = 0; i < full.size(); ++i) {
      ASSERT_TRUE(testing_util::Close(outs[1][i], full[i]))
          << "decode vs forward, element " << i << ": " << outs[1][i] << " vs " << full[i];
    }
  }
}

// Quantizing bf16 weights quantizes their exact f32 values: the same layer bitwise.
TEST(QuantWeightsTest, Bf16WeightsQuantizeAsTheirF32Values) {
  std::mt19937 rng(7);
  for (const Quant& q : kQuants) {
    for (int i = 0; i < 20; ++i) {
      Problem p = RandomProblem(&rng);
      std::vector<float>* mats[5] = {&p.in_proj_w, &p.wq, &p.wk, &p.wv, &p.wo};
      std::vector<uint16_t> half[5];
      for (int m = 0; m < 5; ++m) {
        half[m].resize(mats[m]->size());
        kernels::F32ToBF16(mats[m]->data(), half[m].data(), half[m].size());
        kernels::BF16ToF32(half[m].data(), mats[m]->data(), half[m].size());
      }
      AttentionWeights w16 = WeightsOf(p);
      w16.dtype = DType::kBF16;
      if (w16.in_proj_weight) w16.in_proj_weight = half[0].data();
      if (w16.q_proj_weight) {
        w16.q_proj_weight = half[1].data();
        w16.k_proj_weight = half[2].data();
        w16.v_proj_weight = half[3].data();
      }
      w16.out_proj_weight = half[4].data();
      Views from32, from16;
      RunLayerForward(QuantConfig(p.config, q), WeightsOf(p), WeightBinding::kCopy, p, 2, &from32);
      RunLayerForward(QuantConfig(p.config, q), w16, WeightBinding::kCopy, p, 2, &from16);
      ExpectSameBits(from16.output, from32.output, q.Name() + " from bf16");
    }
  }
}

// The error against f32 weights on a Llama-shaped layer: hidden E, E / 128 heads of 128, a
// quarter of them kv heads (Llama 3 8B: E 4096, 32 heads, 8 kv heads), RoPE (theta 5e5),
// causal, 64 tokens; weights N(0, 0.02) (Llama's initialization), inputs N(0, 1) (hidden states
// after RMSNorm). E is 1024 here (same ratios, seconds); MHA_QUANT_LLAMA_E=4096 runs Llama's
// (README "Quantized weights" quotes that run). Errors relative to the f32 output's largest
// magnitude and its RMS.
TEST(QuantWeightsTest, LlamaShapedLayerError) {
  const char* env = std::getenv("MHA_QUANT_LLAMA_E");
  const int64_t E = env != nullptr ? std::atoll(env) : 1024, hd = 128, H = E / hd, KVH = H / 4;
  const int64_t L = 64;
  ASSERT_TRUE(E % (4 * hd) == 0) << "MHA_QUANT_LLAMA_E: a multiple of 512";
  std::mt19937 rng(8);
  std::normal_distribution<float> weight(0.0f, 0.02f), hidden(0.0f, 1.0f);
  const testing_util::SeparateWeights weights =
      testing_util::DrawSeparateWeights(E, H, KVH, /*bias=*/false, [&] { return weight(rng); });
  std::vector<float> x(L * E);
  for (float& f : x) f = hidden(rng);
  AttentionConfig c = testing_util::LlamaLikeConfig(E, H, KVH);
  c.rope_theta = 500000.0f;
  const AttentionWeights w = weights.View();
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  const auto forward = [&](const AttentionConfig& config, std::vector<float>* out) {
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(MultiheadAttention::Create(config, w, WeightBinding::kCopy, &layer).ok());
    out->assign(L * E, 0.0f);
    AttentionInputs in;
    AttentionOutputs o;
    const int64_t shape[3] = {1, L, E};
    ASSERT_TRUE(
        TensorView::Dense(const_cast<float*>(x.data()), DType::kF32, 3, shape, &in.query).ok());
    ASSERT_TRUE(TensorView::Dense(out->data(), DType::kF32, 3, shape, &o.output).ok());
    in.causal = true;
    ASSERT_TRUE(layer->Forward(*ctx, in, o).ok());
  };
  std::vector<float> exact;
  forward(c, &exact);
  double rms = 0;
  for (float v : exact) rms += static_cast<double>(v) * v;
  rms = std::sqrt(rms / static_cast<double>(exact.size()));
  // Bounds about twice the errors measured at E 1024 and 4096 (printed): at 1024 i8 0.012 /
  // 0.012 (max / RMS), i4 0.15 / 0.14, i4-128 0.16 / 0.18; each weight's error is up to half a
  // step of max|w| / 127 (row of E) or / 7 (block), about 1% and 8% of the weights' RMS.
  const double max_bound[3] = {0.03, 0.35, 0.35}, rms_bound[3] = {0.03, 0.35, 0.35};
  // Each dtype with f32 products, int8 activations (Compute::kInt8) and bf16 products
  // (Compute::kBF16, 64 rows: the bf16 kernels): the activations' rounding adds little to the
  // weights' (measured, printed), so the same bounds. Then bf16 products on the f32 weights (k
  // 9, no bound here: tests/bf16_compute_test.cc holds them), for the part of the error that is
  // bf16's.
  const Compute computes[3] = {Compute::kF32, Compute::kInt8, Compute::kBF16};
  const char* compute_names[3] = {"", " int8 activations", " bf16 products"};
  for (int k = 0; k < 10; ++k) {
    const int i = k % 3;
    const bool f32_weights = k == 9;
    AttentionConfig qc = f32_weights ? c : QuantConfig(c, kQuants[i]);
    qc.compute = f32_weights ? Compute::kBF16 : computes[k / 3];
    std::vector<float> got;
    forward(qc, &got);
    const testing_util::OutputError e = MaxError(got, exact);
    double err2 = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      err2 += (static_cast<double>(got[j]) - exact[j]) * (static_cast<double>(got[j]) - exact[j]);
    }
    const double rms_err = std::sqrt(err2 / static_cast<double>(got.size()));
    std::printf(
        "[%s%s] Llama-shaped E %lld: max error %.3g of the max output, RMS error %.3g of "
        "the RMS output\n",
        f32_weights ? "f32" : kQuants[i].Name().c_str(),
        f32_weights ? " bf16 products" : compute_names[k / 3], static_cast<long long>(E),
        e.err / e.scale, rms_err / rms);
    if (f32_weights) continue;
    EXPECT_LE(e.err, max_bound[i] * e.scale) << kQuants[i].Name();
    EXPECT_LE(rms_err, rms_bound[i] * rms) << kQuants[i].Name();
  }
}

// ---------------------------------------------------------------------------------------------
// Compute::kBF16.

constexpr Bf16KernelChoice kBf16Choices[] = {Bf16KernelChoice::kEmulated,
                                             Bf16KernelChoice::kAvx512Bf16, Bf16KernelChoice::kAmx,
                                             Bf16KernelChoice::kNeonBf16};
constexpr const kernels::Bf16Kernel* kBf16Kernels = test::kAllBf16Kernels;

// A random problem whose every product has more than 16 rows (L and S 17..60 per batch entry),
// computed in bf16.
Problem ManyRowsBf16Problem(std::mt19937* rng) {
  Problem p = RandomProblem(rng);
  p.L = 17 + static_cast<int64_t>((*rng)() % 44);
  p.S = p.self_attention ? p.L : 17 + static_cast<int64_t>((*rng)() % 44);
  testing_util::FillProblem(&p, rng);
  p.config.compute = Compute::kBF16;
  return p;
}

// The quantized kBF16 layer against the kBF16 layer of the dequantized f32 weights, on
// `options`' kernel and threads.
void CheckBf16Twin(const Problem& p, const Quant& q, const ContextOptions& options) {
  SCOPED_TRACE(p.Describe() + " weight_dtype " + q.Name());
  const Problem deq = Dequantized(p, q);
  std::unique_ptr<MultiheadAttention> quant_layer, twin_layer;
  Status s = MultiheadAttention::Create(QuantConfig(p.config, q), WeightsOf(p),
                                        WeightBinding::kCopy, &quant_layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = MultiheadAttention::Create(deq.config, WeightsOf(deq), WeightBinding::kCopy, &twin_layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  Views quant, twin;
  testing_util::RunLayerOn(*quant_layer, p, options, &quant);
  testing_util::RunLayerOn(*twin_layer, deq, options, &twin);
  if (::testing::Test::HasFatalFailure()) return;
  const bool biased = p.config.bias_projections != 0 || p.config.bias;
  if (!biased) {
    ExpectSameBits(quant.output, twin.output, "output");
    ExpectSameBits(quant.weights, twin.weights, "attention weights");
    return;
  }
  const testing_util::OutputError e = MaxError(quant.output, twin.output);
  EXPECT_LE(e.err, 1e-4 * std::max(e.scale, 1e-3));
}

class QuantBf16KernelTest : public testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!kernels::Bf16KernelAvailable(kBf16Kernels[GetParam()])) {
      GTEST_SKIP() << "this CPU does not run the "
                   << kernels::Bf16KernelName(kBf16Kernels[GetParam()]) << " kernel";
    }
  }
  ContextOptions Options(size_t threads) const {
    ContextOptions o;
    o.num_threads = threads;
    o.bf16_kernel = kBf16Choices[GetParam()];
    return o;
  }
};

TEST_P(QuantBf16KernelTest, EqualsBf16LayerOnDequantizedWeights) {
  std::mt19937 rng(808);
  for (int i = 0; i < 36; ++i) {
    Problem p = ManyRowsBf16Problem(&rng);
    if (i % 2 == 0) {  // half without projection biases: bitwise
      p.config.bias = false;
      p.config.bias_projections = 0;
      testing_util::FillProblem(&p, &rng);
    }
    CheckBf16Twin(p, kQuants[i % 3], Options(2));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// 600 rows per batch entry (two groups of rows of the transposed packing) on 1, 2 and 3 threads.
TEST_P(QuantBf16KernelTest, ThreadCountsAndGroupsGiveTheSameBits) {
  std::mt19937 rng(77);
  for (const Quant& q : kQuants) {
    Problem p = RandomProblem(&rng);
    p.config.num_heads = 4;
    p.config.num_kv_heads = p.packed ? 0 : 2;
    p.config.head_dim = 0;
    p.config.embed_dim = 4 * 24;
    p.config.q_dim = p.config.kdim = p.config.vdim = 0;
    p.config.bias = false;
    p.config.bias_projections = 0;
    p.config.compute = Compute::kBF16;
    p.need_weights = false;
    p.L = 600;
    p.S = p.self_attention ? p.L : 610;
    testing_util::FillProblem(&p, &rng);
    CheckBf16Twin(p, q, Options(2));
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(MultiheadAttention::Create(QuantConfig(p.config, q), WeightsOf(p),
                                           WeightBinding::kCopy, &layer)
                    .ok());
    Views outs[3];
    for (size_t threads = 1; threads <= 3; ++threads) {
      testing_util::RunLayerOn(*layer, p, Options(threads), &outs[threads - 1]);
    }
    ExpectSameBits(outs[1].output, outs[0].output, q.Name() + " 2 threads vs 1");
    ExpectSameBits(outs[2].output, outs[0].output, q.Name() + " 3 threads vs 1");
  }
}

// Token-by-token decode (one-row products: the codes in f32) against the layer's causal
// forward of the same tokens (more than 16 rows: bf16 products), within bf16 compute's bound.
TEST_P(QuantBf16KernelTest, KvCacheDecodeWithinBf16BoundOfForward) {
  const int64_t E = 64, H = 4, KVH = 2, T = 24;
  std::vector<float> x;
  const testing_util::SeparateWeights weights = DrawDecodeProblem(21, E, H, KVH, T, &x);
  for (const Quant& q : kQuants) {
    SCOPED_TRACE(q.Name());
    AttentionConfig c = DecodeConfig(E, H, KVH);
    c.compute = Compute::kBF16;
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(MultiheadAttention::Create(QuantConfig(c, q), weights.View(), WeightBinding::kCopy,
                                           &layer)
                    .ok());
    std::unique_ptr<Context> ctx;
    ASSERT_TRUE(Context::Create(Options(2), &ctx).ok());
    std::vector<float> steps, full;
    testing_util::DecodeAndCausalForward(*ctx, *layer, x, T, E, &steps, &full);
    if (::testing::Test::HasFatalFailure()) return;
    const testing_util::OutputError e = MaxError(steps, full);
    // bf16 compute's bound (tests/bf16_compute_test.cc, README "bf16 compute"): the forward's
    // operands are rounded to bf16, the steps' projections are not.
    EXPECT_LE(e.err, 3e-2 * std::max(e.scale, 1e-3));
    std::printf("[ %s %s ] decode vs forward: %.3g of the output scale\n",
                kernels::Bf16KernelName(kBf16Kernels[GetParam()]), q.Name().c_str(),
                e.scale > 0 ? e.err / e.scale : e.err);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, QuantBf16KernelTest, testing::Range(0, 4),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::string(kernels::Bf16KernelName(kBf16Kernels[info.param]));
                         });


TEST(QuantWeightsTest, InvalidSettings) {
  std::mt19937 rng(5);
  Problem p = RandomProblem(&rng);
  std::unique_ptr<MultiheadAttention> layer;
  const auto expect = [&](const AttentionConfig& c, const AttentionWeights& w,
                          WeightBinding binding, StatusCode code, const std::string& needle) {
    const Status s = MultiheadAttention::Create(c, w, binding, &layer);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  AttentionConfig c = QuantConfig(p.config, kQuants[0]);
  expect(c, WeightsOf(p), WeightBinding::kView, StatusCode::kInvalidArgument,
         "binding: weight_dtype i8 quantizes the weights into the layer's own codes: expected "
         "WeightBinding::kCopy, got kView");
  {
    // bf16 products pack 32 rows of an input transposed into a worker's scratch (~2-3 MiB):
    // 200,000 key features do not fit on any CPU.
    AttentionConfig wide;
    wide.embed_dim = 8;
    wide.num_heads = 2;
    wide.kdim = 200000;
    wide.bias = false;
    wide.compute = Compute::kBF16;
    const std::vector<float> small(8 * 8, 0.25f), k_weights(8 * 200000, 0.5f);
    AttentionWeights w;
    w.q_proj_weight = small.data();
    w.k_proj_weight = k_weights.data();
    w.v_proj_weight = small.data();
    w.out_proj_weight = small.data();
    expect(QuantConfig(wide, kQuants[0]), w, WeightBinding::kCopy, StatusCode::kInvalidArgument,
           "kdim: expected an input whose bf16 packing of 32 rows fits the GEMM scratch with "
           "compute kBF16 and weight_dtype i8 (");
    expect(QuantConfig(wide, kQuants[0]), w, WeightBinding::kCopy, StatusCode::kInvalidArgument,
           "bytes), got 200000 features");
  }
  AttentionConfig block = QuantConfig(p.config, {DType::kI4, 64});
  expect(block, WeightsOf(p), WeightBinding::kCopy, StatusCode::kInvalidArgument,
         "weight_block: expected 0, 32 or 128 with weight_dtype I4, got 64");
  block = QuantConfig(p.config, {DType::kI8, 32});
  expect(block, WeightsOf(p), WeightBinding::kCopy, StatusCode::kInvalidArgument,
         "weight_block: expected 0 unless weight_dtype is I4, got 32");
  Problem bad = p;
  bad.wo[bad.wo.size() - 1] = std::nanf("");
  expect(QuantConfig(bad.config, kQuants[1]), WeightsOf(bad), WeightBinding::kCopy,
         StatusCode::kInvalidArgument, "weights: out_proj_weight row ");
  expect(QuantConfig(bad.config, kQuants[1]), WeightsOf(bad), WeightBinding::kCopy,
         StatusCode::kInvalidArgument, ": expected finite values to quantize (weight_dtype i4)");
}

}  // namespace
}  // namespace mha
