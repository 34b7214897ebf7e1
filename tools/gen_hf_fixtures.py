#!/usr/bin/env python3
"""Generates the Hugging Face checkpoint fixtures: tests/data/hf/<case>/.

Each case builds a tiny random model of one family with transformers (the family's own config and
model classes, no download), saves it with `save_pretrained` (bf16 for most cases, f16 or f32 for
a few, one case sharded), reloads that folder in float64 with the eager attention (falcon_alibi:
sdpa, see tests/data/hf/README.md), and records the outputs of chosen attention modules on a
fixed f32 query:

    checkpoint/           the folder as save_pretrained wrote it (the *_v4config cases: with
                          config.json rewritten into transformers 4.x's keys afterwards)
    inputs.safetensors    query [N, L, hidden] f32; key [N, S, hidden] f32 (cross-attention);
                          positions [N, L] i64 (RoPE families); key_padding_mask [N, L] u8
                          (1 = ignore that key; BERT/RoBERTa)
    expected.safetensors  <module>.attn_output [N, L, hidden] f32 for each module, and for causal
                          decoder modules <module>.decode_output: the same module run token by
                          token through transformers' own KV cache
    case.json             family, model_type, modules (name, layer, prefix, causal, cross),
                          exercises

How a module's output is recorded: the whole model runs (so it builds its own RoPE cos/sin,
masks, ALiBi and caches), but a forward pre-hook on the attention module replaces its
hidden_states argument with the query (and, for cross-attention, key_value_states with the key;
for BLOOM the residual the module adds with zeros), and a forward hook records its output. BERT
and RoBERTa: the pre-hook sits on `attention.self` and the output is `attention.output.dense`'s
(the LayerNorm and residual after it are not attention). Decode: the model runs one token per
call with a cache object carried over, the pre-hook substituting query[:, t:t+1] and positions
[:, t:t+1]; the per-step outputs are concatenated.

The reference is float64 except where transformers itself rounds to float32 (RoPE angles and
cos/sin, the Gemma/Qwen3/OLMo 2 RMSNorm, GPT-J's q.k product); its eager softmax, which it computes
in float32, is computed in float64 here (torch.nn.functional.softmax is wrapped while the
reference runs), so that the expected values are the module's exact outputs up to those roundings.

Self-checks: for the cases with a `direct` recomputation (Llama-like with default RoPE, BLOOM,
Falcon ALiBi, BERT, Whisper) the attention output is recomputed from the saved tensors in float64
(projections, RoPE with transformers' float32 angles, masks, ALiBi, softmax, output projection)
and must agree to 1e-10; for every decoder module whose RoPE does not depend on the call's
length, the token-by-token output must equal the forward's to 1e-10 (GPT-J 1e-6); the
*_v4config folders must read back to the same rope_parameters.

Deterministic (a seed per case from its name, one torch thread). Run from the repository root:

    build/peers-venv/bin/python tools/gen_hf_fixtures.py [--out tests/data/hf] [--only a,b]
    build/peers-venv/bin/python tools/gen_hf_fixtures.py --check   # regenerate, compare bytes
    build/peers-venv/bin/python tools/gen_hf_fixtures.py --list    # names and what each exercises
"""

import argparse
import copy
import inspect
import json
import math
import os
import shutil
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file as st_load_file
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
except ImportError as e:  # pragma: no cover
    sys.exit(f"gen_hf_fixtures.py needs torch, transformers and safetensors (run it with "
             f"build/peers-venv/bin/python): {e}")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "hf")

N = 2        # batch
L = 7        # query tokens
S = 5        # key tokens of the cross-attention case
VOCAB = 64


class Module:
    """One attention module of a case.

    name: the key prefix in expected.safetensors. layer: the layer index (`mha-run --layer`).
    prefix: the state_dict prefix when the module is picked by prefix (`--prefix`), else None.
    path: the module's path in the transformers model (for the hooks). out_path: the submodule
    whose output is the attention output, when not the module itself (BERT's
    attention.output.dense).
    """

    def __init__(self, name, layer, path, causal=True, cross=False, prefix=None, out_path=None,
                 zero_residual=False):
        self.name = name
        self.layer = layer
        self.path = path
        self.causal = causal
        self.cross = cross
        self.prefix = prefix
        self.out_path = out_path or path
        self.zero_residual = zero_residual


class Case:
    def __init__(self, name, family, model_class, config, modules, exercises, dtype=torch.bfloat16,
                 positions=None, padding=False, shard=None, attn="eager", stateless_rope=True,
                 direct=None, kind="decoder", decode_tol=1e-10, legacy_config=None):
        self.name = name
        self.family = family
        self.model_class = model_class
        self.config = config          # a callable returning the config (built fresh each time)
        self.modules = modules
        self.exercises = exercises
        self.dtype = dtype
        self.positions = positions    # per-row start positions, or None (no position_ids input)
        self.padding = padding        # key padding in row 1 (encoders)
        self.shard = shard            # save_pretrained max_shard_size
        self.attn = attn              # reference attention implementation
        self.stateless_rope = stateless_rope  # decode must equal forward
        self.direct = direct          # name of a direct recomputation (DIRECT), or None
        self.kind = kind              # decoder | encoder | whisper
        self.decode_tol = decode_tol  # decode vs forward (GPT-J rounds q.k to float32)
        self.legacy_config = legacy_config  # rewrites config.json into transformers 4.x's keys


def T(name):
    return getattr(transformers, name)


def layer_modules(path_fmt, layers, **kw):
    return [Module(f"layer{i}", i, path_fmt.format(i), **kw) for i in layers]


def rope(theta=10000.0, **kw):
    d = {"rope_type": "default", "rope_theta": theta}
    d.update(kw)
    return d


def _llama_like(cls, **extra):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base.update(extra)
    return lambda: T(cls)(**base)


def build_cases():
    cases = []
    self_attn = "model.layers.{}.self_attn"

    cases.append(Case(
        "llama", "llama", "LlamaForCausalLM",
        _llama_like("LlamaConfig", rope_parameters=rope(10000.0)),
        layer_modules(self_attn, [1]),
        "Llama 2 style: GQA 4/2, neox RoPE theta 1e4, no biases; positions start at 3 (row 0) "
        "and 0",
        positions=[3, 0], direct="llama"))
    cases.append(Case(
        "llama3", "llama", "LlamaForCausalLM",
        _llama_like("LlamaConfig", rope_parameters=rope(
            10000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=32)),
        layer_modules(self_attn, [1]),
        "Llama 3.x RoPE scaling llama3 (factor 8, low 1, high 4, original 32 -> with head_dim 16 "
        "one frequency kept, one smoothed, six divided by 8)"))
    cases.append(Case(
        "llama_dynamic", "llama", "LlamaForCausalLM",
        _llama_like("LlamaConfig", max_position_embeddings=4,
                    rope_parameters=rope(10000.0, rope_type="dynamic", factor=2.0)),
        layer_modules(self_attn, [1]),
        "dynamic NTK RoPE (factor 2, max_position_embeddings 4): base from the call's largest "
        "position + 1 (10 in the forward, rows start at 3 and 0; per step in decode)",
        positions=[3, 0], stateless_rope=False))
    cases.append(Case(
        "mistral", "mistral", "MistralForCausalLM",
        _llama_like("MistralConfig", sliding_window=4, rope_parameters=rope(1e6)),
        layer_modules(self_attn, [0]),
        "Mistral: sliding window 4 (keys i-3..i) with GQA 4/2, theta 1e6",
        direct="llama"))
    cases.append(Case(
        "mixtral", "mixtral", "MixtralForCausalLM",
        _llama_like("MixtralConfig", num_local_experts=2, num_experts_per_tok=1,
                    sliding_window=None, rope_parameters=rope(1e6)),
        layer_modules(self_attn, [1]),
        "Mixtral (attention only; 2 tiny experts); checkpoint sharded with "
        "model.safetensors.index.json, the layer's tensors spread over several shards",
        shard="24KB", direct="llama"))
    cases.append(Case(
        "qwen2", "qwen2", "Qwen2ForCausalLM",
        _llama_like("Qwen2Config", rope_parameters=rope(1e6)),
        layer_modules(self_attn, [1]),
        "Qwen2: q/k/v biased, o_proj not; GQA 4/2; positions start at 5 and 2",
        positions=[5, 2], direct="llama"))
    cases.append(Case(
        "qwen2_yarn", "qwen2", "Qwen2ForCausalLM",
        _llama_like("Qwen2Config", max_position_embeddings=16384, rope_parameters=rope(
            1e6, rope_type="yarn", factor=4.0, original_max_position_embeddings=4096)),
        layer_modules(self_attn, [1]),
        "YaRN RoPE (factor 4, original 4096, beta 32/1 by default, truncate true by default: "
        "frequencies 0-1 kept, 2-3 ramped, 4-7 divided by 4; "
        "attention factor 0.1 ln 4 + 1 on cos/sin)"))
    cases.append(Case(
        "qwen3", "qwen3", "Qwen3ForCausalLM",
        _llama_like("Qwen3Config", head_dim=32, rope_parameters=rope(1e6)),
        layer_modules(self_attn, [1]),
        "Qwen3: per-head RMSNorm on q and k before RoPE; head_dim 32 with 4 heads of hidden 64 "
        "(q_proj [128, 64], o_proj [64, 128])"))
    cases.append(Case(
        "gemma", "gemma", "GemmaForCausalLM",
        _llama_like("GemmaConfig", head_dim=32, num_key_value_heads=1, tie_word_embeddings=True,
                    hidden_act="gelu_pytorch_tanh", rope_parameters=rope(10000.0)),
        layer_modules(self_attn, [1]),
        "Gemma: multi-query (1 kv head), head_dim 32 x 4 heads != hidden 64, scale 1/sqrt(32)"))
    cases.append(Case(
        "gemma2", "gemma2", "Gemma2ForCausalLM",
        _llama_like("Gemma2Config", head_dim=32, tie_word_embeddings=True, sliding_window=4,
                    query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                    final_logit_softcapping=30.0, rope_parameters=rope(10000.0)),
        layer_modules(self_attn, [0, 1]),
        "Gemma 2: scale query_pre_attn_scalar^-1/2 (16 -> 0.25), logit softcap 5, layer 0 "
        "sliding (window 4) and layer 1 global (layer_types)"))
    cases.append(Case(
        "gemma3", "gemma3_text", "Gemma3ForCausalLM",
        _llama_like("Gemma3TextConfig", head_dim=32, tie_word_embeddings=True, sliding_window=4,
                    query_pre_attn_scalar=32,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={
                        "sliding_attention": rope(10000.0),
                        "full_attention": rope(1e6, rope_type="linear", factor=8.0)}),
        layer_modules(self_attn, [0, 1]),
        "Gemma 3 text: q/k RMSNorm with (1 + w), layer 0 sliding (window 4, theta 1e4), layer 1 "
        "global (theta 1e6, linear RoPE scaling 8); positions start at 2 and 0",
        positions=[2, 0]))
    cases.append(Case(
        "phi", "phi", "PhiForCausalLM",
        _llama_like("PhiConfig", num_key_value_heads=4, hidden_act="gelu_new",
                    rope_parameters=rope(10000.0, partial_rotary_factor=0.5)),
        layer_modules(self_attn, [1]),
        "Phi (1/2): partial RoPE (8 of head_dim 16), biases on q/k/v and dense"))
    cases.append(Case(
        "phi3", "phi3", "Phi3ForCausalLM",
        _llama_like("Phi3Config", max_position_embeddings=64, original_max_position_embeddings=64,
                    pad_token_id=0, rope_parameters=rope(10000.0)),
        layer_modules(self_attn, [1]),
        "Phi-3: fused qkv_proj [q | k | v] rows with GQA 4/2, no biases"))
    cases.append(Case(
        "phi3_longrope", "phi3", "Phi3ForCausalLM",
        _llama_like("Phi3Config", max_position_embeddings=16, original_max_position_embeddings=4,
                    pad_token_id=0, rope_parameters=rope(
                        10000.0, rope_type="longrope", partial_rotary_factor=0.5,
                        short_factor=[1.0, 1.25, 1.5, 2.0],
                        long_factor=[1.5, 3.0, 6.0, 12.0])),
        layer_modules(self_attn, [1]),
        "LongRoPE (Phi-3.5/4-mini style, partial rotary 8 of 16): original 4 < 7, so the forward "
        "uses long_factor; decode uses short_factor for steps 0-3 and long from step 4 (keys keep "
        "their rotation); attention factor sqrt(1 + ln 4 / ln 4)",
        stateless_rope=False))
    cases.append(Case(
        "gpt2", "gpt2", "GPT2LMHeadModel",
        lambda: T("GPT2Config")(vocab_size=VOCAB, n_embd=64, n_head=4, n_layer=2, n_positions=32,
                                n_inner=64, bos_token_id=1, eos_token_id=2),
        layer_modules("transformer.h.{}.attn", [1]),
        "GPT-2: Conv1D c_attn [64, 192] (x W, not x W^T), biases; learned positions outside "
        "attention; f32 weights",
        dtype=torch.float32))
    cases.append(Case(
        "gpt_neox", "gpt_neox", "GPTNeoXForCausalLM",
        lambda: T("GPTNeoXConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                   rope_parameters=rope(10000.0, partial_rotary_factor=0.25)),
        layer_modules("gpt_neox.layers.{}.attention", [1]),
        "GPT-NeoX/Pythia: fused query_key_value per head [H, 3, hd], biases, rotary_pct 0.25 "
        "(4 of 16); f16 weights (Pythia's dtype)",
        dtype=torch.float16, positions=[1, 0]))
    cases.append(Case(
        "gptj", "gptj", "GPTJForCausalLM",
        lambda: T("GPTJConfig")(vocab_size=VOCAB, n_embd=64, n_head=4, n_layer=2, n_positions=64,
                                rotary_dim=8, n_inner=64, bos_token_id=1, eos_token_id=2),
        layer_modules("transformer.h.{}.attn", [1]),
        "GPT-J: interleaved (rotate_every_two) RoPE on the first 8 of head_dim 16, no biases on "
        "q/k/v/out",
        positions=[0, 4], decode_tol=1e-6))
    cases.append(Case(
        "falcon", "falcon", "FalconForCausalLM",
        lambda: T("FalconConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, multi_query=True, parallel_attn=True,
                                  new_decoder_architecture=False, alibi=False, bias=False,
                                  ffn_hidden_size=64, max_position_embeddings=64,
                                  bos_token_id=1, eos_token_id=2,
                                  rope_parameters=rope(10000.0)),
        layer_modules("transformer.h.{}.self_attention", [1]),
        "Falcon-7B style: old architecture, multi_query (query_key_value rows [H*hd q | hd k | "
        "hd v]), RoPE, no biases"))
    cases.append(Case(
        "falcon_alibi", "falcon", "FalconForCausalLM",
        lambda: T("FalconConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, multi_query=False, parallel_attn=False,
                                  new_decoder_architecture=False, alibi=True, bias=True,
                                  ffn_hidden_size=64, max_position_embeddings=64,
                                  bos_token_id=1, eos_token_id=2),
        layer_modules("transformer.h.{}.self_attention", [1]),
        "Falcon-RW style: ALiBi (slopes scaled by 1/sqrt(head_dim) like the scores), old "
        "architecture without multi_query (query_key_value per head [H, 3, hd]), biases; f32; "
        "reference through sdpa (see README: transformers' eager path adds ALiBi twice)",
        dtype=torch.float32, attn="sdpa", direct="falcon_alibi"))
    cases.append(Case(
        "falcon_new", "falcon", "FalconForCausalLM",
        lambda: T("FalconConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_kv_heads=2,
                                  new_decoder_architecture=True, alibi=False, bias=False,
                                  ffn_hidden_size=64, max_position_embeddings=64,
                                  bos_token_id=1, eos_token_id=2,
                                  rope_parameters=rope(10000.0)),
        layer_modules("transformer.h.{}.self_attention", [1]),
        "Falcon-40B style: new_decoder_architecture, 2 kv groups of [2 q, k, v] heads in "
        "query_key_value, RoPE, no biases"))
    cases.append(Case(
        "bloom", "bloom", "BloomForCausalLM",
        lambda: T("BloomConfig")(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=6,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
        layer_modules("transformer.h.{}.self_attention", [1], zero_residual=True),
        "BLOOM: ALiBi with 6 heads (non-power-of-two slopes), fused query_key_value per head "
        "[H, 3, hd], biases; hidden 48 (head_dim 8)",
        direct="bloom"))
    cases.append(Case(
        "bert", "bert", "BertForMaskedLM",
        lambda: T("BertConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=32, pad_token_id=0),
        [Module(f"layer{i}", i, f"bert.encoder.layer.{i}.attention.self", causal=False,
                out_path=f"bert.encoder.layer.{i}.attention.output.dense") for i in (0, 1)],
        "BERT (BertForMaskedLM: prefix bert.): bidirectional, query/key/value + "
        "attention.output.dense with biases, key padding (row 1: last 2 keys); f32",
        dtype=torch.float32, padding=True, kind="encoder", direct="bert"))
    cases.append(Case(
        "roberta", "roberta", "RobertaModel",
        lambda: T("RobertaConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=40, pad_token_id=1,
                                   bos_token_id=0, eos_token_id=2),
        [Module("layer1", 1, "encoder.layer.1.attention.self", causal=False,
                out_path="encoder.layer.1.attention.output.dense")],
        "RoBERTa (bare RobertaModel: no prefix, encoder.layer.*): bidirectional, key padding "
        "(row 1: last 3 keys)",
        padding=True, kind="encoder"))
    cases.append(Case(
        "olmo2", "olmo2", "Olmo2ForCausalLM",
        _llama_like("Olmo2Config", rope_parameters=rope(500000.0)),
        layer_modules(self_attn, [1]),
        "OLMo 2: RMSNorm over the whole q_proj / k_proj output ([64] and [32]) before the head "
        "split, then RoPE; GQA 4/2"))
    cases.append(Case(
        "gpt_oss", "gpt_oss", "GptOssForCausalLM",
        _llama_like("GptOssConfig", head_dim=32, num_local_experts=2, num_experts_per_tok=1,
                    intermediate_size=32, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"],
                    max_position_embeddings=131072, rope_parameters={
                        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 4096}),
        layer_modules(self_attn, [0, 1]),
        "gpt-oss: sinks per head, YaRN (factor 32, original 4096, truncate false), layer 0 "
        "sliding (window 4) and layer 1 full, biases on q/k/v/o, head_dim 32 x 4 != hidden 64, "
        "GQA 4/2; positions start at 1 and 0",
        positions=[1, 0]))
    cases.append(Case(
        "whisper", "whisper", "WhisperForConditionalGeneration",
        lambda: T("WhisperConfig")(
            vocab_size=VOCAB, num_mel_bins=8, d_model=64, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_source_positions=L, max_target_positions=16,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
            suppress_tokens=None, begin_suppress_tokens=None),
        [Module("encoder_layer0", 0, "model.encoder.layers.0.self_attn", causal=False,
                prefix="model.encoder.layers.0.self_attn."),
         Module("decoder_layer0", 0, "model.decoder.layers.0.self_attn", causal=True),
         Module("decoder_cross0", 0, "model.decoder.layers.0.encoder_attn", causal=False,
                cross=True, prefix="model.decoder.layers.0.encoder_attn.")],
        "Whisper: encoder self-attention (bidirectional), decoder self-attention (causal), "
        "decoder cross-attention over key [N, 5, 64]; k_proj without bias; f32",
        dtype=torch.float32, kind="whisper", direct="whisper"))
    # The same settings in transformers 4.x's config.json keys (rope_theta, rope_scaling,
    # rope_local_base_freq, rotary_pct), as most checkpoints on the Hub still have them;
    # transformers 5 reads them into the same rope_parameters (checked), and the reference is
    # computed from this folder.
    by_name = {c.name: c for c in cases}
    for name, rewrite, what in (
            ("llama3", _v4_flat, "rope_theta + rope_scaling {rope_type: llama3, ...}"),
            ("gemma3", _v4_gemma3, "rope_theta 1e6 + rope_local_base_freq 1e4 + rope_scaling "
                                   "{rope_type: linear, factor: 8}"),
            ("phi3_longrope", _v4_flat, "rope_theta, partial_rotary_factor 0.5 and "
                                        "original_max_position_embeddings top-level + "
                                        "rope_scaling {type: longrope, short/long_factor}"),
            ("gpt_neox", _v4_neox, "rotary_pct 0.25 + rotary_emb_base (Pythia's keys)")):
        c = copy.copy(by_name[name])
        c.name = name + "_v4config"
        c.legacy_config = rewrite
        c.exercises = f"{name} with config.json in transformers 4.x keys: {what}"
        cases.append(c)
    return cases


def _v4_flat(cfg):
    cfg["torch_dtype"] = cfg.pop("dtype")
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    if "partial_rotary_factor" in rp:
        cfg["partial_rotary_factor"] = rp.pop("partial_rotary_factor")
    if rp.get("rope_type") == "longrope":
        rp.pop("rope_type")
        rp["type"] = "longrope"       # Phi-3's checkpoints say "type"
        rp.pop("original_max_position_embeddings", None)  # top-level in Phi-3's configs
    if rp.get("rope_type", rp.get("type")) != "default":
        cfg["rope_scaling"] = rp
    return cfg


def _v4_neox(cfg):
    cfg["torch_dtype"] = cfg.pop("dtype")
    rp = cfg.pop("rope_parameters")
    cfg["rotary_pct"] = rp["partial_rotary_factor"]
    cfg["rotary_emb_base"] = rp["rope_theta"]
    return cfg


def _v4_gemma3(cfg):
    cfg["torch_dtype"] = cfg.pop("dtype")
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp["full_attention"]["rope_theta"]
    cfg["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
    scaling = {k: v for k, v in rp["full_attention"].items() if k != "rope_theta"}
    cfg["rope_scaling"] = scaling
    return cfg


# ---------------------------------------------------------------------------------------------
# model construction


def _randomize(model, gen):
    """Replaces every parameter with O(1)-scaled random values (transformers' own init, std 0.02,
    would make the attention nearly uniform): matrices N(0, 1/fan_in), biases U(-0.5, 0.5), 1-D
    weights (norms) 1 + 0.2 N(0, 1), sinks N(0, 1), embeddings N(0, 1)."""
    conv1d = transformers.pytorch_utils.Conv1D
    fan_in_axis = {}
    for mname, mod in model.named_modules():
        if isinstance(mod, conv1d):
            fan_in_axis[f"{mname}.weight" if mname else "weight"] = 0
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in pname and "wte" not in pname and "wpe" not in pname \
                    and "word_embeddings" not in pname:
                fan_in = p.shape[fan_in_axis.get(pname, 1)]
                v = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
            elif p.dim() == 2:
                v = torch.randn(p.shape, generator=gen)
            elif p.dim() >= 3:
                v = torch.randn(p.shape, generator=gen) * 0.1
            elif pname.endswith("bias"):
                v = torch.rand(p.shape, generator=gen) - 0.5
            elif pname.endswith("sinks"):
                v = torch.randn(p.shape, generator=gen)
            else:
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            p.copy_(v.to(p.dtype))


def _load(case, ckpt):
    cls = T(case.model_class)
    kw = {}
    if case.family in ("mixtral", "gpt_oss"):
        kw["experts_implementation"] = "eager"  # grouped_mm has no float64
    model = cls.from_pretrained(ckpt, dtype=torch.float64, attn_implementation=case.attn, **kw)
    model.eval()
    return model


# ---------------------------------------------------------------------------------------------
# hooks


def _set_arg(module, args, kwargs, name, value):
    if name in kwargs:
        kwargs[name] = value
        return args, kwargs
    params = list(inspect.signature(module.forward).parameters)
    if name not in params:
        raise RuntimeError(f"{type(module).__name__}.forward has no argument {name}")
    i = params.index(name)
    if i >= len(args):
        kwargs[name] = value
        return args, kwargs
    args = list(args)
    args[i] = value
    return tuple(args), kwargs


class Recorder:
    """Installs the substituting pre-hook and the recording hook on each module."""

    def __init__(self, model, modules):
        self.model = model
        self.modules = modules
        self.query = None     # float64 tensor the pre-hooks substitute
        self.key = None
        self.outputs = {m.name: [] for m in modules}
        self.calls = {m.name: 0 for m in modules}
        self.handles = []
        for m in modules:
            target = model.get_submodule(m.path)
            out = model.get_submodule(m.out_path)
            self.handles.append(target.register_forward_pre_hook(self._pre(m), with_kwargs=True))
            self.handles.append(out.register_forward_hook(self._post(m)))

    def _pre(self, m):
        def hook(module, args, kwargs):
            kwargs = dict(kwargs)
            args, kwargs = _set_arg(module, args, kwargs, "hidden_states", self.query)
            if m.cross:
                args, kwargs = _set_arg(module, args, kwargs, "key_value_states", self.key)
            if m.zero_residual:
                args, kwargs = _set_arg(module, args, kwargs, "residual",
                                        torch.zeros_like(self.query))
            self.calls[m.name] += 1
            return args, kwargs
        return hook

    def _post(self, m):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.outputs[m.name].append(out.detach().clone())
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


class Float64Softmax:
    """transformers' eager attention computes softmax in float32 (dtype=torch.float32); while the
    float64 reference runs, softmax of a float64 tensor is computed in float64 instead."""

    def __enter__(self):
        self.orig = torch.nn.functional.softmax

        def softmax(input, dim=None, _stacklevel=3, dtype=None):
            if input.dtype == torch.float64 and dtype in (torch.float32, torch.float16,
                                                          torch.bfloat16):
                dtype = torch.float64
            return self.orig(input, dim=dim, dtype=dtype)

        torch.nn.functional.softmax = softmax
        return self

    def __exit__(self, *exc):
        torch.nn.functional.softmax = self.orig


# ---------------------------------------------------------------------------------------------
# running


def _model_kwargs(case, inputs, t=None):
    """Arguments of one model call: the whole sequence (t None) or step t."""
    sl = slice(None) if t is None else slice(t, t + 1)
    kw = {}
    if case.kind == "whisper":
        kw["decoder_input_ids"] = inputs["ids"][:, sl]
    else:
        kw["input_ids"] = inputs["ids"][:, sl]
    if case.positions is not None:
        kw["position_ids"] = inputs["positions"][:, sl]
    if case.padding:
        kw["attention_mask"] = inputs["attention_mask"]
    return kw


def run_forward(case, ckpt, inputs, modules):
    model = _load(case, ckpt)
    rec = Recorder(model, modules)
    rec.query = inputs["query"].to(torch.float64)
    if "key" in inputs:
        rec.key = inputs["key"].to(torch.float64)
    kw = _model_kwargs(case, inputs)
    with torch.no_grad(), Float64Softmax():
        if case.kind == "whisper":
            model(input_features=inputs["features"], use_cache=False, **kw)
        else:
            model(use_cache=False, **kw)
    rec.remove()
    out = {}
    for m in modules:
        if rec.calls[m.name] != 1 or len(rec.outputs[m.name]) != 1:
            raise RuntimeError(f"{case.name}/{m.name}: hooks ran {rec.calls[m.name]} / "
                               f"{len(rec.outputs[m.name])} times")
        out[m.name] = rec.outputs[m.name][0]
    return out


def run_decode(case, ckpt, inputs, modules):
    """Token by token through the model's own cache; returns {name: [N, L, hidden]}."""
    model = _load(case, ckpt)
    rec = Recorder(model, modules)
    query = inputs["query"].to(torch.float64)
    if case.kind == "whisper":
        cache = EncoderDecoderCache(DynamicCache(config=model.config),
                                    DynamicCache(config=model.config))
        with torch.no_grad():
            enc = model.model.encoder(inputs["features"])
    else:
        cache = DynamicCache(config=model.config)
    with torch.no_grad(), Float64Softmax():
        for t in range(L):
            rec.query = query[:, t:t + 1]
            kw = _model_kwargs(case, inputs, t)
            if case.kind == "whisper":
                model(encoder_outputs=enc, cache=cache, use_cache=True, **kw)
            else:
                model(cache=cache, use_cache=True, **kw)
    rec.remove()
    out = {}
    for m in modules:
        if rec.calls[m.name] != L or len(rec.outputs[m.name]) != L:
            raise RuntimeError(f"{case.name}/{m.name}: decode hooks ran {rec.calls[m.name]} times")
        out[m.name] = torch.cat(rec.outputs[m.name], dim=1)
    return out


# ---------------------------------------------------------------------------------------------
# direct recomputations from the saved tensors (float64), independent of the hooks


def _tensors(ckpt):
    tensors = {}
    for fn in sorted(os.listdir(ckpt)):
        if fn.endswith(".safetensors"):
            tensors.update({k: v.to(torch.float64)
                            for k, v in st_load_file(os.path.join(ckpt, fn)).items()})
    return tensors


def _attend(q, k, v, scale, causal, window=None, bias=None, key_padding=None):
    """q [n, l, H, hd], k/v [n, s, kvH, hd] (head h uses kv head h // (H / kvH)); bias broadcast
    to [n, H, l, s]; key_padding [n, s] nonzero = ignore. Returns [n, l, H * hd]."""
    n, l, H, hd = q.shape
    s = k.shape[1]
    rep = H // k.shape[2]
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    sc = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if bias is not None:
        sc = sc + bias
    i = torch.arange(l)[:, None]
    j = torch.arange(s)[None, :]
    ok = torch.ones(l, s, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window:
        ok &= j > i - window
    ok = ok[None, None].expand(n, H, l, s)
    if key_padding is not None:
        ok = ok & (key_padding == 0)[:, None, None, :]
    sc = sc.masked_fill(~ok, float("-inf"))
    p = torch.exp(sc - sc.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return torch.einsum("bhij,bjhd->bihd", p, v).reshape(n, l, H * hd)


def alibi_slopes(n):
    """The ALiBi paper's get_slopes (non-powers of two: the power below, then every other slope
    of the power above)."""
    def pow2(m):
        start = 2 ** (-2 ** -(math.log2(m) - 3))
        return [start * start ** i for i in range(m)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + pow2(2 * c)[0::2][:n - c]


def direct_llama(case, ckpt, inputs, m):
    """Llama-like q/k/v/o_proj, default RoPE (rotate_half pairs (i, i + hd/2)) with
    transformers' float32 angles, causal (and sliding window) softmax, explicit loops."""
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    tensors = _tensors(ckpt)
    p = f"model.layers.{m.layer}.self_attn."

    def w(name):
        return tensors.get(p + name)

    H = cfg["num_attention_heads"]
    kvH = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    assert rp.get("rope_type", "default") == "default"
    x = inputs["query"].to(torch.float64)
    n, l, _ = x.shape

    def lin(name, v):
        y = v @ w(name + ".weight").T
        b = w(name + ".bias")
        return y if b is None else y + b

    q = lin("q_proj", x).view(n, l, H, hd)
    k = lin("k_proj", x).view(n, l, kvH, hd)
    v = lin("v_proj", x).view(n, l, kvH, hd)
    # transformers' angles: float32 inv_freq and position * inv_freq, float32 cos/sin
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = inputs["positions"] if "positions" in inputs else \
        torch.arange(l, dtype=torch.int64).expand(n, l)
    ang = pos.float()[..., None] * inv_freq            # [n, l, hd/2] f32
    cos = ang.cos().to(torch.float64)[:, :, None, :]
    sin = ang.sin().to(torch.float64)[:, :, None, :]
    half = hd // 2

    def rot(t):  # pair (i, i + hd/2), rotate_half convention
        a, b = t[..., :half], t[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    q, k = rot(q), rot(k)
    window = cfg.get("sliding_window")
    out = torch.zeros(n, l, H, hd, dtype=torch.float64)
    for b in range(n):
        for h in range(H):
            g = h // (H // kvH)
            for i in range(l):
                js = [j for j in range(l) if j <= i and (not window or j > i - window)]
                s = torch.stack([(q[b, i, h] * k[b, j, g]).sum() for j in js]) / math.sqrt(hd)
                pr = torch.exp(s - s.max())
                pr = pr / pr.sum()
                out[b, i, h] = sum(pr[a] * v[b, j, g] for a, j in enumerate(js))
    return lin("o_proj", out.reshape(n, l, H * hd))


def _per_head_fused_alibi(case, ckpt, inputs, m, slope_scale):
    """BLOOM / Falcon-RW: query_key_value rows per head [H, 3, hd], ALiBi m_h * j * slope_scale
    added to the scaled scores, causal, dense."""
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    t = _tensors(ckpt)
    p = f"transformer.h.{m.layer}.self_attention."
    H = cfg.get("n_head") or cfg["num_attention_heads"]
    x = inputs["query"].to(torch.float64)
    n, l, e = x.shape
    hd = e // H
    qkv = (x @ t[p + "query_key_value.weight"].T + t[p + "query_key_value.bias"])
    qkv = qkv.view(n, l, H, 3, hd)
    slopes = torch.tensor(alibi_slopes(H), dtype=torch.float64)
    bias = (slopes[:, None, None] * torch.arange(l, dtype=torch.float64)[None, None, :]
            * slope_scale)[None]
    o = _attend(qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :], hd ** -0.5, True, bias=bias)
    return o @ t[p + "dense.weight"].T + t[p + "dense.bias"]


def direct_bloom(case, ckpt, inputs, m):
    return _per_head_fused_alibi(case, ckpt, inputs, m, 1.0)


def direct_falcon_alibi(case, ckpt, inputs, m):
    return _per_head_fused_alibi(case, ckpt, inputs, m, 16 ** -0.5)   # 1/sqrt(head_dim)


def direct_bert(case, ckpt, inputs, m):
    t = _tensors(ckpt)
    p = f"bert.encoder.layer.{m.layer}.attention."
    x = inputs["query"].to(torch.float64)
    n, l, e = x.shape
    H, hd = 4, e // 4

    def lin(name, v):
        return v @ t[p + name + ".weight"].T + t[p + name + ".bias"]

    o = _attend(lin("self.query", x).view(n, l, H, hd), lin("self.key", x).view(n, l, H, hd),
                lin("self.value", x).view(n, l, H, hd), hd ** -0.5, False,
                key_padding=inputs["key_padding_mask"])
    return lin("output.dense", o)


def direct_whisper(case, ckpt, inputs, m):
    t = _tensors(ckpt)
    p = m.path + "."
    x = inputs["query"].to(torch.float64)
    kv = inputs["key"].to(torch.float64) if m.cross else x
    n, l, e = x.shape
    H, hd = 4, e // 4
    q = (x @ t[p + "q_proj.weight"].T + t[p + "q_proj.bias"]).view(n, l, H, hd)
    k = (kv @ t[p + "k_proj.weight"].T).view(n, kv.shape[1], H, hd)     # k_proj has no bias
    v = (kv @ t[p + "v_proj.weight"].T + t[p + "v_proj.bias"]).view(n, kv.shape[1], H, hd)
    o = _attend(q, k, v, hd ** -0.5, m.causal)
    return o @ t[p + "out_proj.weight"].T + t[p + "out_proj.bias"]


DIRECT = {"llama": direct_llama, "bloom": direct_bloom, "falcon_alibi": direct_falcon_alibi,
          "bert": direct_bert, "whisper": direct_whisper}


# ---------------------------------------------------------------------------------------------


def make_inputs(case, config, gen):
    hidden = getattr(config, "hidden_size", None) or config.d_model
    inputs = {"query": torch.randn(N, L, hidden, generator=gen, dtype=torch.float32)}
    inputs["ids"] = torch.randint(3, VOCAB, (N, L), generator=gen)
    if any(m.cross for m in case.modules):
        inputs["key"] = torch.randn(N, S, hidden, generator=gen, dtype=torch.float32)
    if case.positions is not None:
        inputs["positions"] = torch.stack(
            [torch.arange(L, dtype=torch.int64) + s for s in case.positions])
    if case.padding:
        pad = 2 if case.family == "bert" else 3
        mask = torch.ones(N, L, dtype=torch.int64)
        mask[1, L - pad:] = 0
        inputs["attention_mask"] = mask
        inputs["key_padding_mask"] = (1 - mask).to(torch.uint8)
    if case.kind == "whisper":
        inputs["features"] = torch.randn(N, config.num_mel_bins, 2 * L, generator=gen,
                                         dtype=torch.float64)
    return inputs


def generate(case, out_root):
    seed = zlib.crc32(case.name.encode())
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = case.config()
    model = T(case.model_class)(config)
    model.eval()
    _randomize(model, gen)
    model.to(case.dtype)

    case_dir = os.path.join(out_root, case.name)
    if os.path.isdir(case_dir):
        shutil.rmtree(case_dir)
    ckpt = os.path.join(case_dir, "checkpoint")
    save_kw = {"max_shard_size": case.shard} if case.shard else {}
    model.save_pretrained(ckpt, **save_kw)
    del model
    if case.legacy_config:
        path = os.path.join(ckpt, "config.json")
        cfg = case.legacy_config(json.load(open(path)))
        with open(path, "w") as f:
            f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        loaded = T(case.model_class).config_class.from_pretrained(ckpt)
        def norm(v):  # a legacy "type" key is kept beside the rope_type it became
            if isinstance(v, dict):
                return {k: norm(x) for k, x in v.items() if k != "type"}
            return v
        for key in ("rope_parameters", "layer_types", "sliding_window"):
            if norm(getattr(loaded, key, None)) != norm(getattr(config, key, None)):
                raise RuntimeError(f"{case.name}: {key} reads back as {getattr(loaded, key)}, "
                                   f"not {getattr(config, key)}")

    inputs = make_inputs(case, config, gen)
    fwd = run_forward(case, ckpt, inputs, case.modules)
    causal = [m for m in case.modules if m.causal]
    dec = run_decode(case, ckpt, inputs, causal) if causal else {}

    notes = []
    if case.attn != "eager":
        eager = copy.copy(case)
        eager.attn = "eager"
        e = run_forward(eager, ckpt, inputs, case.modules)
        notes.append("eager-" + case.attn + " " + ", ".join(
            f"{k} {(e[k] - fwd[k]).abs().max().item():.1e}" for k in e))
    expected = {}
    for m in case.modules:
        expected[f"{m.name}.attn_output"] = fwd[m.name].to(torch.float32).numpy()
        if m.name in dec:
            expected[f"{m.name}.decode_output"] = dec[m.name].to(torch.float32).numpy()
            diff = (dec[m.name] - fwd[m.name]).abs().max().item()
            if case.stateless_rope and diff > case.decode_tol:
                raise RuntimeError(f"{case.name}/{m.name}: decode differs from forward by {diff}")
            notes.append(f"{m.name} decode-forward {diff:.1e}")
        if case.direct:
            ref = DIRECT[case.direct](case, ckpt, inputs, m)
            diff = (ref - fwd[m.name]).abs().max().item()
            if diff > 1e-10:
                raise RuntimeError(f"{case.name}/{m.name}: direct recomputation differs by {diff}")
            notes.append(f"{m.name} direct {diff:.1e}")

    stored = {"query": inputs["query"].numpy()}
    if "key" in inputs:
        stored["key"] = inputs["key"].numpy()
    if "positions" in inputs:
        stored["positions"] = inputs["positions"].numpy()
    if "key_padding_mask" in inputs:
        stored["key_padding_mask"] = inputs["key_padding_mask"].numpy()
    safetensors_py.save_file(stored, os.path.join(case_dir, "inputs.safetensors"))
    safetensors_py.save_file(expected, os.path.join(case_dir, "expected.safetensors"))

    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    meta = {
        "family": case.family,
        "model_type": cfg["model_type"],
        "modules": [{"name": m.name, "layer": m.layer, "prefix": m.prefix, "causal": m.causal,
                     "cross": m.cross} for m in case.modules],
        "exercises": case.exercises,
    }
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(dp, fn))
               for dp, _, fns in os.walk(case_dir) for fn in fns)
    mags = max(float(np.abs(v).max()) for v in expected.values())
    print(f"{case.name}: {cfg['model_type']} {str(case.dtype).replace('torch.', '')} "
          f"modules {','.join(m.name for m in case.modules)}; {size} bytes; max|out| {mags:.2f}; "
          + "; ".join(notes), flush=True)
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary folder and compare bytes with --out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cases = build_cases()
    if args.list:
        for c in cases:
            print(f"{c.name}: {c.exercises}")
        return
    if args.only:
        want = args.only.split(",")
        unknown = set(want) - {c.name for c in cases}
        if unknown:
            sys.exit(f"unknown case(s): {', '.join(sorted(unknown))}")
        cases = [c for c in cases if c.name in want]
    out = args.out
    if args.check:
        import filecmp
        import tempfile
        tmp = tempfile.mkdtemp(prefix="hf_fixtures_")
        out = tmp
    os.makedirs(out, exist_ok=True)
    total = 0
    for c in cases:
        total += generate(c, out)
    print(f"{len(cases)} cases, {total} bytes (transformers {transformers.__version__}, "
          f"torch {torch.__version__})")
    if args.check:
        bad = []
        for c in cases:
            a, b = os.path.join(out, c.name), os.path.join(args.out, c.name)
            for dp, _, fns in os.walk(a):
                for fn in fns:
                    fa = os.path.join(dp, fn)
                    fb = os.path.join(b, os.path.relpath(fa, a))
                    if not os.path.isfile(fb) or not filecmp.cmp(fa, fb, shallow=False):
                        bad.append(os.path.relpath(fb, args.out))
            if os.path.isdir(b):
                for dp, _, fns in os.walk(b):
                    for fn in fns:
                        fb = os.path.join(dp, fn)
                        if not os.path.isfile(os.path.join(a, os.path.relpath(fb, b))):
                            bad.append(os.path.relpath(fb, args.out) + " (stale)")
        shutil.rmtree(tmp)
        if bad:
            sys.exit("differ from the regenerated files: " + ", ".join(bad))
        print(f"--check: {args.out} matches")


if __name__ == "__main__":
    main()
