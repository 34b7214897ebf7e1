// The partitioned projection GEMM: panels over the pool with the bias fused, against a naive
// loop, and bitwise identical for 1..4 threads (the partition depends only on shapes), with and
// without a buffer to pack the weights once.
#include "runtime/parallel_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm_direct.h"
#include "kernels/gemv.h"
#include "kernels/gemv_int8.h"
#include "runtime/arena.h"
#include "tests/quant_test_util.h"

namespace mha {
namespace {

struct Problem {
  size_t batches, m, k, n;
  bool bias;
};

// Runs c[b] = a[b] * w^T + bias for every batch with `threads` threads; a [batches, m, k]
// (row stride k + 3: padded rows), w [n, k] (nn.Linear layout), c [batches, m, n].
// packed_bytes: room ParallelGemm may use to pack w once (0: none; each job's weights need
// PackedJobBytes(k, n)). prepacked: w^T packed beforehand (GemmJob::b_packed), as a layer with
// AttentionConfig::prepack holds it.
std::vector<float> RunGemm(const Problem& p, const std::vector<float>& a,
                           const std::vector<float>& w, const std::vector<float>& bias,
                           size_t threads, size_t packed_bytes = 0,
                           const kernels::PackedB& prepacked = {},
                           const kernels::StrassenPackedB& strassen = {}) {
  ThreadPool pool(threads);
  const size_t lda = p.k + 3;
  std::vector<float> c(p.batches * p.m * p.n, std::nanf(""));
  GemmJob job;
  job.a = {a.data(), p.m, p.k, static_cast<ptrdiff_t>(lda), 1};
  job.b = {w.data(), p.k, p.n, 1, static_cast<ptrdiff_t>(p.k)};
  job.c = {c.data(), p.m, p.n, static_cast<ptrdiff_t>(p.n), 1};
  job.b_packed = prepacked;
  job.b_strassen = strassen;
  job.bias = p.bias ? bias.data() : nullptr;
  job.batches = p.batches;
  job.a_batch_stride = static_cast<ptrdiff_t>(p.m * lda);
  job.c_batch_stride = static_cast<ptrdiff_t>(p.m * p.n);
  size_t stride = 0;
  RoundUpToAlignment(kernels::GemmScratchBytes(), &stride);
  Arena arena;
  EXPECT_TRUE(arena.Init(stride * threads + packed_bytes + 64).ok());
  void* scratch = nullptr;
  EXPECT_TRUE(arena.Allocate(stride * threads, &scratch).ok());
  void* packed = nullptr;
  if (packed_bytes > 0) {
    EXPECT_TRUE(arena.Allocate(packed_bytes, &packed).ok());
    // NaN, so that a product reading a panel nobody packed would show.
    std::fill_n(static_cast<float*>(packed), packed_bytes / sizeof(float), std::nanf(""));
  }
  ParallelGemm(pool, &job, 1, static_cast<uint8_t*>(scratch), stride, kernels::Bf16ActiveKernel(),
               nullptr, static_cast<uint8_t*>(packed), packed_bytes);
  return c;
}

std::string Describe(const Problem& p) {
  return "batches " + std::to_string(p.batches) + " m " + std::to_string(p.m) + " k " +
         std::to_string(p.k) + " n " + std::to_string(p.n);
}

// Random a [batches, m, k + 3] (padded rows, as RunGemm reads them), w [n, k] and bias [n].
void FillOperands(const Problem& p, std::mt19937* rng, std::vector<float>* a, std::vector<float>* w,
                  std::vector<float>* bias) {
  std::uniform_real_distribution<float> u(-1, 1);
  a->resize(p.batches * p.m * (p.k + 3));
  w->resize(p.n * p.k);
  bias->resize(p.n);
  for (std::vector<float>* v : {a, w, bias}) {
    for (float& x : *v) x = u(*rng);
  }
}

// Three jobs over one a [batches, m, k + 3] (padded rows) with `threads` threads, each with
// biases[j] and c [batches, m, ns[j]]; set_weights gives job j its weights. Returns the c's.
std::vector<std::vector<float>> RunSharedInput(
    const std::vector<float>& a, size_t batches, size_t m, size_t k, const size_t (&ns)[3],
    const std::vector<std::vector<float>>& biases, size_t threads,
    const std::function<void(size_t, GemmJob*)>& set_weights) {
  ThreadPool pool(threads);
  std::vector<std::vector<float>> cs(3);
  GemmJob jobs[3];
  for (size_t j = 0; j < 3; ++j) {
    cs[j].assign(batches * m * ns[j], std::nanf(""));
    jobs[j].a = {a.data(), m, k, static_cast<ptrdiff_t>(k + 3), 1};
    jobs[j].c = {cs[j].data(), m, ns[j], static_cast<ptrdiff_t>(ns[j]), 1};
    jobs[j].bias = biases[j].data();
    jobs[j].batches = batches;
    jobs[j].a_batch_stride = static_cast<ptrdiff_t>(m * (k + 3));
    jobs[j].c_batch_stride = static_cast<ptrdiff_t>(m * ns[j]);
    set_weights(j, &jobs[j]);
  }
  size_t stride = 0;
  RoundUpToAlignment(kernels::GemmScratchBytes(), &stride);
  Arena arena;
  EXPECT_TRUE(arena.Init(stride * threads + 64).ok());
  void* scratch = nullptr;
  EXPECT_TRUE(arena.Allocate(stride * threads, &scratch).ok());
  ParallelGemm(pool, jobs, 3, static_cast<uint8_t*>(scratch), stride, kernels::Bf16ActiveKernel());
  return cs;
}

TEST(ParallelGemmTest, MatchesNaiveLoopAndIsIdenticalForAnyThreadCount) {
  std::mt19937 rng(17);
  // Shapes straddling the panel sizes, with a batch dimension, and products large enough for
  // the large panels (with edge panels of 1..16 rows, which take the GEMV route).
  const Problem problems[] = {{1, 1, 1, 1, true},        {1, 130, 70, 300, true},
                              {3, 129, 64, 257, false},  {2, 300, 33, 513, true},
                              {1, 17, 512, 1536, true},  {1, 1040, 40, 1100, true},
                              {2, 513, 24, 1030, false}, {8, 257, 8, 520, true},
                              {1, 400, 300, 700, true},  {3, 40, 20, 50, false}};
  for (const Problem& p : problems) {
    // A GEMV-route product is one row panel (the panels split its columns only).
    GemmJob job;
    job.c.rows = p.m;
    job.c.cols = p.n;
    job.batches = p.batches;
    const PanelShape panel = PanelsOf(job);
    EXPECT_GT(panel.cols, 0u);
    if (p.m <= kernels::kGemvMaxRows) {
      EXPECT_GE(panel.rows, p.m) << Describe(p);
    }
  }
  for (const Problem& p : problems) {
    SCOPED_TRACE(Describe(p));
    std::vector<float> a, w, bias;
    FillOperands(p, &rng, &a, &w, &bias);
    const std::vector<float> c1 = RunGemm(p, a, w, bias, 1);
    for (size_t b = 0; b < p.batches; ++b) {
      for (size_t i = 0; i < p.m; ++i) {
        for (size_t j = 0; j < p.n; ++j) {
          double want = p.bias ? bias[j] : 0.0, mag = std::abs(want);
          for (size_t q = 0; q < p.k; ++q) {
            const double t = double(a[(b * p.m + i) * (p.k + 3) + q]) * w[j * p.k + q];
            want += t;
            mag += std::abs(t);
          }
          ASSERT_NEAR(c1[(b * p.m + i) * p.n + j], want, 1e-6 * mag + 1e-6)
              << "b " << b << " i " << i << " j " << j;
        }
      }
    }
    for (size_t threads = 2; threads <= 4; ++threads) {
      const std::vector<float> ct = RunGemm(p, a, w, bias, threads);
      ASSERT_EQ(0, std::memcmp(c1.data(), ct.data(), c1.size() * sizeof(float)))
          << threads << " threads";
    }
    // With room to pack the weights once (products of two or more row panels then take the
    // shared packing): the same bits on row-preferring micro-kernels, where GemmBlisPackedB and
    // Gemm agree (on others the rows may round differently; the partition still depends only on
    // shapes), for any thread count; too little room packs nothing.
    // (Unless the unpacked partition has an edge panel of 16 rows or fewer: that one takes the
    // GEMV path, which sums in another order.)
    GemmJob shape;
    shape.c.rows = p.m;
    shape.c.cols = p.n;
    shape.batches = p.batches;
    const size_t edge_rows = p.m % PanelsOf(shape).rows;
    const bool same_bits = kernels::GemmBlocking().prefers_rows &&
                           (edge_rows == 0 || edge_rows > kernels::kGemvMaxRows);
    const size_t room = PackedJobBytes(p.k, p.n);
    const std::vector<float> p1 = RunGemm(p, a, w, bias, 1, room);
    if (same_bits) {
      ASSERT_EQ(0, std::memcmp(c1.data(), p1.data(), c1.size() * sizeof(float)));
    } else {
      for (size_t i = 0; i < c1.size(); ++i)
        ASSERT_NEAR(p1[i], c1[i], 1e-5 * (1 + std::abs(c1[i])));
    }
    for (size_t threads = 2; threads <= 4; ++threads) {
      const std::vector<float> pt = RunGemm(p, a, w, bias, threads, room);
      ASSERT_EQ(0, std::memcmp(p1.data(), pt.data(), p1.size() * sizeof(float)))
          << threads << " threads, packed once";
    }
    const std::vector<float> small = RunGemm(p, a, w, bias, 2, room - 64);
    ASSERT_EQ(0, std::memcmp(c1.data(), small.data(), c1.size() * sizeof(float)));
  }
}

// More jobs than kMaxGemmJobs in one call: every job runs, each with the bits it has alone.
TEST(ParallelGemmTest, AnyNumberOfJobs) {
  std::mt19937 rng(31);
  const size_t num_jobs = 2 * kMaxGemmJobs + 3;
  const Problem p{1, 20, 24, 40, true};
  std::vector<std::vector<float>> as(num_jobs), ws(num_jobs), biases(num_jobs), cs(num_jobs);
  std::vector<GemmJob> jobs(num_jobs);
  for (size_t j = 0; j < num_jobs; ++j) {
    FillOperands(p, &rng, &as[j], &ws[j], &biases[j]);
    cs[j].assign(p.m * p.n, std::nanf(""));
    jobs[j].a = {as[j].data(), p.m, p.k, static_cast<ptrdiff_t>(p.k + 3), 1};
    jobs[j].b = {ws[j].data(), p.k, p.n, 1, static_cast<ptrdiff_t>(p.k)};
    jobs[j].c = {cs[j].data(), p.m, p.n, static_cast<ptrdiff_t>(p.n), 1};
    jobs[j].bias = biases[j].data();
  }
  ThreadPool pool(2);
  size_t stride = 0;
  RoundUpToAlignment(kernels::GemmScratchBytes(), &stride);
  Arena arena;
  ASSERT_TRUE(arena.Init(2 * stride + 64).ok());
  void* scratch = nullptr;
  ASSERT_TRUE(arena.Allocate(2 * stride, &scratch).ok());
  ParallelGemm(pool, jobs.data(), num_jobs, static_cast<uint8_t*>(scratch), stride,
               kernels::Bf16ActiveKernel());
  for (size_t j = 0; j < num_jobs; ++j) {
    const std::vector<float> alone = RunGemm(p, as[j], ws[j], biases[j], 1);
    ASSERT_EQ(0, std::memcmp(alone.data(), cs[j].data(), alone.size() * sizeof(float)))
        << "job " << j;
  }
}

// w^T [k, n] of w [n, k] packed by kernels::PackB into 64-byte aligned storage.
struct Prepacked {
  std::vector<float> storage;
  kernels::PackedB packed;
};
Prepacked Prepack(const std::vector<float>& w, size_t k, size_t n) {
  Prepacked r;
  r.storage.assign(kernels::PackedBFloats(k, n) + 16, std::nanf(""));
  float* dst = r.storage.data();
  dst += (16 - reinterpret_cast<uintptr_t>(dst) / sizeof(float) % 16) % 16;
  r.packed = kernels::PackB({w.data(), k, n, 1, static_cast<ptrdiff_t>(k)}, dst);
  return r;
}

// Prepacked weights (GemmJob::b_packed): from PrepackedMinRows() rows per product, every panel
// multiplies the packing, so the result is bitwise one MultiplyPackedB call over each whole
// product on its route (GemmDirectPackedB or GemmBlisPackedB, plus the bias), for any thread count
// and whether or not there is room to pack; fewer rows take the unpacked path (GEMV) and give its
// bits.
TEST(ParallelGemmTest, PrepackedWeights) {
  std::mt19937 rng(23);
  const Problem problems[] = {{1, 1, 7, 5, true},       {2, 3, 64, 100, true},
                              {1, 4, 33, 20, true},     {3, 5, 16, 256, false},
                              {1, 16, 256, 768, true},  {2, 17, 40, 130, true},
                              {1, 128, 96, 1536, true}, {1, 400, 70, 520, false},
                              {4, 200, 24, 48, true},   {1, 1000, 24, 70, true}};
  size_t scratch_bytes = 0;
  RoundUpToAlignment(kernels::GemmScratchBytes(), &scratch_bytes);
  std::vector<uint8_t> scratch_buf(scratch_bytes + 64);
  void* scratch =
      scratch_buf.data() + (64 - reinterpret_cast<uintptr_t>(scratch_buf.data()) % 64) % 64;
  for (const Problem& p : problems) {
    SCOPED_TRACE(Describe(p));
    std::vector<float> a, w, bias;
    FillOperands(p, &rng, &a, &w, &bias);
    const Prepacked pw = Prepack(w, p.k, p.n);
    std::vector<float> want(p.batches * p.m * p.n);
    if (p.m >= PrepackedMinRows()) {
      for (size_t b = 0; b < p.batches; ++b) {
        const size_t lda = p.k + 3;
        const kernels::MatrixView av{a.data() + b * p.m * lda, p.m, p.k,
                                     static_cast<ptrdiff_t>(lda), 1};
        float* c = want.data() + b * p.m * p.n;
        const kernels::GemmRoute route =
            kernels::ChooseGemmRoute({p.m, p.n, p.k, DType::kF32, kernels::BPacking::kPrepacked});
        MultiplyPackedB(route, av, pw.packed, p.bias ? bias.data() : nullptr,
                        {c, p.m, p.n, static_cast<ptrdiff_t>(p.n), 1}, scratch);
      }
    } else {
      want = RunGemm(p, a, w, bias, 1);
    }
    for (size_t threads = 1; threads <= 4; ++threads) {
      for (size_t room : {size_t{0}, PackedJobBytes(p.k, p.n)}) {
        const std::vector<float> got = RunGemm(p, a, w, bias, threads, room, pw.packed);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << threads << " threads, room " << room;
      }
    }
    // And the values: against the unpacked path to rounding.
    const std::vector<float> ref = RunGemm(p, a, w, bias, 1);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(want[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << "element " << i;
    }
  }
}

// Jobs that share one a with prepacked weights (q, k and v of one input: ParallelGemm runs them
// row panel by row panel) give each job's bits alone, for 1..4 threads: batches, row panels
// (400 rows) and different column counts per job (so different column panels).
TEST(ParallelGemmTest, PrepackedJobsSharingTheirInput) {
  std::mt19937 rng(37);
  const size_t batches = 2, m = 400, k = 40;
  const size_t ns[] = {70, 600, 33};
  std::vector<float> a, unused_w, unused_bias;
  FillOperands({batches, m, k, 1, false}, &rng, &a, &unused_w, &unused_bias);
  std::vector<std::vector<float>> ws(3), biases(3);
  std::vector<Prepacked> packs;
  std::vector<std::vector<float>> want(3);
  for (size_t j = 0; j < 3; ++j) {
    const Problem pj{batches, m, k, ns[j], true};
    std::vector<float> a_j;
    FillOperands(pj, &rng, &a_j, &ws[j], &biases[j]);
    packs.push_back(Prepack(ws[j], k, ns[j]));
    want[j] = RunGemm(pj, a, ws[j], biases[j], 1, 0, packs[j].packed);
  }
  for (size_t threads = 1; threads <= 4; ++threads) {
    const std::vector<std::vector<float>> cs =
        RunSharedInput(a, batches, m, k, ns, biases, threads, [&](size_t j, GemmJob* job) {
          job->b = {ws[j].data(), k, ns[j], 1, static_cast<ptrdiff_t>(k)};
          job->b_packed = packs[j].packed;
        });
    for (size_t j = 0; j < 3; ++j) {
      ASSERT_EQ(0, std::memcmp(want[j].data(), cs[j].data(), want[j].size() * sizeof(float)))
          << "job " << j << ", " << threads << " threads";
    }
  }
}

// Int8 activations (Compute::kInt8): jobs sharing one a, each with weights of another format,
// so that a worker holding a's rows quantized for one format must quantize them again for the
// next. Every job's result is bitwise kernels::GemmInt8 over its whole product plus the bias, for
// 1..4 threads, at decode's row counts (GEMV panels) and prefill's (row panels).
TEST(ParallelGemmTest, Int8ActivationJobsSharingTheirInput) {
  std::mt19937 rng(52);
  const size_t k = 300;  // three 128-input units, the last partial
  const size_t ns[] = {70, 600, 33};
  const kernels::Format formats[] = {kernels::kFormats[0], kernels::kFormats[1],
                                     kernels::kFormats[2]};
  size_t stride = 0;
  RoundUpToAlignment(kernels::GemmScratchBytes(), &stride);
  std::vector<uint8_t> one_scratch(stride + 64);
  void* const aligned =
      one_scratch.data() + (64 - reinterpret_cast<uintptr_t>(one_scratch.data()) % 64) % 64;
  for (const size_t batches : {size_t{1}, size_t{2}}) {
    for (const size_t m : {size_t{1}, size_t{3}, size_t{8}, size_t{200}}) {
      std::vector<float> a, unused_w, unused_bias;
      FillOperands({batches, m, k, 1, false}, &rng, &a, &unused_w, &unused_bias);
      std::vector<kernels::QuantStorage> ws;
      std::vector<std::vector<float>> biases(3), want(3);
      for (size_t j = 0; j < 3; ++j) {
        std::vector<float> a_j, w;
        FillOperands({1, 1, k, ns[j], true}, &rng, &a_j, &w, &biases[j]);
        ws.push_back(kernels::Quantize(w, ns[j], k, formats[j]));
        ws[j].m.int8_activations = true;
        want[j].assign(batches * m * ns[j], std::nanf(""));
        for (size_t b = 0; b < batches; ++b) {
          const kernels::MatrixView c{want[j].data() + b * m * ns[j], m, ns[j],
                                      static_cast<ptrdiff_t>(ns[j]), 1};
          kernels::GemmInt8({a.data() + b * m * (k + 3), m, k, static_cast<ptrdiff_t>(k + 3), 1},
                            ws[j].m, c, aligned);
          kernels::AddBiasToRows(biases[j].data(), c.data, m, ns[j], c.row_stride);
        }
      }
      for (size_t threads = 1; threads <= 4; ++threads) {
        const std::vector<std::vector<float>> cs =
            RunSharedInput(a, batches, m, k, ns, biases, threads,
                           [&](size_t j, GemmJob* job) { job->b_quant = ws[j].m; });
        for (size_t j = 0; j < 3; ++j) {
          ASSERT_EQ(0, std::memcmp(want[j].data(), cs[j].data(), want[j].size() * sizeof(float)))
              << batches << " batches, m " << m << ", job " << j << " (" << formats[j].Name()
              << "), " << threads << " threads";
        }
      }
    }
  }
}

// Strassen operands (GemmJob::b_strassen, as StrassenPacks layers hold them): from
// kStrassenMinRows rows, panels of 128 rows run kernels::GemmStrassenPackedB and the odd last row
// or a panel under kStrassenMinPanelRows rows the plain product. The results are bitwise the
// same for 1..4 threads, within Strassen's bound (8 eps k max|a| max|w| + |bias|) of the
// double-precision product, and rows of panels too short for Strassen are bitwise the plain
// prepacked product's.
TEST(ParallelGemmTest, StrassenWeights) {
  if (!kernels::GemmDirectSupported()) GTEST_SKIP() << "no direct micro-kernel here";
  const size_t nr = kernels::GemmBlocking().nr;
  std::mt19937 rng(29);
  const Problem problems[] = {{1, 128, 512, 16 * nr, true}, {2, 131, 64, 4 * nr, true},
                              {1, 200, 96, 6 * nr, false},  {3, 65, 40, 2 * nr, true},
                              {1, 101, 64, 4 * nr, true},   {1, 64, 2, 2 * nr, true}};
  for (const Problem& p : problems) {
    SCOPED_TRACE(Describe(p));
    std::vector<float> a, w, bias;
    FillOperands(p, &rng, &a, &w, &bias);
    const Prepacked pw = Prepack(w, p.k, p.n);
    std::vector<float> storage(kernels::StrassenPackedBFloats(p.k, p.n) + 16);
    std::vector<float> tmp(kernels::StrassenPackTmpFloats(p.k, p.n));
    float* dst = storage.data();
    dst += (16 - reinterpret_cast<uintptr_t>(dst) / sizeof(float) % 16) % 16;
    const kernels::StrassenPackedB ops = kernels::PackBStrassen(
        {w.data(), p.k, p.n, 1, static_cast<ptrdiff_t>(p.k)}, dst, tmp.data());
    GemmJob probe;
    probe.a = {a.data(), p.m, p.k, static_cast<ptrdiff_t>(p.k + 3), 1};
    probe.c = {nullptr, p.m, p.n, static_cast<ptrdiff_t>(p.n), 1};
    probe.b_packed = pw.packed;
    probe.b_strassen = ops;
    ASSERT_TRUE(UsesStrassen(probe));
    const std::vector<float> want = RunGemm(p, a, w, bias, 1, 0, pw.packed, ops);
    for (size_t threads = 2; threads <= 4; ++threads) {
      const std::vector<float> got = RunGemm(p, a, w, bias, threads, 0, pw.packed, ops);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << threads << " threads";
    }
    const std::vector<float> plain = RunGemm(p, a, w, bias, 1, 0, pw.packed);
    const double eps = std::numeric_limits<float>::epsilon();
    const size_t lda = p.k + 3;
    const size_t panel_rows = p.m % kStrassenPanelRows;  // rows of the last panel
    size_t differing = 0;
    for (size_t b = 0; b < p.batches; ++b) {
      for (size_t i = 0; i < p.m; ++i) {
        const bool short_panel =
            panel_rows != 0 && panel_rows < kStrassenMinPanelRows && i >= p.m - panel_rows;
        const bool odd_row = i == p.m - 1 && (p.m % kStrassenPanelRows) % 2 == 1;
        for (size_t j = 0; j < p.n; ++j) {
          double ref = p.bias ? bias[j] : 0.0, max_a = 0, max_w = 0;
          for (size_t q = 0; q < p.k; ++q) {
            const double av = a[b * p.m * lda + i * lda + q], wv = w[j * p.k + q];
            ref += av * wv;
            max_a = std::max(max_a, std::abs(av));
            max_w = std::max(max_w, std::abs(wv));
          }
          const size_t e = (b * p.m + i) * p.n + j;
          ASSERT_NEAR(want[e], ref, 8 * eps * (p.k * max_a * max_w + std::abs(ref)))
              << "batch " << b << " (" << i << ", " << j << ")";
          if (short_panel || odd_row) {
            ASSERT_EQ(want[e], plain[e]) << "plain row " << i << " column " << j;
          }
          if (!short_panel && !odd_row) differing += want[e] != plain[e];
        }
      }
    }
    // The Strassen rows are another computation: most of their bits differ from the plain one's.
    if (p.k > 2) {
      EXPECT_GT(differing, 0u);
    }
  }
}

// Strassen panels, whatever their tuned sizes: columns per half a multiple of NR; rows even
// for every panel but the last (Strassen halves a panel's rows); kMinPrepackedTasks tasks where
// the columns allow it; a job alone in its call with one batch of at most kStrassenPanelRows
// rows splits them into two row panels only if the second keeps kStrassenMinPanelRows rows (else
// it would run the plain product). Bitwise results for any thread count: StrassenWeights.
TEST(ParallelGemmTest, StrassenPanels) {
  const size_t nr = kernels::GemmBlocking().nr;
  const size_t narrowest = std::max(nr, size_t{64} / nr * nr);
  for (const size_t batches : {size_t{1}, size_t{2}}) {
    for (const size_t m : {size_t{33}, size_t{64}, size_t{65}, size_t{101}, size_t{128},
                           size_t{129}, size_t{256}, size_t{1000}}) {
      for (const size_t n : {2 * nr, 512 / nr * nr * 2, size_t{1536} / (2 * nr) * 2 * nr}) {
        for (const bool alone : {false, true}) {
          SCOPED_TRACE("batches " + std::to_string(batches) + " m " + std::to_string(m) + " n " +
                       std::to_string(n) + (alone ? " alone" : ""));
          GemmJob job;
          job.c.rows = m;
          job.c.cols = n;
          job.batches = batches;
          job.b_strassen.op[0].n = n / 2;
          const PanelShape p = StrassenPanelsOf(job, alone);
          ASSERT_GT(p.rows, 0u);
          ASSERT_GT(p.cols, 0u);
          EXPECT_EQ(p.cols % nr, 0u);
          const size_t row_panels = (m + p.rows - 1) / p.rows;
          if (row_panels > 1) {
            EXPECT_EQ(p.rows % 2, 0u);
          }
          const uint64_t tasks = batches * row_panels * ((n / 2 + p.cols - 1) / p.cols);
          EXPECT_TRUE(tasks >= kMinPrepackedTasks || p.cols == narrowest) << tasks << " tasks";
          if (p.rows < std::min(m, kStrassenPanelRows)) {
            // The split of a short job alone: two row panels, the second long enough.
            EXPECT_TRUE(alone);
            EXPECT_EQ(batches, 1u);
            EXPECT_EQ(row_panels, 2u);
            EXPECT_GE(m - p.rows, kStrassenMinPanelRows);
          }
        }
      }
    }
  }
}

// Panels of prepacked jobs: mc rows; the widest column width (a multiple of NR) that gives
// kMinPrepackedTasks tasks, else the narrowest. On the direct route, balanced row panels: the
// count nearest rows / mc (at least one), heights multiples of MR (but the last) that differ by
// at most MR and cover the rows.
TEST(ParallelGemmTest, PrepackedPanels) {
  const kernels::GemmBlocks& blk = kernels::GemmBlocking();
  auto panels = [](size_t batches, size_t m, size_t n) {
    GemmJob job;
    job.c.rows = m;
    job.c.cols = n;
    job.batches = batches;
    return PrepackedPanelsOf(job);
  };
  const size_t widest = std::max(blk.nr, kLargePanelCols / blk.nr * blk.nr);
  const size_t narrowest = std::max(blk.nr, kMinPrepackedPanelCols / blk.nr * blk.nr);
  EXPECT_EQ(panels(1, 4096, 4096).rows, blk.mc);
  EXPECT_EQ(panels(1, 4096, 4096).cols, widest);               // many row panels
  EXPECT_EQ(panels(1, 16, 32).cols, narrowest);                // one task however narrow
  EXPECT_EQ(panels(kMinPrepackedTasks, 16, 32).cols, widest);  // the batches make the tasks
  EXPECT_FALSE(panels(1, 4096, 4096).balanced);
  EXPECT_EQ(RowPanels(0, PanelShape{blk.mc, 64, true}), 0u);  // no rows, no tasks
  EXPECT_EQ(RowPanels(4096, panels(1, 4096, 4096)), (4096 + blk.mc - 1) / blk.mc);
  for (size_t m :
       {size_t{1}, size_t{100}, blk.mc, blk.mc + 1, size_t{2048}, size_t{4096}, size_t{4100}}) {
    GemmJob job;
    job.c.rows = m;
    job.c.cols = 512;
    const PanelShape ps = PrepackedPanelsOf(job, /*direct=*/true);
    EXPECT_TRUE(ps.balanced);
    EXPECT_EQ(ps.rows, blk.mc);
    const uint64_t count = RowPanels(m, ps);
    const double ideal = static_cast<double>(m) / blk.mc;
    EXPECT_LE(std::abs(static_cast<double>(count) - std::max(ideal, 1.0)), 0.5) << m;
    EXPECT_EQ(RowPanelStart(m, ps, 0), 0u);
    EXPECT_EQ(RowPanelStart(m, ps, count), m);
    size_t lo = m, hi = 0;
    for (uint64_t rp = 0; rp < count; ++rp) {
      const size_t r0 = RowPanelStart(m, ps, rp), r1 = RowPanelStart(m, ps, rp + 1);
      ASSERT_LT(r0, r1) << m << " panel " << rp;
      EXPECT_EQ(r0 % blk.mr, 0u) << m << " panel " << rp;
      if (rp + 1 < count) {
        lo = std::min(lo, r1 - r0);
        hi = std::max(hi, r1 - r0);
      }
    }
    if (count > 2) {
      EXPECT_LE(hi - lo, blk.mr) << m;
    }
  }
  for (size_t n : {size_t{100}, size_t{256}, size_t{768}, size_t{1000}}) {
    const PanelShape ps = panels(1, 16, n);
    EXPECT_EQ(ps.cols % blk.nr, 0u) << n;
    const uint64_t tasks = (n + ps.cols - 1) / ps.cols;
    EXPECT_TRUE(tasks >= kMinPrepackedTasks || ps.cols == narrowest) << n;
    if (ps.cols < widest) {
      // A wider standard width would have given too few tasks.
      EXPECT_LT((n + 2 * ps.cols - 1) / (2 * ps.cols), kMinPrepackedTasks) << n;
    }
  }
}

// Which products pack their weights once: f32 weights, more rows than the GEMV path, and two
// or more row panels (of GemmBlocking().mc rows) over all batches; panel columns are a multiple
// of NR.
TEST(ParallelGemmTest, PackedPanels) {
  const PanelShape panel = PackedPanelsOf();
  EXPECT_EQ(panel.rows, kernels::GemmBlocking().mc);
  EXPECT_EQ(panel.cols % kernels::GemmBlocking().nr, 0u);
  EXPECT_GT(panel.cols, 0u);
  EXPECT_LE(panel.cols, kLargePanelCols);
  EXPECT_EQ(PackedJobBytes(100, 300) % 64, 0u);
  EXPECT_GE(PackedJobBytes(100, 300), 100u * 300u * sizeof(float));
  // The rule (shared with the operator's workspace planner); column-preferring micro-kernels
  // never pack once.
  const bool rows_pref = kernels::GemmBlocking().prefers_rows;
  const size_t gemv = kernels::kGemvMaxRows;
  EXPECT_FALSE(PacksWeightsOnce(1, panel.rows));  // one row panel
  EXPECT_EQ(PacksWeightsOnce(1, panel.rows + 1), rows_pref);
  EXPECT_FALSE(PacksWeightsOnce(8, gemv));              // GEMV rows, however many batches
  EXPECT_EQ(PacksWeightsOnce(2, gemv + 1), rows_pref);  // two batches of one panel each
  EXPECT_FALSE(PacksWeightsOnce(0, 4 * panel.rows));    // no product
}

}  // namespace
}  // namespace mha
