// Plans made once and reused (XNNPACK's reshape once, setup per call): a forward's plan and a
// KV-cache call's plan are functions of shapes, flags, the layer and the thread count, so a call
// whose key equals an earlier call's takes that plan and only binds its pointers. Keys: the
// layer's id (LayerWeights::id, never reused: everything a plan reads from the layer), the
// validated shapes and flags, the aliasing (forward), the thread count, and PlanSettingsEpoch()
// (the process-wide settings a plan reads). Caches live where one thread at a time uses them
// (the context; a KV cache), so they take no lock. Internal: not installed.
#ifndef MHA_RUNTIME_PLAN_CACHE_H_
#define MHA_RUNTIME_PLAN_CACHE_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "runtime/forward_plan.h"
#include "runtime/layer_weights.h"
#include "runtime/step_plan.h"
#include "runtime/validate.h"

namespace mha {

// Up to kEntries plans by key, the oldest replaced first: a context serving the layers of a
// model in turn keeps one plan per layer up to kEntries layers.
template <typename Key, typename Plan, size_t kEntries>
class PlanCache {
 public:
  // The plan remembered for `key`, else make() remembered.
  template <typename Make>
  const Plan& Get(const Key& key, const Make& make) {
    for (Entry& e : entries_) {
      if (e.valid && e.key == key) return e.plan;
    }
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    e.key = key;
    e.plan = make();
    e.valid = true;
    return e.plan;
  }

 private:
  struct Entry {
    bool valid = false;
    Key key;
    Plan plan;
  };
  std::array<Entry, kEntries> entries_;
  size_t next_ = 0;
};

struct ForwardPlanKey {
  uint64_t layer = 0, epoch = 0;
  ForwardShapes shapes;
  Aliasing aliasing;
  size_t threads = 0;
  BatchGrouping grouping;  // {} for a prefill (stage by stage)
  bool operator==(const ForwardPlanKey& o) const {
    return layer == o.layer && epoch == o.epoch && threads == o.threads &&
           grouping.rows == o.grouping.rows && grouping.max_bytes == o.grouping.max_bytes &&
           aliasing == o.aliasing && shapes == o.shapes;
  }
};
// A context's forward plans (Context::Impl): 16 layers' worth, ~10 KiB.
using ForwardPlanCache = PlanCache<ForwardPlanKey, ForwardPlan, 16>;

struct StepPlanKey {
  uint64_t layer = 0, epoch = 0;
  StepShapes shapes;
  size_t threads = 0;
  bool operator==(const StepPlanKey& o) const {
    return layer == o.layer && epoch == o.epoch && threads == o.threads && shapes.N == o.shapes.N &&
           shapes.T == o.shapes.T && shapes.capacity == o.shapes.capacity &&
           shapes.ring == o.shapes.ring && shapes.append == o.shapes.append &&
           shapes.forward == o.shapes.forward;
  }
};
// A KV cache's step plans: decoding alternates at most a prompt's, a step's and Append /
// Forward's shapes.
using StepPlanCache = PlanCache<StepPlanKey, StepPlan, 4>;

}  // namespace mha

#endif  // MHA_RUNTIME_PLAN_CACHE_H_
