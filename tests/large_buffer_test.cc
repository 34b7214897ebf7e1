#include "runtime/large_buffer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <new>
#include <sstream>
#include <string>

namespace mha {
namespace {

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST(LargeBufferTest, SmallBuffersAreZeroedAnd64ByteAligned) {
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{4096} + 3}) {
    LargeBuffer b = AllocateLargeBuffer(bytes);
    ASSERT_NE(b, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u) << bytes;
    EXPECT_TRUE(AllZero(b.get(), bytes)) << bytes;
  }
}

TEST(LargeBufferTest, LargeBuffersAreZeroedAndHugePageAligned) {
  const size_t bytes = 3 * kHugePageBytes + 3;  // a partial last block
  LargeBuffer b = AllocateLargeBuffer(bytes);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % kHugePageBytes, 0u);
  EXPECT_TRUE(AllZero(b.get(), bytes));
  b[bytes - 1] = 1;  // the whole size is writable
}

// A buffer of kHugePageBytes or more is mapped to the page, no more, and unmapped when freed.
TEST(LargeBufferTest, LargeBuffersMapTheirPagesOnly) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = 3 * kHugePageBytes + page + 1;
  const LargeBufferCounts before = LargeBufferMapped();
  {
    LargeBuffer b = AllocateLargeBuffer(bytes);
    ASSERT_NE(b, nullptr);
    const LargeBufferCounts now = LargeBufferMapped();
    EXPECT_EQ(now.live - before.live, 3 * kHugePageBytes + 2 * page);
    EXPECT_EQ(now.total - before.total, 3 * kHugePageBytes + 2 * page);
    LargeBuffer small = AllocateLargeBuffer(kHugePageBytes - 1);  // from malloc
    ASSERT_NE(small, nullptr);
    EXPECT_EQ(LargeBufferMapped().live, now.live);
  }
  EXPECT_EQ(LargeBufferMapped().live, before.live);
}

// A size no allocator can give fails (null), as any other refused allocation.
TEST(LargeBufferTest, ImpossibleSizesFail) { EXPECT_EQ(AllocateLargeBuffer(SIZE_MAX), nullptr); }

// The THPeligible line of the /proc/self/smaps mapping that holds `p`, or -1.
int ThpEligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

TEST(LargeBufferTest, LargeBuffersAskForHugePages) {
#if !defined(__linux__) || !defined(__x86_64__)
  GTEST_SKIP() << "checked on x86-64 Linux only: qemu-user, which runs the other Linux tests, "
                  "ignores madvise";
#else
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(mode_file)), std::istreambuf_iterator<char>());
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off here: '" << mode << "'";
  }
  // Two whole blocks and a partial one: huge pages for the blocks; where the mode is "madvise"
  // (only what asks gets them), ordinary pages for the partial block, as nothing is rounded up.
  const size_t bytes = 2 * kHugePageBytes + 12345;
  LargeBuffer large = AllocateLargeBuffer(bytes);
  ASSERT_NE(large, nullptr);
  const int first = ThpEligible(large.get());
  const int second = ThpEligible(large.get() + 2 * kHugePageBytes - 1);
  const int tail = ThpEligible(large.get() + bytes - 1);
  if (first < 0 || second < 0 || tail < 0) {
    GTEST_SKIP() << "no THPeligible line in /proc/self/smaps for the buffer";
  }
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
  if (mode.find("[madvise]") != std::string::npos) {
    EXPECT_EQ(tail, 0);
  }
#endif
}

TEST(LargeArrayTest, AssignGivesZeroedElementsAndClearFrees) {
  LargeArray<float> a;
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);
  a.Assign(1001);
  ASSERT_EQ(a.size(), 1001u);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_TRUE(AllZero(reinterpret_cast<const uint8_t*>(a.data()), 1001 * sizeof(float)));
  a.data()[1000] = 1.0f;
  a.Assign(3);  // replaces the contents: zeroed again
  ASSERT_EQ(a.size(), 3u);
  EXPECT_TRUE(AllZero(reinterpret_cast<const uint8_t*>(a.data()), 3 * sizeof(float)));
  a.Assign(0);
  EXPECT_TRUE(a.empty());
  a.Assign(5);
  a.Clear();
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);
}

TEST(LargeArrayTest, LargeArraysAreHugePageAligned) {
  LargeArray<uint16_t> a;
  a.Assign(kHugePageBytes / sizeof(uint16_t));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kHugePageBytes, 0u);
}

TEST(LargeArrayTest, OverflowingSizesThrow) {
  LargeArray<float> a;
  EXPECT_THROW(a.Assign(SIZE_MAX / 2), std::bad_alloc);
  EXPECT_TRUE(a.empty());
}

}  // namespace
}  // namespace mha
