// Operator validation: every bad argument is an InvalidArgument (or OutOfMemory) whose message
// names the argument and the expected and actual values, and outputs stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "mha/mha.hpp"
#include "tests/attention_test_util.h"

namespace mha {
namespace {

using testing_util::MaskChoice;
using testing_util::Problem;

struct Fixture {
  Problem p;
  std::unique_ptr<MultiheadAttention> mha;
  std::unique_ptr<Context> ctx;
  testing_util::Views v;
};

void MakeFixture(Fixture* f, bool weights = true, MaskChoice attn = MaskChoice::kBool,
                 MaskChoice kpm = MaskChoice::kFloat) {
  std::mt19937 rng(11);
  f->p.config.embed_dim = 8;
  f->p.config.num_heads = 2;
  f->p.config.batch_first = true;
  f->p.N = 2;
  f->p.L = 3;
  f->p.S = 5;
  f->p.attn = attn;
  f->p.kpm = kpm;
  f->p.need_weights = weights;
  testing_util::FillProblem(&f->p, &rng);
  ASSERT_TRUE(MultiheadAttention::Create(f->p.config, testing_util::WeightsOf(f->p),
                                         WeightBinding::kView, &f->mha).ok());
  ContextOptions o;
  o.num_threads = 2;
  ASSERT_TRUE(Context::Create(o, &f->ctx).ok());
  testing_util::MakeViews(f->p, &f->v);
}

// Runs Forward, expects failure with every fragment in the message, and checks that neither
// output was written (they start as NaN).
void ExpectError(Fixture& f, const AttentionInputs& in, const AttentionOutputs& out,
                 std::vector<std::string> fragments, StatusCode code = StatusCode::kInvalidArgument) {
  Status s = f.mha->Forward(*f.ctx, in, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const std::string& frag : fragments) {
    EXPECT_NE(s.message().find(frag), std::string::npos) << "'" << frag << "' not in: " << s.message();
  }
  for (float x : f.v.output) ASSERT_TRUE(std::isnan(x)) << "output written on error";
  for (float x : f.v.weights) ASSERT_TRUE(std::isnan(x)) << "weights written on error";
  size_t bytes = 0;
  EXPECT_EQ(f.mha->Plan(in, out, 2, &bytes).code(), code);
}

TEST(AttentionValidationTest, ConfigErrors) {
  AttentionWeights w;
  float dummy[64] = {};
  w.in_proj_weight = dummy;
  w.out_proj_weight = dummy;
  w.in_proj_bias = dummy;
  w.out_proj_bias = dummy;
  std::unique_ptr<MultiheadAttention> m;
  AttentionConfig c;
  c.embed_dim = 6;
  c.num_heads = 4;
  Status s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("embed_dim: expected a multiple of num_heads (4), got 6"), std::string::npos) << s.message();
  c.num_heads = 0;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("num_heads: expected > 0, got 0"), std::string::npos) << s.message();
  c.num_heads = 2;
  c.embed_dim = -4;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("embed_dim: expected > 0, got -4"), std::string::npos) << s.message();
  c.embed_dim = 4;
  c.num_kv_heads = 3;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("num_kv_heads"), std::string::npos) << s.message();
  c.num_kv_heads = 0;
  c.kdim = int64_t{1} << 40;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("kdim: expected 1.."), std::string::npos) << s.message();
  c.kdim = 0;
  c.scale = std::nanf("");
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("scale"), std::string::npos) << s.message();
  c.scale = 0;
  AttentionWeights none;
  s = MultiheadAttention::Create(c, none, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("expected in_proj_weight"), std::string::npos) << s.message();
  AttentionWeights both = w;
  both.q_proj_weight = dummy;
  s = MultiheadAttention::Create(c, both, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("got both"), std::string::npos) << s.message();
  AttentionWeights nobias = w;
  nobias.in_proj_bias = nullptr;
  s = MultiheadAttention::Create(c, nobias, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("bias is true"), std::string::npos) << s.message();
  c.add_bias_kv = true;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("add_bias_kv"), std::string::npos) << s.message();
  c.add_bias_kv = false;
  c.kdim = 3;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("in_proj_weight: a packed"), std::string::npos) << s.message();
  EXPECT_EQ(MultiheadAttention::Create(c, w, WeightBinding::kView, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m, nullptr);
}

// head_dim and per-projection biases: each error names the field, the expected and the actual.
TEST(AttentionValidationTest, HeadWidthAndProjectionBiasErrors) {
  float dummy[512] = {};
  AttentionWeights w;
  w.q_proj_weight = w.k_proj_weight = w.v_proj_weight = w.out_proj_weight = dummy;
  std::unique_ptr<MultiheadAttention> m;
  AttentionConfig c;
  c.embed_dim = 6;
  c.num_heads = 4;
  c.head_dim = -1;
  c.bias = false;
  Status s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("head_dim: expected > 0 (or 0 for embed_dim / num_heads), got -1"),
            std::string::npos)
      << s.message();
  c.head_dim = 3;  // A = 12 != E = 6: no divisibility needed
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(m->head_dim(), 3);
  EXPECT_EQ(m->config().head_dim, 3);
  c.bias_projections = 16;
  s = MultiheadAttention::Create(c, w, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("bias_projections: expected 0 or a mask"), std::string::npos)
      << s.message();
  c.bias_projections = kBiasQ | kBiasV;
  AttentionWeights b = w;
  b.q_proj_bias = dummy;
  s = MultiheadAttention::Create(c, b, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("v_proj_bias: expected a bias (bias_projections 5), got null"),
            std::string::npos)
      << s.message();
  b.v_proj_bias = dummy;
  b.k_proj_bias = dummy;
  s = MultiheadAttention::Create(c, b, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("k_proj_bias: expected none (bias_projections 5), got a bias"),
            std::string::npos)
      << s.message();
  b.k_proj_bias = nullptr;
  b.out_proj_bias = dummy;
  s = MultiheadAttention::Create(c, b, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("out_proj_bias: expected none"), std::string::npos) << s.message();
  b.out_proj_bias = nullptr;
  b.in_proj_bias = dummy;
  s = MultiheadAttention::Create(c, b, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("either in_proj_bias or q/k/v_proj_bias"), std::string::npos)
      << s.message();
  AttentionWeights packed_bias = w;
  packed_bias.in_proj_bias = dummy;
  s = MultiheadAttention::Create(c, packed_bias, WeightBinding::kView, &m);
  EXPECT_NE(s.message().find("in_proj_bias: biases q, k and v together"), std::string::npos)
      << s.message();
  b.in_proj_bias = nullptr;
  s = MultiheadAttention::Create(c, b, WeightBinding::kView, &m);
  EXPECT_TRUE(s.ok()) << s.message();
}

// Creates the 8-wide, 2-head layer of `cfg` (its other fields set here) with variant weights
// `vw` (their projection weights are filled in); returns the status.
Status CreateVariant(AttentionConfig cfg, AttentionWeights vw,
                     std::unique_ptr<MultiheadAttention>* m) {
  static float dummy[256] = {};
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  vw.in_proj_weight = dummy;
  vw.out_proj_weight = dummy;
  vw.in_proj_bias = dummy;
  vw.out_proj_bias = dummy;
  if (cfg.add_bias_kv) vw.bias_k = vw.bias_v = dummy;
  return MultiheadAttention::Create(cfg, vw, WeightBinding::kView, m);
}

void ExpectCreateError(const AttentionConfig& cfg, const AttentionWeights& vw,
                       const std::string& fragment,
                       StatusCode code = StatusCode::kInvalidArgument) {
  std::unique_ptr<MultiheadAttention> m;
  const Status s = CreateVariant(cfg, vw, &m);
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(fragment), std::string::npos)
      << "'" << fragment << "' not in: " << s.message();
  EXPECT_EQ(m, nullptr);
}

TEST(AttentionValidationTest, VariantConfigErrors) {
  const AttentionWeights none;
  AttentionConfig c;
  c.rope = RopeStyle::kNeox;
  c.rotary_dim = 3;
  ExpectCreateError(c, none,
                    "rotary_dim: expected an even value in 2..4 (head_dim), or 0 for "
                    "head_dim, got 3");
  c.rotary_dim = 6;
  ExpectCreateError(c, none, "rotary_dim: expected an even value in 2..4 (head_dim)");
  c.rotary_dim = -2;
  ExpectCreateError(c, none, "got -2");
  c.rotary_dim = 0;
  c.rope_theta = -1.0f;
  ExpectCreateError(c, none, "rope_theta: expected a finite value >= 0 (0 = 10000), got -1");
  c.rope_theta = INFINITY;
  ExpectCreateError(c, none, "rope_theta: expected a finite value >= 0");
  c.rope_theta = 0.0f;
  c.rope_scale = std::nanf("");
  ExpectCreateError(c, none, "rope_scale: expected a finite value >= 0 (0 = 1), got nan");
  c.rope_scale = 0.0f;
  c.rope = static_cast<RopeStyle>(3);
  ExpectCreateError(c, none, "rope: expected kNone (0), kNeox (1) or kGptj (2), got 3");

  c = AttentionConfig();
  c.rotary_dim = 2;
  ExpectCreateError(c, none, "rope_theta/rotary_dim/rope_scale: expected 0 when rope is kNone");
  c.rotary_dim = 0;
  c.rope_theta = 500.0f;
  ExpectCreateError(c, none, "rope_theta 500");
  c.rope_theta = 0.0f;
  c.rope_scale = 2.0f;
  ExpectCreateError(c, none, "rope_scale 2");

  c = AttentionConfig();
  c.window = -1;
  ExpectCreateError(c, none, "window: expected >= 0 (0 = no window), got -1");
  c.window = 0;
  c.softcap = -2.0f;
  ExpectCreateError(c, none, "softcap: expected a finite value >= 0 (0 = off), got -2");
  c.softcap = INFINITY;
  ExpectCreateError(c, none, "softcap: expected a finite value >= 0 (0 = off), got inf");
  c.softcap = 0.0f;
  c.qk_norm_eps = -1e-6f;
  ExpectCreateError(c, none, "qk_norm_eps: expected a finite value >= 0 (0 = 1e-6)");
}

TEST(AttentionValidationTest, VariantTensorErrors) {
  AttentionConfig c;
  const float slopes[2] = {0.5f, 0.25f};
  AttentionWeights w;
  w.alibi_slopes = slopes;
  ExpectCreateError(c, w, "weights.alibi_slopes: given but config.alibi is false");
  c.alibi = true;
  const float bad_slopes[2] = {0.5f, INFINITY};
  w.alibi_slopes = bad_slopes;
  ExpectCreateError(c, w, "weights.alibi_slopes: expected finite values, got inf at index 1");

  c = AttentionConfig();
  w = AttentionWeights();
  const float nan_sinks[2] = {0.0f, std::nanf("")};
  w.sinks = nan_sinks;
  ExpectCreateError(c, w, "weights.sinks: expected non-NaN, < +inf values, got nan at index 1");
  const float inf_sinks[2] = {INFINITY, 0.0f};
  w.sinks = inf_sinks;
  ExpectCreateError(c, w, "weights.sinks: expected non-NaN, < +inf values, got inf at index 0");
  const float none_sinks[2] = {-INFINITY, 1.0f};  // -inf: that head has no sink
  w.sinks = none_sinks;
  std::unique_ptr<MultiheadAttention> m;
  EXPECT_TRUE(CreateVariant(c, w, &m).ok());

  w = AttentionWeights();
  const float norm[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  w.q_norm_weight = norm;
  ExpectCreateError(c, w,
                    "q_norm_weight/k_norm_weight: expected both or neither, got only "
                    "q_norm_weight");
  w.q_norm_weight = nullptr;
  w.k_norm_weight = norm;
  ExpectCreateError(c, w, "got only k_norm_weight");
  const float bad_norm[8] = {1, 1, 1, 1, 1, std::nanf(""), 1, 1};
  w.q_norm_weight = norm;
  w.k_norm_weight = bad_norm;
  c.qk_norm_whole = true;  // [E]: index 5 is read
  ExpectCreateError(c, w, "weights.k_norm_weight: expected finite values, got nan at index 5");
  c.qk_norm_whole = false;  // [hd] = 4 values: index 5 is not part of it
  EXPECT_TRUE(CreateVariant(c, w, &m).ok());
}

TEST(AttentionValidationTest, PositionsCannotCombineWithAppendedKeys) {
  const AttentionWeights none;
  for (int variant = 0; variant < 3; ++variant) {
    for (const bool bias_kv : {true, false}) {
      AttentionConfig c;
      c.rope = variant == 0 ? RopeStyle::kGptj : RopeStyle::kNone;
      c.alibi = variant == 1;
      c.window = variant == 2 ? 4 : 0;
      c.add_bias_kv = bias_kv;
      c.add_zero_attn = !bias_kv;
      ExpectCreateError(c, none, "add_bias_kv/add_zero_attn: the appended keys have no position",
                        StatusCode::kUnsupported);
    }
  }
  // Without positions (QK-norm, softcap, sinks) the appended keys are fine.
  AttentionConfig c;
  c.softcap = 30.0f;
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  std::unique_ptr<MultiheadAttention> m;
  EXPECT_TRUE(CreateVariant(c, AttentionWeights(), &m).ok());
}

// A positions tensor over `values` with the given dtype and shape.
struct Positions {
  std::vector<int32_t> i32;
  std::vector<int64_t> i64;
  TensorView view;
  Positions(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
    void* data = nullptr;
    if (dtype == DType::kI64) {
      i64 = values;
      data = i64.data();
    } else {
      i32.assign(values.begin(), values.end());
      data = i32.data();
    }
    EXPECT_TRUE(TensorView::Dense(data, dtype == DType::kI64 ? DType::kI64 : dtype,
                                  static_cast<int>(shape.size()), shape.data(), &view)
                    .ok());
  }
};

TEST(AttentionValidationTest, PositionErrors) {
  Fixture f;
  MakeFixture(&f);  // N 2, L 3, S 5, cross-attention, no position variant
  const Positions q(DType::kI32, {2, 3}, {0, 1, 2, 5, 6, 7});
  AttentionInputs in = f.v.in;
  in.positions = q.view;
  ExpectError(f, in, f.v.out,
              {"positions: expected none, since the layer uses no position", "[2, 3] i32"});

  // The same problem on a layer with RoPE.
  f.p.config.rope = RopeStyle::kNeox;
  ASSERT_TRUE(MultiheadAttention::Create(f.p.config, testing_util::WeightsOf(f.p),
                                         WeightBinding::kView, &f.mha)
                  .ok());
  ASSERT_TRUE(f.mha->Forward(*f.ctx, in, f.v.out).ok());
  std::fill(f.v.output.begin(), f.v.output.end(), NAN);  // ExpectError checks they stay NaN
  std::fill(f.v.weights.begin(), f.v.weights.end(), NAN);

  const Positions f32(DType::kF32, {2, 3}, {0, 0, 0, 0, 0, 0});
  in.positions = f32.view;
  ExpectError(f, in, f.v.out, {"positions: expected dtype i32 or i64, got f32"});
  const Positions wrong(DType::kI64, {3}, {0, 1, 2});
  in.positions = q.view;
  in.key_positions = wrong.view;
  ExpectError(f, in, f.v.out,
              {"key_positions: expected shape [2, 5] (N, S) or [5] (S), got [3] i64"});
  const Positions rank3(DType::kI32, {1, 2, 3}, {0, 1, 2, 3, 4, 5});
  in.key_positions = TensorView();
  in.positions = rank3.view;
  ExpectError(f, in, f.v.out, {"positions: expected shape [2, 3] (N, L) or [3] (L)"});
  const Positions negative(DType::kI64, {3}, {0, -1, 2});
  in.positions = negative.view;
  ExpectError(f, in, f.v.out, {"positions[1]: expected a position in [0, 2^31), got -1"});
  const Positions huge(DType::kI64, {2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, int64_t{1} << 31});
  in.positions = TensorView();
  in.key_positions = huge.view;
  ExpectError(f, in, f.v.out,
              {"key_positions[1, 4]: expected a position in [0, 2^31), got 2147483648"});

  // Self-attention: the keys share the query positions.
  in = f.v.in;
  in.key = in.value = TensorView();
  const int64_t shape[3] = {2, 3, 8};
  ASSERT_TRUE(TensorView::Dense(f.p.query.data(), DType::kF32, 3, shape, &in.query).ok());
  in.need_weights = false;
  AttentionOutputs out = f.v.out;
  out.attn_weights = TensorView();
  in.attn_mask = in.key_padding_mask = TensorView();
  const Positions keys(DType::kI32, {3}, {0, 1, 2});
  in.key_positions = keys.view;
  ExpectError(f, in, out, {"key_positions: expected none in self-attention"});
  in.key_positions = TensorView();
  in.positions = keys.view;  // [L] shared by the batch
  EXPECT_TRUE(f.mha->Forward(*f.ctx, in, out).ok());
}

TEST(AttentionValidationTest, InputShapeErrors) {
  Fixture f;
  MakeFixture(&f);
  AttentionInputs in = f.v.in;
  in.query = TensorView();
  ExpectError(f, in, f.v.out, {"query", "absent"});

  in = f.v.in;
  in.query.rank = 1;
  ExpectError(f, in, f.v.out, {"query: expected 3 dims [N, L, q_dim] or 2 dims", "got [2] f32"});

  in = f.v.in;
  in.key.shape[2] = 7;  // kdim is 8
  ExpectError(f, in, f.v.out, {"key: expected last dimension 8", "[2, 5, 7]"});

  in = f.v.in;
  in.value.shape[0] = 1;  // batch 1 vs query's 2
  ExpectError(f, in, f.v.out, {"value: expected batch size 2", "[1, 5, 8]"});

  in = f.v.in;
  in.value.shape[1] = 4;  // S differs from key's 5
  ExpectError(f, in, f.v.out, {"value: expected the same sequence length as key (5)"});

  in = f.v.in;
  in.query.dtype = DType::kBF16;
  ExpectError(f, in, f.v.out, {"query: expected dtype f32, got bf16"});

  in = f.v.in;
  in.key.strides[2] = 2;
  ExpectError(f, in, f.v.out, {"key: expected a contiguous last dimension"});
}

TEST(AttentionValidationTest, MaskErrors) {
  Fixture f;
  MakeFixture(&f);
  AttentionInputs in = f.v.in;
  in.attn_mask.shape[1] = 4;
  ExpectError(f, in, f.v.out, {"attn_mask: expected shape [3, 5] or [4, 3, 5]", "got [3, 4] bool"});
  in = f.v.in;
  in.attn_mask.dtype = DType::kBF16;
  ExpectError(f, in, f.v.out, {"attn_mask: expected dtype bool, u8 or f32, got bf16"});
  in = f.v.in;
  in.key_padding_mask.shape[0] = 3;
  ExpectError(f, in, f.v.out, {"key_padding_mask: expected shape [2, 5] (N, S)", "[3, 5] f32"});
}

TEST(AttentionValidationTest, OutputErrors) {
  Fixture f;
  MakeFixture(&f);
  AttentionOutputs out = f.v.out;
  out.output.shape[2] = 9;
  ExpectError(f, f.v.in, out, {"output: expected shape [2, 3, 8] f32, got [2, 3, 9] f32"});
  out = f.v.out;
  out.attn_weights = TensorView();
  ExpectError(f, f.v.in, out, {"attn_weights: need_weights is true"});
  out = f.v.out;
  out.attn_weights.shape[2] = 6;
  ExpectError(f, f.v.in, out, {"attn_weights: expected shape [2, 3, 5]"});
  AttentionInputs in = f.v.in;
  in.need_weights = false;
  ExpectError(f, in, f.v.out, {"attn_weights: given but need_weights is false"});
}

TEST(AttentionValidationTest, BorrowedArenaTooSmallNamesTheBytes) {
  Fixture f;
  MakeFixture(&f);
  std::vector<uint8_t> small(256);
  ContextOptions o;
  o.num_threads = 1;
  o.arena_buffer = small.data();
  o.arena_bytes = small.size();
  ASSERT_TRUE(Context::Create(o, &f.ctx).ok());
  size_t need = 0;
  ASSERT_TRUE(f.mha->Plan(f.v.in, f.v.out, 1, &need).ok());
  Status s = f.mha->Forward(*f.ctx, f.v.in, f.v.out);
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(s.message().find("buffer of " + std::to_string(need) + " bytes"), std::string::npos)
      << s.message();
  for (float x : f.v.output) ASSERT_TRUE(std::isnan(x));
  // A buffer of the planned size works (at any address: tests/plan_test.cc).
  std::vector<uint8_t> enough(need);
  o.arena_buffer = enough.data();
  o.arena_bytes = enough.size();
  ASSERT_TRUE(Context::Create(o, &f.ctx).ok());
  s = f.mha->Forward(*f.ctx, f.v.in, f.v.out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(std::isnan(f.v.output[0]));
}

TEST(AttentionValidationTest, ContextErrors) {
  std::unique_ptr<Context> ctx;
  ContextOptions o;
  o.num_threads = 5000;
  Status s = Context::Create(o, &ctx);
  EXPECT_NE(s.message().find("num_threads: expected 0..1024, got 5000"), std::string::npos);
  EXPECT_EQ(Context::Create(ContextOptions(), nullptr).code(), StatusCode::kInvalidArgument);
}

// Numerical robustness: +-inf and NaN inputs, all -inf masks, magnitude 1e4, L = S = 1, head_dim 1.
TEST(AttentionRobustnessTest, FullyMaskedRowsAreZerosNotNaN) {
  Fixture f;
  MakeFixture(&f);
  std::fill(f.p.attn_mask_b.begin(), f.p.attn_mask_b.end(), 1);  // every key masked
  ASSERT_TRUE(f.mha->Forward(*f.ctx, f.v.in, f.v.out).ok());
  for (float w : f.v.weights) ASSERT_EQ(w, 0.0f);
  // Output rows equal out_proj.bias exactly.
  for (int64_t n = 0; n < f.p.N; ++n)
    for (int64_t l = 0; l < f.p.L; ++l)
      for (int64_t e = 0; e < 8; ++e)
        ASSERT_EQ(testing_util::OutputAt(f.p, f.v.output, n, l, e), f.p.bo[e]);
}

TEST(AttentionRobustnessTest, AllMinusInfFloatMask) {
  Fixture f;
  MakeFixture(&f, true, MaskChoice::kFloat, MaskChoice::kNone);
  std::fill(f.p.attn_mask_f.begin(), f.p.attn_mask_f.end(), -INFINITY);
  testing_util::MakeViews(f.p, &f.v);
  ASSERT_TRUE(f.mha->Forward(*f.ctx, f.v.in, f.v.out).ok());
  for (float w : f.v.weights) ASSERT_EQ(w, 0.0f);
  for (float o : f.v.output) ASSERT_FALSE(std::isnan(o));
}

TEST(AttentionRobustnessTest, NaNInOneBatchStaysInThatBatch) {
  Fixture f;
  MakeFixture(&f, true, MaskChoice::kNone, MaskChoice::kNone);
  f.p.key[0] = NAN;  // batch 0, key 0 (batch_first)
  testing_util::MakeViews(f.p, &f.v);
  ASSERT_TRUE(f.mha->Forward(*f.ctx, f.v.in, f.v.out).ok());
  for (int64_t l = 0; l < f.p.L; ++l) {
    EXPECT_TRUE(std::isnan(testing_util::OutputAt(f.p, f.v.output, 0, l, 0)));
    EXPECT_FALSE(std::isnan(testing_util::OutputAt(f.p, f.v.output, 1, l, 0)));
  }
}

TEST(AttentionRobustnessTest, HugeMagnitudesStayFinite) {
  std::mt19937 rng(4);
  Problem p;
  p.config.embed_dim = 4;
  p.config.num_heads = 4;  // head_dim 1
  p.N = 1;
  p.L = p.S = 1;
  p.self_attention = true;
  p.need_weights = true;
  testing_util::FillProblem(&p, &rng);
  for (float& x : p.query) x *= 1e4f;
  std::unique_ptr<MultiheadAttention> mha;
  ASSERT_TRUE(MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), WeightBinding::kCopy, &mha).ok());
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(ContextOptions(), &ctx).ok());
  testing_util::Views v;
  testing_util::MakeViews(p, &v);
  ASSERT_TRUE(mha->Forward(*ctx, v.in, v.out).ok());
  reference::Outputs ref;
  testing_util::RunReference(p, &ref);
  for (size_t i = 0; i < v.output.size(); ++i) {
    ASSERT_TRUE(std::isfinite(v.output[i]));
    EXPECT_NEAR(v.output[i], ref.output[i], 1e-3 * std::abs(ref.output[i]) + 1e-2);
  }
  for (float w : v.weights) EXPECT_EQ(w, 1.0f);  // one key: weight 1
}

// One layer shared by 8 application threads, each with its own context; results equal the
// single-threaded ones bitwise; a failing forward on one thread does not disturb the others.
TEST(AttentionConcurrencyTest, OneLayerManyThreads) {
  Fixture f;
  MakeFixture(&f);
  ASSERT_TRUE(f.mha->Forward(*f.ctx, f.v.in, f.v.out).ok());
  const std::vector<float> want = f.v.output;
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<Context> ctx;
      ContextOptions o;
      o.num_threads = 1 + t % 2;
      if (!Context::Create(o, &ctx).ok()) { errors++; return; }
      std::vector<float> out(want.size());
      AttentionOutputs ao = f.v.out;
      ao.output.data = out.data();
      std::vector<float> w(f.v.weights.size());
      ao.attn_weights.data = w.data();
      for (int i = 0; i < 300; ++i) {
        if (t == 3 && i % 7 == 0) {
          AttentionInputs bad = f.v.in;
          bad.key.shape[2] = 1;
          if (f.mha->Forward(*ctx, bad, ao).ok()) errors++;
          continue;
        }
        if (!f.mha->Forward(*ctx, f.v.in, ao).ok()) { errors++; continue; }
        if (std::memcmp(out.data(), want.data(), want.size() * 4) != 0) mismatches++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(AttentionConcurrencyTest, ContextsCreatedAndDestroyedInALoop) {
  Fixture f;
  MakeFixture(&f);
  for (int i = 0; i < 200; ++i) {
    std::unique_ptr<Context> ctx;
    ContextOptions o;
    o.num_threads = 1 + i % 4;
    ASSERT_TRUE(Context::Create(o, &ctx).ok());
    if (i % 10 == 0) {
      ASSERT_TRUE(f.mha->Forward(*ctx, f.v.in, f.v.out).ok());
    }
  }
}

}  // namespace
}  // namespace mha
