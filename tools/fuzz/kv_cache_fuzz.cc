// libFuzzer target for the KV cache through the C API (the mha_kv_cache_* functions of
// include/mha/mha.h), checked against the one-shot causal forward (mha_layer_forward with
// MHA_FORWARD_CAUSAL) of the same layer.
//
// Each input decodes (ByteReader, fuzz_util.h) into a self-attention layer (E = H * hd <= 128,
// GQA / MQA, input width d = q_dim = kdim = vdim, bias, f32/bf16/f16 weights, prepack mode), a
// cache (batch N <= 3, capacity <= 96, f32/bf16/f16/int8 storage, int8 with or without
// int8_attention, owned or in a caller buffer with canary bytes around it; attention variants:
// RoPE, ALiBi, window, softcap, sinks, QK-norm per head or whole), a context (1-3 threads, owned
// or caller arena) and up to 24 operations: steps and appends of T tokens with ragged or absent
// `counts`, appends of keys and values projected by mha_layer_project, forwards re-querying the
// last tokens of each entry, truncations, resets, and calls that must fail (capacity exceeded,
// counts out of range, a forward past an entry's length, a truncation beyond it, wrong shapes,
// an add_zero_attn layer).
// The fuzzer keeps each entry's token sequence; the cache must hold exactly its keys and values.
//
// Checks, any of which aborts with the case's description and the operation:
// - outputs of rows an entry uses within the documented tolerance of the causal forward over
//   that entry's sequence (f32 1e-5, bf16 2e-2, f16 4e-3, times 1 + |forward|; see mha.h and
//   tests/kv_cache_test.cc), padding rows exactly 0, nothing written outside the output's
//   elements (canaries, row padding), inputs unchanged;
// - a call that must fail returns a status with a message and changes nothing: lengths (read
//   back with mha_kv_cache_length), the output buffer, and (through later comparisons) the
//   cached keys and values; a caller arena that is too small may only fail with
//   MHA_STATUS_OUT_OF_MEMORY in the same way;
// - the cache's caller buffer is not written beyond mha_kv_cache_required_bytes.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mha/mha.h"
#include "tools/fuzz/fuzz_util.h"

namespace mha {
namespace fuzz {
namespace {

constexpr int kMaxOps = 24;

enum OpKind {
  kStep = 0,
  kAppendForward,
  kForward,
  kTruncate,
  kReset,
  kAppendProjected,
  kStepTooLong,     // exceeds the capacity of an entry: INVALID_ARGUMENT
  kBadCounts,       // a count < 0 or > T
  kForwardTooLong,  // a forward of more tokens than an entry holds
  kTruncateBeyond,  // a length above the current one, or an entry out of range
  kWrongShape,      // x with d + 1 features / output with E + 1 / rank 2
  kZeroAttnLayer,   // a layer with add_zero_attn: UNSUPPORTED
  kOpCount
};

struct Op {
  int kind = kStep;
  int64_t T = 1;
  bool with_counts = false;
  std::vector<int64_t> counts;  // per entry (with_counts)
  int64_t n = 0, length = 0;    // truncation
  int64_t pad = 0;              // row padding of x and output
  bool token_major = false;     // x and output stored [T, N, f] (strides)
  int64_t query_back = 0;       // kAppendForward / kForward: tokens re-queried (max over entries)
};

struct Case {
  int64_t E = 1, H = 1, KVH = 1, d = 1;
  bool bias = true;
  int32_t wdtype = MHA_DTYPE_F32, prepack = MHA_PREPACK_ON;
  bool batch_first = true;
  int64_t N = 1, capacity = 1;
  int32_t cdtype = MHA_DTYPE_F32;
  bool int8_attention = false;  // mha_kv_cache_options.int8_attention (int8 caches)
  bool caller_buffer = false;
  size_t threads = 1;
  int arena = 0;  // 0 owned, 1 caller 1 MiB, 2 caller 64 KiB (either may be too small)
  // Attention variants (mha_layer_config's fields; 0 = off).
  int32_t rope = MHA_ROPE_NONE;
  float rope_theta = 0, softcap = 0;
  int64_t rotary_dim = 0, window = 0;
  bool alibi = false, sinks = false, qk_norm = false, qk_norm_whole = false;
  uint32_t seed = 0;
  std::vector<Op> ops;

  std::string Describe() const {
    std::ostringstream os;
    os << "E=" << E << " H=" << H << " KVH=" << KVH << " d=" << d << " bias=" << bias
       << " wdtype=" << wdtype << " prepack=" << prepack << " batch_first=" << batch_first
       << " N=" << N << " capacity=" << capacity << " cache_dtype=" << cdtype
       << (int8_attention ? "(int8_attention)" : "")
       << " caller_buffer=" << caller_buffer << " threads=" << threads << " arena=" << arena
       << " rope=" << rope << " theta=" << rope_theta << " rd=" << rotary_dim << " alibi=" << alibi
       << " window=" << window << " softcap=" << softcap << " sinks=" << sinks
       << " qk_norm=" << qk_norm << (qk_norm_whole ? "(whole)" : "") << " seed=" << seed
       << " ops=[";
    for (const Op& op : ops) {
      os << "{kind=" << op.kind << " T=" << op.T;
      if (op.with_counts) {
        os << " counts=";
        for (int64_t x : op.counts) os << x << ",";
      }
      os << " n=" << op.n << " len=" << op.length << " pad=" << op.pad
         << " token_major=" << op.token_major << " back=" << op.query_back << "} ";
    }
    os << "]";
    return os.str();
  }
};

Case Decode(ByteReader* r) {
  Case c;
  // Mostly small layers and caches; about one case in eight reaches the full bounds.
  const bool big = r->Chance(32);
  const Heads heads = DecodeHeads(r, /*max_embed=*/big ? 128 : 32, /*full_heads=*/128);
  c.E = heads.E, c.H = heads.H, c.KVH = heads.KVH;
  c.d = r->Chance(48) ? r->Range(1, big ? 64 : 24) : c.E;
  const uint8_t f = r->Byte();
  c.bias = (f & 1) == 0;
  c.wdtype = ((f >> 1) & 3) == 1 ? MHA_DTYPE_BF16 : ((f >> 1) & 3) == 2 ? MHA_DTYPE_F16
                                                                          : MHA_DTYPE_F32;
  c.prepack = (f >> 3) & 3;  // MHA_PREPACK_ON, OFF, PLAIN or STRASSEN
  c.batch_first = (f >> 5) & 1;
  c.caller_buffer = (f >> 6) & 1;
  c.N = r->Range(1, 3);
  c.capacity = r->Range(1, big ? 96 : 24);
  const uint8_t s = r->Byte();
  const int32_t cache_dtypes[4] = {MHA_DTYPE_F32, MHA_DTYPE_BF16, MHA_DTYPE_F16, MHA_DTYPE_I8};
  c.cdtype = cache_dtypes[s & 3];
  c.threads = 1 + ((s >> 2) & 3) % 3;
  c.arena = ((s >> 4) & 3) % 3;
  c.int8_attention = c.cdtype == MHA_DTYPE_I8 && ((s >> 6) & 1) != 0;
  const int64_t num_ops = r->Range(1, kMaxOps);
  for (int64_t i = 0; i < num_ops; ++i) {
    Op op;
    op.kind = static_cast<int>(r->Byte() % kOpCount);
    // Mostly short steps; sometimes a prefill of up to the capacity.
    op.T = r->Chance(48) ? r->Range(1, c.capacity) : r->Range(1, 4);
    op.with_counts = r->Bool();
    for (int64_t n = 0; n < c.N; ++n) op.counts.push_back(r->Range(0, op.T));
    op.n = r->Range(0, c.N - 1);
    op.length = r->Range(0, c.capacity);
    const uint8_t layout = r->Byte();
    op.pad = (layout & 3) == 3 ? (layout >> 2) % 4 : 0;
    op.token_major = (layout >> 4) & 1;
    op.query_back = 1 + (layout >> 5) % 4;
    c.ops.push_back(op);
  }
  // The attention variants, each off for a zero byte.
  const int64_t hd = c.E / c.H;
  const uint8_t v = r->Byte();
  if ((v & 3) == 1 || ((v & 3) == 2 && hd >= 2)) {
    c.rope = hd >= 2 && ((v >> 2) & 1) ? MHA_ROPE_GPTJ : MHA_ROPE_NEOX;
    if (hd < 2) c.rope = MHA_ROPE_NONE;
    if (c.rope != MHA_ROPE_NONE) {
      if ((v >> 3) & 1) c.rope_theta = 100.0f * static_cast<float>(1 + r->Byte());
      // An odd head_dim needs a partial rotary_dim (the default, head_dim, must be even).
      if (((v >> 4) & 1) || hd % 2 != 0) c.rotary_dim = 2 * r->Range(1, hd / 2);
    }
  }
  const uint8_t w = r->Byte();
  c.alibi = (w & 3) == 1;
  if (((w >> 2) & 3) == 1) c.window = r->Range(1, c.capacity + 2);
  if (((w >> 4) & 3) == 1) c.softcap = 0.25f + 0.25f * static_cast<float>(r->Byte() % 40);
  c.sinks = (w >> 6) & 1;
  const uint8_t q = r->Byte();
  c.qk_norm = (q & 3) == 1;
  c.qk_norm_whole = c.qk_norm && ((q >> 2) & 1);
  c.seed = r->Seed();
  return c;
}

// The tested bounds of tests/kv_cache_test.cc; int8's row scale (max |x| / 127) makes small
// elements of a row relatively coarser than bf16's 2^-9, and heads of 1-2 dims (which the
// fuzzer reaches) have no averaging: 5e-2.
double ToleranceOf(int32_t dtype) {
  return dtype == MHA_DTYPE_F32    ? 1e-5
         : dtype == MHA_DTYPE_BF16 ? 2e-2
         : dtype == MHA_DTYPE_I8   ? 5e-2
                                   : 4e-3;
}

// Strides of a batch-first tensor [N, T, F] with `pad` floats after each row, stored batch-major
// or token-major.
struct Layout {
  int64_t sN = 0, sT = 0;
  size_t floats = 0;
};
Layout LayoutOf(int64_t N, int64_t T, int64_t F, int64_t pad, bool token_major) {
  Layout l;
  const int64_t row = F + pad;
  if (token_major) {
    l.sN = row;
    l.sT = N * row;
  } else {
    l.sT = row;
    l.sN = T * row;
  }
  l.floats = static_cast<size_t>(N * T * row);
  return l;
}
mha_tensor Batched(void* data, int64_t N, int64_t T, int64_t F, const Layout& l) {
  const int64_t shape[3] = {N, T, F};
  const int64_t strides[3] = {l.sN, l.sT, 1};
  return Tensor(data, MHA_DTYPE_F32, 3, shape, strides);
}

class Runner {
 public:
  explicit Runner(const Case& c) : c_(c), rng_(c.seed), desc_(c.Describe()) {}

  void Run() {
    CreateLayer(/*zero_attn=*/false, &layer_);
    if (layer_ == nullptr) Fail("mha_layer_create rejected a valid layer", desc_);
    mha_context_options o;
    std::memset(&o, 0, sizeof(o));
    o.num_threads = c_.threads;
    if (c_.arena != 0) {
      arena_.Reset(c_.arena == 1 ? size_t{1} << 20 : size_t{64} << 10, 1);
      o.arena_buffer = arena_.data();
      o.arena_bytes = arena_.bytes();
    }
    if (mha_context_create(&o, &ctx_) != MHA_STATUS_OK) Fail("mha_context_create failed", desc_);
    std::memset(&o, 0, sizeof(o));
    o.num_threads = 1;
    if (mha_context_create(&o, &ref_ctx_) != MHA_STATUS_OK) {
      Fail("mha_context_create failed", desc_);
    }

    mha_kv_cache_options co;
    std::memset(&co, 0, sizeof(co));
    co.batch = c_.N;
    co.capacity = c_.capacity;
    co.dtype = c_.cdtype;
    co.int8_attention = c_.int8_attention ? 1 : 0;
    size_t required = 0;
    if (mha_kv_cache_required_bytes(layer_, &co, &required) != MHA_STATUS_OK) {
      Fail("mha_kv_cache_required_bytes failed", desc_);
    }
    if (c_.caller_buffer) {
      storage_.Reset(required, 1);
      co.buffer = storage_.data();
      co.buffer_bytes = required;
    }
    if (mha_kv_cache_create(layer_, &co, &cache_) != MHA_STATUS_OK) {
      Fail("mha_kv_cache_create failed", desc_);
    }
    seqs_.assign(static_cast<size_t>(c_.N), {});
    for (size_t i = 0; i < c_.ops.size(); ++i) {
      op_desc_ = "op #" + std::to_string(i) + " (kind " + std::to_string(c_.ops[i].kind) + ")";
      RunOp(c_.ops[i]);
      if (c_.caller_buffer && !storage_.OnlyWrote(std::vector<char>(required, 1))) {
        Fail("the cache wrote outside its caller buffer, " + op_desc_, desc_);
      }
    }
  }

  ~Runner() {
    mha_kv_cache_destroy(cache_);
    mha_context_destroy(ctx_);
    mha_context_destroy(ref_ctx_);
    mha_layer_destroy(layer_);
    mha_layer_destroy(zero_attn_layer_);
  }

 private:
  void CreateLayer(bool zero_attn, mha_layer** out) {
    const int64_t E = c_.E, kvE = c_.KVH * (E / c_.H), d = c_.d;
    const float wb = 1.0f / std::sqrt(static_cast<float>(d));
    RandomFill(&wq_, static_cast<size_t>(E * d), wb, &rng_);
    RandomFill(&wk_, static_cast<size_t>(kvE * d), wb, &rng_);
    RandomFill(&wv_, static_cast<size_t>(kvE * d), wb, &rng_);
    RandomFill(&wo_, static_cast<size_t>(E * E), 1.0f / std::sqrt(static_cast<float>(E)), &rng_);
    RandomFill(&bias_, static_cast<size_t>(E + 2 * kvE), 0.5f, &rng_);
    RandomFill(&bo_, static_cast<size_t>(E), 0.5f, &rng_);
    // 16-bit layers get values their format holds; the layer copies them (kCopy rounds exactly).
    RoundWeights(c_.wdtype, &wq_);
    RoundWeights(c_.wdtype, &wk_);
    RoundWeights(c_.wdtype, &wv_);
    RoundWeights(c_.wdtype, &wo_);
    // The variants' tensors, drawn for the main layer only (the add_zero_attn layer, which the
    // cache must reject, has no positional variant).
    if (!zero_attn) {
      if (c_.sinks) RandomFill(&sinks_, static_cast<size_t>(c_.H), 2.0f, &rng_);
      if (c_.qk_norm) {
        const int64_t hd = E / c_.H;
        RandomFill(&q_norm_, static_cast<size_t>(c_.qk_norm_whole ? E : hd), 0.5f, &rng_);
        RandomFill(&k_norm_, static_cast<size_t>(c_.qk_norm_whole ? kvE : hd), 0.5f, &rng_);
        for (float& x : q_norm_) x += 1.0f;
        for (float& x : k_norm_) x += 1.0f;
      }
    }
    mha_layer_config config;
    mha_layer_config_init(&config);
    config.embed_dim = E;
    config.num_heads = c_.H;
    config.num_kv_heads = c_.KVH;
    config.q_dim = config.kdim = config.vdim = d;
    config.no_bias = c_.bias ? 0 : 1;
    config.add_zero_attn = zero_attn;
    config.batch_first = c_.batch_first;
    config.weight_dtype = c_.wdtype;
    config.prepack = c_.prepack;
    mha_layer_weights w;
    std::memset(&w, 0, sizeof(w));
    w.q_proj_weight = wq_.data();
    w.k_proj_weight = wk_.data();
    w.v_proj_weight = wv_.data();
    w.out_proj_weight = wo_.data();
    w.in_proj_bias = c_.bias ? bias_.data() : nullptr;
    w.out_proj_bias = c_.bias ? bo_.data() : nullptr;
    w.dtype = MHA_DTYPE_F32;
    if (!zero_attn) {
      config.rope = c_.rope;
      config.rope_theta = c_.rope_theta;
      config.rotary_dim = c_.rotary_dim;
      config.alibi = c_.alibi;
      config.window = c_.window;
      config.softcap = c_.softcap;
      config.qk_norm_whole = c_.qk_norm_whole;
      if (c_.sinks) w.sinks = sinks_.data();
      if (c_.qk_norm) {
        w.q_norm_weight = q_norm_.data();
        w.k_norm_weight = k_norm_.data();
      }
    }
    if (mha_layer_create(&config, &w, MHA_WEIGHTS_COPY, out) != MHA_STATUS_OK) *out = nullptr;
  }

  std::vector<float> NewToken() {
    std::vector<float> t;
    RandomFill(&t, static_cast<size_t>(c_.d), 1.0f, &rng_);
    return t;
  }

  std::vector<int64_t> Lengths() {
    std::vector<int64_t> lens(static_cast<size_t>(c_.N), -1);
    for (int64_t n = 0; n < c_.N; ++n) {
      if (mha_kv_cache_length(cache_, n, &lens[n]) != MHA_STATUS_OK) {
        Fail("mha_kv_cache_length failed, " + op_desc_, desc_);
      }
    }
    return lens;
  }

  void CheckLengths() {
    const std::vector<int64_t> lens = Lengths();
    for (int64_t n = 0; n < c_.N; ++n) {
      if (lens[n] != static_cast<int64_t>(seqs_[n].size())) {
        Fail("entry " + std::to_string(n) + " has length " + std::to_string(lens[n]) +
                 ", want " + std::to_string(seqs_[n].size()) + ", " + op_desc_,
             desc_);
      }
    }
  }

  // The effective count of entry n.
  static int64_t CountOf(const Op& op, int64_t n) { return op.with_counts ? op.counts[n] : op.T; }

  // x [N, T, d] whose row i of entry n is tokens[n][i] (missing rows: random padding).
  void FillInput(const Op& op, const Layout& l, const std::vector<std::vector<std::vector<float>>>& tokens,
                 GuardedBuffer* x) {
    x->Reset(l.floats, 4);
    for (int64_t n = 0; n < c_.N; ++n)
      for (int64_t i = 0; i < op.T; ++i) {
        const bool given = static_cast<size_t>(n) < tokens.size() &&
                           i < static_cast<int64_t>(tokens[n].size());
        const std::vector<float> t = given ? tokens[n][i] : NewToken();
        std::memcpy(x->f32() + n * l.sN + i * l.sT, t.data(), t.size() * 4);
      }
  }

  // Checks output rows i < rows[n] of entry n against the causal forward over its sequence
  // (rows at positions seqs_[n].size() - rows[n] + i), padding rows for zeros, and the canaries.
  void CheckOutput(const Op& op, const Layout& l, GuardedBuffer* out,
                   const std::vector<int64_t>& rows) {
    const int64_t E = c_.E;
    std::vector<char> written(out->elements(), 0);
    const double tol = ToleranceOf(c_.cdtype);
    for (int64_t n = 0; n < c_.N; ++n) {
      const int64_t len = static_cast<int64_t>(seqs_[n].size());
      std::vector<float> want;
      if (rows[n] > 0) want = CausalForward(n);
      for (int64_t i = 0; i < op.T; ++i)
        for (int64_t e = 0; e < E; ++e) {
          const int64_t at = n * l.sN + i * l.sT + e;
          written[static_cast<size_t>(at)] = 1;
          const float got = out->f32()[at];
          if (i >= rows[n]) {
            if (got != 0.0f) {
              Fail("padding row " + std::to_string(i) + " of entry " + std::to_string(n) +
                       " is not 0, " + op_desc_,
                   desc_);
            }
            continue;
          }
          const double w = want[static_cast<size_t>((len - rows[n] + i) * E + e)];
          const double err = std::fabs(got - w) / (1.0 + std::fabs(w));
          if (!(err <= tol)) {
            std::ostringstream os;
            os << "output[n=" << n << ", i=" << i << ", e=" << e << "] = " << got
               << ", causal forward " << w << " (position " << len - rows[n] + i << " of " << len
               << "), " << op_desc_;
            Fail(os.str(), desc_);
          }
        }
    }
    if (!out->OnlyWrote(written)) Fail("wrote outside the output's elements, " + op_desc_, desc_);
  }

  // The one-shot causal forward of entry n's sequence, [len, E] (unbatched input).
  std::vector<float> CausalForward(int64_t n) {
    const int64_t len = static_cast<int64_t>(seqs_[n].size());
    std::vector<float> x(static_cast<size_t>(len * c_.d)), out(static_cast<size_t>(len * c_.E));
    for (int64_t i = 0; i < len; ++i) {
      std::memcpy(x.data() + i * c_.d, seqs_[n][i].data(), static_cast<size_t>(c_.d) * 4);
    }
    mha_attention_inputs in;
    std::memset(&in, 0, sizeof(in));
    const int64_t xs[2] = {len, c_.d}, os[2] = {len, c_.E};
    in.query = Tensor(x.data(), MHA_DTYPE_F32, 2, xs, nullptr);
    const mha_tensor o = Tensor(out.data(), MHA_DTYPE_F32, 2, os, nullptr);
    if (mha_layer_forward(layer_, ref_ctx_, &in, &o, nullptr, MHA_FORWARD_CAUSAL) !=
        MHA_STATUS_OK) {
      Fail("the causal forward failed, " + op_desc_, desc_);
    }
    return out;
  }

  // A call that must fail (or, `oom_ok`, an out-of-memory failure of a small caller arena):
  // status, message, nothing written, lengths unchanged.
  void ExpectFailure(mha_status s, const GuardedBuffer* out, const char* what) {
    if (s == MHA_STATUS_OK) Fail(std::string(what) + " succeeded, " + op_desc_, desc_);
    if (std::strlen(mha_last_error_message()) == 0) {
      Fail(std::string(what) + " failed without a message, " + op_desc_, desc_);
    }
    if (out != nullptr && !out->Untouched()) {
      Fail(std::string("failed ") + what + " wrote its output, " + op_desc_, desc_);
    }
    CheckLengths();
  }

  // Whether a failed call is a caller arena running out (the arena a step needs includes GEMM
  // packing scratch sized by the blocking, megabytes even for tiny layers) (then it must have changed
  // nothing, which is checked).
  bool ArenaOom(mha_status s, const GuardedBuffer* out, const char* what) {
    if (s != MHA_STATUS_OUT_OF_MEMORY || c_.arena == 0) return false;
    ExpectFailure(s, out, what);
    return true;
  }

  // New tokens for each entry: counts[n] of them.
  std::vector<std::vector<std::vector<float>>> NewTokens(const Op& op) {
    std::vector<std::vector<std::vector<float>>> tokens(static_cast<size_t>(c_.N));
    for (int64_t n = 0; n < c_.N; ++n)
      for (int64_t i = 0; i < CountOf(op, n); ++i) tokens[n].push_back(NewToken());
    return tokens;
  }

  bool Fits(const Op& op) const {
    for (int64_t n = 0; n < c_.N; ++n) {
      if (static_cast<int64_t>(seqs_[n].size()) + CountOf(op, n) > c_.capacity) return false;
    }
    return true;
  }

  void Commit(const std::vector<std::vector<std::vector<float>>>& tokens) {
    for (int64_t n = 0; n < c_.N; ++n) {
      seqs_[n].insert(seqs_[n].end(), tokens[n].begin(), tokens[n].end());
    }
  }

  void RunOp(const Op& op) {
    const int64_t* counts = op.with_counts ? op.counts.data() : nullptr;
    const Layout xl = LayoutOf(c_.N, op.T, c_.d, op.pad, op.token_major);
    const Layout ol = LayoutOf(c_.N, op.T, c_.E, op.pad, !op.token_major);
    GuardedBuffer x, out;
    out.Reset(ol.floats, 4);
    const mha_tensor out_t = Batched(out.data(), c_.N, op.T, c_.E, ol);
    switch (op.kind) {
      case kStep:
      case kStepTooLong: {
        Op o = op;
        if (op.kind == kStepTooLong) {
          // One entry one token past the capacity.
          o.with_counts = true;
          const int64_t room = c_.capacity - static_cast<int64_t>(seqs_[op.n].size());
          o.T = std::max<int64_t>(o.T, room + 1);
          o.counts.assign(static_cast<size_t>(c_.N), 0);
          o.counts[op.n] = room + 1;
        }
        const Layout xl2 = LayoutOf(c_.N, o.T, c_.d, o.pad, o.token_major);
        const Layout ol2 = LayoutOf(c_.N, o.T, c_.E, o.pad, !o.token_major);
        GuardedBuffer out2(ol2.floats, 4);
        const auto tokens = NewTokens(o);
        FillInput(o, xl2, tokens, &x);
        const std::vector<uint8_t> x_before = Bytes(x);
        const mha_tensor x_t = Batched(x.data(), c_.N, o.T, c_.d, xl2);
        const mha_tensor o_t = Batched(out2.data(), c_.N, o.T, c_.E, ol2);
        const mha_status s = mha_kv_cache_step(cache_, layer_, ctx_, &x_t, &o_t,
                                               o.with_counts ? o.counts.data() : nullptr);
        if (!Fits(o)) {
          ExpectFailure(s, &out2, "a step past the capacity");
          return;
        }
        if (s != MHA_STATUS_OK) {
          if (ArenaOom(s, &out2, "mha_kv_cache_step")) return;
          Fail(std::string("mha_kv_cache_step failed: ") + mha_status_name(s) + ", " + op_desc_,
               desc_);
        }
        if (Bytes(x) != x_before) Fail("mha_kv_cache_step modified x, " + op_desc_, desc_);
        Commit(tokens);
        CheckLengths();
        std::vector<int64_t> rows;
        for (int64_t n = 0; n < c_.N; ++n) rows.push_back(CountOf(o, n));
        CheckOutput(o, ol2, &out2, rows);
        return;
      }
      case kAppendForward:
      case kAppendProjected: {
        const auto tokens = NewTokens(op);
        FillInput(op, xl, tokens, &x);
        mha_status s;
        if (op.kind == kAppendForward) {
          const mha_tensor x_t = Batched(x.data(), c_.N, op.T, c_.d, xl);
          s = mha_kv_cache_append(cache_, layer_, ctx_, &x_t, &x_t, counts);
        } else {
          s = AppendProjected(op, xl, &x, counts);
          if (s == MHA_STATUS_INTERNAL) return;  // the projection itself ran out of arena
        }
        if (!Fits(op)) {
          ExpectFailure(s, nullptr, "an append past the capacity");
          return;
        }
        if (s != MHA_STATUS_OK) {
          if (ArenaOom(s, nullptr, "mha_kv_cache_append")) return;
          Fail(std::string("append failed: ") + mha_status_name(s) + ", " + op_desc_, desc_);
        }
        Commit(tokens);
        CheckLengths();
        if (op.kind == kAppendForward) ForwardLast(op, &out, out_t, ol);
        return;
      }
      case kForward: ForwardLast(op, &out, out_t, ol); return;
      case kForwardTooLong: {
        // Entry n re-queries one token more than it holds.
        Op o = op;
        o.with_counts = true;
        o.counts.assign(static_cast<size_t>(c_.N), 0);
        o.counts[op.n] = static_cast<int64_t>(seqs_[op.n].size()) + 1;
        o.T = std::max<int64_t>(o.T, o.counts[op.n]);
        const Layout xl2 = LayoutOf(c_.N, o.T, c_.d, o.pad, o.token_major);
        const Layout ol2 = LayoutOf(c_.N, o.T, c_.E, o.pad, !o.token_major);
        GuardedBuffer out2(ol2.floats, 4);
        FillInput(o, xl2, {}, &x);
        const mha_tensor x_t = Batched(x.data(), c_.N, o.T, c_.d, xl2);
        const mha_tensor o_t = Batched(out2.data(), c_.N, o.T, c_.E, ol2);
        ExpectFailure(mha_kv_cache_forward(cache_, layer_, ctx_, &x_t, &o_t, o.counts.data()),
                      &out2, "a forward past an entry's length");
        return;
      }
      case kTruncate: {
        const int64_t len = static_cast<int64_t>(seqs_[op.n].size());
        const int64_t to = len == 0 ? 0 : op.length % (len + 1);
        if (mha_kv_cache_truncate(cache_, op.n, to) != MHA_STATUS_OK) {
          Fail("mha_kv_cache_truncate failed, " + op_desc_, desc_);
        }
        seqs_[op.n].resize(static_cast<size_t>(to));
        CheckLengths();
        return;
      }
      case kTruncateBeyond: {
        const int64_t len = static_cast<int64_t>(seqs_[op.n].size());
        const bool bad_entry = op.length % 2 == 1;
        const mha_status s = bad_entry ? mha_kv_cache_truncate(cache_, c_.N + op.n, 0)
                                       : mha_kv_cache_truncate(cache_, op.n, len + 1 + op.length);
        ExpectFailure(s, nullptr, "a truncation beyond the length");
        return;
      }
      case kReset:
        if (mha_kv_cache_reset(cache_) != MHA_STATUS_OK) Fail("mha_kv_cache_reset failed", desc_);
        for (auto& seq : seqs_) seq.clear();
        CheckLengths();
        return;
      case kBadCounts: {
        FillInput(op, xl, {}, &x);
        std::vector<int64_t> bad = op.counts;
        bad[op.n] = op.length % 2 == 0 ? -1 : op.T + 1;
        const mha_tensor x_t = Batched(x.data(), c_.N, op.T, c_.d, xl);
        ExpectFailure(mha_kv_cache_step(cache_, layer_, ctx_, &x_t, &out_t, bad.data()), &out,
                      "a step with a bad count");
        return;
      }
      case kWrongShape: {
        // x with one feature too many, or an output with one too many, or a rank-2 x.
        const int which = static_cast<int>(op.length % 3);
        const Layout xw = LayoutOf(c_.N, op.T, c_.d + 1, op.pad, op.token_major);
        const Layout ow = LayoutOf(c_.N, op.T, c_.E + 1, op.pad, !op.token_major);
        GuardedBuffer wide(std::max(xw.floats, ow.floats), 4);
        FillInput(op, xl, {}, &x);
        mha_tensor x_t = Batched(x.data(), c_.N, op.T, c_.d, xl);
        mha_tensor o_t = out_t;
        if (which == 0) x_t = Batched(wide.data(), c_.N, op.T, c_.d + 1, xw);
        if (which == 1) o_t = Batched(wide.data(), c_.N, op.T, c_.E + 1, ow);
        if (which == 2) {
          x_t.rank = 2;
          x_t.shape[0] = x_t.shape[1], x_t.shape[1] = x_t.shape[2];
          x_t.strides[0] = x_t.strides[1], x_t.strides[1] = 1;
        }
        ExpectFailure(mha_kv_cache_step(cache_, layer_, ctx_, &x_t, &o_t, counts), &out,
                      "a step with a wrong shape");
        if (which != 1) {
          ExpectFailure(mha_kv_cache_append(cache_, layer_, ctx_, &x_t, &x_t, counts), nullptr,
                        "an append with a wrong shape");
        }
        return;
      }
      case kZeroAttnLayer: {
        if (zero_attn_layer_ == nullptr) {
          CreateLayer(/*zero_attn=*/true, &zero_attn_layer_);
          if (zero_attn_layer_ == nullptr) Fail("mha_layer_create (add_zero_attn) failed", desc_);
        }
        FillInput(op, xl, {}, &x);
        const mha_tensor x_t = Batched(x.data(), c_.N, op.T, c_.d, xl);
        const mha_status s = mha_kv_cache_step(cache_, zero_attn_layer_, ctx_, &x_t, &out_t,
                                               counts);
        if (s != MHA_STATUS_UNSUPPORTED) {
          Fail(std::string("a step with an add_zero_attn layer returned ") + mha_status_name(s) +
                   ", want Unsupported, " + op_desc_,
               desc_);
        }
        ExpectFailure(s, &out, "a step with an add_zero_attn layer");
        return;
      }
      default: Fail("unknown op", desc_);
    }
  }

  // mha_layer_project of the new tokens, then mha_kv_cache_append_projected of its k and v.
  // Returns MHA_STATUS_INTERNAL (a value no append returns here) when the projection could not
  // run for lack of arena; nothing is then appended.
  mha_status AppendProjected(const Op& op, const Layout& xl, GuardedBuffer* x,
                             const int64_t* counts) {
    const int64_t hd = c_.E / c_.H;
    // The layer's own layout for Project: [N, T, d] when batch_first, else [T, N, d].
    mha_attention_inputs in;
    std::memset(&in, 0, sizeof(in));
    if (c_.batch_first) {
      in.query = Batched(x->data(), c_.N, op.T, c_.d, xl);
    } else {
      const int64_t shape[3] = {op.T, c_.N, c_.d};
      const int64_t strides[3] = {xl.sT, xl.sN, 1};
      in.query = Tensor(x->data(), MHA_DTYPE_F32, 3, shape, strides);
    }
    const size_t qn = static_cast<size_t>(c_.N * c_.H * op.T * hd);
    const size_t kn = static_cast<size_t>(c_.N * c_.KVH * op.T * hd);
    std::vector<float> q(qn), k(kn), v(kn);
    const int64_t qs[4] = {c_.N, c_.H, op.T, hd}, ks[4] = {c_.N, c_.KVH, op.T, hd};
    const mha_tensor q_t = Tensor(q.data(), MHA_DTYPE_F32, 4, qs, nullptr);
    const mha_tensor k_t = Tensor(k.data(), MHA_DTYPE_F32, 4, ks, nullptr);
    const mha_tensor v_t = Tensor(v.data(), MHA_DTYPE_F32, 4, ks, nullptr);
    // The cache stores keys as given: with RoPE, Project rotates them at the positions they
    // take, len_n + t (the entry's length before the append).
    std::vector<int64_t> positions;
    if (c_.rope != MHA_ROPE_NONE || c_.alibi || c_.window > 0) {
      for (int64_t n = 0; n < c_.N; ++n) {
        for (int64_t t = 0; t < op.T; ++t) {
          positions.push_back(static_cast<int64_t>(seqs_[n].size()) + t);
        }
      }
      const int64_t shape[2] = {c_.N, op.T};
      in.positions = Tensor(positions.data(), MHA_DTYPE_I64, 2, shape, nullptr);
    }
    const mha_status p = mha_layer_project(layer_, ctx_, &in, &q_t, &k_t, &v_t);
    if (p != MHA_STATUS_OK) {
      if (p == MHA_STATUS_OUT_OF_MEMORY && c_.arena != 0) return MHA_STATUS_INTERNAL;
      Fail(std::string("mha_layer_project failed: ") + mha_status_name(p) + ", " + op_desc_,
           desc_);
    }
    return mha_kv_cache_append_projected(cache_, &k_t, &v_t, counts);
  }

  // Forward of the last back[n] tokens of each entry (back[n] <= its length; 0 = padding only).
  void ForwardLast(const Op& op, GuardedBuffer* out, const mha_tensor& out_t, const Layout& ol) {
    std::vector<int64_t> back(static_cast<size_t>(c_.N));
    std::vector<std::vector<std::vector<float>>> tokens(static_cast<size_t>(c_.N));
    for (int64_t n = 0; n < c_.N; ++n) {
      const int64_t len = static_cast<int64_t>(seqs_[n].size());
      back[n] = std::min({op.query_back, len, op.T});
      if (op.with_counts) back[n] = std::min(back[n], op.counts[n]);
      for (int64_t i = len - back[n]; i < len; ++i) tokens[n].push_back(seqs_[n][i]);
    }
    // Without counts every entry must use all T tokens; use counts unless that holds.
    bool all_t = true;
    for (int64_t n = 0; n < c_.N; ++n) all_t = all_t && back[n] == op.T;
    const Layout xl = LayoutOf(c_.N, op.T, c_.d, op.pad, op.token_major);
    GuardedBuffer x;
    FillInput(op, xl, tokens, &x);
    const mha_tensor x_t = Batched(x.data(), c_.N, op.T, c_.d, xl);
    const mha_status s = mha_kv_cache_forward(cache_, layer_, ctx_, &x_t, &out_t,
                                              all_t ? nullptr : back.data());
    if (s != MHA_STATUS_OK) {
      if (ArenaOom(s, out, "mha_kv_cache_forward")) return;
      Fail(std::string("mha_kv_cache_forward failed: ") + mha_status_name(s) + ", " + op_desc_,
           desc_);
    }
    CheckLengths();
    CheckOutput(op, ol, out, back);
  }

  static std::vector<uint8_t> Bytes(GuardedBuffer& b) {
    const uint8_t* p = static_cast<const uint8_t*>(b.data());
    return std::vector<uint8_t>(p, p + b.bytes());
  }

  const Case& c_;
  std::mt19937 rng_;
  std::string desc_, op_desc_;
  std::vector<float> wq_, wk_, wv_, wo_, bias_, bo_;
  std::vector<float> sinks_, q_norm_, k_norm_;  // the variants' tensors (empty: off)
  mha_layer* layer_ = nullptr;
  mha_layer* zero_attn_layer_ = nullptr;
  mha_context* ctx_ = nullptr;
  mha_context* ref_ctx_ = nullptr;
  mha_kv_cache* cache_ = nullptr;
  GuardedBuffer arena_, storage_;
  std::vector<std::vector<std::vector<float>>> seqs_;  // per entry: its tokens' d features
};

}  // namespace
}  // namespace fuzz
}  // namespace mha

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mha::fuzz::ByteReader reader(data, size);
  const mha::fuzz::Case c = mha::fuzz::Decode(&reader);
  mha::fuzz::Runner(c).Run();
  return 0;
}
