// Plans made once and reused (runtime/plan_cache.h): a cache makes a plan once per key and again
// when any part of the key changes (layer, shapes, aliasing, threads, the settings epoch), keeps
// its last 16 keys; the testing hooks and forced dispatch advance the epoch; and a context that
// reuses its plans, across shapes and a changed key chunking, gives the bits of fresh contexts.
#include "runtime/plan_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/targets.h"
#include "mha/mha.hpp"
#include "tests/attention_test_util.h"

namespace mha {
namespace {

using testing_util::Problem;
using testing_util::ScopedKeyChunking;
using testing_util::Views;

TEST(PlanCacheTest, MakesEachPlanOncePerKey) {
  ForwardPlanCache cache;
  int made = 0;
  auto get = [&](const ForwardPlanKey& k) {
    return cache.Get(k, [&] {
      ++made;
      ForwardPlan p;
      p.total = static_cast<size_t>(k.layer * 1000 + k.threads);
      return p;
    });
  };
  ForwardPlanKey k;
  k.layer = 1;
  k.threads = 2;
  k.shapes.N = 2;
  k.shapes.L = 16;
  EXPECT_EQ(get(k).total, 1002u);
  EXPECT_EQ(get(k).total, 1002u);
  EXPECT_EQ(made, 1);
  ForwardPlanKey other = k;
  other.threads = 3;
  EXPECT_EQ(get(other).total, 1003u);
  other = k;
  other.shapes.L = 17;
  get(other);
  other = k;
  other.shapes.q.layout.token = 5;
  get(other);
  other = k;
  other.aliasing.self_attention = true;
  get(other);
  other = k;
  other.epoch = 1;
  get(other);
  other = k;
  other.grouping.rows = 256;
  get(other);
  other = k;
  other.grouping.max_bytes = 1;
  get(other);
  EXPECT_EQ(made, 8);
  get(k);
  EXPECT_EQ(made, 8) << "the first key is still held";
  // 16 more layers push the first key out.
  for (uint64_t layer = 100; layer < 116; ++layer) {
    other = k;
    other.layer = layer;
    get(other);
  }
  EXPECT_EQ(made, 24);
  get(k);
  EXPECT_EQ(made, 25);
}

TEST(PlanCacheTest, SettingsAdvanceTheEpoch) {
  uint64_t epoch = PlanSettingsEpoch();
  {
    ScopedKeyChunking chunking(8);
    EXPECT_NE(PlanSettingsEpoch(), epoch);
    epoch = PlanSettingsEpoch();
  }
  EXPECT_NE(PlanSettingsEpoch(), epoch);
  epoch = PlanSettingsEpoch();
  kernels::ForceTarget(0);
  EXPECT_NE(PlanSettingsEpoch(), epoch);
}

// One context runs forwards of two shapes in turn, with and without a key chunking that sends
// the longer one down the key-chunked path: every output equals a fresh context's, bitwise.
TEST(PlanCacheTest, ReusedPlansGiveFreshPlansBits) {
  std::mt19937 rng(21);
  Problem shapes[2];
  for (int i = 0; i < 2; ++i) {
    Problem& p = shapes[i];
    p.config.embed_dim = 32;
    p.config.num_heads = 4;
    p.config.batch_first = true;
    p.N = 2;
    p.self_attention = true;
    p.L = p.S = i == 0 ? 9 : 40;
    p.causal = i == 1;
    testing_util::FillProblem(&p, &rng);
  }
  ContextOptions co;
  co.num_threads = 2;
  std::unique_ptr<Context> shared;
  ASSERT_TRUE(Context::Create(co, &shared).ok());
  std::vector<std::unique_ptr<MultiheadAttention>> layers;
  for (const Problem& p : shapes) {
    std::unique_ptr<MultiheadAttention> layer;
    ASSERT_TRUE(
        MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &layer).ok());
    layers.push_back(std::move(layer));
  }
  for (const int64_t chunk_keys : {0, 16, 0}) {
    ScopedKeyChunking chunking(chunk_keys);
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 2; ++i) {
        Views reused, fresh;
        testing_util::MakeViews(shapes[i], &reused);
        testing_util::MakeViews(shapes[i], &fresh);
        ASSERT_TRUE(layers[i]->Forward(*shared, reused.in, reused.out).ok());
        std::unique_ptr<Context> ctx;
        ASSERT_TRUE(Context::Create(co, &ctx).ok());
        ASSERT_TRUE(layers[i]->Forward(*ctx, fresh.in, fresh.out).ok());
        ASSERT_EQ(std::memcmp(reused.output.data(), fresh.output.data(),
                              reused.output.size() * sizeof(float)),
                  0)
            << "shape " << i << ", chunk_keys " << chunk_keys << ", round " << round;
      }
    }
  }
}

}  // namespace
}  // namespace mha
