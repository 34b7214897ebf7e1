// Shared helpers for the operator tests: random problems in mha's API form and in the double
// reference's form, built from the same float values.
#ifndef MHA_TESTS_ATTENTION_TEST_UTIL_H_
#define MHA_TESTS_ATTENTION_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/attention_impl.h"
#include "tests/reference/reference_attention.h"

namespace mha {
namespace testing_util {

enum class MaskChoice { kNone, kBool, kFloat };

// A complete random attention problem.
struct Problem {
  AttentionConfig config;
  bool packed = true;
  QkvLayout layout = QkvLayout::kPyTorch;
  WeightBinding binding = WeightBinding::kView;
  bool batched = true;
  bool self_attention = false;
  int64_t N = 1, L = 1, S = 1;
  MaskChoice attn = MaskChoice::kNone;
  bool attn_3d = false;
  MaskChoice kpm = MaskChoice::kNone;
  bool causal = false;
  bool need_weights = false;
  bool average = true;
  int64_t row_pad = 0;  // extra floats between tokens of the inputs (strided views)

  // Attention variants (config holds their scalars): the extra weights, empty = absent; token
  // positions, empty = the defaults. positions is [N, L] ([L] when positions_shared: one
  // vector for the whole batch, given to mha as a rank-1 tensor), key_positions [N, S]; passed
  // to mha as pos_dtype (kI32 or kI64).
  std::vector<float> sinks, alibi_slopes, q_norm, k_norm;
  // RoPE scaling: kLongRope's factor arrays (empty = absent), and the frequencies and attention
  // factor the reference rotates with (empty = theta / rope_scale's; tests compute a scaling's
  // from their own transcription of transformers).
  std::vector<float> rope_short_factor, rope_long_factor;
  std::vector<double> ref_rope_inv_freq;
  double ref_rope_attention = 1.0;
  std::vector<int64_t> positions, key_positions;
  bool positions_shared = false;
  DType pos_dtype = DType::kI32;

  // Weights as mha sees them.
  std::vector<float> in_proj_w, in_proj_b, wq, wk, wv, bias_k, bias_v, wo, bo;
  // Separate q, k, v biases when config.bias_projections is set (empty = unbiased).
  std::vector<float> bq, bk, bv;
  // Inputs in the layout described by batched / batch_first.
  std::vector<float> query, key, value;
  std::vector<float> attn_mask_f;
  std::vector<uint8_t> attn_mask_b;
  std::vector<float> kpm_f;
  std::vector<uint8_t> kpm_b;

  std::string Describe() const;
};

// A uniform integer in [lo, hi]; true with probability p.
int64_t Pick(std::mt19937* rng, int64_t lo, int64_t hi);
bool Coin(std::mt19937* rng, double p = 0.5);

// Fills a problem's tensors with random values (masks included) from `rng`.
void FillProblem(Problem* p, std::mt19937* rng);

// A random configuration; `max_len` bounds L and S.
Problem RandomProblem(std::mt19937* rng, int64_t max_len = 9);

// Reference inputs (batch-first dense doubles) and outputs of a problem.
void RunReference(const Problem& p, reference::Outputs* out);

// mha's inputs/weights views over a problem's storage.
AttentionWeights WeightsOf(const Problem& p);
struct Views {
  AttentionInputs in;
  AttentionOutputs out;
  std::vector<float> output;   // sized for the output
  std::vector<float> weights;  // sized for the attention weights
  std::vector<int32_t> pos32, key_pos32;  // positions' storage when Problem::pos_dtype is kI32
};
void MakeViews(const Problem& p, Views* v);

// Element (n, l, e) of an output stored in the problem's query layout.
float OutputAt(const Problem& p, const std::vector<float>& out, int64_t n, int64_t l, int64_t e);

// The operator against the double reference: f32 arithmetic on O(1) values (products summed
// over <= 64 terms, softmax, two more products) is within 2e-5 absolute + 2e-4 relative, while
// an indexing or masking error is O(0.1).
constexpr double kAtol = 2e-5;
constexpr double kRtol = 2e-4;
bool Close(double got, double want);

// Max over elements of |got - want| / (1 + |want|) (NaN counts as infinite): decode against
// the forward's output.
double MaxScaledError(const std::vector<float>& got, const std::vector<float>& want);

// One batch entry's tokens x [T, E] (batch_first layer) through `layer` on ctx: token by token
// through a new KvCache into *steps [T, E], and as one causal forward into *full [T, E]. gtest
// failures on any error.
void DecodeAndCausalForward(Context& ctx, const MultiheadAttention& layer,
                            const std::vector<float>& x, int64_t T, int64_t E,
                            std::vector<float>* steps, std::vector<float>* full);

// Creates the layer of `p`, plans and runs its forward on `threads` threads into `v` (gtest
// assertions: every step succeeds, the workspace stays within the plan).
void RunForward(const Problem& p, size_t threads, Views* v);
// The same for a layer of `config` and `weights` bound as `binding` (another storage of p's
// weights), on p's inputs.
void RunLayerForward(const AttentionConfig& config, const AttentionWeights& weights,
                     WeightBinding binding, const Problem& p, size_t threads, Views* v);
// The same on a context made with `options` (its threads, grouping and bf16 kernel), for p's
// layer or for `layer`.
void RunForwardWith(const Problem& p, const ContextOptions& options, Views* v);
void RunLayerOn(const MultiheadAttention& layer, const Problem& p, const ContextOptions& options,
                Views* v);

// gtest failures (the first three, named by `what`) where got's bits differ from want's.
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what);

// The largest |got - want| and the largest |want| (the output's scale).
struct OutputError {
  double err = 0, scale = 0;
};
OutputError MaxError(const std::vector<float>& got, const std::vector<float>& want);

// The forward's output and (when requested) attention weights against the reference, within
// Close; each weights row's sum too (1 - p_sink with sinks). gtest failures name the problem.
void ExpectMatchesReference(const Problem& p, const Views& v);

// Sets the operator's key chunking (runtime/attention_impl.h) for one scope: chunks of
// `chunk_keys` keys for K/V of any size, so small shapes take the chunked path; or, with
// chunk_keys 0, never chunked.
class ScopedKeyChunking {
 public:
  explicit ScopedKeyChunking(int64_t chunk_keys)
      : previous_(SetKeyChunkingForTesting(
            chunk_keys > 0 ? KeyChunking{0, chunk_keys}
                           : KeyChunking{std::numeric_limits<size_t>::max(), 1})) {}
  ~ScopedKeyChunking() { SetKeyChunkingForTesting(previous_); }
  ScopedKeyChunking(const ScopedKeyChunking&) = delete;
  ScopedKeyChunking& operator=(const ScopedKeyChunking&) = delete;

 private:
  KeyChunking previous_;
};

// Sets the operator's batch grouping (runtime/forward_plan.h) for one scope: groups of
// ceil(rows / L) entries whose buffers take at most max_bytes (by default whatever their bytes),
// so small shapes take the grouped forward; or, with rows 0, never grouped.
class ScopedBatchGrouping {
 public:
  explicit ScopedBatchGrouping(size_t rows, size_t max_bytes = std::numeric_limits<size_t>::max())
      : previous_(SetBatchGroupingForTesting({rows, max_bytes})) {}
  ~ScopedBatchGrouping() { SetBatchGroupingForTesting(previous_); }
  ScopedBatchGrouping(const ScopedBatchGrouping&) = delete;
  ScopedBatchGrouping& operator=(const ScopedBatchGrouping&) = delete;

 private:
  BatchGrouping previous_;
};

// The entries per group of p's forward (into a separate output) on `threads` threads with the
// current batch grouping (ForwardPlan::batch_group; 0: stage by stage).
size_t ForwardBatchGroup(const Problem& p, size_t threads);

// Whether p's forward (into a separate output) on `threads` threads runs grouped when groups
// are ceil(rows / L) entries (ScopedBatchGrouping).
bool RunsGrouped(const Problem& p, size_t rows, size_t threads);

// Runs p on `threads` threads stage by stage and in groups of ceil(rows / L) entries: the same
// output bits (gtest failures name the problem), and the grouped output against the reference.
void ExpectGroupedGivesStagedBits(const Problem& p, size_t threads, size_t rows);

// Whether any forward can run grouped on this CPU: the grouped forward multiplies prepacked f32
// weights, which BLIS's configurations that store column-major C tiles (e.g. generic, on
// aarch64) cannot have. Elsewhere every forward runs stage by stage.
bool GroupingPossible();

// A grouped-query layer's separate projections (nn.Linear layout): q and out [E, E], k and v
// [kvE, E] with kvE = KVH * E / H; with `bias`, in-projection biases [E + 2 kvE] (q, k, v) and
// an out-projection bias [E]. Drawn in that order, each element from `draw`.
struct SeparateWeights {
  std::vector<float> q, k, v, out, in_bias, out_bias;
  // Pointers into the vectors; biases null when empty.
  AttentionWeights View() const;
};
template <class Draw>
SeparateWeights DrawSeparateWeights(int64_t E, int64_t H, int64_t KVH, bool bias, Draw draw) {
  const size_t e = static_cast<size_t>(E), kve = static_cast<size_t>(E / H * KVH);
  SeparateWeights w;
  w.q.resize(e * e);
  w.k.resize(kve * e);
  w.v.resize(kve * e);
  w.out.resize(e * e);
  if (bias) {
    w.in_bias.resize(e + 2 * kve);
    w.out_bias.resize(e);
  }
  for (auto* m : {&w.q, &w.k, &w.v, &w.out, &w.in_bias, &w.out_bias}) {
    for (float& x : *m) x = draw();
  }
  return w;
}

// A Llama-like layer's configuration: E features, H heads, KVH kv heads, no biases,
// batch-first, RoPE (neox).
AttentionConfig LlamaLikeConfig(int64_t E, int64_t H, int64_t KVH);

}  // namespace testing_util
}  // namespace mha

#endif  // MHA_TESTS_ATTENTION_TEST_UTIL_H_
