// Helpers shared by the C API tests (tests/c_api_test.cc, tests/c_api_kv_test.cc).
#ifndef MHA_TESTS_C_API_TEST_UTIL_H_
#define MHA_TESTS_C_API_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "mha/mha.h"

namespace mha {
namespace testing_util {

// Fills outputs that an erroring call must leave untouched.
constexpr float kSentinel = -12345.0f;

// A dense mha_tensor over `data`.
inline mha_tensor Dense(void* data, int32_t dtype, std::vector<int64_t> shape) {
  mha_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

// A context with `threads` threads over an owned arena, or over the caller's `arena` of
// `arena_bytes`; null (and a test failure) when creation fails.
inline mha_context* NewContext(size_t threads, void* arena = nullptr, size_t arena_bytes = 0) {
  mha_context_options o;
  std::memset(&o, 0, sizeof(o));
  o.num_threads = threads;
  o.arena_buffer = arena;
  o.arena_bytes = arena_bytes;
  mha_context* ctx = nullptr;
  EXPECT_EQ(mha_context_create(&o, &ctx), MHA_STATUS_OK) << mha_last_error_message();
  return ctx;
}

}  // namespace testing_util
}  // namespace mha

// Expects `call` to return INVALID_ARGUMENT with a message containing `needle`.
#define EXPECT_INVALID(call, needle) EXPECT_STATUS(call, MHA_STATUS_INVALID_ARGUMENT, needle)

// Expects `call` to return `status` with a message containing `needle`.
#define EXPECT_STATUS(call, status, needle)                                                \
  do {                                                                                     \
    const mha_status st_ = (call);                                                         \
    EXPECT_EQ(st_, (status)) << #call << ": " << mha_last_error_message();                 \
    const std::string msg_ = mha_last_error_message();                                     \
    const std::string needle_ = (needle);                                                  \
    EXPECT_NE(msg_.find(needle_), std::string::npos)                                       \
        << #call << ": message \"" << msg_ << "\" does not mention \"" << needle_ << "\""; \
  } while (0)

#endif  // MHA_TESTS_C_API_TEST_UTIL_H_
