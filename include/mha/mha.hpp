// mha C++ API: multi-head attention with the semantics of torch.nn.MultiheadAttention.forward in
// eval mode, plus what PyTorch lacks (query input dim != embed_dim, per-head interleaved packed
// QKV weights, causal without a mask tensor, zeros for fully-masked rows, per-head Q/K/V access,
// grouped-query attention).
//
// Objects:
//   Context            threads (a pool created once, or the host's Executor) + an arena that
//                      serves every temporary of a forward pass. One context per application
//                      thread that calls forward.
//   MultiheadAttention a layer: configuration + weights (viewed or copied). Immutable after
//                      creation: one layer may be used by several threads at once, each with its
//                      own Context.
//
// Memory: Plan() returns the workspace bytes a forward needs; Forward() takes them from the
// context's arena. A context with an owned arena grows it (one heap allocation) when a larger
// plan arrives, then never allocates again for that size; a context over a caller-provided buffer
// never allocates and returns OutOfMemory naming the bytes needed when the buffer is too small.
// Forward performs no heap allocation in steady state.
//
// Errors: every call returns Status; on error, outputs are not written.
// Determinism: the same inputs give bitwise the same outputs for any thread count.
#ifndef MHA_MHA_HPP_
#define MHA_MHA_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mha/types.hpp"

namespace mha {

// The runtime's access to Context and MultiheadAttention internals (runtime/context_internal.h).
struct InternalAccess;

// A host application's thread pool, on which a Context runs its parallel loops instead of
// threads of its own (ContextOptions::executor). A context with an executor never starts a
// thread: every task of every entry point taking the context (Forward, Project, KvCache's Append,
// Forward and Step) runs inside ParallelFor.
//
// Contract (mha_executor in mha/mha.h is the same for C):
// - ParallelFor(n, task_fn, task_arg) runs task_fn(task_arg, t, w) exactly once for every task
//   t in [0, n), in any order, on any threads, as many at once as the host likes, and returns
//   only when all have finished (their writes visible to the returning thread, as any join or
//   mutex gives). n >= 1. `w` is the worker running the task: w < num_workers(), and no two
//   tasks with the same w may run at the same time (w selects mha's per-worker scratch). Which
//   thread carries which w may change from task to task and from call to call.
// - mha calls ParallelFor from the thread that called the entry point, one call at a time per
//   context (never from inside a task), and blocks in it. Whether that thread takes part is the
//   host's choice: it may run tasks itself (a serial executor runs them all, as worker 0) or
//   wait for its workers. A host that calls mha from inside one of its own tasks needs a
//   ParallelFor that does not wait for the worker it is running on (e.g. lets the calling
//   thread run tasks too).
// - Results do not depend on the executor: the split of the work may follow num_workers() (as
//   it follows an owned pool's thread count), the results never do, and a task's result
//   depends only on its index, never on `w` or on the thread running it. Outputs are bitwise
//   identical to those of a context with its own pool, of any thread count.
// - Tasks never fail and never throw: every argument is validated and all memory reserved
//   before the first task is handed out, and task_fn is noexcept (nothing propagates through
//   the host's frames). The only error a dispatch can raise is the host's: a worker index
//   >= num_workers(), two tasks running at once on one worker index, a task index >= n, or
//   ParallelFor returning after fewer or more task calls than n. mha detects these, does not run
//   the offending task (its scratch would be shared), runs no further dispatch in that call,
//   and the entry point returns InvalidArgument naming the breach; its outputs (and a KV
//   cache's contents) are then unspecified.
// - num_workers() (1..1024) is read once, when the context is created.
class MHA_API Executor {
 public:
  // One task: `task` in [0, n), `worker` in [0, num_workers()).
  using TaskFn = void (*)(void* task_arg, uint64_t task, size_t worker);
  virtual ~Executor() = default;
  virtual size_t num_workers() const = 0;
  virtual void ParallelFor(uint64_t num_tasks, TaskFn task_fn, void* task_arg) = 0;
};

// Whether a context runs the grouped forward (ContextOptions::grouped_forward).
enum class GroupedForward : int {
  kAuto = 0,  // where its rule (ContextOptions::group_rows) says so
  kOff = 1,   // never: every forward runs stage by stage over the whole batch
};

// The kernel of Compute::kBF16 products (ContextOptions::bf16_kernel; README "bf16 compute").
// Every kernel gives the same results to rounding (its f32 sums run in its own order).
enum class Bf16KernelChoice : int {
  kAuto = 0,        // the fastest this CPU runs (amx, avx512_bf16, neon_bf16, else emulated), or
                    // MHA_BF16_KERNEL=<name> from the environment when this CPU runs that one
  kEmulated = 1,    // bf16-rounded operands, f32 FMAs on the Highway target: every CPU
  kAvx512Bf16 = 2,  // AVX512_BF16 (vdpbf16ps)
  kAmx = 3,         // AMX-BF16 tiles (Linux grants the tiles at the first context)
  kNeonBf16 = 4,    // Arm BF16 (bfmmla)
};

struct ContextOptions {
  // Threads used by forward passes, counting the calling thread; 0 = all hardware threads.
  // With an executor: 0 or executor->num_workers(). The context's own threads poll for work
  // while a call runs (up to 2 ms while its stages' last tasks run) and for 50 us after it, then
  // sleep: between calls they use no CPU.
  size_t num_threads = 0;
  // Caller-provided arena memory (not owned; must outlive the context). When null the context
  // owns its arena, starting at `arena_bytes` (0 = grow on first use).
  void* arena_buffer = nullptr;
  size_t arena_bytes = 0;
  // The host's thread pool (see Executor; not owned; must outlive the context). Null: the
  // context creates a pool of num_threads threads of its own.
  Executor* executor = nullptr;
  // The grouped forward of short sequences: with an output that shares no memory with the
  // inputs, f32 compute and prepacked weights, batch entries run in groups of ceil(group_rows / L)
  // entries, each group on one worker from its input projections to its output rows, when the
  // group's buffers (Q, K, V, results; f32) take at most group_max_bytes and the groups keep every
  // worker busy. Same results bitwise as the stage-by-stage forward. 0 = the default: 256 rows
  // and 1.5 x the core's L2 (or MHA_GROUP_ROWS / MHA_GROUP_MAX_KIB from the environment).
  GroupedForward grouped_forward = GroupedForward::kAuto;
  size_t group_rows = 0;
  size_t group_max_bytes = 0;
  // The kernel of this context's Compute::kBF16 products; a named kernel must be one this CPU
  // runs (Create returns InvalidArgument otherwise).
  Bf16KernelChoice bf16_kernel = Bf16KernelChoice::kAuto;
};

class MHA_API Context {
 public:
  static Status Create(const ContextOptions& options, std::unique_ptr<Context>* out);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Threads of the context's own pool, or its executor's num_workers().
  size_t num_threads() const;
  // Bytes of arena memory available / used at most so far.
  size_t arena_capacity() const;
  size_t arena_high_water() const;
  // The kernel this context's Compute::kBF16 products run on ("amx", "avx512_bf16",
  // "neon_bf16" or "emulated"; ContextOptions::bf16_kernel).
  const char* bf16_kernel() const;

 private:
  struct Impl;  // threads, arena, trace hook: runtime/context_internal.h
  explicit Context(std::unique_ptr<Impl> impl);
  friend struct InternalAccess;
  std::unique_ptr<Impl> impl_;
};

// Order of the rows of a packed in_proj_weight [3 * E, in] (and in_proj_bias [3 * E]).
enum class QkvLayout : int {
  kPyTorch = 0,  // all q rows, then all k rows, then all v rows (nn.MultiheadAttention)
  kPerHead = 1,  // for each head h: its head_dim q rows, k rows, v rows (a Linear(in, 3E) whose
                 // output is reshaped to [..., heads, 3 * head_dim] and chunked)
};

// Whether an f32 layer keeps a second copy of its projection weights in the layout this CPU's
// matrix kernels read (AttentionConfig::prepack). Ignored for 16-bit and quantized weights. Any
// choice gives the same results to rounding (the products sum in another order), each bitwise
// independent of the thread count.
enum class WeightPrepack : int {
  kOn = 0,        // the default: about the f32 weights' bytes again (E = 1024: 16 MiB, also for
                  // a kView layer; a kCopy layer may keep only this, see WeightBinding); no
                  // forward repacks weights, fastest for short inputs/decode
  kOff = 1,       // no copy: the least memory, slower projections
  kPlain = 2,     // the same as kOn
  kStrassen = 3,  // opt-in: kOn plus 1.75x the bytes of each large matrix (>= 512 inputs, >= 256
                  // outputs) again; products of >= 64 tokens do 7/8 of the multiplications, with
                  // a few times kOn's rounding error (~1e-6 relative on unit-scale data). Its
                  // speed depends on the CPU: measure before choosing it
};

// Rotary position embedding of q and k (README "Attention variants": exact formulas).
enum class RopeStyle : int {
  kNone = 0,
  kNeox = 1,  // pairs (x_i, x_{i + rd/2}): HF rotate_half (Llama, Mistral, Qwen, Gemma, Phi)
  kGptj = 2,  // pairs (x_{2i}, x_{2i+1}): GPT-J rotate_every_two (and Meta's Llama checkpoints)
};

// How RoPE's frequencies are scaled for long contexts (README "RoPE scaling" gives each formula;
// they follow transformers' modeling_rope_utils.py). kDynamic and kLongRope depend on the
// sequence length, seq_len = the call's largest position + 1 (a forward's, or a decode step's:
// cached keys keep the rotation they were stored with, as transformers' cache does).
enum class RopeScaling : int {
  kNone = 0,
  kLinear = 1,    // positions divided by rope_factor (the same as rope_scale)
  kDynamic = 2,   // NTK-aware: base scaled once seq_len > rope_original_max_positions
  kLlama3 = 3,    // Llama 3.1: low frequencies divided by rope_factor, a smooth band between
  kYarn = 4,      // YaRN: per-frequency blend of interpolation and extrapolation, cos/sin scaled
  kLongRope = 5,  // Phi-3: per-frequency short/long factors (AttentionWeights), cos/sin scaled
};

// Projections that add a bias (AttentionConfig::bias_projections).
enum ProjectionBias : uint32_t {
  kBiasQ = 1,
  kBiasK = 2,
  kBiasV = 4,
  kBiasOut = 8,
  kBiasAll = 15,
};

// Arithmetic of the layer's matrix products (README "bf16 compute").
enum class Compute : int {
  kF32 = 0,   // f32 products (16-bit weights widened exactly): the results stated above
  kBF16 = 1,  // the products' inputs rounded to bf16 (activations, the weights, the softmax's
              // probabilities), each product of two bf16 exact, sums in f32; softmax, masks and
              // the attention variants in f32; outputs f32. Native bf16 dot products where the
              // CPU has them (AMX, AVX512_BF16, Arm BF16), the same arithmetic emulated
              // elsewhere. The layer holds its weights once more in bf16 (half their f32
              // bytes) instead of the f32 prepacking (a kCopy layer with head_dim a multiple of
              // 32 holds only that). Error against float64 on the f32 inputs:
              // measured at most 1.9e-2 of the output's largest magnitude over 3,000 random
              // configurations, typically 5e-3 (tested bound 3e-2);
              // README "bf16 compute". With quantized weights (kI8 / kI4) the products of more
              // than 16 rows (prefill, forward) multiply bf16 of the dequantized weights,
              // dequantized per block as they run (no bf16 copy held); products of 16 rows or
              // fewer (decode) read the codes in f32 as kF32 does
  kInt8 = 2,  // quantized weights only (weight_dtype kI8 / kI4, else InvalidArgument): each row
              // of a projection's activations quantized to int8 as the product runs (symmetric,
              // per block of 32 inputs, or of weight_block for kI4; round to nearest even),
              // integer dot products summed exactly per block, then scaled and summed in f32
              // in one fixed order, so every CPU and target gives the same bits (AVX-512 VNNI
              // VPDPBUSD where the CPU has it). Attention (scores, softmax, P V) and the KV cache
              // stay f32. Error: the weights' plus the activations' rounding; README "Quantized
              // weights" states it as measured. Inputs of about a million features per projection
              // at most (one quantized row must fit a worker's GEMM scratch, sized by the CPU's
              // GEMM blocking: 1.4 M on Zen 4); wider: InvalidArgument at create
};

struct AttentionConfig {
  int64_t embed_dim = 0;     // E: model width, output width
  int64_t num_heads = 0;     // H: E % H == 0 when head_dim is 0 (then head_dim = E / H)
  int64_t num_kv_heads = 0;  // grouped-query attention: H % num_kv_heads == 0; 0 = num_heads
  int64_t q_dim = 0;         // query input features; 0 = E (nn.MultiheadAttention requires E)
  int64_t kdim = 0;          // key input features; 0 = E
  int64_t vdim = 0;          // value input features; 0 = E
  bool bias = true;          // in_proj and out_proj biases
  bool add_bias_kv = false;  // bias_k, bias_v appended as one more key/value position
  bool add_zero_attn = false;  // a zero key/value position appended (after bias_kv)
  bool batch_first = false;  // batched inputs are [N, L, features] instead of [L, N, features]
  float scale = 0.0f;        // score scale; 0 = 1 / sqrt(head_dim)
  // How the layer stores its four projection matrices: kF32, or kBF16 / kF16 for half the
  // memory and half the bytes streamed per decoded token. Arithmetic is f32 either way (16-bit
  // weights are widened exactly inside the products), so a 16-bit layer computes exactly what
  // an f32 layer holding the rounded weights computes with prepack kOff; the only error is the
  // weights' rounding (relative 2^-9 per bf16 element, 2^-11 per f16 element). Biases stay f32.
  // kI8 / kI4: quantized once at creation (WeightBinding::kCopy only; compute kF32, kBF16 for
  // bf16 prefill products, or kInt8 for int8 activations) from the given f32/bf16/f16 weights,
  // symmetric, round to nearest even: kI8 one f32 scale per output row (max|w| / 127, codes in
  // [-127, 127]), kI4 one per block of weight_block consecutive inputs of a row (max|w| / 7,
  // codes in [-7, 7]); the layer then holds only the codes and scales (about 1/4 and 5/32 of
  // the f32 bytes at block 32), and with kF32 computes in f32 what an f32 layer holding the
  // dequantized weights (code * scale, rounded to f32) computes with prepack kOff. The weights
  // must be finite. README "Quantized weights".
  DType weight_dtype = DType::kF32;
  // kI4: inputs per scale, 32 or 128 (0 = 32); must be 0 for every other weight_dtype.
  int64_t weight_block = 0;
  // Memory against speed of the projections: see WeightPrepack (ignored with kBF16 compute).
  WeightPrepack prepack = WeightPrepack::kOn;
  // f32 (the default), bf16 or int8-activation products: see Compute.
  Compute compute = Compute::kF32;

  // Attention variants (README "Attention variants" gives each formula and the models it
  // matches). Every field at its zero value is off, and the layer computes exactly what it did
  // without them. With s = scale * q.k, the order is: QK-norm, RoPE, s, softcap, ALiBi and the
  // masks, then softmax over the visible keys and the sink.
  RopeStyle rope = RopeStyle::kNone;
  float rope_theta = 0.0f;  // RoPE base; 0 = 10000
  int64_t rotary_dim = 0;   // rotated components per head: even, <= head_dim; 0 = head_dim
  float rope_scale = 0.0f;  // linear position interpolation: angles use p / rope_scale; 0 = 1
  // ALiBi: s -= m_h * |p_i - p_j| with the ALiBi paper's slopes (m_h = 2^(-8(h+1)/H) for H a
  // power of two), or AttentionWeights::alibi_slopes when given.
  bool alibi = false;
  // Sliding window of W positions: with causal, key j is visible to query i iff
  // p_i - W < p_j <= p_i (W keys, itself included: HF's sliding_window = W; README "Sliding
  // window" relates it to ONNX Runtime's local_window_size); without causal iff
  // |p_i - p_j| < W. 0 = no window.
  int64_t window = 0;
  float softcap = 0.0f;      // > 0: s = softcap * tanh(s / softcap), before ALiBi and masks
  float qk_norm_eps = 0.0f;  // QK-norm's RMSNorm epsilon; 0 = 1e-6 (OLMo 2 uses 1e-5)
  // QK-norm weights span the whole projection ([E] for q, [kvE] for k, one RMS per token: OLMo
  // 2) instead of one head ([head_dim], one RMS per token and head: Qwen3, Gemma 3).
  bool qk_norm_whole = false;

  // Per-head width; 0 = embed_dim / num_heads. The attention width A = num_heads * head_dim
  // may differ from embed_dim (Gemma, Qwen3, gpt-oss): q_proj [A, q_dim], k/v_proj [kvH *
  // head_dim, kdim / vdim], out_proj [E, A]; q_dim, kdim and vdim still default to E.
  int64_t head_dim = 0;
  // 0: `bias` decides (all four projections or none). Else the biased projections, a mask of
  // ProjectionBias (Qwen2: q | k | v; Whisper: q | v | out), and `bias` is ignored.
  uint32_t bias_projections = 0;

  // RoPE scaling (see RopeScaling; 0 in a field = that type's default, as in transformers).
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_factor = 0.0f;                  // the scaling factor (linear, dynamic, llama3, yarn)
  int64_t rope_original_max_positions = 0;   // original_max_position_embeddings
  float rope_low_freq_factor = 0.0f;         // llama3
  float rope_high_freq_factor = 0.0f;        // llama3
  float rope_beta_fast = 0.0f;               // yarn; 0 = 32
  float rope_beta_slow = 0.0f;               // yarn; 0 = 1
  float rope_attention_factor = 0.0f;        // yarn, longrope: cos and sin scaled; 0 = default
  bool rope_no_truncate = false;             // yarn: keep the correction range unrounded
};

// Weights in nn.Linear layout ([out_features, in_features], row-major). kvE = num_kv_heads *
// head_dim (= E without grouped-query attention). Give either the packed in_proj_weight (only
// when q_dim == kdim == vdim and kvE == E) or the three separate ones. The four projection
// matrices are arrays of `dtype` (f32, or bf16/f16 bits as uint16_t); biases are always f32.
// With WeightBinding::kView, dtype must equal the config's weight_dtype (the layer uses the
// arrays as they are); kCopy converts (f32 -> 16-bit rounds to nearest even).
struct AttentionWeights {
  DType dtype = DType::kF32;              // kF32, kBF16 or kF16: the element type of the
                                          // *_weight arrays below
  const void* in_proj_weight = nullptr;   // [3E, q_dim], rows ordered by `qkv_layout`
  const float* in_proj_bias = nullptr;    // [3E], same order (when bias)
  QkvLayout qkv_layout = QkvLayout::kPyTorch;
  const void* q_proj_weight = nullptr;    // [E, q_dim]
  const void* k_proj_weight = nullptr;    // [kvE, kdim]
  const void* v_proj_weight = nullptr;    // [kvE, vdim]
  // Separate-weight biases: PyTorch keeps one in_proj_bias [E + 2 kvE] even with separate weights;
  // when in_proj_weight is null, in_proj_bias (if given) is that tensor, in q, k, v order.
  const float* bias_k = nullptr;           // [kvE] (add_bias_kv)
  const float* bias_v = nullptr;           // [kvE] (add_bias_kv)
  const void* out_proj_weight = nullptr;   // [E, E]
  const float* out_proj_bias = nullptr;    // [E] (when bias)
  // Attention variants (see AttentionConfig); f32, copied at creation whatever the binding.
  const float* sinks = nullptr;          // [H]: one logit per head joining each softmax row
  const float* alibi_slopes = nullptr;   // [H]: ALiBi slopes (needs config.alibi)
  const float* q_norm_weight = nullptr;  // [head_dim] ([E] with qk_norm_whole): QK-norm of q
  const float* k_norm_weight = nullptr;  // [head_dim] ([kvE] with qk_norm_whole): of k
  // Separate biases ([A], [kvE], [kvE]) instead of in_proj_bias, when the weights are separate.
  const float* q_proj_bias = nullptr;
  const float* k_proj_bias = nullptr;
  const float* v_proj_bias = nullptr;
  // RopeScaling::kLongRope: [rotary_dim / 2] per-frequency factors (copied).
  const float* rope_short_factor = nullptr;
  const float* rope_long_factor = nullptr;
};

enum class WeightBinding : int {
  kView = 0,  // the layer points at the caller's arrays: they must outlive it, unchanged
  kCopy = 1,  // the layer copies the weights at creation; once they are prepacked (WeightPrepack,
              // Compute::kBF16) it frees the copy where every product reads the packing (x86
              // AVX2/AVX-512 with head_dim a multiple of 16; bf16 compute: of 32). README
              // "Prepacked weights"
};

// Inputs of one forward pass. Batched: query [L, N, q_dim] ([N, L, q_dim] if batch_first), key
// [S, N, kdim], value [S, N, vdim]. Unbatched: query [L, q_dim], key [S, kdim], value [S, vdim].
// Views may be strided, but the last dimension must be contiguous (stride 1), all f32.
struct AttentionInputs {
  TensorView query;
  TensorView key;    // absent: self-attention, key = query
  TensorView value;  // absent: value = key
  // Optional. [L, S] or [N * num_heads, L, S]; bool/u8 (nonzero = NOT allowed to attend, as
  // nn.MultiheadAttention) or f32 (added to the scaled scores; -inf masks).
  TensorView attn_mask;
  // Optional. [N, S] ([S] unbatched); bool/u8 (nonzero = ignore this key) or f32 (added).
  TensorView key_padding_mask;
  // Mask key j for query i when j > i (top-left aligned, as torch's is_causal), without building
  // a mask. Combines with the masks above. Positions added by add_bias_kv / add_zero_attn are
  // never masked (PyTorch pads masks with "allowed" there).
  bool causal = false;
  bool need_weights = false;
  bool average_attn_weights = true;  // weights averaged over heads: [N, L, S'] else [N, H, L, S']
  // Optional token positions for RoPE, ALiBi and the window, kI32 or kI64 values in [0, 2^31):
  // positions [N, L] ([L] shared by the batch, or unbatched) for the queries, key_positions
  // [N, S] / [S] for the keys. Absent: queries 0..L-1; keys share the query positions in
  // self-attention (key absent) and are 0..S-1 otherwise. causal stays index based (j <= i).
  TensorView positions;
  TensorView key_positions;
};

// Outputs: `output` has the query's layout with E features ([L, N, E], [N, L, E] or [L, E]).
// `attn_weights` (required iff need_weights) is [N, L, S'] averaged or [N, H, L, S'] per head
// (unbatched: [L, S'] / [H, L, S']), S' = S + add_bias_kv + add_zero_attn. Last dims contiguous.
// A query row with no allowed key gets all-zero weights and a zero attention result (so its
// output row is out_proj_bias); PyTorch returns NaN there.
struct AttentionOutputs {
  TensorView output;
  TensorView attn_weights;
};

// Per-head projections (Project): q [N, H, L, hd], k and v [N, kvH, S', hd], dense f32 (N = 1 for
// unbatched inputs). k and v include the bias_kv / zero-attention positions. q and k are as
// attention uses them: QK-norm then RoPE applied (at AttentionInputs::positions /
// key_positions, or the default positions); the appended positions and v are as projected.
struct ProjectionOutputs {
  TensorView q;
  TensorView k;
  TensorView v;
};

// What a state_dict cannot tell: nn.MultiheadAttention's constructor arguments that leave no
// tensor behind, plus mha's own options.
struct LoadOptions {
  int64_t num_heads = 0;  // required: > 0 and dividing embed_dim
  bool add_zero_attn = false;
  bool batch_first = false;
  float scale = 0.0f;  // 0 = 1 / sqrt(head_dim)
  QkvLayout qkv_layout = QkvLayout::kPyTorch;  // row order of a packed in_proj_weight
  // Storage of the layer's weight matrices (AttentionConfig::weight_dtype): kF32, kBF16, kF16,
  // kI8 or kI4. Tensors stored in the file in that 16-bit dtype are kept as they are (never
  // widened to f32 and rounded back); others are converted. kI8 / kI4 quantize the tensors as
  // stored (16-bit ones are not widened first).
  DType weight_dtype = DType::kF32;
  int64_t weight_block = 0;  // AttentionConfig::weight_block
  // Key/value heads of a grouped-query layer (k_proj_weight / v_proj_weight with kvE =
  // num_kv_heads * head_dim rows); 0 = inferred from those rows. Must agree with them.
  int64_t num_kv_heads = 0;
  // AttentionConfig::prepack of the created layer.
  WeightPrepack prepack = WeightPrepack::kOn;
  // AttentionConfig::compute of the created layer.
  Compute compute = Compute::kF32;
  // The variants' settings a state_dict cannot tell (AttentionConfig's fields of those names).
  // Their tensors are read when present: prefix + sinks [H], alibi_slopes [H] (sets alibi),
  // q_norm.weight and k_norm.weight ([head_dim] per head; [E] and [kvE] set qk_norm_whole).
  RopeStyle rope = RopeStyle::kNone;
  float rope_theta = 0.0f;
  int64_t rotary_dim = 0;
  float rope_scale = 0.0f;
  bool alibi = false;
  int64_t window = 0;
  float softcap = 0.0f;
  float qk_norm_eps = 0.0f;
  // Gemma's RMSNorm scales by (1 + w): add 1 to the stored q/k norm weights.
  bool qk_norm_add_one = false;
};

// Options of CreateFromHuggingFace: what the checkpoint does not decide.
struct HfOptions {
  // Storage of the layer's matrices (kF32, kBF16, kF16, or quantized kI8 / kI4 from the stored
  // tensors one row at a time, with binding kCopy), and AttentionConfig::weight_block.
  DType weight_dtype = DType::kF32;
  int64_t weight_block = 0;
  Compute compute = Compute::kF32;
  WeightPrepack prepack = WeightPrepack::kOn;
  // kView: the layer views the mapped checkpoint (and keeps it mapped) where a stored tensor is
  // usable as it is; kCopy copies (16-bit tensors of weight_dtype are never widened to f32).
  WeightBinding binding = WeightBinding::kCopy;
  bool batch_first = true;  // inputs [N, L, hidden]
  // Non-empty: the attention module by its state_dict prefix, with its trailing dot (e.g.
  // "model.decoder.layers.0.encoder_attn."), instead of layer_index's self-attention.
  std::string prefix;
};

// What CreateFromHuggingFace found.
struct HfLayerInfo {
  std::string model_type;        // config.json's model_type
  std::string prefix;            // the state_dict prefix of the module read
  int64_t hidden_size = 0;       // input and output width
  bool causal = false;           // decoder self-attention: run with AttentionInputs::causal
  bool cross_attention = false;  // keys and values from another sequence (Whisper encoder_attn)
};

class MHA_API MultiheadAttention {
 public:
  static Status Create(const AttentionConfig& config, const AttentionWeights& weights,
                       WeightBinding binding, std::unique_ptr<MultiheadAttention>* out);
  // Loads nn.MultiheadAttention state_dict tensors named prefix + {in_proj_weight,
  // in_proj_bias, q/k/v_proj_weight, out_proj.weight, out_proj.bias, bias_k, bias_v} from a
  // safetensors file (F32, F16 or BF16; weights stored as options.weight_dtype, biases widened
  // exactly to f32) and creates a layer owning a copy. Grouped-query layers: k/v_proj_weight
  // (and their biases, bias_k, bias_v) with kvE rows. `prefix` includes its trailing dot ("encoder.layers.3.self_attn."). embed_dim, q_dim,
  // kdim, vdim, bias and add_bias_kv come from the tensors. Errors: IoError (cannot open),
  // FormatError (malformed file, missing or inconsistent tensors), Unsupported (a non-float
  // dtype), InvalidArgument (options). The file is not kept open.
  static Status CreateFromSafeTensors(const std::string& path, const std::string& prefix,
                                      const LoadOptions& options,
                                      std::unique_ptr<MultiheadAttention>* out);
  // Loads the attention of layer `layer_index` (its self-attention; the decoder's in an
  // encoder-decoder model) from a Hugging Face checkpoint folder as transformers writes it:
  // config.json and model.safetensors, or shards named by model.safetensors.index.json. Every
  // setting comes from config.json (README "Hugging Face checkpoints" lists the families);
  // only the layer's tensors are read. Errors: IoError (a file cannot be read), FormatError
  // (malformed config or checkpoint, tensors that disagree with the config), Unsupported (a
  // model_type or setting mha cannot honour, named), InvalidArgument (arguments).
  static Status CreateFromHuggingFace(const std::string& dir, int64_t layer_index,
                                      const HfOptions& options,
                                      std::unique_ptr<MultiheadAttention>* out,
                                      HfLayerInfo* info = nullptr);
  ~MultiheadAttention();
  MultiheadAttention(const MultiheadAttention&) = delete;
  MultiheadAttention& operator=(const MultiheadAttention&) = delete;

  const AttentionConfig& config() const;
  int64_t head_dim() const;

  // Validates every shape and returns the arena bytes Forward needs on `num_threads` threads
  // (workspace grows with threads, not with S^2 x heads x batch). The figure depends on shapes,
  // dtypes, which inputs are present, flags and threads only: it suffices for every forward
  // with those, whatever the pointers and strides (in place or not) and wherever a
  // caller-provided arena buffer of that many bytes starts (it counts the 63 bytes of alignment
  // slack). An output that shares memory with an input takes the larger of the two workspaces
  // it may need; the plan is their maximum.
  Status Plan(const AttentionInputs& inputs, const AttentionOutputs& outputs, size_t num_threads,
              size_t* workspace_bytes) const;
  // Runs one forward pass on the context's pool, with temporaries from its arena. Long
  // sequences without weights keep running sums in `output` until the pass ends when it shares
  // no memory with an input (else in the workspace; validation errors leave it unwritten).
  Status Forward(Context& context, const AttentionInputs& inputs,
                 const AttentionOutputs& outputs) const;

  // Runs only the input projections and writes per-head Q, K, V (see ProjectionOutputs).
  // Masks, causal and need_weights in `inputs` are ignored. PlanProject's bytes hold for any
  // pointers and any buffer alignment, as Plan's.
  Status PlanProject(const AttentionInputs& inputs, const ProjectionOutputs& outputs,
                     size_t num_threads, size_t* workspace_bytes) const;
  Status Project(Context& context, const AttentionInputs& inputs,
                 const ProjectionOutputs& outputs) const;

 private:
  struct Impl;  // resolved configuration and bound weights: runtime/attention.cc
  explicit MultiheadAttention(std::unique_ptr<Impl> impl);
  friend struct InternalAccess;
  std::unique_ptr<Impl> impl_;
};

// Library version ("0.5.0"), the Highway target the kernels dispatch to on this CPU ("AVX3_DL"),
// the BLIS architecture configuration in use ("skx"), and the kernel Compute::kBF16 products run
// on ("amx", "avx512_bf16", "neon_bf16", or "emulated": bf16-rounded operands and f32 FMAs on
// the Highway target; MHA_BF16_KERNEL=<name> in the environment chooses another available one):
// the kernel of contexts whose ContextOptions::bf16_kernel is kAuto.
MHA_API const char* Version();
MHA_API const char* SimdTarget();
MHA_API const char* BlasArch();
MHA_API const char* Bf16Kernel();

}  // namespace mha

#endif  // MHA_MHA_HPP_
