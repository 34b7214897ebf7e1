// Layers that store their weights in bf16 or f16 (AttentionConfig::weight_dtype).
//
// The contract (mha.hpp): arithmetic stays f32 and 16-bit weights are widened exactly inside the
// products, so a 16-bit layer must compute BITWISE what an f32 layer computes when given the
// 16-bit-rounded weights — for every configuration (packed, per-head, separate, GQA, q_dim/kdim/
// vdim, biases, bias_kv, masks, weights), whether the layer converts at creation (kCopy from f32)
// or views the caller's 16-bit arrays (kView), and on every SIMD target. The accuracy against the
// f32 layer is then only the weights' rounding, bounded here and stated in README.
// The KV-cache decoder uses the same projections: checked bitwise the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
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

// Output error of a 16-bit layer against the f32 layer, relative to the largest output
// magnitude of the problem (RandomProblem's weights and inputs are O(1)). Each weight carries a
// relative error of at most 2^-9 (bf16) / 2^-11 (f16); two projections and the softmax compound
// it, and cancellation in tiny layers (E = 1..2) magnifies it relative to the output scale.
// Measured worst cases over the 150 problems per type of BitwiseEqualToF32OnRoundedWeights:
// 8.8e-3 (bf16) and 6.5e-4 (f16). Bounds: about 10 and 8 units of the weights' rounding, the
// same as the KV cache's 16-bit bounds (kv_cache.hpp).
double Bound(DType t) { return t == DType::kBF16 ? 2e-2 : 4e-3; }

std::vector<uint16_t> ToHalf(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> h(x.size());
  if (t == DType::kBF16) {
    kernels::F32ToBF16(x.data(), h.data(), x.size());
  } else {
    kernels::F32ToF16(x.data(), h.data(), x.size());
  }
  return h;
}

std::vector<float> Widen(const std::vector<uint16_t>& h, DType t) {
  std::vector<float> x(h.size());
  if (t == DType::kBF16) {
    kernels::BF16ToF32(h.data(), x.data(), h.size());
  } else {
    kernels::F16ToF32(h.data(), x.data(), h.size());
  }
  return x;
}

// The problem's five weight matrices, 16-bit.
struct HalfWeights {
  std::vector<uint16_t> in_proj_w, wq, wk, wv, wo;
};

HalfWeights RoundWeights(Problem* p, DType t, bool round_problem) {
  HalfWeights h;
  std::vector<float>* src[5] = {&p->in_proj_w, &p->wq, &p->wk, &p->wv, &p->wo};
  std::vector<uint16_t>* dst[5] = {&h.in_proj_w, &h.wq, &h.wk, &h.wv, &h.wo};
  for (int i = 0; i < 5; ++i) {
    *dst[i] = ToHalf(*src[i], t);
    if (round_problem) *src[i] = Widen(*dst[i], t);
  }
  return h;
}

// 16-bit layer == f32 layer (without prepacking) on the rounded weights, bitwise; and close to
// the f32 layer (prepacked, the default) on the original weights.
void CheckProblem(Problem p, DType t, double* worst) {
  SCOPED_TRACE(p.Describe() + " weight_dtype " + DTypeName(t));
  Views exact;  // the f32 layer on the original weights
  RunLayerForward(p.config, WeightsOf(p), p.binding, p, 2, &exact);

  Problem rounded = p;
  const HalfWeights h = RoundWeights(&rounded, t, /*round_problem=*/true);
  // 16-bit weights are never prepacked (AttentionConfig::prepack): the bitwise twin is the f32
  // layer without prepacking. (`exact` keeps the default: it is compared within a bound.)
  rounded.config.prepack = WeightPrepack::kOff;
  Views ref;  // the f32 layer on the rounded weights
  RunLayerForward(rounded.config, WeightsOf(rounded), rounded.binding, rounded, 2, &ref);

  AttentionConfig c16 = p.config;
  c16.weight_dtype = t;
  Views copied;  // converted at creation from the f32 weights
  RunLayerForward(c16, WeightsOf(p), WeightBinding::kCopy, p, 2, &copied);
  ExpectSameBits(copied.output, ref.output, "kCopy output");
  ExpectSameBits(copied.weights, ref.weights, "kCopy attention weights");

  AttentionWeights w16 = WeightsOf(p);
  w16.dtype = t;
  if (w16.in_proj_weight) w16.in_proj_weight = h.in_proj_w.data();
  if (w16.q_proj_weight) {
    w16.q_proj_weight = h.wq.data();
    w16.k_proj_weight = h.wk.data();
    w16.v_proj_weight = h.wv.data();
  }
  w16.out_proj_weight = h.wo.data();
  Views viewed;  // the caller's 16-bit arrays
  RunLayerForward(c16, w16, WeightBinding::kView, p, 2, &viewed);
  // Against the f32 layer viewing the rounded weights: a view of separate q/k/v arrays cannot
  // fuse the three projections into one product as an owned copy does, which may change the
  // last bit in f32 too.
  Views ref_view;
  RunLayerForward(rounded.config, WeightsOf(rounded), WeightBinding::kView, rounded, 2, &ref_view);
  ExpectSameBits(viewed.output, ref_view.output, "kView output");

  const testing_util::OutputError e = MaxError(copied.output, exact.output);
  EXPECT_LE(e.err, Bound(t) * std::max(e.scale, 1e-3));
  if (e.scale > 0) *worst = std::max(*worst, e.err / e.scale);
}

TEST(Weights16Test, BitwiseEqualToF32OnRoundedWeights) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::mt19937 rng(2026);
    double worst = 0;
    for (int i = 0; i < 150; ++i) CheckProblem(RandomProblem(&rng), t, &worst);
    std::printf("[%s] worst output error / output scale vs f32 weights: %.3g (bound %.3g)\n",
                DTypeName(t), worst, Bound(t));
  }
}

// The long-sequence path (keys in chunks, output projection in place) with 16-bit weights: forced
// with small chunks, as attention_random_test does for f32.
TEST(Weights16Test, ChunkedLongSequencePath) {
  testing_util::ScopedKeyChunking chunking(3);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::mt19937 rng(31);
    double worst = 0;
    for (int i = 0; i < 40; ++i) {
      Problem p = RandomProblem(&rng);
      p.need_weights = false;  // the chunked path serves forwards without weights
      CheckProblem(p, t, &worst);
    }
  }
}

// CheckProblem on the kernels of each target (GEMV and packed GEMM paths).
class Weights16TargetTest : public test::PerTargetTest {};

TEST_P(Weights16TargetTest, BitwiseEqualToF32OnRoundedWeights) {
  std::mt19937 rng(99);
  double worst = 0;
  for (int i = 0; i < 12; ++i) {
    const DType t = i % 2 ? DType::kF16 : DType::kBF16;
    Problem p = RandomProblem(&rng);
    // Few rows take the GEMV path, more the packed GEMM: cover both.
    if (i % 3 == 0) p.L = p.S = 40;
    testing_util::FillProblem(&p, &rng);
    CheckProblem(p, t, &worst);
  }
}

MHA_INSTANTIATE_PER_TARGET(Weights16TargetTest);

TEST(Weights16Test, InvalidDtypes) {
  std::mt19937 rng(5);
  Problem p = RandomProblem(&rng);
  std::unique_ptr<MultiheadAttention> layer;
  AttentionConfig c = p.config;
  c.weight_dtype = DType::kU8;
  Status s = MultiheadAttention::Create(c, WeightsOf(p), WeightBinding::kCopy, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("config.weight_dtype: expected F32, BF16, F16, I8 or I4, got u8"),
            std::string::npos)
      << s.message();
  AttentionConfig bad_prepack = p.config;
  bad_prepack.prepack = static_cast<WeightPrepack>(4);
  s = MultiheadAttention::Create(bad_prepack, WeightsOf(p), WeightBinding::kCopy, &layer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prepack: expected kOn (0), kOff (1), kPlain (2) or kStrassen (3), "
                             "got 4"),
            std::string::npos)
      << s.message();
  AttentionWeights w = WeightsOf(p);
  w.dtype = DType::kBool;
  s = MultiheadAttention::Create(p.config, w, WeightBinding::kCopy, &layer);
  EXPECT_NE(s.message().find("weights.dtype: expected F32, BF16 or F16, got bool"),
            std::string::npos)
      << s.message();
  // A view cannot convert.
  c.weight_dtype = DType::kBF16;
  p.layout = QkvLayout::kPyTorch;
  s = MultiheadAttention::Create(c, WeightsOf(p), WeightBinding::kView, &layer);
  if (!(p.packed && p.layout == QkvLayout::kPerHead)) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("weights.dtype: a view binding uses the arrays as they are, so it "
                               "must equal config.weight_dtype (bf16), got f32"),
              std::string::npos)
        << s.message();
  }
}

// Decoding with a 16-bit layer equals decoding with the f32 layer on the rounded weights,
// bitwise (the decode step's projections take the GEMV path with one row).
TEST(Weights16Test, KvCacheDecodeBitwise) {
  const int64_t E = 64, H = 4, KVH = 2, T = 12;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  const int64_t kvE = E / H * KVH;
  std::vector<float> wq = fill(E * E), wk = fill(kvE * E), wv = fill(kvE * E), wo = fill(E * E);
  std::vector<float> b = fill(E + 2 * kvE), bo = fill(E);
  std::vector<float> x = fill(T * E);
  for (DType t : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    AttentionConfig c;
    c.embed_dim = E;
    c.num_heads = H;
    c.num_kv_heads = KVH;
    AttentionWeights w;
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.in_proj_bias = b.data();
    w.out_proj_weight = wo.data();
    w.out_proj_bias = bo.data();
    std::vector<float> rq = Widen(ToHalf(wq, t), t), rk = Widen(ToHalf(wk, t), t),
                       rv = Widen(ToHalf(wv, t), t), ro = Widen(ToHalf(wo, t), t);
    AttentionWeights wr = w;
    wr.q_proj_weight = rq.data();
    wr.k_proj_weight = rk.data();
    wr.v_proj_weight = rv.data();
    wr.out_proj_weight = ro.data();
    std::unique_ptr<MultiheadAttention> f32_layer, half_layer;
    // The bitwise twin of a 16-bit layer is the f32 layer without prepacked weights
    // (AttentionConfig::weight_dtype): a decode step's one-row projections multiply prepacked
    // weights where kernels::GemmDirectPackedB runs.
    AttentionConfig c32 = c;
    c32.prepack = WeightPrepack::kOff;
    ASSERT_TRUE(MultiheadAttention::Create(c32, wr, WeightBinding::kView, &f32_layer).ok());
    AttentionConfig c16 = c;
    c16.weight_dtype = t;
    ASSERT_TRUE(MultiheadAttention::Create(c16, w, WeightBinding::kCopy, &half_layer).ok());
    std::unique_ptr<Context> ctx;
    ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
    std::vector<float> outs[2];
    const MultiheadAttention* layers[2] = {f32_layer.get(), half_layer.get()};
    for (int l = 0; l < 2; ++l) {
      std::unique_ptr<KvCache> cache;
      ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*layers[l], 1, T), &cache).ok());
      outs[l].assign(T * E, 0.0f);
      for (int64_t i = 0; i < T; ++i) {
        TensorView xi, yi;
        const int64_t shape[3] = {1, 1, E};
        ASSERT_TRUE(TensorView::Dense(x.data() + i * E, DType::kF32, 3, shape, &xi).ok());
        ASSERT_TRUE(TensorView::Dense(outs[l].data() + i * E, DType::kF32, 3, shape, &yi).ok());
        const Status s = cache->Step(*ctx, *layers[l], xi, yi);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
    }
    ExpectSameBits(outs[1], outs[0], "decode output");
  }
}

}  // namespace
}  // namespace mha
