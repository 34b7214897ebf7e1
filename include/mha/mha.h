/* mha C API: multi-head attention with the semantics of torch.nn.MultiheadAttention.forward in
 * eval mode, for C99 and C++ callers (no C++ types cross this header). It is a thin layer over
 * the C++ API in mha/mha.hpp; see that header for the full semantics (shapes, masks, fully
 * masked rows, grouped-query attention, per-head packed QKV weights).
 *
 * Objects (opaque handles):
 *   mha_context  threads (a pool created once, or the host's mha_executor) + an arena that
 *                serves every temporary of a forward pass. Used by ONE thread at a time; give
 *                each application thread that runs forward passes its own context.
 *   mha_layer    a layer: configuration + weights (viewed or copied). Immutable after creation:
 *                one layer may be used concurrently by several threads, each with its own
 *                context.
 *
 * Ownership and lifetimes:
 *   - mha_*_create functions allocate a handle the caller frees with the matching
 *     mha_*_destroy (which accepts NULL). On error *out is left untouched.
 *   - A layer created with MHA_WEIGHTS_VIEW points at the caller's weight arrays: they must stay
 *     valid and unchanged until mha_layer_destroy. MHA_WEIGHTS_COPY copies them at creation, so
 *     the caller may free them right away. Layers loaded from a file own their weights.
 *   - A context over a caller-provided arena buffer (mha_context_options.arena_buffer) borrows
 *     it: the buffer must outlive the context; the context never allocates and forward fails
 *     with MHA_STATUS_OUT_OF_MEMORY (naming the bytes needed) when it is too small.
 *   - mha_tensor structs only describe caller memory; mha never keeps a pointer to a tensor
 *     after the call returns.
 *   - Strings returned by mha_version, mha_simd_target, mha_blas_arch and mha_status_name are
 *     static. The string returned by mha_last_error_message stays valid until the calling
 *     thread's next mha_* call.
 *
 * Errors: every fallible function returns an mha_status (the values of mha::StatusCode). On
 * failure nothing is written to any output (handles, tensors, sizes). The message describing the
 * most recent call is thread-local: mha_last_error_message() returns the calling thread's last
 * message ("" when its last mha_* call succeeded), so threads never see each other's errors.
 * A NULL pointer where one is required is never dereferenced: the call returns
 * MHA_STATUS_INVALID_ARGUMENT with a message naming the argument. No function lets a C++
 * exception escape (allocation failure maps to MHA_STATUS_OUT_OF_MEMORY).
 *
 * Options structs (mha_context_options, mha_layer_config, mha_layer_weights, mha_load_options,
 * mha_kv_cache_options): a zero-initialized struct ({0} or memset) means every default; set
 * only the fields you need (each struct names its required ones).
 *
 * Thread-safety: everything is safe to call concurrently except that one mha_context must not
 * be used by two threads at the same time (and must not be destroyed while in use). Creating
 * and destroying different handles from different threads is safe.
 */
#ifndef MHA_MHA_H_
#define MHA_MHA_H_

#include <stddef.h>
#include <stdint.h>

/* Same definition as in mha/types.hpp, so both headers may be included in either order. */
#ifndef MHA_API
#if defined(_WIN32)
#define MHA_API __declspec(dllexport)
#else
#define MHA_API __attribute__((visibility("default")))
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the values of mha::StatusCode. */
typedef enum mha_status {
  MHA_STATUS_OK = 0,
  MHA_STATUS_INVALID_ARGUMENT = 1, /* a caller-supplied value is out of its documented range */
  MHA_STATUS_OUT_OF_MEMORY = 2,    /* an arena or allocation could not hold the request */
  MHA_STATUS_IO_ERROR = 3,         /* a file could not be opened, read or mapped */
  MHA_STATUS_FORMAT_ERROR = 4,     /* a file's contents are malformed */
  MHA_STATUS_UNSUPPORTED = 5,      /* valid but not implemented (e.g. a weight dtype) */
  MHA_STATUS_INTERNAL = 6          /* a broken invariant inside mha: a bug */
} mha_status;

/* Element types (the values of mha::DType). Inputs, outputs and weights are F32. Masks are BOOL
 * or U8 (1 byte; nonzero = masked out, as nn.MultiheadAttention) or F32 (added to the scaled
 * scores; -INFINITY masks). */
typedef enum mha_dtype {
  MHA_DTYPE_F32 = 0,
  MHA_DTYPE_BF16 = 1,
  MHA_DTYPE_F16 = 2,
  MHA_DTYPE_BOOL = 3,
  MHA_DTYPE_U8 = 4,
  MHA_DTYPE_I8 = 5,  /* KV-cache storage (mha_kv_cache_options.dtype), quantized weights */
  MHA_DTYPE_I32 = 6, /* token positions (mha_attention_inputs.positions) */
  MHA_DTYPE_I64 = 7,
  MHA_DTYPE_I4 = 8   /* quantized weights only (mha_layer_config.weight_dtype) */
} mha_dtype;

#define MHA_MAX_RANK 4

/* Enumerated values travel in int32_t fields and parameters (not the enum types): a C caller may
 * store any integer there, and mha rejects out-of-range values with INVALID_ARGUMENT, which C++
 * could not do safely for an out-of-range value of an enum type. */

/* A description of caller memory: `rank` (1..4) dimensions, outermost first; shape and strides
 * in elements (not bytes). All strides zero means dense row-major. Otherwise strides must be
 * >= 0, and the last dimension of every tensor must be contiguous (stride 1). data == NULL means
 * "absent" for optional tensors. Zero-initialize and fill in data, dtype, rank and shape. */
typedef struct mha_tensor {
  void* data;
  int32_t dtype; /* an mha_dtype */
  int32_t rank;
  int64_t shape[MHA_MAX_RANK];
  int64_t strides[MHA_MAX_RANK];
} mha_tensor;

/* ---- Library information ------------------------------------------------------------------ */

/* The library version, e.g. "0.6.0". */
MHA_API const char* mha_version(void);
/* The Highway target the kernels dispatch to on this CPU, e.g. "AVX2", "AVX3_DL", "NEON". */
MHA_API const char* mha_simd_target(void);
/* The BLIS architecture configuration in use, e.g. "haswell", "skx", "zen3". */
MHA_API const char* mha_blas_arch(void);
/* The kernel MHA_COMPUTE_BF16 products run on in a context whose options name none: "amx",
 * "avx512_bf16", "neon_bf16" or "emulated" (see mha::Bf16Kernel; mha_context_bf16_kernel). */
MHA_API const char* mha_bf16_kernel(void);
/* "OK", "InvalidArgument", ... for an mha_status value; "Unknown" for any other value. */
MHA_API const char* mha_status_name(int32_t status);
/* The calling thread's message for its most recent mha_* call: "" after a success, otherwise
 * one line naming the function, the argument, the expected and the actual value. Never NULL. */
MHA_API const char* mha_last_error_message(void);

/* ---- Context --------------------------------------------------------------------------------- */

typedef struct mha_context mha_context;

/* One task of a parallel loop: `task` in [0, n_tasks), `worker` in [0, num_workers). */
typedef void (*mha_task_fn)(void* task_arg, uint64_t task, size_t worker);

/* A host application's thread pool, on which a context runs its parallel loops instead of
 * threads of its own (mha_context_options.executor); mha::Executor in mha/mha.hpp is the same
 * for C++. A context with an executor never starts a thread.
 *
 * Contract:
 *   - parallel_for(user, n_tasks, task_fn, task_arg) calls task_fn(task_arg, t, w) exactly once
 *     for every t in [0, n_tasks), in any order, on any threads, and returns only when all have
 *     finished (their writes visible to the returning thread, as any join or mutex gives).
 *     n_tasks >= 1. w < num_workers, and no two tasks with the same w may run at the same time
 *     (w selects mha's per-worker scratch); which thread carries which w may change freely.
 *   - mha calls parallel_for from the thread that called mha (mha_layer_forward,
 *     mha_layer_project, mha_kv_cache_append / _forward / _step), one call at a time per context
 *     (never from inside a task), and blocks in it. Whether that thread runs tasks is the host's
 *     choice (a serial executor runs them all itself, as worker 0). A host that calls mha from
 *     one of its own tasks needs a parallel_for that does not wait for that task's worker.
 *   - Outputs are bitwise identical to those of a context with its own pool (any thread count):
 *     a task's result depends only on its index, never on w or on the thread.
 *   - Tasks never fail and never unwind (every argument is validated and every buffer reserved
 *     before the first task; task_fn is noexcept), so nothing escapes through parallel_for. The
 *     only error a loop can raise is a breach of this contract by the host (w >= num_workers,
 *     two tasks at once on one w, t >= n_tasks, or a return after fewer or more task calls than
 *     n_tasks): mha detects it, skips the offending call and the rest of the mha call's loops,
 *     and the mha call returns MHA_STATUS_INVALID_ARGUMENT naming the breach, its outputs (and a
 *     KV cache's contents) unspecified.
 * mha copies this struct when the context is created. */
typedef struct mha_executor {
  void (*parallel_for)(void* user, uint64_t n_tasks, mha_task_fn task_fn, void* task_arg);
  size_t num_workers; /* workers the host runs concurrently: 1..1024 */
  void* user;         /* passed to parallel_for unchanged */
} mha_executor;

/* mha_context_options.grouped_forward (mha::GroupedForward). */
typedef enum mha_grouped_forward {
  MHA_GROUPED_FORWARD_AUTO = 0, /* where its rule says so (group_rows, group_max_bytes) */
  MHA_GROUPED_FORWARD_OFF = 1   /* never: every forward runs stage by stage */
} mha_grouped_forward;

/* mha_context_options.bf16_kernel (mha::Bf16KernelChoice): the kernel of MHA_COMPUTE_BF16
 * products. Every kernel gives the same results to rounding. */
typedef enum mha_bf16_kernel_choice {
  MHA_BF16_KERNEL_AUTO = 0,        /* the fastest this CPU runs, or MHA_BF16_KERNEL=<name> */
  MHA_BF16_KERNEL_EMULATED = 1,    /* bf16-rounded operands, f32 FMAs: every CPU */
  MHA_BF16_KERNEL_AVX512_BF16 = 2, /* AVX512_BF16 (vdpbf16ps) */
  MHA_BF16_KERNEL_AMX = 3,         /* AMX-BF16 tiles */
  MHA_BF16_KERNEL_NEON_BF16 = 4    /* Arm BF16 (bfmmla) */
} mha_bf16_kernel_choice;

/* Zero-initialized = defaults (a pool of the context's own, all hardware threads). */
typedef struct mha_context_options {
  /* Threads used by forward passes, counting the calling thread; 0 = all hardware threads. At
   * most 1024. With an executor: 0 or executor->num_workers. The context's own threads poll for
   * work while a call runs (up to 2 ms while its stages' last tasks run) and for 50 us after
   * it, then sleep: between calls they use no CPU. */
  size_t num_threads;
  /* Caller-provided arena memory (not owned; must outlive the context), arena_bytes long. When
   * NULL the context owns its arena, starting at arena_bytes bytes (0 = grow on first use; an
   * owned arena grows with one allocation when a larger forward arrives). */
  void* arena_buffer;
  size_t arena_bytes;
  /* NULL: the context creates a pool of num_threads threads of its own. Otherwise the host's
   * thread pool (copied at creation; executor->user must stay valid for the context's life). */
  const mha_executor* executor;
  /* The grouped forward of short sequences (mha::ContextOptions in mha/mha.hpp has the rule):
   * MHA_GROUPED_FORWARD_AUTO or _OFF; group_rows (query rows a group aims for) and
   * group_max_bytes (most bytes of a group's buffers), 0 = the defaults (256 rows, 1.5 x the
   * core's L2, or MHA_GROUP_ROWS / MHA_GROUP_MAX_KIB from the environment). */
  int32_t grouped_forward; /* an mha_grouped_forward */
  size_t group_rows;
  size_t group_max_bytes;
  /* MHA_BF16_KERNEL_*: a named kernel must be one this CPU runs (else
   * MHA_STATUS_INVALID_ARGUMENT). */
  int32_t bf16_kernel; /* an mha_bf16_kernel_choice */
} mha_context_options;

/* options == NULL means defaults. */
MHA_API mha_status mha_context_create(const mha_context_options* options, mha_context** out);
/* Accepts NULL. The context must not be in use. */
MHA_API void mha_context_destroy(mha_context* context);
/* Threads of the context's own pool, or its executor's num_workers. */
MHA_API mha_status mha_context_num_threads(const mha_context* context, size_t* num_threads);
/* The kernel the context's MHA_COMPUTE_BF16 products run on: "amx", "avx512_bf16", "neon_bf16"
 * or "emulated" (a static string). */
MHA_API mha_status mha_context_bf16_kernel(const mha_context* context, const char** name);
/* Usable arena bytes now, and the most any forward has used so far. */
MHA_API mha_status mha_context_arena_bytes(const mha_context* context, size_t* capacity,
                                           size_t* high_water);

/* ---- Layer ----------------------------------------------------------------------------------- */

typedef struct mha_layer mha_layer;

/* Row order of a packed in_proj_weight [3E, in] and in_proj_bias [3E]. */
typedef enum mha_qkv_layout {
  MHA_QKV_LAYOUT_PYTORCH = 0, /* all q rows, then all k rows, then all v rows */
  MHA_QKV_LAYOUT_PER_HEAD = 1 /* per head h: its head_dim q rows, k rows, v rows */
} mha_qkv_layout;

typedef enum mha_weight_binding {
  MHA_WEIGHTS_VIEW = 0, /* the layer points at the caller's arrays (see Ownership above) */
  MHA_WEIGHTS_COPY = 1  /* the layer copies the weights at creation; where every product reads
                         * the packed form it keeps only that (see mha::WeightBinding) */
} mha_weight_binding;

/* Whether an f32 layer also keeps its projection weights packed for the GEMM micro-kernel
 * (mha::WeightPrepack; see mha_layer_config.prepack). */
typedef enum mha_prepack {
  MHA_PREPACK_ON = 0,       /* pack once at creation (the default) */
  MHA_PREPACK_OFF = 1,      /* keep only the nn.Linear layout */
  MHA_PREPACK_PLAIN = 2,    /* the same as MHA_PREPACK_ON */
  MHA_PREPACK_STRASSEN = 3  /* MHA_PREPACK_ON plus Strassen operands (opt-in, 1.75x more) */
} mha_prepack;

/* mha_layer_config.compute: the arithmetic of the layer's products (mha::Compute; README
 * "bf16 compute"). */
typedef enum mha_compute {
  MHA_COMPUTE_F32 = 0, /* f32 products (the default) */
  MHA_COMPUTE_BF16 = 1 /* inputs of the products rounded to bf16, f32 sums; native bf16 dot
                          products where the CPU has them (mha_bf16_kernel names which). Error:
                          measured at most 1.9e-2 of the output's largest magnitude over
                          3,000 random configurations, typically 5e-3 (tested
                          bound 3e-2). With MHA_DTYPE_I8 / I4 weights: products of more than
                          16 rows on bf16 of the dequantized weights, fewer rows (decode) in
                          f32 as MHA_COMPUTE_F32 */,
  MHA_COMPUTE_INT8 = 2 /* weight_dtype MHA_DTYPE_I8 / I4 only: the projections' activations
                          quantized to int8 per block of 32 (I4: of weight_block) as each product
                          runs, integer dot products, f32 scaling in one fixed order (the same
                          bits on every CPU); attention itself stays f32 (mha::Compute::kInt8;
                          README "Quantized weights" states the error) */
} mha_compute;

/* mha_layer_config.rope: rotary position embedding (mha::RopeStyle). */
typedef enum mha_rope {
  MHA_ROPE_NONE = 0,
  MHA_ROPE_NEOX = 1, /* pairs (x_i, x_{i + rd/2}): HF rotate_half */
  MHA_ROPE_GPTJ = 2  /* pairs (x_{2i}, x_{2i+1}): GPT-J rotate_every_two */
} mha_rope;

/* mha_layer_config.rope_scaling (mha::RopeScaling; README "RoPE scaling"). */
typedef enum mha_rope_scaling {
  MHA_ROPE_SCALING_NONE = 0,
  MHA_ROPE_SCALING_LINEAR = 1,
  MHA_ROPE_SCALING_DYNAMIC = 2,
  MHA_ROPE_SCALING_LLAMA3 = 3,
  MHA_ROPE_SCALING_YARN = 4,
  MHA_ROPE_SCALING_LONGROPE = 5
} mha_rope_scaling;

/* mha_layer_config.bias_projections: a mask of the biased projections. */
enum {
  MHA_BIAS_Q = 1,
  MHA_BIAS_K = 2,
  MHA_BIAS_V = 4,
  MHA_BIAS_OUT = 8
};

/* Fields as mha::AttentionConfig; booleans are 0/1. A zero-initialized config is PyTorch's
 * defaults (with biases), as mha_layer_config_init gives; embed_dim and num_heads must be set.
 * ABI note: `no_bias` replaced `int32_t bias` (1 = biases) in 0.1.x so that 0 means the
 * default in every field; code that sets `bias` no longer compiles. 0.2.0 appended the attention
 * variants' fields to mha_layer_config, mha_layer_weights, mha_load_options,
 * mha_attention_inputs and mha_kv_cache_options, and `compute` to mha_layer_config and
 * mha_load_options: the structs grew, so programs built against
 * 0.1.x must be recompiled (zero-initialized new fields keep 0.1.x's results); the library's
 * soname carries the minor version (libmha.so.0.2) so that such a program cannot load it.
 * 0.3.0 appended head_dim, bias_projections and the RoPE scaling fields to mha_layer_config and
 * the separate biases and longrope factors to mha_layer_weights (libmha.so.0.3). 0.4.0 appended
 * weight_block to mha_layer_config, mha_load_options and mha_hf_options (libmha.so.0.4). 0.5.0
 * appended grouped_forward, group_rows, group_max_bytes and bf16_kernel to mha_context_options
 * (libmha.so.0.5). 0.6.0 appended int8_attention to mha_kv_cache_options, in what was its tail
 * padding (the size is unchanged): a struct that was not zero-initialized may now carry garbage
 * there, which is rejected unless it is 0 or 1 (libmha.so.0.6). */
typedef struct mha_layer_config {
  int64_t embed_dim;    /* E: model width, output width */
  int64_t num_heads;    /* H: E % H == 0, head_dim = E / H */
  int64_t num_kv_heads; /* grouped-query attention: H % num_kv_heads == 0; 0 = num_heads */
  int64_t q_dim;        /* query input features; 0 = E */
  int64_t kdim;         /* key input features; 0 = E */
  int64_t vdim;         /* value input features; 0 = E */
  int32_t no_bias;      /* 1: no in_proj and out_proj biases (nn.MultiheadAttention bias=False) */
  int32_t add_bias_kv;  /* bias_k, bias_v appended as one more key/value position */
  int32_t add_zero_attn; /* a zero key/value position appended (after bias_kv) */
  int32_t batch_first;  /* batched inputs are [N, L, features] instead of [L, N, features] */
  float scale;          /* score scale; 0 = 1 / sqrt(head_dim) */
  /* Storage of the four projection matrices, an mha_dtype: MHA_DTYPE_F32 (0, the default),
   * MHA_DTYPE_BF16 or MHA_DTYPE_F16. 16-bit weights are widened exactly inside the products
   * (f32 arithmetic): the only error is their rounding (relative 2^-9 bf16, 2^-11 f16).
   * MHA_DTYPE_I8 / MHA_DTYPE_I4: quantized at creation (MHA_WEIGHTS_COPY; f32, bf16 or int8
   * compute; weight_block below), as mha::AttentionConfig::weight_dtype says. */
  int32_t weight_dtype;
  /* An mha_prepack (see mha::WeightPrepack for the contract). MHA_PREPACK_ON (0, the default):
   * an f32 layer keeps a second, CPU-specific copy of its projection weights (about their f32
   * bytes again, also for MHA_WEIGHTS_VIEW) so that no forward repacks them; fastest for short
   * inputs and decoding. MHA_PREPACK_OFF: no copy, slower projections. MHA_PREPACK_STRASSEN:
   * opt-in, 1.75x the bytes of large matrices again for fewer multiplications on long inputs,
   * at a few times the rounding error. Ignored for 16-bit weights. */
  int32_t prepack;
  /* Attention variants, as mha::AttentionConfig (0 = off / default in each). */
  int32_t rope;          /* an mha_rope: MHA_ROPE_NONE (0), MHA_ROPE_NEOX, MHA_ROPE_GPTJ */
  float rope_theta;      /* 0 = 10000 */
  int64_t rotary_dim;    /* even, <= head_dim; 0 = head_dim */
  float rope_scale;      /* linear position interpolation; 0 = 1 */
  int32_t alibi;         /* 1: ALiBi with the paper's slopes or mha_layer_weights.alibi_slopes */
  int64_t window;        /* sliding window of W positions; 0 = none */
  float softcap;         /* > 0: scores = softcap * tanh(scores / softcap) */
  float qk_norm_eps;     /* 0 = 1e-6 */
  int32_t qk_norm_whole; /* 1: q/k norm weights [E] / [kvE] over the whole projection (OLMo 2) */
  int32_t compute;       /* an mha_compute: MHA_COMPUTE_F32 (0, the default), _BF16 or _INT8 */
  /* 0.3.0 (mha::AttentionConfig's fields of the same names): */
  int64_t head_dim;           /* 0 = E / H; else A = H * head_dim may differ from E */
  uint32_t bias_projections;  /* 0: no_bias decides; else a mask of MHA_BIAS_* */
  int32_t rope_scaling;       /* an mha_rope_scaling */
  float rope_factor;
  int64_t rope_original_max_positions;
  float rope_low_freq_factor;
  float rope_high_freq_factor;
  float rope_beta_fast;        /* 0 = 32 */
  float rope_beta_slow;        /* 0 = 1 */
  float rope_attention_factor; /* 0 = the scaling type's default */
  int32_t rope_no_truncate;    /* yarn: 1 keeps the correction range unrounded */
  /* 0.4.0: MHA_DTYPE_I4 weights' inputs per scale, 32 or 128 (0 = 32); 0 for other dtypes. */
  int64_t weight_block;
} mha_layer_config;

/* Row-major, nn.Linear layout [out_features, in_features]; kvE = num_kv_heads * head_dim. Give
 * either in_proj_weight (only when q_dim == kdim == vdim and kvE == E) or all three of
 * q/k/v_proj_weight. Unused pointers are NULL. The four *_proj_weight arrays hold elements of
 * `dtype` (float, or bf16/f16 bits as uint16_t); biases are always float. With
 * MHA_WEIGHTS_VIEW, dtype must equal the config's weight_dtype; MHA_WEIGHTS_COPY converts
 * (f32 -> 16-bit rounds to nearest even). */
typedef struct mha_layer_weights {
  const void* in_proj_weight;   /* [E + 2 kvE, q_dim], rows ordered by qkv_layout */
  const float* in_proj_bias;    /* [E + 2 kvE] (bias), also with separate weights (q, k, v) */
  int32_t qkv_layout;           /* an mha_qkv_layout */
  const void* q_proj_weight;    /* [E, q_dim] */
  const void* k_proj_weight;    /* [kvE, kdim] */
  const void* v_proj_weight;    /* [kvE, vdim] */
  const float* bias_k;          /* [kvE] (add_bias_kv) */
  const float* bias_v;          /* [kvE] (add_bias_kv) */
  const void* out_proj_weight;  /* [E, E] */
  const float* out_proj_bias;   /* [E] (bias) */
  int32_t dtype;                /* an mha_dtype: F32 (0, the default), BF16 or F16 */
  /* Attention variants (f32, copied at creation; NULL = absent). */
  const float* sinks;         /* [H] */
  const float* alibi_slopes;  /* [H] (needs config alibi) */
  const float* q_norm_weight; /* [head_dim], or [E] with qk_norm_whole */
  const float* k_norm_weight; /* [head_dim], or [kvE] with qk_norm_whole */
  /* 0.3.0: separate biases instead of in_proj_bias ([A], [kvE], [kvE]), longrope factors
   * ([rotary_dim / 2]). */
  const float* q_proj_bias;
  const float* k_proj_bias;
  const float* v_proj_bias;
  const float* rope_short_factor;
  const float* rope_long_factor;
} mha_layer_weights;

/* Options for mha_layer_create_from_safetensors: what the file cannot tell. Zero-initialized =
 * defaults except num_heads, which is required. */
typedef struct mha_load_options {
  int64_t num_heads;          /* H, required (> 0, divides E) */
  int32_t add_zero_attn;      /* nn.MultiheadAttention's add_zero_attn (not in a state_dict) */
  int32_t batch_first;        /* layout of batched inputs */
  float scale;                /* 0 = 1 / sqrt(head_dim) */
  int32_t qkv_layout;         /* an mha_qkv_layout: row order of a packed in_proj_weight */
  /* Storage of the layer's projection matrices (an mha_dtype: F32 = 0 default, BF16, F16, I8,
   * I4). 16-bit tensors of that dtype in the file are kept as they are (never widened to f32);
   * others are converted; I8 / I4 quantize the tensors as stored. */
  int32_t weight_dtype;
  /* Key/value heads (grouped-query attention); 0 = inferred from the rows of k_proj_weight
   * (kvE / head_dim). Must divide num_heads. */
  int64_t num_kv_heads;
  /* An mha_prepack for the created layer (mha_layer_config.prepack); 0 = MHA_PREPACK_ON. */
  int32_t prepack;
  /* Attention variants a state_dict cannot tell (mha_layer_config's fields of those names);
   * the tensors prefix + sinks, alibi_slopes, q_norm.weight, k_norm.weight are read when
   * present. */
  int32_t rope;
  float rope_theta;
  int64_t rotary_dim;
  float rope_scale;
  int32_t alibi;
  int64_t window;
  float softcap;
  float qk_norm_eps;
  int32_t qk_norm_add_one; /* 1: Gemma's (1 + w) norm weights */
  int32_t compute;         /* an mha_compute for the created layer; 0 = MHA_COMPUTE_F32 */
  int64_t weight_block;    /* 0.4.0: mha_layer_config.weight_block */
} mha_load_options;

/* Sets *config to the defaults: all fields 0, as a zero-initialized config (embed_dim and
 * num_heads must then be set). */
MHA_API mha_status mha_layer_config_init(mha_layer_config* config);

/* Validates the configuration and weights (every error names the field) and creates a layer. */
MHA_API mha_status mha_layer_create(const mha_layer_config* config,
                                    const mha_layer_weights* weights,
                                    int32_t binding /* an mha_weight_binding */,
                                    mha_layer** out);

/* Loads nn.MultiheadAttention state_dict tensors named `prefix` + {in_proj_weight,
 * in_proj_bias, q/k/v_proj_weight, out_proj.weight, out_proj.bias, bias_k, bias_v} from a
 * safetensors file (F32, F16 or BF16, stored as options->weight_dtype; biases widened to f32)
 * and creates a layer owning a copy. Grouped-query layers: k/v_proj_weight with kvE rows. prefix includes its trailing dot ("encoder.layers.0.self_attn."); NULL means "". E,
 * q_dim, kdim, vdim, bias and add_bias_kv come from the tensors' shapes and presence. Errors:
 * IO_ERROR (cannot open), FORMAT_ERROR (malformed file, missing or inconsistent tensors),
 * UNSUPPORTED (a non-float weight dtype), INVALID_ARGUMENT (options). The file is not kept
 * open. */
MHA_API mha_status mha_layer_create_from_safetensors(const char* path, const char* prefix,
                                                     const mha_load_options* options,
                                                     mha_layer** out);

/* Options of mha_layer_create_from_hf (mha::HfOptions); zero-initialized = the defaults. */
typedef struct mha_hf_options {
  int32_t weight_dtype;   /* an mha_dtype for the layer's matrices: F32 (0), BF16, F16, I8, I4 */
  int32_t compute;        /* an mha_compute */
  int32_t prepack;        /* an mha_prepack */
  int32_t view;           /* 1: view the mapped checkpoint (mha::WeightBinding::kView) where a
                             tensor is usable as stored; 0: copy (the default) */
  int32_t sequence_first; /* 1: inputs [L, N, hidden]; 0: batch first [N, L, hidden] */
  const char* prefix;     /* non-NULL, non-empty: the attention module by state_dict prefix */
  int64_t weight_block;   /* 0.4.0: mha_layer_config.weight_block */
} mha_hf_options;

/* What mha_layer_create_from_hf found (mha::HfLayerInfo). */
typedef struct mha_hf_layer_info {
  char model_type[64];
  char prefix[256];
  int64_t hidden_size;
  int32_t causal;          /* 1: run with causal = 1 (decoder self-attention) */
  int32_t cross_attention; /* 1: keys and values from another sequence */
} mha_hf_layer_info;

/* Loads layer `layer_index`'s attention from a Hugging Face checkpoint folder (config.json and
 * model.safetensors or a sharded index), as mha::MultiheadAttention::CreateFromHuggingFace.
 * `options` may be NULL (defaults), `info` may be NULL. */
MHA_API mha_status mha_layer_create_from_hf(const char* dir, int64_t layer_index,
                                            const mha_hf_options* options, mha_layer** out,
                                            mha_hf_layer_info* info);

/* Accepts NULL. No forward on the layer may be running. */
MHA_API void mha_layer_destroy(mha_layer* layer);

/* The layer's effective configuration (defaults resolved: num_kv_heads, q_dim, kdim, vdim are
 * never 0); useful to size buffers for a layer loaded from a file. */
MHA_API mha_status mha_layer_get_config(const mha_layer* layer, mha_layer_config* config);

/* ---- Forward --------------------------------------------------------------------------------- */

/* Inputs of one forward pass; absent tensors have data == NULL (zero-initialize the struct).
 *   query  [L, N, q_dim] ([N, L, q_dim] when batch_first) or [L, q_dim] unbatched; required.
 *   key    [S, N, kdim] / [N, S, kdim] / [S, kdim]; absent: self-attention (key = query).
 *   value  [S, N, vdim] / [N, S, vdim] / [S, vdim]; absent: value = key.
 *   attn_mask         [L, S] or [N * H, L, S] (index n * H + h); BOOL/U8 or F32.
 *   key_padding_mask  [N, S] ([S] unbatched); BOOL/U8 or F32.
 * Positions added by add_bias_kv / add_zero_attn are never masked. */
typedef struct mha_attention_inputs {
  mha_tensor query;
  mha_tensor key;
  mha_tensor value;
  mha_tensor attn_mask;
  mha_tensor key_padding_mask;
  /* Token positions (I32 or I64, values in [0, 2^31)): [N, L] or [L] for the queries, [N, S] or
   * [S] for the keys. Absent: 0..L-1, and keys share the query positions in self-attention,
   * 0..S-1 otherwise. */
  mha_tensor positions;
  mha_tensor key_positions;
} mha_attention_inputs;

/* Flags for mha_layer_forward / mha_layer_plan (bitwise OR). */
/* Mask key j for query i when j > i (top-left aligned), without a mask tensor. */
#define MHA_FORWARD_CAUSAL 1u
/* Attention weights per head [N, H, L, S'] instead of averaged over heads [N, L, S']. */
#define MHA_FORWARD_PER_HEAD_WEIGHTS 2u

/* Runs one forward pass on the context's threads with temporaries from its arena.
 *   output        F32, the query's layout with E features: [L, N, E], [N, L, E] or [L, E].
 *   attn_weights  NULL: not computed (need_weights = False). Otherwise F32 [N, L, S'] averaged
 *                 or [N, H, L, S'] per head (unbatched: [L, S'] / [H, L, S']),
 *                 S' = S + add_bias_kv + add_zero_attn.
 * A query row with no allowed key gets all-zero weights and contributes zero (PyTorch: NaN).
 * On error nothing is written to output or attn_weights. Results are bitwise identical for any
 * thread count. */
MHA_API mha_status mha_layer_forward(const mha_layer* layer, mha_context* context,
                                     const mha_attention_inputs* inputs,
                                     const mha_tensor* output, const mha_tensor* attn_weights,
                                     uint32_t flags);

/* Validates the same arguments as mha_layer_forward without running it, and returns the arena
 * bytes a forward needs on `num_threads` threads (for sizing a caller-provided arena). output
 * and attn_weights are only checked for shape: their data is never touched and may be NULL.
 * The figure depends on shapes, dtypes, which inputs are present, flags and threads only, so it
 * suffices for every forward with those whatever the pointers and strides (in place or not), and
 * a buffer of exactly that many bytes works at any address (the 63 bytes a context may skip to
 * align its start are counted). */
MHA_API mha_status mha_layer_plan(const mha_layer* layer, const mha_attention_inputs* inputs,
                                  const mha_tensor* output, const mha_tensor* attn_weights,
                                  uint32_t flags, size_t num_threads, size_t* workspace_bytes);

/* Runs only the input projections and writes per-head Q, K, V, dense F32:
 *   q [N, H, L, head_dim], k and v [N, kvH, S', head_dim] (N = 1 for unbatched inputs); k and v
 *   include the bias_kv / zero-attention positions. Masks in `inputs` are ignored. */
MHA_API mha_status mha_layer_project(const mha_layer* layer, mha_context* context,
                                     const mha_attention_inputs* inputs, const mha_tensor* q,
                                     const mha_tensor* k, const mha_tensor* v);

/* ---- KV cache: incremental decoding --------------------------------------------------------- */

/* An mha_kv_cache holds the projected keys and values of one layer for a batch of `batch`
 * sequences of up to `capacity` positions, so that each new token costs one projection of that
 * token plus one pass over the cached positions instead of a forward over the whole prefix. It
 * is the C face of mha::KvCache; mha/kv_cache.hpp states the full contract (storage layout,
 * accuracy of 16-bit storage, scheduling).
 *
 *   mha_kv_cache_options o = {0};
 *   o.batch = 1;
 *   o.capacity = 4096;
 *   o.dtype = MHA_DTYPE_BF16;
 *   mha_kv_cache_create(layer, &o, &cache);
 *   mha_kv_cache_step(cache, layer, ctx, &prompt, &prompt_out, NULL);  prefill: [N, T, E]
 *   mha_kv_cache_step(cache, layer, ctx, &token, &token_out, NULL);    decode:  [N, 1, E]
 *
 * Tensors: F32, batch-first [N, T, features] whatever the layer's batch_first, N = batch,
 * 1 <= T tokens per entry, rank 3, last dimension contiguous (other strides free):
 *   key [N, T, kdim], value [N, T, vdim], query [N, T, q_dim], x [N, T, q_dim] (Step needs
 *   q_dim == kdim == vdim), output [N, T, E].
 *
 * Positions: entry n of the batch has its own length (cached positions, mha_kv_cache_length).
 * `counts` is NULL (every entry uses all T tokens) or an array of `batch` values (read during
 * the call only), counts[n] in 0..T the tokens entry n really uses; its other tokens are
 * padding: never stored, their output rows are set to 0. Append stores entry n's tokens at
 * positions length .. length + counts[n] - 1. Forward attends query token i < counts[n] of
 * entry n, which sits at position length - counts[n] + i, to positions
 * 0 .. length - counts[n] + i (causal: itself included), so it needs counts[n] <= length.
 * Step = Append, then Forward, of the same x. Prefill (a Step of T prompt tokens) then decoding
 * (Steps of T = 1) gives the output of mha_layer_forward with MHA_FORWARD_CAUSAL over the whole
 * sequence: within f32 rounding for an F32 cache; BF16 / F16 storage moves outputs by about
 * 1e-2 / 1e-3 of the output scale.
 *
 * Layers: a cache is sized for one layer's num_kv_heads and head_dim (grouped-query and
 * multi-query layers cache num_kv_heads heads only); every call taking a layer checks that they
 * match. A layer may serve several caches; the cache keeps no pointer to it. Layers with
 * add_bias_kv or add_zero_attn are rejected by append, forward and step with
 * MHA_STATUS_UNSUPPORTED (their extra key positions belong at the end of every sequence, which a
 * cache that grows in place cannot express).
 *
 * Memory and threads: the storage is allocated once at creation (zeroed) and owned by the cache,
 * or borrowed from options->buffer, which must then outlive the cache. Temporaries come from the
 * context's arena (an owned arena grows once; a caller arena that is too small gives
 * MHA_STATUS_OUT_OF_MEMORY); once the arena has grown, append, forward and step allocate
 * nothing. One thread at a time may use a cache. Results are bitwise identical for any thread
 * count and to the C++ API's.
 *
 * Errors: every argument is validated first (NULL pointers, options, shapes, counts, n,
 * capacity, the layer) with a message naming it, the expected and the actual value; on failure
 * neither the cache (its lengths and contents) nor any output is modified. */

typedef struct mha_kv_cache mha_kv_cache;

/* Zero-initialize, then set batch and capacity (dtype 0 = MHA_DTYPE_F32). */
typedef struct mha_kv_cache_options {
  int64_t batch;    /* N: sequences, > 0 */
  int64_t capacity; /* positions per sequence (its maximum length), > 0 */
  int32_t dtype;    /* storage: MHA_DTYPE_F32, MHA_DTYPE_BF16, MHA_DTYPE_F16 or MHA_DTYPE_I8
                     * (symmetric codes, one f32 scale per position and kv head: mha/kv_cache.hpp) */
  /* Caller storage (borrowed), at least mha_kv_cache_required_bytes long, aligned to the
   * element size (64 bytes recommended). NULL: the cache allocates and owns its storage;
   * buffer_bytes is then ignored. */
  void* buffer;
  size_t buffer_bytes;
  /* 1: a windowed layer's cache keeps the last `capacity` positions as a ring (see
   * mha::KvCacheOptions::ring). */
  int32_t ring;
  /* 1: MHA_DTYPE_I8 storage only, head_dim <= 1024: the attention over the cache takes integer
   * dot products (quantized queries and probabilities; AVX512_VNNI's VPDPBUSD where the CPU has
   * it and an AVX-512 target runs; see mha::KvCacheOptions::int8_attention for the numerics).
   * 0: f32 arithmetic. */
  int32_t int8_attention;
} mha_kv_cache_options;

/* Bytes of storage (K and V) a cache with these options needs for `layer`:
 * 2 * batch * num_kv_heads * capacity * head_dim * element size. options->buffer is ignored. */
MHA_API mha_status mha_kv_cache_required_bytes(const mha_layer* layer,
                                               const mha_kv_cache_options* options, size_t* bytes);

/* Creates an empty cache (every length 0) for `layer`'s num_kv_heads and head_dim. Errors:
 * INVALID_ARGUMENT (options, buffer too small or misaligned), OUT_OF_MEMORY (owned storage). */
MHA_API mha_status mha_kv_cache_create(const mha_layer* layer, const mha_kv_cache_options* options,
                                       mha_kv_cache** out);

/* Accepts NULL. Does not free a caller-provided buffer. */
MHA_API void mha_kv_cache_destroy(mha_kv_cache* cache);

/* The context arena bytes that every append, forward and step with `layer` of up to max_tokens
 * tokens per entry needs on num_threads threads, for sizing a caller-provided arena
 * (mha_context_options.arena_buffer). From shapes alone: it holds for any lengths, counts and
 * pointers, and a buffer of exactly that many bytes works at any address. */
MHA_API mha_status mha_kv_cache_plan(const mha_kv_cache* cache, const mha_layer* layer,
                                     int64_t max_tokens, size_t num_threads, size_t* bytes);

/* Empties every entry (lengths 0); the storage is kept. */
MHA_API mha_status mha_kv_cache_reset(mha_kv_cache* cache);

/* Shortens entry n (0 <= n < batch) to `length` positions, 0 <= length <= its current length
 * (e.g. to drop rejected speculative tokens); later appends overwrite the dropped positions. */
MHA_API mha_status mha_kv_cache_truncate(mha_kv_cache* cache, int64_t n, int64_t length);

/* The current length of entry n (0 <= n < batch). */
MHA_API mha_status mha_kv_cache_length(const mha_kv_cache* cache, int64_t n, int64_t* length);

/* Projects key [N, T, kdim] and value [N, T, vdim] with the layer's k/v weights and biases and
 * stores counts[n] of them for entry n. INVALID_ARGUMENT when an entry would exceed the capacity
 * (the message names the entry, its length, the count and the capacity). */
MHA_API mha_status mha_kv_cache_append(mha_kv_cache* cache, const mha_layer* layer,
                                       mha_context* context, const mha_tensor* key,
                                       const mha_tensor* value, const int64_t* counts);

/* Stores keys and values that are already projected, per head: k and v F32
 * [N, num_kv_heads, T, head_dim] (the layout of mha_layer_project's k and v), counts[n] positions
 * for entry n. For importing keys and values computed elsewhere (a prompt prefix shared by
 * several requests) without a projection. */
MHA_API mha_status mha_kv_cache_append_projected(mha_kv_cache* cache, const mha_tensor* k,
                                                 const mha_tensor* v, const int64_t* counts);

/* Attends query [N, T, q_dim] over the cache (positions above), then the output projection
 * into output [N, T, E]. Needs counts[n] <= the length of entry n. */
MHA_API mha_status mha_kv_cache_forward(mha_kv_cache* cache, const mha_layer* layer,
                                        mha_context* context, const mha_tensor* query,
                                        const mha_tensor* output, const int64_t* counts);

/* Self-attention step: append(x, x), then forward(x), in one call. x [N, T, q_dim], output
 * [N, T, E]. */
MHA_API mha_status mha_kv_cache_step(mha_kv_cache* cache, const mha_layer* layer,
                                     mha_context* context, const mha_tensor* x,
                                     const mha_tensor* output, const int64_t* counts);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MHA_MHA_H_ */
