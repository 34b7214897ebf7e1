// The attention variants of issue #30 (RoPE, ALiBi, sliding window, softcap, sinks, QK-norm and
// explicit positions) through the whole operator, against the double reference
// (tests/reference/reference_attention.h states the exact conventions): each variant alone,
// random combinations with GQA/MQA, masks, causal, need_weights, 16-bit weights and the
// key-chunked path; windows around the kernel's block sizes; bitwise determinism across
// thread counts; Project's rotated q and k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

using testing_util::Close;
using testing_util::ExpectMatchesReference;
using testing_util::MakeViews;
using testing_util::MaskChoice;
using testing_util::OutputAt;
using testing_util::Problem;
using testing_util::RunForward;
using testing_util::ScopedKeyChunking;
using testing_util::Views;
using testing_util::WeightsOf;

using testing_util::Coin;
using testing_util::Pick;

bool UsesPositions(const AttentionConfig& c) {
  return c.rope != RopeStyle::kNone || c.alibi || c.window > 0;
}

// Rounds the problem's projection weights to bf16 and makes the layer store them as bf16
// (converted at creation, exactly, since they are bf16 values already): the reference then sees
// the very weights the layer uses.
void UseBf16Weights(Problem* p) {
  for (std::vector<float>* w : {&p->in_proj_w, &p->wq, &p->wk, &p->wv, &p->wo}) {
    std::vector<uint16_t> h(w->size());
    kernels::F32ToBF16(w->data(), h.data(), w->size());
    kernels::BF16ToF32(h.data(), w->data(), w->size());
  }
  p->config.weight_dtype = DType::kBF16;
  p->binding = WeightBinding::kCopy;
}

// Query positions of one batch entry, drawn as one of: an offset run (p0 + l), packed
// sequences (runs restarting at 0: non-monotone), or random values in [0, max_pos].
std::vector<int64_t> RandomPositions(int64_t len, int64_t max_offset, std::mt19937* rng) {
  std::vector<int64_t> pos(len);
  const int kind = static_cast<int>(Pick(rng, 0, 2));
  const int64_t offset = Pick(rng, 0, max_offset);
  int64_t next = offset;
  for (int64_t i = 0; i < len; ++i) {
    if (kind == 1 && i > 0 && Coin(rng, 0.25)) next = Pick(rng, 0, 3);  // a new packed sequence
    pos[i] = kind == 2 ? Pick(rng, 0, std::max<int64_t>(max_offset, len)) : next++;
  }
  return pos;
}

// Variant settings drawn onto a problem whose shapes and tensors are already set. `only`
// (0..6, kVariantNames) draws one variant alone; -1 draws a random combination.
void DrawVariants(Problem* pp, int only, std::mt19937* rng) {
  Problem& p = *pp;
  AttentionConfig& c = p.config;
  const int64_t H = c.num_heads, hd = c.embed_dim / H;
  const int64_t KVH = c.num_kv_heads ? c.num_kv_heads : H;
  // only == 6 (positions) carries them on a window.
  auto want = [&](int v, double prob) {
    return only == -1 ? Coin(rng, prob) : only == v || (only == 6 && v == 2);
  };
  if (want(0, 0.45) && hd >= 2) {
    c.rope = Coin(rng) ? RopeStyle::kNeox : RopeStyle::kGptj;
    const float thetas[4] = {0.0f, 10000.0f, 500000.0f, 100.0f};
    c.rope_theta = thetas[Pick(rng, 0, 3)];
    c.rotary_dim = (hd % 2 == 1 || Coin(rng, 0.4)) ? 2 * Pick(rng, 1, hd / 2) : 0;
    const float scales[4] = {0.0f, 1.0f, 2.0f, 0.5f};
    c.rope_scale = scales[Pick(rng, 0, 3)];
  }
  if (want(1, 0.3)) {
    c.alibi = true;
    if (Coin(rng, 0.3)) p.alibi_slopes = test::UniformFloats(H, 0.0f, 0.6f, rng);
  }
  if (want(2, 0.4)) {
    const int64_t span = std::max(p.L, p.S);
    const int64_t choices[5] = {1, 2, 3, std::max<int64_t>(1, span / 2), span + Pick(rng, 0, 3)};
    c.window = choices[Pick(rng, 0, 4)];
  }
  if (want(3, 0.3)) {
    const float caps[4] = {0.25f, 0.5f, 2.0f, 30.0f};
    c.softcap = caps[Pick(rng, 0, 3)];
  }
  if (want(4, 0.35)) {
    p.sinks = test::UniformFloats(H, -2.0f, 2.0f, rng);
    if (Coin(rng, 0.2)) p.sinks[Pick(rng, 0, H - 1)] = -std::numeric_limits<float>::infinity();
  }
  if (want(5, 0.3)) {
    c.qk_norm_whole = H > 1 && Coin(rng, 0.4);
    const float eps[3] = {0.0f, 1e-5f, 0.1f};
    c.qk_norm_eps = eps[Pick(rng, 0, 2)];
    p.q_norm = test::UniformFloats(c.qk_norm_whole ? H * hd : hd, 0.5f, 1.5f, rng);
    p.k_norm = test::UniformFloats(c.qk_norm_whole ? KVH * hd : hd, 0.5f, 1.5f, rng);
  }
  const bool positional = UsesPositions(c);
  // Keys appended by bias_kv / zero_attn have no position (Unsupported with the positional
  // variants) and are no projection (no QK-norm): these problems leave them out.
  if (positional || !p.q_norm.empty()) {
    c.add_bias_kv = false;
    c.add_zero_attn = false;
  }
  if (positional && (only == 6 || (only == -1 && Coin(rng, 0.5)))) {
    // ALiBi in f32 loses |p_i - p_j| * slope's low bits: offsets stay small where queries and
    // keys are far apart (cross-attention, packed or random positions).
    const int64_t max_offset = c.alibi ? 16 : 100000;
    p.positions_shared = p.batched && Coin(rng, 0.3);
    const int64_t rows = p.positions_shared ? 1 : p.N;
    for (int64_t n = 0; n < rows; ++n) {
      const std::vector<int64_t> pos = RandomPositions(p.L, max_offset, rng);
      p.positions.insert(p.positions.end(), pos.begin(), pos.end());
    }
    if (!p.self_attention && Coin(rng, 0.7)) {
      for (int64_t n = 0; n < p.N; ++n) {
        const std::vector<int64_t> pos = RandomPositions(p.S, max_offset, rng);
        p.key_positions.insert(p.key_positions.end(), pos.begin(), pos.end());
      }
    }
    if (Coin(rng, 0.3)) p.positions.clear();  // key positions alone
    if (p.positions.empty()) p.positions_shared = false;
    p.pos_dtype = Coin(rng) ? DType::kI32 : DType::kI64;
  }
}

// A random problem: shapes, GQA/MQA, masks, causal and weights like RandomProblem, then the
// variants.
Problem RandomVariantProblem(std::mt19937* rng, int64_t max_len, int only = -1) {
  Problem p;
  AttentionConfig& c = p.config;
  const int64_t H = Pick(rng, 1, 4);
  const int64_t hd = Coin(rng, 0.15) ? Pick(rng, 1, 3) : 2 * Pick(rng, 1, 4);
  c.num_heads = H;
  c.embed_dim = H * hd;
  p.packed = Coin(rng, 0.4);
  if (!p.packed && Coin(rng, 0.5)) {
    int64_t kvh = Coin(rng, 0.4) ? 1 : Pick(rng, 1, H);  // MQA or GQA
    while (H % kvh) --kvh;
    c.num_kv_heads = kvh;
  }
  p.layout = p.packed && Coin(rng, 0.3) ? QkvLayout::kPerHead : QkvLayout::kPyTorch;
  p.binding = Coin(rng, 0.3) ? WeightBinding::kCopy : WeightBinding::kView;
  c.bias = Coin(rng, 0.8);
  c.add_bias_kv = Coin(rng, 0.15);
  c.add_zero_attn = Coin(rng, 0.15);
  c.batch_first = Coin(rng);
  p.batched = Coin(rng, 0.8);
  p.N = p.batched ? Pick(rng, 1, 3) : 1;
  p.L = Pick(rng, 1, max_len);
  p.self_attention = Coin(rng, 0.5);
  if (!p.self_attention && !p.packed && Coin(rng, 0.4)) {
    c.kdim = Pick(rng, 1, 11);
    c.vdim = Pick(rng, 1, 11);
  }
  p.S = p.self_attention ? p.L : Pick(rng, 1, max_len);
  const int mask_pick = static_cast<int>(Pick(rng, 0, 4));
  p.attn = mask_pick == 1   ? MaskChoice::kBool
           : mask_pick == 2 ? MaskChoice::kFloat
                            : MaskChoice::kNone;
  p.attn_3d = p.attn != MaskChoice::kNone && Coin(rng, 0.3);
  const int kpm_pick = static_cast<int>(Pick(rng, 0, 3));
  p.kpm = kpm_pick == 1   ? MaskChoice::kBool
          : kpm_pick == 2 ? MaskChoice::kFloat
                          : MaskChoice::kNone;
  p.causal = Coin(rng, 0.4);
  p.need_weights = Coin(rng, 0.5);
  p.average = Coin(rng);
  p.row_pad = Coin(rng, 0.2) ? Pick(rng, 1, 3) : 0;
  testing_util::FillProblem(&p, rng);
  c.prepack = Coin(rng, 0.3) ? WeightPrepack::kOff : WeightPrepack::kOn;
  DrawVariants(&p, only, rng);
  if (Coin(rng, 0.15)) UseBf16Weights(&p);
  return p;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const Problem& p,
                    const char* what, size_t threads) {
  ASSERT_EQ(a.size(), b.size());
  if (a.empty()) return;
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
      << what << " differ between 1 and " << threads << " threads\n"
      << p.Describe();
}

const char* const kVariantNames[7] = {"rope",  "alibi",   "window",   "softcap",
                                      "sinks", "qk_norm", "positions"};

TEST(VariantsTest, EachVariantAloneMatchesReference) {
  std::mt19937 rng(3030);
  for (int only = 0; only < 7; ++only) {
    int tried = 0;
    for (int i = 0; i < 30; ++i) {
      const Problem p = RandomVariantProblem(&rng, 12, only);
      Views v;
      RunForward(p, 1 + i % 3, &v);
      if (HasFatalFailure()) return;
      ExpectMatchesReference(p, v);
      if (HasFailure()) {
        ADD_FAILURE() << kVariantNames[only] << " alone, problem #" << i;
        return;
      }
      tried += only != 0 || p.config.rope != RopeStyle::kNone;
    }
    EXPECT_GT(tried, 15) << kVariantNames[only];
  }
}

TEST(VariantsTest, RandomCombinationsMatchReference) {
  std::mt19937 rng(30);
  for (int i = 0; i < 600; ++i) {
    const Problem p = RandomVariantProblem(&rng, i % 10 == 0 ? 40 : 10);
    Views v;
    RunForward(p, 1 + i % 3, &v);
    if (HasFatalFailure()) return;
    ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i;
      return;
    }
  }
}

TEST(VariantsTest, KeyChunkedPathMatchesReference) {
  std::mt19937 rng(3031);
  for (int i = 0; i < 400; ++i) {
    Problem p = RandomVariantProblem(&rng, 40);
    p.need_weights = false;
    const int64_t chunk_keys = 1 + i % 9;
    ScopedKeyChunking forced(chunk_keys);
    Views v;
    RunForward(p, 1 + i % 3, &v);
    if (HasFatalFailure()) return;
    ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i << ", chunks of " << chunk_keys << " keys";
      return;
    }
  }
}

TEST(VariantsTest, BitwiseIdenticalForOneTwoThreeThreads) {
  std::mt19937 rng(3032);
  for (int i = 0; i < 100; ++i) {
    Problem p = RandomVariantProblem(&rng, 60);
    const int64_t chunk_keys = i % 2 ? 3 + i % 13 : 0;
    if (chunk_keys) p.need_weights = false;
    ScopedKeyChunking chunking(chunk_keys);
    Views v1, v2, v3;
    RunForward(p, 1, &v1);
    RunForward(p, 2, &v2);
    RunForward(p, 3, &v3);
    if (HasFatalFailure()) return;
    ExpectSameBits(v1.output, v2.output, p, "outputs", 2);
    ExpectSameBits(v1.output, v3.output, p, "outputs", 3);
    ExpectSameBits(v1.weights, v2.weights, p, "weights", 2);
    ExpectSameBits(v1.weights, v3.weights, p, "weights", 3);
    if (HasFatalFailure()) return;
  }
}

// The grouped forward (runtime/batch_groups.h) with every variant, QK-norm and RoPE applied in
// each group's buffers and explicit positions of the group's entries: the staged forward's bits
// on 1 and 2 threads, and the reference.
TEST(VariantsTest, GroupedForwardGivesTheStagedBits) {
  std::mt19937 rng(3033);
  int transformed = 0;  // grouped problems with QK-norm or RoPE
  for (int i = 0; i < 300; ++i) {
    Problem p = RandomVariantProblem(&rng, 30);
    p.need_weights = false;
    p.config.prepack = WeightPrepack::kOn;
    const size_t threads = 1 + i % 2;
    const size_t rows = static_cast<size_t>(p.L) * (1 + i % 3);
    testing_util::ExpectGroupedGivesStagedBits(p, threads, rows);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i;
      return;
    }
    const bool qk = p.config.rope != RopeStyle::kNone || !p.q_norm.empty();
    transformed += qk && testing_util::RunsGrouped(p, rows, threads);
  }
  if (testing_util::GroupingPossible()) {
    EXPECT_GT(transformed, 20);
  }
}

// Self-attention long enough for windows around the online path's key block (512) and the
// key chunk (1024), causal and not, with and without weights, unchunked and chunked; plus a
// window over explicit offset positions.
TEST(VariantsTest, WindowsAroundBlockSizes) {
  std::mt19937 rng(3033);
  Problem base;
  base.config.embed_dim = 8;
  base.config.num_heads = 2;
  base.config.batch_first = true;
  base.self_attention = true;
  base.L = base.S = 1030;
  testing_util::FillProblem(&base, &rng);
  const int64_t windows[10] = {1, 7, 16, 511, 512, 513, 1023, 1024, 1025, 1030};
  for (int i = 0; i < 10; ++i) {
    for (int mode = 0; mode < 4; ++mode) {
      Problem p = base;
      p.config.window = windows[i];
      p.causal = mode % 2 == 0;
      p.need_weights = mode == 3;
      if (mode == 1) {  // offset positions: the band follows positions, not indices
        p.positions.resize(p.L);
        for (int64_t l = 0; l < p.L; ++l) p.positions[l] = 70000 + l;
      }
      const int64_t chunk_keys = mode == 2 ? 100 : 0;
      ScopedKeyChunking chunking(chunk_keys);
      Views v;
      RunForward(p, 2, &v);
      if (HasFatalFailure()) return;
      ExpectMatchesReference(p, v);
      if (HasFailure()) {
        ADD_FAILURE() << "window " << windows[i] << " mode " << mode;
        return;
      }
    }
  }
}

// Without attention weights and key chunks the results overwrite Q's rows in the workspace
// (ForwardPlan::concat_in_q): a task may read its Q rows in place only while nothing has
// written them. The cases where something could: a sink's state zeroes the results before the
// first product; a window's band splits one key block into several; appended bias_kv / zero
// keys run as a block of their own; several query blocks per head (long L, 2 threads); Q apart
// from K and V (cross-attention) and sequence-major rows (the output projection reading the
// results at Q's padded row stride). Each against the double reference on 1 and 2 threads.
TEST(VariantsTest, ResultsOverQueryRowsMatchReference) {
  std::mt19937 rng(3040);
  for (int c = 0; c < 6; ++c) {
    Problem p;
    p.config.embed_dim = 64;
    // Case 1: two heads of one entry, so the query blocks (>= 4 per thread) start off the
    // window's key-block grid and a block's band straddles two key blocks.
    p.config.num_heads = c == 1 ? 2 : 4;
    p.config.batch_first = c != 5;
    p.self_attention = c != 4;
    p.N = c == 5 ? 3 : c == 1 ? 1 : 2;
    p.L = c == 1 ? 600 : 130;
    p.S = c == 4 ? 77 : p.L;
    p.causal = c == 1;
    p.config.window = c == 1 ? 7 : 0;
    p.config.add_bias_kv = c == 2;
    p.config.add_zero_attn = c == 2;
    testing_util::FillProblem(&p, &rng);
    if (c == 0) p.sinks = test::UniformFloats(p.config.num_heads, -2.0f, 2.0f, &rng);
    for (size_t threads : {size_t{1}, size_t{2}}) {
      Views v;
      RunForward(p, threads, &v);
      if (HasFatalFailure()) return;
      ExpectMatchesReference(p, v);
      if (HasFailure()) {
        ADD_FAILURE() << "case " << c << ", " << threads << " thread(s)";
        return;
      }
    }
  }
}

// Cross-attention with many keys (online key blocks, default chunking and chunks of 1024), key
// positions and every variant on.
TEST(VariantsTest, LongCrossAttentionWithKeyPositions) {
  std::mt19937 rng(3034);
  for (int variant = 0; variant < 4; ++variant) {
    Problem p;
    p.config.embed_dim = 16;
    p.config.num_heads = 4;
    p.config.num_kv_heads = variant == 1 ? 1 : 2;
    p.config.batch_first = variant % 2 == 0;
    p.packed = false;
    p.N = 2;
    p.L = 40;
    p.S = 1300;
    p.causal = variant >= 2;
    testing_util::FillProblem(&p, &rng);
    p.config.rope = variant % 2 ? RopeStyle::kGptj : RopeStyle::kNeox;
    p.config.window = variant == 3 ? 1024 : 600;
    p.config.softcap = 5.0f;
    p.config.alibi = variant != 2;
    p.sinks = test::UniformFloats(4, -1.0f, 1.0f, &rng);
    p.q_norm = test::UniformFloats(4, 0.5f, 1.5f, &rng);
    p.k_norm = test::UniformFloats(4, 0.5f, 1.5f, &rng);
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t l = 0; l < p.L; ++l) p.positions.push_back(1250 + l - 3 * n);
      for (int64_t s = 0; s < p.S; ++s) p.key_positions.push_back(s + 2 * n);
    }
    p.pos_dtype = variant % 2 ? DType::kI64 : DType::kI32;
    ScopedKeyChunking chunking(variant >= 2 ? 1024 : 0);
    Views v1, v2;
    RunForward(p, 2, &v2);
    RunForward(p, 1, &v1);
    if (HasFatalFailure()) return;
    ExpectMatchesReference(p, v2);
    ExpectSameBits(v1.output, v2.output, p, "outputs", 2);
    if (HasFailure()) return;
  }
}

// BLOOM-style left padding: the padded keys masked by a bool key_padding_mask, positions
// cumsum(mask) - 1 (0 on the padding), ALiBi and RoPE, causal; and the same sequence unpadded
// gives the same outputs on its real rows.
TEST(VariantsTest, LeftPaddedBatchWithCumsumPositions) {
  std::mt19937 rng(3039);
  Problem p;
  p.config.embed_dim = 16;
  p.config.num_heads = 4;
  p.config.batch_first = true;
  p.self_attention = true;
  p.N = 2;
  p.L = p.S = 9;
  p.causal = true;
  testing_util::FillProblem(&p, &rng);
  p.config.alibi = true;
  p.config.rope = RopeStyle::kNeox;
  const int64_t pad[2] = {0, 4};
  p.kpm = MaskChoice::kBool;
  p.kpm_b.assign(p.N * p.S, 0);
  for (int64_t n = 0; n < p.N; ++n) {
    for (int64_t l = 0; l < p.L; ++l) {
      p.positions.push_back(std::max<int64_t>(0, l - pad[n]));
      if (l < pad[n]) p.kpm_b[n * p.S + l] = 1;
    }
  }
  p.pos_dtype = DType::kI64;
  Views v;
  RunForward(p, 2, &v);
  if (HasFatalFailure()) return;
  ExpectMatchesReference(p, v);
  // Batch entry 1 unpadded: its 5 real tokens alone, positions 0..4.
  Problem alone = p;
  alone.N = 1;
  alone.L = alone.S = p.L - pad[1];
  alone.query.assign(p.query.begin() + (p.L + pad[1]) * 16, p.query.begin() + 2 * p.L * 16);
  alone.kpm = MaskChoice::kNone;
  alone.kpm_b.clear();
  alone.positions.clear();
  for (int64_t l = 0; l < alone.L; ++l) alone.positions.push_back(l);
  Views w;
  RunForward(alone, 2, &w);
  if (HasFatalFailure()) return;
  for (int64_t l = 0; l < alone.L; ++l)
    for (int64_t e = 0; e < 16; ++e) {
      EXPECT_NEAR(OutputAt(p, v.output, 1, pad[1] + l, e), OutputAt(alone, w.output, 0, l, e), 1e-5)
          << l << " " << e;
    }
}

// Project returns q and k as attention uses them: QK-norm, then RoPE at the given positions.
TEST(VariantsTest, ProjectReturnsNormalizedRotatedQk) {
  std::mt19937 rng(3035);
  int checked = 0;
  for (int i = 0; i < 60 && checked < 30; ++i) {
    Problem p = RandomVariantProblem(&rng, 12);
    if (p.config.rope == RopeStyle::kNone && p.q_norm.empty()) continue;
    ++checked;
    reference::Outputs ref;
    testing_util::RunReference(p, &ref);
    std::unique_ptr<MultiheadAttention> mha;
    ASSERT_TRUE(MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha).ok());
    std::unique_ptr<Context> ctx;
    ContextOptions opts;
    opts.num_threads = 2;
    ASSERT_TRUE(Context::Create(opts, &ctx).ok());
    Views v;
    MakeViews(p, &v);
    const int64_t H = p.config.num_heads, hd = p.config.embed_dim / H;
    const int64_t KVH = p.config.num_kv_heads ? p.config.num_kv_heads : H;
    const int64_t St = ref.total_src_len;
    std::vector<float> q(p.N * H * p.L * hd), k(p.N * KVH * St * hd), val(k.size());
    const int64_t qs[4] = {p.N, H, p.L, hd}, ks[4] = {p.N, KVH, St, hd};
    ProjectionOutputs po;
    ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &po.q).ok());
    ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, ks, &po.k).ok());
    ASSERT_TRUE(TensorView::Dense(val.data(), DType::kF32, 4, ks, &po.v).ok());
    const Status s = mha->Project(*ctx, v.in, po);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
    int bad = 0;
    for (size_t j = 0; j < q.size(); ++j) {
      if (!Close(q[j], ref.q[j]) && bad++ < 5) {
        ADD_FAILURE() << "q[" << j << "] = " << q[j] << ", want " << ref.q[j] << "\n"
                      << p.Describe();
      }
    }
    for (size_t j = 0; j < k.size(); ++j) {
      if (!Close(k[j], ref.k[j]) && bad++ < 5) {
        ADD_FAILURE() << "k[" << j << "] = " << k[j] << ", want " << ref.k[j] << "\n"
                      << p.Describe();
      }
    }
    if (HasFailure()) return;
  }
  EXPECT_GE(checked, 20);
}

// Neutral settings give the plain layer's results: W >= S' without causal is no window; sinks
// of -inf are none; ALiBi with zero slopes and RoPE with rotary positions all 0 change nothing.
TEST(VariantsTest, NeutralSettingsMatchThePlainLayer) {
  std::mt19937 rng(3036);
  for (int i = 0; i < 40; ++i) {
    Problem plain = testing_util::RandomProblem(&rng, 12);
    plain.config.add_bias_kv = plain.config.add_zero_attn = false;
    Views want;
    RunForward(plain, 2, &want);
    if (HasFatalFailure()) return;
    Problem p = plain;
    const int64_t H = p.config.num_heads;
    switch (i % 4) {
      case 0:
        p.config.window = std::max(p.L, p.S) + i;
        break;
      case 1:
        p.sinks.assign(H, -std::numeric_limits<float>::infinity());
        break;
      case 2:
        p.config.alibi = true;
        p.alibi_slopes.assign(H, 0.0f);
        break;
      default:
        if (p.config.embed_dim / H < 2) continue;
        p.config.rope = RopeStyle::kNeox;
        p.config.rotary_dim = p.config.embed_dim / H / 2 * 2;
        p.positions.assign(p.N * p.L, 0);
        if (!p.self_attention) p.key_positions.assign(p.N * p.S, 0);
        break;
    }
    Views got;
    RunForward(p, 2, &got);
    if (HasFatalFailure()) return;
    int bad = 0;
    for (size_t j = 0; j < want.output.size(); ++j) {
      if (!Close(got.output[j], want.output[j]) && bad++ < 3) {
        ADD_FAILURE() << "output[" << j << "] = " << got.output[j] << ", plain " << want.output[j]
                      << "\n"
                      << p.Describe();
      }
    }
    if (HasFailure()) return;
  }
}

// The softcap bends every logit, the appended bias_k key's too, on the unchunked and the
// key-chunked paths (where the appended keys form a block of their own).
TEST(VariantsTest, SoftcapCoversAppendedKeys) {
  for (int mode = 0; mode < 4; ++mode) {
    std::mt19937 rng(3038);
    Problem p;
    p.config.embed_dim = 4;
    p.config.num_heads = 1;
    p.config.batch_first = true;
    p.config.add_bias_kv = true;
    p.L = 3;
    p.S = 6;
    p.causal = mode % 2 == 1;
    testing_util::FillProblem(&p, &rng);
    for (float& x : p.bias_k) x *= 4;  // a large logit, which the cap visibly bends
    p.config.softcap = 0.5f;
    const bool chunked = mode >= 2;
    ScopedKeyChunking chunking(chunked ? 2 : 0);
    Views v;
    RunForward(p, 1, &v);
    if (HasFatalFailure()) return;
    ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << (chunked ? "key-chunked" : "unchunked") << ", causal " << p.causal;
      return;
    }
  }
}

// What cannot combine is refused: appended keys have no position.
TEST(VariantsTest, PositionalVariantsRefuseAppendedKeys) {
  std::mt19937 rng(3037);
  Problem p;
  p.config.embed_dim = 8;
  p.config.num_heads = 2;
  p.config.add_bias_kv = true;
  testing_util::FillProblem(&p, &rng);
  for (int v = 0; v < 3; ++v) {
    Problem q = p;
    AttentionConfig& c = q.config;
    c.rope = v == 0 ? RopeStyle::kNeox : RopeStyle::kNone;
    c.alibi = v == 1;
    c.window = v == 2 ? 4 : 0;
    for (bool zero_attn : {false, true}) {
      c.add_bias_kv = !zero_attn;
      c.add_zero_attn = zero_attn;
      std::unique_ptr<MultiheadAttention> mha;
      const Status s = MultiheadAttention::Create(c, WeightsOf(q), WeightBinding::kCopy, &mha);
      EXPECT_EQ(s.code(), StatusCode::kUnsupported) << v << " " << zero_attn << " " << s.ToString();
    }
  }
}

// Random combinations, unchunked and key-chunked, on each SIMD target compiled in and supported
// here (the kernels' dispatch forced to the test's target).
class VariantsTargetTest : public test::PerTargetTest {};

TEST_P(VariantsTargetTest, RandomCombinationsMatchReference) {
  std::mt19937 rng(3040);
  for (int i = 0; i < 60; ++i) {
    Problem p = RandomVariantProblem(&rng, i % 5 == 0 ? 40 : 10);
    const int64_t chunk_keys = i % 2 ? 1 + i % 7 : 0;
    if (chunk_keys) p.need_weights = false;
    ScopedKeyChunking chunking(chunk_keys);
    Views v;
    RunForward(p, 1 + i % 3, &v);
    if (HasFatalFailure()) return;
    ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << "target " << target_name() << ", random problem #" << i;
      return;
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(VariantsTargetTest);

}  // namespace
}  // namespace mha
