// Large, long-lived zeroed buffers (a KV cache's storage, a layer's weights) backed by transparent
// huge pages where the kernel offers them: a decode step streams the whole cache and every
// weight, and with 4 KiB pages every 4 KiB of them costs a TLB miss, which a virtual machine's
// nested page walk makes dear.
#ifndef MHA_RUNTIME_LARGE_BUFFER_H_
#define MHA_RUNTIME_LARGE_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace mha {

// A buffer of at least one huge page is mapped on its own (mmap), starts on a huge-page boundary
// and asks for huge pages on its whole 2 MiB blocks (Linux madvise(MADV_HUGEPAGE), before its
// pages are first touched); its last, partial block keeps ordinary pages, so no buffer holds more
// memory than asked (to the page). A model's per-layer caches and weights are mostly 2-32 MiB,
// each streamed from memory once per token across its layers. Smaller buffers come from malloc,
// with ordinary pages.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Frees a LargeBuffer: munmap of `mapped` bytes, or free() where mapped is 0.
struct LargeBufferFree {
  size_t mapped = 0;
  void operator()(uint8_t* p) const;
};
using LargeBuffer = std::unique_ptr<uint8_t[], LargeBufferFree>;

// `bytes` zeroed bytes, 64-byte aligned (2 MiB from kHugePageBytes), every page touched (no
// page faults in the steps that read it); null when the allocation fails. Huge pages are a
// request: where the kernel refuses them (THP "never", not Linux) the buffer has ordinary pages
// and the same contents.
LargeBuffer AllocateLargeBuffer(size_t bytes);

// Bytes the LargeBuffers of kHugePageBytes or more map outside malloc (whose statistics count
// the smaller ones): `live` now (what layers and caches hold outside the heap), `total` ever
// (what creating them mapped on the way).
struct LargeBufferCounts {
  size_t live = 0;
  size_t total = 0;
};
LargeBufferCounts LargeBufferMapped();

// n zeroed elements of a trivial T in a LargeBuffer: a layer's weights in each form it keeps,
// which a batch-1 decode step streams whole every token, as it streams the cache.
template <typename T>
class LargeArray {
 public:
  // Replaces the contents with n zeroed elements (none for 0); throws std::bad_alloc when the
  // memory is not there, as std::vector does.
  void Assign(size_t n) {
    Clear();
    if (n == 0) return;
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    buffer_ = AllocateLargeBuffer(n * sizeof(T));
    if (!buffer_) throw std::bad_alloc();
    size_ = n;
  }
  void Clear() {
    buffer_.reset();
    size_ = 0;
  }
  // 64-byte aligned (2 MiB from kHugePageBytes); null when empty.
  T* data() { return reinterpret_cast<T*>(buffer_.get()); }
  const T* data() const { return reinterpret_cast<const T*>(buffer_.get()); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  LargeBuffer buffer_;
  size_t size_ = 0;
};

}  // namespace mha

#endif  // MHA_RUNTIME_LARGE_BUFFER_H_
