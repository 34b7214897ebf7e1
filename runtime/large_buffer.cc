#include "runtime/large_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace mha {
namespace {

std::atomic<size_t> g_mapped_live{0};
std::atomic<size_t> g_mapped_total{0};

// Maps `bytes` (a whole number of pages) starting on a huge-page boundary: a reservation of one
// huge page more, its unaligned head and its tail unmapped. Null when refused.
uint8_t* MapHugeAligned(size_t bytes) {
  const size_t reserve = bytes + kHugePageBytes;
  if (reserve < bytes) return nullptr;
  void* r = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(r);
  const uintptr_t start = (base + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (start > base) munmap(r, start - base);
  const uintptr_t end = start + bytes;
  if (base + reserve > end) munmap(reinterpret_cast<void*>(end), base + reserve - end);
  return reinterpret_cast<uint8_t*>(start);
}

}  // namespace

void LargeBufferFree::operator()(uint8_t* p) const {
  if (mapped == 0) {
    std::free(p);
    return;
  }
  munmap(p, mapped);
  g_mapped_live.fetch_sub(mapped, std::memory_order_relaxed);
}

LargeBuffer AllocateLargeBuffer(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes == 0 ? 1 : bytes) != 0) return nullptr;
    std::memset(p, 0, bytes);
    return LargeBuffer(static_cast<uint8_t*>(p));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  if (mapped < bytes) return nullptr;  // overflow
  uint8_t* p = MapHugeAligned(mapped);
  if (p == nullptr) return nullptr;
#if defined(MADV_HUGEPAGE)
  // Before the memset below first touches the pages, so that they fault in as huge pages. A
  // refusal (EINVAL where THP is compiled out) leaves ordinary pages: nothing to report.
  (void)madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
#endif
  // The mapping is zero already; writing it faults every page in now, not in a decode step.
  std::memset(p, 0, bytes);
  g_mapped_live.fetch_add(mapped, std::memory_order_relaxed);
  g_mapped_total.fetch_add(mapped, std::memory_order_relaxed);
  return LargeBuffer(p, LargeBufferFree{mapped});
}

LargeBufferCounts LargeBufferMapped() {
  return {g_mapped_live.load(std::memory_order_relaxed),
          g_mapped_total.load(std::memory_order_relaxed)};
}

}  // namespace mha
