// ContextOptions' per-context settings (runtime/context.cc): the grouped forward's rule and the
// kernel of Compute::kBF16 products. Invalid values are refused naming the option, the expected
// and the actual value; each context plans and computes with its own setting whatever the
// others hold (two contexts of one process differ); Plan's bytes hold for every grouping.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm_bf16.h"
#include "mha/mha.hpp"
#include "runtime/arena.h"
#include "runtime/attention_impl.h"
#include "runtime/forward_plan.h"
#include "tests/attention_test_util.h"

namespace mha {
namespace {

using testing_util::Problem;
using testing_util::Views;

std::unique_ptr<Context> MakeContext(const ContextOptions& options) {
  std::unique_ptr<Context> ctx;
  const Status s = Context::Create(options, &ctx);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return ctx;
}

// Self-attention of N entries of L tokens, batch-first, prepacked f32 weights (the grouped
// forward's conditions) or bf16 compute.
Problem SelfAttention(int64_t E, int64_t H, int64_t N, int64_t L, Compute compute, unsigned seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.config.embed_dim = E;
  p.config.num_heads = H;
  p.config.batch_first = true;
  p.config.prepack = WeightPrepack::kOn;
  p.config.compute = compute;
  p.N = N;
  p.L = p.S = L;
  p.self_attention = true;
  testing_util::FillProblem(&p, &rng);
  return p;
}

void ExpectInvalid(const ContextOptions& options, const std::string& message) {
  std::unique_ptr<Context> ctx;
  const Status s = Context::Create(options, &ctx);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  EXPECT_EQ(ctx, nullptr);
}

TEST(ContextOptionsTest, RefusesAnUnknownGroupedForward) {
  ContextOptions o;
  o.grouped_forward = static_cast<GroupedForward>(2);
  ExpectInvalid(o, "grouped_forward: expected kAuto (0) or kOff (1), got 2");
}

TEST(ContextOptionsTest, RefusesAnUnknownOrUnavailableBf16Kernel) {
  ContextOptions o;
  o.bf16_kernel = static_cast<Bf16KernelChoice>(7);
  ExpectInvalid(o, "bf16_kernel: expected one of kAuto (0), emulated (1)");
  ExpectInvalid(o, ", got 7");
  // No CPU runs both AMX and Arm's BF16: at least one of them is refused here.
  int refused = 0;
  const std::pair<Bf16KernelChoice, kernels::Bf16Kernel> natives[] = {
      {Bf16KernelChoice::kAvx512Bf16, kernels::Bf16Kernel::kAvx512Bf16},
      {Bf16KernelChoice::kAmx, kernels::Bf16Kernel::kAmx},
      {Bf16KernelChoice::kNeonBf16, kernels::Bf16Kernel::kNeonBf16}};
  for (const auto& [choice, kernel] : natives) {
    o.bf16_kernel = choice;
    if (kernels::Bf16KernelAvailable(kernel)) {
      EXPECT_STREQ(MakeContext(o)->bf16_kernel(), kernels::Bf16KernelName(kernel));
      continue;
    }
    ++refused;
    ExpectInvalid(o, std::string("bf16_kernel: expected a kernel this CPU runs, one of kAuto (0), "
                                 "emulated (1)"));
    ExpectInvalid(o, std::string(", got ") + kernels::Bf16KernelName(kernel) + " (" +
                         std::to_string(static_cast<int>(choice)) + ")");
  }
  EXPECT_GE(refused, 1);
}

TEST(ContextOptionsTest, Bf16KernelNamesTheContextsKernel) {
  ContextOptions o;
  EXPECT_STREQ(MakeContext(o)->bf16_kernel(), Bf16Kernel());
  o.bf16_kernel = Bf16KernelChoice::kEmulated;
  EXPECT_STREQ(MakeContext(o)->bf16_kernel(), "emulated");
}

// The problem with inputs scaled into f32's subnormals and no biases: its projections, attention
// results and output are subnormal, which the emulated kernel computes and the x86 native
// kernels (VDPBF16PS, AMX) read as zero (kernels/gemm_bf16.h, Numerics).
Problem Subnormal(Problem p) {
  p.config.bias = false;
  std::mt19937 rng(3);
  testing_util::FillProblem(&p, &rng);
  for (float& x : p.query) x *= 1e-39f;
  return p;
}

void ExpectContextsComputeOnTheirKernels(const Problem& p) {
  std::vector<kernels::Bf16Kernel> kernels_here;
  for (kernels::Bf16Kernel k : {kernels::Bf16Kernel::kEmulated, kernels::Bf16Kernel::kAvx512Bf16,
                                kernels::Bf16Kernel::kAmx, kernels::Bf16Kernel::kNeonBf16}) {
    if (kernels::Bf16KernelAvailable(k)) kernels_here.push_back(k);
  }
  std::vector<Views> forced(kernels_here.size());
  for (size_t i = 0; i < kernels_here.size(); ++i) {
    kernels::ForceBf16Kernel(kernels_here[i]);
    testing_util::RunForward(p, 2, &forced[i]);
  }
  kernels::ForceBf16Kernel(kernels::Bf16DefaultKernel());
  if (::testing::Test::HasFatalFailure()) return;
  // One layer, contexts on every kernel in turn, twice (each context's choice holds whatever
  // ran before it).
  std::unique_ptr<MultiheadAttention> layer;
  ASSERT_TRUE(
      MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &layer).ok());
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < kernels_here.size(); ++i) {
      ContextOptions o;
      o.num_threads = 2;
      o.bf16_kernel = static_cast<Bf16KernelChoice>(static_cast<int>(kernels_here[i]) + 1);
      Views v;
      testing_util::RunLayerOn(*layer, p, o, &v);
      if (::testing::Test::HasFatalFailure()) return;
      testing_util::ExpectSameBits(
          v.output, forced[i].output,
          std::string("context on ") + kernels::Bf16KernelName(kernels_here[i]));
    }
  }
#if defined(__x86_64__)
  if (kernels_here.size() > 1 && !p.config.bias) {
    EXPECT_NE(0, std::memcmp(forced[0].output.data(), forced.back().output.data(),
                             forced[0].output.size() * sizeof(float)))
        << "emulated and " << kernels::Bf16KernelName(kernels_here.back())
        << " gave the same bits on subnormal inputs: this test could not tell the contexts apart";
  }
#endif
}

// Each context computes on its own kernel: a context that names a kernel gives the bits of a
// default context with that kernel forced process-wide, while other contexts of the process
// run other kernels. On x86 the emulated and a native kernel differ on subnormal inputs, so a
// context that ignored its option would fail there.
TEST(ContextOptionsTest, EachContextComputesOnItsBf16Kernel) {
  for (const Problem& p : {SelfAttention(96, 3, 2, 37, Compute::kBF16, 11),
                           Subnormal(SelfAttention(64, 2, 2, 9, Compute::kBF16, 12))}) {
    ExpectContextsComputeOnTheirKernels(p);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Every ContextOptions value of the enums maps to the kernel of the same name.
TEST(ContextOptionsTest, Bf16KernelChoicesMapToTheirKernels) {
  EXPECT_EQ(static_cast<int>(Bf16KernelChoice::kEmulated),
            static_cast<int>(kernels::Bf16Kernel::kEmulated) + 1);
  EXPECT_EQ(static_cast<int>(Bf16KernelChoice::kAvx512Bf16),
            static_cast<int>(kernels::Bf16Kernel::kAvx512Bf16) + 1);
  EXPECT_EQ(static_cast<int>(Bf16KernelChoice::kAmx),
            static_cast<int>(kernels::Bf16Kernel::kAmx) + 1);
  EXPECT_EQ(static_cast<int>(Bf16KernelChoice::kNeonBf16),
            static_cast<int>(kernels::Bf16Kernel::kNeonBf16) + 1);
}

size_t BatchGroupOn(const MultiheadAttention& layer, const Problem& p,
                    const ContextOptions& options) {
  const std::unique_ptr<Context> ctx = MakeContext(options);
  Views v;
  testing_util::MakeViews(p, &v);
  ForwardPlan plan;
  const Status s = ForwardPlanForTesting(layer, *ctx, v.in, v.out, &plan);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return plan.batch_group;
}

// A context's group_rows and group_max_bytes decide its plans, kOff turns grouping off, and
// every setting gives the same bits.
TEST(ContextOptionsTest, EachContextGroupsByItsOptions) {
  if (!testing_util::GroupingPossible()) {
    GTEST_SKIP() << "this build does not prepack f32 weights: no forward runs grouped";
  }
  const Problem p = SelfAttention(32, 2, 8, 6, Compute::kF32, 5);
  std::unique_ptr<MultiheadAttention> layer;
  ASSERT_TRUE(
      MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &layer).ok());
  ContextOptions two_per_group;
  two_per_group.num_threads = 2;
  two_per_group.group_rows = 2 * static_cast<size_t>(p.L);  // groups of 2 entries
  two_per_group.group_max_bytes = size_t{1} << 30;
  ContextOptions four_per_group = two_per_group;
  four_per_group.group_rows = 4 * static_cast<size_t>(p.L);
  ContextOptions too_small = two_per_group;
  too_small.group_max_bytes = 1;
  ContextOptions off = two_per_group;
  off.grouped_forward = GroupedForward::kOff;
  EXPECT_EQ(BatchGroupOn(*layer, p, two_per_group), 2u);
  EXPECT_EQ(BatchGroupOn(*layer, p, four_per_group), 4u);
  EXPECT_EQ(BatchGroupOn(*layer, p, too_small), 0u);
  EXPECT_EQ(BatchGroupOn(*layer, p, off), 0u);
  Views want;
  testing_util::RunLayerOn(*layer, p, off, &want);
  for (const ContextOptions& o : {two_per_group, four_per_group, too_small}) {
    Views got;
    testing_util::RunLayerOn(*layer, p, o, &got);
    if (::testing::Test::HasFatalFailure()) return;
    testing_util::ExpectSameBits(got.output, want.output,
                                 "group_rows " + std::to_string(o.group_rows));
  }
  testing_util::ExpectMatchesReference(p, want);
}

// Plan's bytes do not depend on the context: they cover the largest group any grouping can
// choose (each forward's plan on a context of any group_rows fits them).
TEST(ContextOptionsTest, PlanBoundsEveryGrouping) {
  for (const int64_t N : {2, 3, 5, 8, 13}) {
    for (const size_t threads : {size_t{1}, size_t{2}, size_t{3}}) {
      const Problem p = SelfAttention(48, 4, N, 5, Compute::kF32, 17 + static_cast<unsigned>(N));
      std::unique_ptr<MultiheadAttention> layer;
      ASSERT_TRUE(
          MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &layer).ok());
      Views v;
      testing_util::MakeViews(p, &v);
      size_t bound = 0;
      ASSERT_TRUE(layer->Plan(v.in, v.out, threads, &bound).ok());
      for (int64_t group = 1; group <= N; ++group) {
        ContextOptions o;
        o.num_threads = threads;
        o.group_rows = static_cast<size_t>(group * p.L);
        o.group_max_bytes = SIZE_MAX;
        const std::unique_ptr<Context> ctx = MakeContext(o);
        ForwardPlan plan;
        ASSERT_TRUE(ForwardPlanForTesting(*layer, *ctx, v.in, v.out, &plan).ok());
        EXPECT_LE(ArenaBytesFor(plan.total), bound)
            << "N " << N << ", " << threads << " threads, group_rows " << o.group_rows
            << " (batch_group " << plan.batch_group << ")";
      }
    }
  }
}

}  // namespace
}  // namespace mha
