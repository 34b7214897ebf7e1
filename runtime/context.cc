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
  // The environment's developer overrides, read once, at the first context or layer.
  kernels::TargetsFromEnvironment();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  auto impl = std::make_unique<Context::Impl>();
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
