// The multi-head attention operator: validation and planning, weight binding, and the scheduled
// forward pass (projections -> per-(batch, head, query block) attention tasks -> output
// projection) on the context's pool with temporaries from its arena.
//
// Data flow of Forward (E = embed_dim, hd = head_dim, S' = S + add_bias_kv + add_zero_attn):
//   1. Input projections (ParallelGemm, bias fused): Q [tokens_q, E], K and V [tokens_kv, kvE]
//      in the arena. Self-attention with packed weights does one fused GEMM into a
//      [tokens, E + 2 kvE] buffer (three products into its column ranges when the layer's
//      weights are prepacked: AttentionConfig::prepack). Buffers keep the token order of their
//      input (batch-major or sequence-major), so dense inputs of either layout project with one
//      GEMM; per-head views are strided views of these buffers (no permute copies).
//   2. Attention tasks over (batch, head, query block). Without weights (the online path): for
//      each key block of up to kKeyBlock keys, K_h^T and V_h are packed once, then the query
//      block runs in strips of kStripRows rows: scores = Q_strip K_h^T (BLIS micro-kernel), the
//      online-softmax update (Highway), Q_strip's rows of concat[:, h*hd:(h+1)*hd] += P V_h, so
//      a strip's scores stay in L1/L2 and scratch is threads x (strip x key block + packed K, V)
//      floats, never S^2 x heads x batch. With weights (the full-row path): scores = Q_blk K_h^T
//      into the weights (or scratch), masked softmax over whole rows, P V_h.
//   3. Output projection (ParallelGemm) from concat [tokens_q, E] into the caller's output.
// Chunked path (no weights, S > kChunkKeys and K + V of all keys >= kChunkMinKvBytes, e.g.
// (1, 8192, 1024, 16): 48 MiB of workspace instead of 135): full K, V and concat would dominate
// the workspace, so
//   1. Q alone is projected whole, [tokens_q, E];
//   2. for each chunk of kChunkKeys keys in order (the last one with the appended positions):
//      its K and V [N, chunk, kvE] are projected (ParallelGemm), then the attention tasks run
//      the online-softmax recurrence over the chunk's key blocks, their state kept between
//      chunks: row max and sum [N, H, L] in the workspace, the unnormalized output in the
//      caller's output rows (concat layout [tokens_q, E] at the output's strides) when they
//      share no memory with an input, else in concat (in place: 80 MiB at that shape). Causal
//      blocks skip chunks past their diagonal;
//   3. output projection per block of rows: copy to scratch, normalize, GEMM into the output.
// Plan returns the larger of the two (and of fused or separate Q/K/V buffers), so one plan fits
// every forward with the same shapes.
// Every partition depends on the shapes only, so results are bitwise identical for any thread
// count.
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_direct.h"
#include "kernels/softmax.h"
#include "mha/mha.hpp"
#include "runtime/context_internal.h"
#include "runtime/arena.h"
#include "runtime/attention_impl.h"
#include "runtime/parallel_gemm.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"
#include "runtime/weights.h"

namespace mha {

using kernels::MatrixView;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct OnlineScratch {
  size_t row_max = 0, row_sum = 0, packed_k = 0, packed_v = 0, q_rows = 0, acc_rows = 0;
  size_t total = 0;
};

// Query rows per task of the full-row path (with weights): the scores block [block, S'] stays
// within ~512 KiB (L2), and small enough blocks leave several tasks per thread. Multiple of 8
// for the GEMM micro-tiles.
constexpr size_t kScoresBlockFloats = 128 * 1024;
constexpr size_t kMinQueryBlock = 8;
constexpr size_t kMaxQueryBlock = 256;
// Keys per block of the online-softmax path (every forward without attention weights).
constexpr size_t kKeyBlock = 512;
// Query rows per task of the online path: each task packs K^T and V of every key block once,
// so without a causal mask it takes as many rows as leave kMinOnlineTasksPerThread tasks per
// thread over the N x H heads, at most kMaxOnlineQueryBlock (its Q and output rows are copied
// to scratch, 2 x 512 KiB per worker at head_dim 64). At (1, 2048, 1024, 16) on 2 threads a
// task is a whole head, where 512-row blocks packed every key block four times (PackB: ~3% of
// the forward's CPU time in a perf profile). Without a causal mask every row runs the same key
// blocks and rows are independent (GemmBlisPackedB's rows, per-row softmax), so this split may
// follow the thread count without changing any result. So may a causal one: its strips stop at
// their own last row (RunAttention), so a row's work depends only on the strip grid, which
// query blocks that are multiples of OnlineStripRows() keep fixed. The chunked path's causal
// blocks are kCausalQueryBlock rows: 512 measured ~2% less time than 256 at (1, 8192, 1024, 16)
// (mha-bench, 2 threads, alternated runs: 2578 / 2419 -> 2552 / 2365 ms).
constexpr size_t kMinOnlineTasksPerThread = 4;
constexpr size_t kMaxOnlineQueryBlock = 2048;
constexpr size_t kCausalQueryBlock = 512;
// Query rows per strip of the online path (a multiple of the micro-kernel's 6 or 8 rows on
// x86-64 and arm64): a strip's scores [kStripRows, kKeyBlock] are 48 KiB.
constexpr size_t kStripRows = 24;
// Tasks the averaged-weights path aims for (it has no head dimension to parallelize over), and
// the fewest query rows such a task takes: each task packs every head's K^T and V for its rows,
// so 8-row tasks spent more time packing than multiplying (mha-bench (1, 128, 512, 8) with
// weights, 2 threads: scores + weighted sums 0.65-0.76 ms per forward with 16 tasks of 8 rows,
// 0.36-0.42 ms with 4 tasks of 32 rows).
constexpr size_t kMinAverageTasks = 16;
constexpr size_t kMinAverageRows = 32;
// The chunked path (long sequences without weights, see PlanWorkspace): keys per chunk, and the
// size of K + V for all keys (f32) from which it replaces the full K, V and concat buffers.
// 1024 keys are two online-softmax key blocks, so inside a chunk the recurrence is the
// unchunked one, and one chunk's K + V is 8 MiB at kvE = 1024. 32 MiB is K + V of (1, 4096,
// 1024) self-attention, where the chunked path plans 30 MiB instead of 68 and measured ~35%
// less CPU time (2 threads; mostly its 256-row query blocks, see PlanWorkspace); at (1, 2048,
// 1024) the two paths measured alike, so shorter sequences keep the unchunked path.
constexpr int64_t kChunkKeys = 1024;
constexpr size_t kChunkMinKvBytes = size_t{32} << 20;
// Rows per task of the chunked path's in-place output projection: a [rows, E] copy per worker.
constexpr size_t kOutRows = 128;

// Copies n weights of type `from` at src into dst as type `to` (each kF32, kBF16 or kF16):
// f32 -> 16-bit rounds to nearest even, 16-bit -> f32 is exact, bf16 <-> f16 goes through f32
// (exact, then rounded once). Creation-time only, so the temporary is acceptable.
void ConvertWeights(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * DTypeSize(to));
    return;
  }
  std::vector<float> tmp;
  const float* f32 = static_cast<const float*>(src);
  if (from != DType::kF32) {
    tmp.resize(n);
    const uint16_t* h = static_cast<const uint16_t*>(src);
    if (from == DType::kBF16) {
      kernels::BF16ToF32(h, tmp.data(), n);
    } else {
      kernels::F16ToF32(h, tmp.data(), n);
    }
    f32 = tmp.data();
  }
  if (to == DType::kF32) {
    std::memcpy(dst, f32, n * sizeof(float));
  } else if (to == DType::kBF16) {
    kernels::F32ToBF16(f32, static_cast<uint16_t*>(dst), n);
  } else {
    kernels::F32ToF16(f32, static_cast<uint16_t*>(dst), n);
  }
}

std::string Dims(const TensorView& v) {
  if (!v.present()) return "absent";
  return v.ShapeString();
}

std::string Str(int64_t v) { return std::to_string(v); }

// Row layout of a buffer of tokens: element offset of token (n, t) = n * batch + t * token.
struct TokenLayout {
  ptrdiff_t batch = 0;
  ptrdiff_t token = 0;
};

// A validated input sequence tensor: N batches of T tokens of `features` floats each.
struct SeqInput {
  const float* data = nullptr;
  int64_t tokens = 0;
  int64_t features = 0;
  TokenLayout layout;  // in elements
};

enum class MaskType { kNone, kBool, kFloat };

struct MaskInput {
  MaskType type = MaskType::kNone;
  const void* data = nullptr;
  bool per_head = false;     // attn_mask [N*H, L, S]
  ptrdiff_t stride0 = 0;     // elements between [N*H] slices (3-D) or between batches (kpm)
  ptrdiff_t row_stride = 0;  // elements between query rows (attn_mask)
};

// Everything Plan derives from the inputs and outputs.
struct Shapes {
  bool batched = false;
  int64_t N = 0, L = 0, S = 0, St = 0;  // St = S'
  SeqInput q, k, v;
  bool self_attention = false;  // key and value are the query view
  // Key and value (or their absence) have the query's shape: the same shapes may come as
  // self-attention (the query's view) or not, so the plan covers both.
  bool self_possible = false;
  MaskInput attn, kpm;
  bool causal = false;
  bool need_weights = false;
  bool average = true;
  float* out = nullptr;
  TokenLayout out_layout;
  // The output's rows are disjoint and share no memory with any input or mask, so the chunked
  // path keeps its running sums there instead of in a workspace buffer.
  bool out_private = false;
  float* weights = nullptr;
  ptrdiff_t w_stride[3] = {0, 0, 0};  // averaged: n, l; per head: n, h, l (in elements)
};

// Byte offsets of the workspace, computed by the plan.
struct Workspace {
  size_t qkv = 0, q = 0, k = 0, v = 0, concat = 0;
  size_t attn_pad = 0, kpm_pad = 0;
  size_t row_max = 0, row_sum = 0;  // chunked: [N, H, L] each
  size_t scratch = 0, scratch_per_worker = 0;
  size_t gemm_scratch = 0;  // bytes at the start of each worker's scratch
  // Projection weights packed once per ParallelGemm call (0 bytes when none is packed).
  size_t packed_w = 0, packed_w_bytes = 0;
  size_t total = 0;
  bool fused = false;
  bool padded_masks = false;
  size_t query_block = 0;
  // Online path (no weights): keys per block, min(kKeyBlock, S').
  bool online = false;
  size_t key_block = 0;
  // Chunked path: K and V hold one chunk of chunk_keys keys (plus the appended positions).
  bool chunked = false;
  int64_t chunk_keys = 0;
  // Chunked path: the running output lives in the caller's output rows (out_private), else in
  // concat.
  bool acc_in_output = false;
  // Projection buffers: element row stride and token layouts.
  ptrdiff_t q_ld = 0, kv_ld = 0;
  TokenLayout q_layout, kv_layout, concat_layout;
};

// The keys one RunAttention call covers: all S' positions, or one chunk of the chunked path,
// whose last chunk also holds the appended positions [S, S').
struct KeyChunk {
  int64_t begin = 0, end = 0;  // key positions [begin, end)
  bool first = true, last = true;
};

bool IsFloatMask(DType t) { return t == DType::kF32; }
bool IsBoolMask(DType t) { return t == DType::kBool || t == DType::kU8; }

// Whether two present views can touch a common byte: their address ranges [lowest, highest
// element] intersect (conservative for interleaved views).
bool MayOverlap(const TensorView& a, const TensorView& b) {
  auto range = [](const TensorView& t, uintptr_t* lo, uintptr_t* hi) {
    ptrdiff_t first = 0, last = 0;
    for (int i = 0; i < t.rank; ++i) {
      const ptrdiff_t span = static_cast<ptrdiff_t>((t.shape[i] - 1) * t.strides[i]);
      (span < 0 ? first : last) += span;
    }
    const ptrdiff_t size = static_cast<ptrdiff_t>(DTypeSize(t.dtype));
    *lo = reinterpret_cast<uintptr_t>(t.data) + first * size;
    *hi = reinterpret_cast<uintptr_t>(t.data) + last * size + size;
  };
  if (!a.present() || !b.present()) return false;
  uintptr_t a_lo, a_hi, b_lo, b_hi;
  range(a, &a_lo, &a_hi);
  range(b, &b_lo, &b_hi);
  return a_lo < b_hi && b_lo < a_hi;
}

}  // namespace

namespace {

std::atomic<size_t> g_chunk_min_kv_bytes{kChunkMinKvBytes};
std::atomic<int64_t> g_chunk_keys{kChunkKeys};

}  // namespace

KeyChunking CurrentKeyChunking() {
  return {g_chunk_min_kv_bytes.load(std::memory_order_relaxed),
          g_chunk_keys.load(std::memory_order_relaxed)};
}

KeyChunking SetKeyChunkingForTesting(const KeyChunking& chunking) {
  const KeyChunking previous = CurrentKeyChunking();
  g_chunk_min_kv_bytes.store(chunking.min_kv_bytes, std::memory_order_relaxed);
  g_chunk_keys.store(std::max<int64_t>(chunking.chunk_keys, 1), std::memory_order_relaxed);
  return previous;
}

struct MultiheadAttention::Impl : LayerWeights {
  int64_t Extra() const { return (config.add_bias_kv ? 1 : 0) + (config.add_zero_attn ? 1 : 0); }

  Status Validate(const AttentionInputs& in, const AttentionOutputs* out, Shapes* sh) const;
  Status ValidateSeq(const TensorView& t, const char* name, int64_t features, bool batched,
                     int64_t expect_batch, SeqInput* seq) const;
  Status ValidateMasks(const AttentionInputs& in, Shapes* sh) const;
  void PlanWorkspace(const Shapes& sh, size_t threads, Workspace* ws) const;
  // The most workspace any forward with sh's shapes needs, whatever its pointers and strides:
  // the maximum of PlanWorkspace over what they decide (an output that shares memory with an
  // input or not; key and value the query's view or not).
  size_t PlanBound(const Shapes& sh, size_t threads) const;
  // Q, K and V (chunked path: Q alone when keys is null, else the keys of one chunk).
  void RunProjections(Context& ctx, const Shapes& sh, const Workspace& ws, uint8_t* base,
                      const KeyChunk* keys) const;
  void PrepareMasks(const Shapes& sh, const Workspace& ws, uint8_t* base, MaskInput* attn,
                    MaskInput* kpm) const;
  // The attention tasks over `keys` (all of them unless chunked).
  void RunAttention(Context& ctx, const Shapes& sh, const Workspace& ws, uint8_t* base,
                    const KeyChunk& keys) const;
  // Chunked path: per chunk, its K and V then the attention tasks; then the output projection.
  // `sink` (optional) gets each chunk's projected keys and values.
  void RunChunked(Context& ctx, const Shapes& sh, const Workspace& ws, uint8_t* base,
                  KvSinkFn sink, void* user) const;
  // Forward's body; `sink` (optional) gets the projected keys and values.
  Status RunForward(Context& ctx, const AttentionInputs& inputs, const AttentionOutputs& outputs,
                    KvSinkFn sink, void* user) const;
  // Hands the K and V rows of key positions [begin, end) in the projection buffers to `sink`.
  void SinkKv(Context& ctx, const Workspace& ws, uint8_t* base, int64_t begin, int64_t end,
              KvSinkFn sink, void* user) const {
    if (sink == nullptr) return;
    const QkvBuffers buf = Buffers(ws, base);
    sink(user, ctx, ProjectedKv{buf.k, buf.v, ws.kv_layout.batch, ws.kv_layout.token, begin, end});
  }
  // Q, K, V inside the workspace: one [tokens, E + 2 kvE] buffer when fused, three otherwise.
  struct QkvBuffers {
    float* q;
    float* k;
    float* v;
  };
  QkvBuffers Buffers(const Workspace& ws, uint8_t* base) const {
    if (ws.fused) {
      float* qkv = reinterpret_cast<float*>(base + ws.qkv);
      return {qkv, qkv + E, qkv + E + kvE};
    }
    return {reinterpret_cast<float*>(base + ws.q), reinterpret_cast<float*>(base + ws.k),
            reinterpret_cast<float*>(base + ws.v)};
  }
  // Validates inputs and outputs of Project/PlanProject (masks and weights are ignored there).
  Status ValidateProject(const AttentionInputs& inputs, const ProjectionOutputs& outputs,
                         Shapes* sh) const;
};

MultiheadAttention::MultiheadAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MultiheadAttention::~MultiheadAttention() = default;
const AttentionConfig& MultiheadAttention::config() const { return impl_->config; }
const LayerWeights& LayerWeightsOf(const MultiheadAttention& layer) { return ImplOf(layer); }
int64_t MultiheadAttention::head_dim() const { return impl_->hd; }

// ---------------------------------------------------------------------------------------------
// Creation: configuration checks and weight binding.

Status MultiheadAttention::Create(const AttentionConfig& config, const AttentionWeights& w,
                                  WeightBinding binding, std::unique_ptr<MultiheadAttention>* out) {
  const char* op = "MultiheadAttention::Create: ";
  if (out == nullptr) return InvalidArgument(std::string(op) + "out is null");
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.config = config;
  m.E = config.embed_dim;
  m.H = config.num_heads;
  if (m.E <= 0)
    return InvalidArgument(std::string(op) + "embed_dim: expected > 0, got " + Str(m.E));
  if (m.H <= 0)
    return InvalidArgument(std::string(op) + "num_heads: expected > 0, got " + Str(m.H));
  if (m.E % m.H != 0) {
    return InvalidArgument(std::string(op) + "embed_dim: expected a multiple of num_heads (" +
                           Str(m.H) + "), got " + Str(m.E));
  }
  m.KVH = config.num_kv_heads == 0 ? m.H : config.num_kv_heads;
  if (m.KVH <= 0 || m.H % m.KVH != 0) {
    return InvalidArgument(std::string(op) + "num_kv_heads: expected a divisor of num_heads (" +
                           Str(m.H) + ") or 0, got " + Str(config.num_kv_heads));
  }
  m.hd = m.E / m.H;
  m.kvE = m.KVH * m.hd;
  m.qd = config.q_dim == 0 ? m.E : config.q_dim;
  m.kd = config.kdim == 0 ? m.E : config.kdim;
  m.vd = config.vdim == 0 ? m.E : config.vdim;
  // Dimensions are bounded so that every size product below fits comfortably in 64 bits.
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  const struct {
    const char* name;
    int64_t v;
  } dims[] = {{"embed_dim", m.E}, {"q_dim", m.qd}, {"kdim", m.kd}, {"vdim", m.vd}};
  for (const auto& d : dims) {
    if (d.v <= 0 || d.v > kMaxDim) {
      return InvalidArgument(std::string(op) + d.name + ": expected 1.." + Str(kMaxDim) +
                             " (or 0 for embed_dim), got " + Str(d.v));
    }
  }
  if (!(config.scale >= 0.0f) || std::isinf(config.scale)) {
    return InvalidArgument(std::string(op) +
                           "scale: expected a finite value >= 0 (0 = default), got " +
                           std::to_string(config.scale));
  }
  m.scale = config.scale > 0 ? config.scale : 1.0f / std::sqrt(static_cast<float>(m.hd));
  m.config.num_kv_heads = m.KVH;
  m.config.q_dim = m.qd;
  m.config.kdim = m.kd;
  m.config.vdim = m.vd;

  const struct {
    const char* name;
    DType v;
  } dtypes[] = {{"config.weight_dtype", config.weight_dtype}, {"weights.dtype", w.dtype}};
  for (const auto& d : dtypes) {
    if (d.v != DType::kF32 && d.v != DType::kBF16 && d.v != DType::kF16) {
      return InvalidArgument(std::string(op) + d.name + ": expected F32, BF16 or F16, got " +
                             DTypeName(d.v));
    }
  }

  if (config.prepack != WeightPrepack::kOn && config.prepack != WeightPrepack::kOff &&
      config.prepack != WeightPrepack::kPlain && config.prepack != WeightPrepack::kStrassen) {
    return InvalidArgument(std::string(op) +
                           "prepack: expected kOn (0), kOff (1), kPlain (2) or kStrassen (3), "
                           "got " +
                           Str(static_cast<int>(config.prepack)));
  }

  const bool packed = w.in_proj_weight != nullptr;
  const bool separate = w.q_proj_weight || w.k_proj_weight || w.v_proj_weight;
  if (packed && separate) {
    return InvalidArgument(
        std::string(op) + "weights: expected either in_proj_weight or q/k/v_proj_weight, got both");
  }
  if (!packed && !(w.q_proj_weight && w.k_proj_weight && w.v_proj_weight)) {
    return InvalidArgument(std::string(op) +
                           "weights: expected in_proj_weight, or all of q_proj_weight, "
                           "k_proj_weight and v_proj_weight");
  }
  if (packed && (m.qd != m.kd || m.qd != m.vd || m.kvE != m.E)) {
    return InvalidArgument(std::string(op) +
                           "in_proj_weight: a packed [3E, in] weight needs "
                           "q_dim == kdim == vdim and num_kv_heads == num_heads, got q_dim " +
                           Str(m.qd) + ", kdim " + Str(m.kd) + ", vdim " + Str(m.vd) +
                           ", num_kv_heads " + Str(m.KVH));
  }
  if (w.qkv_layout != QkvLayout::kPyTorch && w.qkv_layout != QkvLayout::kPerHead) {
    return InvalidArgument(std::string(op) +
                           "qkv_layout: expected kPyTorch (0) or kPerHead (1), got " +
                           Str(static_cast<int>(w.qkv_layout)));
  }
  if (!packed && w.qkv_layout == QkvLayout::kPerHead) {
    return InvalidArgument(std::string(op) +
                           "qkv_layout: kPerHead applies to a packed in_proj_weight only");
  }
  if (w.out_proj_weight == nullptr) {
    return InvalidArgument(std::string(op) + "out_proj_weight: expected [E, E] weights, got null");
  }
  if (config.bias && (w.in_proj_bias == nullptr || w.out_proj_bias == nullptr)) {
    return InvalidArgument(std::string(op) +
                           "bias is true: expected in_proj_bias [E + 2 kvE] and "
                           "out_proj_bias [E], got " +
                           (w.in_proj_bias    ? "in_proj_bias only"
                            : w.out_proj_bias ? "out_proj_bias only"
                                              : "neither"));
  }
  if (!config.bias && (w.in_proj_bias != nullptr || w.out_proj_bias != nullptr)) {
    return InvalidArgument(std::string(op) +
                           "bias is false: expected no in_proj_bias/out_proj_bias");
  }
  if (config.add_bias_kv && (w.bias_k == nullptr || w.bias_v == nullptr)) {
    return InvalidArgument(std::string(op) + "add_bias_kv: expected bias_k and bias_v [kvE]");
  }
  if (!config.add_bias_kv && (w.bias_k != nullptr || w.bias_v != nullptr)) {
    return InvalidArgument(std::string(op) + "bias_k/bias_v given but add_bias_kv is false");
  }

  const int64_t qkv_rows = m.E + 2 * m.kvE;
  const DType st = config.weight_dtype;
  // Copies are made when asked for, and always for the per-head packed layout, which is
  // reordered into PyTorch's (q, k, v) row order once here so every later path is the same.
  const bool copy =
      binding == WeightBinding::kCopy || (packed && w.qkv_layout == QkvLayout::kPerHead);
  if (!copy && w.dtype != st) {
    return InvalidArgument(std::string(op) +
                           "weights.dtype: a view binding uses the arrays as "
                           "they are, so it must equal config.weight_dtype (" +
                           DTypeName(st) + "), got " + DTypeName(w.dtype) +
                           " (use WeightBinding::kCopy to convert)");
  }
  if (!copy) {
    if (packed) {
      m.w_packed = {w.in_proj_weight, st};
      m.w_q = m.w_packed;
      m.w_k = m.w_packed.Rows(m.E, m.qd);
      m.w_v = m.w_packed.Rows(m.E + m.kvE, m.qd);
      m.b_packed = w.in_proj_bias;
    } else {
      m.w_q = {w.q_proj_weight, st};
      m.w_k = {w.k_proj_weight, st};
      m.w_v = {w.v_proj_weight, st};
    }
    if (w.in_proj_bias) {
      m.b_q = w.in_proj_bias;
      m.b_k = w.in_proj_bias + m.E;
      m.b_v = w.in_proj_bias + m.E + m.kvE;
    }
    m.bias_k = w.bias_k;
    m.bias_v = w.bias_v;
    m.w_o = {w.out_proj_weight, st};
    m.b_o = w.out_proj_bias;
  } else {
    // Owned copies in the storage dtype: the weights [w_q | w_k | w_v | w_o] (w_q..w_v adjacent
    // rows of one packed matrix when the input dims agree) in `owned` (f32) or `owned16`
    // (16-bit); the biases (in_proj, bias_kv, out_proj) always in `owned`, after any weights.
    const size_t n_wq = m.E * m.qd, n_wk = m.kvE * m.kd, n_wv = m.kvE * m.vd, n_wo = m.E * m.E;
    const size_t n_w = n_wq + n_wk + n_wv + n_wo;
    const size_t n_b = config.bias ? qkv_rows : 0;
    const size_t n_bkv = config.add_bias_kv ? 2 * m.kvE : 0;
    const size_t n_bo = config.bias ? m.E : 0;
    const bool f32 = st == DType::kF32;
    m.owned.resize((f32 ? n_w : 0) + n_b + n_bkv + n_bo);
    if (!f32) m.owned16.resize(n_w);
    uint8_t* wblk = f32 ? reinterpret_cast<uint8_t*>(m.owned.data())
                        : reinterpret_cast<uint8_t*>(m.owned16.data());
    const size_t eb = DTypeSize(st);
    uint8_t* wq = wblk;
    uint8_t* wk = wq + n_wq * eb;
    uint8_t* wv = wk + n_wk * eb;
    uint8_t* wo = wv + n_wv * eb;
    float* bias = m.owned.data() + (f32 ? n_w : 0);
    float* bkv = bias + n_b;
    float* bo = bkv + n_bkv;
    const size_t src_eb = DTypeSize(w.dtype);
    if (packed && w.qkv_layout == QkvLayout::kPerHead) {
      // Row (h, part, d) of the interleaved layout -> row part * E + h * hd + d.
      const uint8_t* src_w = static_cast<const uint8_t*>(w.in_proj_weight);
      for (int64_t h = 0; h < m.H; ++h) {
        for (int64_t part = 0; part < 3; ++part) {
          for (int64_t d = 0; d < m.hd; ++d) {
            const int64_t src = (h * 3 + part) * m.hd + d;
            const int64_t dst = part * m.E + h * m.hd + d;
            ConvertWeights(src_w + src * m.qd * src_eb, w.dtype, wq + dst * m.qd * eb, st, m.qd);
            if (config.bias) bias[dst] = w.in_proj_bias[src];
          }
        }
      }
    } else if (packed) {
      ConvertWeights(w.in_proj_weight, w.dtype, wq, st, qkv_rows * m.qd);
      if (config.bias) std::memcpy(bias, w.in_proj_bias, qkv_rows * sizeof(float));
    } else {
      ConvertWeights(w.q_proj_weight, w.dtype, wq, st, n_wq);
      ConvertWeights(w.k_proj_weight, w.dtype, wk, st, n_wk);
      ConvertWeights(w.v_proj_weight, w.dtype, wv, st, n_wv);
      if (config.bias) std::memcpy(bias, w.in_proj_bias, qkv_rows * sizeof(float));
    }
    if (config.add_bias_kv) {
      std::memcpy(bkv, w.bias_k, m.kvE * sizeof(float));
      std::memcpy(bkv + m.kvE, w.bias_v, m.kvE * sizeof(float));
      m.bias_k = bkv;
      m.bias_v = bkv + m.kvE;
    }
    ConvertWeights(w.out_proj_weight, w.dtype, wo, st, n_wo);
    if (config.bias) std::memcpy(bo, w.out_proj_bias, m.E * sizeof(float));
    m.w_q = {wq, st};
    m.w_k = {wk, st};
    m.w_v = {wv, st};
    // The three weights are adjacent rows of one [E + 2 kvE, in] matrix when the dims agree.
    if (m.qd == m.kd && m.qd == m.vd) m.w_packed = m.w_q;
    if (config.bias) {
      m.b_packed = bias;
      m.b_q = bias;
      m.b_k = bias + m.E;
      m.b_v = bias + m.E + m.kvE;
    }
    m.w_o = {wo, st};
    m.b_o = config.bias ? bo : nullptr;
  }
  if (!config.bias) m.b_packed = nullptr;
  m.Prepack();
  out->reset(new MultiheadAttention(std::move(impl)));
  return Status::Ok();
}

void LayerWeights::Prepack() {
  if (config.prepack == WeightPrepack::kOff || config.weight_dtype != DType::kF32 ||
      !kernels::GemmBlocking().prefers_rows) {
    return;
  }
  // w^T [in, out] of each matrix, one after the other (PackedBFloats keeps each 64-byte aligned).
  WeightMatrix* const mats[4] = {&w_q, &w_k, &w_v, &w_o};
  const int64_t ins[4] = {qd, kd, vd, E}, outs[4] = {E, kvE, kvE, E};
  const bool strassen = config.prepack == WeightPrepack::kStrassen;
  size_t floats = 0, strassen_floats = 0, tmp_floats = 0;
  for (int i = 0; i < 4; ++i) {
    floats += kernels::PackedBFloats(ins[i], outs[i]);
    if (strassen && StrassenPacks(ins[i], outs[i])) {
      strassen_floats += kernels::StrassenPackedBFloats(ins[i], outs[i]);
      tmp_floats = std::max(tmp_floats, kernels::StrassenPackTmpFloats(ins[i], outs[i]));
    }
  }
  constexpr size_t kAlignFloats = kernels::kGemmScratchAlignment / sizeof(float);
  const auto aligned = [](std::vector<float>& v) {
    float* p = v.data();
    return p + (kAlignFloats - reinterpret_cast<uintptr_t>(p) / sizeof(float) % kAlignFloats) %
                   kAlignFloats;
  };
  prepacked.assign(floats + kAlignFloats, 0.0f);
  float* dst = aligned(prepacked);
  std::vector<float> tmp(tmp_floats);
  if (strassen_floats > 0) strassen_packed.assign(strassen_floats + kAlignFloats, 0.0f);
  float* sdst = strassen_floats > 0 ? aligned(strassen_packed) : nullptr;
  for (int i = 0; i < 4; ++i) {
    const kernels::ConstMatrixView wt{static_cast<const float*>(mats[i]->data),
                                 static_cast<size_t>(ins[i]), static_cast<size_t>(outs[i]), 1,
                                 static_cast<ptrdiff_t>(ins[i])};
    mats[i]->packed = kernels::PackB(wt, dst);
    dst += kernels::PackedBFloats(ins[i], outs[i]);
    if (strassen && StrassenPacks(ins[i], outs[i])) {
      mats[i]->strassen = kernels::PackBStrassen(wt, sdst, tmp.data());
      sdst += kernels::StrassenPackedBFloats(ins[i], outs[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validation.

Status MultiheadAttention::Impl::ValidateSeq(const TensorView& t, const char* name,
                                             int64_t features, bool batched, int64_t expect_batch,
                                             SeqInput* seq) const {
  const int rank = batched ? 3 : 2;
  const char* layout = !batched             ? "[tokens, features]"
                       : config.batch_first ? "[N, tokens, features]"
                                            : "[tokens, N, features]";
  if (t.rank != rank) {
    return InvalidArgument(std::string(name) + ": expected " + Str(rank) + " dims " + layout +
                           ", got " + Dims(t));
  }
  if (t.dtype != DType::kF32) {
    return InvalidArgument(std::string(name) + ": expected dtype f32, got " + DTypeName(t.dtype));
  }
  if (t.shape[rank - 1] != features) {
    return InvalidArgument(std::string(name) + ": expected last dimension " + Str(features) +
                           ", got " + Dims(t));
  }
  if (t.strides[rank - 1] != 1 && features > 1) {
    return InvalidArgument(std::string(name) +
                           ": expected a contiguous last dimension (stride 1), "
                           "got stride " +
                           Str(t.strides[rank - 1]));
  }
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] <= 0) {
      return InvalidArgument(std::string(name) + ": expected non-empty dimensions, got " + Dims(t));
    }
  }
  seq->data = t.As<const float>();
  seq->features = features;
  if (!batched) {
    seq->tokens = t.shape[0];
    seq->layout = {0, static_cast<ptrdiff_t>(t.strides[0])};
    return Status::Ok();
  }
  const int bdim = config.batch_first ? 0 : 1;
  const int tdim = 1 - bdim;
  if (expect_batch >= 0 && t.shape[bdim] != expect_batch) {
    return InvalidArgument(std::string(name) + ": expected batch size " + Str(expect_batch) +
                           " (from query) in dimension " + Str(bdim) + ", got " + Dims(t));
  }
  seq->tokens = t.shape[tdim];
  seq->layout = {static_cast<ptrdiff_t>(t.strides[bdim]), static_cast<ptrdiff_t>(t.strides[tdim])};
  return Status::Ok();
}

Status MultiheadAttention::Impl::ValidateMasks(const AttentionInputs& in, Shapes* sh) const {
  const int64_t N = sh->N, L = sh->L, S = sh->S;
  if (in.attn_mask.present()) {
    const TensorView& m = in.attn_mask;
    MaskInput& a = sh->attn;
    a.type = IsBoolMask(m.dtype)    ? MaskType::kBool
             : IsFloatMask(m.dtype) ? MaskType::kFloat
                                    : MaskType::kNone;
    if (a.type == MaskType::kNone) {
      return InvalidArgument("attn_mask: expected dtype bool, u8 or f32, got " +
                             std::string(DTypeName(m.dtype)));
    }
    const std::string want2 = "[" + Str(L) + ", " + Str(S) + "]";
    const std::string want3 = "[" + Str(N * H) + ", " + Str(L) + ", " + Str(S) + "]";
    if (m.rank == 2 && m.shape[0] == L && m.shape[1] == S) {
      a.per_head = false;
      a.row_stride = m.strides[0];
    } else if (m.rank == 3 && m.shape[0] == N * H && m.shape[1] == L && m.shape[2] == S) {
      a.per_head = true;
      a.stride0 = m.strides[0];
      a.row_stride = m.strides[1];
    } else {
      return InvalidArgument("attn_mask: expected shape " + want2 + " or " + want3 +
                             " (N * num_heads, L, S), got " + Dims(m));
    }
    if (m.strides[m.rank - 1] != 1 && S > 1) {
      return InvalidArgument("attn_mask: expected a contiguous last dimension, got stride " +
                             Str(m.strides[m.rank - 1]));
    }
    a.data = m.data;
  }
  if (in.key_padding_mask.present()) {
    const TensorView& m = in.key_padding_mask;
    MaskInput& k = sh->kpm;
    k.type = IsBoolMask(m.dtype)    ? MaskType::kBool
             : IsFloatMask(m.dtype) ? MaskType::kFloat
                                    : MaskType::kNone;
    if (k.type == MaskType::kNone) {
      return InvalidArgument("key_padding_mask: expected dtype bool, u8 or f32, got " +
                             std::string(DTypeName(m.dtype)));
    }
    if (sh->batched) {
      if (m.rank != 2 || m.shape[0] != N || m.shape[1] != S) {
        return InvalidArgument("key_padding_mask: expected shape [" + Str(N) + ", " + Str(S) +
                               "] (N, S), got " + Dims(m));
      }
      k.stride0 = m.strides[0];
    } else if (m.rank != 1 || m.shape[0] != S) {
      return InvalidArgument("key_padding_mask: expected shape [" + Str(S) +
                             "] (S) for unbatched inputs, got " + Dims(m));
    }
    if (m.strides[m.rank - 1] != 1 && S > 1) {
      return InvalidArgument("key_padding_mask: expected a contiguous last dimension, got stride " +
                             Str(m.strides[m.rank - 1]));
    }
    k.data = m.data;
  }
  return Status::Ok();
}

Status MultiheadAttention::Impl::Validate(const AttentionInputs& in, const AttentionOutputs* out,
                                          Shapes* sh) const {
  const TensorView& q = in.query;
  if (!q.present()) return InvalidArgument("query: expected a tensor, got absent (null data)");
  if (q.rank != 2 && q.rank != 3) {
    return InvalidArgument(std::string("query: expected 3 dims ") +
                           (config.batch_first ? "[N, L, q_dim]" : "[L, N, q_dim]") +
                           " or 2 dims [L, q_dim] (unbatched), got " + Dims(q));
  }
  sh->batched = q.rank == 3;
  Status s = ValidateSeq(q, "query", qd, sh->batched, -1, &sh->q);
  if (!s.ok()) return s;
  sh->N = sh->batched ? q.shape[config.batch_first ? 0 : 1] : 1;
  sh->L = sh->q.tokens;

  const TensorView& kt = in.key.present() ? in.key : in.query;
  const TensorView& vt = in.value.present() ? in.value : kt;
  if (!in.key.present() && qd != kd) {
    return InvalidArgument("key: absent (self-attention) needs kdim == q_dim, got kdim " + Str(kd) +
                           ", q_dim " + Str(qd));
  }
  if (!in.value.present() && kd != vd) {
    return InvalidArgument("value: absent (value = key) needs vdim == kdim, got vdim " + Str(vd) +
                           ", kdim " + Str(kd));
  }
  s = ValidateSeq(kt, "key", kd, sh->batched, sh->N, &sh->k);
  if (!s.ok()) return s;
  s = ValidateSeq(vt, "value", vd, sh->batched, sh->N, &sh->v);
  if (!s.ok()) return s;
  if (sh->k.tokens != sh->v.tokens) {
    return InvalidArgument("value: expected the same sequence length as key (" + Str(sh->k.tokens) +
                           "), got " + Dims(vt));
  }
  sh->S = sh->k.tokens;
  sh->St = sh->S + Extra();
  auto same_shape = [](const TensorView& a, const TensorView& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i) {
      if (a.shape[i] != b.shape[i]) return false;
    }
    return true;
  };
  auto same_view = [&](const TensorView& a, const TensorView& b) {
    if (a.data != b.data || !same_shape(a, b)) return false;
    for (int i = 0; i < a.rank; ++i) {
      if (a.strides[i] != b.strides[i]) return false;
    }
    return true;
  };
  sh->self_attention = same_view(q, kt) && same_view(kt, vt);
  sh->self_possible = same_shape(q, kt) && same_shape(kt, vt);

  // Sizes must stay far from overflow: N * L * S' * H (the per-head weights) in 63 bits.
  constexpr double kMaxElements = 9.0e18;
  if (static_cast<double>(sh->N) * sh->L * sh->St * H > kMaxElements ||
      static_cast<double>(sh->N) * std::max(sh->L, sh->St) * (E + 2 * kvE) > kMaxElements) {
    return InvalidArgument("query/key: sizes overflow 64-bit arithmetic (N " + Str(sh->N) + ", L " +
                           Str(sh->L) + ", S " + Str(sh->S) + ")");
  }

  s = ValidateMasks(in, sh);
  if (!s.ok()) return s;
  sh->causal = in.causal;
  sh->need_weights = in.need_weights;
  sh->average = in.average_attn_weights;

  if (out == nullptr) return Status::Ok();
  const TensorView& o = out->output;
  if (!o.present()) return InvalidArgument("output: expected a tensor, got absent (null data)");
  if (o.dtype != DType::kF32) {
    return InvalidArgument(std::string("output: expected dtype f32, got ") + DTypeName(o.dtype));
  }
  const bool shape_ok = o.rank == q.rank && o.shape[0] == q.shape[0] &&
                        (q.rank == 2 || o.shape[1] == q.shape[1]) && o.shape[o.rank - 1] == E;
  if (!shape_ok) {
    std::string want =
        "[" + Str(q.shape[0]) + ", " + (q.rank == 3 ? Str(q.shape[1]) + ", " : "") + Str(E) + "]";
    return InvalidArgument("output: expected shape " + want + " f32, got " + Dims(o));
  }
  if (o.strides[o.rank - 1] != 1) {
    return InvalidArgument("output: expected a contiguous last dimension, got stride " +
                           Str(o.strides[o.rank - 1]));
  }
  sh->out = o.As<float>();
  if (!sh->batched) {
    sh->out_layout = {0, static_cast<ptrdiff_t>(o.strides[0])};
  } else {
    const int bdim = config.batch_first ? 0 : 1;
    sh->out_layout = {static_cast<ptrdiff_t>(o.strides[bdim]),
                      static_cast<ptrdiff_t>(o.strides[1 - bdim])};
  }
  // Rows of E floats are disjoint when one stride steps over whole rows and the other over all
  // of the first's (batch-major or sequence-major); strides are never negative.
  const ptrdiff_t tok = sh->out_layout.token, bat = sh->out_layout.batch;
  const bool rows_disjoint = (sh->N == 1 && sh->L == 1) ||
                             (tok >= E && (sh->N == 1 || bat >= (sh->L - 1) * tok + E)) ||
                             (bat >= E && (sh->L == 1 || tok >= (sh->N - 1) * bat + E));
  sh->out_private = rows_disjoint && !MayOverlap(o, q) && !MayOverlap(o, kt) &&
                    !MayOverlap(o, vt) && !MayOverlap(o, in.attn_mask) &&
                    !MayOverlap(o, in.key_padding_mask);

  const TensorView& wt = out->attn_weights;
  if (!in.need_weights) {
    if (wt.present()) {
      return InvalidArgument("attn_weights: given but need_weights is false");
    }
    return Status::Ok();
  }
  if (!wt.present()) {
    return InvalidArgument(
        "attn_weights: need_weights is true, expected an output tensor, got absent");
  }
  // Expected [N, L, S'] / [N, H, L, S'], without the leading N when unbatched.
  int64_t want[4];
  int rank = 0;
  if (sh->batched) want[rank++] = sh->N;
  if (!in.average_attn_weights) want[rank++] = H;
  want[rank++] = sh->L;
  want[rank++] = sh->St;
  bool ok = wt.rank == rank && wt.dtype == DType::kF32 && wt.strides[rank - 1] == 1;
  for (int i = 0; ok && i < rank; ++i) ok = wt.shape[i] == want[i];
  if (!ok) {
    std::string ws = "[";
    for (int i = 0; i < rank; ++i) ws += (i ? ", " : "") + Str(want[i]);
    return InvalidArgument(
        "attn_weights: expected shape " + ws + "] f32 with a contiguous last dimension, got " +
        Dims(wt) + (wt.strides[wt.rank > 0 ? wt.rank - 1 : 0] != 1 ? " (last stride != 1)" : ""));
  }
  sh->weights = wt.As<float>();
  int d = 0;
  sh->w_stride[0] = sh->batched ? static_cast<ptrdiff_t>(wt.strides[d++]) : 0;
  if (!in.average_attn_weights) {
    sh->w_stride[1] = wt.strides[d++];
    sh->w_stride[2] = wt.strides[d++];
  } else {
    sh->w_stride[1] = wt.strides[d++];  // l
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Planning.

namespace {

// Layout of a projection buffer that follows the input's token order when the input is dense in
// batch-major or sequence-major order (so one GEMM covers all batches), batch-major otherwise.
TokenLayout BufferLayout(const SeqInput& in, int64_t N, int64_t rows_per_batch, ptrdiff_t ld) {
  if (N > 1 && in.layout.token == N * in.layout.batch && in.tokens == rows_per_batch) {
    return {ld, N * ld};  // sequence-major, like the input
  }
  return {rows_per_batch * ld, ld};
}

size_t Bytes(size_t floats) {
  size_t r = 0;
  RoundUpToAlignment(floats * sizeof(float), &r);
  return r;
}

// Whether the online path's two products per strip run on kernels::GemmDirectPackedB, which
// reads its a operand as it lies: the task's Q rows (a contiguous copy, no PackA) and the
// strip's probabilities P (no packing per strip); else on BLIS micro-kernels through
// GemmBlisPackedAB (Q packed once per task) and GemmBlisPackedB. Fixed per process (the dispatched
// target and BLIS's configuration). (1, 128, 512, 8) causal, 2 threads, mha-bench --breakdown: the
// scores stage (PackA included) took 0.095 ms per forward with Q packed, 0.085 ms on the direct
// kernel (0.068 ms with the causal strips below).
bool OnlineUsesDirectKernel() { return kernels::GemmDirectSupported(); }

// Query rows per strip of the online path: kStripRows rounded down to a multiple of the
// micro-kernel's MR (at least MR), since strips are row ranges of the task's packed Q.
size_t OnlineStripRows() {
  const size_t mr = kernels::GemmBlocking().mr;
  return std::max(kStripRows / mr, size_t{1}) * mr;
}

// The online path's per-worker scratch (after the GEMM packing buffer), byte offsets: scores
// [OnlineStripRows(), key_block], row max and sum [query_block] (unused when chunked: the state
// lives in the workspace), K^T of one key block packed [hd, key_block], V packed [key_block, hd],
// the query block's Q rows (copied [query_block, hd] where the scores product runs the direct
// kernel, see OnlineUsesDirectKernel, else packed: PackA of [query_block, hd]) and its running
// output [query_block, hd].
OnlineScratch OnlineScratchLayout(const Workspace& ws, size_t hd) {
  OnlineScratch l;
  size_t off = Bytes(OnlineStripRows() * ws.key_block);
  l.row_max = off;
  off += Bytes(ws.query_block);
  l.row_sum = off;
  off += Bytes(ws.query_block);
  l.packed_k = off;
  off += Bytes(kernels::PackedBFloats(hd, ws.key_block));
  l.packed_v = off;
  off += Bytes(kernels::PackedBFloats(ws.key_block, hd));
  l.q_rows = off;
  off += Bytes(OnlineUsesDirectKernel() ? ws.query_block * hd
                                        : kernels::PackedAFloats(ws.query_block, hd));
  l.acc_rows = off;
  off += Bytes(ws.query_block * hd);
  l.total = off;
  return l;
}

}  // namespace

size_t MultiheadAttention::Impl::PlanBound(const Shapes& sh, size_t threads) const {
  size_t bound = 0;
  for (const bool out_private : {false, true}) {
    for (const bool self : {false, true}) {
      if (self != sh.self_attention && !sh.self_possible) continue;
      Shapes variant = sh;
      variant.out_private = out_private;
      variant.self_attention = self;
      Workspace ws;
      PlanWorkspace(variant, threads, &ws);
      bound = std::max(bound, ws.total);
    }
  }
  return bound;
}

void MultiheadAttention::Impl::PlanWorkspace(const Shapes& sh, size_t threads,
                                             Workspace* ws) const {
  const size_t N = sh.N, L = sh.L, St = sh.St;
  size_t off = 0;
  // Chunked path: long keys, no weights (see kChunkMinKvBytes). Q [tokens_q, E] is projected
  // whole (the chunks reread it), K and V [N, chunk + extra, kvE] hold one chunk of keys at a
  // time, and the running softmax state of every query row stays between chunks: row max and
  // sum [N, H, L] here, the unnormalized output in the caller's output rows when they are
  // private (out_private), else in concat. At (1, 8192, 1024, 16): 32 + 2 x 4 + 1 MiB (+ 32
  // for concat) instead of 4 x 32 MiB (plus per-worker scratch).
  const KeyChunking chunking = CurrentKeyChunking();
  ws->chunked = !sh.need_weights && sh.S > chunking.chunk_keys &&
                2 * N * St * kvE * sizeof(float) >= chunking.min_kv_bytes;
  ws->acc_in_output = ws->chunked && sh.out_private;
  ws->fused = !ws->chunked && sh.self_attention && w_packed.data != nullptr;
  if (ws->fused) {
    // One [tokens, E + 2 kvE] buffer; rows per batch = max(L, S') so the appended key/value
    // positions fit after the real ones.
    ws->q_ld = ws->kv_ld = E + 2 * kvE;
    const size_t rows = std::max(L, St);
    ws->q_layout = ws->kv_layout = BufferLayout(sh.q, N, rows, ws->q_ld);
    ws->qkv = off;
    off += Bytes(N * rows * ws->q_ld);
  } else {
    // Q [tokens_q, E]; K and V [tokens_kv, kvE], or when chunked [N, chunk + extra, kvE]
    // (batch-major, a chunk's key k0 + i at row i).
    ws->chunk_keys = ws->chunked ? chunking.chunk_keys : 0;
    const size_t kv_rows = ws->chunked ? ws->chunk_keys + Extra() : St;
    ws->q_ld = E;
    ws->kv_ld = kvE;
    ws->q_layout = BufferLayout(sh.q, N, L, E);
    ws->kv_layout = ws->chunked ? TokenLayout{static_cast<ptrdiff_t>(kv_rows * kvE), kvE}
                                : BufferLayout(sh.k, N, St, kvE);
    ws->q = off;
    off += Bytes(N * L * E);
    ws->k = off;
    off += Bytes(N * kv_rows * kvE);
    ws->v = off;
    off += Bytes(N * kv_rows * kvE);
  }
  if (ws->chunked) {
    ws->row_max = off;
    off += Bytes(N * H * L);
    ws->row_sum = off;
    off += Bytes(N * H * L);
  }
  if (!ws->acc_in_output) {
    ws->concat_layout = BufferLayout(sh.q, N, L, E);
    ws->concat = off;
    off += Bytes(N * L * E);
  }

  // Masks are padded to S' columns (and causal folded into them) only when extra key positions
  // exist, because the kernels read a mask value for every column they process. The chunked
  // path reads the caller's masks as they are: it runs the extra positions as a block of their
  // own without masks (it would not fit an [L, S'] copy either).
  ws->padded_masks =
      !ws->chunked && St > static_cast<size_t>(sh.S) &&
      (sh.attn.type != MaskType::kNone || sh.kpm.type != MaskType::kNone || sh.causal);
  if (ws->padded_masks) {
    if (sh.attn.type != MaskType::kNone || sh.causal) {
      const size_t slices = sh.attn.per_head ? N * H : 1;
      const size_t elem = sh.attn.type == MaskType::kFloat ? sizeof(float) : 1;
      size_t r = 0;
      RoundUpToAlignment(slices * L * St * elem, &r);
      ws->attn_pad = off;
      off += r;
    }
    if (sh.kpm.type != MaskType::kNone) {
      const size_t elem = sh.kpm.type == MaskType::kFloat ? sizeof(float) : 1;
      size_t r = 0;
      RoundUpToAlignment(N * St * elem, &r);
      ws->kpm_pad = off;
      off += r;
    }
  }

  // Without weights, the online path at every length: its strips measured faster than the
  // full-row path (scores [block, S'] in scratch) at S' <= 1024 too (mha-bench, 2 threads,
  // alternated runs: (8, 512, 768, 12) 168 / 167 -> 161 / 161 ms, (4, 1024, 512, 8) 119 / 122
  // -> 116 / 114 ms, the small shapes within noise).
  ws->online = !sh.need_weights;
  ws->key_block = std::max<size_t>(std::min(kKeyBlock, St), 1);
  // Query rows per task: the full-row path's scores block [block, S'] within
  // kScoresBlockFloats; the online path's as kMinOnlineTasksPerThread says.
  size_t qb = kCausalQueryBlock;
  if (ws->online && !(sh.causal && ws->chunked)) {
    // Causal too: 64-row blocks, which skipped most of the masked triangle before the strips
    // stopped at their own last row, now only pack each head's K^T and V more often
    // (mha-bench --causal, 2 threads, alternated: (1, 2048, 1024, 16) 163.2 / 163.6 ->
    // 152.2 / 153.1 ms, (4, 1024, 512, 8) 81.0 / 80.9 -> 77.4 / 77.5 ms).
    const size_t heads = std::max<size_t>(N * H, 1);
    const size_t blocks =
        std::max<size_t>((kMinOnlineTasksPerThread * threads + heads - 1) / heads, 1);
    const size_t strip = OnlineStripRows();
    qb = std::min(kMaxOnlineQueryBlock, ((L + blocks - 1) / blocks + strip - 1) / strip * strip);
    qb = std::max(qb, strip);
  } else if (!ws->online) {
    qb = std::min(std::max(kScoresBlockFloats / std::max<size_t>(St, 1), kMinQueryBlock),
                  kMaxQueryBlock) /
         8 * 8;
  }
  if (sh.need_weights && sh.average) {
    // Averaged weights run one task per (batch, query block) with all heads inside it: split
    // the queries so that there are at least kMinAverageTasks tasks when L allows, with blocks of
    // at least kMinAverageRows rows.
    const size_t blocks = (kMinAverageTasks + N - 1) / N;
    qb = std::min(qb, std::max<size_t>(kMinAverageRows, (L + blocks - 1) / blocks + 7) / 8 * 8);
  }
  // The full-row path's partition depends only on shapes; the online path's follows the thread
  // count too, which its results do not depend on (see kMinOnlineTasksPerThread).
  ws->query_block = std::min(qb, L);
  // Per worker: the GEMM packing buffer, then the online path's strip scores, row state and
  // packed K^T and V (OnlineScratchLayout), or the full-row path's scores [block, S'] (unused
  // when the per-head weights are the scores); the chunked path's output projection uses the
  // same space for a copy of kOutRows output rows [rows, E].
  ws->gemm_scratch = kernels::GemmScratchBytes();
  RoundUpToAlignment(ws->gemm_scratch, &ws->gemm_scratch);
  size_t per_worker = ws->online ? OnlineScratchLayout(*ws, hd).total : Bytes(ws->query_block * St);
  if (ws->chunked) per_worker = std::max(per_worker, Bytes(std::min<size_t>(kOutRows, L) * E));
  ws->scratch_per_worker = ws->gemm_scratch + per_worker;
  ws->scratch = off;
  off += ws->scratch_per_worker * threads;
  // f32 projection weights packed once per projection (see ParallelGemm) when the product has
  // rows for several row panels: room for the largest of the projections that run (q, k, v
  // together or fused; when chunked q alone, then k and v per chunk; the output projection).
  // The chunked path's output projection runs its own panels (RunChunked).
  // Prepacked weights (LayerWeights::Prepack) need no room: every product that would pack
  // here has PrepackedMinRows() rows or more.
  if (config.weight_dtype == DType::kF32 && w_q.packed.data == nullptr) {
    // ProjectionJob makes one product of N x len rows or N products of len rows.
    auto packs = [&](size_t len) {
      return PacksWeightsOnce(1, N * len) || PacksWeightsOnce(N, len);
    };
    const bool q_packs = packs(L);
    const bool kv_packs = packs(ws->chunked ? ws->chunk_keys : St);
    const size_t wq = q_packs ? PackedJobBytes(qd, E) : 0;
    const size_t wkv = kv_packs ? PackedJobBytes(kd, kvE) + PackedJobBytes(vd, kvE) : 0;
    size_t bytes = 0;
    if (ws->fused) {
      bytes = q_packs ? PackedJobBytes(qd, E + 2 * kvE) : 0;
    } else if (ws->chunked) {
      bytes = std::max(wq, wkv);
    } else {
      bytes = wq + wkv;
    }
    if (!ws->chunked && q_packs) bytes = std::max(bytes, PackedJobBytes(E, E));
    ws->packed_w = off;
    ws->packed_w_bytes = bytes;
    off += bytes;
  }
  ws->total = off;
}

Status MultiheadAttention::Plan(const AttentionInputs& inputs, const AttentionOutputs& outputs,
                                size_t num_threads, size_t* workspace_bytes) const {
  if (workspace_bytes == nullptr) return InvalidArgument("Plan: workspace_bytes is null");
  Shapes sh;
  Status s = impl_->Validate(inputs, &outputs, &sh);
  if (!s.ok()) return s;
  *workspace_bytes = ArenaBytesFor(impl_->PlanBound(sh, std::max<size_t>(num_threads, 1)));
  return Status::Ok();
}

Status ForwardWorkspaceBytesForTesting(const MultiheadAttention& layer,
                                       const AttentionInputs& inputs,
                                       const AttentionOutputs& outputs, size_t num_threads,
                                       size_t* bytes) {
  Shapes sh;
  Status s = ImplOf(layer).Validate(inputs, &outputs, &sh);
  if (!s.ok()) return s;
  Workspace ws;
  ImplOf(layer).PlanWorkspace(sh, std::max<size_t>(num_threads, 1), &ws);
  *bytes = ws.total;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Execution.

namespace {

// The projection of input x into dst (row stride ld, token layout dst_layout): rows of all N
// batches at once when the buffer is in the input's order with a uniform token stride, else one
// batch per GEMM call.
GemmJob ProjectionJob(const SeqInput& x, size_t N, const WeightMatrix& w, const float* bias,
                      size_t out_cols, float* dst, TokenLayout dst_layout, ptrdiff_t ld) {
  GemmJob job;
  job.SetWeights(w, out_cols, x.features);
  job.bias = bias;
  const bool seq_major_all = N > 1 && dst_layout.token == static_cast<ptrdiff_t>(N) * ld &&
                             x.layout.token == static_cast<ptrdiff_t>(N) * x.layout.batch;
  const bool batch_major_all =
      N == 1 || (x.layout.batch == static_cast<ptrdiff_t>(x.tokens) * x.layout.token &&
                 dst_layout.batch == static_cast<ptrdiff_t>(x.tokens) * dst_layout.token);
  if (seq_major_all) {
    job.a = {x.data, x.tokens * N, static_cast<size_t>(x.features),
             x.layout.batch, 1};
    job.c = {dst, x.tokens * N, out_cols, ld, 1};
  } else if (batch_major_all) {
    job.a = {x.data, x.tokens * N, static_cast<size_t>(x.features),
             x.layout.token, 1};
    job.c = {dst, x.tokens * N, out_cols, dst_layout.token, 1};
  } else {
    job.a = {x.data, static_cast<size_t>(x.tokens),
             static_cast<size_t>(x.features), x.layout.token, 1};
    job.c = {dst, static_cast<size_t>(x.tokens), out_cols, dst_layout.token, 1};
    job.batches = N;
    job.a_batch_stride = x.layout.batch;
    job.c_batch_stride = dst_layout.batch;
  }
  return job;
}

}  // namespace

void MultiheadAttention::Impl::RunProjections(Context& ctx, const Shapes& sh, const Workspace& ws,
                                              uint8_t* base, const KeyChunk* keys) const {
  const size_t N = sh.N;
  const QkvBuffers buf = Buffers(ws, base);
  float* k_buf = buf.k;
  float* v_buf = buf.v;
  GemmJob jobs[3];
  size_t num_jobs = 0;
  // Buffer row of the first appended key/value position, when this call writes them.
  int64_t pos = ws.chunked ? -1 : sh.S;
  if (ws.fused) {
    jobs[num_jobs++] =
        ProjectionJob(sh.q, N, w_packed, b_packed, E + 2 * kvE, buf.q, ws.q_layout, ws.q_ld);
    if (UsesPrepacked(w_q, jobs[0].c.rows, qd, E)) {
      // Prepacked weights are packed per matrix: three products into the buffer's columns.
      jobs[0] = ProjectionJob(sh.q, N, w_q, b_q, E, buf.q, ws.q_layout, ws.q_ld);
      jobs[num_jobs++] = ProjectionJob(sh.q, N, w_k, b_k, kvE, buf.k, ws.q_layout, ws.q_ld);
      jobs[num_jobs++] = ProjectionJob(sh.q, N, w_v, b_v, kvE, buf.v, ws.q_layout, ws.q_ld);
    }
  } else if (keys == nullptr) {
    jobs[num_jobs++] = ProjectionJob(sh.q, N, w_q, b_q, E, buf.q, ws.q_layout, ws.q_ld);
  }
  if (!ws.fused && (!ws.chunked || keys != nullptr)) {
    // Chunked: the chunk's real keys [begin, min(end, S)) into buffer rows from 0.
    SeqInput k = sh.k, v = sh.v;
    if (keys != nullptr) {
      k.tokens = v.tokens = std::min(keys->end, sh.S) - keys->begin;
      k.data += keys->begin * k.layout.token;
      v.data += keys->begin * v.layout.token;
      if (keys->end > sh.S) pos = sh.S - keys->begin;
    }
    jobs[num_jobs++] = ProjectionJob(k, N, w_k, b_k, kvE, k_buf, ws.kv_layout, ws.kv_ld);
    jobs[num_jobs++] = ProjectionJob(v, N, w_v, b_v, kvE, v_buf, ws.kv_layout, ws.kv_ld);
  }
  ParallelGemm(PoolOf(ctx), jobs, num_jobs, base + ws.scratch, ws.scratch_per_worker, TraceOf(ctx),
               base + ws.packed_w, ws.packed_w_bytes);
  if (pos < 0) return;
  // Appended key/value positions: bias_k / bias_v at S, zeros at S (or S + 1) for add_zero_attn.
  for (size_t n = 0; n < N; ++n) {
    int64_t p = pos;
    if (config.add_bias_kv) {
      std::memcpy(k_buf + n * ws.kv_layout.batch + p * ws.kv_layout.token, bias_k,
                  kvE * sizeof(float));
      std::memcpy(v_buf + n * ws.kv_layout.batch + p * ws.kv_layout.token, bias_v,
                  kvE * sizeof(float));
      ++p;
    }
    if (config.add_zero_attn) {
      std::memset(k_buf + n * ws.kv_layout.batch + p * ws.kv_layout.token, 0, kvE * sizeof(float));
      std::memset(v_buf + n * ws.kv_layout.batch + p * ws.kv_layout.token, 0, kvE * sizeof(float));
    }
  }
}

void MultiheadAttention::Impl::PrepareMasks(const Shapes& sh, const Workspace& ws, uint8_t* base,
                                            MaskInput* attn, MaskInput* kpm) const {
  *attn = sh.attn;
  *kpm = sh.kpm;
  if (!ws.padded_masks) return;
  const int64_t N = sh.N, L = sh.L, S = sh.S, St = sh.St;
  if (sh.attn.type != MaskType::kNone || sh.causal) {
    // [slices, L, S'] copy; columns >= S are "allowed"; causal folded in as masked cells.
    const int64_t slices = sh.attn.per_head ? N * H : 1;
    const bool as_float = sh.attn.type == MaskType::kFloat;
    for (int64_t sl = 0; sl < slices; ++sl) {
      for (int64_t l = 0; l < L; ++l) {
        const int64_t row = (sl * L + l) * St;
        for (int64_t s = 0; s < St; ++s) {
          bool masked = sh.causal && s < S && s > l;
          float add = 0.0f;
          if (s < S && sh.attn.type != MaskType::kNone) {
            const ptrdiff_t src = sl * sh.attn.stride0 + l * sh.attn.row_stride + s;
            if (as_float) {
              add = static_cast<const float*>(sh.attn.data)[src];
            } else {
              masked = masked || static_cast<const uint8_t*>(sh.attn.data)[src] != 0;
            }
          }
          if (as_float) {
            reinterpret_cast<float*>(base + ws.attn_pad)[row + s] = masked ? kNegInf : add;
          } else {
            (base + ws.attn_pad)[row + s] = masked ? 1 : 0;
          }
        }
      }
    }
    attn->type = as_float ? MaskType::kFloat : MaskType::kBool;
    attn->data = base + ws.attn_pad;
    attn->stride0 = L * St;
    attn->row_stride = St;
  }
  if (sh.kpm.type != MaskType::kNone) {
    const bool as_float = sh.kpm.type == MaskType::kFloat;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t s = 0; s < St; ++s) {
        const ptrdiff_t src = n * sh.kpm.stride0 + s;
        if (as_float) {
          reinterpret_cast<float*>(base + ws.kpm_pad)[n * St + s] =
              s < S ? static_cast<const float*>(sh.kpm.data)[src] : 0.0f;
        } else {
          (base + ws.kpm_pad)[n * St + s] =
              s < S ? (static_cast<const uint8_t*>(sh.kpm.data)[src] != 0) : 0;
        }
      }
    }
    kpm->data = base + ws.kpm_pad;
    kpm->stride0 = St;
  }
}

void MultiheadAttention::Impl::RunAttention(Context& ctx, const Shapes& sh, const Workspace& ws,
                                            uint8_t* base, const KeyChunk& keys) const {
  const int64_t N = sh.N, L = sh.L, St = sh.St;
  const size_t qb = ws.query_block;
  const int64_t q_blocks = (L + qb - 1) / qb;
  const int64_t group = H / KVH;
  MaskInput attn, kpm;
  PrepareMasks(sh, ws, base, &attn, &kpm);
  // With padded masks, causal is already folded into the attn mask.
  const bool causal = sh.causal && !ws.padded_masks;

  const QkvBuffers buf = Buffers(ws, base);
  float* const q_buf = buf.q;
  float* const k_buf = buf.k;
  float* const v_buf = buf.v;
  // Attention results [tokens_q, E]: concat, or the caller's output (chunked running sums).
  float* const concat = ws.acc_in_output ? sh.out : reinterpret_cast<float*>(base + ws.concat);
  const TokenLayout concat_layout = ws.acc_in_output ? sh.out_layout : ws.concat_layout;
  uint8_t* scratch_base = base + ws.scratch;
  TraceRecorder* trace = TraceOf(ctx);

  // Masks of query rows [q0, q0 + rows) for (n, h), columns from k0.
  auto masks_for = [&](int64_t n, int64_t h, int64_t q0, int64_t k0) {
    kernels::SoftmaxMasks m;
    int slot_add = 0, slot_bool = 0;
    auto add_mask = [&](const MaskInput& mi, ptrdiff_t offset, ptrdiff_t row_stride) {
      if (mi.type == MaskType::kFloat) {
        m.add[slot_add] = static_cast<const float*>(mi.data) + offset;
        m.add_row_stride[slot_add++] = row_stride;
      } else if (mi.type == MaskType::kBool) {
        m.masked[slot_bool] = static_cast<const uint8_t*>(mi.data) + offset;
        m.masked_row_stride[slot_bool++] = row_stride;
      }
    };
    if (attn.type != MaskType::kNone) {
      const ptrdiff_t slice = attn.per_head ? (n * H + h) * attn.stride0 : 0;
      add_mask(attn, slice + q0 * attn.row_stride + k0, attn.row_stride);
    }
    if (kpm.type != MaskType::kNone) add_mask(kpm, n * kpm.stride0 + k0, 0);
    m.causal = causal;
    m.causal_offset = q0 - k0;
    return m;
  };

  auto record = [&](int64_t begin, size_t worker, Stage stage, int64_t n, int64_t h, int64_t b) {
    if (trace) {
      trace->Record({begin, TraceRecorder::NowNs(), static_cast<uint32_t>(worker), stage,
                     static_cast<int32_t>(n), static_cast<int32_t>(h), static_cast<int32_t>(b)});
    }
  };
  auto now = [&] { return trace ? TraceRecorder::NowNs() : 0; };

  // Views of head h's rows.
  auto q_view = [&](int64_t n, int64_t h, int64_t q0, size_t rows) {
    return MatrixView{q_buf + n * ws.q_layout.batch + q0 * ws.q_layout.token + h * hd, rows,
                      static_cast<size_t>(hd), ws.q_layout.token, 1};
  };
  // K_g^T for keys [k0, k0 + cols): [hd, cols]. Key k0 is buffer row k0 - keys.begin.
  auto kt_view = [&](int64_t n, int64_t g, int64_t k0, size_t cols) {
    return MatrixView{
        k_buf + n * ws.kv_layout.batch + (k0 - keys.begin) * ws.kv_layout.token + g * hd,
        static_cast<size_t>(hd), cols, 1, ws.kv_layout.token};
  };
  auto v_view = [&](int64_t n, int64_t g, int64_t k0, size_t rows) {
    return MatrixView{
        v_buf + n * ws.kv_layout.batch + (k0 - keys.begin) * ws.kv_layout.token + g * hd, rows,
        static_cast<size_t>(hd), ws.kv_layout.token, 1};
  };
  auto out_view = [&](int64_t n, int64_t h, int64_t q0, size_t rows) {
    return MatrixView{concat + n * concat_layout.batch + q0 * concat_layout.token + h * hd, rows,
                      static_cast<size_t>(hd), concat_layout.token, 1};
  };
  // Keys a causal block needs: key j is used by some row iff j <= q0 + rows - 1.
  auto key_limit = [&](int64_t q0, size_t rows) {
    return causal ? std::min<int64_t>(St, q0 + static_cast<int64_t>(rows)) : St;
  };

  // One (n, h, query block) with attention weights: full-row softmax, scores into `scores` (row
  // stride ld).
  auto gemm_scratch = [&](size_t worker) { return scratch_base + worker * ws.scratch_per_worker; };
  auto worker_scratch = [&](size_t worker) { return gemm_scratch(worker) + ws.gemm_scratch; };
  auto full_rows = [&](int64_t n, int64_t h, int64_t q0, size_t rows, float* scores, ptrdiff_t ld,
                       size_t worker, int64_t blk) {
    const int64_t g = h / group;
    void* gs = gemm_scratch(worker);
    const size_t kl = static_cast<size_t>(key_limit(q0, rows));
    const MatrixView s_view{scores, rows, kl, ld, 1};
    const MatrixView out = out_view(n, h, q0, rows);
    int64_t t0 = now();
    // The scale is the product's alpha (the softmax's own multiply by it would round alike).
    kernels::Gemm(scale, q_view(n, h, q0, rows), kt_view(n, g, 0, kl), 0.0f, s_view, gs);
    record(t0, worker, Stage::kScores, n, h, blk);
    t0 = now();
    kernels::SoftmaxRows(scores, rows, kl, ld, 1.0f, masks_for(n, h, q0, 0));
    record(t0, worker, Stage::kSoftmax, n, h, blk);
    t0 = now();
    kernels::Gemm(1.0f, s_view, v_view(n, g, 0, kl), 0.0f, out, gs);
    record(t0, worker, Stage::kWeightedSum, n, h, blk);
    // Columns past the causal limit are exactly zero in the returned weights.
    if (kl < static_cast<size_t>(St)) {
      for (size_t r = 0; r < rows; ++r) {
        std::memset(scores + r * ld + kl, 0, (St - kl) * sizeof(float));
      }
    }
  };

  if (sh.need_weights && sh.average) {
    // Tasks over (n, query block); heads in a fixed order so the average is deterministic.
    PoolOf(ctx).ParallelFor(N * q_blocks, [&](uint64_t task, size_t worker) {
      const int64_t n = task / q_blocks, blk = task % q_blocks;
      const int64_t q0 = blk * qb;
      const size_t rows = std::min<int64_t>(qb, L - q0);
      float* scores = reinterpret_cast<float*>(worker_scratch(worker));
      float* wrow = sh.weights + n * sh.w_stride[0] + q0 * sh.w_stride[1];
      for (int64_t h = 0; h < H; ++h) {
        full_rows(n, h, q0, rows, scores, St, worker, blk);
        const int64_t t0 = now();
        for (size_t r = 0; r < rows; ++r) {
          float* dst = wrow + r * sh.w_stride[1];
          if (h == 0) {
            std::memcpy(dst, scores + r * St, St * sizeof(float));
          } else {
            kernels::AddInto(scores + r * St, dst, St);
          }
          if (h == H - 1) kernels::ScaleBy(1.0f / static_cast<float>(H), dst, St);
        }
        record(t0, worker, Stage::kAverageWeights, n, h, blk);
      }
    });
    return;
  }

  const bool direct = OnlineUsesDirectKernel();
  PoolOf(ctx).ParallelFor(N * H * q_blocks, [&](uint64_t task, size_t worker) {
    // Causal blocks cost more the later they start: each head's run from its last block down,
    // so the tasks left for stealing at the end of a worker's range are its cheapest.
    const int64_t blk = causal ? q_blocks - 1 - static_cast<int64_t>(task % q_blocks)
                               : static_cast<int64_t>(task % q_blocks);
    const int64_t h = (task / q_blocks) % H;
    const int64_t n = task / (q_blocks * H);
    const int64_t q0 = blk * qb;
    const size_t rows = std::min<int64_t>(qb, L - q0);
    uint8_t* scratch = worker_scratch(worker);
    if (sh.need_weights) {
      // Per-head weights: the scores block lives in the caller's weights tensor.
      float* w = sh.weights + n * sh.w_stride[0] + h * sh.w_stride[1] + q0 * sh.w_stride[2];
      full_rows(n, h, q0, rows, w, sh.w_stride[2], worker, blk);
      return;
    }
    // Online softmax over key blocks. The block's Q rows are the scores product's a operand:
    // copied once for the task into a contiguous [rows, hd] buffer that the direct micro-kernel
    // reads in place (OnlineUsesDirectKernel), or else packed once (PackA: MR-row micro-panels,
    // which its strips read by row range) instead of once per key block and strip. The copy
    // matters at long lengths, where a strip rereads its rows once per key block: rows of the
    // [tokens, 3E] buffer are 12 KiB apart at E = 1024, all in the same L1 sets
    // ((1, 2048, 1024, 16): scores stage 53.0 ms in place, 49.5 with PackA, ~50 copied). Its
    // running output is likewise copied into a
    // contiguous [rows, hd] buffer in the worker's scratch: the strips then read, scale and
    // accumulate rows at a stride of hd floats in L2 instead of rows of the [tokens, E] buffers
    // (a multiple of 4 KiB apart, L3 or memory at long lengths) once per key block.
    // The running output lives in concat (or the caller's output) between tasks only on the
    // chunked path, unnormalized; row max and sum [rows] live in the worker's scratch, or when chunked
    // in the workspace's [N, H, L] arrays, where they persist from chunk to chunk.
    // Each key block's K^T [hd, kc] and V [kc, hd] are packed once, then the block's rows run in
    // strips of kStripRows (rounded down to the micro-kernel's MR, the packed Q's row ranges):
    // scores [strip, kc], the online update, and P [strip, kc] times V, so
    // a strip's scores stay in L1/L2 between the three steps instead of a [rows, kc] block
    // round-tripping through L3.
    const int64_t g = h / group;
    float* scores = reinterpret_cast<float*>(scratch);
    const OnlineScratch os = OnlineScratchLayout(ws, hd);
    float* row_max = reinterpret_cast<float*>(scratch + os.row_max);
    float* row_sum = reinterpret_cast<float*>(scratch + os.row_sum);
    float* const packed_k = reinterpret_cast<float*>(scratch + os.packed_k);
    float* const packed_v = reinterpret_cast<float*>(scratch + os.packed_v);
    float* const q_rows = reinterpret_cast<float*>(scratch + os.q_rows);
    if (ws.chunked) {
      const int64_t state = (n * H + h) * L + q0;
      row_max = reinterpret_cast<float*>(base + ws.row_max) + state;
      row_sum = reinterpret_cast<float*>(base + ws.row_sum) + state;
    }
    // Keys below mask_end take the masks and the causal limit (a chunk past this block's
    // diagonal has none left); the chunked path's unpadded masks end at S, and the appended
    // positions [S, S') after them are never masked, so they form one block without masks.
    const int64_t mask_end = ws.chunked ? sh.S : St;
    const int64_t kend = std::min({keys.end, mask_end, key_limit(q0, rows)});
    const int64_t tail = std::max(keys.begin, mask_end);
    // A later chunk past this block's causal diagonal leaves its state as it is.
    if (!keys.first && kend <= keys.begin && tail >= keys.end) return;
    const MatrixView out = out_view(n, h, q0, rows);
    const int64_t kb = static_cast<int64_t>(ws.key_block);
    // One key block for the whole task (S' <= key_block without chunks, e.g. every S <= 512):
    // each strip reads its Q rows once per product, so the direct kernel reads them in place,
    // and the running output is the output itself (normalized there by the finish), which
    // saves the Q copy, the [rows, hd] copy out and its initialization (a block's first visible
    // keys overwrite its rows of acc, OnlineSoftmaxUpdate).
    const bool one_block = !ws.chunked && ((kend - keys.begin <= kb && tail >= keys.end) ||
                                           (kend <= keys.begin && keys.end - tail <= kb));
    const MatrixView acc = one_block
                               ? out
                               : MatrixView{reinterpret_cast<float*>(scratch + os.acc_rows), rows,
                                            static_cast<size_t>(hd), static_cast<ptrdiff_t>(hd), 1};
    int64_t t0 = now();
    kernels::PackedA qp{};
    MatrixView q{q_rows, rows, static_cast<size_t>(hd), static_cast<ptrdiff_t>(hd), 1};
    if (direct && one_block) {
      q = q_view(n, h, q0, rows);
    } else if (direct) {
      const MatrixView src = q_view(n, h, q0, rows);
      for (size_t r = 0; r < rows; ++r) {
        std::memcpy(q.data + r * hd, src.data + r * src.row_stride, hd * sizeof(float));
      }
    } else {
      qp = kernels::PackA(q_view(n, h, q0, rows), q_rows);
    }
    record(t0, worker, Stage::kScores, n, h, blk);
    t0 = now();
    for (size_t r = 0; r < rows; ++r) {
      if (keys.first) {
        row_max[r] = kNegInf;
        row_sum[r] = 0.0f;
      } else {
        std::memcpy(acc.data + r * hd, out.data + r * out.row_stride, hd * sizeof(float));
      }
    }
    record(t0, worker, Stage::kWeightedSum, n, h, blk);
    void* const gs = gemm_scratch(worker);
    const size_t strip_rows = OnlineStripRows();
    auto update = [&](int64_t k0, size_t kc, bool masked) {
      // The trace counts packing K^T as scores time and packing V as weighted-sum time.
      t0 = now();
      const kernels::PackedB kp = kernels::PackB(kt_view(n, g, k0, kc), packed_k);
      record(t0, worker, Stage::kScores, n, h, blk);
      t0 = now();
      const kernels::PackedB vp = kernels::PackB(v_view(n, g, k0, kc), packed_v);
      record(t0, worker, Stage::kWeightedSum, n, h, blk);
      for (size_t r0 = 0; r0 < rows; r0 += strip_rows) {
        const size_t sr = std::min(strip_rows, rows - r0);
        // Causal: the strip's rows see the keys below key_limit(q0 + r0, sr) only; the block's
        // columns from there on are masked for all of them, so the strip's two products and its
        // softmax stop there (the rest would add exact zeros): the strips of a diagonal block
        // do about half its work. A block wholly past the strip's limit is skipped.
        const int64_t visible =
            masked ? std::min<int64_t>(kc, key_limit(q0 + r0, sr) - k0) : int64_t(kc);
        if (visible <= 0) continue;
        const size_t cols = static_cast<size_t>(visible);
        const MatrixView s_view{scores, sr, cols, static_cast<ptrdiff_t>(ws.key_block), 1};
        const MatrixView a_view = acc.Block(r0, 0, sr, hd);
        const kernels::PackedB k_cols = kp.Columns(0, cols);
        const kernels::PackedB v_rows = vp.LeadingRows(cols);
        t0 = now();
        // The scale is the product's alpha (rounded as the softmax's own multiply would be), so
        // without masks the softmax's first pass only reads the scores.
        if (direct) {
          const bool ran =
              kernels::GemmDirectPackedB(scale, q.Block(r0, 0, sr, hd), k_cols, 0.0f, s_view);
          assert(ran && "the direct kernel runs where it was chosen");
          (void)ran;
        } else {
          kernels::GemmBlisPackedAB(scale, qp.Rows(r0, sr), k_cols, 0.0f, s_view);
        }
        record(t0, worker, Stage::kScores, n, h, blk);
        t0 = now();
        kernels::OnlineSoftmaxUpdate(
            scores, sr, cols, ws.key_block, 1.0f,
            masked ? masks_for(n, h, q0 + r0, k0) : kernels::SoftmaxMasks(), row_max + r0,
            row_sum + r0, a_view.data, hd, a_view.row_stride);
        record(t0, worker, Stage::kSoftmax, n, h, blk);
        t0 = now();
        // P is read in place where the direct micro-kernel runs: no packing of the strip's
        // probabilities (GemmBlisPackedB's PackPanel, ~4% of CPU time at large shapes).
        if (direct) {
          const bool ran = kernels::GemmDirectPackedB(1.0f, s_view, v_rows, 1.0f, a_view);
          assert(ran && "the direct kernel runs where it was chosen");
          (void)ran;
        } else {
          kernels::GemmBlisPackedB(1.0f, s_view, v_rows, 1.0f, a_view, gs);
        }
        record(t0, worker, Stage::kWeightedSum, n, h, blk);
      }
    };
    for (int64_t k0 = keys.begin; k0 < kend; k0 += kb) {
      update(k0, std::min<int64_t>(kb, kend - k0), true);
    }
    if (tail < keys.end) update(tail, keys.end - tail, false);
    // The chunked path normalizes in its output projection, after the last chunk.
    t0 = now();
    if (!ws.chunked) kernels::OnlineSoftmaxFinish(acc.data, rows, hd, acc.row_stride, row_sum);
    if (!one_block) {
      for (size_t r = 0; r < rows; ++r) {
        std::memcpy(out.data + r * out.row_stride, acc.data + r * hd, hd * sizeof(float));
      }
    }
    record(t0, worker, Stage::kWeightedSum, n, h, blk);
  });
}

void MultiheadAttention::Impl::RunChunked(Context& ctx, const Shapes& sh, const Workspace& ws,
                                          uint8_t* base, KvSinkFn sink, void* user) const {
  // Chunks of chunk_keys real keys; the last one also takes the appended positions [S, S').
  for (int64_t k0 = 0; k0 < sh.S; k0 += ws.chunk_keys) {
    KeyChunk keys;
    keys.begin = k0;
    keys.first = k0 == 0;
    keys.last = k0 + ws.chunk_keys >= sh.S;
    keys.end = keys.last ? sh.St : k0 + ws.chunk_keys;
    RunProjections(ctx, sh, ws, base, &keys);
    SinkKv(ctx, ws, base, keys.begin, std::min(keys.end, sh.S), sink, user);
    RunAttention(ctx, sh, ws, base, keys);
  }

  // Output projection, kOutRows rows of one batch per task: the rows' running sums (in the
  // output rows themselves, or in concat) are copied to the worker's scratch [rows, E] and
  // normalized there by the row sums of each head (OnlineSoftmaxFinish), then out rows = scratch
  // x W_o^T + b_o. Every task reads and writes only its own rows, so the tasks are independent.
  const int64_t N = sh.N, L = sh.L;
  const int64_t blocks = (L + kOutRows - 1) / kOutRows;
  const float* row_sum = reinterpret_cast<const float*>(base + ws.row_sum);
  TraceRecorder* trace = TraceOf(ctx);
  PoolOf(ctx).ParallelFor(N * blocks, [&](uint64_t task, size_t worker) {
    const int64_t n = task / blocks;
    const TraceSpan span(trace, worker, Stage::kOutProjection, n, -1, static_cast<int64_t>(task));
    const int64_t r0 = (task % blocks) * kOutRows;
    const size_t rows = std::min<int64_t>(kOutRows, L - r0);
    uint8_t* gemm_scratch = base + ws.scratch + worker * ws.scratch_per_worker;
    float* a = reinterpret_cast<float*>(gemm_scratch + ws.gemm_scratch);
    float* out = sh.out + n * sh.out_layout.batch + r0 * sh.out_layout.token;
    const float* acc = out;
    ptrdiff_t acc_stride = sh.out_layout.token;
    if (!ws.acc_in_output) {
      acc = reinterpret_cast<const float*>(base + ws.concat) + n * ws.concat_layout.batch +
            r0 * ws.concat_layout.token;
      acc_stride = ws.concat_layout.token;
    }
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(a + r * E, acc + r * acc_stride, E * sizeof(float));
    }
    for (int64_t h = 0; h < H; ++h) {
      kernels::OnlineSoftmaxFinish(a + h * hd, rows, hd, E, row_sum + (n * H + h) * L + r0);
    }
    const MatrixView c{out, rows, static_cast<size_t>(E), sh.out_layout.token, 1};
    MultiplyWeights(MatrixView{a, rows, static_cast<size_t>(E), E, 1}, w_o, static_cast<size_t>(E),
                    b_o, c, gemm_scratch);
  });
}

Status MultiheadAttention::Forward(Context& ctx, const AttentionInputs& inputs,
                                   const AttentionOutputs& outputs) const {
  return impl_->RunForward(ctx, inputs, outputs, nullptr, nullptr);
}

Status ForwardWithKvSink(const MultiheadAttention& layer, Context& ctx,
                         const AttentionInputs& inputs, const AttentionOutputs& outputs,
                         KvSinkFn sink, void* user) {
  return ImplOf(layer).RunForward(ctx, inputs, outputs, sink, user);
}

Status MultiheadAttention::Impl::RunForward(Context& ctx, const AttentionInputs& inputs,
                                            const AttentionOutputs& outputs, KvSinkFn sink,
                                            void* user) const {
  const Impl& m = *this;
  Shapes sh;
  Status s = m.Validate(inputs, &outputs, &sh);
  if (!s.ok()) return s;
  Workspace ws;
  m.PlanWorkspace(sh, ctx.num_threads(), &ws);
  s = ReserveArena(ctx, ws.total);
  if (!s.ok()) return s;
  Arena& arena = ArenaOf(ctx);
  arena.Reset();
  void* base = nullptr;
  s = arena.Allocate(ws.total, &base, "forward workspace");
  if (!s.ok()) return s;
  uint8_t* b = static_cast<uint8_t*>(base);

  m.RunProjections(ctx, sh, ws, b, nullptr);
  if (ws.chunked) {
    m.RunChunked(ctx, sh, ws, b, sink, user);
    return TakeDispatchError(ctx);
  }
  m.SinkKv(ctx, ws, b, 0, sh.S, sink, user);
  m.RunAttention(ctx, sh, ws, b, KeyChunk{0, sh.St, true, true});

  // Output projection: concat [tokens, E] x W_o^T + b_o into the caller's output.
  float* concat = reinterpret_cast<float*>(b + ws.concat);
  GemmJob job;
  job.SetWeights(m.w_o, m.E, m.E);
  job.bias = m.b_o;
  job.stage = Stage::kOutProjection;
  const size_t N = sh.N, L = sh.L;
  const bool concat_seq_major = N > 1 && ws.concat_layout.token == static_cast<ptrdiff_t>(N * m.E);
  const bool out_seq_major =
      N > 1 && sh.out_layout.token == static_cast<ptrdiff_t>(N) * sh.out_layout.batch;
  const bool out_batch_major =
      N == 1 || sh.out_layout.batch == static_cast<ptrdiff_t>(L) * sh.out_layout.token;
  if (concat_seq_major && out_seq_major) {
    job.a = {concat, N * L, static_cast<size_t>(m.E), static_cast<ptrdiff_t>(m.E), 1};
    job.c = {sh.out, N * L, static_cast<size_t>(m.E), sh.out_layout.batch, 1};
  } else if (!concat_seq_major && out_batch_major) {
    job.a = {concat, N * L, static_cast<size_t>(m.E), static_cast<ptrdiff_t>(m.E), 1};
    job.c = {sh.out, N * L, static_cast<size_t>(m.E), sh.out_layout.token, 1};
  } else {
    job.a = {concat, L, static_cast<size_t>(m.E), ws.concat_layout.token, 1};
    job.c = {sh.out, L, static_cast<size_t>(m.E), sh.out_layout.token, 1};
    job.batches = N;
    job.a_batch_stride = ws.concat_layout.batch;
    job.c_batch_stride = sh.out_layout.batch;
  }
  ParallelGemm(PoolOf(ctx), &job, 1, b + ws.scratch, ws.scratch_per_worker, TraceOf(ctx),
               b + ws.packed_w, ws.packed_w_bytes);
  return TakeDispatchError(ctx);
}

// ---------------------------------------------------------------------------------------------
// Per-head projections.

namespace {

Status CheckDense4(const TensorView& t, const char* name, int64_t a, int64_t b, int64_t c,
                   int64_t d) {
  const int64_t want[4] = {a, b, c, d};
  bool ok = t.present() && t.rank == 4 && t.dtype == DType::kF32 && t.IsContiguous();
  for (int i = 0; ok && i < 4; ++i) ok = t.shape[i] == want[i];
  if (!ok) {
    return InvalidArgument(std::string(name) + ": expected a dense f32 tensor [" + Str(a) + ", " +
                           Str(b) + ", " + Str(c) + ", " + Str(d) + "], got " + Dims(t));
  }
  return Status::Ok();
}

}  // namespace

Status MultiheadAttention::Impl::ValidateProject(const AttentionInputs& inputs,
                                                 const ProjectionOutputs& outputs,
                                                 Shapes* sh) const {
  AttentionInputs in = inputs;
  in.attn_mask = TensorView();
  in.key_padding_mask = TensorView();
  in.need_weights = false;
  Status s = Validate(in, nullptr, sh);
  if (!s.ok()) return s;
  s = CheckDense4(outputs.q, "q", sh->N, H, sh->L, hd);
  if (!s.ok()) return s;
  s = CheckDense4(outputs.k, "k", sh->N, KVH, sh->St, hd);
  if (!s.ok()) return s;
  return CheckDense4(outputs.v, "v", sh->N, KVH, sh->St, hd);
}

namespace {

// The GEMMs write straight into the caller's tensors: only per-worker packing buffers.
size_t ProjectWorkspaceBytes(size_t num_threads) {
  size_t per_worker = 0;
  RoundUpToAlignment(kernels::GemmScratchBytes(), &per_worker);
  return per_worker * std::max<size_t>(num_threads, 1);
}

}  // namespace

Status MultiheadAttention::PlanProject(const AttentionInputs& inputs,
                                       const ProjectionOutputs& outputs, size_t num_threads,
                                       size_t* workspace_bytes) const {
  if (workspace_bytes == nullptr) return InvalidArgument("PlanProject: workspace_bytes is null");
  Shapes sh;
  Status s = impl_->ValidateProject(inputs, outputs, &sh);
  if (!s.ok()) return s;
  *workspace_bytes = ArenaBytesFor(ProjectWorkspaceBytes(num_threads));
  return Status::Ok();
}

Status MultiheadAttention::Project(Context& ctx, const AttentionInputs& inputs,
                                   const ProjectionOutputs& outputs) const {
  const Impl& m = *impl_;
  Shapes sh;
  Status s = m.ValidateProject(inputs, outputs, &sh);
  if (!s.ok()) return s;
  const size_t bytes = ProjectWorkspaceBytes(ctx.num_threads());
  s = ReserveArena(ctx, bytes);
  if (!s.ok()) return s;
  ArenaOf(ctx).Reset();
  void* scratch = nullptr;
  s = ArenaOf(ctx).Allocate(bytes, &scratch, "projection workspace");
  if (!s.ok()) return s;
  const size_t scratch_stride = bytes / ctx.num_threads();
  const int64_t N = sh.N, hd = m.hd;
  // Tasks over (which in q/k/v, n, head): out[n, h] [T, hd] = X_n [T, in] x W_h^T + b_h.
  const int64_t heads[3] = {m.H, m.KVH, m.KVH};
  const SeqInput* xs[3] = {&sh.q, &sh.k, &sh.v};
  const WeightMatrix ws[3] = {m.w_q, m.w_k, m.w_v};
  const float* bs[3] = {m.b_q, m.b_k, m.b_v};
  float* outs[3] = {outputs.q.As<float>(), outputs.k.As<float>(), outputs.v.As<float>()};
  const int64_t rows_out[3] = {sh.L, sh.St, sh.St};
  const uint64_t per_kind = static_cast<uint64_t>(N) * m.H;  // upper bound over kinds
  PoolOf(ctx).ParallelFor(3 * per_kind, [&](uint64_t task, size_t worker) {
    const int kind = static_cast<int>(task / per_kind);
    const int64_t n = (task % per_kind) / m.H;
    const int64_t h = (task % per_kind) % m.H;
    if (h >= heads[kind]) return;
    const SeqInput& x = *xs[kind];
    float* dst = outs[kind] + ((n * heads[kind] + h) * rows_out[kind]) * hd;
    const kernels::ConstMatrixView a{x.data + n * x.layout.batch,
                       static_cast<size_t>(x.tokens), static_cast<size_t>(x.features),
                       x.layout.token, 1};
    const MatrixView c{dst, static_cast<size_t>(x.tokens), static_cast<size_t>(hd),
                       static_cast<ptrdiff_t>(hd), 1};
    MultiplyWeights(a, ws[kind].Rows(h * hd, x.features), static_cast<size_t>(hd),
                    bs[kind] != nullptr ? bs[kind] + h * hd : nullptr, c,
                    static_cast<uint8_t*>(scratch) + worker * scratch_stride);
    if (kind > 0) {
      int64_t p = sh.S;
      const float* extra = kind == 1 ? m.bias_k : m.bias_v;
      if (m.config.add_bias_kv) {
        std::memcpy(dst + p * hd, extra + h * hd, hd * sizeof(float));
        ++p;
      }
      if (m.config.add_zero_attn) std::memset(dst + p * hd, 0, hd * sizeof(float));
    }
  });
  return TakeDispatchError(ctx);
}

// ---------------------------------------------------------------------------------------------
// Loading from a safetensors file (the operator's entry; the parsing is runtime/weights.cc, which
// the fuzzer builds on its own).

Status MultiheadAttention::CreateFromSafeTensors(const std::string& path, const std::string& prefix,
                                                 const LoadOptions& options,
                                                 std::unique_ptr<MultiheadAttention>* out) {
  if (out == nullptr) return InvalidArgument("CreateFromSafeTensors: out is null");
  if (options.num_heads <= 0) {
    return InvalidArgument("options.num_heads: expected > 0, got " +
                           std::to_string(options.num_heads));
  }
  const DType st = options.weight_dtype;
  if (st != DType::kF32 && st != DType::kBF16 && st != DType::kF16) {
    return InvalidArgument(std::string("options.weight_dtype: expected F32, BF16 or F16, got ") +
                           DTypeName(st));
  }
  if (options.num_kv_heads < 0) {
    return InvalidArgument("options.num_kv_heads: expected >= 0 (0 = from the file), got " +
                           std::to_string(options.num_kv_heads));
  }
  SafeTensorsFile file;
  Status s = SafeTensorsFile::Open(path, &file);
  if (!s.ok()) return s;
  MhaWeights mw;
  s = LoadMhaWeights(file, prefix, &mw, st);
  if (!s.ok()) return s;
  const std::string where = path + " (prefix \"" + prefix + "\"): ";
  // Grouped-query layers: k/v have kvE = num_kv_heads * head_dim rows.
  int64_t kv_heads = options.num_heads;
  if (mw.kv_rows != mw.embed_dim) {
    const int64_t hd = mw.embed_dim % options.num_heads == 0 ? mw.embed_dim / options.num_heads : 0;
    if (hd == 0 || mw.kv_rows % hd != 0) {
      return FormatError(where + "tensor '" + prefix + "k_proj_weight': expected a multiple of " +
                         "head_dim (embed_dim " + std::to_string(mw.embed_dim) + " / num_heads " +
                         std::to_string(options.num_heads) + ") rows, got " +
                         std::to_string(mw.kv_rows));
    }
    kv_heads = mw.kv_rows / hd;
  }
  if (options.num_kv_heads != 0 && options.num_kv_heads != kv_heads) {
    return InvalidArgument(where + "options.num_kv_heads: expected " + std::to_string(kv_heads) +
                           " (k_proj_weight has " + std::to_string(mw.kv_rows) +
                           " rows) or 0, got " + std::to_string(options.num_kv_heads));
  }

  AttentionConfig c;
  c.embed_dim = mw.embed_dim;
  c.num_heads = options.num_heads;
  c.num_kv_heads = kv_heads;
  c.q_dim = mw.q_dim;
  c.kdim = mw.kdim;
  c.vdim = mw.vdim;
  c.bias = mw.bias;
  c.add_bias_kv = mw.add_bias_kv;
  c.add_zero_attn = options.add_zero_attn;
  c.batch_first = options.batch_first;
  c.scale = options.scale;
  c.weight_dtype = st;
  c.prepack = options.prepack;

  // Every weight matrix in the storage dtype: those the loader kept 16-bit are used as they
  // are; the others (f32, or the other 16-bit type) are converted here.
  std::vector<std::vector<uint8_t>> converted;
  auto as_storage = [&](const WeightTensor& t) -> const void* {
    if (t.dtype == st) return t.data();
    converted.emplace_back(t.size() * DTypeSize(st));
    ConvertWeights(t.data(), t.dtype, converted.back().data(), st, t.size());
    return converted.back().data();
  };
  converted.reserve(5);
  AttentionWeights w;
  w.dtype = st;
  // Separate projections keep PyTorch's one in_proj_bias [E + 2 kvE] in q, k, v order.
  std::vector<float> bias_qkv;
  w.qkv_layout = options.qkv_layout;
  if (mw.packed_in_proj) {
    w.in_proj_weight = as_storage(mw.in_proj_weight);
    if (mw.bias) w.in_proj_bias = mw.in_proj_bias.data();
  } else {
    w.q_proj_weight = as_storage(mw.w_q);
    w.k_proj_weight = as_storage(mw.w_k);
    w.v_proj_weight = as_storage(mw.w_v);
    if (mw.bias) {
      bias_qkv = mw.b_q;
      bias_qkv.insert(bias_qkv.end(), mw.b_k.begin(), mw.b_k.end());
      bias_qkv.insert(bias_qkv.end(), mw.b_v.begin(), mw.b_v.end());
      w.in_proj_bias = bias_qkv.data();
    }
  }
  if (mw.add_bias_kv) {
    w.bias_k = mw.bias_k.data();
    w.bias_v = mw.bias_v.data();
  }
  w.out_proj_weight = as_storage(mw.w_out);
  if (mw.bias) w.out_proj_bias = mw.b_out.data();
  // Copy: the loaded vectors are freed when this call returns.
  s = Create(c, w, WeightBinding::kCopy, out);
  if (!s.ok()) return Status(s.code(), where + s.message());
  return Status::Ok();
}

}  // namespace mha
