// A KV cache's storage as a step writes and reads it (the layout of include/mha/kv_cache.hpp):
// K then V, each [batch, kv_heads, capacity, head_dim] elements of the storage dtype, with int8's
// per-row f32 scales [batch, kv_heads, capacity] each; position p of an entry in slot p (or
// p mod capacity in a ring). The stores are defined with the cache object (kv_cache.cc), the
// reads in cache_attention.cc. Internal: not installed.
#ifndef MHA_RUNTIME_KV_STORAGE_H_
#define MHA_RUNTIME_KV_STORAGE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "mha/types.hpp"
#include "runtime/projections.h"
#include "runtime/thread_pool.h"

namespace mha {

struct CacheStorage {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  float* k_scales = nullptr;  // int8 only, else null
  float* v_scales = nullptr;
  DType dtype = DType::kF32;
  int64_t kv_heads = 0, head_dim = 0, capacity = 0;
  bool ring = false;
  bool int8_dot = false;  // KvCacheOptions::int8_attention: kernels/decode_int8.h reads the rows

  // The slot (row within its (entry, kv head) block) of position `pos`.
  int64_t Slot(int64_t pos) const { return ring ? pos % capacity : pos; }
  // The row of (entry n, kv head g, slot) in K or V, and in their scales.
  int64_t Row(int64_t n, int64_t g, int64_t slot) const {
    return (n * kv_heads + g) * capacity + slot;
  }
  size_t RowBytes() const { return static_cast<size_t>(head_dim) * DTypeSize(dtype); }
  const uint8_t* KeyRow(int64_t row) const { return k + row * RowBytes(); }
  const uint8_t* ValueRow(int64_t row) const { return v + row * RowBytes(); }
  const float* KeyScale(int64_t row) const {
    return k_scales != nullptr ? k_scales + row : nullptr;
  }
  const float* ValueScale(int64_t row) const {
    return v_scales != nullptr ? v_scales + row : nullptr;
  }
  // Calls fn(row, offset, run) for the runs of consecutive rows that hold positions [a, b) (at
  // most `capacity` of them) of entry n's kv head g: position a + offset + i in row + i, i < run.
  // One run, or two when a ring's range wraps.
  template <typename Fn>
  void ForEachRun(int64_t n, int64_t g, int64_t a, int64_t b, const Fn& fn) const {
    for (int64_t p = a; p < b;) {
      const int64_t slot = Slot(p), run = std::min(b - p, capacity - slot);
      fn(Row(n, g, slot), p - a, run);
      p += run;
    }
  }
};

// Stores the rows [t0, count) of (entry n, kv head g) from f32 k and v (row t at k + t *
// k_stride, likewise v; head_dim values each) at positions pos0 + t, in the storage type (16-bit:
// round to nearest even; int8: kernels::QuantizeRowI8).
void StoreCacheRows(const CacheStorage& cache, int64_t n, int64_t g, int64_t pos0, const float* k,
                    ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, int64_t t0,
                    int64_t count);

// Stores projected keys and values kv (f32 [N, T, kvE] at kv's strides; head g at columns
// [g * hd, (g + 1) * hd)) in tasks over (entry, kv head) on `pool`: count_n of entry n's tokens
// (counts null: kv.end - kv.begin) at positions lengths[n] + kv.begin + t, except positions
// below keep_from (a ring prompt longer than the capacity keeps its last `capacity` positions).
void StoreCacheTokens(ThreadPool& pool, const CacheStorage& cache, int64_t N,
                      const int64_t* lengths, const ProjectedKv& kv, const int64_t* counts,
                      int64_t keep_from);

}  // namespace mha

#endif  // MHA_RUNTIME_KV_STORAGE_H_
