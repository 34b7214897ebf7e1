// The benchmark workload shared by mha-bench (tools/) and the Google Benchmark program
// (bench/operator_bench.cc): the attention shapes, their floating-point operation count, and a
// layer with random weights plus input/output buffers for one shape. Header-only so that both
// programs build it without another library.
#ifndef MHA_TOOLS_BENCH_WORKLOAD_H_
#define MHA_TOOLS_BENCH_WORKLOAD_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mha/mha.hpp"
#include "tools/variant_flags.h"

namespace mha {
namespace bench {

// The attention variants of a case (AttentionConfig's fields of those names; zero = off) and
// its key/value heads. The layer gets random sinks [H] and QK-norm weights [head_dim] when asked;
// ALiBi uses the paper's slopes.
// The settings of the shared flags (kv_heads 0 = heads), plus mha-bench's random tensors.
struct Variants : tools::VariantFlags {
  bool sinks = false;
  bool qk_norm = false;

  bool any() const {
    return kv_heads != 0 || rope != RopeStyle::kNone || alibi || window != 0 || softcap != 0.0f ||
           sinks || qk_norm;
  }
};

// One benchmark case: batch-first self-attention (kv_seq == seq) or cross-attention with separate
// key/value inputs (kv_seq != seq). q_dim = kdim = vdim = embed.
struct Shape {
  int64_t batch = 1;   // N
  int64_t seq = 1;     // L, query tokens
  int64_t kv_seq = 1;  // S, key/value tokens
  int64_t embed = 1;   // E
  int64_t heads = 1;   // H
  bool causal = false;
  bool need_weights = false;
  bool prepack = true;   // AttentionConfig::prepack kOn or kPlain (false: kOff)
  bool strassen = false;  // with prepack: kStrassen (false: kOn)
  bool bf16 = false;      // AttentionConfig::compute kBF16 (false: kF32)
  // Per-head width; 0 = embed / heads. A checkpoint's layer (mha-bench --hf) may have
  // heads * head_dim != embed (Gemma, Qwen3): the attention width A differs from embed.
  int64_t head_dim = 0;
  // A cross-attention layer read from a checkpoint (mha-bench --hf --prefix of an encoder_attn
  // module): key/value inputs even when kv_seq == seq.
  bool cross = false;
  Variants variants;

  bool self_attention() const { return kv_seq == seq && !cross; }
  int64_t kv_heads() const { return variants.kv_heads > 0 ? variants.kv_heads : heads; }
  int64_t hd() const { return head_dim > 0 ? head_dim : embed / heads; }
  int64_t attn_embed() const { return heads * hd(); }     // A
  int64_t kv_embed() const { return kv_heads() * hd(); }  // kvE
};

// The default suite: (batch, seq, embed, heads), each without and with causal.
inline std::vector<Shape> DefaultSuite() {
  struct Row {
    int64_t batch, seq, embed, heads;
  };
  static constexpr Row kRows[] = {{1, 16, 256, 4},   {1, 128, 512, 8},    {32, 64, 512, 8},
                                  {8, 512, 768, 12}, {1, 2048, 1024, 16}, {4, 1024, 512, 8}};
  std::vector<Shape> shapes;
  for (const Row& r : kRows) {
    for (bool causal : {false, true}) {
      Shape s;
      s.batch = r.batch;
      s.seq = r.seq;
      s.kv_seq = r.seq;
      s.embed = r.embed;
      s.heads = r.heads;
      s.causal = causal;
      shapes.push_back(s);
    }
  }
  return shapes;
}

// The variant cases of the suite: a Llama-style layer (grouped-query 32/8 heads of head_dim 128,
// RoPE neox, causal) and a gpt-oss-style windowed one (causal, window 1024, sinks).
inline std::vector<Shape> VariantSuite() {
  Shape llama;
  llama.batch = 1;
  llama.seq = llama.kv_seq = 1024;
  llama.embed = 4096;
  llama.heads = 32;
  llama.causal = true;
  llama.variants.kv_heads = 8;
  llama.variants.rope = RopeStyle::kNeox;
  llama.variants.rope_theta = 500000.0f;
  Shape windowed;
  windowed.batch = 1;
  windowed.seq = windowed.kv_seq = 4096;
  windowed.embed = 1024;
  windowed.heads = 16;
  windowed.causal = true;
  windowed.variants.window = 1024;
  windowed.variants.sinks = true;
  return {llama, windowed};
}

// Query-key pairs a query row i of `seq` sees among `kv_seq` keys under the causal mask and the
// window (index positions), summed over the rows.
inline double VisiblePairs(const Shape& s) {
  const int64_t W = s.variants.window;
  double pairs = 0;
  for (int64_t i = 0; i < s.seq; ++i) {
    int64_t lo = 0, hi = s.kv_seq - 1;  // inclusive key range
    if (s.causal) hi = std::min(hi, i);
    if (W > 0) {
      lo = std::max<int64_t>(lo, i - W + 1);
      if (!s.causal) hi = std::min(hi, i + W - 1);
    }
    pairs += static_cast<double>(std::max<int64_t>(0, hi - lo + 1));
  }
  return pairs;
}

// Floating-point operations of one forward pass, a multiply and an add counting as two, with
// A = heads * head_dim (= E unless a checkpoint says otherwise) and kvE = kv_heads * head_dim:
//   projections  2*N*(L*q_dim*A + S*kdim*kvE + S*vdim*kvE + L*A*E)
//   core         4*N*L*S*A  (Q*K^T and P*V), halved when causal; with a window 4*N*A times
//                the visible query-key pairs
// The causal halving is FlashAttention's convention: only about half of the score matrix is
// needed. Softmax, weight averaging, RoPE and QK-norm are not counted.
inline double AttentionFlops(const Shape& s) {
  const double n = static_cast<double>(s.batch), l = static_cast<double>(s.seq),
               kv = static_cast<double>(s.kv_seq), e = static_cast<double>(s.embed),
               a = static_cast<double>(s.attn_embed()), kve = static_cast<double>(s.kv_embed());
  const double projections = 2.0 * n * (l * e * a + kv * e * kve + kv * e * kve + l * a * e);
  double core = 4.0 * n * l * kv * a;
  if (s.causal) core *= 0.5;
  if (s.variants.window > 0) core = 4.0 * n * a * VisiblePairs(s);
  return projections + core;
}

// " kv_heads=8 rope=neox window=1024 sinks": the case's variants (and a head_dim that is not
// embed / heads), "" without any.
inline std::string VariantsLabel(const Shape& s) {
  const Variants& v = s.variants;
  auto number = [](double x) {
    char b[32];
    std::snprintf(b, sizeof(b), "%g", x);
    return std::string(b);
  };
  std::string label;
  if (s.head_dim > 0 && s.head_dim * s.heads != s.embed) {
    label += " head_dim=" + std::to_string(s.head_dim);
  }
  if (v.kv_heads > 0) label += " kv_heads=" + std::to_string(v.kv_heads);
  if (v.rope != RopeStyle::kNone) {
    label += v.rope == RopeStyle::kNeox ? " rope=neox" : " rope=gptj";
    if (v.rope_theta > 0) label += " theta=" + number(v.rope_theta);
    if (v.rotary_dim > 0) label += " rotary_dim=" + std::to_string(v.rotary_dim);
    if (v.rope_scale > 0) label += " rope_scale=" + number(v.rope_scale);
  }
  if (v.alibi) label += " alibi";
  if (v.window > 0) label += " window=" + std::to_string(v.window);
  if (v.softcap > 0) label += " softcap=" + number(v.softcap);
  if (v.sinks) label += " sinks";
  if (v.qk_norm) {
    label += " qk_norm";
    if (v.qk_norm_eps > 0) label += " eps=" + number(v.qk_norm_eps);
  }
  return label;
}

// "(1,128,512,8)" plus " causal" / " weights" / " kv=64" qualifiers, for messages and progress.
inline std::string ShapeLabel(const Shape& s) {
  std::string label = "(" + std::to_string(s.batch) + "," + std::to_string(s.seq) + "," +
                      std::to_string(s.embed) + "," + std::to_string(s.heads) + ")";
  if (!s.self_attention()) label += " kv_seq=" + std::to_string(s.kv_seq);
  if (s.causal) label += " causal";
  if (s.need_weights) label += " weights";
  return label + VariantsLabel(s);
}

// SplitMix64: a tiny, fast generator whose sequence is the same on every platform (unlike the
// standard distributions), so a seed names the same weights everywhere.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-bound, bound).
  float Uniform(float bound) {
    const double unit = static_cast<double>(Next() >> 11) * 0x1.0p-53;  // [0, 1)
    return static_cast<float>((2.0 * unit - 1.0) * bound);
  }
  void Fill(std::vector<float>* v, float bound) {
    for (float& x : *v) x = Uniform(bound);
  }

 private:
  uint64_t state_;
};

inline constexpr uint64_t kDefaultSeed = 42;

// A layer with random weights (nn.MultiheadAttention-like scale: U(-1/sqrt(E), 1/sqrt(E)), so
// activations stay O(1)) and random inputs in U(-1, 1) for one shape, plus the output buffers.
// The layer views the weight arrays (WeightBinding::kView); the object owns them all.
// FromLayer instead takes a layer made elsewhere (a checkpoint's, mha-bench --hf): random
// inputs and output buffers only, and no weight arrays for a reference to read.
class Workload {
 public:
  static Status Create(const Shape& shape, uint64_t seed, std::unique_ptr<Workload>* out) {
    std::unique_ptr<Workload> w(new Workload(shape));
    Status s = w->Init(seed);
    if (!s.ok()) return s;
    *out = std::move(w);
    return Status::Ok();
  }
  // `shape` describes `layer` (embed = its input width, heads, head_dim, kv heads); inputs are
  // drawn from `seed`.
  static Status FromLayer(const Shape& shape, std::unique_ptr<MultiheadAttention> layer,
                          uint64_t seed, std::unique_ptr<Workload>* out) {
    std::unique_ptr<Workload> w(new Workload(shape));
    w->layer_ = std::move(layer);
    Random rng(seed);
    w->FillInputs(&rng);
    Status s = w->BindViews();
    if (!s.ok()) return s;
    *out = std::move(w);
    return Status::Ok();
  }

  const Shape& shape() const { return shape_; }
  // Whether the weights are this object's random arrays (a double reference can check the
  // output); false for FromLayer.
  bool has_weights() const { return !in_proj_weight_.empty(); }
  const MultiheadAttention& layer() const { return *layer_; }
  const AttentionInputs& inputs() const { return inputs_; }
  const AttentionOutputs& outputs() const { return outputs_; }

  // Dense f32 data, batch-first: query [N, L, E]; key/value [N, S, E] (for self-attention they
  // are the query); output [N, L, E]; weights [N, L, S] (empty unless need_weights).
  // The projections' rows q | k | v: [E + 2 kvE, E] ([3E, E] without grouped-query heads).
  const std::vector<float>& in_proj_weight() const { return in_proj_weight_; }
  const std::vector<float>& in_proj_bias() const { return in_proj_bias_; }        // [E + 2 kvE]
  const std::vector<float>& out_proj_weight() const { return out_proj_weight_; }  // [E, E]
  const std::vector<float>& out_proj_bias() const { return out_proj_bias_; }      // [E]
  const std::vector<float>& query() const { return query_; }
  const std::vector<float>& key() const { return shape_.self_attention() ? query_ : key_; }
  const std::vector<float>& value() const { return shape_.self_attention() ? query_ : value_; }
  const std::vector<float>& output() const { return output_; }
  const std::vector<float>& attn_weights() const { return attn_weights_; }
  // The variants' random tensors (empty unless the case asks): sinks [H], QK-norm [head_dim].
  const std::vector<float>& sinks() const { return sinks_; }
  const std::vector<float>& q_norm() const { return q_norm_; }
  const std::vector<float>& k_norm() const { return k_norm_; }

  // Zeroes the output buffers, so that a check after a forward never sees a previous run's
  // results.
  void ClearOutputs() {
    std::fill(output_.begin(), output_.end(), 0.0f);
    std::fill(attn_weights_.begin(), attn_weights_.end(), 0.0f);
  }

 private:
  explicit Workload(const Shape& shape) : shape_(shape) {}

  Status Init(uint64_t seed) {
    const Shape& s = shape_;
    const size_t e = static_cast<size_t>(s.embed), kve = static_cast<size_t>(s.kv_embed()),
                 hd = e / static_cast<size_t>(s.heads);
    Random rng(seed);
    const float weight_bound = 1.0f / std::sqrt(static_cast<float>(e));
    in_proj_weight_.resize((e + 2 * kve) * e);
    in_proj_bias_.resize(e + 2 * kve);
    out_proj_weight_.resize(e * e);
    out_proj_bias_.resize(e);
    rng.Fill(&in_proj_weight_, weight_bound);
    rng.Fill(&in_proj_bias_, weight_bound);
    rng.Fill(&out_proj_weight_, weight_bound);
    rng.Fill(&out_proj_bias_, weight_bound);
    FillInputs(&rng);
    // Drawn last, so that a case without variants keeps the weights and inputs of its seed.
    const Variants& v = s.variants;
    if (v.sinks) {
      sinks_.resize(static_cast<size_t>(s.heads));
      rng.Fill(&sinks_, 1.0f);
    }
    if (v.qk_norm) {
      q_norm_.resize(hd);
      k_norm_.resize(hd);
      rng.Fill(&q_norm_, 0.25f);
      rng.Fill(&k_norm_, 0.25f);
      for (float& x : q_norm_) x += 1.0f;
      for (float& x : k_norm_) x += 1.0f;
    }

    AttentionConfig config;
    config.embed_dim = s.embed;
    config.num_heads = s.heads;
    config.batch_first = true;
    config.prepack = !s.prepack   ? WeightPrepack::kOff
                     : s.strassen ? WeightPrepack::kStrassen
                                  : WeightPrepack::kOn;
    config.compute = s.bf16 ? Compute::kBF16 : Compute::kF32;
    config.num_kv_heads = s.kv_heads();
    config.rope = v.rope;
    config.rope_theta = v.rope_theta;
    config.rotary_dim = v.rotary_dim;
    config.rope_scale = v.rope_scale;
    config.alibi = v.alibi;
    config.window = v.window;
    config.softcap = v.softcap;
    config.qk_norm_eps = v.qk_norm_eps;
    AttentionWeights weights;
    if (kve == e) {
      weights.in_proj_weight = in_proj_weight_.data();
    } else {
      weights.q_proj_weight = in_proj_weight_.data();
      weights.k_proj_weight = in_proj_weight_.data() + e * e;
      weights.v_proj_weight = in_proj_weight_.data() + (e + kve) * e;
    }
    weights.in_proj_bias = in_proj_bias_.data();
    if (v.sinks) weights.sinks = sinks_.data();
    if (v.qk_norm) {
      weights.q_norm_weight = q_norm_.data();
      weights.k_norm_weight = k_norm_.data();
    }
    weights.out_proj_weight = out_proj_weight_.data();
    weights.out_proj_bias = out_proj_bias_.data();
    Status st = MultiheadAttention::Create(config, weights, WeightBinding::kView, &layer_);
    if (!st.ok()) return st;
    return BindViews();
  }

  // Random inputs in U(-1, 1) (key/value only for cross-attention) and zeroed outputs.
  void FillInputs(Random* rng) {
    const Shape& s = shape_;
    const size_t n = static_cast<size_t>(s.batch), l = static_cast<size_t>(s.seq),
                 kv = static_cast<size_t>(s.kv_seq), e = static_cast<size_t>(s.embed);
    query_.resize(n * l * e);
    rng->Fill(&query_, 1.0f);
    if (!s.self_attention()) {
      key_.resize(n * kv * e);
      value_.resize(n * kv * e);
      rng->Fill(&key_, 1.0f);
      rng->Fill(&value_, 1.0f);
    }
    output_.assign(n * l * e, 0.0f);
    if (s.need_weights) attn_weights_.assign(n * l * kv, 0.0f);
  }

  // The inputs' and outputs' views over this object's arrays.
  Status BindViews() {
    const Shape& s = shape_;
    const int64_t q_shape[3] = {s.batch, s.seq, s.embed};
    Status st = TensorView::Dense(query_.data(), DType::kF32, 3, q_shape, &inputs_.query, "query");
    if (!st.ok()) return st;
    if (!s.self_attention()) {
      // Self-attention leaves key/value absent (key = query), the API's self-attention form.
      const int64_t kv_shape[3] = {s.batch, s.kv_seq, s.embed};
      st = TensorView::Dense(key_.data(), DType::kF32, 3, kv_shape, &inputs_.key, "key");
      if (!st.ok()) return st;
      st = TensorView::Dense(value_.data(), DType::kF32, 3, kv_shape, &inputs_.value, "value");
      if (!st.ok()) return st;
    }
    inputs_.causal = s.causal;
    inputs_.need_weights = s.need_weights;
    inputs_.average_attn_weights = true;
    st = TensorView::Dense(output_.data(), DType::kF32, 3, q_shape, &outputs_.output, "output");
    if (!st.ok()) return st;
    if (s.need_weights) {
      const int64_t w_shape[3] = {s.batch, s.seq, s.kv_seq};
      st = TensorView::Dense(attn_weights_.data(), DType::kF32, 3, w_shape, &outputs_.attn_weights,
                             "attn_weights");
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }

  Shape shape_;
  std::vector<float> in_proj_weight_, in_proj_bias_, out_proj_weight_, out_proj_bias_;
  std::vector<float> query_, key_, value_;
  std::vector<float> output_, attn_weights_;
  std::vector<float> sinks_, q_norm_, k_norm_;
  std::unique_ptr<MultiheadAttention> layer_;
  AttentionInputs inputs_;
  AttentionOutputs outputs_;
};

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_WORKLOAD_H_
