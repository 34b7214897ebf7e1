#include "runtime/large_buffer.h"

#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace mha {

void LargeBufferFree::operator()(uint8_t* p) const { std::free(p); }

LargeBuffer AllocateLargeBuffer(size_t bytes) {
  const bool huge = bytes >= kHugePageMinBytes;
  const size_t align = huge ? kHugePageBytes : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  if (rounded < bytes) return nullptr;  // overflow
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Before the memset below first touches the pages, so that they fault in as huge pages. A
  // refusal (EINVAL where THP is compiled out) leaves ordinary pages: nothing to report.
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, rounded);
  return LargeBuffer(static_cast<uint8_t*>(p));
}

}  // namespace mha
