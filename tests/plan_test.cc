// Plans are upper bounds from shapes alone: a caller arena of exactly the planned bytes, at any
// address, runs every forward with those shapes (in place or not, key/value the query's view or
// a copy of it, chunked or not), KV-cache call and projection, and allocates nothing; one byte
// less fails with OutOfMemory naming the planned bytes where the plan is tight, and writes
// nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tests/alloc_counter.h"
#include "tests/attention_test_util.h"
#include "tests/random_util.h"

namespace mha {
namespace {

using testing_util::Problem;
using testing_util::ScopedKeyChunking;
using testing_util::Views;

// Offsets from a 64-byte boundary at which caller buffers start; 1 is the worst case (63 bytes
// of alignment slack).
constexpr size_t kOffsets[] = {0, 8, 16, 32, 48, 1};

// Heap bytes with room for `bytes` starting `offset` bytes past a 64-byte boundary.
struct CallerBuffer {
  CallerBuffer(size_t bytes, size_t offset) : raw(bytes + 128) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(raw.data());
    data = raw.data() + ((64 - a % 64) % 64) + offset;
  }
  std::vector<uint8_t> raw;
  uint8_t* data;
};

std::unique_ptr<MultiheadAttention> LayerOf(const Problem& p) {
  std::unique_ptr<MultiheadAttention> layer;
  const Status s =
      MultiheadAttention::Create(p.config, testing_util::WeightsOf(p), p.binding, &layer);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return layer;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Context over a caller buffer of `bytes` at `offset`, `threads` threads.
std::unique_ptr<Context> CallerContext(const CallerBuffer& buf, size_t bytes, size_t threads) {
  ContextOptions o;
  o.num_threads = threads;
  o.arena_buffer = buf.data;
  o.arena_bytes = bytes;
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(o, &ctx).ok());
  return ctx;
}

std::unique_ptr<Context> OwnedContext(size_t threads) {
  ContextOptions o;
  o.num_threads = threads;
  std::unique_ptr<Context> ctx;
  EXPECT_TRUE(Context::Create(o, &ctx).ok());
  return ctx;
}

// Runs fn() and returns the heap allocations it made (0 under sanitizers, which own malloc).
template <typename Fn>
long CountAllocations(const Fn& fn) {
  g_allocations = 0;
  g_counting = true;
  fn();
  g_counting = false;
  return g_allocations.load();
}

// One way of calling a problem's forward: its own views, or in place (output = query).
struct Call {
  const char* name;
  AttentionInputs in;
  AttentionOutputs out;
  std::vector<float>* result;  // where the output lands
};

// Every call of `calls` (same shapes) gets the same plan; each runs on caller arenas of exactly
// that many bytes at every offset, allocation-free, with the bits an owned arena gives; one byte
// less at offset 1 fails cleanly when the plan is tight for that call. `restore` refills the
// inputs an in-place call overwrote. Counts the calls where the plan was tight in *tight.
void CheckCalls(const MultiheadAttention& layer, std::vector<Call>& calls, size_t threads,
                const std::vector<float>& query_copy, std::vector<float>* query,
                const std::string& what, int* tight) {
  size_t plan = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    size_t p = 0;
    const Status s = layer.Plan(calls[c].in, calls[c].out, threads, &p);
    EXPECT_TRUE(s.ok()) << what << " " << calls[c].name << ": " << s.ToString();
    if (c == 0) plan = p;
    EXPECT_EQ(p, plan) << what << ": " << calls[c].name << " planned differently from "
                       << calls[0].name;
  }
  for (Call& call : calls) {
    const std::string where = what + " " + call.name;
    // The owned arena's bits, and the bytes this call really uses.
    std::copy(query_copy.begin(), query_copy.end(), query->begin());
    auto owned = OwnedContext(threads);
    Status s = layer.Forward(*owned, call.in, call.out);
    ASSERT_TRUE(s.ok()) << where << ": " << s.ToString();
    const std::vector<float> expected = *call.result;
    const size_t used = owned->arena_high_water();
    EXPECT_LE(used + 63, plan) << where;

    for (size_t offset : kOffsets) {
      CallerBuffer buf(plan, offset);
      auto ctx = CallerContext(buf, plan, threads);
      std::copy(query_copy.begin(), query_copy.end(), query->begin());
      const long allocations = CountAllocations([&] { s = layer.Forward(*ctx, call.in, call.out); });
      ASSERT_TRUE(s.ok()) << where << " offset " << offset << ": " << s.ToString();
      EXPECT_EQ(allocations, 0) << where << " offset " << offset;
      EXPECT_TRUE(SameBits(*call.result, expected)) << where << " offset " << offset;
    }
    if (used + 63 == plan) {
      ++*tight;
      CallerBuffer buf(plan - 1, 1);
      auto ctx = CallerContext(buf, plan - 1, threads);
      std::copy(query_copy.begin(), query_copy.end(), query->begin());
      std::fill(call.result->begin(), call.result->end(), 7.0f);
      const std::vector<float> before = *call.result;
      s = layer.Forward(*ctx, call.in, call.out);
      EXPECT_EQ(s.code(), StatusCode::kOutOfMemory) << where << ": " << s.ToString();
      EXPECT_NE(s.message().find(std::to_string(plan)), std::string::npos)
          << where << ": the message should name the planned bytes " << plan << ": "
          << s.message();
      EXPECT_TRUE(SameBits(*call.result, before)) << where << ": a failed forward wrote output";
    }
  }
}

TEST(PlanTest, ForwardFitsThePlanAtAnyAlignmentInPlaceOrNot) {
  std::mt19937 rng(26);
  int tight = 0, in_place = 0, chunked_runs = 0;
  for (int iter = 0; iter < 60; ++iter) {
    // A third of the problems take the chunked path wherever it applies (chunks of 1-3 keys).
    const int64_t chunk = iter % 3 == 0 ? 1 + iter % 4 : 0;
    ScopedKeyChunking chunking(chunk);
    Problem p = testing_util::RandomProblem(&rng, 12);
    const size_t threads = 1 + static_cast<size_t>(iter % 3);
    std::unique_ptr<MultiheadAttention> layer = LayerOf(p);
    ASSERT_NE(layer, nullptr);
    Views v;
    testing_util::MakeViews(p, &v);
    const std::vector<float> query_copy = p.query;
    std::vector<Call> calls;
    calls.push_back({"out of place", v.in, v.out, &v.output});
    const int64_t E = p.config.embed_dim;
    const int64_t qd = p.config.q_dim ? p.config.q_dim : E;
    if (p.self_attention) {
      // Key and value as the query's own view: the same shapes as key absent.
      Call explicit_self = calls[0];
      explicit_self.name = "key = value = query view";
      explicit_self.in.key = explicit_self.in.value = v.in.query;
      calls.push_back(explicit_self);
    }
    // In place: the output is the query's storage (its shape when q_dim == E).
    std::vector<float> in_place_result;
    if (qd == E) {
      Call c = calls[0];
      c.name = "in place";
      c.out.output = v.in.query;
      if (p.self_attention) c.in.key = c.in.value = v.in.query;
      c.result = &p.query;
      calls.push_back(c);
      ++in_place;
    }
    chunked_runs += chunk > 0 && !p.need_weights;
    CheckCalls(*layer, calls, threads, query_copy, &p.query, p.Describe(), &tight);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(in_place, 10);
  EXPECT_GT(chunked_runs, 5);
  EXPECT_GT(tight, 10) << "too few calls where the plan is tight to check one byte less";
}

// A random problem's layer with positions-based variants and QK-norm (RoPE where head_dim
// allows it, else ALiBi), and positions inputs for its views.
struct VariantLayer {
  std::vector<float> q_norm, k_norm;
  std::vector<int64_t> positions, key_positions;
  std::unique_ptr<MultiheadAttention> layer;
};

void MakeVariantLayer(Problem* p, std::mt19937* rng, VariantLayer* vl) {
  AttentionConfig& c = p->config;
  c.add_bias_kv = c.add_zero_attn = false;  // their keys have no position
  const int64_t E = c.embed_dim, hd = E / c.num_heads;
  const int64_t kvE = (c.num_kv_heads ? c.num_kv_heads : c.num_heads) * hd;
  AttentionConfig vc = c;
  if (hd >= 2) {
    vc.rope = (*rng)() % 2 ? RopeStyle::kNeox : RopeStyle::kGptj;
    vc.rotary_dim = hd - hd % 2;
  } else {
    vc.alibi = true;
  }
  vc.qk_norm_whole = (*rng)() % 2 == 0;
  vl->q_norm.assign(vc.qk_norm_whole ? E : hd, 1.25f);
  vl->k_norm.assign(vc.qk_norm_whole ? kvE : hd, 0.75f);
  AttentionWeights w = testing_util::WeightsOf(*p);
  w.q_norm_weight = vl->q_norm.data();
  w.k_norm_weight = vl->k_norm.data();
  const Status s = MultiheadAttention::Create(vc, w, p->binding, &vl->layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int64_t i = 0; i < p->N * p->L; ++i) vl->positions.push_back((*rng)() % 1000);
  for (int64_t i = 0; i < p->N * p->S; ++i) vl->key_positions.push_back((*rng)() % 1000);
}

void AddPositions(const Problem& p, bool keys, VariantLayer* vl, AttentionInputs* in) {
  const int64_t qs[2] = {p.N, p.L}, ks[2] = {p.N, p.S};
  const int rank = p.batched ? 2 : 1;
  ASSERT_TRUE(TensorView::Dense(vl->positions.data(), DType::kI64, rank, p.batched ? qs : qs + 1,
                                &in->positions)
                  .ok());
  if (keys) {
    ASSERT_TRUE(TensorView::Dense(vl->key_positions.data(), DType::kI64, rank,
                                  p.batched ? ks : ks + 1, &in->key_positions)
                    .ok());
  }
}

TEST(PlanTest, ForwardWithPositionsAndQkTransformFitsThePlan) {
  std::mt19937 rng(31);
  int with_positions = 0, chunked_runs = 0;
  for (int iter = 0; iter < 30; ++iter) {
    const int64_t chunk = iter % 3 == 0 ? 1 + iter % 4 : 0;
    ScopedKeyChunking chunking(chunk);
    Problem p = testing_util::RandomProblem(&rng, 12);
    VariantLayer vl;
    MakeVariantLayer(&p, &rng, &vl);
    ASSERT_NE(vl.layer, nullptr);
    const size_t threads = 1 + static_cast<size_t>(iter % 3);
    Views v;
    testing_util::MakeViews(p, &v);
    const bool positions = iter % 4 != 3;  // else the default positions
    if (positions) AddPositions(p, !p.self_attention && iter % 2 == 0, &vl, &v.in);
    with_positions += positions;
    const std::vector<float> query_copy = p.query;
    std::vector<Call> calls;
    calls.push_back({"out of place", v.in, v.out, &v.output});
    if (p.self_attention) {
      Call explicit_self = calls[0];
      explicit_self.name = "key = value = query view";
      explicit_self.in.key = explicit_self.in.value = v.in.query;
      calls.push_back(explicit_self);
    }
    chunked_runs += chunk > 0 && !p.need_weights;
    int tight = 0;
    CheckCalls(*vl.layer, calls, threads, query_copy, &p.query, p.Describe(), &tight);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(with_positions, 15);
  EXPECT_GT(chunked_runs, 2);
}

TEST(PlanTest, CrossAttentionWithKeyAsACopyOfTheQueryPlansLikeSelfAttention) {
  // Same shapes, key/value the query's view or a copy of it: one plan covers both (with
  // add_bias_kv, the fused [tokens, 3E] projection buffer of self-attention and the three
  // separate ones round differently).
  std::mt19937 rng(7);
  Problem p;
  p.config.embed_dim = 20;
  p.config.num_heads = 4;
  p.config.add_bias_kv = true;
  p.config.batch_first = true;
  p.N = 1;
  p.L = p.S = 7;
  testing_util::FillProblem(&p, &rng);
  std::unique_ptr<MultiheadAttention> layer = LayerOf(p);
  ASSERT_NE(layer, nullptr);
  Views v;
  testing_util::MakeViews(p, &v);
  std::vector<float> copy = p.query;
  AttentionInputs cross = v.in;
  const int64_t shape[3] = {p.N, p.L, 20};
  ASSERT_TRUE(TensorView::Dense(copy.data(), DType::kF32, 3, shape, &cross.key).ok());
  cross.value = cross.key;
  AttentionInputs self = v.in;
  self.key = self.value = v.in.query;
  size_t a = 0, b = 0;
  ASSERT_TRUE(layer->Plan(cross, v.out, 2, &a).ok());
  ASSERT_TRUE(layer->Plan(self, v.out, 2, &b).ok());
  EXPECT_EQ(a, b);
  for (size_t offset : kOffsets) {
    CallerBuffer buf(a, offset);
    auto ctx = CallerContext(buf, a, 2);
    ASSERT_TRUE(layer->Forward(*ctx, cross, v.out).ok()) << offset;
    ASSERT_TRUE(layer->Forward(*ctx, self, v.out).ok()) << offset;
  }
}

TEST(PlanTest, ProjectFitsItsPlanAtAnyAlignment) {
  std::mt19937 rng(11);
  Problem p;
  p.config.embed_dim = 24;
  p.config.num_heads = 3;
  p.config.batch_first = true;
  p.N = 2;
  p.L = 9;
  p.S = 13;
  testing_util::FillProblem(&p, &rng);
  std::unique_ptr<MultiheadAttention> layer = LayerOf(p);
  ASSERT_NE(layer, nullptr);
  Views v;
  testing_util::MakeViews(p, &v);
  const int64_t hd = 8;
  std::vector<float> q(p.N * 3 * p.L * hd), k(p.N * 3 * p.S * hd), vv(k.size());
  ProjectionOutputs out;
  const int64_t qs[4] = {p.N, 3, p.L, hd}, ks[4] = {p.N, 3, p.S, hd};
  ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &out.q).ok());
  ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, ks, &out.k).ok());
  ASSERT_TRUE(TensorView::Dense(vv.data(), DType::kF32, 4, ks, &out.v).ok());
  for (size_t threads : {1, 3}) {
    size_t plan = 0;
    ASSERT_TRUE(layer->PlanProject(v.in, out, threads, &plan).ok());
    for (size_t offset : kOffsets) {
      CallerBuffer buf(plan, offset);
      auto ctx = CallerContext(buf, plan, threads);
      Status s;
      const long allocations = CountAllocations([&] { s = layer->Project(*ctx, v.in, out); });
      ASSERT_TRUE(s.ok()) << offset << ": " << s.ToString();
      EXPECT_EQ(allocations, 0) << offset;
    }
  }
}

TEST(PlanTest, ProjectWithPositionsAndQkTransformFitsItsPlan) {
  std::mt19937 rng(12);
  for (int iter = 0; iter < 8; ++iter) {
    Problem p = testing_util::RandomProblem(&rng, 12);
    VariantLayer vl;
    MakeVariantLayer(&p, &rng, &vl);
    ASSERT_NE(vl.layer, nullptr);
    Views v;
    testing_util::MakeViews(p, &v);
    if (iter % 2 == 0) AddPositions(p, !p.self_attention, &vl, &v.in);
    const int64_t H = p.config.num_heads, hd = p.config.embed_dim / H;
    const int64_t KVH = p.config.num_kv_heads ? p.config.num_kv_heads : H;
    std::vector<float> q(p.N * H * p.L * hd), k(p.N * KVH * p.S * hd), vv(k.size());
    ProjectionOutputs out;
    const int64_t qs[4] = {p.N, H, p.L, hd}, ks[4] = {p.N, KVH, p.S, hd};
    ASSERT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &out.q).ok());
    ASSERT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, ks, &out.k).ok());
    ASSERT_TRUE(TensorView::Dense(vv.data(), DType::kF32, 4, ks, &out.v).ok());
    const size_t threads = 1 + iter % 3;
    size_t plan = 0;
    ASSERT_TRUE(vl.layer->PlanProject(v.in, out, threads, &plan).ok());
    std::vector<float> want_q;
    for (size_t offset : kOffsets) {
      CallerBuffer buf(plan, offset);
      auto ctx = CallerContext(buf, plan, threads);
      Status s;
      const long allocations = CountAllocations([&] { s = vl.layer->Project(*ctx, v.in, out); });
      ASSERT_TRUE(s.ok()) << offset << ": " << s.ToString() << " " << p.Describe();
      EXPECT_EQ(allocations, 0) << offset;
      if (want_q.empty()) want_q = q;
      EXPECT_TRUE(SameBits(q, want_q)) << offset;
    }
  }
}

TEST(PlanTest, KvCacheCallsFitTheCachePlanAtAnyAlignment) {
  std::mt19937 rng(35);
  for (const int64_t kv_heads : {4, 2}) {
    Problem p;
    p.config.embed_dim = 32;
    p.config.num_heads = 4;
    p.config.num_kv_heads = kv_heads;
    p.config.batch_first = true;
    p.packed = false;
    testing_util::FillProblem(&p, &rng);
    std::unique_ptr<MultiheadAttention> layer = LayerOf(p);
    ASSERT_NE(layer, nullptr);
    const int64_t N = 2, T = 70, capacity = 600;
    std::vector<float> x = test::SymmetricFloats(N * T * 32, 1.0f, &rng);
    std::vector<float> y(N * T * 32);
    for (size_t threads : {1, 2}) {
      std::unique_ptr<KvCache> cache;
      ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*layer, N, capacity), &cache).ok());
      size_t plan = 0;
      ASSERT_TRUE(cache->Plan(*layer, T, threads, &plan).ok());
      for (size_t offset : kOffsets) {
        cache->Reset();
        CallerBuffer buf(plan, offset);
        auto ctx = CallerContext(buf, plan, threads);
        // Prefill of T tokens, then every token count down to 1 (split and blocked schedules),
        // with a cache growing towards its capacity.
        for (int64_t t = T; t >= 1; t = t > 8 ? t / 2 : t - 1) {
          const int64_t shape[3] = {N, t, 32};
          TensorView xv, yv;
          ASSERT_TRUE(TensorView::Dense(x.data(), DType::kF32, 3, shape, &xv).ok());
          ASSERT_TRUE(TensorView::Dense(y.data(), DType::kF32, 3, shape, &yv).ok());
          Status s;
          const long allocations = CountAllocations([&] { s = cache->Step(*ctx, *layer, xv, yv); });
          ASSERT_TRUE(s.ok()) << "t " << t << " offset " << offset << ": " << s.ToString();
          EXPECT_EQ(allocations, 0) << "t " << t << " offset " << offset;
          ASSERT_TRUE(cache->Forward(*ctx, *layer, xv, yv).ok()) << t;
        }
      }
    }
    std::unique_ptr<KvCache> cache;
    ASSERT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*layer, N, capacity), &cache).ok());
    size_t plan = 0;
    EXPECT_EQ(cache->Plan(*layer, 0, 1, &plan).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace mha
