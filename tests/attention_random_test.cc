// The operator against the double-precision reference on hundreds of random configurations,
// plus bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

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

// f32 computation against the double reference: products of O(1) values summed over <= 64
// terms, then softmax and two more products. 2e-5 absolute + 2e-4 relative covers f32 rounding
// with a wide margin while still catching any indexing or masking error (those are O(0.1)).
constexpr double kAtol = 2e-5;
constexpr double kRtol = 2e-4;

bool Close(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::abs(got - want) <= kAtol + kRtol * std::abs(want);
}

// Runs `p` on `threads` threads; returns the views with outputs filled.
void RunMha(const Problem& p, size_t threads, Views* v) {
  std::unique_ptr<MultiheadAttention> mha;
  Status s = MultiheadAttention::Create(p.config, WeightsOf(p), p.binding, &mha);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  ContextOptions opts;
  opts.num_threads = threads;
  std::unique_ptr<Context> ctx;
  ASSERT_TRUE(Context::Create(opts, &ctx).ok());
  MakeViews(p, v);
  size_t bytes = 0;
  s = mha->Plan(v->in, v->out, threads, &bytes);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  s = mha->Forward(*ctx, v->in, v->out);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p.Describe();
  EXPECT_LE(ctx->arena_high_water(), bytes + 64);
}

void CheckAgainstReference(const Problem& p, const Views& v) {
  reference::Outputs ref;
  testing_util::RunReference(p, &ref);
  const int64_t E = p.config.embed_dim;
  int bad = 0;
  for (int64_t n = 0; n < p.N; ++n) {
    for (int64_t l = 0; l < p.L; ++l) {
      for (int64_t e = 0; e < E; ++e) {
        const double want = ref.output[(n * p.L + l) * E + e];
        const double got = OutputAt(p, v.output, n, l, e);
        if (!Close(got, want) && bad++ < 5) {
          ADD_FAILURE() << "output[n=" << n << ", l=" << l << ", e=" << e << "] = " << got
                        << ", want " << want << "\n" << p.Describe();
        }
      }
    }
  }
  if (!p.need_weights) return;
  const int64_t St = ref.total_src_len;
  const std::vector<double>& want_w = p.average ? ref.mean_weights : ref.head_weights;
  ASSERT_EQ(v.weights.size(), want_w.size()) << p.Describe();
  for (size_t i = 0; i < want_w.size(); ++i) {
    if (!Close(v.weights[i], want_w[i]) && bad++ < 5) {
      ADD_FAILURE() << "weights[" << i << "] (row " << i / St << ", col " << i % St
                    << ") = " << v.weights[i] << ", want " << want_w[i] << "\n"
                    << p.Describe();
    }
  }
}

TEST(AttentionRandomTest, MatchesDoubleReference) {
  std::mt19937 rng(20261122);
  for (int i = 0; i < 260; ++i) {
    const Problem p = RandomProblem(&rng);
    Views v;
    RunMha(p, 1 + i % 4, &v);
    if (HasFatalFailure()) return;
    CheckAgainstReference(p, v);
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

// Long key sequences without weights take the online-softmax path (key blocks of 512); with
// causal and masks, and several query blocks.
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
    Views v1, v2;
    RunMha(p, 2, &v2);
    RunMha(p, 1, &v1);
    if (HasFatalFailure()) return;
    CheckAgainstReference(p, v2);
    ASSERT_EQ(0, std::memcmp(v1.output.data(), v2.output.data(), v1.output.size() * 4))
        << p.Describe();
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
    CheckAgainstReference(p, v);
  }
}

// The whole operator on every SIMD target compiled in and supported here (the kernels'
// dispatch is forced per target): each agrees with the double reference within the same
// tolerance, so targets agree with each other within twice that.
TEST(AttentionRandomTest, EverySimdTarget) {
  test::ForEachTarget([&](const char* target) {
    std::mt19937 rng(123);
    for (int i = 0; i < 40; ++i) {
      const Problem p = RandomProblem(&rng, i % 5 == 0 ? 80 : 9);
      Views v;
      RunMha(p, 1 + i % 3, &v);
      if (HasFatalFailure()) return;
      CheckAgainstReference(p, v);
      if (HasFailure()) {
        ADD_FAILURE() << "target " << target << ", random problem #" << i;
        return;
      }
    }
  });
}

}  // namespace
}  // namespace mha
