// The runtime's access to what the public objects hide: a Context's pool, arena and trace hook,
// and a MultiheadAttention's resolved Impl. Internal: not installed; tools (mha-bench) reach the
// internals only through this header.
#ifndef MHA_RUNTIME_CONTEXT_INTERNAL_H_
#define MHA_RUNTIME_CONTEXT_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/gemm_bf16.h"
#include "mha/mha.hpp"
#include "runtime/arena.h"
#include "runtime/forward_plan.h"
#include "runtime/plan_cache.h"
#include "runtime/thread_pool.h"

namespace mha {

struct TraceRecorder;

struct Context::Impl {
  std::unique_ptr<ThreadPool> pool;  // the context's own threads, or the host's executor
  Arena arena;                       // every temporary of a forward pass
  bool borrowed = false;             // arena over a caller-provided buffer: never grows
  TraceRecorder* trace = nullptr;    // mha-bench's --breakdown / --trace; null = off
  ForwardPlanCache forward_plans;    // plans of the forwards run here, reused (plan_cache.h)
  // ContextOptions' grouped forward and bf16 kernel, validated: 0 sizes and a negative kernel
  // take the process's defaults (CurrentBatchGrouping, Bf16ActiveKernel) at each plan or call.
  GroupedForward grouped_forward = GroupedForward::kAuto;
  size_t group_rows = 0, group_max_bytes = 0;
  int bf16_kernel = -1;  // a kernels::Bf16Kernel, or -1
};

// The one friend of Context and MultiheadAttention; the free functions below are its interface.
struct InternalAccess {
  using LayerImpl = MultiheadAttention::Impl;
  static Context::Impl& Of(Context& context) { return *context.impl_; }
  static const Context::Impl& Of(const Context& context) { return *context.impl_; }
  static const LayerImpl& Of(const MultiheadAttention& layer) { return *layer.impl_; }
  static LayerImpl& Of(MultiheadAttention& layer) { return *layer.impl_; }
};

inline ThreadPool& PoolOf(Context& context) { return *InternalAccess::Of(context).pool; }
inline Arena& ArenaOf(Context& context) { return InternalAccess::Of(context).arena; }
inline TraceRecorder* TraceOf(Context& context) { return InternalAccess::Of(context).trace; }
inline ForwardPlanCache& ForwardPlansOf(Context& context) {
  return InternalAccess::Of(context).forward_plans;
}
// The batch grouping of this context's forwards (ContextOptions over the process's defaults).
BatchGrouping GroupingOf(const Context& context);
// The kernel of this context's Compute::kBF16 products.
kernels::Bf16Kernel Bf16KernelOf(const Context& context);
// Installs (or, with null, removes) a recorder; see runtime/trace.h.
inline void SetTrace(Context& context, TraceRecorder* trace) {
  InternalAccess::Of(context).trace = trace;
}
// The layer's resolved configuration and bound weights.
inline const InternalAccess::LayerImpl& ImplOf(const MultiheadAttention& layer) {
  return InternalAccess::Of(layer);
}

// Ensures the arena can serve `bytes`: grows an owned arena (one allocation), or returns
// OutOfMemory naming the bytes needed for a caller-provided buffer too small.
Status ReserveArena(Context& context, size_t bytes);
// The workspace of one call: reserves `bytes` (ReserveArena), frees whatever the previous call
// left in the arena and returns the start of `bytes` 64-byte-aligned bytes in *base. `what`
// names the workspace in the error message. On error *base is unchanged.
Status TakeWorkspace(Context& context, size_t bytes, const char* what, uint8_t** base);
// The executor's breach of its contract (see Executor) since the last call, which clears it;
// Ok for a context with its own pool. An entry point that dispatched tasks returns it.
Status TakeDispatchError(Context& context);

}  // namespace mha

#endif  // MHA_RUNTIME_CONTEXT_INTERNAL_H_
