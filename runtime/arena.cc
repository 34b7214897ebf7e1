#include "runtime/arena.h"

#include <cstdlib>
#include <string>

namespace mha {

bool RoundUpToAlignment(size_t bytes, size_t* out) {
  if (bytes > SIZE_MAX - (kArenaAlignment - 1)) return false;
  *out = (bytes + kArenaAlignment - 1) & ~(kArenaAlignment - 1);
  return true;
}

size_t ArenaBytesFor(size_t workspace) {
  size_t rounded = 0;
  if (!RoundUpToAlignment(workspace == 0 ? 1 : workspace, &rounded) ||
      rounded > SIZE_MAX - (kArenaAlignment - 1)) {
    return SIZE_MAX;
  }
  return rounded + (kArenaAlignment - 1);
}

Arena::~Arena() { Release(); }

void Arena::Release() {
  std::free(owned_);
  owned_ = nullptr;
  base_ = nullptr;
  capacity_ = used_ = high_water_ = 0;
}

Status Arena::Init(size_t bytes) {
  Release();
  size_t rounded = 0;
  if (!RoundUpToAlignment(bytes == 0 ? kArenaAlignment : bytes, &rounded)) {
    return OutOfMemory("arena: requested size " + std::to_string(bytes) + " bytes overflows");
  }
  void* p = std::aligned_alloc(kArenaAlignment, rounded);
  if (p == nullptr) {
    return OutOfMemory("arena: could not allocate " + std::to_string(rounded) + " bytes");
  }
  owned_ = p;
  base_ = static_cast<uint8_t*>(p);
  capacity_ = rounded;
  return Status::Ok();
}

Status Arena::InitBorrowed(void* buffer, size_t bytes) {
  Release();
  if (buffer == nullptr) return InvalidArgument("arena buffer: expected non-null pointer");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(buffer);
  const size_t skip = (kArenaAlignment - addr % kArenaAlignment) % kArenaAlignment;
  if (bytes < skip + kArenaAlignment) {
    return InvalidArgument("arena buffer: expected at least " +
                           std::to_string(skip + kArenaAlignment) + " bytes, got " +
                           std::to_string(bytes));
  }
  base_ = static_cast<uint8_t*>(buffer) + skip;
  capacity_ = (bytes - skip) & ~(kArenaAlignment - 1);
  return Status::Ok();
}

Status Arena::Allocate(size_t bytes, void** out, const char* what) {
  *out = nullptr;
  size_t rounded = 0;
  // Zero-byte requests still take one alignment unit so every pointer is distinct.
  if (!RoundUpToAlignment(bytes == 0 ? 1 : bytes, &rounded)) {
    return OutOfMemory(std::string(what) + ": " + std::to_string(bytes) +
                       " bytes overflows the arena's size arithmetic");
  }
  if (base_ == nullptr || rounded > capacity_ - used_) {
    return OutOfMemory(std::string(what) + ": needs " + std::to_string(rounded) +
                       " bytes, arena has " + std::to_string(capacity_ - used_) + " of " +
                       std::to_string(capacity_) + " bytes free");
  }
  *out = base_ + used_;
  used_ += rounded;
  if (used_ > high_water_) high_water_ = used_;
  return Status::Ok();
}

}  // namespace mha
