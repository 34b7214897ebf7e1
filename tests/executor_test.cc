// Contexts on a host's executor (mha::Executor, mha_executor): every entry point gives outputs
// bitwise equal to the owned pool's, no thread is started, bad executor options and hosts that
// break the contract are reported.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.h"
#include "mha/mha.hpp"
#include "runtime/thread_pool.h"
#include "tests/attention_test_util.h"
#include "tests/c_api_test_util.h"
#include "tests/host_pool.h"
#include "tests/random_util.h"

namespace mha {
namespace {

using testing_util::HostPool;
using testing_util::SerialExecutor;

TensorView Dense3(std::vector<float>* data, int64_t a, int64_t b, int64_t c) {
  const int64_t shape[3] = {a, b, c};
  data->resize(static_cast<size_t>(a * b * c));
  TensorView v;
  EXPECT_TRUE(TensorView::Dense(data->data(), DType::kF32, 3, shape, &v).ok());
  return v;
}

// A self-attention layer E 64, H 8, KV heads 4, batch-first, weights and inputs from `seed`.
struct Layer {
  static constexpr int64_t kE = 64, kH = 8, kKvh = 4, kKvE = 32;
  explicit Layer(uint32_t seed) {
    std::mt19937 rng(seed);
    wq = test::SymmetricFloats(kE * kE, 1.0f, &rng);
    wk = test::SymmetricFloats(kKvE * kE, 1.0f, &rng);
    wv = test::SymmetricFloats(kKvE * kE, 1.0f, &rng);
    bias = test::SymmetricFloats(kE + 2 * kKvE, 1.0f, &rng);
    wo = test::SymmetricFloats(kE * kE, 1.0f, &rng);
    bo = test::SymmetricFloats(kE, 1.0f, &rng);
    AttentionConfig c;
    c.embed_dim = kE;
    c.num_heads = kH;
    c.num_kv_heads = kKvh;
    c.batch_first = true;
    AttentionWeights w;
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.in_proj_bias = bias.data();
    w.out_proj_weight = wo.data();
    w.out_proj_bias = bo.data();
    const Status s = MultiheadAttention::Create(c, w, WeightBinding::kView, &layer);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  std::vector<float> wq, wk, wv, bias, wo, bo;
  std::unique_ptr<MultiheadAttention> layer;
};

// Everything one context computes: forwards (online path, causal; need_weights averaged and per
// head; the chunked path), Project, and a KV cache prefill plus decode steps (f32 and bf16).
std::vector<float> RunAll(const Layer& l, Context& ctx) {
  constexpr int64_t N = 2, L = 37, E = Layer::kE;
  std::mt19937 rng(11);
  std::vector<float> x = test::SymmetricFloats(N * L * E, 1.0f, &rng);
  std::vector<float> all;
  auto append = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };

  std::vector<float> xd = x, out, weights;
  AttentionInputs in;
  in.query = Dense3(&xd, N, L, E);
  AttentionOutputs o;
  o.output = Dense3(&out, N, L, E);
  for (int variant = 0; variant < 4; ++variant) {
    in.causal = variant == 0 || variant == 3;
    in.need_weights = variant == 1 || variant == 2;
    in.average_attn_weights = variant == 1;
    o.attn_weights = TensorView();
    if (in.need_weights) {
      const int64_t shape[4] = {N, Layer::kH, L, L};
      weights.assign(static_cast<size_t>(N * Layer::kH * L * L), 0.0f);
      if (in.average_attn_weights) {
        const int64_t avg[3] = {N, L, L};
        EXPECT_TRUE(TensorView::Dense(weights.data(), DType::kF32, 3, avg, &o.attn_weights).ok());
      } else {
        EXPECT_TRUE(TensorView::Dense(weights.data(), DType::kF32, 4, shape, &o.attn_weights).ok());
      }
    }
    // Variant 3: keys and values in chunks of 8, the path of long sequences.
    std::unique_ptr<testing_util::ScopedKeyChunking> chunking;
    if (variant == 3) chunking = std::make_unique<testing_util::ScopedKeyChunking>(8);
    std::fill(out.begin(), out.end(), 0.0f);
    const Status s = l.layer->Forward(ctx, in, o);
    EXPECT_TRUE(s.ok()) << s.ToString();
    append(out);
    if (in.need_weights) append(weights);
  }

  std::vector<float> q, k, v;
  ProjectionOutputs p;
  const int64_t qs[4] = {N, Layer::kH, L, Layer::kE / Layer::kH};
  const int64_t kvs[4] = {N, Layer::kKvh, L, Layer::kE / Layer::kH};
  q.assign(static_cast<size_t>(N * E * L), 0.0f);
  k.assign(static_cast<size_t>(N * Layer::kKvE * L), 0.0f);
  v.assign(k.size(), 0.0f);
  EXPECT_TRUE(TensorView::Dense(q.data(), DType::kF32, 4, qs, &p.q).ok());
  EXPECT_TRUE(TensorView::Dense(k.data(), DType::kF32, 4, kvs, &p.k).ok());
  EXPECT_TRUE(TensorView::Dense(v.data(), DType::kF32, 4, kvs, &p.v).ok());
  in = AttentionInputs();
  in.query = Dense3(&xd, N, L, E);
  const Status ps = l.layer->Project(ctx, in, p);
  EXPECT_TRUE(ps.ok()) << ps.ToString();
  append(q);
  append(k);
  append(v);

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::unique_ptr<KvCache> cache;
    EXPECT_TRUE(KvCache::Create(KvCacheOptions::ForLayer(*l.layer, N, L, dtype), &cache).ok());
    // Prefill 30 tokens (entry 1 uses 25 of them), then single-token steps.
    constexpr int64_t kPrefill = 30;
    std::vector<float> prompt(x.begin(), x.begin() + N * kPrefill * E), step_out;
    const int64_t counts[N] = {kPrefill, 25};
    Status s = cache->Step(ctx, *l.layer, Dense3(&prompt, N, kPrefill, E),
                           Dense3(&step_out, N, kPrefill, E), counts);
    EXPECT_TRUE(s.ok()) << s.ToString();
    append(step_out);
    for (int64_t t = 0; t < 5; ++t) {
      std::vector<float> token(x.begin() + (N * kPrefill + t * N) * E,
                               x.begin() + (N * kPrefill + t * N + N) * E);
      s = cache->Step(ctx, *l.layer, Dense3(&token, N, 1, E), Dense3(&step_out, N, 1, E));
      EXPECT_TRUE(s.ok()) << s.ToString();
      append(step_out);
    }
  }
  return all;
}

std::unique_ptr<Context> MakeContext(size_t threads, Executor* executor) {
  ContextOptions o;
  o.num_threads = threads;
  o.executor = executor;
  std::unique_ptr<Context> ctx;
  const Status s = Context::Create(o, &ctx);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return ctx;
}

void ExpectBitwiseEqual(const std::vector<float>& want, const std::vector<float>& got,
                        const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
      << what << " differs from the owned pool";
}

TEST(ExecutorTest, HostPoolsAndSerialExecutorMatchOwnedPoolBitwise) {
  Layer l(3);
  ASSERT_NE(l.layer, nullptr);
  const std::vector<float> owned = RunAll(l, *MakeContext(2, nullptr));
  ASSERT_FALSE(::testing::Test::HasFailure());
  ExpectBitwiseEqual(owned, RunAll(l, *MakeContext(1, nullptr)), "owned pool of 1 thread");

  SerialExecutor serial;
  ExpectBitwiseEqual(owned, RunAll(l, *MakeContext(0, &serial)), "serial executor");

  // 3 threads and the caller: 4 workers, more than the owned pool's 2.
  HostPool with_caller(3, /*caller_runs=*/true);
  auto ctx = MakeContext(4, &with_caller);
  EXPECT_EQ(ctx->num_threads(), 4u);
  ExpectBitwiseEqual(owned, RunAll(l, *ctx), "host pool of 3 threads + the caller");
  EXPECT_GT(with_caller.dispatches(), 0u);

  // 2 threads, the caller only waits.
  HostPool without_caller(2, /*caller_runs=*/false);
  ExpectBitwiseEqual(owned, RunAll(l, *MakeContext(0, &without_caller)),
                     "host pool of 2 threads, caller waiting");
  EXPECT_GT(without_caller.dispatches(), 0u);
}

// Threads of this process (Linux), or -1 where /proc does not list them.
int CountThreads() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/task", ec);
  if (ec) return -1;
  int n = 0;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) ++n;
  return n;
}

TEST(ExecutorTest, ContextOnExecutorStartsNoThread) {
  Layer l(5);
  ASSERT_NE(l.layer, nullptr);
  // Library-wide initialization (BLIS, dispatch) happens before the count.
  RunAll(l, *MakeContext(1, nullptr));
  HostPool pool(2, /*caller_runs=*/true);
  const int before = CountThreads();
  if (before < 0) GTEST_SKIP() << "/proc/self/task is not available";
  {
    auto ctx = MakeContext(0, &pool);
    RunAll(l, *ctx);
    EXPECT_EQ(CountThreads(), before) << "a context on an executor started threads";
  }
  // The count can see threads: an owned pool of 3 shows 2 more.
  auto owned = MakeContext(3, nullptr);
  EXPECT_EQ(CountThreads(), before + 2);
}

TEST(ExecutorTest, BadExecutorOptionsAreRejected) {
  class Workers final : public Executor {
   public:
    explicit Workers(size_t n) : n_(n) {}
    size_t num_workers() const override { return n_; }
    void ParallelFor(uint64_t, TaskFn, void*) override {}

   private:
    size_t n_;
  };
  std::unique_ptr<Context> ctx;
  ContextOptions o;
  Workers none(0);
  o.executor = &none;
  Status s = Context::Create(o, &ctx);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("executor->num_workers(): expected 1..1024, got 0"), std::string::npos)
      << s.message();
  Workers many(1025);
  o.executor = &many;
  s = Context::Create(o, &ctx);
  EXPECT_NE(s.message().find("expected 1..1024, got 1025"), std::string::npos) << s.message();
  Workers two(2);
  o.executor = &two;
  o.num_threads = 3;
  s = Context::Create(o, &ctx);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_threads: expected 0 or the executor's num_workers() 2"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(ctx, nullptr);
  o.num_threads = 2;
  EXPECT_TRUE(Context::Create(o, &ctx).ok());
  EXPECT_EQ(ctx->num_threads(), 2u);
}

// A host that breaks the contract in one way, for one ParallelFor, then behaves (serially).
class BrokenHost final : public Executor {
 public:
  enum class Fault {
    kNone,
    kWorkerOutOfRange,
    kTaskOutOfRange,
    kSkipsTasks,
    kRepeatsTask,
    kSharesWorker
  };
  size_t num_workers() const override { return 2; }
  void ParallelFor(uint64_t n, TaskFn fn, void* arg) override {
    const Fault fault = fault_;
    fault_ = Fault::kNone;
    ++calls_;
    switch (fault) {
      case Fault::kNone:
        for (uint64_t t = 0; t < n; ++t) fn(arg, t, t % 2);
        return;
      case Fault::kWorkerOutOfRange:
        for (uint64_t t = 0; t < n; ++t) fn(arg, t, t == 0 ? 2 : 0);
        return;
      case Fault::kTaskOutOfRange:
        for (uint64_t t = 1; t <= n; ++t) fn(arg, t, 0);
        return;
      case Fault::kSkipsTasks:
        return;
      case Fault::kRepeatsTask:
        for (uint64_t t = 0; t < n; ++t) fn(arg, t, 0);
        fn(arg, 0, 1);
        return;
      case Fault::kSharesWorker: {
        // Task 0 runs on another thread with worker 1 and waits (in its task) until task 1 has
        // been offered with worker 1 too; mha must refuse task 1 rather than share the scratch.
        // The test's own ThreadPool tasks below block for that handshake.
        std::thread t0([&] { fn(arg, 0, 1); });
        while (!first_started_.load()) std::this_thread::yield();
        fn(arg, 1, 1);
        second_offered_.store(true);
        t0.join();
        for (uint64_t t = 2; t < n; ++t) fn(arg, t, 0);
        return;
      }
    }
  }
  Fault fault_ = Fault::kNone;
  int calls_ = 0;
  std::atomic<bool> first_started_{false}, second_offered_{false};
};

TEST(ExecutorTest, HostBreachesOfContractAreDetectedAndReported) {
  using Fault = BrokenHost::Fault;
  Layer l(7);
  ASSERT_NE(l.layer, nullptr);
  SerialExecutor serial;
  const std::vector<float> want = RunAll(l, *MakeContext(0, &serial));
  const struct {
    Fault fault;
    const char* message;
  } cases[] = {
      {Fault::kWorkerOutOfRange,
       "with worker index 2, expected a worker index below num_workers 2"},
      {Fault::kTaskOutOfRange, "expected a task index below n_tasks"},
      {Fault::kSkipsTasks, "returned after 0 task calls, expected"},
      {Fault::kRepeatsTask, "(every task exactly once, all finished before it returns)"},
  };
  for (const auto& c : cases) {
    BrokenHost host;
    auto ctx = MakeContext(0, &host);
    constexpr int64_t N = 1, L = 20, E = Layer::kE;
    std::vector<float> x(N * L * E, 0.25f), out;
    AttentionInputs in;
    in.query = Dense3(&x, N, L, E);
    AttentionOutputs o;
    o.output = Dense3(&out, N, L, E);
    host.fault_ = c.fault;
    Status s = l.layer->Forward(*ctx, in, o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("executor: parallel_for"), std::string::npos) << s.message();
    // The dispatches after the breach did not reach the host.
    EXPECT_EQ(host.calls_, 1) << c.message;
    // The error is cleared: the same context then computes what a sound host computes.
    ExpectBitwiseEqual(want, RunAll(l, *ctx), std::string("after ") + c.message);
  }
}

TEST(ExecutorTest, TwoTasksOnOneWorkerIndexAtOnceAreRefused) {
  BrokenHost host;
  host.fault_ = BrokenHost::Fault::kSharesWorker;
  ThreadPool pool(host, host.num_workers());
  std::atomic<int> ran{0};
  pool.ParallelFor(3, [&](uint64_t task, size_t) {
    if (task == 0) {
      host.first_started_.store(true);
      while (!host.second_offered_.load()) std::this_thread::yield();
    }
    ran.fetch_add(1);
  });
  EXPECT_EQ(ran.load(), 2);  // task 1 was refused
  const Status s = pool.TakeError();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ran task 1 with worker index 1 while another task with that worker "
                             "index was running"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(pool.TakeError().ok());
}

// ---- The C API --------------------------------------------------------------------------------

// A dense f32 mha_tensor [a, b, c] over `data`, resized to hold it.
mha_tensor CTensor(std::vector<float>* data, int64_t a, int64_t b, int64_t c) {
  data->resize(static_cast<size_t>(a * b * c));
  return testing_util::Dense(data->data(), MHA_DTYPE_F32, {a, b, c});
}

// A causal forward with averaged weights, then a KV-cache prefill and decode steps, through the
// C API on `context`.
std::vector<float> RunC(const mha_layer* layer, mha_context* context) {
  constexpr int64_t N = 2, L = 21, E = Layer::kE;
  std::mt19937 rng(5);
  std::vector<float> x = test::SymmetricFloats(N * L * E, 1.0f, &rng), out, weights, all;
  mha_attention_inputs in;
  std::memset(&in, 0, sizeof(in));
  in.query = CTensor(&x, N, L, E);
  const mha_tensor o = CTensor(&out, N, L, E);
  const mha_tensor w = CTensor(&weights, N, L, L);
  EXPECT_EQ(mha_layer_forward(layer, context, &in, &o, &w, MHA_FORWARD_CAUSAL), MHA_STATUS_OK)
      << mha_last_error_message();
  all.insert(all.end(), out.begin(), out.end());
  all.insert(all.end(), weights.begin(), weights.end());
  mha_kv_cache_options co;
  std::memset(&co, 0, sizeof(co));
  co.batch = N;
  co.capacity = L;
  mha_kv_cache* cache = nullptr;
  EXPECT_EQ(mha_kv_cache_create(layer, &co, &cache), MHA_STATUS_OK) << mha_last_error_message();
  std::vector<float> prompt(x.begin(), x.begin() + N * 16 * E), step_out;
  const mha_tensor pt = CTensor(&prompt, N, 16, E), po = CTensor(&step_out, N, 16, E);
  EXPECT_EQ(mha_kv_cache_step(cache, layer, context, &pt, &po, nullptr), MHA_STATUS_OK)
      << mha_last_error_message();
  all.insert(all.end(), step_out.begin(), step_out.end());
  for (int64_t t = 0; t < 3; ++t) {
    std::vector<float> token(x.begin() + (N * 16 + t * N) * E,
                             x.begin() + (N * 16 + t * N + N) * E);
    const mha_tensor tt = CTensor(&token, N, 1, E), to = CTensor(&step_out, N, 1, E);
    EXPECT_EQ(mha_kv_cache_step(cache, layer, context, &tt, &to, nullptr), MHA_STATUS_OK)
        << mha_last_error_message();
    all.insert(all.end(), step_out.begin(), step_out.end());
  }
  mha_kv_cache_destroy(cache);
  return all;
}

class CExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(layer_.layer, nullptr);
    mha_layer_config c;
    ASSERT_EQ(mha_layer_config_init(&c), MHA_STATUS_OK);
    c.embed_dim = Layer::kE;
    c.num_heads = Layer::kH;
    c.num_kv_heads = Layer::kKvh;
    c.batch_first = 1;
    mha_layer_weights w;
    std::memset(&w, 0, sizeof(w));
    w.q_proj_weight = layer_.wq.data();
    w.k_proj_weight = layer_.wk.data();
    w.v_proj_weight = layer_.wv.data();
    w.in_proj_bias = layer_.bias.data();
    w.out_proj_weight = layer_.wo.data();
    w.out_proj_bias = layer_.bo.data();
    ASSERT_EQ(mha_layer_create(&c, &w, MHA_WEIGHTS_VIEW, &c_layer_), MHA_STATUS_OK)
        << mha_last_error_message();
  }
  void TearDown() override { mha_layer_destroy(c_layer_); }

  Layer layer_{9};
  mha_layer* c_layer_ = nullptr;
};

TEST_F(CExecutorTest, HostPoolAndSerialExecutorMatchOwnedPoolBitwise) {
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  o.num_threads = 2;
  mha_context* owned = nullptr;
  ASSERT_EQ(mha_context_create(&o, &owned), MHA_STATUS_OK) << mha_last_error_message();
  const std::vector<float> want = RunC(c_layer_, owned);
  mha_context_destroy(owned);

  HostPool pool(2, /*caller_runs=*/true);
  const mha_executor pool_c = pool.AsC();
  mha_executor serial;
  serial.parallel_for = [](void*, uint64_t n, mha_task_fn fn, void* arg) {
    for (uint64_t t = 0; t < n; ++t) fn(arg, t, 0);
  };
  serial.num_workers = 1;
  serial.user = nullptr;
  for (const mha_executor* e : {&pool_c, const_cast<const mha_executor*>(&serial)}) {
    std::memset(&o, 0, sizeof(o));
    o.executor = e;
    mha_context* ctx = nullptr;
    ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
    size_t threads = 0;
    EXPECT_EQ(mha_context_num_threads(ctx, &threads), MHA_STATUS_OK);
    EXPECT_EQ(threads, e->num_workers);
    ExpectBitwiseEqual(want, RunC(c_layer_, ctx),
                       e == &serial ? "C serial executor" : "C host pool");
    mha_context_destroy(ctx);
  }
  EXPECT_GT(pool.dispatches(), 0u);
}

TEST_F(CExecutorTest, BadExecutorsAreRejectedAndZeroOptionsOwnAPool) {
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  mha_executor e;
  std::memset(&e, 0, sizeof(e));
  e.num_workers = 2;
  o.executor = &e;
  mha_context* ctx = nullptr;
  EXPECT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message())
                .find("options->executor->parallel_for: expected a function, got NULL"),
            std::string::npos)
      << mha_last_error_message();
  EXPECT_EQ(ctx, nullptr);
  e.parallel_for = [](void*, uint64_t, mha_task_fn, void*) {};
  e.num_workers = 0;
  EXPECT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message()).find("num_workers(): expected 1..1024, got 0"),
            std::string::npos)
      << mha_last_error_message();
  e.num_workers = 2;
  o.num_threads = 4;
  EXPECT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message()).find("num_threads: expected 0 or"),
            std::string::npos)
      << mha_last_error_message();
  EXPECT_EQ(ctx, nullptr);

  // Zero-initialized options: a pool of the context's own, one thread per hardware thread.
  std::memset(&o, 0, sizeof(o));
  ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
  size_t threads = 0;
  EXPECT_EQ(mha_context_num_threads(ctx, &threads), MHA_STATUS_OK);
  EXPECT_EQ(threads, std::max(1u, std::thread::hardware_concurrency()));
  mha_context_destroy(ctx);
}

TEST_F(CExecutorTest, HostThatSkipsTasksGetsAnErrorNotACrash) {
  mha_executor e;
  e.parallel_for = [](void*, uint64_t, mha_task_fn, void*) {};  // runs nothing
  e.num_workers = 3;
  e.user = nullptr;
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  o.executor = &e;
  mha_context* ctx = nullptr;
  ASSERT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
  std::vector<float> x(4 * Layer::kE, 0.5f), out;
  mha_attention_inputs in;
  std::memset(&in, 0, sizeof(in));
  in.query = CTensor(&x, 1, 4, Layer::kE);
  const mha_tensor ot = CTensor(&out, 1, 4, Layer::kE);
  EXPECT_EQ(mha_layer_forward(c_layer_, ctx, &in, &ot, nullptr, 0), MHA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mha_last_error_message())
                .find("mha_layer_forward: executor: parallel_for returned after 0 task calls"),
            std::string::npos)
      << mha_last_error_message();
  mha_context_destroy(ctx);
}

}  // namespace
}  // namespace mha
