// Google Benchmark of the single-threaded kernels at attention shapes:
// - softmax rows (kernels/softmax.h) for row lengths 16..8192, plain, masked and online, on
//   the best target and (one length) on every target this CPU supports;
// - the 16-bit conversions (kernels/elementwise.h);
// - GEMM (kernels/gemm.h) for the scores Q K^T, the weighted sum P V and an input projection,
//   and a projection split into ParallelGemm's panels with and without the weights packed once;
//   products by a packed operand through BLIS's micro-kernel and mha's direct one
//   (kernels/gemm_direct.h) at the operator's shapes; Gemm against BLIS's bli_sgemm_ex;
// - the int8-activation decode product (kernels/gemv_int8.h) per kernel, its weights in L2 and
//   beyond the L3, against a plain read of the same bytes;
// - the bf16 compute product (kernels/gemm_bf16.h) per kernel (emulated, AVX512_BF16, AMX,
//   BFDOT) at a projection's, the scores' and P V's shapes;
// - the attention core of one head (scores, online softmax, P V in strips), on every target this
//   CPU supports, against its two products alone (BM_AttentionCore).
//
// Units: items/s counts elements (softmax: scores; conversions: values); bytes/s counts one read
// and one write of each element (the kernel's minimum traffic; softmax actually makes three
// passes over a row, normally from L1/L2); FLOPS (printed as G/s) counts 2 m n k flops per GEMM.
//
//   build-kernels/bench/kernels_bench --benchmark_min_time=0.1
#include <benchmark/benchmark.h>
#include <blis.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/decode.h"
#include "kernels/decode_int8.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_direct.h"
#include "kernels/gemv_int8.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "kernels/softmax.h"
#include "kernels/targets.h"
#include "runtime/forward_plan.h"
#include "runtime/large_buffer.h"
#include "runtime/parallel_gemm.h"
#include "runtime/thread_pool.h"

namespace mha {
namespace {

using kernels::MatrixView;
using kernels::SoftmaxMasks;

std::vector<float> RandomFloats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Rows per softmax call: a query block of the attention operator.
constexpr size_t kSoftmaxRows = 16;

void SetSoftmaxCounters(benchmark::State& state, size_t rows, size_t cols) {
  const int64_t elements = static_cast<int64_t>(state.iterations() * rows * cols);
  state.SetItemsProcessed(elements);
  state.SetBytesProcessed(elements * static_cast<int64_t>(2 * sizeof(float)));
}

// SoftmaxRows on scores [kSoftmaxRows, cols], re-softmaxed in place every iteration: values stay
// in [0, 1], and the cost of a row does not depend on the values (no early exit in the kernel).
void TimeSoftmaxRows(benchmark::State& state, std::vector<float>* scores, size_t cols,
                     const SoftmaxMasks& masks) {
  for (auto _ : state) {
    kernels::SoftmaxRows(scores->data(), kSoftmaxRows, cols, static_cast<ptrdiff_t>(cols), 0.125f,
                         masks);
    benchmark::DoNotOptimize(scores->data());
    benchmark::ClobberMemory();
  }
  SetSoftmaxCounters(state, kSoftmaxRows, cols);
}

void BM_SoftmaxRows(benchmark::State& state) {
  const size_t cols = static_cast<size_t>(state.range(0));
  std::vector<float> scores = RandomFloats(kSoftmaxRows * cols, -4.0f, 4.0f, 1);
  TimeSoftmaxRows(state, &scores, cols, SoftmaxMasks());
}
BENCHMARK(BM_SoftmaxRows)->RangeMultiplier(2)->Range(16, 8192);

// With an additive mask [rows, cols], a broadcast bool key-padding mask and causal (offset so
// that about half of the block is visible on average).
void BM_SoftmaxRowsMasked(benchmark::State& state) {
  const size_t cols = static_cast<size_t>(state.range(0));
  std::vector<float> scores = RandomFloats(kSoftmaxRows * cols, -4.0f, 4.0f, 2);
  const std::vector<float> add = RandomFloats(kSoftmaxRows * cols, -1.0f, 1.0f, 3);
  std::vector<uint8_t> padding(cols, 0);
  for (size_t j = cols - cols / 8; j < cols; ++j) padding[j] = 1;
  SoftmaxMasks masks;
  masks.add[0] = add.data();
  masks.add_row_stride[0] = static_cast<ptrdiff_t>(cols);
  masks.masked[0] = padding.data();
  masks.masked_row_stride[0] = 0;
  masks.causal = true;
  masks.causal_offset = static_cast<int64_t>(cols / 2);
  TimeSoftmaxRows(state, &scores, cols, masks);
}
BENCHMARK(BM_SoftmaxRowsMasked)->RangeMultiplier(4)->Range(64, 8192);

// The attention variants' terms on 16 x 2048 causal rows (the last 16 queries of 2048 keys).
// Argument: 0 = softcap 50 (tanh per element); 1 = ALiBi; 2 = window 256 with index positions
// (a column range: about 256 of 2048 columns per row run the passes); 3 = the same window with
// explicit positions (per-element int32 compare over every column); 4 = a sink.
void BM_SoftmaxRowsVariants(benchmark::State& state) {
  const size_t cols = 2048;
  std::vector<float> scores = RandomFloats(kSoftmaxRows * cols, -4.0f, 4.0f, 8);
  std::vector<int32_t> q_pos(kSoftmaxRows), k_pos(cols);
  for (size_t r = 0; r < kSoftmaxRows; ++r) {
    q_pos[r] = static_cast<int32_t>(cols - kSoftmaxRows + r);
  }
  for (size_t j = 0; j < cols; ++j) k_pos[j] = static_cast<int32_t>(j);
  SoftmaxMasks masks;
  masks.causal = true;
  masks.causal_offset = static_cast<int64_t>(cols - kSoftmaxRows);
  switch (state.range(0)) {
    case 0:
      masks.softcap = 50.0f;
      break;
    case 1:
      masks.alibi_slope = 0.0625f;
      break;
    case 2:
      masks.window = 256;
      break;
    case 3:
      masks.window = 256;
      masks.q_pos = q_pos.data();
      masks.k_pos = k_pos.data();
      break;
    default:
      masks.sink = 0.5f;
      break;
  }
  TimeSoftmaxRows(state, &scores, cols, masks);
}
BENCHMARK(BM_SoftmaxRowsVariants)->DenseRange(0, 4);

// RoPE on a 64-token block of q (16 heads x 128): argument 0 = neox, 1 = gptj. The rotation is
// repeated on the same rows (values stay bounded: it is a rotation).
void BM_ApplyRope(benchmark::State& state) {
  const size_t rows = 64, heads = 16, hd = 128, half = hd / 2;
  std::vector<float> x = RandomFloats(rows * heads * hd, -1.0f, 1.0f, 9);
  std::vector<double> inv_freq(half);
  for (size_t i = 0; i < half; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / hd);
  std::vector<float> cos(rows * half), sin(rows * half);
  kernels::RopeAngles(nullptr, 4096, rows, inv_freq.data(), half, cos.data(), sin.data());
  for (auto _ : state) {
    kernels::ApplyRope(x.data(), rows, static_cast<ptrdiff_t>(heads * hd), heads, hd, hd,
                       state.range(0) == 1, cos.data(), sin.data());
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows * heads * hd));
}
BENCHMARK(BM_ApplyRope)->DenseRange(0, 1);

// One online-softmax step as the attention's online path takes it: a strip of 24 query rows x
// 512 keys (kStripRows x kKeyBlock in runtime/attention.cc), scale 1 (applied by the scores
// product), no masks, head_dim 64 acc. Argument: 0 = a row's first key block (row_max -inf:
// passes 1 and 2); 1 = a later block within kOnlineSoftmaxHeadroom of the reference (the fused
// pass); 2 = a later block above it (the fused pass stops at once: passes 1 and 2 and the
// rescale). The scores are restored before every step, untimed (manual time), since the step
// overwrites them with p.
void BM_OnlineSoftmaxUpdate(benchmark::State& state) {
  const size_t rows = 24, cols = 512, hd = 64;
  const std::vector<float> pristine = RandomFloats(rows * cols, -4.0f, 4.0f, 4);
  std::vector<float> scores(rows * cols);
  std::vector<float> acc = RandomFloats(rows * hd, -1.0f, 1.0f, 5);
  const float start_max[3] = {-std::numeric_limits<float>::infinity(), 3.9f, -10.0f};
  std::vector<float> row_max(rows), row_sum(rows);
  for (auto _ : state) {
    scores = pristine;
    std::fill(row_max.begin(), row_max.end(), start_max[state.range(0)]);
    std::fill(row_sum.begin(), row_sum.end(), 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    kernels::OnlineSoftmaxUpdate(scores.data(), rows, cols, static_cast<ptrdiff_t>(cols), 1.0f,
                                 SoftmaxMasks(), row_max.data(), row_sum.data(), acc.data(), hd,
                                 static_cast<ptrdiff_t>(hd));
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  SetSoftmaxCounters(state, rows, cols);
}
BENCHMARK(BM_OnlineSoftmaxUpdate)->DenseRange(0, 2)->UseManualTime();

// The online softmax of one 64-token head as the attention's online path runs it when the head's
// keys are one key block (e.g. (32, 64, 512, 8)): strips of 24, 24 and 16 rows, each a row's
// first block (row_max -inf), scale 1, head_dim 64 acc. Argument: 0 = non-causal (every strip
// 64 columns), 1 = causal (each strip over the columns its last row sees: 24, 48, 64; row r of
// the head sees r + 1), which is half the elements. Items: the elements visible.
void BM_OnlineSoftmaxHead64(benchmark::State& state) {
  const size_t seq = 64, hd = 64;
  const bool causal = state.range(0) == 1;
  const std::vector<float> pristine = RandomFloats(seq * seq, -4.0f, 4.0f, 6);
  std::vector<float> scores(seq * seq), acc(seq * hd);
  std::vector<float> row_max(seq), row_sum(seq);
  for (auto _ : state) {
    scores = pristine;
    std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<float>::infinity());
    std::fill(row_sum.begin(), row_sum.end(), 0.0f);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t r0 = 0; r0 < seq; r0 += kStripRows) {
      const size_t rows = std::min(kStripRows, seq - r0);
      SoftmaxMasks masks;
      masks.causal = causal;
      masks.causal_offset = static_cast<int64_t>(r0);
      const size_t cols = causal ? r0 + rows : seq;
      kernels::OnlineSoftmaxUpdate(scores.data() + r0 * seq, rows, cols,
                                   static_cast<ptrdiff_t>(seq), 1.0f, masks, row_max.data() + r0,
                                   row_sum.data() + r0, acc.data() + r0 * hd, hd,
                                   static_cast<ptrdiff_t>(hd));
    }
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(causal ? seq * (seq + 1) / 2 : seq * seq));
  state.SetLabel(causal ? "causal" : "non-causal");
}
BENCHMARK(BM_OnlineSoftmaxHead64)->DenseRange(0, 1)->UseManualTime();

// Forces dispatch to the index-th target this CPU supports (kernels::SupportedTargets); false,
// with the benchmark skipped, where there are fewer. The caller restores with ForceTarget(0).
bool ForceTargetAt(benchmark::State& state, size_t index) {
  kernels::ForceTarget(0);
  const std::vector<int64_t> targets = kernels::SupportedTargets();
  if (index >= targets.size()) {
    state.SkipWithError("this CPU supports fewer targets");
    return false;
  }
  kernels::ForceTarget(targets[index]);
  return true;
}

// The decode kernels (kernels/decode.h) on one thread over a block of cached rows that stays in
// L2 (2048 positions of head_dim 64: 512 KiB f32, 256 KiB 16-bit, 128 KiB int8): their compute
// rate, which a decode step beyond the last-level cache needs above the memory's read rate.
// Arguments: cache type (0 f32, 1 bf16, 2 f16, 3 int8), query rows (1: multi-head, 4: the four
// query heads of a kv head), product (0 scores q K^T, 1 weighted sum P V). bytes/s counts the
// cache bytes read (int8: codes and row scales).
void BM_DecodeKernel(benchmark::State& state) {
  constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI8};
  const DType type = kTypes[state.range(0)];
  const size_t rows = static_cast<size_t>(state.range(1));
  const bool values = state.range(2) != 0;
  constexpr size_t n = 2048, hd = 64;
  state.SetLabel(std::string(DTypeName(type)) + (values ? " P V" : " q K^T"));
  const std::vector<float> src = RandomFloats(n * hd, -1.0f, 1.0f, 11);
  std::vector<uint8_t> cache(n * hd * DTypeSize(type));
  std::vector<float> scales(n, 1.0f / 127);
  if (type == DType::kF32) {
    std::memcpy(cache.data(), src.data(), cache.size());
  } else if (type == DType::kBF16) {
    kernels::F32ToBF16(src.data(), reinterpret_cast<uint16_t*>(cache.data()), src.size());
  } else if (type == DType::kF16) {
    kernels::F32ToF16(src.data(), reinterpret_cast<uint16_t*>(cache.data()), src.size());
  } else {
    for (size_t i = 0; i < src.size(); ++i) {
      cache[i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[i] * 127)));
    }
  }
  const std::vector<float> q = RandomFloats(rows * hd, -1.0f, 1.0f, 12);
  std::vector<float> p = RandomFloats(rows * n, 0.0f, 1.0f / n, 13);
  std::vector<float> out(rows * std::max(n, hd));
  for (auto _ : state) {
    if (values) {
      kernels::AccumulateWeightedValues(p.data(), rows, n, cache.data(), type, hd, scales.data(), n,
                                        hd, out.data(), hd);
    } else {
      kernels::QueryKeyScores(q.data(), rows, hd, cache.data(), type, hd, scales.data(), n, hd,
                              out.data(), n);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const size_t bytes = cache.size() + (type == DType::kI8 ? n * sizeof(float) : 0);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_DecodeKernel)->ArgsProduct({{0, 1, 2, 3}, {1, 4}, {0, 1}});

// The int8 dot-product decode kernels (kernels/decode_int8.h) on BM_DecodeKernel's int8 block,
// to set beside its f32-arithmetic int8 rows. Arguments: kernel (0 portable, 1 AVX512_VNNI:
// skipped where the CPU lacks it), query rows, product (0 scores, 1 weighted sum).
void BM_DecodeDotKernel(benchmark::State& state) {
  const kernels::DecodeDotKernel kernel =
      state.range(0) == 0 ? kernels::DecodeDotKernel::kPortable : kernels::DecodeDotKernel::kAvx512Vnni;
  if (!kernels::DecodeDotKernelAvailable(kernel)) {
    state.SkipWithError("kernel not available on this CPU");
    return;
  }
  const size_t rows = static_cast<size_t>(state.range(1));
  const bool values = state.range(2) != 0;
  constexpr size_t n = 2048, hd = 64;
  state.SetLabel(std::string(kernels::DecodeDotKernelName(kernel)) + (values ? " P V" : " q K^T"));
  const std::vector<float> src = RandomFloats(n * hd, -1.0f, 1.0f, 11);
  std::vector<int8_t> cache(n * hd);
  for (size_t i = 0; i < src.size(); ++i) cache[i] = static_cast<int8_t>(std::lround(src[i] * 127));
  std::vector<float> scales(n, 1.0f / 127);
  const std::vector<float> q = RandomFloats(rows * hd, -1.0f, 1.0f, 12);
  std::vector<float> p = RandomFloats(rows * n, 0.0f, 1.0f / n, 13);
  std::vector<float> out(rows * std::max(n, hd));
  for (auto _ : state) {
    if (values) {
      kernels::AccumulateWeightedValuesDot(kernel, p.data(), rows, n, cache.data(), hd,
                                           scales.data(), n, hd, out.data(), hd);
    } else {
      kernels::QueryKeyScoresDot(kernel, q.data(), rows, hd, cache.data(), hd, scales.data(), n,
                                 hd, out.data(), n);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (n * hd + n * sizeof(float))));
}
BENCHMARK(BM_DecodeDotKernel)->ArgsProduct({{0, 1}, {1, 4}, {0, 1}});

// The int8-activation decode product (kernels/gemv_int8.h): one row of quantized activations
// (k 4096) times quantized weights on one thread, weights of 1 MiB (L2-resident: the kernel's
// compute rate) or 96 MiB (beyond any L3 here: its memory stream; a decode step needs it near
// the read probe's rate per thread). Arguments: kernel (0 the active one, 1 AVX2, 2 portable,
// 3 none: a plain sum of the same bytes, the thread's streaming read rate), weights (0 i8, 1 i4
// in 32-blocks), size (0 L2, 1 DRAM). bytes/s counts the weights' codes and scales read.
void BM_GemvInt8(benchmark::State& state) {
  constexpr kernels::Int8Kernel kKernels[] = {kernels::Int8Kernel::kAuto,
                                              kernels::Int8Kernel::kAvx2,
                                              kernels::Int8Kernel::kPortable,
                                              kernels::Int8Kernel::kPortable};
  kernels::Int8Kernel kernel = kKernels[state.range(0)];
  if (kernel == kernels::Int8Kernel::kAuto) kernel = kernels::Int8ActiveKernel();
  if (!kernels::Int8KernelAvailable(kernel)) {
    state.SkipWithError("this CPU lacks the kernel");
    return;
  }
  const DType type = state.range(1) == 0 ? DType::kI8 : DType::kI4;
  const size_t block = type == DType::kI4 ? kernels::kI4Block : 0;
  constexpr size_t k = 4096;
  const size_t row_bytes = kernels::QuantRowBytes(type, block, k);
  const size_t scales_per_row = kernels::QuantScalesPerRow(type, block, k);
  const size_t weight_bytes = (state.range(2) == 0 ? 1 : 96) << 20;
  const size_t n = weight_bytes / (row_bytes + scales_per_row * sizeof(float));
  state.SetLabel(std::string(kernels::Int8KernelName(kernel)) + " " + DTypeName(type) +
                 (state.range(2) == 0 ? " L2" : " DRAM"));
  // Codes of random bytes (every value a valid i8 / two i4 codes), scales near 1 / 127, in one
  // LargeBuffer as a layer holds them (layer_weights.cc: huge pages on its whole 2 MiB blocks).
  LargeBuffer storage = AllocateLargeBuffer(n * row_bytes + n * scales_per_row * sizeof(float) + 64);
  if (!storage) {
    state.SkipWithError("out of memory");
    return;
  }
  uint8_t* codes = storage.get();
  std::mt19937 rng(14);
  for (size_t i = 0; i < n * row_bytes; ++i) {
    codes[i] = static_cast<uint8_t>(rng() & (type == DType::kI8 ? 0x7F : 0x77));
  }
  float* scales = reinterpret_cast<float*>(codes + (n * row_bytes + 63) / 64 * 64);
  const std::vector<float> drawn = RandomFloats(n * scales_per_row, 0.007f, 0.009f, 15);
  std::copy(drawn.begin(), drawn.end(), scales);
  const kernels::QuantMatrix w{codes, scales, type, block, n, k, row_bytes, scales_per_row,
                               /*int8_activations=*/true};
  if (state.range(0) == 3) {  // the same bytes summed: one thread's streaming read rate
    const uint64_t* p = reinterpret_cast<const uint64_t*>(codes);
    const size_t words = (n * row_bytes + n * scales_per_row * sizeof(float)) / 8;
    for (auto _ : state) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = 0; i + 4 <= words; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
      }
      benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
    }
    state.SetLabel(std::string("read ") + DTypeName(type) +
                   (state.range(2) == 0 ? " L2" : " DRAM"));
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * words * 8));
    return;
  }
  const std::vector<float> a = RandomFloats(k, -1.0f, 1.0f, 16);
  const kernels::Int8ActLayout lay = kernels::Int8ActLayoutOf(type, block, k);
  std::vector<uint8_t> buf(lay.row_bytes + 64);  // the kernels read it 64-byte aligned
  uint8_t* qa = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  kernels::QuantizeActivationsInt8(a.data(), k, 1, k, type, block, qa);
  std::vector<float> c(n);
  const MatrixView cv{c.data(), 1, n, static_cast<ptrdiff_t>(n), 1};
  for (auto _ : state) {
    kernels::GemvInt8Rows(kernel, qa, 1, w, cv);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * n * (row_bytes + scales_per_row * sizeof(float))));
}
BENCHMARK(BM_GemvInt8)->ArgsProduct({{0, 1, 2, 3}, {0, 1}, {0, 1}});

// Softmax of 16 x 1024 on each target this CPU supports (argument = index into the list).
void BM_SoftmaxRowsPerTarget(benchmark::State& state) {
  if (!ForceTargetAt(state, static_cast<size_t>(state.range(0)))) return;
  state.SetLabel(kernels::TargetName(kernels::ActiveTarget()));
  const size_t cols = 1024;
  std::vector<float> scores = RandomFloats(kSoftmaxRows * cols, -4.0f, 4.0f, 6);
  TimeSoftmaxRows(state, &scores, cols, SoftmaxMasks());
  kernels::ForceTarget(0);
}
BENCHMARK(BM_SoftmaxRowsPerTarget)->DenseRange(0, 5);

// 16-bit conversions of 4096 values (a 64 x 64 head tile).
template <void (*Convert)(const float*, uint16_t*, size_t)>
void BM_ConvertFromF32(benchmark::State& state) {
  const size_t n = 4096;
  const std::vector<float> x = RandomFloats(n, -100.0f, 100.0f, 7);
  std::vector<uint16_t> y(n);
  for (auto _ : state) {
    Convert(x.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 6));
}
template <void (*Convert)(const uint16_t*, float*, size_t)>
void BM_ConvertToF32(benchmark::State& state) {
  const size_t n = 4096;
  std::vector<uint16_t> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<uint16_t>(0x3000 + i);  // finite in both
  std::vector<float> y(n);
  for (auto _ : state) {
    Convert(x.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 6));
}
BENCHMARK_TEMPLATE(BM_ConvertFromF32, kernels::F32ToBF16)->Name("BM_F32ToBF16");
BENCHMARK_TEMPLATE(BM_ConvertFromF32, kernels::F32ToF16)->Name("BM_F32ToF16");
BENCHMARK_TEMPLATE(BM_ConvertToF32, kernels::BF16ToF32)->Name("BM_BF16ToF32");
BENCHMARK_TEMPLATE(BM_ConvertToF32, kernels::F16ToF32)->Name("BM_F16ToF32");

// --- GEMM ---------------------------------------------------------------------------------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Gemm's packing scratch, allocated once per benchmark (outside the timed loop).
std::unique_ptr<void, FreeDeleter> GemmScratch() {
  const size_t a = kernels::kGemmScratchAlignment;
  const size_t bytes = (kernels::GemmScratchBytes() + a - 1) / a * a;
  return std::unique_ptr<void, FreeDeleter>(std::aligned_alloc(a, bytes));
}

// An aligned buffer for kernels::PackB of a [k, n] operand (null if it cannot be allocated).
std::unique_ptr<void, FreeDeleter> PackedBuffer(size_t k, size_t n) {
  const size_t a = kernels::kGemmScratchAlignment;
  const size_t bytes = (kernels::PackedBFloats(k, n) * sizeof(float) + a - 1) / a * a;
  return std::unique_ptr<void, FreeDeleter>(std::aligned_alloc(a, bytes));
}

MatrixView RowMajor(std::vector<float>& v, size_t rows, size_t cols) {
  return MatrixView{v.data(), rows, cols, static_cast<ptrdiff_t>(cols), 1};
}

void RunGemm(benchmark::State& state, const MatrixView& a, const MatrixView& b,
             const MatrixView& c) {
  kernels::GemmInit();
  const auto scratch = GemmScratch();
  if (!scratch) {
    state.SkipWithError("cannot allocate GEMM scratch");
    return;
  }
  for (auto _ : state) {
    kernels::Gemm(1.0f, a, b, 0.0f, c, scratch.get());
    benchmark::DoNotOptimize(c.data);
    benchmark::ClobberMemory();
  }
  const double flops =
      2.0 * static_cast<double>(a.rows) * static_cast<double>(b.cols) * static_cast<double>(a.cols);
  // Printed as FLOPS=<n>G/s (rate over CPU time, base 1000).
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.SetLabel(kernels::GemmArchName());
}

constexpr size_t kHeadDim = 64;

// Scores of one head: Q [L, 64] x K^T, with K stored [S, 64] row-major (a transposed view, as in
// the operator). L = S = range(0).
void BM_GemmScores(benchmark::State& state) {
  const size_t len = static_cast<size_t>(state.range(0));
  std::vector<float> q = RandomFloats(len * kHeadDim, -1.0f, 1.0f, 8);
  std::vector<float> k = RandomFloats(len * kHeadDim, -1.0f, 1.0f, 9);
  std::vector<float> s(len * len);
  RunGemm(state, RowMajor(q, len, kHeadDim), RowMajor(k, len, kHeadDim).Transposed(),
          RowMajor(s, len, len));
}
BENCHMARK(BM_GemmScores)->RangeMultiplier(2)->Range(128, 1024);

// Weighted sum of one head: P [L, S] x V [S, 64]. L = S = range(0).
void BM_GemmPV(benchmark::State& state) {
  const size_t len = static_cast<size_t>(state.range(0));
  std::vector<float> p = RandomFloats(len * len, 0.0f, 1.0f, 10);
  std::vector<float> v = RandomFloats(len * kHeadDim, -1.0f, 1.0f, 11);
  std::vector<float> o(len * kHeadDim);
  RunGemm(state, RowMajor(p, len, len), RowMajor(v, len, kHeadDim), RowMajor(o, len, kHeadDim));
}
BENCHMARK(BM_GemmPV)->RangeMultiplier(2)->Range(128, 1024);

// mha's Gemm (range(1) = 0) against BLIS's own bli_sgemm_ex (range(1) = 1) on one thread,
// row-major operands, beta 0, at shapes from a tiny block to a large square (range(0) indexes
// kGemmVersusBlisShapes): how mha's blocked driver over BLIS's micro-kernel compares with BLIS's
// driver, which also allocates its control tree per call (kernels/gemm.h says why mha has its
// own). Run the two alternately:
//   build/bench/kernels_bench --benchmark_filter=GemmVersusBlis --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true
struct GemmShape {
  size_t m, n, k;
};
constexpr GemmShape kGemmVersusBlisShapes[] = {
    {16, 16, 64}, {64, 1024, 64}, {128, 512, 64}, {512, 2304, 768}, {2048, 2048, 2048}};

void BM_GemmVersusBlis(benchmark::State& state) {
  const GemmShape& g = kGemmVersusBlisShapes[state.range(0)];
  std::vector<float> a = RandomFloats(g.m * g.k, -1.0f, 1.0f, 12);
  std::vector<float> b = RandomFloats(g.k * g.n, -1.0f, 1.0f, 13);
  std::vector<float> c(g.m * g.n);
  if (state.range(1) == 0) {
    RunGemm(state, RowMajor(a, g.m, g.k), RowMajor(b, g.k, g.n), RowMajor(c, g.m, g.n));
    return;
  }
  kernels::GemmInit();
  rntm_t rntm;
  bli_rntm_init(&rntm);
  bli_rntm_set_num_threads(1, &rntm);
  float one = 1.0f, zero = 0.0f;
  for (auto _ : state) {
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, static_cast<dim_t>(g.m),
                 static_cast<dim_t>(g.n), static_cast<dim_t>(g.k), &one, a.data(),
                 static_cast<inc_t>(g.k), 1, b.data(), static_cast<inc_t>(g.n), 1, &zero, c.data(),
                 static_cast<inc_t>(g.n), 1, nullptr, &rntm);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) *
                       static_cast<double>(g.k);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.SetLabel(std::string("bli_sgemm_ex, ") + kernels::GemmArchName());
}
BENCHMARK(BM_GemmVersusBlis)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}});

// The online attention path's two products for one strip of 24 query rows against a key block
// of 512 keys packed once (PackB outside the timed loop, as the operator amortizes it over its
// strips): scores [24, 512] = Q_strip [24, 64] K^T (range(0) = 0) and acc [24, 64] += P [24,
// 512] V [512, 64] (range(0) = 1). Q and P are read through a 1024-float row stride, as the
// strips of the operator's [tokens, E] buffers.
void BM_GemmPackedStrip(benchmark::State& state) {
  const bool pv = state.range(0) == 1;
  const size_t rows = 24, keys = 512, ld = 1024;
  kernels::GemmInit();
  const auto scratch = GemmScratch();
  std::vector<float> a_buf = RandomFloats(rows * ld, -1.0f, 1.0f, 14);
  std::vector<float> kv = RandomFloats(keys * kHeadDim, -1.0f, 1.0f, 15);
  std::vector<float> c_buf(rows * ld);
  const size_t k = pv ? keys : kHeadDim, n = pv ? kHeadDim : keys;
  const MatrixView b =
      pv ? RowMajor(kv, keys, kHeadDim) : RowMajor(kv, keys, kHeadDim).Transposed();
  const auto packed = PackedBuffer(k, n);
  if (!scratch || !packed) {
    state.SkipWithError("cannot allocate GEMM scratch");
    return;
  }
  const kernels::PackedB pb = kernels::PackB(b, static_cast<float*>(packed.get()));
  const MatrixView a{a_buf.data(), rows, k, static_cast<ptrdiff_t>(ld), 1};
  const MatrixView c{c_buf.data(), rows, n, static_cast<ptrdiff_t>(ld), 1};
  for (auto _ : state) {
    kernels::GemmBlisPackedB(pv ? 1.0f : 0.125f, a, pb, pv ? 1.0f : 0.0f, c, scratch.get());
    benchmark::DoNotOptimize(c.data);
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(rows * n * k);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.SetLabel(pv ? "P V" : "Q K^T");
}
BENCHMARK(BM_GemmPackedStrip)->Arg(0)->Arg(1);

// A product by an operand packed once (kernels::PackB, outside the timed loop): range(3) = 0
// through BLIS's micro-kernel (kernels::GemmBlisPackedB, which packs a per call), 1 through mha's
// direct micro-kernel (kernels::GemmDirectPackedB, a read in place; skipped where it cannot run).
// Shapes (m, k, n) = range(0..2), from the operator: a 128-token projection [128, 512] x
// [512, 512], a 16-token one [16, 256] x [256, 768], a strip's scores [24, 64] x [64, 128] and
// its probabilities times V [24, 512] x [512, 64], and [64, 64] x [64, 512]. Both kernels of a
// shape run in the same process, so their ratio is the kernels' (the throwaway loops quoted in
// kernels/gemm_direct.h and README's Performance measured these shapes the same way).
void BM_GemmPackedOperand(benchmark::State& state) {
  const size_t m = static_cast<size_t>(state.range(0)), k = static_cast<size_t>(state.range(1));
  const size_t n = static_cast<size_t>(state.range(2));
  const bool direct = state.range(3) == 1;
  kernels::GemmInit();
  if (direct && !kernels::GemmDirectSupported()) {
    state.SkipWithError("GemmDirectPackedB does not run on this target / BLIS configuration");
    return;
  }
  const auto scratch = GemmScratch();
  std::vector<float> a = RandomFloats(m * k, -1.0f, 1.0f, 16);
  std::vector<float> b = RandomFloats(k * n, -1.0f, 1.0f, 17);
  std::vector<float> c(m * n);
  const auto packed = PackedBuffer(k, n);
  if (!scratch || !packed) {
    state.SkipWithError("cannot allocate GEMM scratch");
    return;
  }
  const kernels::PackedB pb = kernels::PackB(RowMajor(b, k, n), static_cast<float*>(packed.get()));
  const MatrixView av = RowMajor(a, m, k), cv = RowMajor(c, m, n);
  for (auto _ : state) {
    if (direct) {
      const bool ran = kernels::GemmDirectPackedB(1.0f, av, pb, 0.0f, cv);
      assert(ran && "the direct kernel runs where it was chosen");
      (void)ran;
    } else {
      kernels::GemmBlisPackedB(1.0f, av, pb, 0.0f, cv, scratch.get());
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(m * n * k);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.SetLabel(direct ? "GemmDirectPackedB" : "GemmBlisPackedB (BLIS)");
}
BENCHMARK(BM_GemmPackedOperand)
    ->ArgsProduct({{128}, {512}, {512}, {0, 1}})
    ->ArgsProduct({{16}, {256}, {768}, {0, 1}})
    ->ArgsProduct({{24}, {64}, {128}, {0, 1}})
    ->ArgsProduct({{24}, {512}, {64}, {0, 1}})
    ->ArgsProduct({{64}, {64}, {512}, {0, 1}})
    ->ArgsProduct({{64}, {512}, {512}, {0, 1}})
    ->ArgsProduct({{128}, {1024}, {1024}, {0, 1}})
    ->ArgsProduct({{64}, {512}, {64}, {0, 1}});

// The bf16 compute product (kernels/gemm_bf16.h) by a b packed beforehand, per kernel:
// range(0) a Bf16Kernel (unavailable ones skip with the reason), range(1..3) m, k, n. Shapes:
// a projection [128, 1024] x [1024, 1024], scores [64, 64] x [64, 512], P V [64, 512] x
// [512, 64] (BM_GemmPackedOperand has the f32 direct kernel at the same shapes). FLOPS as
// above.
void BM_GemmBf16(benchmark::State& state) {
  const auto kernel = static_cast<kernels::Bf16Kernel>(state.range(0));
  const size_t m = static_cast<size_t>(state.range(1)), k = static_cast<size_t>(state.range(2));
  const size_t n = static_cast<size_t>(state.range(3));
  state.SetLabel(kernels::Bf16KernelName(kernel));
  if (!kernels::Bf16KernelAvailable(kernel)) {
    state.SkipWithError("this CPU (or OS) does not run the kernel");
    return;
  }
  const size_t align = 64;
  const size_t scratch_bytes = (kernels::GemmBf16ScratchBytes() + align - 1) / align * align;
  const std::unique_ptr<void, FreeDeleter> scratch(std::aligned_alloc(align, scratch_bytes));
  const size_t packed_bytes =
      (kernels::PackedBf16Elements(k, n) * sizeof(uint16_t) + align - 1) / align * align;
  const std::unique_ptr<void, FreeDeleter> packed(std::aligned_alloc(align, packed_bytes));
  if (!scratch || !packed) {
    state.SkipWithError("cannot allocate the scratch or the packing");
    return;
  }
  std::vector<float> a = RandomFloats(m * k, -1.0f, 1.0f, 16);
  std::vector<float> b = RandomFloats(k * n, -1.0f, 1.0f, 17);
  std::vector<float> c(m * n);
  const kernels::PackedBf16B pb =
      kernels::PackBf16B(RowMajor(b, k, n), static_cast<uint16_t*>(packed.get()));
  const MatrixView av = RowMajor(a, m, k), cv = RowMajor(c, m, n);
  kernels::ForceBf16Kernel(kernel);
  for (auto _ : state) {
    kernels::GemmBf16PackedB(1.0f, av, pb, 0.0f, nullptr, cv, scratch.get());
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  kernels::ForceBf16Kernel(kernels::Bf16DefaultKernel());
  const double flops = 2.0 * static_cast<double>(m * n * k);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmBf16)
    ->ArgsProduct({{0, 1, 2, 3}, {128}, {1024}, {1024}})
    ->ArgsProduct({{0, 1, 2, 3}, {64}, {64}, {512}})
    ->ArgsProduct({{0, 1, 2, 3}, {64}, {512}, {64}});

// The attention core of one (batch, head) alone, as the operator's online path runs it
// (runtime/attention.cc, RunAttention): Q [L, hd], K and V [S, hd] rows of [tokens, E]-strided
// buffers (E = 8 hd); per key block of 512 keys K^T and V packed once (kernels::PackB), then
// strips of 24 query rows: scores = scale Q_strip K^T (kernels::GemmDirectPackedB, Q read in
// place), kernels::OnlineSoftmaxUpdate, acc += P V; kernels::OnlineSoftmaxFinish at the end.
// L = S = 1024, no mask. range(0): index into the targets this CPU supports (ForceTarget);
// range(1): head_dim (64 or 128); range(2) = 1 skips the softmax (the two products alone, on
// the same packed operands: the core's GEMM ceiling in the same process). FLOPS counts the two
// products' 4 L S hd flops. Targets where the direct kernel does not run (NR of BLIS's
// configuration not a multiple of the target's lanes) are skipped with the reason.
void BM_AttentionCore(benchmark::State& state) {
  if (!ForceTargetAt(state, static_cast<size_t>(state.range(0)))) return;
  state.SetLabel(std::string(kernels::TargetName(kernels::ActiveTarget())) +
                 (state.range(2) == 1 ? " products only" : ""));
  if (!kernels::GemmDirectSupported()) {
    kernels::ForceTarget(0);
    state.SkipWithError("the direct micro-kernel does not run on this target");
    return;
  }
  const size_t len = 1024, hd = static_cast<size_t>(state.range(1)), ld = 8 * hd;
  const size_t key_block = 512, strip = 24;
  const bool softmax = state.range(2) == 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> q = RandomFloats(len * ld, -1.0f, 1.0f, 20);
  std::vector<float> k = RandomFloats(len * ld, -1.0f, 1.0f, 21);
  std::vector<float> v = RandomFloats(len * ld, -1.0f, 1.0f, 22);
  std::vector<float> scores(strip * key_block), acc(len * hd), row_max(len), row_sum(len);
  const auto packed_k = PackedBuffer(hd, key_block);
  const auto packed_v = PackedBuffer(key_block, hd);
  if (!packed_k || !packed_v) {
    kernels::ForceTarget(0);
    state.SkipWithError("cannot allocate the packed operands");
    return;
  }
  const auto rows_of = [ld](std::vector<float>& x, size_t r0, size_t n, size_t cols) {
    return MatrixView{x.data() + r0 * ld, n, cols, static_cast<ptrdiff_t>(ld), 1};
  };
  for (auto _ : state) {
    std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<float>::infinity());
    std::fill(row_sum.begin(), row_sum.end(), 0.0f);
    for (size_t k0 = 0; k0 < len; k0 += key_block) {
      const kernels::PackedB kp = kernels::PackB(rows_of(k, k0, key_block, hd).Transposed(),
                                                 static_cast<float*>(packed_k.get()));
      const kernels::PackedB vp =
          kernels::PackB(rows_of(v, k0, key_block, hd), static_cast<float*>(packed_v.get()));
      for (size_t r0 = 0; r0 < len; r0 += strip) {
        const size_t sr = std::min(strip, len - r0);
        const MatrixView s_view{scores.data(), sr, key_block, static_cast<ptrdiff_t>(key_block), 1};
        const MatrixView a_view{acc.data() + r0 * hd, sr, hd, static_cast<ptrdiff_t>(hd), 1};
        bool ran = kernels::GemmDirectPackedB(scale, rows_of(q, r0, sr, hd), kp, 0.0f, s_view);
        if (softmax) {
          kernels::OnlineSoftmaxUpdate(
              scores.data(), sr, key_block, static_cast<ptrdiff_t>(key_block), 1.0f, SoftmaxMasks(),
              row_max.data() + r0, row_sum.data() + r0, a_view.data, hd, a_view.row_stride);
        }
        ran &= kernels::GemmDirectPackedB(1.0f, s_view, vp, k0 == 0 ? 0.0f : 1.0f, a_view);
        benchmark::DoNotOptimize(ran);  // checked before the loop (GemmDirectSupported)
      }
    }
    if (softmax) {
      kernels::OnlineSoftmaxFinish(acc.data(), len, hd, static_cast<ptrdiff_t>(hd), row_sum.data());
    }
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  kernels::ForceTarget(0);
  const double flops = 4.0 * static_cast<double>(len * len * hd);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionCore)->ArgsProduct({{0, 1, 2, 3, 4, 5}, {64, 128}, {0, 1}});

// Packed input projection: X [512 tokens, E = 512] x W^T [512, 3 E = 1536] (W stored
// [1536, 512] as nn.Linear, read through a transposed view).
void BM_GemmProjection(benchmark::State& state) {
  const size_t tokens = 512, e = 512, out = 1536;
  std::vector<float> x = RandomFloats(tokens * e, -1.0f, 1.0f, 12);
  std::vector<float> w = RandomFloats(out * e, -0.05f, 0.05f, 13);
  std::vector<float> y(tokens * out);
  RunGemm(state, RowMajor(x, tokens, e), RowMajor(w, out, e).Transposed(),
          RowMajor(y, tokens, out));
}
BENCHMARK(BM_GemmProjection);

// A larger projection, X [4096 tokens, 512] x W^T [512, 1536] (the Q/K/V projection of
// (4, 1024, 512, 8)), as ParallelGemm runs it on a pool of one thread: 0 = panels that each
// pack their own columns of W (no packing buffer), 1 = W packed once for all panels (the
// operator's path), 2 = one kernels::Gemm call for the whole product (the ceiling).
void BM_ProjectionPanels(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const size_t tokens = 4096, e = 512, out = 1536;
  std::vector<float> x = RandomFloats(tokens * e, -1.0f, 1.0f, 16);
  std::vector<float> w = RandomFloats(out * e, -0.05f, 0.05f, 17);
  std::vector<float> y(tokens * out);
  kernels::GemmInit();
  const size_t align = kernels::kGemmScratchAlignment;
  const size_t stride = (kernels::GemmScratchBytes() + align - 1) / align * align;
  const size_t packed_bytes = PackedJobBytes(e, out);
  std::unique_ptr<void, FreeDeleter> scratch(std::aligned_alloc(align, stride));
  std::unique_ptr<void, FreeDeleter> packed(std::aligned_alloc(align, packed_bytes));
  if (!scratch || !packed) {
    state.SkipWithError("cannot allocate GEMM scratch");
    return;
  }
  ThreadPool pool(1);
  GemmJob job;
  job.a = RowMajor(x, tokens, e);
  job.b = RowMajor(w, out, e).Transposed();
  job.c = RowMajor(y, tokens, out);
  for (auto _ : state) {
    if (mode == 2) {
      kernels::Gemm(1.0f, job.a, job.b, 0.0f, job.c, scratch.get());
    } else {
      ParallelGemm(pool, &job, 1, static_cast<uint8_t*>(scratch.get()), stride,
                   kernels::Bf16ActiveKernel(), nullptr,
                   mode == 1 ? static_cast<uint8_t*>(packed.get()) : nullptr,
                   mode == 1 ? packed_bytes : 0);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(tokens * e * out);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.SetLabel(mode == 0   ? "own packing per panel"
                 : mode == 1 ? "weights packed once"
                             : "one call");
}
BENCHMARK(BM_ProjectionPanels)->DenseRange(0, 2)->UseRealTime();

}  // namespace
}  // namespace mha

BENCHMARK_MAIN();
