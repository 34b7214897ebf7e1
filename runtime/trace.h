// Per-task timestamps for mha-bench's --breakdown and --trace. Off (null) unless a tool installs
// a recorder on the Context; when on, each task appends one event to a buffer preallocated by the
// tool, so recording allocates nothing. Events beyond capacity are counted, not stored.
#ifndef MHA_RUNTIME_TRACE_H_
#define MHA_RUNTIME_TRACE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace mha {

enum class Stage : uint8_t {
  kQkvProjection = 0,
  kScores = 1,      // Q K^T
  kSoftmax = 2,     // scale, masks, softmax (or the online-softmax update)
  kWeightedSum = 3, // P V
  kOutProjection = 4,
  kAverageWeights = 5,
  kCacheAttention = 6,  // KvCache: scores, softmax and P V over the cached positions, and the
                        // merge of flash-decoding chunks
  kNumStages = 7,
};

inline const char* StageName(Stage s) {
  switch (s) {
    case Stage::kQkvProjection: return "qkv_projection";
    case Stage::kScores: return "scores";
    case Stage::kSoftmax: return "softmax";
    case Stage::kWeightedSum: return "pv";
    case Stage::kOutProjection: return "out_projection";
    case Stage::kAverageWeights: return "average_weights";
    case Stage::kCacheAttention: return "cache_attention";
    case Stage::kNumStages: break;
  }
  return "unknown";
}

struct TraceEvent {
  int64_t begin_ns;  // steady_clock, nanoseconds
  int64_t end_ns;
  uint32_t worker;
  Stage stage;
  int32_t batch;  // -1 when not applicable
  int32_t head;   // -1 when not applicable
  int32_t block;  // query block, or panel index for projections
};

struct TraceRecorder {
  explicit TraceRecorder(size_t capacity) : events(capacity) {}
  std::vector<TraceEvent> events;  // preallocated; first `count` are valid
  std::atomic<size_t> count{0};
  std::atomic<size_t> dropped{0};

  void Clear() { count = 0; dropped = 0; }
  size_t size() const { size_t c = count.load(); return c < events.size() ? c : events.size(); }
  void Record(const TraceEvent& e) {
    const size_t i = count.fetch_add(1, std::memory_order_relaxed);
    if (i < events.size()) {
      events[i] = e;
    } else {
      dropped.fetch_add(1, std::memory_order_relaxed);
    }
  }
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

// One event from construction to destruction, recorded when `trace` is non-null: a task body
// opens with a TraceSpan and every way out of it (including early returns) records the event.
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* trace, size_t worker, Stage stage, int64_t batch, int64_t head,
            int64_t block)
      : trace_(trace),
        begin_(trace != nullptr ? TraceRecorder::NowNs() : 0),
        worker_(static_cast<uint32_t>(worker)),
        stage_(stage),
        batch_(static_cast<int32_t>(batch)),
        head_(static_cast<int32_t>(head)),
        block_(static_cast<int32_t>(block)) {}
  ~TraceSpan() {
    if (trace_ != nullptr) {
      trace_->Record({begin_, TraceRecorder::NowNs(), worker_, stage_, batch_, head_, block_});
    }
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  TraceRecorder* trace_;
  int64_t begin_;
  uint32_t worker_;
  Stage stage_;
  int32_t batch_, head_, block_;
};

}  // namespace mha

#endif  // MHA_RUNTIME_TRACE_H_
