// Context (threads or the host's executor, + arena) and library-wide information.
#include <memory>
#include <string>
#include <thread>

#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/targets.h"
#include "mha/mha.hpp"
#include "runtime/arena.h"
#include "runtime/context_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/version.h"

namespace mha {
namespace {

// The kernel ContextOptions::bf16_kernel names (-1 for kAuto), or an error naming the choices
// this CPU runs.
Status ResolveBf16Kernel(Bf16KernelChoice choice, int* kernel) {
  using kernels::Bf16Kernel;
  const int value = static_cast<int>(choice);
  if (choice == Bf16KernelChoice::kAuto) {
    *kernel = -1;
    return Status::Ok();
  }
  static constexpr Bf16Kernel kByChoice[] = {Bf16Kernel::kEmulated, Bf16Kernel::kAvx512Bf16,
                                             Bf16Kernel::kAmx, Bf16Kernel::kNeonBf16};
  std::string available = "kAuto (0)";
  for (int i = 0; i < 4; ++i) {
    if (kernels::Bf16KernelAvailable(kByChoice[i])) {
      available += std::string(", ") + kernels::Bf16KernelName(kByChoice[i]) + " (" +
                   std::to_string(i + 1) + ")";
    }
  }
  if (value < 1 || value > 4) {
    return InvalidArgument("bf16_kernel: expected one of " + available + ", got " +
                           std::to_string(value));
  }
  const Bf16Kernel named = kByChoice[value - 1];
  if (!kernels::Bf16KernelAvailable(named)) {
    return InvalidArgument("bf16_kernel: expected a kernel this CPU runs, one of " + available +
                           ", got " + kernels::Bf16KernelName(named) + " (" +
                           std::to_string(value) + ")");
  }
  *kernel = static_cast<int>(named);
  return Status::Ok();
}

}  // namespace

Status Context::Create(const ContextOptions& options, std::unique_ptr<Context>* out) {
  if (out == nullptr) return InvalidArgument("Context::Create: out is null");
  // An absurd thread count is almost certainly a bug (e.g. a negative value cast to size_t).
  constexpr size_t kMaxThreads = 1024;
  if (options.num_threads > kMaxThreads) {
    return InvalidArgument("num_threads: expected 0..1024, got " +
                           std::to_string(options.num_threads));
  }
  size_t threads = options.num_threads;
  if (options.executor != nullptr) {
    const size_t workers = options.executor->num_workers();
    if (workers == 0 || workers > kMaxThreads) {
      return InvalidArgument("executor->num_workers(): expected 1..1024, got " +
                             std::to_string(workers));
    }
    if (threads != 0 && threads != workers) {
      return InvalidArgument(
          "num_threads: expected 0 or the executor's num_workers() " + std::to_string(workers) +
          " (a context with an executor runs on the executor's workers), got " +
          std::to_string(threads));
    }
    threads = workers;
  }
  const int grouped = static_cast<int>(options.grouped_forward);
  if (grouped != static_cast<int>(GroupedForward::kAuto) &&
      grouped != static_cast<int>(GroupedForward::kOff)) {
    return InvalidArgument("grouped_forward: expected kAuto (0) or kOff (1), got " +
                           std::to_string(grouped));
  }
  int bf16_kernel = -1;
  if (Status s = ResolveBf16Kernel(options.bf16_kernel, &bf16_kernel); !s.ok()) return s;
  // The environment's developer overrides, read once, at the first context or layer.
  kernels::TargetsFromEnvironment();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  auto impl = std::make_unique<Context::Impl>();
  impl->grouped_forward = options.grouped_forward;
  impl->group_rows = options.group_rows;
  impl->group_max_bytes = options.group_max_bytes;
  impl->bf16_kernel = bf16_kernel;
  if (options.arena_buffer != nullptr) {
    Status s = impl->arena.InitBorrowed(options.arena_buffer, options.arena_bytes);
    if (!s.ok()) return s;
    impl->borrowed = true;
  } else if (options.arena_bytes > 0) {
    Status s = impl->arena.Init(options.arena_bytes);
    if (!s.ok()) return s;
  }
  kernels::GemmInit();
  // num_workers() was read once, above.
  impl->pool = options.executor != nullptr
                   ? std::make_unique<ThreadPool>(*options.executor, threads)
                   : std::make_unique<ThreadPool>(threads);
  out->reset(new Context(std::move(impl)));
  return Status::Ok();
}

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

size_t Context::num_threads() const { return impl_->pool->NumThreads(); }
size_t Context::arena_capacity() const { return impl_->arena.capacity(); }
size_t Context::arena_high_water() const { return impl_->arena.high_water(); }
const char* Context::bf16_kernel() const { return kernels::Bf16KernelName(Bf16KernelOf(*this)); }

BatchGrouping GroupingOf(const Context& context) {
  const auto& c = InternalAccess::Of(context);
  if (c.grouped_forward == GroupedForward::kOff) return {};
  BatchGrouping g = CurrentBatchGrouping();
  if (c.group_rows != 0) g.rows = c.group_rows;
  if (c.group_max_bytes != 0) g.max_bytes = c.group_max_bytes;
  return g;
}

kernels::Bf16Kernel Bf16KernelOf(const Context& context) {
  const int k = InternalAccess::Of(context).bf16_kernel;
  return k < 0 ? kernels::Bf16ActiveKernel() : static_cast<kernels::Bf16Kernel>(k);
}

Status TakeDispatchError(Context& context) { return PoolOf(context).TakeError(); }

Status ReserveArena(Context& context, size_t bytes) {
  auto& c = InternalAccess::Of(context);
  if (c.arena.capacity() >= bytes) return Status::Ok();
  if (c.borrowed) {
    return OutOfMemory("context arena: this call needs " + std::to_string(bytes) +
                       " bytes of workspace, which a caller-provided buffer of " +
                       std::to_string(ArenaBytesFor(bytes)) +
                       " bytes holds at any address (the figure its plan returns); this buffer"
                       " holds " +
                       std::to_string(c.arena.capacity()) + " usable bytes");
  }
  return c.arena.Init(bytes);
}

Status TakeWorkspace(Context& context, size_t bytes, const char* what, uint8_t** base) {
  Status s = ReserveArena(context, bytes);
  if (!s.ok()) return s;
  Arena& arena = ArenaOf(context);
  arena.Reset();
  void* p = nullptr;
  s = arena.Allocate(bytes, &p, what);
  if (s.ok()) *base = static_cast<uint8_t*>(p);
  return s;
}

const char* Version() { return MHA_VERSION; }

const char* SimdTarget() { return kernels::TargetName(kernels::ActiveTarget()); }
const char* Bf16Kernel() { return kernels::Bf16KernelName(kernels::Bf16ActiveKernel()); }

const char* BlasArch() { return kernels::GemmArchName(); }

}  // namespace mha
