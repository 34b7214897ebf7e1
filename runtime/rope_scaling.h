// RoPE scaling (AttentionConfig::rope_scaling): the checks of its parameters, their resolution
// into a layer, and each type's inverse frequencies and attention factor, transcribed from
// transformers' modeling_rope_utils.py (README "RoPE scaling"). Everything is computed in
// double. Internal: not installed.
//
// When: the static types (none, linear, llama3, yarn) give one table at creation
// (LayerVariants::inv_freq). kLongRope gives two at creation, chosen per call; kDynamic's table
// past rope_original_max_positions depends on the call's length, so the QK transform computes
// it per task into its scratch (RopeCallInvFreq; rd/2 pow() against the task's 64 x rd/2 cos and
// sin). A call's length is its largest position + 1: a forward's or Project's over all of its
// query and key positions, a KV-cache step's over the real (not padding) tokens it adds or
// queries (qk_transform.h's RopeCallLength and QkRows::rope_len).
#ifndef MHA_RUNTIME_ROPE_SCALING_H_
#define MHA_RUNTIME_ROPE_SCALING_H_

#include <cstdint>
#include <vector>

#include "mha/mha.hpp"

namespace mha {

// transformers' rope_type name of a scaling type ("llama3"; "none" for kNone).
const char* RopeScalingName(RopeScaling type);

// A layer's RoPE frequency settings, resolved (defaults applied, longrope factors copied).
struct RopeScalingParams {
  RopeScaling type = RopeScaling::kNone;
  int64_t rotary_dim = 0;    // rd; 0 without RoPE
  double theta = 10000.0;    // rope_theta (0 = 10000)
  double factor = 1.0;       // rope_factor; kNone: rope_scale (0 = 1)
  int64_t original_max = 0;  // rope_original_max_positions (kDynamic: transformers'
                             // max_position_embeddings)
  double low_freq_factor = 0.0, high_freq_factor = 0.0;  // kLlama3
  double beta_fast = 32.0, beta_slow = 1.0;              // kYarn
  bool truncate = true;                                  // kYarn: !rope_no_truncate
  double attention = 1.0;  // cos and sin are multiplied by it (kYarn, kLongRope; else 1)
  std::vector<double> short_factor, long_factor;  // kLongRope: [rd / 2] each
  std::vector<double> long_inv_freq;  // kLongRope: the frequencies of calls past original_max

  // Whether a call's frequencies depend on its length (kDynamic, kLongRope).
  bool LengthDependent() const {
    return type == RopeScaling::kDynamic || type == RopeScaling::kLongRope;
  }
};

// Checks config's rope_scaling fields and weights' rope_short_factor / rope_long_factor
// (messages prefixed "MultiheadAttention::Create: ") against the layer's resolved rotary_dim (0:
// no RoPE, when every scaling field must be off), then fills *p and inv_freq [rd / 2] (the
// frequencies of every call for the static types, of calls up to original_max for kDynamic and
// kLongRope). InvalidArgument for values out of range or fields the type does not read;
// Unsupported for rope_scaling without rope, rope_scale with rope_scaling, and kLongRope without
// both factor arrays.
Status ResolveRopeScaling(const AttentionConfig& config, const AttentionWeights& weights,
                          int64_t rotary_dim, RopeScalingParams* p, std::vector<double>* inv_freq);

// The inverse frequencies [rd / 2] of a call of length seq_len (read by kDynamic and kLongRope
// only; <= 0 stands for transformers' seq_len None, the frequencies at creation).
void ComputeRopeInvFreq(const RopeScalingParams& p, int64_t seq_len, double* inv_freq);

// The frequencies a call of length seq_len rotates with: `inv_freq` (the layer's), or
// p.long_inv_freq (kLongRope past original_max), or computed into buf [rd / 2] (kDynamic past
// original_max). Deterministic in seq_len: any thread computes the same bits.
const double* RopeCallInvFreq(const RopeScalingParams& p, const std::vector<double>& inv_freq,
                              int64_t seq_len, double* buf);

}  // namespace mha

#endif  // MHA_RUNTIME_ROPE_SCALING_H_
