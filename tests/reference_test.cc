// The double-precision reference against cases small enough to work out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tests/reference/reference_attention.h"

namespace mha {
namespace reference {
namespace {

// Identity projections with zero biases, embed_dim 2.
Weights Identity2(bool bias) {
  Weights w;
  w.wq = w.wk = w.wv = w.wo = {1, 0, 0, 1};
  if (bias) w.bq = w.bk = w.bv = w.bo = {0, 0};
  return w;
}

Inputs TwoKeys() {
  Inputs in;
  in.batch = 1;
  in.tgt_len = 1;
  in.src_len = 2;
  in.query = {1, 0};
  in.key = {1, 0, 0, 0};
  in.value = {1, 2, 3, 4};
  return in;
}

TEST(ReferenceTest, SingleHeadTwoKeys) {
  Config c;
  c.embed_dim = 2;
  Outputs out;
  Attention(c, Identity2(true), TwoKeys(), &out);
  // scores = [q.k0, q.k1] / sqrt(2) = [1/sqrt(2), 0]
  const double a = std::exp(1.0 / std::sqrt(2.0));
  const double p0 = a / (a + 1), p1 = 1 / (a + 1);
  ASSERT_EQ(out.output.size(), 2u);
  EXPECT_NEAR(out.output[0], p0 * 1 + p1 * 3, 1e-12);
  EXPECT_NEAR(out.output[1], p0 * 2 + p1 * 4, 1e-12);
  EXPECT_NEAR(out.head_weights[0], p0, 1e-12);
  EXPECT_NEAR(out.head_weights[1], p1, 1e-12);
  EXPECT_NEAR(out.mean_weights[0], p0, 1e-12);
}

TEST(ReferenceTest, TwoHeadsOfDimOne) {
  Config c;
  c.embed_dim = 2;
  c.num_heads = 2;  // head 0 sees dim 0, head 1 sees dim 1; scale = 1
  Inputs in = TwoKeys();
  in.query = {1, 2};
  in.key = {1, 1, 0, 3};
  Outputs out;
  Attention(c, Identity2(false), in, &out);
  // head 0: scores [1, 0]; head 1: scores [2, 6]
  const double h0 = std::exp(1.0) / (std::exp(1.0) + 1);
  const double h1 = std::exp(2.0) / (std::exp(2.0) + std::exp(6.0));
  EXPECT_NEAR(out.output[0], h0 * 1 + (1 - h0) * 3, 1e-12);
  EXPECT_NEAR(out.output[1], h1 * 2 + (1 - h1) * 4, 1e-12);
  EXPECT_NEAR(out.mean_weights[0], (h0 + h1) / 2, 1e-12);
  EXPECT_NEAR(out.head_weights[2], h1, 1e-12);  // [n=0, h=1, l=0, s=0]
}

TEST(ReferenceTest, BoolMaskTrueMeansMaskedOut) {
  Config c;
  c.embed_dim = 2;
  Inputs in = TwoKeys();
  in.attn_mask_kind = MaskKind::kBool;
  in.attn_mask = {0, 1};  // mask key 1
  Outputs out;
  Attention(c, Identity2(true), in, &out);
  EXPECT_DOUBLE_EQ(out.head_weights[0], 1.0);
  EXPECT_DOUBLE_EQ(out.head_weights[1], 0.0);
  EXPECT_DOUBLE_EQ(out.output[0], 1.0);
  EXPECT_DOUBLE_EQ(out.output[1], 2.0);
}

TEST(ReferenceTest, FloatMaskIsAdded) {
  Config c;
  c.embed_dim = 2;
  Inputs in = TwoKeys();
  in.key_padding_mask_kind = MaskKind::kFloat;
  in.key_padding_mask = {0, 1.0 / std::sqrt(2.0)};  // makes both scores equal
  Outputs out;
  Attention(c, Identity2(true), in, &out);
  EXPECT_NEAR(out.head_weights[0], 0.5, 1e-12);
  EXPECT_NEAR(out.output[0], 2.0, 1e-12);
}

TEST(ReferenceTest, FullyMaskedRowGivesZeroWeightsAndBiasOutput) {
  Config c;
  c.embed_dim = 2;
  Weights w = Identity2(true);
  w.bo = {0.5, -0.25};
  Inputs in = TwoKeys();
  in.key_padding_mask_kind = MaskKind::kBool;
  in.key_padding_mask = {1, 1};
  Outputs out;
  Attention(c, w, in, &out);
  EXPECT_EQ(out.head_weights[0], 0.0);
  EXPECT_EQ(out.head_weights[1], 0.0);
  EXPECT_EQ(out.output[0], 0.5);
  EXPECT_EQ(out.output[1], -0.25);
}

TEST(ReferenceTest, CausalMasksLaterKeys) {
  Config c;
  c.embed_dim = 2;
  c.causal = true;
  Inputs in = TwoKeys();
  in.tgt_len = 2;
  in.query = {1, 0, 1, 0};
  Outputs out;
  Attention(c, Identity2(true), in, &out);
  // Query 0 sees only key 0; query 1 sees both.
  EXPECT_DOUBLE_EQ(out.head_weights[0], 1.0);
  EXPECT_DOUBLE_EQ(out.head_weights[1], 0.0);
  EXPECT_GT(out.head_weights[3], 0.0);
}

TEST(ReferenceTest, AddZeroAttnAndBiasKv) {
  Config c;
  c.embed_dim = 2;
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  Weights w = Identity2(true);
  w.bias_k = {0, 0};
  w.bias_v = {10, 20};
  Inputs in = TwoKeys();
  in.key = {0, 0, 0, 0};  // all scores 0: uniform over 2 keys + bias_kv + zero_attn
  Outputs out;
  Attention(c, w, in, &out);
  ASSERT_EQ(out.total_src_len, 4);
  for (int s = 0; s < 4; ++s) EXPECT_NEAR(out.head_weights[s], 0.25, 1e-12);
  EXPECT_NEAR(out.output[0], (1 + 3 + 10 + 0) / 4.0, 1e-12);
  EXPECT_NEAR(out.output[1], (2 + 4 + 20 + 0) / 4.0, 1e-12);
}

TEST(ReferenceTest, GroupedQueryRepeatsKvHeads) {
  Config c;
  c.embed_dim = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;  // head_dim 1, both query heads share K/V head 0
  Weights w;
  w.wq = {1, 0, 0, 1};
  w.wk = {1, 0};  // [kvE=1, kdim=2]
  w.wv = {1, 0};
  w.wo = {1, 0, 0, 1};
  Inputs in = TwoKeys();
  in.query = {1, 1};
  Outputs out;
  Attention(c, w, in, &out);
  // Both heads: scores [1, 0] against keys' dim 0; values' dim 0 = [1, 3].
  const double p = std::exp(1.0) / (std::exp(1.0) + 1);
  EXPECT_NEAR(out.output[0], p * 1 + (1 - p) * 3, 1e-12);
  EXPECT_NEAR(out.output[1], p * 1 + (1 - p) * 3, 1e-12);
}

// ---- Attention variants (issue #30 "Exact conventions") ----

TEST(ReferenceVariantsTest, StandardAlibiSlopesMatchThePaperTable) {
  // get_slopes(n) of the ALiBi paper, written out: powers of two give 2^(-8(h+1)/n); otherwise
  // the closest power of two cp's slopes, then get_slopes(2cp)[0::2][:n-cp].
  const std::vector<std::vector<double>> exponents = {
      {-8},                                                      // H = 1
      {-4, -8},                                                  // 2
      {-4, -8, -2},                                              // 3
      {-2, -4, -6, -8},                                          // 4
      {-2, -4, -6, -8, -1},                                      // 5
      {-2, -4, -6, -8, -1, -3},                                  // 6
      {-2, -4, -6, -8, -1, -3, -5},                              // 7
      {-1, -2, -3, -4, -5, -6, -7, -8},                          // 8
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5},                    // 9
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5},              // 10
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5},        // 11
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5},  // 12
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5, -4.5},
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5, -4.5, -5.5},
      {-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5, -4.5, -5.5, -6.5},
      {-0.5, -1, -1.5, -2, -2.5, -3, -3.5, -4, -4.5, -5, -5.5, -6, -6.5, -7, -7.5, -8},
  };
  for (size_t i = 0; i < exponents.size(); ++i) {
    const int64_t H = static_cast<int64_t>(i) + 1;
    const std::vector<double> got = StandardAlibiSlopes(H);
    ASSERT_EQ(got.size(), exponents[i].size()) << "H=" << H;
    for (size_t h = 0; h < got.size(); ++h) {
      EXPECT_DOUBLE_EQ(got[h], std::exp2(exponents[i][h])) << "H=" << H << " h=" << h;
    }
  }
}

// A random single-batch self-attention problem with E = H * hd and L tokens.
struct Random {
  Config c;
  Weights w;
  Inputs in;
};

Random RandomSelf(int64_t H, int64_t hd, int64_t L, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  auto vec = [&](size_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = u(rng);
    return v;
  };
  Random r;
  const int64_t E = H * hd;
  r.c.embed_dim = E;
  r.c.num_heads = H;
  r.w.wq = vec(E * E);
  r.w.wk = vec(E * E);
  r.w.wv = vec(E * E);
  r.w.wo = vec(E * E);
  r.w.bq = vec(E);
  r.w.bk = vec(E);
  r.w.bv = vec(E);
  r.w.bo = vec(E);
  r.in.batch = 1;
  r.in.tgt_len = r.in.src_len = L;
  r.in.query = vec(L * E);
  r.in.key = r.in.value = r.in.query;
  r.in.self_attention = true;
  return r;
}

Outputs Solve(const Random& r) {
  Outputs out;
  Attention(r.c, r.w, r.in, &out);
  return out;
}

TEST(ReferenceVariantsTest, WindowOfOneGivesTheRowsOwnValue) {
  Random r = RandomSelf(2, 3, 5, 1);
  r.c.window = 1;
  for (bool causal : {false, true}) {
    r.c.causal = causal;
    const Outputs out = Solve(r);
    const int64_t L = 5, H = 2;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t s = 0; s < L; ++s)
          EXPECT_EQ(out.head_weights[(h * L + l) * L + s], s == l ? 1.0 : 0.0);
    // Attention output before the output projection is v of the row itself.
    Config plain = r.c;
    plain.window = 0;
    Inputs diag = r.in;
    diag.attn_mask_kind = MaskKind::kBool;
    diag.attn_mask.assign(L * L, 1.0);
    for (int64_t l = 0; l < L; ++l) diag.attn_mask[l * L + l] = 0;
    Outputs want;
    Attention(plain, r.w, diag, &want);
    for (size_t i = 0; i < want.output.size(); ++i)
      EXPECT_NEAR(out.output[i], want.output[i], 1e-12);
  }
}

TEST(ReferenceVariantsTest, WindowPredicates) {
  Random r = RandomSelf(1, 2, 9, 2);
  r.in.positions = {3, 4, 5, 6, 7, 8, 9, 10, 11};  // offsets do not change the band
  for (bool causal : {false, true}) {
    r.c.causal = causal;
    r.c.window = 3;
    const Outputs out = Solve(r);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t j = 0; j < 9; ++j) {
        const bool visible = causal ? (i - 3 < j && j <= i) : std::abs(i - j) < 3;
        EXPECT_EQ(out.head_weights[i * 9 + j] > 0, visible) << i << " " << j;
      }
    r.c.window = 9;  // W >= S: no window
    const Outputs wide = Solve(r);
    r.c.window = 0;
    const Outputs none = Solve(r);
    for (size_t i = 0; i < none.output.size(); ++i) EXPECT_EQ(wide.output[i], none.output[i]);
  }
}

TEST(ReferenceVariantsTest, HugeSoftcapIsNone) {
  Random r = RandomSelf(2, 4, 6, 3);
  r.c.causal = true;
  const Outputs none = Solve(r);
  r.c.softcap = 1e30;
  const Outputs capped = Solve(r);
  for (size_t i = 0; i < none.output.size(); ++i)
    EXPECT_NEAR(capped.output[i], none.output[i], 1e-12);
  // A small cap bounds every logit: weights differ, and match an explicit c * tanh(s / c).
  r.c.softcap = 0.5;
  const Outputs small = Solve(r);
  double diff = 0;
  for (size_t i = 0; i < none.head_weights.size(); ++i)
    diff = std::max(diff, std::abs(small.head_weights[i] - none.head_weights[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(ReferenceVariantsTest, SoftcapByHand) {
  Config c;
  c.embed_dim = 2;
  c.softcap = 0.3;
  Outputs out;
  Attention(c, Identity2(true), TwoKeys(), &out);
  const double s0 = 0.3 * std::tanh(1.0 / std::sqrt(2.0) / 0.3);  // s1 = 0
  const double p0 = std::exp(s0) / (std::exp(s0) + 1);
  EXPECT_NEAR(out.head_weights[0], p0, 1e-12);
  EXPECT_NEAR(out.output[0], p0 * 1 + (1 - p0) * 3, 1e-12);
}

TEST(ReferenceVariantsTest, SinkByHand) {
  Config c;
  c.embed_dim = 2;
  c.sinks = {0.7};
  Outputs out;
  Attention(c, Identity2(true), TwoKeys(), &out);
  const double a = std::exp(1.0 / std::sqrt(2.0)), z = a + 1 + std::exp(0.7);
  EXPECT_NEAR(out.head_weights[0], a / z, 1e-12);
  EXPECT_NEAR(out.head_weights[1], 1 / z, 1e-12);
  EXPECT_NEAR(out.output[0], (a * 1 + 3) / z, 1e-12);
  EXPECT_NEAR(out.output[1], (a * 2 + 4) / z, 1e-12);
}

TEST(ReferenceVariantsTest, MinusInfinitySinkIsNone) {
  Random r = RandomSelf(3, 2, 5, 4);
  const Outputs none = Solve(r);
  r.c.sinks.assign(3, -std::numeric_limits<double>::infinity());
  const Outputs sunk = Solve(r);
  EXPECT_EQ(sunk.output, none.output);
  EXPECT_EQ(sunk.head_weights, none.head_weights);
}

TEST(ReferenceVariantsTest, AllMaskedRowWithSinkGivesZeros) {
  Config c;
  c.embed_dim = 2;
  c.sinks = {2.0};
  Weights w = Identity2(true);
  Inputs in = TwoKeys();
  in.key_padding_mask_kind = MaskKind::kBool;
  in.key_padding_mask = {1, 1};
  Outputs out;
  Attention(c, w, in, &out);
  EXPECT_EQ(out.head_weights[0], 0.0);
  EXPECT_EQ(out.head_weights[1], 0.0);
  EXPECT_EQ(out.output[0], 0.0);
  EXPECT_EQ(out.output[1], 0.0);
}

TEST(ReferenceVariantsTest, AlibiByHand) {
  // Two queries and keys at positions 0 and 5, one head (slope 2^-8); all q.k = 0 so the
  // scores are the biases alone.
  Config c;
  c.embed_dim = 2;
  c.alibi = true;
  Inputs in = TwoKeys();
  in.tgt_len = 2;
  in.query = {0, 0, 0, 0};
  in.positions = {0, 5};
  in.key_positions = {0, 5};
  Outputs out;
  Attention(c, Identity2(true), in, &out);
  const double m = std::exp2(-8.0), far = std::exp(-5 * m);
  EXPECT_NEAR(out.head_weights[0], 1 / (1 + far), 1e-12);
  EXPECT_NEAR(out.head_weights[1], far / (1 + far), 1e-12);
  EXPECT_NEAR(out.head_weights[2], far / (1 + far), 1e-12);  // |p_i - p_j|: symmetric
  c.alibi_slopes = {0.25};
  Attention(c, Identity2(true), in, &out);
  EXPECT_NEAR(out.head_weights[1], std::exp(-1.25) / (1 + std::exp(-1.25)), 1e-12);
}

TEST(ReferenceVariantsTest, AlibiIsShiftInvariant) {
  Random r = RandomSelf(4, 2, 6, 5);
  r.c.alibi = true;
  r.c.causal = true;
  const Outputs base = Solve(r);
  r.in.positions = {100, 101, 102, 103, 104, 105};
  const Outputs shifted = Solve(r);
  for (size_t i = 0; i < base.output.size(); ++i)
    EXPECT_NEAR(shifted.output[i], base.output[i], 1e-12);
}

TEST(ReferenceVariantsTest, RopeAtPositionZeroIsIdentity) {
  Random r = RandomSelf(2, 6, 1, 6);
  const Outputs plain = Solve(r);
  for (Rope style : {Rope::kNeox, Rope::kGptj}) {
    r.c.rope = style;
    const Outputs rot = Solve(r);
    EXPECT_EQ(rot.q, plain.q);
    EXPECT_EQ(rot.k, plain.k);
    EXPECT_EQ(rot.output, plain.output);
  }
}

TEST(ReferenceVariantsTest, RopeByHand) {
  // One head of dim 4, rd = 4, theta = 100, position 3, scale 2: angles 1.5 and 1.5 / 10.
  Config c;
  c.embed_dim = 4;
  c.rope = Rope::kNeox;
  c.rope_theta = 100;
  c.rope_scale = 2;
  Weights w;
  w.wq = w.wk = w.wv = w.wo = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  Inputs in;
  in.src_len = 1;
  in.query = {1, 2, 3, 4};
  in.key = in.value = in.query;
  in.positions = {3};
  in.key_positions = {3};
  Outputs out;
  Attention(c, w, in, &out);
  const double a0 = 1.5, a1 = 0.15;
  const double neox[4] = {1 * std::cos(a0) - 3 * std::sin(a0), 2 * std::cos(a1) - 4 * std::sin(a1),
                          3 * std::cos(a0) + 1 * std::sin(a0), 4 * std::cos(a1) + 2 * std::sin(a1)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out.q[i], neox[i], 1e-12) << i;
  c.rope = Rope::kGptj;
  Attention(c, w, in, &out);
  const double gptj[4] = {1 * std::cos(a0) - 2 * std::sin(a0), 2 * std::cos(a0) + 1 * std::sin(a0),
                          3 * std::cos(a1) - 4 * std::sin(a1), 4 * std::cos(a1) + 3 * std::sin(a1)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out.q[i], gptj[i], 1e-12) << i;
  // Partial rotary: rd = 2 rotates (x0, x1) with angle 1.5 in both styles; x2, x3 stay.
  c.rotary_dim = 2;
  for (Rope style : {Rope::kNeox, Rope::kGptj}) {
    c.rope = style;
    Attention(c, w, in, &out);
    EXPECT_NEAR(out.q[0], 1 * std::cos(a0) - 2 * std::sin(a0), 1e-12);
    EXPECT_NEAR(out.q[1], 2 * std::cos(a0) + 1 * std::sin(a0), 1e-12);
    EXPECT_EQ(out.q[2], 3);
    EXPECT_EQ(out.q[3], 4);
  }
}

TEST(ReferenceVariantsTest, GptjIsNeoxConjugatedByTheDeinterleavePermutation) {
  // P maps interleaved (x0, x1, x2, x3, ...) to halves (x0, x2, ..., x1, x3, ...); permuting the
  // rows of wq and wk by P makes the neox-rotated projection equal P times the gptj-rotated one.
  const int64_t H = 2, hd = 6, E = H * hd, L = 4;
  Random r = RandomSelf(H, hd, L, 7);
  r.c.rotary_dim = 4;             // the permutation acts on the rotated components only
  std::vector<int64_t> perm(hd);  // perm[new] = old, within one head
  for (int64_t i = 0; i < 2; ++i) {
    perm[i] = 2 * i;
    perm[i + 2] = 2 * i + 1;
  }
  for (int64_t i = 4; i < hd; ++i) perm[i] = i;
  Random permuted = r;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < hd; ++d) {
      const int64_t to = h * hd + d, from = h * hd + perm[d];
      for (int64_t i = 0; i < E; ++i) {
        permuted.w.wq[to * E + i] = r.w.wq[from * E + i];
        permuted.w.wk[to * E + i] = r.w.wk[from * E + i];
      }
      permuted.w.bq[to] = r.w.bq[from];
      permuted.w.bk[to] = r.w.bk[from];
    }
  r.in.positions = {0, 7, 3, 100};
  permuted.in.positions = r.in.positions;
  r.c.rope = Rope::kGptj;
  permuted.c.rope = Rope::kNeox;
  const Outputs gptj = Solve(r), neox = Solve(permuted);
  for (int64_t row = 0; row < H * L; ++row)
    for (int64_t d = 0; d < hd; ++d) {
      EXPECT_NEAR(neox.q[row * hd + d], gptj.q[row * hd + perm[d]], 1e-12);
      EXPECT_NEAR(neox.k[row * hd + d], gptj.k[row * hd + perm[d]], 1e-12);
    }
  // q.k is invariant under the same permutation of both: identical attention.
  for (size_t i = 0; i < gptj.output.size(); ++i)
    EXPECT_NEAR(neox.output[i], gptj.output[i], 1e-12);
}

TEST(ReferenceVariantsTest, RopeScoresDependOnRelativePositionOnly) {
  for (Rope style : {Rope::kNeox, Rope::kGptj}) {
    Random r = RandomSelf(2, 8, 5, 8);
    r.c.rope = style;
    r.c.rotary_dim = 6;
    r.c.causal = true;
    r.in.positions = {0, 1, 2, 3, 4};
    const Outputs base = Solve(r);
    r.in.positions = {1000, 1001, 1002, 1003, 1004};
    const Outputs shifted = Solve(r);
    EXPECT_NE(base.q, shifted.q);
    for (size_t i = 0; i < base.head_weights.size(); ++i)
      EXPECT_NEAR(shifted.head_weights[i], base.head_weights[i], 1e-10);
    for (size_t i = 0; i < base.output.size(); ++i)
      EXPECT_NEAR(shifted.output[i], base.output[i], 1e-10);
  }
}

TEST(ReferenceVariantsTest, QkNormByHand) {
  Config c;
  c.embed_dim = 2;
  c.q_norm = {2, 3};
  c.k_norm = {1, 1};
  c.qk_norm_eps = 0.25;
  Inputs in = TwoKeys();
  in.query = {3, 4};
  Outputs out;
  Attention(c, Identity2(true), in, &out);
  const double rq = std::sqrt((9 + 16) / 2.0 + 0.25);
  EXPECT_NEAR(out.q[0], 3 / rq * 2, 1e-12);
  EXPECT_NEAR(out.q[1], 4 / rq * 3, 1e-12);
  EXPECT_NEAR(out.k[0], 1 / std::sqrt(0.5 + 0.25), 1e-12);
  EXPECT_EQ(out.k[2], 0);  // key 1 is zero
}

TEST(ReferenceVariantsTest, QkNormWholeSpansEveryHead) {
  // Per head and whole differ as soon as heads have different norms; whole with H = 1 is per head.
  Random r = RandomSelf(2, 3, 3, 9);
  r.c.q_norm = r.c.k_norm = {1.5, 0.5, 1.0, 2.0, 0.25, 1.0};
  r.c.qk_norm_whole = true;
  const Outputs whole = Solve(r);
  double ss = 0;
  Random raw = r;
  raw.c.q_norm.clear();
  raw.c.k_norm.clear();
  const Outputs plain = Solve(raw);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t d = 0; d < 3; ++d)
      ss += plain.q[(h * 3 + 0) * 3 + d] * plain.q[(h * 3 + 0) * 3 + d];
  const double inv = 1 / std::sqrt(ss / 6 + 1e-6);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t d = 0; d < 3; ++d)
      EXPECT_NEAR(whole.q[(h * 3 + 0) * 3 + d],
                  plain.q[(h * 3 + 0) * 3 + d] * inv * r.c.q_norm[h * 3 + d], 1e-12);
}

TEST(ReferenceVariantsTest, QkNormIsInputScaleInvariantWithoutBias) {
  Random r = RandomSelf(2, 4, 4, 10);
  r.w.bq.clear();
  r.w.bk.clear();
  r.w.bv.clear();
  r.w.bo.clear();
  r.c.bias = false;
  r.c.q_norm = {1, 2, 3, 4};
  r.c.k_norm = {0.5, 1, 1, 2};
  r.c.qk_norm_eps = 1e-300;
  const Outputs base = Solve(r);
  Random scaled = r;
  for (double& x : scaled.in.query) x *= 7;
  scaled.in.key = scaled.in.value = scaled.in.query;
  const Outputs big = Solve(scaled);
  for (size_t i = 0; i < base.head_weights.size(); ++i)
    EXPECT_NEAR(big.head_weights[i], base.head_weights[i], 1e-12);
}

}  // namespace
}  // namespace reference
}  // namespace mha
