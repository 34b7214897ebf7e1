// The operator against the double-precision reference on hundreds of random configurations,
// plus bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"
#include "tests/kernel_test_util.h"

namespace mha {
namespace {

using testing_util::MakeViews;
using testing_util::OutputAt;
using testing_util::Problem;
using testing_util::RandomProblem;
using testing_util::Views;
using testing_util::WeightsOf;

// Runs `p` on `threads` threads; returns the views with outputs filled. in_place: the query is
// read from the output's storage (dense, q_dim == E), which the forward then overwrites.
void RunMha(const Problem& p, size_t threads, Views* v, bool in_place = false) {
  std::unique_ptr<MultiheadAttention> mha;
  Status s = MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  ContextOptions opts;
  opts.num_threads = threads;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(opts, &ctx).ok());
  MakeViews(p, v);
  if (in_place) {
    ASSERT_EQ(p.query.size(), v->output.size()) << p.Describe();
    std::copy(p.query.begin(), p.query.end(), v->output.begin());
    v->in.query.data = v->output.data();
  }
  size_t bytes = 0;
  s = mha->Plan(v->in, v->out, threads, &bytes);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  s = mha->Forward(*ctx, v->in, v->out);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  EXPECT_LE(ctx->arena_high_water(), bytes + 64);
}

// Self-attention of N batch-first entries of L tokens (E, H), prepacked weights, filled from rng.
Problem SelfAttention(std::mt19937* rng, int64_t E, int64_t H, int64_t N, int64_t L) {
  Problem p;
  p.config.embed_dim = E;
  p.config.num_heads = H;
  p.config.batch_first = true;
  p.config.prepack = WeightPrepack::kOn;
  p.N = N;
  p.L = p.S = L;
  p.self_attention = true;
  testing_util::FillProblem(&p, rng);
  return p;
}

// Runs `p` on 2 threads into a separate output and in place (the query's storage): the same
// bits.
void ExpectInPlaceGivesTheSameBits(const Problem& p) {
  Views want, got;
  RunMha(p, 2, &want);
  RunMha(p, 2, &got, /*in_place=*/true);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(0, std::memcmp(got.output.data(), want.output.data(), got.output.size() * 4));
}

// Runs `p` on 2 threads against the reference, and on 1 thread for the same bits.
void CheckTwoThreadsAndOne(const Problem& p) {
  Views v1, v2;
  RunMha(p, 2, &v2);
  RunMha(p, 1, &v1);
  if (::testing::Test::HasFatalFailure()) return;
  testing_util::ExpectMatchesReference(p, v2);
  ASSERT_EQ(0, std::memcmp(v1.output.data(), v2.output.data(), v1.output.size() * 4))
      << p.Describe();
}

TEST(AttentionRandomTest, MatchesDoubleReference) {
  std::mt19937 rng(20261122);
  for (int i = 0; i < 260; ++i) {
    const Problem p = RandomProblem(&rng);
    Views v;
    RunMha(p, 1 + i % 4, &v);
    if (HasFatalFailure()) return;
    testing_util::ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i << " failed";
      return;
    }
  }
}

TEST(AttentionRandomTest, BitwiseIdenticalForAnyThreadCount) {
  std::mt19937 rng(7);
  for (int i = 0; i < 60; ++i) {
    const Problem p = RandomProblem(&rng, 40);
    Views v1, v3, v4;
    RunMha(p, 1, &v1);
    RunMha(p, 3, &v3);
    RunMha(p, 4, &v4);
    if (HasFatalFailure()) return;
    ASSERT_EQ(0, std::memcmp(v1.output.data(), v3.output.data(), v1.output.size() * 4))
        << p.Describe();
    ASSERT_EQ(0, std::memcmp(v1.output.data(), v4.output.data(), v1.output.size() * 4))
        << p.Describe();
    // memcmp must not see the null data() of empty vectors (no weights requested).
    if (!v1.weights.empty()) {
      ASSERT_EQ(0, std::memcmp(v1.weights.data(), v3.weights.data(), v1.weights.size() * 4))
          << p.Describe();
    }
  }
}

// Long key sequences without weights take the online-softmax path over several key blocks (not
// the key-chunked path: K and V are far below its bytes), with causal and masks, and the long
// self-attention ones over several query blocks.
TEST(AttentionRandomTest, LongSequencesUseOnlineSoftmax) {
  std::mt19937 rng(99);
  for (int variant = 0; variant < 6; ++variant) {
    Problem p;
    p.config.embed_dim = 16;
    p.config.num_heads = 2;
    p.config.batch_first = variant % 2 == 0;
    p.config.add_zero_attn = variant == 3;
    p.N = 2;
    p.self_attention = variant >= 4;
    p.L = p.self_attention ? 1100 : 70;
    p.S = p.self_attention ? p.L : 1300;
    p.causal = variant == 1 || variant == 4;
    p.kpm = variant == 2 ? testing_util::MaskChoice::kBool : testing_util::MaskChoice::kNone;
    p.attn = variant == 5 ? testing_util::MaskChoice::kFloat : testing_util::MaskChoice::kNone;
    testing_util::FillProblem(&p, &rng);
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(
        MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &layer).ok());
    Views v;
    testing_util::MakeViews(p, &v);
    ForwardPlan plan;
    ASSERT_TRUE(ForwardPlanForTesting(*layer, v.in, v.out, 2, &plan).ok());
    EXPECT_EQ(plan.path, ForwardPath::kOnline) << p.Describe();
    EXPECT_LT(plan.key_block, static_cast<size_t>(p.S)) << "one key block: " << p.Describe();
    if (p.self_attention) {
      EXPECT_LT(plan.query_block, static_cast<size_t>(p.L)) << "one query block: " << p.Describe();
    }
    CheckTwoThreadsAndOne(p);
    if (HasFailure()) return;
  }
}

// Projections through the Strassen operands (AttentionConfig::prepack kStrassen, E >= 512): the
// layer holds them for all four matrices, and the forward (token counts with a Strassen panel and
// an odd row or a short panel after it; fused and separate q/k/v; self- and cross-attention;
// causal) matches the double reference and gives the same bits on 1 and 2 threads; the default
// kOn and kPlain hold none.
TEST(AttentionRandomTest, StrassenProjections) {
  std::mt19937 rng(77);
  for (int variant = 0; variant < 4; ++variant) {
    Problem p;
    p.config.embed_dim = 512;
    p.config.num_heads = 8;
    p.config.prepack = WeightPrepack::kStrassen;
    p.config.batch_first = variant % 2 == 0;
    p.packed = variant != 1;
    p.N = variant == 3 ? 2 : 1;
    p.self_attention = variant != 2;
    p.L = variant == 0 ? 131 : 97;
    p.S = p.self_attention ? p.L : 160;
    p.causal = variant == 3;
    testing_util::FillProblem(&p, &rng);
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &layer).ok());
    const LayerWeights& lw = LayerWeightsOf(*layer);
    const bool direct = StrassenPacks(512, 512);
    for (const WeightMatrix* w : {&lw.w_q, &lw.w_k, &lw.w_v, &lw.w_o}) {
      EXPECT_EQ(!w->strassen.empty(), direct) << p.Describe();
    }
    CheckTwoThreadsAndOne(p);
    if (HasFailure()) return;
  }
  for (const WeightPrepack mode : {WeightPrepack::kOn, WeightPrepack::kPlain}) {
    Problem plain;
    plain.config.embed_dim = 512;
    plain.config.num_heads = 8;
    plain.config.prepack = mode;
    testing_util::FillProblem(&plain, &rng);
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(
        MultiheadAttention::Create(plain.config, WeightsOf(plain), plain.binding, &layer).ok());
    EXPECT_TRUE(LayerWeightsOf(*layer).w_q.strassen.empty());
    // Packed at all only where the micro-kernel stores row-major C (not BLIS's aarch64 kernels).
    EXPECT_EQ(LayerWeightsOf(*layer).w_q.packed.data != nullptr,
              kernels::GemmBlocking().prefers_rows);
  }
}

// Weights requested for long sequences: full rows, per head and averaged.
TEST(AttentionRandomTest, LongSequencesWithWeights) {
  std::mt19937 rng(5);
  for (int avg = 0; avg < 2; ++avg) {
    Problem p;
    p.config.embed_dim = 8;
    p.config.num_heads = 2;
    p.config.batch_first = true;
    p.N = 1;
    p.L = 300;
    p.S = 1200;
    p.causal = avg == 1;
    p.need_weights = true;
    p.average = avg == 1;
    testing_util::FillProblem(&p, &rng);
    Views v;
    RunMha(p, 2, &v);
    if (HasFatalFailure()) return;
    testing_util::ExpectMatchesReference(p, v);
  }
}

// ---------------------------------------------------------------------------------------------
// The chunked path (long keys without weights: K and V projected one chunk of keys at a time,
// the running softmax state kept across chunks), reached with small shapes by lowering its
// thresholds through ScopedKeyChunking.

using testing_util::ScopedKeyChunking;

// Plan's bytes for `p` with the current key chunking.
size_t PlanBytes(const Problem& p, size_t threads) {
  std::unique_ptr<MultiheadAttention> mha;
  EXPECT_TRUE(MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha).ok());
  Views v;
  MakeViews(p, &v);
  size_t bytes = 0;
  EXPECT_TRUE(mha->Plan(v.in, v.out, threads, &bytes).ok()) << p.Describe();
  return bytes;
}

// Plans differ between the paths (the chunked one has no concat buffer and K/V of one chunk),
// so a different plan shows the forced chunking took effect.
bool TakesChunkedPath(const Problem& p, int64_t chunk_keys) {
  size_t chunked = 0, unchunked = 0;
  {
    ScopedKeyChunking forced(chunk_keys);
    chunked = PlanBytes(p, 2);
  }
  {
    ScopedKeyChunking never(0);
    unchunked = PlanBytes(p, 2);
  }
  return chunked != unchunked;
}

// Random configurations (masks of every kind, causal, cross-attention with kdim/vdim, GQA,
// bias_kv/zero_attn, batch_first, unbatched, strided inputs, fully masked rows) in chunks of 1
// to 9 keys, so that chunks split key blocks, masks and the appended positions everywhere.
TEST(AttentionChunkedTest, RandomConfigsMatchDoubleReference) {
  std::mt19937 rng(8192);
  int chunked = 0;
  for (int i = 0; i < 200; ++i) {
    Problem p = RandomProblem(&rng, 40);
    p.need_weights = false;
    const int64_t chunk_keys = 1 + i % 9;
    ScopedKeyChunking forced(chunk_keys);
    Views v;
    RunMha(p, 1 + i % 4, &v);
    if (HasFatalFailure()) return;
    testing_util::ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i << ", chunks of " << chunk_keys << " keys";
      return;
    }
    chunked += p.S > chunk_keys;
  }
  EXPECT_GT(chunked, 120);  // the others have too few keys to split
}

TEST(AttentionChunkedTest, BitwiseIdenticalForAnyThreadCount) {
  std::mt19937 rng(17);
  for (int i = 0; i < 40; ++i) {
    Problem p = RandomProblem(&rng, 70);
    p.need_weights = false;
    ScopedKeyChunking forced(3 + i % 13);
    Views v1, v2, v3, v4;
    RunMha(p, 1, &v1);
    RunMha(p, 2, &v2);
    RunMha(p, 3, &v3);
    RunMha(p, 4, &v4);
    if (HasFatalFailure()) return;
    for (const Views* v : {&v2, &v3, &v4}) {
      ASSERT_EQ(0, std::memcmp(v1.output.data(), v->output.data(), v1.output.size() * 4))
          << p.Describe();
    }
  }
}

// Several query blocks and chunks: causal blocks skip the chunks past their diagonal, chunks of
// 1024 keys hold two online-softmax key blocks (the default chunk size), chunks of 100 cut key
// blocks short; masks, cross-attention with kdim/vdim, GQA and the appended positions.
TEST(AttentionChunkedTest, LongSequencesMatchReferenceOnTwoThreads) {
  std::mt19937 rng(2024);
  for (int variant = 0; variant < 8; ++variant) {
    Problem p;
    p.config.embed_dim = 16;
    p.config.num_heads = 4;
    p.config.batch_first = variant % 2 == 0;
    p.N = variant == 6 ? 1 : 2;
    p.batched = variant != 6;
    p.self_attention = variant < 4;
    p.L = p.self_attention ? 600 : 130;
    p.S = p.self_attention ? p.L : 2100;
    if (!p.self_attention) {
      p.packed = false;
      p.config.num_kv_heads = variant == 5 ? 1 : 2;
      p.config.kdim = 12;
      p.config.vdim = 20;
    }
    p.causal = variant == 1 || variant == 2 || variant == 7;
    p.config.add_bias_kv = variant == 2 || variant == 5;
    p.config.add_zero_attn = variant == 3 || variant == 5;
    p.attn = variant == 3   ? testing_util::MaskChoice::kFloat
             : variant == 4 ? testing_util::MaskChoice::kBool
                            : testing_util::MaskChoice::kNone;
    p.attn_3d = variant == 4;
    p.kpm = variant == 2   ? testing_util::MaskChoice::kBool
            : variant == 7 ? testing_util::MaskChoice::kFloat
                           : testing_util::MaskChoice::kNone;
    testing_util::FillProblem(&p, &rng);
    const int64_t chunk_keys = p.self_attention ? 100 : 1024;
    ASSERT_TRUE(TakesChunkedPath(p, chunk_keys)) << p.Describe();
    ScopedKeyChunking forced(chunk_keys);
    CheckTwoThreadsAndOne(p);
    if (HasFailure()) return;
  }
}

// An output that shares memory with an input cannot hold the running sums while the chunks still
// read the input: such a forward keeps them in the workspace, with the same bits.
TEST(AttentionChunkedTest, OutputAliasingTheQueryKeepsRunningSumsInTheWorkspace) {
  std::mt19937 rng(31);
  const Problem p = SelfAttention(&rng, 8, 2, 1, 50);
  ScopedKeyChunking forced(8);
  ASSERT_TRUE(TakesChunkedPath(p, 8));
  ExpectInPlaceGivesTheSameBits(p);
}

// (1, 8192, 1024, 16) self-attention into a separate output uses at most 64 MiB of workspace
// (unchunked: 135 MiB); the plan, which also covers the output in place (running sums in the
// workspace), at most 84 MiB. Planning reads no data, so the tensors are left uninitialized.
TEST(AttentionChunkedTest, LongSelfAttentionWorkspaceFitsIn64MiB) {
  constexpr int64_t E = 1024, L = 8192;
  AttentionConfig config;
  config.embed_dim = E;
  config.num_heads = 16;
  std::unique_ptr<float[]> in_proj(new float[3 * E * E]), out_proj(new float[E * E]);
  std::unique_ptr<float[]> in_proj_b(new float[3 * E]), out_proj_b(new float[E]);
  AttentionWeights w;
  w.in_proj_weight = in_proj.get();
  w.in_proj_bias = in_proj_b.get();
  w.out_proj_weight = out_proj.get();
  w.out_proj_bias = out_proj_b.get();
  std::unique_ptr<MultiheadAttention> mha;
  ASSERT_TRUE(MultiheadAttention::Create(config, w, WeightBinding::kView, &mha).ok());
  std::unique_ptr<float[]> query(new float[L * E]), output(new float[L * E]);
  const int64_t shape[3] = {L, 1, E};
  AttentionInputs in;
  AttentionOutputs out;
  ASSERT_TRUE(TensorView::Dense(query.get(), DType::kF32, 3, shape, &in.query).ok());
  ASSERT_TRUE(TensorView::Dense(output.get(), DType::kF32, 3, shape, &out.output).ok());
  AttentionOutputs in_place;
  in_place.output = in.query;
  for (size_t threads : {1, 2}) {
    size_t plan = 0, separate = 0, aliased = 0;
    ASSERT_TRUE(mha->Plan(in, out, threads, &plan).ok());
    ASSERT_TRUE(ForwardWorkspaceBytesForTesting(*mha, in, out, threads, &separate).ok());
    ASSERT_TRUE(ForwardWorkspaceBytesForTesting(*mha, in, in_place, threads, &aliased).ok());
    EXPECT_LE(separate, size_t{64} << 20) << threads << " threads";
    EXPECT_LE(plan, size_t{84} << 20) << threads << " threads";
    EXPECT_LT(separate, aliased);
    EXPECT_LE(aliased + 63, plan);
  }
}

// The whole operator on each SIMD target compiled in and supported here (the kernels' dispatch
// is forced to the test's target): each agrees with the double reference within the same
// tolerance, so targets agree with each other within twice that.
class AttentionRandomTargetTest : public test::PerTargetTest {};

TEST_P(AttentionRandomTargetTest, MatchesDoubleReference) {
  const char* const target = target_name();
  std::mt19937 rng(123);
  for (int i = 0; i < 40; ++i) {
    const Problem p = RandomProblem(&rng, i % 5 == 0 ? 80 : 9);
    Views v;
    RunMha(p, 1 + i % 3, &v);
    if (HasFatalFailure()) return;
    testing_util::ExpectMatchesReference(p, v);
    if (HasFailure()) {
      ADD_FAILURE() << "target " << target << ", random problem #" << i;
      return;
    }
  }
}

MHA_INSTANTIATE_PER_TARGET(AttentionRandomTargetTest);

// ---------------------------------------------------------------------------------------------
// The grouped forward (runtime/batch_groups.h: groups of whole batch entries, each on one worker
// from its input to its output rows), reached with small shapes through ScopedBatchGrouping.

using testing_util::ScopedBatchGrouping;

// A random problem given a head width independent of embed_dim (A = H * head_dim != E, as
// Gemma's) and, half of the time, biases on a random subset of the projections (Qwen2: q, k, v;
// Whisper: q, v, out), then refilled for those shapes.
Problem HeadWidthAndBiasProblem(std::mt19937* rng, int64_t max_len) {
  Problem p = RandomProblem(rng, max_len);
  const int64_t H = p.config.num_heads;
  do {
    p.config.head_dim = testing_util::Pick(rng, 1, 9);
  } while (H * p.config.head_dim == p.config.embed_dim);
  if (testing_util::Coin(rng)) {
    p.config.bias_projections = static_cast<uint32_t>(testing_util::Pick(rng, 1, 15));
    if (p.layout == QkvLayout::kPerHead) p.layout = QkvLayout::kPyTorch;
  }
  testing_util::FillProblem(&p, rng);
  return p;
}

// head_dim != embed_dim / num_heads and per-projection biases on every path: the double
// reference on 1-4 threads (online, full rows with weights, key-chunked), the same bits for 1
// and 3 threads, and the grouped forward's bits equal the staged forward's.
TEST(AttentionRandomTest, HeadWidthAndProjectionBiasesMatchDoubleReference) {
  std::mt19937 rng(20261127);
  for (int i = 0; i < 150; ++i) {
    Problem p = HeadWidthAndBiasProblem(&rng, 24);
    Views v;
    RunMha(p, 1 + i % 4, &v);
    if (HasFatalFailure()) return;
    testing_util::ExpectMatchesReference(p, v);
    Views v3;
    RunMha(p, 3, &v3);
    if (HasFatalFailure()) return;
    EXPECT_EQ(0, std::memcmp(v.output.data(), v3.output.data(), v.output.size() * 4))
        << p.Describe();
    p.need_weights = false;
    {
      testing_util::ScopedKeyChunking forced(1 + i % 5);
      Views vc;
      RunMha(p, 2, &vc);
      if (HasFatalFailure()) return;
      testing_util::ExpectMatchesReference(p, vc);
    }
    if (p.config.prepack == WeightPrepack::kOff) p.config.prepack = WeightPrepack::kOn;
    testing_util::ExpectGroupedGivesStagedBits(p, 1 + i % 2, static_cast<size_t>(p.L) * 2);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i;
      return;
    }
  }
}

// Random configurations (masks of every kind, causal, cross-attention with kdim/vdim, GQA,
// bias_kv/zero_attn, batch_first, strided inputs; the variants: variants_test.cc) in groups of 1 to
// 3 entries: the grouped forward gives the staged forward's bits on 1 and 2 threads, and matches
// the double reference.
TEST(AttentionGroupedTest, RandomConfigsGiveTheStagedBits) {
  std::mt19937 rng(4096);
  int grouped = 0;
  for (int i = 0; i < 300; ++i) {
    Problem p = RandomProblem(&rng, 40);
    p.need_weights = false;
    if (p.config.prepack == WeightPrepack::kOff) p.config.prepack = WeightPrepack::kOn;
    // Random problems have 1 to 3 entries: more threads than groups keep the staged forward.
    const size_t threads = 1 + i % 2;
    const size_t rows = static_cast<size_t>(p.L) * (1 + i % 3);
    testing_util::ExpectGroupedGivesStagedBits(p, threads, rows);
    if (HasFailure()) {
      ADD_FAILURE() << "random problem #" << i;
      return;
    }
    grouped += testing_util::RunsGrouped(p, rows, threads);
  }
  // Some problems run grouped, or the comparison above compared nothing (the others run stage
  // by stage: one entry, groups of one, Strassen, bf16, ...).
  if (testing_util::GroupingPossible()) {
    EXPECT_GT(grouped, 0);
  }
}

// Groups that split the batch unevenly (the last one shorter), seq-major and batch-major
// layouts, cross-attention with longer keys, GQA, masks and the appended positions.
TEST(AttentionGroupedTest, UnevenGroupsAndLayoutsMatchReference) {
  std::mt19937 rng(77);
  for (int variant = 0; variant < 6; ++variant) {
    Problem p;
    p.config.embed_dim = 24;
    p.config.num_heads = 4;
    p.config.prepack = WeightPrepack::kOn;
    p.config.batch_first = variant % 2 == 0;
    p.N = 7;
    p.self_attention = variant < 3;
    p.L = 10 + variant;
    p.S = p.self_attention ? p.L : 33;
    if (!p.self_attention) {
      p.packed = false;
      p.config.num_kv_heads = 2;
      p.config.kdim = 12;
      p.config.vdim = 20;
    }
    p.causal = variant == 1 || variant == 4;
    p.config.add_bias_kv = variant == 2 || variant == 5;
    p.config.add_zero_attn = variant == 3;
    p.kpm = variant == 2 ? testing_util::MaskChoice::kBool : testing_util::MaskChoice::kNone;
    testing_util::FillProblem(&p, &rng);
    // Groups of 3, 3 and 1 entries, grouped on one thread; whichever schedule two threads take
    // (grouped, or stage by stage where the groups would load the workers unevenly), both give
    // the same bits.
    const size_t rows = 3 * static_cast<size_t>(p.L);
    ASSERT_EQ(testing_util::RunsGrouped(p, rows, 1), testing_util::GroupingPossible())
        << p.Describe();
    ScopedBatchGrouping forced(rows);
    CheckTwoThreadsAndOne(p);
    if (HasFailure()) return;
  }
}

// An output that shares memory with an input cannot be written group by group while later
// groups still read their inputs: such a forward runs stage by stage, with the same bits.
TEST(AttentionGroupedTest, OutputAliasingTheQueryRunsStageByStage) {
  std::mt19937 rng(5);
  const Problem p = SelfAttention(&rng, 16, 2, 4, 12);
  ScopedBatchGrouping forced(2 * p.L);
  ASSERT_EQ(testing_util::RunsGrouped(p, 2 * p.L, 2), testing_util::GroupingPossible());
  ExpectInPlaceGivesTheSameBits(p);
}

// The plan's rule at the measured setting (groups of 256 rows within 3 MiB, a 2 MiB L2): the
// suite's (32, 64, 512, 8) groups 4 entries on 2 threads, but not on 16 (fewer groups than
// workers), not with 33 entries on 2 (one worker would get 20 of 33), not in bf16, and not
// with 512 tokens (one entry is a group); (8, 64, 768, 12) groups 4 entries (3 MiB).
TEST(AttentionGroupedTest, PlanGroupsManyShortSequences) {
  const ScopedBatchGrouping measured(kGroupRows, size_t{3} << 20);
  std::mt19937 rng(9);
  struct Case {
    int64_t N, L, E, H;
    size_t threads;
    bool bf16;
    size_t group;
  };
  const Case cases[] = {{32, 64, 512, 8, 2, false, 4}, {32, 64, 512, 8, 16, false, 0},
                        {33, 64, 512, 8, 2, false, 0}, {32, 64, 512, 8, 2, true, 0},
                        {4, 512, 512, 8, 2, false, 0}, {8, 64, 768, 12, 2, false, 4},
                        {32, 64, 512, 8, 1, false, 4}};
  for (const Case& c : cases) {
    Problem p = SelfAttention(&rng, c.E, c.H, c.N, c.L);
    if (c.bf16) p.config.compute = Compute::kBF16;
    const size_t want = testing_util::GroupingPossible() ? c.group : 0;
    EXPECT_EQ(testing_util::ForwardBatchGroup(p, c.threads), want)
        << p.Describe() << " threads " << c.threads;
  }
}

}  // namespace
}  // namespace mha
