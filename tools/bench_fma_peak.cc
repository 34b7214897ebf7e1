// The multiply-add throughput probe of mha-bench (contract in bench_fma_peak.h). The chains are
// compiled once per Highway target (foreach_target) and dispatched once per thread.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tools/bench_fma_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// kFmaChains (12) chains of a = a * 0.5 + 1 over `iters` steps; each chain converges to 2, so
// no value grows or goes subnormal. Returns the number of lanes, so the caller can count flops,
// and stores the sum of the chains to *sink, so the work cannot be removed.
size_t FmaChains(size_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.5f);
  const auto c = hn::Set(d, 1.0f);
  // Named accumulators (not an array): SVE's sizeless vectors cannot form one, and the
  // compiler keeps them all in registers.
  auto a0 = hn::Set(d, 0.0f), a1 = hn::Set(d, 0.1f), a2 = hn::Set(d, 0.2f);
  auto a3 = hn::Set(d, 0.3f), a4 = hn::Set(d, 0.4f), a5 = hn::Set(d, 0.5f);
  auto a6 = hn::Set(d, 0.6f), a7 = hn::Set(d, 0.7f), a8 = hn::Set(d, 0.8f);
  auto a9 = hn::Set(d, 0.9f), a10 = hn::Set(d, 1.0f), a11 = hn::Set(d, 1.1f);
  for (size_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  const auto s = hn::Add(
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
      hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return hn::Lanes(d);
}

}  // namespace HWY_NAMESPACE
}  // namespace mha
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "runtime/thread_pool.h"
#include "runtime/trace.h"
#include "tools/bench_fma_peak.h"

namespace mha {

HWY_EXPORT(FmaChains);

double MeasureFmaPeakGflops(size_t threads) {
  // Steps per run: calibrated to ~8 ms from two short runs of kCalibrationIters (0.1 ms on an
  // AVX-512 core), so the probe costs ~50 ms whatever the build: under ASan at -O1 the chains
  // spill to the stack and run 50x slower, and a fixed count took 2 s per probe.
  constexpr size_t kCalibrationIters = size_t{1} << 16;
  constexpr size_t kMaxIters = size_t{8} << 20;
  constexpr double kRepSeconds = 8e-3;
  constexpr int kReps = 5;
  const size_t parts = threads > 0 ? threads : 1;
  ThreadPool pool(parts);
  std::vector<float> sinks(parts);
  std::vector<size_t> lanes(parts);
  // Seconds of one run of `iters` steps on every thread.
  const auto run = [&](size_t iters) {
    const int64_t t0 = TraceRecorder::NowNs();
    pool.ParallelFor(parts, [&](uint64_t task, size_t /*worker*/) {
      lanes[task] = HWY_DYNAMIC_DISPATCH(FmaChains)(iters, &sinks[task]);
    });
    return static_cast<double>(TraceRecorder::NowNs() - t0) * 1e-9;
  };
  const double calibration_s = std::min(run(kCalibrationIters), run(kCalibrationIters));
  const double scale = calibration_s > 0 ? kRepSeconds / calibration_s : 1.0;
  const size_t iters = static_cast<size_t>(
      std::clamp(static_cast<double>(kCalibrationIters) * scale,
                 static_cast<double>(kCalibrationIters), static_cast<double>(kMaxIters)));
  double best_s = 0;
  for (int rep = 0; rep <= kReps; ++rep) {
    const double sec = run(iters);
    if (rep > 0 && (best_s == 0 || sec < best_s)) best_s = sec;
  }
  float all = 0;
  for (float s : sinks) all += s;
  if (all < 0) std::fputc('\0', stderr);
  double flops = 0;
  for (size_t n : lanes) flops += 2.0 * static_cast<double>(kFmaChains * iters * n);
  return best_s > 0 ? flops / best_s * 1e-9 : 0.0;
}

}  // namespace mha
#endif  // HWY_ONCE
