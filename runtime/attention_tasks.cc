// The attention tasks of a forward (attention_tasks.h).
#include "runtime/attention_tasks.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_direct.h"
#include "kernels/softmax.h"
#include "runtime/context_internal.h"
#include "runtime/masks.h"
#include "runtime/task_grid.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

using kernels::MatrixView;

namespace {

using kernels::kNegInf;

// Keys per key block of the online path with a window over index positions (see
// OnlineTask::Run): at most one KC block of the GEMM configuration, so that a strip's P V can
// start at its band (PackedB::Rows), as its scores and softmax do; blocks as deep as that keep
// the softmax's per-row work per call (max, sum, rescale) small against the keys it covers.
int64_t WindowKeyBlock(int64_t key_block) {
  return std::min<int64_t>(key_block, static_cast<int64_t>(kernels::GemmBlocking().kc));
}

// What every task of one RunAttentionTasks call reads: the layer, the bound workspace, the keys
// covered, the masks and the trace; and views of one head's rows of the buffers.
struct TaskContext {
  const LayerWeights& m;
  const ForwardArgs& args;
  const ForwardPlan& plan;
  const ForwardBuffers& buf;
  const KeyChunk& keys;
  AttentionMasks masks;
  TraceRecorder* trace;
  int64_t St;
  int64_t group;  // query heads per key/value head
  bool direct;    // OnlineUsesDirectKernel()
  bool bf16;      // Compute::kBF16: the online path's products run kernels::GemmBf16PackedB
  kernels::Bf16Kernel bf16_kernel;  // on this kernel (the context's)
  // The batch entry whose rows the buffers (q, k, v, concat) hold first: 0, or the group's
  // first entry on the grouped forward (entry n at (n - entry0) x the layouts' batch stride).
  int64_t entry0 = 0;

  // Q rows [q0, q0 + rows) of head h: [rows, hd].
  MatrixView QView(int64_t n, int64_t h, int64_t q0, size_t rows) const {
    n -= entry0;
    return MatrixView{buf.q + n * plan.q_layout.batch + q0 * plan.q_layout.token + h * m.hd, rows,
                      static_cast<size_t>(m.hd), plan.q_layout.token, 1};
  }
  // K_g^T for keys [k0, k0 + cols): [hd, cols]. Key k0 is buffer row k0 - keys.begin.
  MatrixView KtView(int64_t n, int64_t g, int64_t k0, size_t cols) const {
    n -= entry0;
    return MatrixView{
        buf.k + n * plan.kv_layout.batch + (k0 - keys.begin) * plan.kv_layout.token + g * m.hd,
        static_cast<size_t>(m.hd), cols, 1, plan.kv_layout.token};
  }
  // V_g for keys [k0, k0 + rows): [rows, hd].
  MatrixView VView(int64_t n, int64_t g, int64_t k0, size_t rows) const {
    n -= entry0;
    return MatrixView{
        buf.v + n * plan.kv_layout.batch + (k0 - keys.begin) * plan.kv_layout.token + g * m.hd,
        rows, static_cast<size_t>(m.hd), plan.kv_layout.token, 1};
  }
  // Head h's columns of concat for query rows [q0, q0 + rows).
  MatrixView OutView(int64_t n, int64_t h, int64_t q0, size_t rows) const {
    n -= entry0;
    return MatrixView{
        buf.concat + n * buf.concat_layout.batch + q0 * buf.concat_layout.token + h * m.hd, rows,
        static_cast<size_t>(m.hd), buf.concat_layout.token, 1};
  }
  // One past the last key some row of [q0, q0 + rows) sees: causal, key j is used by some row
  // iff j <= q0 + rows - 1; a non-causal window's band ends at q0 + rows - 1 + W.
  int64_t KeyLimit(int64_t q0, size_t rows) const {
    return masks.BandLimit(q0, static_cast<int64_t>(rows), St);
  }
  // The first key query row q sees (a window's band over index positions, else 0).
  int64_t KeyStart(int64_t q) const { return masks.BandStart(q); }
  // Keys [0, MaskEnd()) take the masks, the causal limit and the window: the key-chunked path's
  // unpadded masks end at S, and its appended positions [S, S') are never masked.
  int64_t MaskEnd() const { return plan.chunked() ? args.shapes.S : St; }
  // Whether this pass starts the softmax state of the online task of query rows from q0: it
  // holds the block's first visible key (with a window, its band's start; the last key chunk
  // when the band lies past every key).
  bool StartsState(int64_t q0) const {
    const int64_t kfirst = std::max<int64_t>(std::min(KeyStart(q0), St - 1), 0);
    return keys.begin <= kfirst && kfirst < keys.end;
  }
  // Whether the online task of query rows [q0, q0 + rows) has anything to do in this pass: it
  // starts the state, or keys of its band or appended keys lie in [keys.begin, keys.end). A key
  // chunk before the band or past the causal diagonal leaves the state as it is.
  bool Visits(int64_t q0, size_t rows) const {
    const int64_t kend = std::min({keys.end, MaskEnd(), KeyLimit(q0, rows)});
    const int64_t kbegin = std::max(keys.begin, KeyStart(q0));
    return StartsState(q0) || kend > kbegin || std::max(keys.begin, MaskEnd()) < keys.end;
  }
  uint8_t* GemmScratch(size_t worker) const {
    return buf.scratch + worker * plan.scratch_per_worker;
  }
  uint8_t* WorkerScratch(size_t worker) const { return GemmScratch(worker) + plan.gemm_scratch; }
  int64_t Now() const { return trace ? TraceRecorder::NowNs() : 0; }
  void Record(int64_t begin, size_t worker, Stage stage, int64_t n, int64_t h, int64_t b) const {
    if (trace) {
      trace->Record({begin, TraceRecorder::NowNs(), static_cast<uint32_t>(worker), stage,
                     static_cast<int32_t>(n), static_cast<int32_t>(h), static_cast<int32_t>(b)});
    }
  }
};

// One (n, h, query block) with attention weights: full-row softmax, scores into `scores` (row
// stride ld).
void FullRows(const TaskContext& t, int64_t n, int64_t h, int64_t q0, size_t rows, float* scores,
              ptrdiff_t ld, size_t worker, int64_t blk) {
  const int64_t g = h / t.group;
  void* gs = t.GemmScratch(worker);
  // Keys [ks, kl): those some row of the block sees (causal limit, a window's band). The
  // products and the softmax run over them only; the weights' other columns are exactly zero.
  // The block's rows depend only on the shapes, so the band does too (deterministic).
  const int64_t kl = t.KeyLimit(q0, rows);
  const int64_t ks = std::min(t.KeyStart(q0), kl);
  const size_t kn = static_cast<size_t>(kl - ks);
  const MatrixView out = t.OutView(n, h, q0, rows);
  if (kn > 0) {
    float* band = scores + ks;
    const MatrixView s_view{band, rows, kn, ld, 1};
    int64_t t0 = t.Now();
    // The scale is the product's alpha (the softmax's own multiply by it would round alike).
    kernels::Gemm(t.m.scale, t.QView(n, h, q0, rows), t.KtView(n, g, ks, kn), 0.0f, s_view, gs);
    t.Record(t0, worker, Stage::kScores, n, h, blk);
    t0 = t.Now();
    kernels::SoftmaxRows(band, rows, kn, ld, 1.0f, MasksFor(t.masks, n, h, q0, ks, true));
    t.Record(t0, worker, Stage::kSoftmax, n, h, blk);
    t0 = t.Now();
    kernels::Gemm(1.0f, s_view, t.VView(n, g, ks, kn), 0.0f, out, gs);
    t.Record(t0, worker, Stage::kWeightedSum, n, h, blk);
  } else {
    for (size_t r = 0; r < rows; ++r) {
      std::memset(out.data + r * out.row_stride, 0, t.m.hd * sizeof(float));
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    float* row = scores + r * ld;
    std::memset(row, 0, ks * sizeof(float));
    std::memset(row + kl, 0, (t.St - kl) * sizeof(float));
  }
}

// Averaged weights, one task per (n, query block): every head's full rows in a fixed order, so
// the average is deterministic.
void AveragedWeightsTask(const TaskContext& t, int64_t n, int64_t blk, size_t worker) {
  const ForwardShapes& sh = t.args.shapes;
  const int64_t H = t.m.H, St = t.St;
  const int64_t q0 = blk * t.plan.query_block;
  const size_t rows = std::min<int64_t>(t.plan.query_block, sh.L - q0);
  float* scores = reinterpret_cast<float*>(t.WorkerScratch(worker));
  float* wrow = t.args.weights + n * sh.w_stride[0] + q0 * sh.w_stride[1];
  for (int64_t h = 0; h < H; ++h) {
    FullRows(t, n, h, q0, rows, scores, St, worker, blk);
    const int64_t t0 = t.Now();
    for (size_t r = 0; r < rows; ++r) {
      float* dst = wrow + r * sh.w_stride[1];
      if (h == 0) {
        std::memcpy(dst, scores + r * St, St * sizeof(float));
      } else {
        kernels::AddInto(scores + r * St, dst, St);
      }
      if (h == H - 1) kernels::ScaleBy(1.0f / static_cast<float>(H), dst, St);
    }
    t.Record(t0, worker, Stage::kAverageWeights, n, h, blk);
  }
}

// One (n, h, query block) of the online path: online softmax over key blocks.
//
// The block's Q rows are the scores product's a operand: copied once for the task into a
// contiguous [rows, hd] buffer that the direct micro-kernel reads in place
// (OnlineUsesDirectKernel), or else packed once (PackA: MR-row micro-panels, which its strips
// read by row range) instead of once per key block and strip; in place, rows of the
// [tokens, 3E] buffer are 12 KiB apart at E = 1024, all in the same L1 sets. Its running
// output is likewise a contiguous [rows, hd] buffer in the worker's scratch: the strips read,
// scale and accumulate rows hd floats apart in L2 instead of rows of the [tokens, E] buffers.
// The running output lives in concat (or the caller's output) between tasks only on the
// key-chunked path, unnormalized; row max and sum [rows] live in the worker's scratch, or when
// key-chunked in the plan's [N, H, L] arrays, where they persist from key chunk to key chunk.
// Each key block's K^T [hd, kc] and V [kc, hd] are packed once, then the block's rows run in
// strips of OnlineStripRows(): scores [strip, kc], the online update, and P [strip, kc] times
// V, so a strip's scores stay in L1/L2 between the three steps.
class OnlineTask {
 public:
  OnlineTask(const TaskContext& t, int64_t n, int64_t h, int64_t blk, size_t worker)
      : t_(t), n_(n), h_(h), g_(h / t.group), blk_(blk), worker_(worker) {}

  void Run();

 private:
  // The task's Q rows as the scores product reads them (q_ or qp_); in_place: the direct
  // kernel reads them where they lie.
  void LoadQueryRows(bool in_place);
  // Starts the softmax state (the block's first key chunk) or reloads the running output into
  // acc_.
  void LoadState();
  // Keys [k0, k0 + kc) of one key block; `masked` when they take the masks, the causal limit
  // and the window.
  void UpdateKeyBlock(int64_t k0, size_t kc, bool masked);
  // The head's sink logit (-inf: none; a finite sink is the state's first logit).
  float Sink() const { return t_.masks.sinks != nullptr ? t_.masks.sinks[h_] : kNegInf; }
  void Record(int64_t t0, Stage stage) const { t_.Record(t0, worker_, stage, n_, h_, blk_); }

  const TaskContext& t_;
  const int64_t n_, h_, g_, blk_;
  const size_t worker_;
  const bool direct_ = t_.direct;
  const bool bf16_ = t_.bf16;
  int64_t q0_ = 0;
  size_t rows_ = 0;
  bool init_ = true;  // this pass starts the softmax state
  float* scores_ = nullptr;
  float* row_max_ = nullptr;
  float* row_sum_ = nullptr;
  uint8_t* packed_k_ = nullptr;  // K^T of a key block packed as f32 or bf16
  uint8_t* packed_v_ = nullptr;  // V of a key block likewise
  kernels::PackedA qp_{};
  MatrixView q_;
  MatrixView out_;
  MatrixView acc_;
};

void OnlineTask::Run() {
  const ForwardPlan& plan = t_.plan;
  const KeyChunk& keys = t_.keys;
  const int64_t hd = t_.m.hd, L = t_.args.shapes.L;
  q0_ = blk_ * plan.query_block;
  rows_ = std::min<int64_t>(plan.query_block, L - q0_);
  uint8_t* scratch = t_.WorkerScratch(worker_);
  const OnlineScratch& os = plan.online_scratch;
  scores_ = reinterpret_cast<float*>(scratch);
  row_max_ = reinterpret_cast<float*>(scratch + os.row_max);
  row_sum_ = reinterpret_cast<float*>(scratch + os.row_sum);
  packed_k_ = scratch + os.packed_k;
  packed_v_ = scratch + os.packed_v;
  q_ = MatrixView{reinterpret_cast<float*>(scratch + os.q_rows), rows_, static_cast<size_t>(hd),
                  static_cast<ptrdiff_t>(hd), 1};
  if (plan.chunked()) {
    const int64_t state = (n_ * t_.m.H + h_) * L + q0_;
    row_max_ = t_.buf.row_max + state;
    row_sum_ = t_.buf.row_sum + state;
  }
  if (!t_.Visits(q0_, rows_)) return;
  init_ = t_.StartsState(q0_);
  // Keys below mask_end take the masks and the causal limit; the appended positions after them
  // form one block without masks.
  const int64_t mask_end = t_.MaskEnd();
  const int64_t kend = std::min({keys.end, mask_end, t_.KeyLimit(q0_, rows_)});
  const int64_t kbegin = std::max(keys.begin, t_.KeyStart(q0_));
  const int64_t tail = std::max(keys.begin, mask_end);
  out_ = t_.OutView(n_, h_, q0_, rows_);
  const int64_t kb = static_cast<int64_t>(plan.key_block);
  // A window over index positions (masks.banded()): key blocks of at most WindowKeyBlock keys
  // from the one holding the band's start; the blocks before it are never packed or multiplied.
  // The block grid starts at keys.begin whatever the task's rows (which follow the thread
  // count), so a row's blocks, and its results, do not depend on them.
  const int64_t bk = t_.masks.banded() ? WindowKeyBlock(kb) : kb;
  // k_first: the first block's first key; blocks: the UpdateKeyBlock calls below.
  const int64_t k_first = keys.begin + (kbegin - keys.begin) / bk * bk;
  const int64_t blocks = (kend > k_first ? (kend - k_first + bk - 1) / bk : 0) + (tail < keys.end);
  // One key block for the whole task (S' <= key_block without key chunks, e.g. every S <= 512):
  // each strip reads its Q rows once per product, so the direct kernel reads them in place,
  // and the running output is the output itself (normalized there by the finish), which
  // saves the Q copy, the [rows, hd] copy out and its initialization (a block's first visible
  // keys overwrite its rows of acc, OnlineSoftmaxUpdate).
  const bool one_block = !plan.chunked() && ((kend - kbegin <= kb && tail >= keys.end) ||
                                             (kend <= kbegin && keys.end - tail <= kb));
  acc_ = one_block ? out_
                   : MatrixView{reinterpret_cast<float*>(scratch + os.acc_rows), rows_,
                                static_cast<size_t>(hd), static_cast<ptrdiff_t>(hd), 1};
  // With concat_in_q, out_ is the task's Q rows: the strips read them in place only when each
  // strip's scores product comes before anything writes its rows of acc_: one key block
  // (a window's one_block may take several), and no sink (LoadState zeroes acc_ for it).
  LoadQueryRows(one_block && blocks <= 1 &&
                !(init_ && kernels::SinkSeededState(Sink()).has_sink()));
  LoadState();
  for (int64_t k0 = k_first; k0 < kend; k0 += bk) {
    UpdateKeyBlock(k0, std::min(bk, kend - k0), true);
  }
  if (tail < keys.end) UpdateKeyBlock(tail, keys.end - tail, false);
  // The key-chunked path normalizes in its output projection, after the last key chunk.
  const int64_t t0 = t_.Now();
  if (!plan.chunked()) {
    kernels::OnlineSoftmaxFinish(acc_.data, rows_, hd, acc_.row_stride, row_sum_);
  }
  if (!one_block) {
    for (size_t r = 0; r < rows_; ++r) {
      std::memcpy(out_.data + r * out_.row_stride, acc_.data + r * hd, hd * sizeof(float));
    }
  }
  Record(t0, Stage::kWeightedSum);
}

void OnlineTask::LoadQueryRows(bool in_place) {
  const int64_t hd = t_.m.hd;
  const int64_t t0 = t_.Now();
  if (bf16_) {
    // bf16: scale * q, rounded to bf16 by the scores product (which then stores its sums as
    // they are: the AMX kernel writes its tiles straight into the scores, and the softmax's
    // first pass only reads them). A power-of-two scale (head_dim 16, 64, 256) gives the bits
    // of scaling the product; otherwise q's rounding moves by the scale's.
    const MatrixView src = t_.QView(n_, h_, q0_, rows_);
    for (size_t r = 0; r < rows_; ++r) {
      std::memcpy(q_.data + r * hd, src.data + r * src.row_stride, hd * sizeof(float));
      kernels::ScaleBy(t_.m.scale, q_.data + r * hd, hd);
    }
  } else if (direct_ && in_place) {
    q_ = t_.QView(n_, h_, q0_, rows_);
  } else if (direct_) {
    const MatrixView src = t_.QView(n_, h_, q0_, rows_);
    for (size_t r = 0; r < rows_; ++r) {
      std::memcpy(q_.data + r * hd, src.data + r * src.row_stride, hd * sizeof(float));
    }
  } else {
    qp_ = kernels::PackA(t_.QView(n_, h_, q0_, rows_), q_.data);
  }
  Record(t0, Stage::kScores);
}

void OnlineTask::LoadState() {
  const int64_t hd = t_.m.hd;
  const int64_t t0 = t_.Now();
  // The first key chunk starts from the head's seed (a sink zeroes acc: SinkSeededState); later
  // ones continue the running output.
  const kernels::OnlineSoftmaxState seed = kernels::SinkSeededState(Sink());
  for (size_t r = 0; r < rows_; ++r) {
    float* acc_row = acc_.data + r * acc_.row_stride;
    if (!init_) {
      std::memcpy(acc_row, out_.data + r * out_.row_stride, hd * sizeof(float));
      continue;
    }
    row_max_[r] = seed.row_max;
    row_sum_[r] = seed.row_sum;
    if (seed.has_sink()) std::memset(acc_row, 0, hd * sizeof(float));
  }
  Record(t0, Stage::kWeightedSum);
}

void OnlineTask::UpdateKeyBlock(int64_t k0, size_t kc, bool masked) {
  const int64_t hd = t_.m.hd;
  const size_t key_block = t_.plan.key_block;
  // The trace counts packing K^T as scores time and packing V as weighted-sum time.
  int64_t t0 = t_.Now();
  kernels::PackedB kp{}, vp{};
  kernels::PackedBf16B kp16{}, vp16{};
  if (bf16_) {
    kp16 = kernels::PackBf16B(t_.KtView(n_, g_, k0, kc), reinterpret_cast<uint16_t*>(packed_k_));
  } else {
    kp = kernels::PackB(t_.KtView(n_, g_, k0, kc), reinterpret_cast<float*>(packed_k_));
  }
  Record(t0, Stage::kScores);
  t0 = t_.Now();
  if (bf16_) {
    vp16 = kernels::PackBf16B(t_.VView(n_, g_, k0, kc), reinterpret_cast<uint16_t*>(packed_v_));
  } else {
    vp = kernels::PackB(t_.VView(n_, g_, k0, kc), reinterpret_cast<float*>(packed_v_));
  }
  Record(t0, Stage::kWeightedSum);
  const size_t strip_rows = OnlineStripRows(t_.m.config.compute);
  // A window's band starts the products at a whole panel of the packing (f32: NR columns; bf16:
  // kBf16PanelCols, also the row alignment PackedBf16B::Rows needs).
  const size_t nr = bf16_ ? kernels::kBf16PanelCols : kernels::GemmBlocking().nr;
  void* const gs = t_.GemmScratch(worker_);
  for (size_t r0 = 0; r0 < rows_; r0 += strip_rows) {
    const size_t sr = std::min(strip_rows, rows_ - r0);
    const int64_t q = q0_ + static_cast<int64_t>(r0);
    // Causal: the strip's rows see the keys below KeyLimit(q0 + r0, sr) only; the block's
    // columns from there on are masked for all of them, so the strip's two products and its
    // softmax stop there (the rest would add exact zeros): the strips of a diagonal block
    // do about half its work. A block wholly past the strip's limit is skipped.
    const int64_t visible = masked ? std::min<int64_t>(kc, t_.KeyLimit(q, sr) - k0) : int64_t(kc);
    // A window's band: the strip's first row sees keys from KeyStart(q) on, so the scores
    // product and the softmax start at the micro-panel holding it (c0, a multiple of NR), and
    // P V starts at c0 too. A block wholly before the strip's band is skipped.
    const int64_t first = masked ? t_.KeyStart(q) - k0 : 0;
    if (visible <= 0 || first >= visible) continue;
    const size_t cols = static_cast<size_t>(visible);
    const size_t c0 = first <= 0 ? 0 : static_cast<size_t>(first) / nr * nr;
    const MatrixView s_view{scores_, sr, cols, static_cast<ptrdiff_t>(key_block), 1};
    const MatrixView s_band = s_view.Block(0, c0, sr, cols - c0);
    const MatrixView a_view = acc_.Block(r0, 0, sr, hd);
    // P V reads P's columns and V's rows from c0 on (the band), as the scores did; c0 > 0 only
    // with a window, whose blocks are one KC block deep (WindowKeyBlock), as Rows needs.
    assert(c0 == 0 || kc <= (bf16_ ? kernels::kBf16BlockDepth : kernels::GemmBlocking().kc));
    kernels::PackedB k_cols{}, v_rows{};
    if (!bf16_) {
      k_cols = kp.Columns(c0, cols - c0);
      v_rows = vp.Rows(c0, cols - c0, kernels::GemmBlocking().packnr);
    }
    t0 = t_.Now();
    // The scale is the product's alpha (rounded as the softmax's own multiply would be), so
    // without masks the softmax's first pass only reads the scores.
    // bf16: q_ holds scale * q (LoadQueryRows).
    if (bf16_) {
      kernels::GemmBf16PackedB(t_.bf16_kernel, 1.0f, q_.Block(r0, 0, sr, hd),
                               kp16.Columns(c0, cols - c0), 0.0f, nullptr, s_band, gs);
    } else if (direct_) {
      const bool ran =
          kernels::GemmDirectPackedB(t_.m.scale, q_.Block(r0, 0, sr, hd), k_cols, 0.0f, s_band);
      MHA_CHECK(ran, "online scores: the direct kernel did not run where it was chosen");
    } else {
      kernels::GemmBlisPackedAB(t_.m.scale, qp_.Rows(r0, sr), k_cols, 0.0f, s_band);
    }
    Record(t0, Stage::kScores);
    t0 = t_.Now();
    kernels::OnlineSoftmaxUpdate(s_band.data, sr, cols - c0, key_block, 1.0f,
                                 masked
                                     ? MasksFor(t_.masks, n_, h_, q, k0 + static_cast<int64_t>(c0))
                                     : AppendedKeyTerms(t_.masks),
                                 row_max_ + r0, row_sum_ + r0, a_view.data, hd, a_view.row_stride);
    Record(t0, Stage::kSoftmax);
    t0 = t_.Now();
    // P is read in place where the direct micro-kernel runs: no packing of the strip's
    // probabilities (GemmBlisPackedB's PackPanel). The bf16 kernel rounds P to bf16 as it reads it.
    if (bf16_) {
      kernels::GemmBf16PackedB(t_.bf16_kernel, 1.0f, s_band, vp16.Rows(c0, cols - c0), 1.0f,
                               nullptr, a_view, gs);
    } else if (direct_) {
      const bool ran = kernels::GemmDirectPackedB(1.0f, s_band, v_rows, 1.0f, a_view);
      MHA_CHECK(ran, "online P V: the direct kernel did not run where it was chosen");
    } else {
      kernels::GemmBlisPackedB(1.0f, s_band, v_rows, 1.0f, a_view, gs);
    }
    Record(t0, Stage::kWeightedSum);
  }
}

}  // namespace

void RunAttentionTasks(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                       const ForwardPlan& plan, const ForwardBuffers& buf, const KeyChunk& keys) {
  const ForwardShapes& sh = args.shapes;
  const int64_t N = sh.N, L = sh.L, H = m.H;
  const size_t qb = plan.query_block;
  const int64_t q_blocks = (L + qb - 1) / qb;
  const AttentionMasks masks = PrepareMasks(m, args, plan, buf);
  // need_weights runs the full-row path in f32 whatever the compute: its weights are the
  // product's f32 probabilities.
  const TaskContext t{m,
                      args,
                      plan,
                      buf,
                      keys,
                      masks,
                      TraceOf(ctx),
                      sh.St,
                      H / m.KVH,
                      OnlineUsesDirectKernel(),
                      m.config.compute == Compute::kBF16,
                      Bf16KernelOf(ctx)};

  if (sh.need_weights && sh.average) {
    PoolOf(ctx).ParallelFor(N * q_blocks, [&](uint64_t task, size_t worker) {
      const TaskPair nb = SplitTask(task, q_blocks);  // (entry, query block)
      AveragedWeightsTask(t, nb.outer, nb.inner, worker);
    });
    return;
  }

  // Key-chunked: only the query blocks [b_lo, b_hi) that have work in this key chunk
  // (TaskContext::Visits; causal or a window's band make them a contiguous range).
  int64_t b_lo = 0, b_hi = q_blocks;
  if (plan.chunked() && !sh.need_weights) {
    auto visits = [&](int64_t b) {
      const int64_t q0 = b * static_cast<int64_t>(qb);
      return t.Visits(q0, static_cast<size_t>(std::min<int64_t>(qb, L - q0)));
    };
    while (b_lo < b_hi && !visits(b_lo)) ++b_lo;
    while (b_hi > b_lo && !visits(b_hi - 1)) --b_hi;
  }
  const int64_t blocks = b_hi - b_lo;
  if (blocks == 0) return;
  PoolOf(ctx).ParallelFor(N * H * blocks, [&](uint64_t task, size_t worker) {
    // Causal blocks cost more the later they start: each head's run from its last block down,
    // so the tasks left for stealing at the end of a worker's range are its cheapest.
    const TaskTriple nhb = SplitTask(task, H, blocks);  // (entry, head, block)
    const int64_t n = nhb.i0, h = nhb.i1;
    const int64_t blk = t.masks.causal ? b_hi - 1 - nhb.i2 : b_lo + nhb.i2;
    if (sh.need_weights) {
      // Per-head weights: the scores block lives in the caller's weights tensor.
      const int64_t q0 = blk * qb;
      const size_t rows = std::min<int64_t>(qb, L - q0);
      float* w = args.weights + n * sh.w_stride[0] + h * sh.w_stride[1] + q0 * sh.w_stride[2];
      FullRows(t, n, h, q0, rows, w, sh.w_stride[2], worker, blk);
      return;
    }
    OnlineTask(t, n, h, blk, worker).Run();
  });
}

void RunGroupAttentionTasks(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                            const ForwardBuffers& group_buf, const AttentionMasks& masks,
                            TraceRecorder* trace, int64_t n0, size_t count, size_t worker) {
  const ForwardShapes& sh = args.shapes;
  const KeyChunk keys{0, sh.St, true};
  const TaskContext t{m, args, plan, group_buf, keys, masks, trace, sh.St, m.H / m.KVH,
                      OnlineUsesDirectKernel(), m.config.compute == Compute::kBF16,
                      // Grouped forwards compute in f32 (BatchGroupOf): no bf16 product runs.
                      kernels::Bf16Kernel::kEmulated, n0};
  const int64_t qb = static_cast<int64_t>(plan.query_block);
  const int64_t blocks = (sh.L + qb - 1) / qb;
  for (int64_t n = n0; n < n0 + static_cast<int64_t>(count); ++n) {
    for (int64_t h = 0; h < m.H; ++h) {
      for (int64_t blk = 0; blk < blocks; ++blk) OnlineTask(t, n, h, blk, worker).Run();
    }
  }
}

}  // namespace mha
