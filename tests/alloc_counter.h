// Heap-allocation counting for "no allocation in steady state" tests. Include it in exactly
// one translation unit of a test binary: it interposes malloc, calloc, realloc, aligned_alloc,
// posix_memalign and operator new for the whole process (every thread, libraries included),
// forwarding to glibc's own entry points, and counts calls (g_allocations) and the bytes they ask
// for (g_allocated_bytes) while g_counting is set.
// Sanitizer builds own the allocator: there MHA_SANITIZED is defined and nothing is interposed
// (tests using the counter must skip).
#ifndef MHA_TESTS_ALLOC_COUNTER_H_
#define MHA_TESTS_ALLOC_COUNTER_H_

#include <atomic>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MHA_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MHA_SANITIZED 1
#endif
#endif

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
std::atomic<size_t> g_allocated_bytes{0};
[[maybe_unused]] void Count(size_t bytes) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1);
    g_allocated_bytes.fetch_add(bytes);
  }
}
}  // namespace

#ifndef MHA_SANITIZED
// glibc's own entry points, so the interposed functions can forward to them.
extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);
extern "C" void* __libc_memalign(size_t, size_t);
extern "C" void __libc_free(void*);

extern "C" void* malloc(size_t n) {
  Count(n);
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t a, size_t b) {
  Count(a * b);
  return __libc_calloc(a, b);
}
extern "C" void* realloc(void* p, size_t n) {
  Count(n);
  return __libc_realloc(p, n);
}
extern "C" void* aligned_alloc(size_t align, size_t n) {
  Count(n);
  return __libc_memalign(align, n);
}
extern "C" int posix_memalign(void** out, size_t align, size_t n) {
  Count(n);
  *out = __libc_memalign(align, n);
  return *out ? 0 : 12;  // ENOMEM
}
extern "C" void free(void* p) { __libc_free(p); }

void* operator new(size_t n) {
  Count(n);
  void* p = __libc_malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
#endif

#endif  // MHA_TESTS_ALLOC_COUNTER_H_
