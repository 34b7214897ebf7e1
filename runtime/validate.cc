// Argument validation of the attention operator and the KV cache (validate.h).
#include "runtime/validate.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/step_plan.h"

namespace mha {

std::string Str(int64_t v) { return std::to_string(v); }

namespace {

// A view's shape, "absent" when it has no data.
std::string Dims(const TensorView& v) {
  if (!v.present()) return "absent";
  return v.ShapeString();
}

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

// Checks a query, key or value tensor t of `features` features; `expect_batch` < 0 for the
// query, which sets the batch size.
Status ValidateSeq(const TensorView& t, const char* name, int64_t features, bool batched,
                   bool batch_first, int64_t expect_batch, SeqShape* seq, const float** data) {
  const int rank = batched ? 3 : 2;
  const char* layout = !batched      ? "[tokens, features]"
                       : batch_first ? "[N, tokens, features]"
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
  *data = t.As<const float>();
  seq->features = features;
  if (!batched) {
    seq->tokens = t.shape[0];
    seq->layout = {0, static_cast<ptrdiff_t>(t.strides[0])};
    return Status::Ok();
  }
  const int bdim = batch_first ? 0 : 1;
  const int tdim = 1 - bdim;
  if (expect_batch >= 0 && t.shape[bdim] != expect_batch) {
    return InvalidArgument(std::string(name) + ": expected batch size " + Str(expect_batch) +
                           " (from query) in dimension " + Str(bdim) + ", got " + Dims(t));
  }
  seq->tokens = t.shape[tdim];
  seq->layout = {static_cast<ptrdiff_t>(t.strides[bdim]), static_cast<ptrdiff_t>(t.strides[tdim])};
  return Status::Ok();
}

// The kind of mask `m` (named `name` in messages): bool, u8 or f32.
Status MaskTypeOf(const TensorView& m, const char* name, MaskType* type) {
  *type = IsBoolMask(m.dtype)    ? MaskType::kBool
          : IsFloatMask(m.dtype) ? MaskType::kFloat
                                 : MaskType::kNone;
  if (*type == MaskType::kNone) {
    return InvalidArgument(std::string(name) + ": expected dtype bool, u8 or f32, got " +
                           DTypeName(m.dtype));
  }
  return Status::Ok();
}

// Checks the masks against the shapes validated before them; H the layer's heads.
Status ValidateMasks(const AttentionInputs& in, int64_t H, ForwardArgs* args) {
  ForwardShapes* sh = &args->shapes;
  const int64_t N = sh->N, L = sh->L, S = sh->S;
  if (in.attn_mask.present()) {
    const TensorView& m = in.attn_mask;
    MaskShape& a = sh->attn;
    const Status s = MaskTypeOf(m, "attn_mask", &a.type);
    if (!s.ok()) return s;
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
    args->attn_mask = m.data;
  }
  if (in.key_padding_mask.present()) {
    const TensorView& m = in.key_padding_mask;
    MaskShape& k = sh->kpm;
    const Status s = MaskTypeOf(m, "key_padding_mask", &k.type);
    if (!s.ok()) return s;
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
    args->key_padding_mask = m.data;
  }
  return Status::Ok();
}

// Element (n, t) of a validated positions tensor t ([N, len] or [len]) as int64.
int64_t PositionAt(const TensorView& t, int64_t n, int64_t i) {
  const int64_t off = (t.rank == 2 ? n * t.strides[0] : 0) + i * t.strides[t.rank - 1];
  return t.dtype == DType::kI32 ? int64_t{t.As<const int32_t>()[off]} : t.As<const int64_t>()[off];
}

// Checks positions tensor t (named `name`, over `len` tokens of N batch entries; `what` names
// the length in messages): i32/i64, [N, len] or [len], values in [0, 2^31).
Status ValidatePositions(const TensorView& t, const char* name, const char* what, int64_t N,
                         int64_t len) {
  if (t.dtype != DType::kI32 && t.dtype != DType::kI64) {
    return InvalidArgument(std::string(name) + ": expected dtype i32 or i64, got " +
                           DTypeName(t.dtype));
  }
  const bool shape_ok =
      (t.rank == 1 && t.shape[0] == len) || (t.rank == 2 && t.shape[0] == N && t.shape[1] == len);
  if (!shape_ok) {
    return InvalidArgument(std::string(name) + ": expected shape [" + Str(N) + ", " + Str(len) +
                           "] (N, " + what + ") or [" + Str(len) + "] (" + what + "), got " +
                           Dims(t));
  }
  const int64_t rows = t.rank == 2 ? N : 1;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t i = 0; i < len; ++i) {
      const int64_t p = PositionAt(t, n, i);
      if (p < 0 || p > INT32_MAX) {
        return InvalidArgument(std::string(name) + "[" + (t.rank == 2 ? Str(n) + ", " : "") +
                               Str(i) + "]: expected a position in [0, 2^31), got " + Str(p));
      }
    }
  }
  return Status::Ok();
}

// Checks AttentionInputs::positions / key_positions against layer m and the shapes validated
// before them, and records them in args.
Status ValidatePositionInputs(const LayerWeights& m, const AttentionInputs& in, ForwardArgs* args) {
  ForwardShapes* sh = &args->shapes;
  const bool q_given = in.positions.present(), k_given = in.key_positions.present();
  if (!q_given && !k_given) return Status::Ok();
  const char* name = q_given ? "positions" : "key_positions";
  if (!m.variants.any_position()) {
    return InvalidArgument(std::string(name) +
                           ": expected none, since the layer uses no position (rope, alibi and "
                           "window are off), got " +
                           Dims(q_given ? in.positions : in.key_positions));
  }
  if (k_given && args->aliasing.self_attention) {
    return InvalidArgument(
        "key_positions: expected none in self-attention (the keys share the query positions; "
        "give `positions`), got " +
        Dims(in.key_positions));
  }
  if (q_given) {
    const Status s = ValidatePositions(in.positions, "positions", "L", sh->N, sh->L);
    if (!s.ok()) return s;
    args->positions = in.positions;
  }
  if (k_given) {
    const Status s = ValidatePositions(in.key_positions, "key_positions", "S", sh->N, sh->S);
    if (!s.ok()) return s;
    args->key_positions = in.key_positions;
  }
  sh->has_positions = true;
  return Status::Ok();
}

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

Status ValidateForward(const LayerWeights& m, const AttentionInputs& in,
                       const AttentionOutputs* out, ForwardArgs* args) {
  const AttentionConfig& config = m.config;
  const int64_t H = m.H, D = m.D, E = m.E, kvE = m.kvE, qd = m.qd, kd = m.kd, vd = m.vd;
  ForwardShapes* sh = &args->shapes;
  const TensorView& q = in.query;
  if (!q.present()) return InvalidArgument("query: expected a tensor, got absent (null data)");
  if (q.rank != 2 && q.rank != 3) {
    return InvalidArgument(std::string("query: expected 3 dims ") +
                           (config.batch_first ? "[N, L, q_dim]" : "[L, N, q_dim]") +
                           " or 2 dims [L, q_dim] (unbatched), got " + Dims(q));
  }
  sh->batched = q.rank == 3;
  Status s = ValidateSeq(q, "query", qd, sh->batched, config.batch_first, -1, &sh->q, &args->q);
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
  s = ValidateSeq(kt, "key", kd, sh->batched, config.batch_first, sh->N, &sh->k, &args->k);
  if (!s.ok()) return s;
  s = ValidateSeq(vt, "value", vd, sh->batched, config.batch_first, sh->N, &sh->v, &args->v);
  if (!s.ok()) return s;
  if (sh->k.tokens != sh->v.tokens) {
    return InvalidArgument("value: expected the same sequence length as key (" + Str(sh->k.tokens) +
                           "), got " + Dims(vt));
  }
  sh->S = sh->k.tokens;
  sh->St = sh->S + m.Extra();
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
  args->aliasing.self_attention = same_view(q, kt) && same_view(kt, vt);
  sh->self_possible = same_shape(q, kt) && same_shape(kt, vt);

  // Sizes must stay far from overflow: N * L * S' * H (the per-head weights) and the
  // projection buffers (rows padded by up to 31 floats, PaddedRowFloats) in 63 bits.
  constexpr double kMaxElements = 9.0e18;
  if (static_cast<double>(sh->N) * sh->L * sh->St * H > kMaxElements ||
      static_cast<double>(sh->N) * std::max(sh->L, sh->St) * (E + 2 * kvE + 32) > kMaxElements) {
    return InvalidArgument("query/key: sizes overflow 64-bit arithmetic (N " + Str(sh->N) + ", L " +
                           Str(sh->L) + ", S " + Str(sh->S) + ")");
  }

  s = ValidateMasks(in, H, args);
  if (!s.ok()) return s;
  s = ValidatePositionInputs(m, in, args);
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
                        (q.rank == 2 || o.shape[1] == q.shape[1]) && o.shape[o.rank - 1] == D;
  if (!shape_ok) {
    std::string want =
        "[" + Str(q.shape[0]) + ", " + (q.rank == 3 ? Str(q.shape[1]) + ", " : "") + Str(D) + "]";
    return InvalidArgument("output: expected shape " + want + " f32, got " + Dims(o));
  }
  if (o.strides[o.rank - 1] != 1) {
    return InvalidArgument("output: expected a contiguous last dimension, got stride " +
                           Str(o.strides[o.rank - 1]));
  }
  args->out = o.As<float>();
  if (!sh->batched) {
    sh->out_layout = {0, static_cast<ptrdiff_t>(o.strides[0])};
  } else {
    const int bdim = config.batch_first ? 0 : 1;
    sh->out_layout = {static_cast<ptrdiff_t>(o.strides[bdim]),
                      static_cast<ptrdiff_t>(o.strides[1 - bdim])};
  }
  // Rows of D floats are disjoint when one stride steps over whole rows and the other over all
  // of the first's (batch-major or sequence-major); strides are never negative.
  const ptrdiff_t tok = sh->out_layout.token, bat = sh->out_layout.batch;
  const bool rows_disjoint = (sh->N == 1 && sh->L == 1) ||
                             (tok >= D && (sh->N == 1 || bat >= (sh->L - 1) * tok + D)) ||
                             (bat >= D && (sh->L == 1 || tok >= (sh->N - 1) * bat + D));
  args->aliasing.out_private = rows_disjoint && !MayOverlap(o, q) && !MayOverlap(o, kt) &&
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
  args->weights = wt.As<float>();
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

void PositionsToInt32(const TensorView& t, int64_t N, int64_t len, int32_t* dst) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < len; ++i) {
      dst[n * len + i] = static_cast<int32_t>(PositionAt(t, t.rank == 2 ? n : 0, i));
    }
  }
}

Status ValidateProject(const LayerWeights& m, const AttentionInputs& inputs,
                       const ProjectionOutputs& outputs, ForwardArgs* args) {
  const int64_t H = m.H, KVH = m.KVH, hd = m.hd;
  const ForwardShapes* sh = &args->shapes;
  AttentionInputs in = inputs;
  in.attn_mask = TensorView();
  in.key_padding_mask = TensorView();
  in.need_weights = false;
  Status s = ValidateForward(m, in, nullptr, args);
  if (!s.ok()) return s;
  s = CheckDense4(outputs.q, "q", sh->N, H, sh->L, hd);
  if (!s.ok()) return s;
  s = CheckDense4(outputs.k, "k", sh->N, KVH, sh->St, hd);
  if (!s.ok()) return s;
  return CheckDense4(outputs.v, "v", sh->N, KVH, sh->St, hd);
}

Status ValidateBatchFirstSeq(const TensorView& t, const char* op, const char* name, int64_t batch,
                             int64_t tokens, int64_t features, BatchFirstSeq* seq) {
  const bool ok = t.present() && t.rank == 3 && t.dtype == DType::kF32 && t.shape[0] == batch &&
                  t.shape[1] >= 1 && t.shape[1] <= (int64_t{1} << 31) &&
                  (tokens <= 0 || t.shape[1] == tokens) && t.shape[2] == features &&
                  (t.strides[2] == 1 || features == 1);
  if (!ok) {
    // Messages are built on the error path only: a successful call allocates nothing.
    std::string got = t.present() ? t.ShapeString() : std::string("absent");
    if (t.present() && t.rank == 3 && t.strides[2] != 1)
      got += " with last stride " + Str(t.strides[2]);
    return InvalidArgument(std::string(op) + name + ": expected [" + Str(batch) + ", " +
                           (tokens > 0 ? Str(tokens) : std::string("T")) + ", " + Str(features) +
                           "] f32 (batch-first, contiguous last dimension), got " + got);
  }
  seq->data = t.As<float>();
  seq->tokens = t.shape[1];
  seq->batch_stride = static_cast<ptrdiff_t>(t.strides[0]);
  seq->token_stride = static_cast<ptrdiff_t>(t.strides[1]);
  return Status::Ok();
}

namespace {

// Ring, a call whose queries attend the cache: entry n's `count` tokens must see their whole
// window in the ring (count <= capacity - window + 1, and no position below the entry's floor
// after the append).
Status ValidateRingQueries(const char* op, const CacheState& cache, int64_t n, int64_t count,
                           bool append, int64_t w) {
  if (!cache.ring || count == 0) return Status::Ok();
  const int64_t capacity = cache.capacity;
  if (count > capacity - w + 1) {
    return InvalidArgument(
        std::string(op) + "counts[" + Str(n) +
        "]: a step over a ring needs at most capacity - window + 1 = " + Str(capacity - w + 1) +
        " tokens (capacity " + Str(capacity) + ", window " + Str(w) + "), got " + Str(count));
  }
  const int64_t len = cache.lengths[n] + (append ? count : 0);
  const int64_t lowest = append ? std::max(cache.floor[n], len - capacity) : cache.floor[n];
  const int64_t band = WindowBandStart(len - count, w);
  if (band < lowest) {
    return InvalidArgument(std::string(op) + "ring: batch entry " + Str(n) +
                           "'s first query (position " + Str(len - count) + ", window " + Str(w) +
                           ") needs positions from " + Str(band) + ", expected >= " + Str(lowest) +
                           " (the oldest position the ring still holds)");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateCacheLayer(const char* op, const LayerWeights& m, const CacheState& cache) {
  if (m.KVH != cache.kv_heads || m.hd != cache.head_dim) {
    return InvalidArgument(std::string(op) + "layer: expected num_kv_heads " + Str(cache.kv_heads) +
                           " and head_dim " + Str(cache.head_dim) + " (the cache's), got " +
                           Str(m.KVH) + " and " + Str(m.hd));
  }
  const int64_t w = m.variants.window;
  if (cache.ring && (w <= 0 || cache.capacity < w)) {
    return InvalidArgument(std::string(op) +
                           "ring: expected a layer with window > 0 and capacity >= window, got "
                           "window " +
                           Str(w) + " and capacity " + Str(cache.capacity));
  }
  return Status::Ok();
}

Status ValidateTokenCount(const char* op, const CacheState& cache, int64_t n, int64_t count,
                          int64_t T, bool append, bool prompt) {
  const int64_t length = cache.lengths[n];
  // A ring's lengths are logical: they may grow past the capacity.
  const int64_t capacity = cache.ring ? INT64_MAX : cache.capacity;
  if (count < 0 || count > T) {
    return InvalidArgument(std::string(op) + "counts[" + Str(n) + "]: expected 0.." + Str(T) +
                           " (tokens per entry), got " + Str(count));
  }
  if (append && length + count > capacity) {
    return InvalidArgument(std::string(op) + "capacity exceeded: batch entry " + Str(n) +
                           " has length " + Str(length) + ", appending " + Str(count) +
                           " tokens needs " + Str(length + count) + " positions, capacity " +
                           Str(capacity));
  }
  if (!append && count > length) {
    return InvalidArgument(
        std::string(op) + "counts[" + Str(n) + "]: query tokens sit at the last " + Str(count) +
        " cached positions, but batch entry " + Str(n) + " has length " + Str(length));
  }
  if (cache.ring && append && !prompt && count > cache.capacity) {
    return InvalidArgument(std::string(op) + "counts[" + Str(n) + "]: a ring of capacity " +
                           Str(cache.capacity) + " stores at most " + Str(cache.capacity) +
                           " tokens per call, got " + Str(count));
  }
  return Status::Ok();
}

Status ValidateCacheCall(const char* op, const LayerWeights& m, const CacheState& cache,
                         const TensorView* query, const TensorView* key, const TensorView* value,
                         const TensorView* output, const int64_t* counts, CacheCallArgs* args) {
  if (m.config.add_bias_kv || m.config.add_zero_attn) {
    return Unsupported(std::string(op) +
                       "layer: add_bias_kv / add_zero_attn append key positions at the end "
                       "of every sequence, which a KV cache cannot express; got add_bias_kv " +
                       (m.config.add_bias_kv ? "true" : "false") + ", add_zero_attn " +
                       (m.config.add_zero_attn ? "true" : "false"));
  }
  Status s = ValidateCacheLayer(op, m, cache);
  if (!s.ok()) return s;
  CacheCallArgs a;
  a.append = key != nullptr;
  a.forward = query != nullptr;
  a.counts = counts;
  a.N = cache.batch;
  const int64_t N = a.N;
  if (a.forward) {
    s = ValidateBatchFirstSeq(*query, op, a.append ? "x" : "query", N, 0, m.qd, &a.q);
    if (!s.ok()) return s;
    a.T = a.q.tokens;
  }
  if (a.append) {
    if (a.forward && (m.kd != m.qd || m.vd != m.qd)) {
      return InvalidArgument(std::string(op) +
                             "layer: Step (self-attention) needs q_dim == kdim == vdim, got " +
                             Str(m.qd) + ", " + Str(m.kd) + ", " + Str(m.vd));
    }
    s = ValidateBatchFirstSeq(*key, op, a.forward ? "x" : "key", N, a.T, m.kd, &a.k);
    if (!s.ok()) return s;
    a.T = a.k.tokens;
    s = ValidateBatchFirstSeq(*value, op, a.forward ? "x" : "value", N, a.T, m.vd, &a.v);
    if (!s.ok()) return s;
  }
  if (a.forward) {
    s = ValidateBatchFirstSeq(*output, op, "output", N, a.T, m.D, &a.out);
    if (!s.ok()) return s;
  }
  // A prompt into an empty cache runs the forward (a ring keeps its last `capacity` positions).
  a.prompt = a.forward && a.append && a.T >= kPrefillForwardMinTokens;
  for (int64_t n = 0; n < N && a.prompt; ++n) {
    a.prompt = cache.lengths[n] == 0 && a.Count(n) == a.T;
  }
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = a.Count(n);
    s = ValidateTokenCount(op, cache, n, c, a.T, a.append, a.prompt);
    if (!s.ok()) return s;
    // RoPE, ALiBi and the window take positions as int32 (kernels/rope.h, kernels/softmax.h).
    const int64_t end = cache.lengths[n] + (a.append ? c : 0);
    if (m.variants.any_position() && end > INT32_MAX) {
      return InvalidArgument(std::string(op) + "batch entry " + Str(n) +
                             ": positions of a layer with RoPE, ALiBi or a window are int32: "
                             "expected a length <= " +
                             Str(INT32_MAX) + ", got " + Str(end));
    }
  }
  for (int64_t n = 0; n < N && a.forward && !a.prompt; ++n) {
    s = ValidateRingQueries(op, cache, n, a.Count(n), a.append, m.variants.window);
    if (!s.ok()) return s;
  }
  *args = a;
  return Status::Ok();
}

}  // namespace mha
