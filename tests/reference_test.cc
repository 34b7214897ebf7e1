// The double-precision reference against cases small enough to work out by hand.
#include "tests/reference/reference_attention.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace reference
}  // namespace mha
