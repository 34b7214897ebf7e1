// Arena: a bump allocator over one block that serves every temporary of a forward pass.
//
// The block is either owned (allocated once by Init) or borrowed from the caller. Every
// allocation is aligned to kArenaAlignment (64 bytes: a cache line on x86 and most Arm cores,
// and the widest x86 vector; SVE vectors may be wider but need no alignment), sizes are
// overflow-checked, and running out is an OutOfMemory Status naming the bytes requested and
// available, never an abort. Not thread-safe: a forward pass allocates from the arena on the
// calling thread before it fans out to the pool.
#ifndef MHA_RUNTIME_ARENA_H_
#define MHA_RUNTIME_ARENA_H_

#include <cstddef>
#include <cstdint>

#include "mha/types.hpp"

namespace mha {

inline constexpr size_t kArenaAlignment = 64;

// Rounds `bytes` up to a multiple of kArenaAlignment; returns false on overflow.
bool RoundUpToAlignment(size_t bytes, size_t* out);

// Bytes a caller-provided buffer needs, at any address, for an arena that serves one allocation
// of `workspace` bytes: the allocation rounded up to kArenaAlignment (at least one unit) plus
// the kArenaAlignment - 1 bytes InitBorrowed may skip to align the buffer's start. What every
// plan returns. Saturates at SIZE_MAX.
size_t ArenaBytesFor(size_t workspace);

class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Allocates an owned block of at least `bytes` (64-byte aligned). Replaces any previous block.
  Status Init(size_t bytes);
  // Uses a caller-provided block; its start is aligned up to 64 bytes, so up to 63 bytes of it
  // are unused. The buffer must outlive the arena.
  Status InitBorrowed(void* buffer, size_t bytes);

  // Returns `bytes` (rounded up to 64) of 64-byte-aligned memory in *out. `what` names the
  // request in the error message. A zero-byte request succeeds with a valid, unique pointer.
  Status Allocate(size_t bytes, void** out, const char* what = "arena allocation");
  template <typename T>
  Status AllocateArray(size_t count, T** out, const char* what = "arena allocation") {
    if (count > SIZE_MAX / sizeof(T)) {
      return InvalidArgument(std::string(what) + ": element count overflows size_t");
    }
    void* p = nullptr;
    Status s = Allocate(count * sizeof(T), &p, what);
    *out = static_cast<T*>(p);
    return s;
  }

  // Frees everything at once; the high-water mark is kept.
  void Reset() { used_ = 0; }
  // Mark/Rewind release everything allocated after Mark().
  size_t Mark() const { return used_; }
  void Rewind(size_t mark) { if (mark <= used_) used_ = mark; }

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t available() const { return capacity_ - used_; }
  size_t high_water() const { return high_water_; }
  bool owns_memory() const { return owned_ != nullptr; }

 private:
  void Release();

  void* owned_ = nullptr;  // non-null when the arena allocated its block
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

}  // namespace mha

#endif  // MHA_RUNTIME_ARENA_H_
