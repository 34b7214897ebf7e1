// libFuzzer target for the attention operator through the C API (include/mha/mha.h), checked
// against the double-precision reference (tests/reference/).
//
// Each input decodes (ByteReader, fuzz_util.h) into one bounded case: a layer (E = H * hd <= 256,
// GQA, q/k/v input dims, bias, add_bias_kv, add_zero_attn, batch_first, scale, f32/bf16/f16
// weights as views or copies, packed (both row orders) or separate q/k/v weights, every prepack
// mode) and a forward (N <= 3, L, S <= 96, batched or not, self-attention with key absent or
// aliasing the query, strided, token-major or broadcast (stride 0) input views, attn_mask and
// key_padding_mask of every dtype (bool, u8, f32), rank and stride, fully masked rows, causal,
// attention weights averaged or per head, strided outputs, output in place over the query,
// 1-3 threads, owned or caller arenas), with the attention variants (RoPE neox/gptj with theta,
// partial rotary and scale, ALiBi with the paper's or given slopes, a window, softcap, sinks,
// QK-norm per head or whole, and int32/int64 positions [N, L] / [L] and key positions for the
// layers that use them). The values come from a PRNG seeded by the input's tail.
//
// Checks, any of which aborts with the case's description:
// - a valid case must succeed: output and weights within 2e-5 + 2e-4 |want| of the reference
//   (README "Accuracy"; tests/attention_random_test.cc) computed from the same f32 values (the
//   16-bit weights' values exactly), every byte outside the written elements (64 canary bytes
//   around each buffer, row padding) untouched, inputs unchanged, and, when asked, the same
//   bits on another thread count;
// - an input may also carry one invalidating change (a bad config field, a missing weight, a
//   wrong shape, dtype, stride, flag, rank, NULL): that call must fail with a status and a
//   non-empty message, write nothing (every guarded byte untouched, no handle), and the valid
//   call that follows on the same context must still succeed;
// - a caller arena of Plan's bytes must suffice; a smaller one may only fail with
//   MHA_STATUS_OUT_OF_MEMORY, writing nothing.
// Built by tools/fuzz/run-fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mha/mha.h"
#include "tests/reference/reference_attention.h"
#include "tools/fuzz/fuzz_util.h"

namespace mha {
namespace fuzz {
namespace {

constexpr double kAtol = 2e-5;
constexpr double kRtol = 2e-4;

enum MaskType { kNoMask = 0, kBoolMask, kU8Mask, kF32Mask };

// Invalidating changes, applied to one call only.
enum Invalid {
  kValid = 0,
  // mha_layer_create
  kHeadsNotDividingE,
  kKvHeadsNotDividingHeads,
  kBoolFieldTwo,
  kWeightDtypeBool,
  kPrepackFour,
  kLayoutTwo,
  kBindingTwo,
  kNoOutProj,
  kNoQkvWeights,
  kZeroHeads,
  kNegativeEmbed,
  kViewDtypeMismatch,
  kNegativeQDim,
  kMissingBiasKv,
  kLastCreate = kMissingBiasKv,
  // mha_layer_forward (and mha_layer_plan with the same arguments)
  kQueryFeatures,
  kValueTokens,
  kAttnMaskShape,
  kAttnMaskDtypeBF16,
  kKeyPaddingShape,
  kOutputFeatures,
  kOutputLastStride,
  kWeightsShape,
  kUnknownFlag,
  kQueryNegativeStride,
  kQueryRank5,
  kOutputNull,
  kNullContext,
  kQueryDtypeU8,
  kKeyUnbatched,
  kAttnMask3dSlices,
  kOutputBatch,
  kMaskDtypeNine,
  kCount
};

// Storage of a sequence tensor ([N, T, F] / [T, N, F] / [T, F]).
struct SeqStore {
  int64_t pad = 0;         // floats after each row of F
  bool swapped = false;    // the other of token-major and batch-major storage
  bool broadcast = false;  // batch stride 0: every batch entry reads the same rows
  bool dense_strides = false;  // pass all-zero strides when the layout is dense
};

struct Case {
  // Layer.
  int64_t E = 1, H = 1, KVH = 1, qd = 1, kd = 1, vd = 1;
  bool pass_kvh = false, pass_dims = false;  // explicit values instead of 0 = default
  bool bias = true, bias_kv = false, zero_attn = false, batch_first = false;
  float scale = 0;
  int32_t wdtype = MHA_DTYPE_F32, prepack = MHA_PREPACK_ON;
  bool packed = true;
  int32_t layout = MHA_QKV_LAYOUT_PYTORCH;
  int32_t binding = MHA_WEIGHTS_VIEW;
  bool copy_from_f32 = false;  // kCopy of f32 arrays holding the 16-bit values
  // Forward.
  bool batched = true;
  int64_t N = 1, L = 1, S = 1;
  int self_mode = 0;  // 0 key absent, 1 key/value views of the query, 2 key and value, 3 key only
  SeqStore q, k, v, out;
  int attn = kNoMask;
  bool attn_3d = false, attn_broadcast = false;
  int64_t attn_pad = 0;
  int kpm = kNoMask;
  bool kpm_broadcast = false;
  int64_t kpm_pad = 0;
  int mask_density = 0;  // of 256
  bool full_rows = false;
  bool causal = false;
  int weights = 0;  // 0 none, 1 averaged, 2 per head
  int64_t wpad = 0;
  size_t threads = 1, other_threads = 0;  // other_threads > 0: compare bits with that count
  int arena = 0;  // 0 owned, 1 owned preset, 2 caller = plan, 3 caller misaligned, 4 caller small
  // > 0: both contexts group `group` batch entries (mha_context_options.group_rows = group * L,
  // no byte bound), so the grouped forward runs wherever its rule allows: the bits must not
  // change, and a caller arena of the plan's bytes must hold it.
  int64_t group = 0;
  bool in_place = false;
  float input_scale = 1;
  int invalid = kValid;
  // Attention variants (mha_layer_config's fields; 0 = off).
  int32_t rope = MHA_ROPE_NONE;
  float rope_theta = 0, rope_scale = 0, softcap = 0, qk_norm_eps = 0;
  int64_t rotary_dim = 0, window = 0;
  bool alibi = false, alibi_given = false, sinks = false, qk_norm = false, qk_norm_whole = false;
  // Positions (layers that use them): 0 none, else I32 (1) or I64 (2); `pos_shared`: [L] / [S]
  // instead of [N, L] / [N, S]; `pos_max`: values in [0, pos_max].
  int positions = 0;
  bool pos_shared = false;
  int64_t pos_max = 0;
  uint32_t seed = 0;

  bool self() const { return self_mode <= 1; }
  bool uses_positions() const { return rope != MHA_ROPE_NONE || alibi || window > 0; }
  int64_t St() const { return S + bias_kv + zero_attn; }
  int64_t kvE() const { return KVH * (E / H); }

  std::string Describe() const {
    std::ostringstream os;
    os << "E=" << E << " H=" << H << " KVH=" << KVH << (pass_kvh ? "(passed)" : "")
       << " qd=" << qd << " kd=" << kd << " vd=" << vd << (pass_dims ? "(passed)" : "")
       << " bias=" << bias << " bias_kv=" << bias_kv << " zero_attn=" << zero_attn
       << " batch_first=" << batch_first << " scale=" << scale << " wdtype=" << wdtype
       << " prepack=" << prepack << " packed=" << packed << " layout=" << layout
       << " binding=" << binding << " copy_from_f32=" << copy_from_f32 << " batched=" << batched
       << " N=" << N << " L=" << L << " S=" << S << " self_mode=" << self_mode;
    auto st = [&](const char* name, const SeqStore& s) {
      os << " " << name << "{pad=" << s.pad << " swapped=" << s.swapped
         << " broadcast=" << s.broadcast << " dense=" << s.dense_strides << "}";
    };
    st("q", q);
    st("k", k);
    st("v", v);
    st("out", out);
    os << " attn=" << attn << (attn_3d ? "(3d)" : "") << " attn_broadcast=" << attn_broadcast
       << " attn_pad=" << attn_pad << " kpm=" << kpm << " kpm_broadcast=" << kpm_broadcast
       << " kpm_pad=" << kpm_pad << " density=" << mask_density << " full_rows=" << full_rows
       << " causal=" << causal << " weights=" << weights << " wpad=" << wpad
       << " threads=" << threads << " other_threads=" << other_threads << " arena=" << arena
       << " group=" << group       << " in_place=" << in_place << " input_scale=" << input_scale << " invalid=" << invalid
       << " rope=" << rope << " theta=" << rope_theta << " rd=" << rotary_dim
       << " rope_scale=" << rope_scale << " alibi=" << alibi << (alibi_given ? "(slopes)" : "")
       << " window=" << window << " softcap=" << softcap << " sinks=" << sinks
       << " qk_norm=" << qk_norm << (qk_norm_whole ? "(whole)" : "") << " eps=" << qk_norm_eps
       << " positions=" << positions << (pos_shared ? "(shared)" : "") << " pos_max=" << pos_max
       << " seed=" << seed;
    return os.str();
  }
};

SeqStore DecodeStore(ByteReader* r) {
  SeqStore s;
  const uint8_t b = r->Byte();
  s.pad = (b & 3) == 3 ? (b >> 2) % 5 : 0;
  s.swapped = (b >> 5) & 1;
  s.broadcast = ((b >> 6) & 3) == 3;
  s.dense_strides = (b >> 4) & 1;
  return s;
}

// The attention variants, each off for a zero byte. Layers with add_bias_kv / add_zero_attn
// (Unsupported with positions) get no positional variant.
void DecodeVariants(ByteReader* r, Case* c) {
  const int64_t hd = c->E / c->H;
  const uint8_t a = r->Byte();
  const bool positional = !c->bias_kv && !c->zero_attn;
  if (positional && (a & 3) != 0 && (a & 3) != 3 && hd >= 2) {
    c->rope = (a & 3) == 1 ? MHA_ROPE_NEOX : MHA_ROPE_GPTJ;
    if ((a >> 2) & 1) c->rope_theta = 100.0f * static_cast<float>(1 + r->Byte());
    // An odd head_dim needs a partial rotary_dim (the default, head_dim, must be even).
    if (((a >> 3) & 1) || hd % 2 != 0) c->rotary_dim = 2 * r->Range(1, hd / 2);
    if ((a >> 4) & 1) c->rope_scale = 0.5f + 0.25f * static_cast<float>(r->Byte() % 16);
  }
  const uint8_t b = r->Byte();
  if (positional && (b & 3) == 1) {
    c->alibi = true;
    c->alibi_given = (b >> 2) & 1;
  }
  if (positional && ((b >> 3) & 3) == 1) c->window = r->Range(1, std::max<int64_t>(c->S, c->L) + 2);
  if (((b >> 5) & 3) == 1) c->softcap = 0.25f + 0.25f * static_cast<float>(r->Byte() % 40);
  c->sinks = (b >> 7) & 1;
  const uint8_t q = r->Byte();
  if ((q & 3) == 1) {
    c->qk_norm = true;
    c->qk_norm_whole = (q >> 2) & 1;
    if ((q >> 3) & 1) c->qk_norm_eps = 1e-5f * static_cast<float>(1 + (q >> 4));
  }
  if (c->uses_positions() && ((q >> 4) & 3) != 0) {
    c->positions = ((q >> 4) & 1) ? 1 : 2;
    c->pos_shared = (q >> 6) & 1;
    // Large positions only without ALiBi, whose f32 bias m * |d| would then carry an absolute
    // rounding of about 2^-24 * m * |d| into the probabilities (kernels/softmax.h).
    c->pos_max = !c->alibi && r->Chance(64) ? 100000 : 2 * std::max(c->L, c->S);
  }
}

Case Decode(ByteReader* r) {
  Case c;
  // Most cases are small (E <= 64, L, S <= 24: hundreds of executions per second under ASan);
  // about one in eight reaches the full bounds.
  const bool big = r->Chance(32);
  const Heads heads = DecodeHeads(r, /*max_embed=*/big ? 256 : 64, /*full_heads=*/160);
  c.E = heads.E, c.H = heads.H, c.KVH = heads.KVH;
  c.pass_kvh = r->Bool();
  const uint8_t dims = r->Byte();
  c.bias = (dims & 1) == 0;
  c.bias_kv = (dims >> 1) & 1;
  c.zero_attn = (dims >> 2) & 1;
  c.batch_first = (dims >> 3) & 1;
  c.batched = ((dims >> 4) & 3) != 0;
  c.self_mode = (dims >> 6) & 3;
  c.qd = c.kd = c.vd = c.E;
  const int64_t max_dim = big ? 96 : 40;
  if (r->Chance(64)) c.qd = r->Range(1, max_dim);
  if (!c.self()) {
    if (r->Chance(64)) c.kd = r->Range(1, max_dim);
    if (r->Chance(64)) c.vd = c.self_mode == 3 ? c.kd : r->Range(1, max_dim);
    if (c.self_mode == 3) c.vd = c.kd;  // value absent: value = key
  } else {
    c.kd = c.vd = c.qd;  // key = query
  }
  c.pass_dims = r->Bool() || c.qd != c.E || c.kd != c.E || c.vd != c.E;
  const bool can_pack = c.qd == c.kd && c.kd == c.vd && c.KVH == c.H;
  const uint8_t w = r->Byte();
  c.packed = can_pack && (w & 1) == 0;
  c.layout = (w >> 1) & 1;
  c.wdtype = ((w >> 2) & 3) == 1 ? MHA_DTYPE_BF16 : ((w >> 2) & 3) == 2 ? MHA_DTYPE_F16
                                                                          : MHA_DTYPE_F32;
  c.prepack = (w >> 4) & 3;  // MHA_PREPACK_ON, OFF, PLAIN or STRASSEN
  c.binding = (w >> 6) & 1;
  c.copy_from_f32 = c.binding == MHA_WEIGHTS_COPY && c.wdtype != MHA_DTYPE_F32 && (w >> 7);
  if (r->Chance(40)) c.scale = 0.05f + 0.004f * r->Byte();  // up to 1.07

  c.N = c.batched ? r->Range(1, 3) : 1;
  const int64_t max_len = big ? 96 : 24;
  c.L = r->Range(1, max_len);
  c.S = c.self() ? c.L : r->Range(1, max_len);
  c.q = DecodeStore(r);
  c.k = DecodeStore(r);
  c.v = DecodeStore(r);
  c.out = DecodeStore(r);
  c.out.broadcast = false;
  const uint8_t m = r->Byte();
  c.attn = m & 3;
  c.attn_3d = (m >> 2) & 1;
  c.attn_broadcast = c.attn_3d && ((m >> 3) & 1);
  c.kpm = (m >> 4) & 3;
  c.kpm_broadcast = c.batched && ((m >> 6) & 1);
  c.full_rows = (m >> 7) & 1;
  const uint8_t pads = r->Byte();
  c.attn_pad = (pads & 3) == 3 ? (pads >> 2) % 4 : 0;
  c.kpm_pad = ((pads >> 4) & 3) == 3 ? (pads >> 6) : 0;
  c.mask_density = r->Byte();
  const uint8_t f = r->Byte();
  c.causal = f & 1;
  c.weights = ((f >> 1) & 3) % 3;
  c.wpad = ((f >> 3) & 3) == 3 ? 1 + ((f >> 5) & 3) : 0;
  const uint8_t t = r->Byte();
  c.threads = 1 + t % 3;
  c.other_threads = ((t >> 2) & 3) == 3 ? 1 + (t >> 4) % 3 : 0;
  c.arena = (t >> 6) & 3;
  if (c.arena == 3 && r->Bool()) c.arena = 4;
  c.in_place = c.qd == c.E && !c.q.broadcast && r->Chance(40);
  c.input_scale = r->Chance(40) ? 2.0f : 1.0f;
  c.invalid = r->Chance(48) ? static_cast<int>(r->Range(1, kCount - 1)) : kValid;
  DecodeVariants(r, &c);
  const int group = r->Byte() % 4;
  c.group = group == 0 ? 0 : group + 1;
  c.seed = r->Seed();
  return c;
}

// Strides of a sequence tensor of T tokens and F features over storage `s`, and the floats it
// spans.
struct SeqLayout {
  int64_t sN = 0, sT = 0;
  size_t floats = 0;
};

SeqLayout LayoutOf(const Case& c, const SeqStore& s, int64_t T, int64_t F) {
  SeqLayout l;
  const int64_t row = F + s.pad;
  if (!c.batched) {
    l.sT = row;
    l.floats = static_cast<size_t>(T * row);
    return l;
  }
  if (s.broadcast) {
    l.sN = 0;
    l.sT = row;
    l.floats = static_cast<size_t>(T * row);
    return l;
  }
  const bool token_major = c.batch_first == s.swapped;
  if (token_major) {
    l.sN = row;
    l.sT = c.N * row;
  } else {
    l.sT = row;
    l.sN = T * row;
  }
  l.floats = static_cast<size_t>(c.N * T * row);
  return l;
}

mha_tensor SeqTensor(const Case& c, const SeqStore& s, void* data, int64_t T, int64_t F) {
  const SeqLayout l = LayoutOf(c, s, T, F);
  int64_t shape[3], strides[3];
  int rank;
  if (!c.batched) {
    rank = 2;
    shape[0] = T, shape[1] = F;
    strides[0] = l.sT, strides[1] = 1;
  } else if (c.batch_first) {
    rank = 3;
    shape[0] = c.N, shape[1] = T, shape[2] = F;
    strides[0] = l.sN, strides[1] = l.sT, strides[2] = 1;
  } else {
    rank = 3;
    shape[0] = T, shape[1] = c.N, shape[2] = F;
    strides[0] = l.sT, strides[1] = l.sN, strides[2] = 1;
  }
  bool dense = s.pad == 0 && !s.broadcast && !s.swapped;
  return Tensor(data, MHA_DTYPE_F32, rank, shape, dense && s.dense_strides ? nullptr : strides);
}

// Dense batch-first doubles [N, T, F] of a sequence stored with layout `l`.
std::vector<double> BatchFirst(const Case& c, const SeqLayout& l, const float* x, int64_t T,
                               int64_t F) {
  std::vector<double> out(static_cast<size_t>(c.N * T * F));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) out[(n * T + t) * F + f] = x[n * l.sN + t * l.sT + f];
  return out;
}

// A mask buffer: `kind` values for `count` logical entries.
struct MaskData {
  GuardedBuffer buf;  // holds the mask (never written by mha: checked unchanged)
  std::vector<double> ref;  // dense logical values for the reference
};

int32_t MaskDtype(int kind) {
  return kind == kBoolMask ? MHA_DTYPE_BOOL : kind == kU8Mask ? MHA_DTYPE_U8 : MHA_DTYPE_F32;
}

// Writes a mask value for logical entry (row r of `rows`, column s) into storage element `at`.
void SetMask(int kind, int density, std::mt19937* rng, void* data, int64_t at, double* ref,
             bool force_masked) {
  std::uniform_int_distribution<int> byte(0, 255);
  const bool masked = force_masked || byte(*rng) < density / 2;
  if (kind == kF32Mask) {
    float v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(*rng);
    if (masked) v = -std::numeric_limits<float>::infinity();
    static_cast<float*>(data)[at] = v;
    *ref = v;
  } else {
    uint8_t v = masked ? (kind == kU8Mask ? static_cast<uint8_t>(1 + byte(*rng) % 255) : 1) : 0;
    static_cast<uint8_t*>(data)[at] = v;
    *ref = v;
  }
}

bool Close(double got, double want) {
  return std::abs(got - want) <= kAtol + kRtol * std::abs(want);
}

// Everything one case allocates, so that the checks can compare before and after a call.
struct Buffers {
  GuardedBuffer query, key, value, output, weights, output2, weights2;
  MaskData attn, kpm;
  SeqLayout ql, kl, vl, ol;
  std::vector<uint8_t> query_copy, key_copy, value_copy, attn_copy, kpm_copy;
  mha_attention_inputs in;
  mha_tensor out_t, w_t;
  bool has_weights = false;
  // Positions as stored (int32 or int64 bytes) and expanded for the reference ([N, L], [N, S]).
  std::vector<uint8_t> q_pos_store, k_pos_store;
  std::vector<int64_t> q_pos, k_pos;
};

std::vector<uint8_t> Snapshot(const GuardedBuffer& b) {
  const uint8_t* p = static_cast<const uint8_t*>(const_cast<GuardedBuffer&>(b).data());
  return std::vector<uint8_t>(p, p + b.bytes());
}

bool SameAs(const GuardedBuffer& b, const std::vector<uint8_t>& snap) {
  return snap.empty() ||
         std::memcmp(const_cast<GuardedBuffer&>(b).data(), snap.data(), snap.size()) == 0;
}

class Runner {
 public:
  explicit Runner(const Case& c) : c_(c), rng_(c.seed), desc_(c.Describe()) {}

  void Run() {
    MakeWeights();
    if (c_.invalid != kValid && c_.invalid <= kLastCreate) CreateInvalid();
    mha_layer* layer = nullptr;
    mha_layer_config config = Config();
    mha_layer_weights weights = Weights();
    if (mha_layer_create(&config, &weights, c_.binding, &layer) != MHA_STATUS_OK) {
      Fail("mha_layer_create rejected a valid layer", desc_);
    }
    std::unique_ptr<mha_layer, void (*)(mha_layer*)> layer_owner(layer, mha_layer_destroy);
    MakeInputs();
    const uint32_t flags = Flags();

    size_t plan = 0;
    if (mha_layer_plan(layer, &b_.in, &b_.out_t, b_.has_weights ? &b_.w_t : nullptr, flags,
                       c_.threads, &plan) != MHA_STATUS_OK) {
      Fail("mha_layer_plan rejected a valid forward", desc_);
    }
    std::vector<uint8_t> arena_storage;
    mha_context_options o = OptionsFor(c_.threads);
    if (c_.arena == 1) o.arena_bytes = plan / 2;
    if (c_.arena >= 2) {
      const size_t misalign = c_.arena == 3 ? 8 : 0;
      const size_t bytes = c_.arena == 4 ? plan / 2 : plan + (c_.arena == 3 ? 64 : 0);
      arena_storage.assign(bytes + misalign + 64, 0);
      uintptr_t p = reinterpret_cast<uintptr_t>(arena_storage.data());
      p = (p + 63) / 64 * 64 + misalign;
      o.arena_buffer = reinterpret_cast<void*>(p);
      o.arena_bytes = bytes;
    }
    mha_context* ctx = nullptr;
    if (mha_context_create(&o, &ctx) != MHA_STATUS_OK) {
      // A caller buffer too small for even the arena's alignment unit is rejected here.
      if (c_.arena >= 2 && o.arena_bytes < 128 && std::strlen(mha_last_error_message()) > 0) {
        return;
      }
      Fail("mha_context_create failed", desc_);
    }
    std::unique_ptr<mha_context, void (*)(mha_context*)> ctx_owner(ctx, mha_context_destroy);

    if (c_.invalid > kLastCreate) ForwardInvalid(layer, ctx, flags);

    const mha_status s = mha_layer_forward(layer, ctx, &b_.in, &b_.out_t,
                                           b_.has_weights ? &b_.w_t : nullptr, flags);
    if (s != MHA_STATUS_OK) {
      if (c_.arena == 4 && s == MHA_STATUS_OUT_OF_MEMORY) {
        ExpectNothingWritten("mha_layer_forward out of arena memory");
        return;
      }
      Fail(std::string("mha_layer_forward failed: ") + mha_status_name(s), desc_);
    }
    CheckInputsUnchanged("mha_layer_forward");
    CheckAgainstReference();
    if (c_.other_threads != 0 && !c_.in_place) CheckOtherThreadCount(layer, flags);
  }

 private:
  // ---- layer ----
  void MakeWeights() {
    const int64_t E = c_.E, kvE = c_.kvE();
    if (c_.packed) {
      RandomFill(&in_proj_, static_cast<size_t>(3 * E * c_.qd), WBound(c_.qd), &rng_);
      in_proj16_ = RoundWeights(c_.wdtype, &in_proj_);
    } else {
      RandomFill(&wq_, static_cast<size_t>(E * c_.qd), WBound(c_.qd), &rng_);
      RandomFill(&wk_, static_cast<size_t>(kvE * c_.kd), WBound(c_.kd), &rng_);
      RandomFill(&wv_, static_cast<size_t>(kvE * c_.vd), WBound(c_.vd), &rng_);
      wq16_ = RoundWeights(c_.wdtype, &wq_);
      wk16_ = RoundWeights(c_.wdtype, &wk_);
      wv16_ = RoundWeights(c_.wdtype, &wv_);
    }
    RandomFill(&wo_, static_cast<size_t>(E * E), WBound(E), &rng_);
    wo16_ = RoundWeights(c_.wdtype, &wo_);
    if (c_.bias) {
      RandomFill(&in_bias_, static_cast<size_t>(E + 2 * kvE), 0.5f, &rng_);
      RandomFill(&bo_, static_cast<size_t>(E), 0.5f, &rng_);
    }
    if (c_.bias_kv) {
      RandomFill(&bias_k_, static_cast<size_t>(kvE), 1.0f, &rng_);
      RandomFill(&bias_v_, static_cast<size_t>(kvE), 1.0f, &rng_);
    }
    const int64_t hd = E / c_.H;
    if (c_.sinks) RandomFill(&sinks_, static_cast<size_t>(c_.H), 2.0f, &rng_);
    if (c_.alibi_given) {
      RandomFill(&slopes_, static_cast<size_t>(c_.H), 0.5f, &rng_);
      for (float& x : slopes_) x += 0.5f;  // (0, 1)
    }
    if (c_.qk_norm) {
      RandomFill(&q_norm_, static_cast<size_t>(c_.qk_norm_whole ? E : hd), 0.5f, &rng_);
      RandomFill(&k_norm_, static_cast<size_t>(c_.qk_norm_whole ? kvE : hd), 0.5f, &rng_);
      for (float& x : q_norm_) x += 1.0f;
      for (float& x : k_norm_) x += 1.0f;
    }
  }
  static float WBound(int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); }

  mha_layer_config Config() const {
    mha_layer_config config;
    mha_layer_config_init(&config);
    config.embed_dim = c_.E;
    config.num_heads = c_.H;
    config.num_kv_heads = c_.pass_kvh || c_.KVH != c_.H ? c_.KVH : 0;
    if (c_.pass_dims) {
      config.q_dim = c_.qd;
      config.kdim = c_.kd;
      config.vdim = c_.vd;
    }
    config.no_bias = c_.bias ? 0 : 1;
    config.add_bias_kv = c_.bias_kv;
    config.add_zero_attn = c_.zero_attn;
    config.batch_first = c_.batch_first;
    config.scale = c_.scale;
    config.weight_dtype = c_.wdtype;
    config.prepack = c_.prepack;
    config.rope = c_.rope;
    config.rope_theta = c_.rope_theta;
    config.rotary_dim = c_.rotary_dim;
    config.rope_scale = c_.rope_scale;
    config.alibi = c_.alibi;
    config.window = c_.window;
    config.softcap = c_.softcap;
    config.qk_norm_eps = c_.qk_norm_eps;
    config.qk_norm_whole = c_.qk_norm_whole;
    return config;
  }

  // The arrays given to mha_layer_create: 16-bit encodings, or f32 values.
  const void* W(const std::vector<float>& f32, const std::vector<uint16_t>& bits) const {
    const bool sixteen = c_.wdtype != MHA_DTYPE_F32 && !c_.copy_from_f32;
    return sixteen ? static_cast<const void*>(bits.data()) : static_cast<const void*>(f32.data());
  }

  mha_layer_weights Weights() const {
    mha_layer_weights w;
    std::memset(&w, 0, sizeof(w));
    w.dtype = c_.copy_from_f32 ? MHA_DTYPE_F32 : c_.wdtype;
    if (c_.packed) {
      w.in_proj_weight = W(in_proj_, in_proj16_);
      w.qkv_layout = c_.layout;
    } else {
      w.q_proj_weight = W(wq_, wq16_);
      w.k_proj_weight = W(wk_, wk16_);
      w.v_proj_weight = W(wv_, wv16_);
    }
    w.in_proj_bias = c_.bias ? in_bias_.data() : nullptr;
    w.out_proj_weight = W(wo_, wo16_);
    w.out_proj_bias = c_.bias ? bo_.data() : nullptr;
    if (c_.bias_kv) {
      w.bias_k = bias_k_.data();
      w.bias_v = bias_v_.data();
    }
    if (c_.sinks) w.sinks = sinks_.data();
    if (c_.alibi_given) w.alibi_slopes = slopes_.data();
    if (c_.qk_norm) {
      w.q_norm_weight = q_norm_.data();
      w.k_norm_weight = k_norm_.data();
    }
    return w;
  }

  void CreateInvalid() {
    mha_layer_config config = Config();
    mha_layer_weights w = Weights();
    int32_t binding = c_.binding;
    switch (c_.invalid) {
      case kHeadsNotDividingE: config.num_heads = c_.E + 1; break;
      case kKvHeadsNotDividingHeads: config.num_kv_heads = c_.H + 1; break;
      case kBoolFieldTwo: config.add_zero_attn = 2; break;
      case kWeightDtypeBool: config.weight_dtype = MHA_DTYPE_BOOL; break;
      case kPrepackFour: config.prepack = 4; break;
      case kLayoutTwo: w.qkv_layout = 2; break;
      case kBindingTwo: binding = 2; break;
      case kNoOutProj: w.out_proj_weight = nullptr; break;
      case kNoQkvWeights:
        w.in_proj_weight = w.q_proj_weight = w.k_proj_weight = w.v_proj_weight = nullptr;
        break;
      case kZeroHeads: config.num_heads = 0; break;
      case kNegativeEmbed: config.embed_dim = -c_.E; break;
      case kViewDtypeMismatch:
        binding = MHA_WEIGHTS_VIEW;
        w.dtype = c_.wdtype == MHA_DTYPE_F32 ? MHA_DTYPE_BF16 : MHA_DTYPE_F32;
        // The per-head packed layout is always copied (reordered), so it converts any dtype.
        w.qkv_layout = MHA_QKV_LAYOUT_PYTORCH;
        break;
      case kNegativeQDim: config.q_dim = -1; break;
      case kMissingBiasKv:
        if (c_.bias_kv) {
          w.bias_v = nullptr;
        } else {
          config.num_heads = 0;
        }
        break;
      default: Fail("unknown create mutation", desc_);
    }
    mha_layer* sentinel = reinterpret_cast<mha_layer*>(uintptr_t{0x5a5a});
    mha_layer* out = sentinel;
    const mha_status s = mha_layer_create(&config, &w, binding, &out);
    if (s == MHA_STATUS_OK) {
      mha_layer_destroy(out);
      Fail("mha_layer_create accepted an invalid layer", desc_);
    }
    if (out != sentinel) Fail("failed mha_layer_create wrote *out", desc_);
    if (std::strlen(mha_last_error_message()) == 0) {
      Fail("failed mha_layer_create left no message", desc_);
    }
  }

  // ---- inputs and outputs ----
  void FillSeq(GuardedBuffer* buf, const SeqLayout& l, int64_t T, int64_t F) {
    buf->Reset(l.floats, 4);
    std::uniform_real_distribution<float> u(-c_.input_scale, c_.input_scale);
    // Padding keeps the canary byte; only elements get values.
    for (int64_t n = 0; n < (c_.batched && l.sN != 0 ? c_.N : 1); ++n)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < F; ++f) buf->f32()[n * l.sN + t * l.sT + f] = u(rng_);
  }

  void MakeInputs() {
    std::memset(&b_.in, 0, sizeof(b_.in));
    b_.ql = LayoutOf(c_, c_.q, c_.L, c_.qd);
    FillSeq(&b_.query, b_.ql, c_.L, c_.qd);
    b_.in.query = SeqTensor(c_, c_.q, b_.query.data(), c_.L, c_.qd);
    if (c_.self_mode == 1) {
      b_.in.key = b_.in.query;  // overlapping views: key and value read the query's memory
      b_.in.value = b_.in.query;
    } else if (c_.self_mode >= 2) {
      b_.kl = LayoutOf(c_, c_.k, c_.S, c_.kd);
      FillSeq(&b_.key, b_.kl, c_.S, c_.kd);
      b_.in.key = SeqTensor(c_, c_.k, b_.key.data(), c_.S, c_.kd);
      if (c_.self_mode == 2) {
        b_.vl = LayoutOf(c_, c_.v, c_.S, c_.vd);
        FillSeq(&b_.value, b_.vl, c_.S, c_.vd);
        b_.in.value = SeqTensor(c_, c_.v, b_.value.data(), c_.S, c_.vd);
      }
    }
    MakeMasks();
    MakePositions();
    // Output: the query's layout with E features, or the query's own memory (in place).
    b_.ol = LayoutOf(c_, c_.in_place ? c_.q : c_.out, c_.L, c_.E);
    if (!c_.in_place) b_.output.Reset(b_.ol.floats, 4);
    b_.out_t = SeqTensor(c_, c_.in_place ? c_.q : c_.out,
                         c_.in_place ? b_.query.data() : b_.output.data(), c_.L, c_.E);
    b_.has_weights = c_.weights != 0;
    if (b_.has_weights) {
      const int64_t heads = c_.weights == 2 ? c_.H : 1;
      const int64_t row = c_.St() + c_.wpad;
      b_.weights.Reset(static_cast<size_t>(c_.N * heads * c_.L * row), 4);
      int64_t shape[4], strides[4];
      int rank = 0;
      if (c_.batched) shape[rank] = c_.N, strides[rank++] = heads * c_.L * row;
      if (c_.weights == 2) shape[rank] = c_.H, strides[rank++] = c_.L * row;
      shape[rank] = c_.L, strides[rank++] = row;
      shape[rank] = c_.St(), strides[rank++] = 1;
      b_.w_t = Tensor(b_.weights.data(), MHA_DTYPE_F32, rank, shape, strides);
    }
    b_.query_copy = Snapshot(b_.query);
    b_.key_copy = Snapshot(b_.key);
    b_.value_copy = Snapshot(b_.value);
    b_.attn_copy = Snapshot(b_.attn.buf);
    b_.kpm_copy = Snapshot(b_.kpm.buf);
  }

  // Random positions (any order: non-monotone ones are valid) for the queries and, in
  // cross-attention, for the keys; the reference gets them expanded to [N, L] / [N, S].
  void MakePositions() {
    b_.q_pos.clear();
    b_.k_pos.clear();
    if (c_.positions == 0) return;
    auto make = [&](int64_t T, std::vector<int64_t>* ref, std::vector<uint8_t>* store,
                    mha_tensor* t) {
      const bool shared = c_.pos_shared || !c_.batched;
      const int64_t stored = shared ? T : c_.N * T;
      std::uniform_int_distribution<int64_t> u(0, c_.pos_max);
      const size_t esize = c_.positions == 1 ? 4 : 8;
      store->assign(static_cast<size_t>(stored) * esize, 0);
      std::vector<int64_t> values(static_cast<size_t>(stored));
      for (int64_t i = 0; i < stored; ++i) {
        values[i] = u(rng_);
        if (esize == 4) {
          const int32_t v = static_cast<int32_t>(values[i]);
          std::memcpy(store->data() + 4 * i, &v, 4);
        } else {
          std::memcpy(store->data() + 8 * i, &values[i], 8);
        }
      }
      ref->resize(static_cast<size_t>(c_.N * T));
      for (int64_t n = 0; n < c_.N; ++n)
        for (int64_t i = 0; i < T; ++i) (*ref)[n * T + i] = values[shared ? i : n * T + i];
      const int64_t shape[2] = {c_.N, T};
      *t = shared ? Tensor(store->data(), c_.positions == 1 ? MHA_DTYPE_I32 : MHA_DTYPE_I64, 1,
                           shape + 1, nullptr)
                  : Tensor(store->data(), c_.positions == 1 ? MHA_DTYPE_I32 : MHA_DTYPE_I64, 2,
                           shape, nullptr);
    };
    make(c_.L, &b_.q_pos, &b_.q_pos_store, &b_.in.positions);
    // Key/value views equal to the query's (self_mode 1) are self-attention too: the keys share
    // the query positions and take no key_positions.
    if (c_.self_mode >= 2) make(c_.S, &b_.k_pos, &b_.k_pos_store, &b_.in.key_positions);
  }

  void MakeMasks() {
    const int64_t L = c_.L, S = c_.S;
    const int64_t slices = c_.attn_3d ? c_.N * c_.H : 1;
    if (c_.attn != kNoMask) {
      const size_t esize = c_.attn == kF32Mask ? 4 : 1;
      const int64_t row = S + c_.attn_pad;
      const int64_t stored = c_.attn_broadcast ? 1 : slices;
      b_.attn.buf.Reset(static_cast<size_t>(stored * L * row), esize);
      b_.attn.ref.assign(static_cast<size_t>(slices * L * S), 0.0);
      // Fully masked rows: a random row of each stored slice.
      std::vector<int64_t> full(static_cast<size_t>(stored), -1);
      if (c_.full_rows) {
        for (auto& r : full) r = std::uniform_int_distribution<int64_t>(0, L - 1)(rng_);
      }
      for (int64_t z = 0; z < stored; ++z)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t s = 0; s < S; ++s) {
            double v;
            SetMask(c_.attn, c_.mask_density, &rng_, b_.attn.buf.data(), (z * L + l) * row + s,
                    &v, full[z] == l);
            for (int64_t zz = c_.attn_broadcast ? 0 : z; zz < (c_.attn_broadcast ? slices : z + 1);
                 ++zz) {
              b_.attn.ref[(zz * L + l) * S + s] = v;
            }
          }
      int64_t shape[3] = {slices, L, S}, strides[3] = {c_.attn_broadcast ? 0 : L * row, row, 1};
      b_.in.attn_mask = c_.attn_3d ? Tensor(b_.attn.buf.data(), MaskDtype(c_.attn), 3, shape,
                                            strides)
                                   : Tensor(b_.attn.buf.data(), MaskDtype(c_.attn), 2, shape + 1,
                                            strides + 1);
    }
    if (c_.kpm != kNoMask) {
      const size_t esize = c_.kpm == kF32Mask ? 4 : 1;
      const int64_t row = S + c_.kpm_pad;
      const int64_t stored = c_.kpm_broadcast ? 1 : c_.N;
      b_.kpm.buf.Reset(static_cast<size_t>(stored * row), esize);
      b_.kpm.ref.assign(static_cast<size_t>(c_.N * S), 0.0);
      const int64_t full = c_.full_rows && c_.kpm != kF32Mask ? 0 : -1;  // entry 0 all padding
      for (int64_t z = 0; z < stored; ++z)
        for (int64_t s = 0; s < S; ++s) {
          double v;
          SetMask(c_.kpm, c_.mask_density, &rng_, b_.kpm.buf.data(), z * row + s, &v,
                  full == z && (c_.mask_density & 1));
          for (int64_t zz = c_.kpm_broadcast ? 0 : z; zz < (c_.kpm_broadcast ? c_.N : z + 1); ++zz) {
            b_.kpm.ref[zz * S + s] = v;
          }
        }
      int64_t shape[2] = {c_.N, S}, strides[2] = {c_.kpm_broadcast ? 0 : row, 1};
      b_.in.key_padding_mask =
          c_.batched ? Tensor(b_.kpm.buf.data(), MaskDtype(c_.kpm), 2, shape, strides)
                     : Tensor(b_.kpm.buf.data(), MaskDtype(c_.kpm), 1, shape + 1, strides + 1);
    }
  }

  uint32_t Flags() const {
    return (c_.causal ? MHA_FORWARD_CAUSAL : 0u) | (c_.weights == 2 ? MHA_FORWARD_PER_HEAD_WEIGHTS
                                                                    : 0u);
  }

  // ---- checks ----
  void CheckInputsUnchanged(const char* call) {
    if (!c_.in_place && !SameAs(b_.query, b_.query_copy)) {
      Fail(std::string(call) + " modified the query", desc_);
    }
    if (!SameAs(b_.key, b_.key_copy) || !SameAs(b_.value, b_.value_copy)) {
      Fail(std::string(call) + " modified the key or value", desc_);
    }
    if (!SameAs(b_.attn.buf, b_.attn_copy) || !SameAs(b_.kpm.buf, b_.kpm_copy)) {
      Fail(std::string(call) + " modified a mask", desc_);
    }
  }

  void ExpectNothingWritten(const std::string& call) {
    if (std::strlen(mha_last_error_message()) == 0) Fail(call + " left no message", desc_);
    if (!c_.in_place && !b_.output.Untouched()) Fail(call + " wrote the output", desc_);
    if (b_.has_weights && !b_.weights.Untouched()) {
      Fail(call + " wrote the attention weights", desc_);
    }
    CheckInputsUnchanged(call.c_str());
    if (c_.in_place && !SameAs(b_.query, b_.query_copy)) {
      Fail(call + " wrote the output (in place over the query)", desc_);
    }
  }

  void ForwardInvalid(mha_layer* layer, mha_context* ctx, uint32_t flags) {
    mha_attention_inputs in = b_.in;
    mha_tensor out = b_.out_t;
    mha_tensor w = b_.w_t;
    bool has_w = b_.has_weights;
    mha_context* context = ctx;
    std::vector<uint8_t> scratch(64, kCanaryByte);
    switch (c_.invalid) {
      case kQueryFeatures: in.query.shape[in.query.rank - 1] += 1; break;
      case kValueTokens:
        if (in.value.data == nullptr) in.value = in.key.data ? in.key : in.query;
        in.value.shape[c_.batched && c_.batch_first ? 1 : 0] += 1;
        break;
      case kAttnMaskShape:
        if (in.attn_mask.data == nullptr) {
          int64_t shape[2] = {c_.L, c_.S + 1};
          in.attn_mask = Tensor(scratch.data(), MHA_DTYPE_BOOL, 2, shape, nullptr);
          scratch.assign(static_cast<size_t>(c_.L * (c_.S + 1)), 0);
          in.attn_mask.data = scratch.data();
        } else {
          in.attn_mask.shape[in.attn_mask.rank - 2] += 1;
        }
        break;
      case kAttnMaskDtypeBF16:
        if (in.attn_mask.data == nullptr) {
          int64_t shape[2] = {c_.L, c_.S};
          scratch.assign(static_cast<size_t>(2 * c_.L * c_.S), 0);
          in.attn_mask = Tensor(scratch.data(), MHA_DTYPE_BF16, 2, shape, nullptr);
        } else {
          in.attn_mask.dtype = MHA_DTYPE_BF16;
          // Strides in elements: a 1-byte mask read as 2-byte elements would exceed its buffer
          // if it were accepted; the call must fail on the dtype first.
        }
        break;
      case kKeyPaddingShape:
        if (in.key_padding_mask.data == nullptr) {
          int64_t shape[2] = {c_.N, c_.S + 1};
          scratch.assign(static_cast<size_t>(c_.N * (c_.S + 1)), 0);
          in.key_padding_mask = c_.batched
                                    ? Tensor(scratch.data(), MHA_DTYPE_U8, 2, shape, nullptr)
                                    : Tensor(scratch.data(), MHA_DTYPE_U8, 1, shape + 1, nullptr);
        } else {
          in.key_padding_mask.shape[in.key_padding_mask.rank - 1] += 1;
        }
        break;
      case kOutputFeatures: out.shape[out.rank - 1] += 1; break;
      case kOutputLastStride:
        if (c_.E == 1) {
          out.shape[out.rank - 1] = 0;  // an empty output
        } else {
          FillStrides(&out);
          out.strides[out.rank - 1] = 2;
        }
        break;
      case kWeightsShape:
        if (has_w) {
          w.shape[w.rank - 1] -= 1;
        } else {
          // Weights of an unbatched shape for a batched forward, or the other way round.
          has_w = true;
          const int64_t St = c_.St();
          int64_t shape[3] = {c_.N, c_.L, St};
          scratch.assign(static_cast<size_t>(4 * c_.N * c_.L * St), kCanaryByte);
          w = c_.batched ? Tensor(scratch.data(), MHA_DTYPE_F32, 2, shape + 1, nullptr)
                         : Tensor(scratch.data(), MHA_DTYPE_F32, 3, shape, nullptr);
          if (!c_.batched) w.shape[0] = 2;  // [2, L, S'] is not [H, L, S'] unless H == 2
          if (!c_.batched && c_.H == 2) w.shape[0] = 3;
          scratch.resize(static_cast<size_t>(4 * 3 * c_.L * St), kCanaryByte);
          w.data = scratch.data();
        }
        break;
      case kUnknownFlag: flags |= 4u; break;
      case kQueryNegativeStride:
        FillStrides(&in.query);
        in.query.strides[0] = -1;
        break;
      case kQueryRank5: in.query.rank = 5; break;
      case kOutputNull: out.data = nullptr; break;
      case kNullContext: context = nullptr; break;
      case kQueryDtypeU8: in.query.dtype = MHA_DTYPE_U8; break;
      case kKeyUnbatched:
        if (in.key.data == nullptr) in.key = in.query;
        if (in.key.rank == 3) {
          // Drop the batch dimension.
          const int bd = c_.batch_first ? 0 : 1;
          FillStrides(&in.key);
          for (int i = bd; i < 2; ++i) {
            in.key.shape[i] = in.key.shape[i + 1];
            in.key.strides[i] = in.key.strides[i + 1];
          }
          in.key.rank = 2;
          if (in.value.data == nullptr) in.value = in.key;  // keep value consistent
        } else {
          int64_t shape[3] = {1, in.key.shape[0], in.key.shape[1]};
          FillStrides(&in.key);
          int64_t strides[3] = {0, in.key.strides[0], 1};
          in.key = Tensor(in.key.data, MHA_DTYPE_F32, 3, shape, strides);
          if (in.value.data == nullptr) in.value = in.key;
        }
        break;
      case kAttnMask3dSlices:
        if (in.attn_mask.data != nullptr && in.attn_mask.rank == 3) {
          in.attn_mask.shape[0] += 1;
        } else {
          flags |= 8u;
        }
        break;
      case kOutputBatch:
        if (c_.batched) {
          out.shape[c_.batch_first ? 0 : 1] += 1;
        } else {
          out.shape[0] += 1;  // L + 1 rows
        }
        break;
      case kMaskDtypeNine:
        if (in.key_padding_mask.data != nullptr) {
          in.key_padding_mask.dtype = 9;
        } else {
          in.query.dtype = 9;
        }
        break;
      default: Fail("unknown forward mutation", desc_);
    }
    size_t plan_bytes = 12345;
    const mha_status p =
        mha_layer_plan(layer, &in, &out, has_w ? &w : nullptr, flags, c_.threads, &plan_bytes);
    // Plan takes no context and reads no output data (NULL is allowed there).
    if (c_.invalid != kNullContext && c_.invalid != kOutputNull) {
      if (p == MHA_STATUS_OK) Fail("mha_layer_plan accepted an invalid forward", desc_);
      if (plan_bytes != 12345) Fail("failed mha_layer_plan wrote *workspace_bytes", desc_);
      if (std::strlen(mha_last_error_message()) == 0) {
        Fail("failed mha_layer_plan left no message", desc_);
      }
    }
    const mha_status s = mha_layer_forward(layer, context, &in, &out, has_w ? &w : nullptr, flags);
    if (s == MHA_STATUS_OK) Fail("mha_layer_forward accepted an invalid forward", desc_);
    ExpectNothingWritten("invalid mha_layer_forward");
    for (uint8_t x : scratch) {
      if (x != kCanaryByte && x != 0) Fail("invalid mha_layer_forward wrote a scratch tensor", desc_);
    }
  }

  // Makes a tensor's strides explicit (all-zero strides mean dense).
  static void FillStrides(mha_tensor* t) {
    bool dense = true;
    for (int i = 0; i < t->rank; ++i) dense = dense && t->strides[i] == 0;
    if (!dense) return;
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; --i) {
      t->strides[i] = s;
      s *= t->shape[i];
    }
  }

  void CheckAgainstReference() {
    reference::Outputs ref;
    RunReference(&ref);
    const int64_t E = c_.E;
    // Output elements written, for the canary check.
    GuardedBuffer& obuf = c_.in_place ? b_.query : b_.output;
    std::vector<char> written(obuf.elements(), 0);
    for (int64_t n = 0; n < c_.N; ++n)
      for (int64_t l = 0; l < c_.L; ++l)
        for (int64_t e = 0; e < E; ++e) {
          const int64_t at = n * b_.ol.sN + l * b_.ol.sT + e;
          written[static_cast<size_t>(at)] = 1;
          const double want = ref.output[(n * c_.L + l) * E + e];
          const double got = obuf.f32()[at];
          if (!Close(got, want)) {
            std::ostringstream os;
            os << "output[n=" << n << ", l=" << l << ", e=" << e << "] = " << got << ", want "
               << want;
            Fail(os.str(), desc_);
          }
        }
    if (c_.in_place) {
      // The query's padding must keep its canary bytes.
      if (!b_.query.OnlyWrote(written)) Fail("forward wrote outside the output's elements", desc_);
    } else if (!b_.output.OnlyWrote(written)) {
      Fail("forward wrote outside the output's elements", desc_);
    }
    if (!b_.has_weights) return;
    const int64_t St = ref.total_src_len;
    const int64_t heads = c_.weights == 2 ? c_.H : 1;
    const int64_t row = St + c_.wpad;
    const std::vector<double>& want_w = c_.weights == 2 ? ref.head_weights : ref.mean_weights;
    std::vector<char> wwritten(b_.weights.elements(), 0);
    for (int64_t i = 0; i < c_.N * heads * c_.L; ++i)
      for (int64_t s = 0; s < St; ++s) {
        wwritten[static_cast<size_t>(i * row + s)] = 1;
        const double got = b_.weights.f32()[i * row + s];
        const double want = want_w[i * St + s];
        if (!Close(got, want)) {
          std::ostringstream os;
          os << "attn_weights[row " << i << ", col " << s << "] = " << got << ", want " << want;
          Fail(os.str(), desc_);
        }
      }
    if (!b_.weights.OnlyWrote(wwritten)) {
      Fail("forward wrote outside the attention weights' elements", desc_);
    }
  }

  void RunReference(reference::Outputs* out) {
    const int64_t E = c_.E, kvE = c_.kvE(), hd = E / c_.H;
    reference::Config rc;
    rc.embed_dim = E;
    rc.num_heads = c_.H;
    rc.num_kv_heads = c_.KVH;
    rc.q_dim = c_.qd;
    rc.kdim = c_.kd;
    rc.vdim = c_.vd;
    rc.bias = c_.bias;
    rc.add_bias_kv = c_.bias_kv;
    rc.add_zero_attn = c_.zero_attn;
    rc.causal = c_.causal;
    rc.scale = c_.scale;
    rc.rope = c_.rope == MHA_ROPE_NEOX   ? reference::Rope::kNeox
              : c_.rope == MHA_ROPE_GPTJ ? reference::Rope::kGptj
                                         : reference::Rope::kNone;
    rc.rope_theta = c_.rope_theta;
    rc.rotary_dim = c_.rotary_dim;
    rc.rope_scale = c_.rope_scale;
    rc.alibi = c_.alibi;
    rc.alibi_slopes.assign(slopes_.begin(), slopes_.end());
    rc.window = c_.window;
    rc.softcap = c_.softcap;
    rc.sinks.assign(sinks_.begin(), sinks_.end());
    rc.q_norm.assign(q_norm_.begin(), q_norm_.end());
    rc.k_norm.assign(k_norm_.begin(), k_norm_.end());
    rc.qk_norm_whole = c_.qk_norm_whole;
    rc.qk_norm_eps = c_.qk_norm_eps;
    reference::Weights w;
    std::vector<double> bias(in_bias_.begin(), in_bias_.end());
    if (c_.packed) {
      // Rows into q, k, v order (per-head layout: head h holds its q, k, v rows in turn).
      const int64_t qd = c_.qd;
      std::vector<double> rows(static_cast<size_t>(3 * E * qd));
      std::vector<double> brows(bias.size());
      for (int64_t r = 0; r < 3 * E; ++r) {
        int64_t src = r;
        if (c_.layout == MHA_QKV_LAYOUT_PER_HEAD) {
          const int64_t part = r / E, h = (r % E) / hd, d = r % hd;
          src = (h * 3 + part) * hd + d;
        }
        for (int64_t i = 0; i < qd; ++i) rows[r * qd + i] = in_proj_[src * qd + i];
        if (c_.bias) brows[r] = bias[src];
      }
      w.wq.assign(rows.begin(), rows.begin() + E * qd);
      w.wk.assign(rows.begin() + E * qd, rows.begin() + 2 * E * qd);
      w.wv.assign(rows.begin() + 2 * E * qd, rows.end());
      bias = brows;
    } else {
      w.wq.assign(wq_.begin(), wq_.end());
      w.wk.assign(wk_.begin(), wk_.end());
      w.wv.assign(wv_.begin(), wv_.end());
    }
    if (c_.bias) {
      w.bq.assign(bias.begin(), bias.begin() + E);
      w.bk.assign(bias.begin() + E, bias.begin() + E + kvE);
      w.bv.assign(bias.begin() + E + kvE, bias.end());
      w.bo.assign(bo_.begin(), bo_.end());
    }
    w.wo.assign(wo_.begin(), wo_.end());
    if (c_.bias_kv) {
      w.bias_k.assign(bias_k_.begin(), bias_k_.end());
      w.bias_v.assign(bias_v_.begin(), bias_v_.end());
    }
    reference::Inputs in;
    in.batch = c_.N;
    in.tgt_len = c_.L;
    in.src_len = c_.S;
    in.self_attention = c_.self();  // keys take the query positions
    in.positions = b_.q_pos;
    in.key_positions = b_.k_pos;
    // The query's values before an in-place forward overwrote them.
    in.query = BatchFirst(c_, b_.ql, reinterpret_cast<const float*>(b_.query_copy.data()), c_.L,
                          c_.qd);
    if (c_.self_mode <= 1) {
      in.key = in.value = in.query;
    } else {
      in.key = BatchFirst(c_, b_.kl, reinterpret_cast<const float*>(b_.key_copy.data()), c_.S,
                          c_.kd);
      in.value = c_.self_mode == 2 ? BatchFirst(c_, b_.vl,
                                                reinterpret_cast<const float*>(b_.value_copy.data()),
                                                c_.S, c_.vd)
                                   : in.key;
    }
    auto kind = [](int m) {
      return m == kF32Mask ? reference::MaskKind::kFloat : reference::MaskKind::kBool;
    };
    if (c_.attn != kNoMask) {
      in.attn_mask_kind = kind(c_.attn);
      in.attn_mask_3d = c_.attn_3d;
      in.attn_mask = b_.attn.ref;
    }
    if (c_.kpm != kNoMask) {
      in.key_padding_mask_kind = kind(c_.kpm);
      in.key_padding_mask = b_.kpm.ref;
    }
    reference::Attention(rc, w, in, out);
  }

  // Options of a context of `threads` threads with the case's grouping.
  mha_context_options OptionsFor(size_t threads) const {
    mha_context_options o;
    std::memset(&o, 0, sizeof(o));
    o.num_threads = threads;
    if (c_.group > 0) {
      o.group_rows = static_cast<size_t>(c_.group * c_.L);
      o.group_max_bytes = SIZE_MAX;
    }
    return o;
  }

  void CheckOtherThreadCount(mha_layer* layer, uint32_t flags) {
    const mha_context_options o = OptionsFor(c_.other_threads);
    mha_context* ctx = nullptr;
    if (mha_context_create(&o, &ctx) != MHA_STATUS_OK) Fail("mha_context_create failed", desc_);
    std::unique_ptr<mha_context, void (*)(mha_context*)> owner(ctx, mha_context_destroy);
    b_.output2.Reset(b_.ol.floats, 4);
    mha_tensor out = b_.out_t;
    out.data = b_.output2.data();
    mha_tensor w = b_.w_t;
    if (b_.has_weights) {
      b_.weights2.Reset(b_.weights.elements(), 4);
      w.data = b_.weights2.data();
    }
    if (mha_layer_forward(layer, ctx, &b_.in, &out, b_.has_weights ? &w : nullptr, flags) !=
        MHA_STATUS_OK) {
      Fail("mha_layer_forward failed on the second thread count", desc_);
    }
    if (std::memcmp(b_.output.data(), b_.output2.data(), b_.output.bytes()) != 0) {
      Fail("output bits differ between thread counts", desc_);
    }
    if (b_.has_weights &&
        std::memcmp(b_.weights.data(), b_.weights2.data(), b_.weights.bytes()) != 0) {
      Fail("attention weight bits differ between thread counts", desc_);
    }
  }

  const Case& c_;
  std::mt19937 rng_;
  std::string desc_;
  std::vector<float> in_proj_, wq_, wk_, wv_, wo_, in_bias_, bo_, bias_k_, bias_v_;
  std::vector<float> sinks_, slopes_, q_norm_, k_norm_;  // the variants' tensors (empty: off)
  std::vector<uint16_t> in_proj16_, wq16_, wk16_, wv16_, wo16_;
  Buffers b_;
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
