// MHA_CHECK: an invariant check that stays on in release builds, for the places where a broken
// invariant would otherwise give a wrong result silently (Highway's HWY_ASSERT does the same).
// On failure it prints "mha: internal error: <message> (<file>:<line>)" on stderr and aborts.
//
// Why abort and not a Status: the checks sit inside kernels and pool tasks, which have no status
// channel (kernels return void and never see the pool), and a failing one has already written
// part of its output; nor can a caller's input reach them: each guards a choice mha made from
// this CPU and its shapes (e.g. the direct micro-kernel runs where a route chose it), so a
// failure is a bug in mha or a misuse of a testing hook (kernels::ForceTarget while a forward
// runs). Cost: one predictable branch per kernel call. Caller errors are never checked this way:
// they are InvalidArgument statuses from validation.
#ifndef MHA_KERNELS_CHECK_H_
#define MHA_KERNELS_CHECK_H_

#include <cstdio>
#include <cstdlib>

namespace mha {
namespace kernels {

[[noreturn]] __attribute__((noinline, cold)) inline void CheckFailed(const char* message,
                                                                     const char* file, int line) {
  std::fprintf(stderr, "mha: internal error: %s (%s:%d)\n", message, file, line);
  std::abort();
}

}  // namespace kernels
}  // namespace mha

#define MHA_CHECK(condition, message)                                           \
  do {                                                                          \
    if (!(condition)) ::mha::kernels::CheckFailed(message, __FILE__, __LINE__); \
  } while (0)

#endif  // MHA_KERNELS_CHECK_H_
