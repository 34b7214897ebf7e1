// Layer weights: configuration checks and resolution, weight binding (views of the caller's
// arrays or owned copies in the storage type), the per-head packed layout's reorder, element
// type conversion and prepacking (layer_weights.h).
#include "runtime/layer_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_route.h"
#include "kernels/gemv_int8.h"
#include "kernels/quant.h"
#include "runtime/validate.h"

namespace mha {

void ConvertElements(const void* src, DType from, void* dst, DType to, size_t n) {
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

namespace {

constexpr const char* kOp = "MultiheadAttention::Create: ";

// Checks the configuration and resolves its dimensions and scale into m.
Status ResolveConfig(const AttentionConfig& config, DType weights_dtype, LayerWeights& m) {
  const char* op = kOp;
  m.config = config;
  m.D = config.embed_dim;
  m.H = config.num_heads;
  if (m.D <= 0)
    return InvalidArgument(std::string(op) + "embed_dim: expected > 0, got " + Str(m.D));
  if (m.H <= 0)
    return InvalidArgument(std::string(op) + "num_heads: expected > 0, got " + Str(m.H));
  if (config.head_dim < 0) {
    return InvalidArgument(std::string(op) + "head_dim: expected > 0 (or 0 for embed_dim / " +
                           "num_heads), got " + Str(config.head_dim));
  }
  if (config.head_dim == 0 && m.D % m.H != 0) {
    return InvalidArgument(std::string(op) + "embed_dim: expected a multiple of num_heads (" +
                           Str(m.H) + "), got " + Str(m.D) + " (or a nonzero head_dim)");
  }
  m.KVH = config.num_kv_heads == 0 ? m.H : config.num_kv_heads;
  if (m.KVH <= 0 || m.H % m.KVH != 0) {
    return InvalidArgument(std::string(op) + "num_kv_heads: expected a divisor of num_heads (" +
                           Str(m.H) + ") or 0, got " + Str(config.num_kv_heads));
  }
  // Dimensions are bounded so that every size product below fits comfortably in 64 bits.
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  if (config.head_dim > kMaxDim || m.H > kMaxDim) {
    return InvalidArgument(std::string(op) + "head_dim, num_heads: expected each 1.." +
                           Str(kMaxDim) + ", got " + Str(config.head_dim) + ", " + Str(m.H));
  }
  m.hd = config.head_dim == 0 ? m.D / m.H : config.head_dim;
  m.E = m.H * m.hd;
  m.kvE = m.KVH * m.hd;
  m.qd = config.q_dim == 0 ? m.D : config.q_dim;
  m.kd = config.kdim == 0 ? m.D : config.kdim;
  m.vd = config.vdim == 0 ? m.D : config.vdim;
  const struct {
    const char* name;
    int64_t v;
  } dims[] = {{"embed_dim", m.D},
              {"num_heads * head_dim", m.E},
              {"q_dim", m.qd},
              {"kdim", m.kd},
              {"vdim", m.vd}};
  for (const auto& d : dims) {
    if (d.v <= 0 || d.v > kMaxDim) {
      return InvalidArgument(std::string(op) + d.name + ": expected 1.." + Str(kMaxDim) +
                             " (or 0 for embed_dim), got " + Str(d.v));
    }
  }
  if (config.bias_projections > kBiasAll) {
    return InvalidArgument(std::string(op) +
                           "bias_projections: expected 0 or a mask of kBiasQ | kBiasK | kBiasV | "
                           "kBiasOut (<= 15), got " +
                           Str(config.bias_projections));
  }
  m.biases = config.bias_projections != 0 ? config.bias_projections
             : config.bias               ? static_cast<uint32_t>(kBiasAll)
                                         : 0u;
  if (!(config.scale >= 0.0f) || std::isinf(config.scale)) {
    return InvalidArgument(std::string(op) +
                           "scale: expected a finite value >= 0 (0 = default), got " +
                           std::to_string(config.scale));
  }
  m.scale = config.scale > 0 ? config.scale : 1.0f / std::sqrt(static_cast<float>(m.hd));
  m.config.num_kv_heads = m.KVH;
  m.config.head_dim = m.hd;
  m.config.q_dim = m.qd;
  m.config.kdim = m.kd;
  m.config.vdim = m.vd;

  const DType st = config.weight_dtype;
  if (st != DType::kF32 && st != DType::kBF16 && st != DType::kF16 && !IsQuantized(st)) {
    return InvalidArgument(std::string(op) +
                           "config.weight_dtype: expected F32, BF16, F16, I8 or I4, got " +
                           DTypeName(st));
  }
  if (weights_dtype != DType::kF32 && weights_dtype != DType::kBF16 &&
      weights_dtype != DType::kF16) {
    return InvalidArgument(std::string(op) + "weights.dtype: expected F32, BF16 or F16, got " +
                           DTypeName(weights_dtype));
  }
  const int64_t block = config.weight_block;
  if (st == DType::kI4 ? !(block == 0 || block == static_cast<int64_t>(kernels::kI4Block) ||
                           block == static_cast<int64_t>(kernels::kI4LargeBlock))
                       : block != 0) {
    return InvalidArgument(
        std::string(op) + "weight_block: expected " +
        (st == DType::kI4 ? "0, 32 or 128 with weight_dtype I4" : "0 unless weight_dtype is I4") +
        ", got " + Str(block));
  }
  m.block = st != DType::kI4 ? 0 : block == 0 ? kernels::kI4Block : static_cast<size_t>(block);
  m.config.weight_block = static_cast<int64_t>(m.block);

  if (config.compute != Compute::kF32 && config.compute != Compute::kBF16 &&
      config.compute != Compute::kInt8) {
    return InvalidArgument(std::string(op) +
                           "compute: expected kF32 (0), kBF16 (1) or kInt8 (2), got " +
                           Str(static_cast<int>(config.compute)));
  }
  if (config.compute == Compute::kInt8 && !IsQuantized(st)) {
    return InvalidArgument(std::string(op) +
                           "compute: kInt8 (int8 activations) expects weight_dtype I8 or I4, got " +
                           DTypeName(st));
  }
  if (config.compute == Compute::kInt8) {
    // Each product quantizes rows of its input into one worker's GEMM scratch
    // (kernels::GemmInt8), which must hold one row: ~1.6 bytes per feature against MBs.
    const struct {
      const char* name;
      int64_t in;
    } inputs[] = {{"q_dim", m.qd}, {"kdim", m.kd}, {"vdim", m.vd}, {"num_heads * head_dim", m.E}};
    const size_t room = kernels::GemmScratchBytes();
    for (const auto& input : inputs) {
      const size_t row =
          kernels::Int8ActLayoutOf(st, m.block, static_cast<size_t>(input.in)).row_bytes;
      if (row > room) {
        return InvalidArgument(std::string(op) + input.name +
                               ": expected an input whose int8 row fits the GEMM scratch with "
                               "compute kInt8 (" +
                               Str(static_cast<int64_t>(row)) + " bytes of at most " +
                               Str(static_cast<int64_t>(room)) + "), got " + Str(input.in) +
                               " features");
      }
    }
  }
  if (config.compute == Compute::kBF16 && IsQuantized(st)) {
    // Many-row products pack a group of at least 32 rows of their input, transposed, into a
    // worker's GEMM scratch (QuantBf16GroupRows).
    const struct {
      const char* name;
      int64_t in;
    } inputs[] = {{"q_dim", m.qd}, {"kdim", m.kd}, {"vdim", m.vd}, {"num_heads * head_dim", m.E}};
    const size_t room = WorkerGemmScratchBytes();
    for (const auto& input : inputs) {
      if (QuantBf16GroupRows(static_cast<size_t>(input.in), room) == 0) {
        return InvalidArgument(
            std::string(op) + input.name +
            ": expected an input whose bf16 packing of 32 rows fits the GEMM scratch with "
            "compute kBF16 and weight_dtype " +
            DTypeName(st) + " (" + Str(static_cast<int64_t>(room)) + " bytes), got " +
            Str(input.in) + " features");
      }
    }
  }
  if (config.prepack != WeightPrepack::kOn && config.prepack != WeightPrepack::kOff &&
      config.prepack != WeightPrepack::kPlain && config.prepack != WeightPrepack::kStrassen) {
    return InvalidArgument(std::string(op) +
                           "prepack: expected kOn (0), kOff (1), kPlain (2) or kStrassen (3), "
                           "got " +
                           Str(static_cast<int>(config.prepack)));
  }
  return Status::Ok();
}

// Checks which weight arrays are given against the resolved configuration m.
Status CheckWeightArrays(const LayerWeights& m, const AttentionWeights& w) {
  const char* op = kOp;
  const AttentionConfig& config = m.config;
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
    return InvalidArgument(std::string(op) +
                           "out_proj_weight: expected [embed_dim, num_heads * head_dim] weights, "
                           "got null");
  }
  if ((w.q_proj_bias || w.k_proj_bias || w.v_proj_bias) && packed &&
      w.qkv_layout == QkvLayout::kPerHead) {
    return InvalidArgument(std::string(op) +
                           "q/k/v_proj_bias: a kPerHead in_proj_weight takes its bias as "
                           "in_proj_bias in the same layout");
  }
  const bool separate_bias = w.q_proj_bias || w.k_proj_bias || w.v_proj_bias;
  if (config.bias_projections == 0 && !separate_bias) {
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
  } else {
    // Per-projection biases: each given exactly when its projection is biased.
    if (w.in_proj_bias != nullptr && separate_bias) {
      return InvalidArgument(std::string(op) +
                             "weights: expected either in_proj_bias or q/k/v_proj_bias, got both");
    }
    const uint32_t qkv = kBiasQ | kBiasK | kBiasV;
    if (w.in_proj_bias != nullptr && (m.biases & qkv) != qkv) {
      return InvalidArgument(std::string(op) +
                             "in_proj_bias: biases q, k and v together, but bias_projections (" +
                             Str(m.biases) + ") leaves some unbiased: give q/k/v_proj_bias");
    }
    const struct {
      const char* name;
      uint32_t bit;
      const float* given;
    } biases[] = {{"q_proj_bias", kBiasQ, w.in_proj_bias ? w.in_proj_bias : w.q_proj_bias},
                  {"k_proj_bias", kBiasK, w.in_proj_bias ? w.in_proj_bias : w.k_proj_bias},
                  {"v_proj_bias", kBiasV, w.in_proj_bias ? w.in_proj_bias : w.v_proj_bias},
                  {"out_proj_bias", kBiasOut, w.out_proj_bias}};
    for (const auto& b : biases) {
      const bool want = (m.biases & b.bit) != 0;
      if (want != (b.given != nullptr)) {
        return InvalidArgument(std::string(op) + b.name + ": expected " +
                               (want ? "a bias" : "none") + " (bias_projections " +
                               Str(m.biases) + "), got " + (want ? "null" : "a bias"));
      }
    }
  }
  if (config.add_bias_kv && (w.bias_k == nullptr || w.bias_v == nullptr)) {
    return InvalidArgument(std::string(op) + "add_bias_kv: expected bias_k and bias_v [kvE]");
  }
  if (!config.add_bias_kv && (w.bias_k != nullptr || w.bias_v != nullptr)) {
    return InvalidArgument(std::string(op) + "bias_k/bias_v given but add_bias_kv is false");
  }
  return Status::Ok();
}

// The ALiBi paper's slopes for H heads (get_slopes, in double): H a power of two gives
// 2^(-8 (h + 1) / H); otherwise the closest power of two cp below H gives slopes(cp) followed by
// every other slope of slopes(2 cp), the first H - cp of them.
std::vector<double> AlibiSlopes(int64_t heads) {
  const auto power_of_two = [](int64_t n) {
    std::vector<double> s(static_cast<size_t>(n));
    for (int64_t h = 0; h < n; ++h) s[h] = std::exp2(-8.0 * static_cast<double>(h + 1) / n);
    return s;
  };
  int64_t cp = 1;
  while (cp * 2 <= heads) cp *= 2;
  std::vector<double> slopes = power_of_two(cp);
  if (cp == heads) return slopes;
  const std::vector<double> extra = AlibiSlopes(2 * cp);
  for (int64_t i = 0; i < heads - cp; ++i) slopes.push_back(extra[2 * i]);
  return slopes;
}

// The index of the first element of v[0, n) that `bad` holds for, or -1.
template <class Bad>
int64_t FindBad(const float* v, int64_t n, Bad bad) {
  for (int64_t i = 0; i < n; ++i) {
    if (bad(v[i])) return i;
  }
  return -1;
}

// Copies weights tensor `name` ([n] f32) into dst after checking no element is `bad`
// (described as `expected` in the message).
template <class Bad>
Status CopyVariantTensor(const float* src, int64_t n, const char* name, const char* expected,
                         Bad bad, std::vector<float>* dst) {
  const int64_t i = FindBad(src, n, bad);
  if (i >= 0) {
    return InvalidArgument(std::string(kOp) + "weights." + name + ": expected " + expected +
                           " values, got " + std::to_string(src[i]) + " at index " + Str(i));
  }
  dst->assign(src, src + n);
  return Status::Ok();
}

// Checks the variants' settings and tensors and resolves them into m.variants (defaults applied,
// tensors copied). All off leaves m.variants at its defaults.
Status ResolveVariants(const AttentionConfig& c, const AttentionWeights& w, LayerWeights& m) {
  const std::string op = kOp;
  LayerVariants& v = m.variants;
  const auto finite_nonneg = [&](float x, const char* name, const char* zero) -> Status {
    if (!(x >= 0.0f) || std::isinf(x)) {
      return InvalidArgument(op + name + ": expected a finite value >= 0 (0 = " + zero + "), got " +
                             std::to_string(x));
    }
    return Status::Ok();
  };
  if (c.rope != RopeStyle::kNone && c.rope != RopeStyle::kNeox && c.rope != RopeStyle::kGptj) {
    return InvalidArgument(op + "rope: expected kNone (0), kNeox (1) or kGptj (2), got " +
                           Str(static_cast<int>(c.rope)));
  }
  if (c.rope == RopeStyle::kNone) {
    if (c.rope_theta != 0.0f || c.rotary_dim != 0 || c.rope_scale != 0.0f) {
      return InvalidArgument(op +
                             "rope_theta/rotary_dim/rope_scale: expected 0 when rope is kNone, "
                             "got rope_theta " +
                             std::to_string(c.rope_theta) + ", rotary_dim " + Str(c.rotary_dim) +
                             ", rope_scale " + std::to_string(c.rope_scale));
    }
  } else {
    const int64_t rd = c.rotary_dim == 0 ? m.hd : c.rotary_dim;
    if (rd < 2 || rd > m.hd || rd % 2 != 0) {
      return InvalidArgument(op + "rotary_dim: expected an even value in 2.." + Str(m.hd) +
                             " (head_dim), or 0 for head_dim, got " + Str(c.rotary_dim));
    }
    Status s = finite_nonneg(c.rope_theta, "rope_theta", "10000");
    if (s.ok()) s = finite_nonneg(c.rope_scale, "rope_scale", "1");
    if (!s.ok()) return s;
    v.rope = c.rope;
    v.rotary_dim = rd;
  }
  // inv_freq and rope_scaling (rope_scaling.h); checks the scaling fields also without RoPE.
  const Status rope_status = ResolveRopeScaling(c, w, v.rotary_dim, &v.rope_scaling, &v.inv_freq);
  if (!rope_status.ok()) return rope_status;

  if (w.alibi_slopes != nullptr && !c.alibi) {
    return InvalidArgument(op + "weights.alibi_slopes: given but config.alibi is false");
  }
  if (c.alibi) {
    if (w.alibi_slopes != nullptr) {
      const Status s = CopyVariantTensor(
          w.alibi_slopes, m.H, "alibi_slopes", "finite", [](float x) { return !std::isfinite(x); },
          &v.alibi_slopes);
      if (!s.ok()) return s;
    } else {
      const std::vector<double> slopes = AlibiSlopes(m.H);
      v.alibi_slopes.assign(slopes.begin(), slopes.end());
    }
  }

  if (c.window < 0) {
    return InvalidArgument(op + "window: expected >= 0 (0 = no window), got " + Str(c.window));
  }
  v.window = c.window;
  Status s = finite_nonneg(c.softcap, "softcap", "off");
  if (s.ok()) s = finite_nonneg(c.qk_norm_eps, "qk_norm_eps", "1e-6");
  if (!s.ok()) return s;
  v.softcap = c.softcap;
  v.qk_norm_eps = c.qk_norm_eps > 0.0f ? c.qk_norm_eps : 1e-6f;
  v.qk_norm_whole = c.qk_norm_whole;

  if (w.sinks != nullptr) {
    // -inf is a sink that never contributes; +inf or NaN would make every row NaN.
    s = CopyVariantTensor(
        w.sinks, m.H, "sinks", "non-NaN, < +inf",
        [](float x) { return std::isnan(x) || x == HUGE_VALF; }, &v.sinks);
    if (!s.ok()) return s;
  }
  if ((w.q_norm_weight == nullptr) != (w.k_norm_weight == nullptr)) {
    return InvalidArgument(op + "q_norm_weight/k_norm_weight: expected both or neither, got only " +
                           (w.q_norm_weight ? "q_norm_weight" : "k_norm_weight"));
  }
  if (w.q_norm_weight != nullptr) {
    const auto not_finite = [](float x) { return !std::isfinite(x); };
    s = CopyVariantTensor(w.q_norm_weight, c.qk_norm_whole ? m.E : m.hd, "q_norm_weight", "finite",
                          not_finite, &v.q_norm);
    if (s.ok()) {
      s = CopyVariantTensor(w.k_norm_weight, c.qk_norm_whole ? m.kvE : m.hd, "k_norm_weight",
                            "finite", not_finite, &v.k_norm);
    }
    if (!s.ok()) return s;
  }

  if (v.any_position() && (c.add_bias_kv || c.add_zero_attn)) {
    return Unsupported(op + "add_bias_kv/add_zero_attn: the appended keys have no position, so " +
                       "they cannot combine with rope, alibi or window (got add_bias_kv " +
                       (c.add_bias_kv ? "true" : "false") + ", add_zero_attn " +
                       (c.add_zero_attn ? "true" : "false") + ")");
  }
  return Status::Ok();
}

// Binds the caller's arrays as they are (their dtype is the storage dtype).
void BindViews(const AttentionWeights& w, LayerWeights& m) {
  const DType st = m.config.weight_dtype;
  const bool packed = w.in_proj_weight != nullptr;
  m.qkv_adjacent = packed;
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
}

// Repoints the biases bound from the caller's arrays at owned copies in `owned_biases`, laid out
// as BindCopies lays them: [in_proj (q, k, v) | bias_kv | out_proj].
void OwnBiases(LayerWeights& m) {
  const int64_t E = m.E, kvE = m.kvE;
  m.owned_biases.resize(static_cast<size_t>((m.b_q != nullptr ? E + 2 * kvE : 0) +
                                            (m.bias_k != nullptr ? 2 * kvE : 0) +
                                            (m.b_o != nullptr ? m.D : 0)));
  float* p = m.owned_biases.data();
  auto take = [&p](const float* src, int64_t n) {
    std::memcpy(p, src, static_cast<size_t>(n) * sizeof(float));
    p += n;
    return p - n;
  };
  if (m.b_q != nullptr) {
    m.b_q = take(m.b_q, E);
    m.b_k = take(m.b_k, kvE);
    m.b_v = take(m.b_v, kvE);
    if (m.b_packed != nullptr) m.b_packed = m.b_q;
  }
  if (m.bias_k != nullptr) {
    m.bias_k = take(m.bias_k, kvE);
    m.bias_v = take(m.bias_v, kvE);
  }
  if (m.b_o != nullptr) m.b_o = take(m.b_o, m.D);
}

// Binds owned copies in the storage dtype, reordering the per-head packed layout.
void BindCopies(const AttentionWeights& w, LayerWeights& m) {
  const AttentionConfig& config = m.config;
  const DType st = config.weight_dtype;
  const bool packed = w.in_proj_weight != nullptr;
  const int64_t qkv_rows = m.E + 2 * m.kvE;
  // Owned copies in the storage dtype: the weights [w_q | w_k | w_v | w_o] (w_q..w_v adjacent
  // rows of one packed matrix when the input dims agree) in `owned` (f32) or `owned16`
  // (16-bit); the biases [in_proj | bias_kv | out_proj] in `owned_biases`.
  const size_t n_wq = m.E * m.qd, n_wk = m.kvE * m.kd, n_wv = m.kvE * m.vd, n_wo = m.D * m.E;
  const size_t n_w = n_wq + n_wk + n_wv + n_wo;
  const bool qkv_bias = w.in_proj_bias != nullptr, out_bias = w.out_proj_bias != nullptr;
  const size_t n_b = qkv_bias ? qkv_rows : 0;
  const size_t n_bkv = config.add_bias_kv ? 2 * m.kvE : 0;
  const size_t n_bo = out_bias ? m.D : 0;
  const bool f32 = st == DType::kF32;
  if (f32) {
    m.owned.Assign(n_w);
  } else {
    m.owned16.Assign(n_w);
  }
  m.owned_biases.resize(n_b + n_bkv + n_bo);
  uint8_t* wblk = f32 ? reinterpret_cast<uint8_t*>(m.owned.data())
                      : reinterpret_cast<uint8_t*>(m.owned16.data());
  const size_t eb = DTypeSize(st);
  uint8_t* wq = wblk;
  uint8_t* wk = wq + n_wq * eb;
  uint8_t* wv = wk + n_wk * eb;
  uint8_t* wo = wv + n_wv * eb;
  float* bias = m.owned_biases.data();
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
          ConvertElements(src_w + src * m.qd * src_eb, w.dtype, wq + dst * m.qd * eb, st, m.qd);
          if (qkv_bias) bias[dst] = w.in_proj_bias[src];
        }
      }
    }
  } else if (packed) {
    ConvertElements(w.in_proj_weight, w.dtype, wq, st, qkv_rows * m.qd);
    if (qkv_bias) std::memcpy(bias, w.in_proj_bias, qkv_rows * sizeof(float));
  } else {
    ConvertElements(w.q_proj_weight, w.dtype, wq, st, n_wq);
    ConvertElements(w.k_proj_weight, w.dtype, wk, st, n_wk);
    ConvertElements(w.v_proj_weight, w.dtype, wv, st, n_wv);
    if (qkv_bias) std::memcpy(bias, w.in_proj_bias, qkv_rows * sizeof(float));
  }
  if (config.add_bias_kv) {
    std::memcpy(bkv, w.bias_k, m.kvE * sizeof(float));
    std::memcpy(bkv + m.kvE, w.bias_v, m.kvE * sizeof(float));
    m.bias_k = bkv;
    m.bias_v = bkv + m.kvE;
  }
  ConvertElements(w.out_proj_weight, w.dtype, wo, st, n_wo);
  if (out_bias) std::memcpy(bo, w.out_proj_bias, m.D * sizeof(float));
  m.w_q = {wq, st};
  m.w_k = {wk, st};
  m.w_v = {wv, st};
  // The three weights are adjacent rows of one [E + 2 kvE, in] matrix when the dims agree.
  m.qkv_adjacent = m.qd == m.kd && m.qd == m.vd;
  if (m.qkv_adjacent) m.w_packed = m.w_q;
  if (qkv_bias) {
    m.b_packed = bias;
    m.b_q = bias;
    m.b_k = bias + m.E;
    m.b_v = bias + m.E + m.kvE;
  }
  m.w_o = {wo, st};
  m.b_o = out_bias ? bo : nullptr;
}

// One quantized matrix of the layer: `rows` rows of `in` inputs, from row `qkv_row` on of
// [w_q | w_k | w_v] (QkvRow), or of out_proj_weight when qkv_row < 0; named for messages.
struct QuantSource {
  const char* name;
  int64_t rows, in, qkv_row;
  WeightMatrix* dst;
};

// The caller's row r of [w_q | w_k | w_v] (rows E + 2 kvE, elements of w.dtype): of
// in_proj_weight (the per-head layout's row (h, part, d) for row part * E + h * hd + d), or of
// the separate matrices.
const void* QkvRow(const AttentionWeights& w, const LayerWeights& m, int64_t r) {
  const size_t es = DTypeSize(w.dtype);
  const auto at = [es](const void* base, int64_t row, int64_t in) {
    return static_cast<const uint8_t*>(base) + static_cast<size_t>(row * in) * es;
  };
  if (w.in_proj_weight != nullptr) {
    if (w.qkv_layout != QkvLayout::kPerHead) return at(w.in_proj_weight, r, m.qd);
    const int64_t part = r / m.E, h = r % m.E / m.hd, d = r % m.hd;
    return at(w.in_proj_weight, (h * 3 + part) * m.hd + d, m.qd);
  }
  if (r < m.E) return at(w.q_proj_weight, r, m.qd);
  if (r < m.E + m.kvE) return at(w.k_proj_weight, r - m.E, m.kd);
  return at(w.v_proj_weight, r - m.E - m.kvE, m.vd);
}

// Binds quantized copies (config.weight_dtype kI8 / kI4): the biases copied (the per-head
// layout's reordered), each weight row widened to f32 in a one-row buffer and quantized
// (kernels::QuantizeRow) straight into m.quantized, so Create never holds an f32 or 16-bit copy
// of a matrix. Non-finite weights are an error (they have no scale).
Status BindQuantized(const AttentionWeights& weights, LayerWeights& m) {
  AttentionWeights w = weights;
  if (w.in_proj_weight != nullptr && w.qkv_layout == QkvLayout::kPerHead &&
      w.in_proj_bias != nullptr) {
    std::vector<float> reordered(static_cast<size_t>(m.E + 2 * m.kvE));
    for (int64_t r = 0; r < m.E + 2 * m.kvE; ++r) {
      const int64_t part = r / m.E, h = r % m.E / m.hd, d = r % m.hd;
      reordered[r] = w.in_proj_bias[(h * 3 + part) * m.hd + d];
    }
    m.qkv_bias.swap(reordered);
    w.in_proj_bias = m.qkv_bias.data();
  }
  BindViews(w, m);  // the biases' pointers, owned next; the weights are replaced below
  OwnBiases(m);
  std::vector<float>().swap(m.qkv_bias);  // copied into owned_biases
  const DType st = m.config.weight_dtype;
  m.qkv_adjacent = m.qd == m.kd && m.qd == m.vd;
  if (m.qkv_adjacent) m.b_packed = m.b_q;  // [E + 2 kvE] in owned_biases, or null
  WeightMatrix qkv;
  std::vector<QuantSource> sources;
  if (m.qkv_adjacent) {
    sources.push_back({"q/k/v weights", m.E + 2 * m.kvE, m.qd, 0, &qkv});
  } else {
    sources.push_back({"q_proj_weight", m.E, m.qd, 0, &m.w_q});
    sources.push_back({"k_proj_weight", m.kvE, m.kd, m.E, &m.w_k});
    sources.push_back({"v_proj_weight", m.kvE, m.vd, m.E + m.kvE, &m.w_v});
  }
  sources.push_back({"out_proj_weight", m.D, m.E, -1, &m.w_o});
  // Each matrix's codes, then its scales, at 64-byte offsets from a 64-byte aligned start.
  constexpr size_t kAlign = 64;
  const auto round_up = [](size_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
  size_t bytes = 0;
  std::vector<size_t> code_at, scale_at;
  for (const QuantSource& src : sources) {
    const size_t rows = static_cast<size_t>(src.rows), in = static_cast<size_t>(src.in);
    code_at.push_back(bytes);
    bytes = round_up(bytes + rows * kernels::QuantRowBytes(st, m.block, in));
    scale_at.push_back(bytes);
    bytes = round_up(bytes + rows * kernels::QuantScalesPerRow(st, m.block, in) * sizeof(float));
  }
  m.quantized.Assign(bytes);  // a LargeArray starts 64-byte aligned
  uint8_t* base = m.quantized.data();
  std::vector<float> row;
  for (size_t i = 0; i < sources.size(); ++i) {
    const QuantSource& src = sources[i];
    const size_t in = static_cast<size_t>(src.in);
    kernels::QuantMatrix q;
    q.codes = base + code_at[i];
    q.scales = reinterpret_cast<const float*>(base + scale_at[i]);
    q.type = st;
    q.block = m.block;
    q.rows = static_cast<size_t>(src.rows);
    q.cols = in;
    q.row_bytes = kernels::QuantRowBytes(st, m.block, in);
    q.scales_per_row = kernels::QuantScalesPerRow(st, m.block, in);
    q.int8_activations = m.config.compute == Compute::kInt8;
    q.bf16_products = m.config.compute == Compute::kBF16;
    row.resize(in);
    for (int64_t r = 0; r < src.rows; ++r) {
      const void* from = src.qkv_row >= 0 ? QkvRow(w, m, src.qkv_row + r)
                                          : static_cast<const uint8_t*>(w.out_proj_weight) +
                                                static_cast<size_t>(r * m.E) * DTypeSize(w.dtype);
      const float* f32 = static_cast<const float*>(from);
      if (w.dtype != DType::kF32) {
        const uint16_t* h = static_cast<const uint16_t*>(from);
        if (w.dtype == DType::kBF16) {
          kernels::BF16ToF32(h, row.data(), in);
        } else {
          kernels::F16ToF32(h, row.data(), in);
        }
        f32 = row.data();
      }
      const int64_t bad = FindBad(f32, src.in, [](float x) { return !std::isfinite(x); });
      if (bad >= 0) {
        return InvalidArgument(std::string(kOp) + "weights: " + src.name + " row " + Str(r) +
                               ": expected finite values to quantize (weight_dtype " +
                               DTypeName(st) + "), got " + std::to_string(f32[bad]) +
                               " at column " + Str(bad));
      }
      kernels::QuantizeRow(f32, in, st, m.block, const_cast<uint8_t*>(q.codes) + r * q.row_bytes,
                           const_cast<float*>(q.scales) + r * q.scales_per_row);
    }
    *src.dst = WeightMatrix{nullptr, st};
    src.dst->quant = q;
  }
  if (m.qkv_adjacent) {
    m.w_packed = qkv;
    m.w_q = qkv;
    m.w_k = qkv.Rows(m.E, m.qd);
    m.w_v = qkv.Rows(m.E + m.kvE, m.qd);
  }
  return Status::Ok();
}

}  // namespace

Status BindLayerWeights(const AttentionConfig& config, const AttentionWeights& weights,
                        WeightBinding binding, LayerWeights* out) {
  LayerWeights& m = *out;
  static std::atomic<uint64_t> last_id{0};
  m.id = last_id.fetch_add(1, std::memory_order_relaxed) + 1;
  Status s = ResolveConfig(config, weights.dtype, m);
  if (!s.ok()) return s;
  s = CheckWeightArrays(m, weights);
  if (!s.ok()) return s;
  s = ResolveVariants(config, weights, m);
  if (!s.ok()) return s;
  // Separate q/k/v biases are gathered into one [E + 2 kvE] array in q, k, v order (zeros for
  // an unbiased projection, whose pointer is nulled below), which every later step reads as it
  // reads an in_proj_bias.
  AttentionWeights w = weights;
  if (w.q_proj_bias || w.k_proj_bias || w.v_proj_bias) {
    m.qkv_bias.assign(static_cast<size_t>(m.E + 2 * m.kvE), 0.0f);
    const float* parts[3] = {w.q_proj_bias, w.k_proj_bias, w.v_proj_bias};
    const int64_t offsets[3] = {0, m.E, m.E + m.kvE}, sizes[3] = {m.E, m.kvE, m.kvE};
    for (int i = 0; i < 3; ++i) {
      if (parts[i] != nullptr) std::copy_n(parts[i], sizes[i], m.qkv_bias.data() + offsets[i]);
    }
    w.in_proj_bias = m.qkv_bias.data();
    w.q_proj_bias = w.k_proj_bias = w.v_proj_bias = nullptr;
  }
  const DType st = config.weight_dtype;
  // Quantized weights are always the layer's own codes: nothing of the caller's is viewed.
  if (IsQuantized(st) && binding != WeightBinding::kCopy) {
    return InvalidArgument(std::string(kOp) + "binding: weight_dtype " + DTypeName(st) +
                           " quantizes the weights into the layer's own codes: expected "
                           "WeightBinding::kCopy, got kView");
  }
  // Copies are made when asked for, and always for the per-head packed layout, which is
  // reordered into PyTorch's (q, k, v) row order once here so every later path is the same.
  const bool copy = binding == WeightBinding::kCopy ||
                    (w.in_proj_weight != nullptr && w.qkv_layout == QkvLayout::kPerHead);
  if (!copy && w.dtype != st) {
    return InvalidArgument(std::string(kOp) +
                           "weights.dtype: a view binding uses the arrays as "
                           "they are, so it must equal config.weight_dtype (" +
                           DTypeName(st) + "), got " + DTypeName(w.dtype) +
                           " (use WeightBinding::kCopy to convert)");
  }
  // A copy that will keep only its packings packs them straight from the caller's arrays when
  // they need no conversion or reorder, so the layer never holds the weights twice.
  const bool pack_from_caller =
      copy && m.PackingsServeEveryProduct() && w.dtype == st &&
      !(w.in_proj_weight != nullptr && w.qkv_layout == QkvLayout::kPerHead);
  if (IsQuantized(st)) {
    // Neither prepacked nor packed afterwards: Prepack and KeepOnlyPackings leave them.
    s = BindQuantized(w, m);
    if (!s.ok()) return s;
  } else if (copy && !pack_from_caller) {
    BindCopies(w, m);
  } else {
    BindViews(w, m);
  }
  if (pack_from_caller) OwnBiases(m);
  // An unbiased q, k or v reads no bias; a fused product reads b_packed's zeros for it.
  if ((m.biases & kBiasQ) == 0) m.b_q = nullptr;
  if ((m.biases & kBiasK) == 0) m.b_k = nullptr;
  if ((m.biases & kBiasV) == 0) m.b_v = nullptr;
  m.Prepack();
  if (copy) m.KeepOnlyPackings();
  return Status::Ok();
}

namespace {

// Compute::kBF16: packs the four projection matrices as bf16 into m->bf16_packed. With a
// packed in_proj_weight whose q, k and v parts start on bf16 panels, w_packed is packed whole
// and w_q, w_k, w_v are its column ranges: the fused projection then rounds x once for all
// three.
void PackBf16(LayerWeights* m) {
  const bool fused = m->qkv_adjacent && m->E % kernels::kBf16PanelCols == 0 &&
                     m->kvE % kernels::kBf16PanelCols == 0;
  const int64_t qkv = m->E + 2 * m->kvE;
  // w^T [in, out] of each matrix packed, one after the other (each a multiple of 32 elements:
  // 64-byte aligned after the first).
  WeightMatrix* mats[4] = {&m->w_packed, &m->w_o, &m->w_k, &m->w_v};
  int64_t ins[4] = {m->qd, m->E, m->kd, m->vd}, outs[4] = {qkv, m->D, m->kvE, m->kvE};
  if (!fused) {
    mats[0] = &m->w_q;
    outs[0] = m->E;
  }
  const int count = fused ? 2 : 4;
  size_t elements = 0;
  for (int i = 0; i < count; ++i) elements += kernels::PackedBf16Elements(ins[i], outs[i]);
  m->bf16_packed.Assign(elements);  // 64-byte aligned, as a LargeArray starts
  uint16_t* dst = m->bf16_packed.data();
  for (int i = 0; i < count; ++i) {
    const size_t in = static_cast<size_t>(ins[i]), out = static_cast<size_t>(outs[i]);
    const ptrdiff_t ld = static_cast<ptrdiff_t>(in);
    if (mats[i]->dtype == DType::kF32) {
      mats[i]->bf16 = kernels::PackBf16B(
          kernels::ConstMatrixView{static_cast<const float*>(mats[i]->data), in, out, 1, ld}, dst);
    } else {
      mats[i]->bf16 = kernels::PackBf16BHalf(
          kernels::HalfMatrixView{static_cast<const uint16_t*>(mats[i]->data), mats[i]->dtype, in,
                                  out, 1, ld},
          dst);
    }
    dst += kernels::PackedBf16Elements(in, out);
  }
  if (fused) {
    const kernels::PackedBf16B& all = m->w_packed.bf16;
    const size_t E = static_cast<size_t>(m->E), kvE = static_cast<size_t>(m->kvE);
    m->w_q.bf16 = all.Columns(0, E);
    m->w_k.bf16 = all.Columns(E, kvE);
    m->w_v.bf16 = all.Columns(E + kvE, kvE);
  }
}

}  // namespace

void LayerWeights::Prepack() {
  if (IsQuantized(config.weight_dtype)) return;  // products read the codes (BindQuantized)
  if (config.compute == Compute::kBF16) {
    PackBf16(this);
    return;
  }
  if (config.prepack == WeightPrepack::kOff || !kernels::WeightsPrepackable(config.weight_dtype)) {
    return;
  }
  // w^T [in, out] of each matrix, one after the other (PackedBFloats keeps each 64-byte aligned).
  WeightMatrix* const mats[4] = {&w_q, &w_k, &w_v, &w_o};
  const int64_t ins[4] = {qd, kd, vd, E}, outs[4] = {E, kvE, kvE, D};
  const bool strassen = config.prepack == WeightPrepack::kStrassen;
  size_t floats = 0, strassen_floats = 0, tmp_floats = 0;
  for (int i = 0; i < 4; ++i) {
    floats += kernels::PackedBFloats(ins[i], outs[i]);
    if (strassen && StrassenPacks(ins[i], outs[i])) {
      strassen_floats += kernels::StrassenPackedBFloats(ins[i], outs[i]);
      tmp_floats = std::max(tmp_floats, kernels::StrassenPackTmpFloats(ins[i], outs[i]));
    }
  }
  // The packings start at a LargeArray's 64-byte alignment, which the kernels ask for.
  static_assert(kernels::kGemmScratchAlignment <= 64, "LargeArray data is 64-byte aligned");
  prepacked.Assign(floats);
  float* dst = prepacked.data();
  std::vector<float> tmp(tmp_floats);
  strassen_packed.Assign(strassen_floats);
  float* sdst = strassen_packed.data();  // null when nothing takes Strassen
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

bool LayerWeights::PackingsServeEveryProduct() const {
  if (IsQuantized(config.weight_dtype)) return false;  // the codes are the layer's only copy
  if (config.compute == Compute::kBF16) {  // PackBf16 packs every matrix, whatever its dtype
    return hd % static_cast<int64_t>(kernels::kBf16PanelCols) == 0;
  }
  return config.prepack != WeightPrepack::kOff &&
         kernels::WeightsPrepackable(config.weight_dtype) && kernels::PrepackedMinRows() == 1 &&
         hd % static_cast<int64_t>(kernels::GemmBlocking().nr) == 0;
}

void LayerWeights::KeepOnlyPackings() {
  if (!PackingsServeEveryProduct()) return;
  owned.Clear();
  owned16.Clear();
  for (WeightMatrix* w : {&w_packed, &w_q, &w_k, &w_v, &w_o}) w->data = nullptr;
}

}  // namespace mha
