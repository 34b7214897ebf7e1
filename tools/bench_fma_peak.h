// mha-bench's compute roofline: the multiply-add throughput of the CPU's dispatched SIMD target,
// the limit no f32 product (mha's, BLIS's or a peer's) can pass.
#ifndef MHA_TOOLS_BENCH_FMA_PEAK_H_
#define MHA_TOOLS_BENCH_FMA_PEAK_H_

#include <cstddef>

namespace mha {

// f32 multiply-add throughput, GFLOP/s (a multiply-add counts 2 flops, as GEMM's 2mnk does):
// each of `threads` threads of an mha pool runs kFmaChains independent chains of vector
// multiply-adds held in registers (no loads or stores), on the SIMD target Highway dispatches
// to (so MHA_TARGETS=AVX2 measures the AVX2 peak). Best of 5 runs of ~8 ms (their length
// calibrated by two short runs) after a warm-up. A target without fused multiply-add (SSE2,
// SSE4) counts its multiply and add pair.
double MeasureFmaPeakGflops(size_t threads);

// Independent accumulator chains per thread: enough to hide the multiply-add latency on every
// x86 and Arm core (4 cycles x 2 pipes = 8 vectors in flight on Intel; Zen 4 runs 512-bit
// vectors on two 256-bit pipes), and few enough to stay in AVX2's 16 registers with the two
// constants.
inline constexpr size_t kFmaChains = 12;

}  // namespace mha

#endif  // MHA_TOOLS_BENCH_FMA_PEAK_H_
