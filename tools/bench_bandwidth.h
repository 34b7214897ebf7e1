// mha-bench's host probes for --decode: the machine's memory bandwidth, the limit a decode step
// (which streams the KV cache) is measured against.
#ifndef MHA_TOOLS_BENCH_BANDWIDTH_H_
#define MHA_TOOLS_BENCH_BANDWIDTH_H_

#include <cstddef>
#include <memory>

#include "runtime/large_buffer.h"

namespace mha {

// Bytes of the last-level cache (sysconf), 0 if unknown.
size_t LastLevelCacheBytes();

// Bytes of the streaming read: 512 MiB or four times the last-level cache, whichever is larger,
// so that the reads come from memory.
size_t ReadBufferBytes();

// Streaming read bandwidth (bytes read per second, in GB/s = 1e9 B/s): ReadBufferBytes() split
// evenly over the threads of an mha pool, each summing its slice with the widest vector loads
// the CPU has (Highway, dispatched at run time), in two access patterns: one sequential stream,
// and four streams side by side with software prefetch (as the decode kernels read a cache;
// on an Intel Xeon VM with AVX-512 the single stream read ~28 GB/s where the decode kernels read
// ~33). The faster pattern's best time is what a decode step, which only reads the cache, can
// reach. The buffer is allocated and its pages faulted in once, so the probe can be repeated
// right before each measurement it is compared with (a shared machine's bandwidth moves by tens
// of percent within minutes). It lies on transparent huge pages where the kernel grants them,
// as a KV cache's storage does (runtime/large_buffer.h): on an AMD EPYC Zen 4 VM, 2 threads
// streamed 512 MiB at 33.5 GB/s on huge pages against 31.3 on 4 KiB pages (means of 20).
class ReadProbe {
 public:
  ReadProbe();
  // Best of `reps` reads of the whole buffer per pattern on `threads` threads, alternating the
  // patterns, after one warm-up read of each.
  double Measure(size_t threads, int reps) const;

 private:
  size_t floats_ = 0;
  LargeBuffer buf_;  // floats_ floats, on huge pages as a KV cache's storage
};

// ReadProbe().Measure(threads, 8).
double MeasureReadGbs(size_t threads);

// memcpy bandwidth (bytes read + written per second, GB/s, STREAM's convention) of a 256 MiB
// buffer into another, split evenly over `threads` threads, best of 5 after a warm-up.
double MeasureCopyGbs(size_t threads);

}  // namespace mha

#endif  // MHA_TOOLS_BENCH_BANDWIDTH_H_
