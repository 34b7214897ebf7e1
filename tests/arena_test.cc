#include "runtime/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace mha {
namespace {

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kArenaAlignment == 0; }

TEST(ArenaTest, AllocationsAreAlignedAndDisjoint) {
  Arena arena;
  ASSERT_TRUE(arena.Init(4096).ok());
  EXPECT_TRUE(arena.owns_memory());
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  ASSERT_TRUE(arena.Allocate(1, &a).ok());
  ASSERT_TRUE(arena.Allocate(100, &b).ok());
  ASSERT_TRUE(arena.Allocate(0, &c).ok());
  EXPECT_TRUE(Aligned(a));
  EXPECT_TRUE(Aligned(b));
  EXPECT_TRUE(Aligned(c));
  EXPECT_EQ(static_cast<uint8_t*>(b) - static_cast<uint8_t*>(a), 64);
  EXPECT_EQ(static_cast<uint8_t*>(c) - static_cast<uint8_t*>(b), 128);
  EXPECT_EQ(arena.used(), 64u + 128u + 64u);
}

TEST(ArenaTest, ExhaustionIsAnErrorNamingTheBytes) {
  Arena arena;
  ASSERT_TRUE(arena.Init(256).ok());
  void* p = nullptr;
  ASSERT_TRUE(arena.Allocate(200, &p).ok());
  Status s = arena.Allocate(100, &p, "scores block");
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(s.message().find("scores block"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("needs 128 bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("has 0 of 256"), std::string::npos) << s.message();
  // A failed request leaves the arena unchanged.
  EXPECT_EQ(arena.used(), 256u);
}

TEST(ArenaTest, HugeRequestsDoNotOverflow) {
  Arena arena;
  ASSERT_TRUE(arena.Init(1024).ok());
  void* p = nullptr;
  EXPECT_EQ(arena.Allocate(SIZE_MAX, &p).code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(arena.Allocate(SIZE_MAX - 10, &p).code(), StatusCode::kOutOfMemory);
  float* f = nullptr;
  EXPECT_EQ(arena.AllocateArray<float>(SIZE_MAX / 2, &f).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(arena.used(), 0u);
}

TEST(ArenaTest, ResetKeepsHighWaterMark) {
  Arena arena;
  ASSERT_TRUE(arena.Init(1 << 16).ok());
  void* p = nullptr;
  ASSERT_TRUE(arena.Allocate(1000, &p).ok());
  ASSERT_TRUE(arena.Allocate(3000, &p).ok());
  EXPECT_EQ(arena.high_water(), 1024u + 3008u);
  arena.Reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.high_water(), 1024u + 3008u);
  void* q = nullptr;
  ASSERT_TRUE(arena.Allocate(64, &q).ok());
  EXPECT_EQ(arena.high_water(), 1024u + 3008u);
}

TEST(ArenaTest, MarkAndRewind) {
  Arena arena;
  ASSERT_TRUE(arena.Init(4096).ok());
  void* a = nullptr;
  ASSERT_TRUE(arena.Allocate(64, &a).ok());
  const size_t mark = arena.Mark();
  void* b = nullptr;
  ASSERT_TRUE(arena.Allocate(512, &b).ok());
  arena.Rewind(mark);
  void* c = nullptr;
  ASSERT_TRUE(arena.Allocate(64, &c).ok());
  EXPECT_EQ(b, c);
}

TEST(ArenaTest, BorrowedMisalignedBuffer) {
  std::vector<uint8_t> buffer(1000);
  Arena arena;
  // Start 3 bytes past an aligned address: the arena skips to the next 64-byte boundary.
  uint8_t* start = buffer.data() + 3;
  ASSERT_TRUE(arena.InitBorrowed(start, 900).ok());
  EXPECT_FALSE(arena.owns_memory());
  EXPECT_LE(arena.capacity(), 900u);
  EXPECT_GE(arena.capacity(), 900u - 63u - 63u);
  EXPECT_EQ(arena.capacity() % 64, 0u);
  void* p = nullptr;
  ASSERT_TRUE(arena.Allocate(10, &p).ok());
  EXPECT_TRUE(Aligned(p));
  EXPECT_GE(static_cast<uint8_t*>(p), start);
  // Everything handed out stays inside the caller's buffer.
  ASSERT_TRUE(arena.Allocate(arena.available(), &p).ok());
  EXPECT_LE(static_cast<uint8_t*>(p) + 64, start + 900);
  EXPECT_EQ(arena.available(), 0u);
}

TEST(ArenaTest, BorrowedBufferTooSmallOrNull) {
  Arena arena;
  uint8_t small[32];
  EXPECT_EQ(arena.InitBorrowed(small, sizeof(small)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(arena.InitBorrowed(nullptr, 4096).code(), StatusCode::kInvalidArgument);
}

TEST(ArenaTest, UninitializedArenaReportsOutOfMemory) {
  Arena arena;
  void* p = nullptr;
  EXPECT_EQ(arena.Allocate(1, &p).code(), StatusCode::kOutOfMemory);
}

}  // namespace
}  // namespace mha
