// The family table (runtime/hf_families.h). Each row cites the transformers files it follows;
// defaults are the configuration class's field defaults (transformers 5.x), names and layouts
// its modeling file's attention class.
#include "runtime/hf_families.h"

#include <algorithm>
#include <cstring>

#include "mha/mha.hpp"

namespace mha {

namespace {

HfTensorNames Linear(const char* q, const char* k, const char* v, const char* out) {
  HfTensorNames n;
  n.q = q;
  n.k = k;
  n.v = v;
  n.out = out;
  return n;
}

HfTensorNames Fused(const char* qkv, const char* out) {
  HfTensorNames n;
  n.qkv = qkv;
  n.out = out;
  return n;
}

HfModuleKind Module(const char* pattern, HfRole role, HfLayout layout, HfTensorNames names) {
  HfModuleKind m;
  m.pattern = pattern;
  m.role = role;
  m.layout = layout;
  m.names = names;
  return m;
}

// Llama-style decoders: model.layers.{i}.self_attn.{q,k,v,o}_proj.
HfModuleKind LlamaSelfAttn() {
  return Module("layers.{i}.self_attn.", HfRole::kDecoderSelf, HfLayout::kSeparate,
                Linear("q_proj", "k_proj", "v_proj", "o_proj"));
}

// A Llama-like row: separate projections, grouped-query heads, head_dim from the config, RoPE.
HfFamily LlamaLike(const char* model_type, const char* defaults) {
  HfFamily f;
  f.model_type = model_type;
  f.defaults = defaults;
  f.modules = {LlamaSelfAttn()};
  f.kv_heads_key = "num_key_value_heads";
  f.head_dim_key = true;
  f.rope = HfRope::kNeox;
  return f;
}

std::vector<HfFamily> BuildTable() {
  std::vector<HfFamily> t;

  // llama: configuration_llama.py, modeling_llama.py (LlamaAttention). Llama 1-3.x; rope
  // scaling linear / dynamic / llama3 / yarn through rope_parameters (rope_scaling).
  HfFamily llama = LlamaLike("llama", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": null, "head_dim": null,
      "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "attention_bias": false})");
  llama.bias_key = "attention_bias";
  t.push_back(llama);

  // mistral: MistralAttention has no biases; sliding_window (default 4096) on every layer.
  HfFamily mistral = LlamaLike("mistral", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": null,
      "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 4096})");
  mistral.window = HfWindow::kAllLayers;
  t.push_back(mistral);

  // mixtral: the attention only (the experts are not attention); default_theta 1e6, no window
  // unless sliding_window is set.
  HfFamily mixtral = LlamaLike("mixtral", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": null,
      "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "sliding_window": null})");
  mixtral.default_theta = 1e6;
  mixtral.window = HfWindow::kAllLayers;
  t.push_back(mixtral);

  // qwen2: q, k, v biased, o not (Qwen2Attention); windows only with use_sliding_window, on
  // layers >= max_window_layers unless layer_types says otherwise.
  HfFamily qwen2 = LlamaLike("qwen2", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-6, "use_sliding_window": false, "sliding_window": 4096,
      "max_window_layers": 28, "layer_types": null})");
  qwen2.fixed_biases = kBiasQ | kBiasK | kBiasV;
  qwen2.window = HfWindow::kLayerTypes;
  qwen2.default_types = HfDefaultTypes::kMaxWindowLayers;
  qwen2.window_gate = "use_sliding_window";
  t.push_back(qwen2);

  // qwen3: head_dim 128 by default (A may differ from hidden_size), per-head RMS QK-norm,
  // attention_bias for all four.
  HfFamily qwen3 = LlamaLike("qwen3", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
      "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "attention_bias": false,
      "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28,
      "layer_types": null})");
  qwen3.bias_key = "attention_bias";
  qwen3.window = HfWindow::kLayerTypes;
  qwen3.default_types = HfDefaultTypes::kMaxWindowLayers;
  qwen3.window_gate = "use_sliding_window";
  qwen3.qk_norm = HfQkNorm::kPerHead;
  qwen3.modules[0].names.q_norm = "q_norm";
  qwen3.modules[0].names.k_norm = "k_norm";
  t.push_back(qwen3);

  // gemma: head_dim 256 by default. use_bidirectional_attention makes GemmaAttention non-causal
  // while GemmaModel still builds a causal mask: refused rather than guessed.
  const HfRefusal gemma_bidirectional = {
      "use_bidirectional_attention", "false",
      "use_bidirectional_attention (transformers' attention module and model disagree on the "
      "mask for this family)"};
  HfFamily gemma = LlamaLike("gemma", R"({"hidden_size": 3072, "num_hidden_layers": 28,
      "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
      "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "attention_bias": false})");
  gemma.bias_key = "attention_bias";
  gemma.refusals = {gemma_bidirectional};
  t.push_back(gemma);

  // gemma2: scale query_pre_attn_scalar^-0.5, logit softcap 50, sliding window on even layers.
  HfFamily gemma2 = LlamaLike("gemma2", R"({"hidden_size": 2304, "num_hidden_layers": 26,
      "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
      "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "attention_bias": false,
      "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": null,
      "attn_logit_softcapping": 50.0})");
  gemma2.bias_key = "attention_bias";
  gemma2.scale = HfScale::kQueryPreAttnScalar;
  gemma2.window = HfWindow::kLayerTypes;
  gemma2.default_types = HfDefaultTypes::kEveryOther;
  gemma2.softcap_key = "attn_logit_softcapping";
  gemma2.refusals = {gemma_bidirectional};
  t.push_back(gemma2);

  // gemma3_text (and gemma3, whose text_config holds the same): five sliding layers of six,
  // global layers' base rope_theta (1e6), sliding layers' rope_local_base_freq (1e4), per-head
  // QK-norm with weight 1 + w, optional bidirectional attention (EmbeddingGemma).
  HfFamily gemma3 = LlamaLike("gemma3_text", R"({"hidden_size": 2304, "num_hidden_layers": 26,
      "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
      "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "attention_bias": false,
      "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": null,
      "attn_logit_softcapping": null, "use_bidirectional_attention": false,
      "sliding_window_pattern": 6})");
  gemma3.bias_key = "attention_bias";
  gemma3.scale = HfScale::kQueryPreAttnScalar;
  gemma3.default_theta = 1e6;
  gemma3.default_local_theta = 1e4;
  gemma3.window = HfWindow::kLayerTypes;
  gemma3.default_types = HfDefaultTypes::kPattern;
  gemma3.softcap_key = "attn_logit_softcapping";
  gemma3.qk_norm = HfQkNorm::kPerHeadPlusOne;
  gemma3.modules[0].names.q_norm = "q_norm";
  gemma3.modules[0].names.k_norm = "k_norm";
  gemma3.bidirectional_key = true;
  t.push_back(gemma3);
  HfFamily gemma3_mm = gemma3;
  gemma3_mm.model_type = "gemma3";
  gemma3_mm.text_config = true;
  t.push_back(gemma3_mm);

  // phi: every projection biased, output named dense, partial RoPE (default factor 0.5).
  HfFamily phi = LlamaLike("phi", R"({"hidden_size": 2048, "num_hidden_layers": 24,
      "num_attention_heads": 32, "num_key_value_heads": null,
      "max_position_embeddings": 2048, "qk_layernorm": false})");
  phi.modules[0].names.out = "dense";
  phi.fixed_biases = kBiasAll;
  phi.partial_rotary = true;
  phi.default_partial = 0.5;
  phi.refusals = {{"qk_layernorm", "false",
                   "qk_layernorm (Phi's QK-norm is a LayerNorm with mean and bias; mha's "
                   "QK-norm is an RMSNorm)"}};
  t.push_back(phi);

  // phi3: fused qkv_proj [A + 2 kvE, D] in q, k, v row order; no biases; longrope (Phi-3.5),
  // whose original_max_position_embeddings is the top-level attribute; "su" and "yarn" are
  // legacy names of longrope (Phi3Config.convert_rope_params_to_dict).
  HfFamily phi3 = LlamaLike("phi3", R"({"hidden_size": 3072, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": null,
      "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
      "rms_norm_eps": 1e-5, "sliding_window": null})");
  phi3.modules[0].layout = HfLayout::kFusedRows;
  phi3.modules[0].names = Fused("qkv_proj", "o_proj");
  phi3.partial_rotary = true;
  phi3.rope_type_aliases = {{"su", "longrope"}, {"yarn", "longrope"}};
  phi3.original_max_top_level = true;
  phi3.window = HfWindow::kAllLayers;
  t.push_back(phi3);

  // gpt2: Conv1D weights [in, out]; every projection biased; scale rules of GPT2Attention;
  // optional cross-attention (add_cross_attention: h.{i}.crossattention, by prefix).
  HfFamily gpt2;
  gpt2.model_type = "gpt2";
  gpt2.defaults = R"({"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
      "max_position_embeddings": 1024, "scale_attn_weights": true,
      "scale_attn_by_inverse_layer_idx": false})";
  gpt2.key_aliases = {{"n_embd", "hidden_size"},
                      {"n_layer", "num_hidden_layers"},
                      {"n_head", "num_attention_heads"},
                      {"n_positions", "max_position_embeddings"}};
  gpt2.modules = {
      Module("h.{i}.attn.", HfRole::kDecoderSelf, HfLayout::kConv1D, Fused("c_attn", "c_proj"))};
  HfTensorNames gpt2_cross;
  gpt2_cross.q = "q_attn";
  gpt2_cross.kv = "c_attn";
  gpt2_cross.out = "c_proj";
  HfModuleKind gpt2_cross_kind =
      Module("h.{i}.crossattention.", HfRole::kCross, HfLayout::kConv1DCross, gpt2_cross);
  gpt2_cross_kind.by_layer_index = false;
  gpt2.modules.push_back(gpt2_cross_kind);
  gpt2.fixed_biases = kBiasAll;
  gpt2.scale = HfScale::kGpt2;
  t.push_back(gpt2);

  // gpt_neox (Pythia): query_key_value rows per head [H, 3, hd]; partial RoPE (rotary_pct,
  // default 0.25) with base rotary_emb_base.
  HfFamily neox;
  neox.model_type = "gpt_neox";
  neox.defaults = R"({"hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
      "max_position_embeddings": 2048, "attention_bias": true})";
  neox.modules = {Module("layers.{i}.attention.", HfRole::kDecoderSelf, HfLayout::kPerHead,
                         Fused("query_key_value", "dense"))};
  neox.bias_key = "attention_bias";
  neox.rope = HfRope::kNeox;
  neox.theta_alias = "rotary_emb_base";
  neox.partial_rotary = true;
  neox.partial_alias = "rotary_pct";
  neox.default_partial = 0.25;
  t.push_back(neox);

  // gptj: separate projections without biases; rotate_every_two RoPE on rotary_dim (64)
  // components, base 10000 (create_sinusoidal_positions).
  HfFamily gptj;
  gptj.model_type = "gptj";
  gptj.defaults = R"({"hidden_size": 4096, "num_hidden_layers": 28, "num_attention_heads": 16,
      "rotary_dim": 64, "max_position_embeddings": 2048})";
  gptj.key_aliases = {{"n_embd", "hidden_size"},
                      {"n_layer", "num_hidden_layers"},
                      {"n_head", "num_attention_heads"},
                      {"n_positions", "max_position_embeddings"}};
  gptj.modules = {Module("h.{i}.attn.", HfRole::kDecoderSelf, HfLayout::kSeparate,
                         Linear("q_proj", "k_proj", "v_proj", "out_proj"))};
  gptj.rope = HfRope::kGptj;
  t.push_back(gptj);

  // falcon: query_key_value laid out by new_decoder_architecture / multi_query; RoPE unless
  // alibi, whose bias Falcon adds before the 1/sqrt(hd) scaling.
  HfFamily falcon;
  falcon.model_type = "falcon";
  falcon.defaults = R"({"hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
      "num_kv_heads": null, "alibi": false, "new_decoder_architecture": false,
      "multi_query": true, "bias": false, "max_position_embeddings": 2048})";
  falcon.key_aliases = {{"n_embed", "hidden_size"}};
  falcon.modules = {Module("h.{i}.self_attention.", HfRole::kDecoderSelf, HfLayout::kFalcon,
                           Fused("query_key_value", "dense"))};
  falcon.bias_key = "bias";
  falcon.rope = HfRope::kNeoxUnlessAlibi;
  falcon.alibi = HfAlibi::kFalconConfig;
  t.push_back(falcon);

  // bloom: query_key_value rows per head [H, 3, hd], biased; ALiBi.
  HfFamily bloom;
  bloom.model_type = "bloom";
  bloom.defaults = R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8})";
  bloom.key_aliases = {{"n_embed", "hidden_size"},
                       {"n_layer", "num_hidden_layers"},
                       {"n_head", "num_attention_heads"}};
  bloom.modules = {Module("h.{i}.self_attention.", HfRole::kDecoderSelf, HfLayout::kPerHead,
                          Fused("query_key_value", "dense"))};
  bloom.fixed_biases = kBiasAll;
  bloom.alibi = HfAlibi::kAlways;
  t.push_back(bloom);

  // bert, roberta: encoder.layer.{i}.attention.{self.query, self.key, self.value,
  // output.dense} (the output LayerNorm and residual are not attention); bidirectional unless
  // is_decoder; optional cross-attention by prefix. Only absolute position embeddings.
  for (const char* type : {"bert", "roberta"}) {
    HfFamily bert;
    bert.model_type = type;
    bert.defaults = R"({"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "max_position_embeddings": 512, "is_decoder": false})";
    const HfTensorNames names = Linear("self.query", "self.key", "self.value", "output.dense");
    bert.modules = {Module("encoder.layer.{i}.attention.", HfRole::kSelfFromConfig,
                           HfLayout::kSeparate, names)};
    HfModuleKind cross =
        Module("encoder.layer.{i}.crossattention.", HfRole::kCross, HfLayout::kSeparate, names);
    cross.by_layer_index = false;
    bert.modules.push_back(cross);
    bert.fixed_biases = kBiasAll;
    bert.refusals = {{"position_embedding_type", "\"absolute\"",
                      "position_embedding_type (relative position scores)"}};
    t.push_back(bert);
  }

  // olmo2: RMS QK-norm over the whole projections (q_norm [A], k_norm [kvE]).
  HfFamily olmo2 = LlamaLike("olmo2", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": null,
      "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "attention_bias": false})");
  olmo2.bias_key = "attention_bias";
  olmo2.qk_norm = HfQkNorm::kWhole;
  olmo2.modules[0].names.q_norm = "q_norm";
  olmo2.modules[0].names.k_norm = "k_norm";
  t.push_back(olmo2);

  // gpt_oss: biased projections, per-head sinks, sliding window (128) on even layers, YaRN
  // by default (GptOssConfig.__post_init__), default_theta 150000.
  HfFamily oss = LlamaLike("gpt_oss", R"({"hidden_size": 2880, "num_hidden_layers": 36,
      "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
      "sliding_window": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
      "attention_bias": true, "layer_types": null})");
  oss.bias_key = "attention_bias";
  oss.default_theta = 150000.0;
  oss.default_rope = R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
      "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096})";
  oss.window = HfWindow::kLayerTypes;
  oss.default_types = HfDefaultTypes::kEveryOther;
  oss.sinks = true;
  oss.modules[0].names.sinks = "sinks";
  t.push_back(oss);

  // whisper: q, v and out biased, k not (WhisperAttention); a layer index picks the decoder's
  // causal self-attention (the encoder's when the checkpoint has no decoder); the decoder's
  // cross-attention over the encoder states by prefix.
  HfFamily whisper;
  whisper.model_type = "whisper";
  whisper.defaults = R"({"hidden_size": 384, "encoder_layers": 4, "encoder_attention_heads": 6,
      "decoder_layers": 4, "decoder_attention_heads": 6})";
  whisper.key_aliases = {{"d_model", "hidden_size"}};
  const HfTensorNames whisper_names = Linear("q_proj", "k_proj", "v_proj", "out_proj");
  HfModuleKind dec = Module("decoder.layers.{i}.self_attn.", HfRole::kDecoderSelf,
                            HfLayout::kSeparate, whisper_names);
  dec.heads_key = "decoder_attention_heads";
  dec.layers_key = "decoder_layers";
  HfModuleKind enc = Module("encoder.layers.{i}.self_attn.", HfRole::kEncoderSelf,
                            HfLayout::kSeparate, whisper_names);
  enc.heads_key = "encoder_attention_heads";
  enc.layers_key = "encoder_layers";
  HfModuleKind xattn = Module("decoder.layers.{i}.encoder_attn.", HfRole::kCross,
                              HfLayout::kSeparate, whisper_names);
  xattn.heads_key = "decoder_attention_heads";
  xattn.layers_key = "decoder_layers";
  xattn.by_layer_index = false;
  whisper.modules = {dec, enc, xattn};
  whisper.fixed_biases = kBiasQ | kBiasV | kBiasOut;
  t.push_back(whisper);

  return t;
}

}  // namespace

const std::vector<HfFamily>& HfFamilies() {
  static const std::vector<HfFamily> table = BuildTable();
  return table;
}

const HfFamily* FindHfFamily(const std::string& model_type) {
  for (const HfFamily& f : HfFamilies()) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

std::string SupportedHfModelTypes() {
  std::vector<std::string> names;
  for (const HfFamily& f : HfFamilies()) names.emplace_back(f.model_type);
  std::sort(names.begin(), names.end());
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace mha
