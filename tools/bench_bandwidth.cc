// Memory bandwidth probes for mha-bench --decode (contract in bench_bandwidth.h). The read
// kernel is compiled once per Highway target (foreach_target) and dispatched once per slice:
// on an AVX-512 Xeon VM, 2 threads summing 1 GiB read 18-20 GB/s with SSE2 loads (the build's
// baseline) and 24-25 GB/s with AVX-512 loads, which is what the decode kernels use.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tools/bench_bandwidth.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Sum of n floats (n a multiple of 4 vectors; the caller's slices are), four independent
// accumulators so that the loads, not the adds, set the pace. One sequential stream.
float SumFloats(const float* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (size_t i = 0; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * N));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

// The same sum read as the decode kernels read a cache (kernels/decode-inl.h): the n floats
// as four equal runs side by side, each requesting its lines 512 bytes ahead. n a multiple of 16
// vectors.
float SumFloatsStreams(const float* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t run = n / 4;
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (size_t i = 0; i + N <= run; i += N) {
    // One prefetch per 64-byte line of each run.
    if (i * sizeof(float) % 64 == 0) {
      for (size_t s = 0; s < 4; ++s) hwy::Prefetch(p + s * run + i + 512 / sizeof(float));
    }
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + run + i));
    a2 = hn::Add(a2, hn::LoadU(d, p + 2 * run + i));
    a3 = hn::Add(a3, hn::LoadU(d, p + 3 * run + i));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

}  // namespace HWY_NAMESPACE
}  // namespace mha
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "runtime/thread_pool.h"
#include "runtime/trace.h"
#include "tools/bench_bandwidth.h"

namespace mha {

HWY_EXPORT(SumFloats);
HWY_EXPORT(SumFloatsStreams);

size_t LastLevelCacheBytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return llc > 0 ? static_cast<size_t>(llc) : 0;
}

size_t ReadBufferBytes() { return std::max<size_t>(size_t{512} << 20, 4 * LastLevelCacheBytes()); }

ReadProbe::ReadProbe() {
  // A multiple of 1024 floats per slice for any thread count up to 64 (whole groups of four
  // vectors on every target); the last slice takes the remainder.
  floats_ = ReadBufferBytes() / sizeof(float) / (64 * 1024) * (64 * 1024);
  buf_ = AllocateLargeBuffer(floats_ * sizeof(float));
  if (!buf_) throw std::bad_alloc();
  float* f = reinterpret_cast<float*>(buf_.get());
  std::fill(f, f + floats_, 1.0f);
}

double ReadProbe::Measure(size_t threads, int reps) const {
  const size_t parts = std::max<size_t>(threads, 1);
  const size_t slice = floats_ / parts / 1024 * 1024;
  ThreadPool pool(parts);
  std::vector<float> sums(parts);
  double best_s = 0;
  // Both access patterns, alternating; the faster one's best time is the roofline.
  for (int rep = 0; rep <= 2 * reps + 1; ++rep) {
    const bool streams = rep % 2 != 0;
    const int64_t t0 = TraceRecorder::NowNs();
    pool.ParallelFor(parts, [&](uint64_t task, size_t /*worker*/) {
      const float* p = reinterpret_cast<const float*>(buf_.get()) + task * slice;
      sums[task] = streams ? HWY_DYNAMIC_DISPATCH(SumFloatsStreams)(p, slice)
                           : HWY_DYNAMIC_DISPATCH(SumFloats)(p, slice);
    });
    const double sec = static_cast<double>(TraceRecorder::NowNs() - t0) * 1e-9;
    if (rep > 1 && (best_s == 0 || sec < best_s)) best_s = sec;
  }
  // The sums are used, so the loads cannot go.
  float all = 0;
  for (float s : sums) all += s;
  if (all < 0) std::fputc('\0', stderr);
  return best_s > 0 ? static_cast<double>(slice * parts * sizeof(float)) / best_s * 1e-9 : 0.0;
}

double MeasureReadGbs(size_t threads) { return ReadProbe().Measure(threads, 8); }

double MeasureCopyGbs(size_t threads) {
  constexpr int64_t kCopyBytes = int64_t{256} << 20;
  std::unique_ptr<uint8_t[]> src(new uint8_t[kCopyBytes]), dst(new uint8_t[kCopyBytes]);
  std::memset(src.get(), 1, kCopyBytes);
  std::memset(dst.get(), 2, kCopyBytes);
  ThreadPool pool(threads);
  const uint64_t parts = threads;
  const int64_t slice = kCopyBytes / static_cast<int64_t>(parts);
  double best_s = 0;
  for (int rep = 0; rep < 6; ++rep) {
    const int64_t t0 = TraceRecorder::NowNs();
    pool.ParallelFor(parts, [&](uint64_t task, size_t /*worker*/) {
      const int64_t begin = static_cast<int64_t>(task) * slice;
      const int64_t end = task + 1 == parts ? kCopyBytes : begin + slice;
      std::memcpy(dst.get() + begin, src.get() + begin, static_cast<size_t>(end - begin));
    });
    const double sec = static_cast<double>(TraceRecorder::NowNs() - t0) * 1e-9;
    if (rep > 0 && (best_s == 0 || sec < best_s)) best_s = sec;
  }
  return best_s > 0 ? 2.0 * static_cast<double>(kCopyBytes) / best_s * 1e-9 : 0.0;
}

}  // namespace mha
#endif  // HWY_ONCE
