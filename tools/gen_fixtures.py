#!/usr/bin/env python3
"""Generates mha's golden fixtures with PyTorch: tests/data/golden/<case>.safetensors.

Each case builds torch.nn.MultiheadAttention (eval mode, float32, seeded), runs forward on small
random inputs and stores the module's weights (PyTorch's state_dict names), the inputs exactly as
passed to forward, the masks, the expected outputs and metadata strings. mha's documented
semantic differences from PyTorch are applied to the expected values (see tests/data/README.md):
`causal` is passed to PyTorch as an explicit upper-triangular mask but stored only as a flag;
q_dim != embed_dim and the seed's fused-QKV configuration are computed with explicit float64
torch ops; the per-head interleaved packed layout is permuted to PyTorch's order for the module;
fully-masked rows (NaN in PyTorch) get zero attention weights.

Every case is also recomputed by an independent float64 implementation of mha's semantics
(`reference64`, a port of tests/reference/reference_attention.cc to torch ops); the generator
fails if the module's output disagrees with it anywhere outside fully-masked rows.

Deterministic: one thread, a seed per case derived from its name, a byte-stable writer. Run:

    /usr/bin/python3 tools/gen_fixtures.py            # (re)write tests/data/golden/
    /usr/bin/python3 tools/gen_fixtures.py --check    # compare with the files on disk
    /usr/bin/python3 tools/gen_fixtures.py --list     # names and descriptions
"""

import argparse
import dataclasses
import hashlib
import math
import os
import re
import sys
import zlib
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.exit(f"gen_fixtures.py needs torch (run it with /usr/bin/python3): {e}")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "golden")

# The C++ golden test's default tolerances on f32 (atol + rtol * |expected|).
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
NEG_INF = float("-inf")


@dataclasses.dataclass
class Case:
    name: str
    desc: str
    E: int = 8
    H: int = 2
    N: int = 2
    L: int = 4
    S: Optional[int] = None  # None: L
    q_dim: Optional[int] = None  # None: E
    kdim: Optional[int] = None  # None: E (self-attention: q_dim)
    vdim: Optional[int] = None
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    batch_first: bool = True
    batched: bool = True
    self_attention: bool = True
    need_weights: bool = True
    average: bool = True
    causal: bool = False
    attn_mask: Optional[str] = None  # "bool2d", "float2d", "bool3d", "float3d"
    kpm: Optional[str] = None  # "bool", "float"
    mask_neginf: bool = False  # float masks also hold some -inf entries
    full: Optional[str] = None  # a fully-masked pattern, see inject_full_rows
    layout: str = "pytorch"  # or "per_head"
    packed: Optional[bool] = None  # None: packed iff q_dim == kdim == vdim
    weights_bf16: bool = False
    seed_kind: Optional[str] = None  # extra checks/tensors for the seed configurations
    # Attention variants (issue #30; tests/data/README.md "Variant fixtures"). Off by default.
    source: str = ""  # the model convention whose explicit formula gives the expected values
    kv_heads: Optional[int] = None  # grouped-query attention (separate q/k/v weights)
    scale: Optional[float] = None  # None: 1/sqrt(head_dim)
    rope: Optional[str] = None  # "neox" | "gptj"
    rope_theta: float = 10000.0
    rotary_dim: Optional[int] = None  # None: head_dim
    rope_scale: float = 1.0  # linear position interpolation factor
    offsets: Optional[tuple] = None  # explicit positions: offsets[n] + arange(L), stored
    alibi: bool = False
    window: int = 0  # mha's W
    softcap: float = 0.0
    sinks: bool = False
    qk_norm: Optional[str] = None  # "per_head" (Qwen3) | "whole" (OLMo2)
    qk_norm_eps: float = 1e-6
    input_scale: float = 1.0  # multiplies the query values (large logits for softcap)
    store_qkv: bool = False  # also store the per-head q, k, v as attention uses them

    @property
    def variant(self):
        return bool(self.source)

    def __post_init__(self):
        if self.S is None:
            self.S = self.L
        if self.q_dim is None:
            self.q_dim = self.E
        if self.self_attention:
            assert self.kdim is None and self.vdim is None and self.S == self.L, self.name
            self.kdim = self.vdim = self.q_dim
        if self.kdim is None:
            self.kdim = self.E
        if self.vdim is None:
            self.vdim = self.E
        if self.packed is None:
            self.packed = self.q_dim == self.kdim == self.vdim and self.kv_heads is None
        if not self.batched:
            assert self.N == 1, self.name
        assert self.E % self.H == 0, self.name
        assert self.layout in ("pytorch", "per_head")
        assert self.layout == "pytorch" or self.packed, self.name
        if self.q_dim == self.E and self.kdim == self.E and self.vdim == self.E:
            # the module always packs when all dims equal E
            assert self.packed or self.kv_heads is not None, self.name
        if self.kv_heads is not None:
            assert self.H % self.kv_heads == 0 and not self.packed, self.name

    @property
    def module_capable(self):
        return self.q_dim == self.E and self.seed_kind != "fused_qkv" and not self.variant

    @property
    def kvE(self):
        return self.E if self.kv_heads is None else self.kv_heads * (self.E // self.H)


def case_seed(name):
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


# ----------------------------------------------------------------------------------------------
# The cases.


def build_cases():
    cs = []

    def c(name, desc, **kw):
        cs.append(Case(name=name, desc=desc, **kw))

    # Self / cross attention, layouts.
    c("self_basic", "self-attention, batch_first", N=2, L=4)
    c("self_seq_first", "self-attention, batch_first=False", N=2, L=4, batch_first=False)
    c("self_unbatched", "self-attention, unbatched 2-D inputs", N=1, L=5, batched=False)
    c("self_batch3", "self-attention, batch 3", N=3, L=5, E=12, H=3)
    c("cross_l3_s5", "cross-attention L < S", L=3, S=5, self_attention=False)
    c("cross_l6_s2_seq_first", "cross-attention L > S, batch_first=False", L=6, S=2,
      self_attention=False, batch_first=False)
    c("cross_same_len", "cross-attention with distinct key/value tensors, L == S", L=4,
      self_attention=False)
    c("cross_unbatched", "cross-attention, unbatched", N=1, L=2, S=5, batched=False,
      self_attention=False)
    c("cross_batch3_seq_first", "cross-attention, batch 3, batch_first=False", N=3, L=3, S=4,
      self_attention=False, batch_first=False)

    # kdim / vdim / q_dim.
    c("kdim_vdim", "kdim=5, vdim=7 != embed 8", L=3, S=4, kdim=5, vdim=7, self_attention=False)
    c("kdim_vdim_seq_first", "kdim=5, vdim=7, batch_first=False", L=3, S=4, kdim=5, vdim=7,
      self_attention=False, batch_first=False)
    c("kdim_vdim_unbatched", "kdim=3, vdim=10, unbatched", N=1, L=4, S=3, kdim=3, vdim=10,
      batched=False, self_attention=False)
    c("kdim_only", "kdim=6 != embed, vdim == embed (separate projection weights)", L=3, S=5,
      kdim=6, self_attention=False)
    c("vdim_only", "vdim=11 != embed, kdim == embed (separate projection weights)", L=3, S=5,
      vdim=11, self_attention=False)
    c("qdim", "q_dim=5 != embed 8 (not expressible with the module)", L=3, S=4, q_dim=5,
      self_attention=False)
    c("qdim_kdim_vdim", "q_dim=5, kdim=3, vdim=7, embed 8", L=3, S=4, q_dim=5, kdim=3, vdim=7,
      self_attention=False)
    c("qdim_seq_first", "q_dim=10 > embed 8, batch_first=False", L=3, S=2, q_dim=10,
      self_attention=False, batch_first=False)
    c("qdim_unbatched", "q_dim=7, kdim=4, vdim=4, unbatched", N=1, L=3, S=4, q_dim=7, kdim=4,
      vdim=4, batched=False, self_attention=False)
    c("qdim_self_separate", "self-attention q_dim=kdim=vdim=6 != embed 8, separate weights",
      L=4, q_dim=6, packed=False)
    c("qdim_self_packed", "self-attention q_dim=kdim=vdim=12 != embed 8, packed in_proj_weight "
      "[3E, 12]", L=4, q_dim=12)
    c("qdim_masks_causal", "q_dim=6, bool 2-D attn_mask, float key_padding_mask, causal", L=5,
      S=6, q_dim=6, self_attention=False, attn_mask="bool2d", kpm="float", causal=True)

    # Bias variants.
    c("no_bias", "bias=False", L=4)
    c("no_bias_cross_kdim_vdim", "bias=False, kdim=5, vdim=3", L=3, S=4, kdim=5, vdim=3,
      bias=False, self_attention=False)
    c("no_bias_unbatched", "bias=False, unbatched", N=1, L=4, bias=False, batched=False)
    c("add_bias_kv", "add_bias_kv", L=4, add_bias_kv=True)
    c("add_bias_kv_cross_kdim_vdim", "add_bias_kv, kdim=5, vdim=7", L=3, S=5, kdim=5, vdim=7,
      add_bias_kv=True, self_attention=False)
    c("add_bias_kv_seq_first", "add_bias_kv, batch_first=False", L=3, add_bias_kv=True,
      batch_first=False)
    c("add_bias_kv_unbatched", "add_bias_kv, unbatched", N=1, L=3, S=4, add_bias_kv=True,
      batched=False, self_attention=False)
    c("add_zero_attn", "add_zero_attn", L=4, add_zero_attn=True)
    c("add_zero_attn_cross", "add_zero_attn, cross-attention", L=2, S=5, add_zero_attn=True,
      self_attention=False)
    c("add_zero_attn_unbatched", "add_zero_attn, unbatched", N=1, L=4, add_zero_attn=True,
      batched=False)
    c("bias_kv_zero_attn", "add_bias_kv and add_zero_attn", L=4, add_bias_kv=True,
      add_zero_attn=True)
    c("bias_kv_zero_attn_masks", "add_bias_kv + add_zero_attn with bool attn_mask and bool "
      "key_padding_mask (padded with 'not masked' for the appended keys)", L=3, S=5,
      add_bias_kv=True, add_zero_attn=True, attn_mask="bool2d", kpm="bool",
      self_attention=False)
    c("bias_kv_zero_attn_per_head_weights", "add_bias_kv + add_zero_attn, per-head weights",
      L=3, add_bias_kv=True, add_zero_attn=True, average=False)
    c("no_bias_add_bias_kv", "bias=False but add_bias_kv=True", L=3, bias=False,
      add_bias_kv=True)
    c("no_bias_add_zero_attn", "bias=False, add_zero_attn", L=3, bias=False, add_zero_attn=True,
      batch_first=False)

    # Masks.
    c("attn_mask_bool_2d", "bool attn_mask [L, S]", L=4, S=5, attn_mask="bool2d",
      self_attention=False)
    c("attn_mask_float_2d", "float attn_mask [L, S]", L=4, attn_mask="float2d")
    c("attn_mask_bool_3d", "bool attn_mask [N*H, L, S]", L=4, S=3, attn_mask="bool3d",
      self_attention=False)
    c("attn_mask_float_3d", "float attn_mask [N*H, L, S]", N=3, L=3, attn_mask="float3d",
      average=False)
    c("attn_mask_float_neginf", "float attn_mask with some -inf entries", L=5,
      attn_mask="float2d", mask_neginf=True)
    c("attn_mask_bool_2d_seq_first", "bool attn_mask, batch_first=False", L=4, S=6,
      attn_mask="bool2d", batch_first=False, self_attention=False)
    c("attn_mask_bool_unbatched", "bool attn_mask [L, S], unbatched", N=1, L=4, S=5,
      attn_mask="bool2d", batched=False, self_attention=False)
    c("attn_mask_float_3d_unbatched", "float attn_mask [H, L, S], unbatched", N=1, L=3, S=4,
      attn_mask="float3d", batched=False, self_attention=False, average=False)
    c("kpm_bool", "bool key_padding_mask [N, S]", L=4, S=6, kpm="bool", self_attention=False)
    c("kpm_float", "float key_padding_mask [N, S]", L=5, kpm="float")
    c("kpm_float_neginf", "float key_padding_mask with some -inf entries", L=3, S=6,
      kpm="float", mask_neginf=True, self_attention=False)
    c("kpm_bool_seq_first", "bool key_padding_mask, batch_first=False", N=3, L=4, kpm="bool",
      batch_first=False)
    c("kpm_bool_unbatched", "bool key_padding_mask [S], unbatched", N=1, L=3, S=6, kpm="bool",
      batched=False, self_attention=False)
    c("kpm_float_unbatched", "float key_padding_mask [S], unbatched", N=1, L=4, kpm="float",
      batched=False)
    c("masks_bool_bool", "bool attn_mask [L, S] + bool key_padding_mask", L=5, S=6,
      attn_mask="bool2d", kpm="bool", self_attention=False)
    c("masks_float_bool", "float attn_mask [L, S] + bool key_padding_mask", L=4,
      attn_mask="float2d", kpm="bool")
    c("masks_bool_float", "bool attn_mask + float key_padding_mask (added, not OR-ed)", L=4,
      S=5, attn_mask="bool2d", kpm="float", self_attention=False)
    c("masks_float_float", "float attn_mask + float key_padding_mask (both added)", L=4,
      attn_mask="float2d", kpm="float", mask_neginf=True)
    c("masks_bool3d_bool_cross", "bool attn_mask [N*H, L, S] + bool key_padding_mask, L != S",
      N=3, L=3, S=7, attn_mask="bool3d", kpm="bool", self_attention=False, average=False)
    c("masks_float3d_float_unbatched", "float attn_mask [H, L, S] + float key_padding_mask [S],"
      " unbatched", N=1, L=3, S=5, attn_mask="float3d", kpm="float", batched=False,
      self_attention=False)
    c("masks_kdim_vdim", "bool attn_mask + bool key_padding_mask, kdim=4, vdim=9", L=3, S=5,
      kdim=4, vdim=9, attn_mask="bool2d", kpm="bool", self_attention=False)
    c("masks_add_bias_kv", "float attn_mask + bool key_padding_mask + add_bias_kv", L=4,
      attn_mask="float2d", kpm="bool", add_bias_kv=True)
    c("masks_add_zero_attn", "bool attn_mask 3-D + float key_padding_mask + add_zero_attn",
      L=3, S=4, attn_mask="bool3d", kpm="float", add_zero_attn=True, self_attention=False)

    # Causal.
    c("causal_self", "causal self-attention", L=6, causal=True)
    c("causal_seq_first", "causal, batch_first=False", L=5, causal=True, batch_first=False)
    c("causal_unbatched", "causal, unbatched", N=1, L=5, causal=True, batched=False)
    c("causal_cross_l3_s5", "causal cross-attention L < S (key j > query i masked, top-left)",
      L=3, S=5, causal=True, self_attention=False)
    c("causal_cross_l5_s3", "causal cross-attention L > S", L=5, S=3, causal=True,
      self_attention=False)
    c("causal_attn_bool", "causal + bool attn_mask (OR)", L=5, causal=True, attn_mask="bool2d")
    c("causal_attn_float", "causal + float attn_mask", L=5, causal=True, attn_mask="float2d")
    c("causal_attn_bool3d", "causal + bool attn_mask [N*H, L, S] + bool key_padding_mask",
      L=5, causal=True, attn_mask="bool3d", kpm="bool", average=False)
    c("causal_kpm_bool", "causal + bool key_padding_mask", L=6, causal=True, kpm="bool")
    c("causal_kpm_float", "causal + float key_padding_mask", L=4, causal=True, kpm="float")
    c("causal_add_bias_kv", "causal + add_bias_kv (appended key never masked)", L=4,
      causal=True, add_bias_kv=True)
    c("causal_add_zero_attn", "causal + add_zero_attn", L=4, causal=True, add_zero_attn=True,
      average=False)
    c("causal_no_weights", "causal, need_weights=False", L=6, causal=True, need_weights=False)

    # need_weights / average_attn_weights.
    c("weights_per_head", "need_weights, average_attn_weights=False", L=4, average=False)
    c("weights_per_head_cross_seq_first", "per-head weights, cross, batch_first=False", L=3,
      S=5, average=False, self_attention=False, batch_first=False)
    c("weights_per_head_unbatched", "per-head weights [H, L, S], unbatched", N=1, L=3, S=4,
      average=False, batched=False, self_attention=False)
    c("no_weights", "need_weights=False", L=4, need_weights=False)
    c("no_weights_cross", "need_weights=False, cross-attention", L=3, S=5, need_weights=False,
      self_attention=False)
    c("no_weights_unbatched", "need_weights=False, unbatched", N=1, L=4, need_weights=False,
      batched=False)
    c("no_weights_masks", "need_weights=False, float attn_mask + bool key_padding_mask", L=5,
      need_weights=False, attn_mask="float2d", kpm="bool")

    # Odd sizes.
    c("e6_h2", "embed 6, 2 heads (head_dim 3)", E=6, H=2, L=5)
    c("e6_h3", "embed 6, 3 heads (head_dim 2)", E=6, H=3, L=4, S=7, self_attention=False)
    c("e12_h4", "embed 12, 4 heads", E=12, H=4, N=3, L=5)
    c("e4_h4", "embed 4, 4 heads (head_dim 1)", E=4, H=4, L=5, average=False)
    c("e4_h4_masks", "head_dim 1 with bool attn_mask + key_padding_mask", E=4, H=4, L=4, S=6,
      attn_mask="bool2d", kpm="bool", self_attention=False)
    c("e1_h1", "embed 1, 1 head", E=1, H=1, L=3)
    c("e5_h1", "embed 5, single head", E=5, H=1, L=4, S=6, self_attention=False)
    c("e6_h3_kdim_vdim", "embed 6, 3 heads, kdim=5, vdim=2", E=6, H=3, L=3, S=4, kdim=5, vdim=2,
      self_attention=False)
    c("e64_h4", "embed 64, 4 heads, batch 3, seq 12", E=64, H=4, N=3, L=12)
    c("e64_h8_cross_masks", "embed 64, 8 heads, cross L=12 S=7, float attn_mask + bool "
      "key_padding_mask", E=64, H=8, L=12, S=7, attn_mask="float2d", kpm="bool",
      self_attention=False, average=False)
    c("e48_h6_causal", "embed 48, 6 heads, causal, batch_first=False", E=48, H=6, L=11,
      causal=True, batch_first=False)
    c("e32_h2_bias_kv_zero_attn", "embed 32, 2 heads, add_bias_kv + add_zero_attn, kdim=24, "
      "vdim=40", E=32, H=2, L=7, S=9, kdim=24, vdim=40, add_bias_kv=True, add_zero_attn=True,
      self_attention=False)

    # One-token sequences.
    c("one_query", "a single query, 6 keys", L=1, S=6, self_attention=False)
    c("one_key", "5 queries, a single key", L=5, S=1, self_attention=False)
    c("one_token_self", "self-attention over 1 token", L=1, N=3)
    c("one_token_unbatched", "unbatched, 1 query, 1 key", N=1, L=1, batched=False,
      average=False)
    c("one_key_causal", "a single key, causal (every query sees key 0)", L=4, S=1, causal=True,
      self_attention=False)

    # Fully-masked rows (PyTorch: NaN; mha: zero weights, output row = out_proj.bias).
    c("full_row_attn_bool", "bool attn_mask with query row 1 fully masked", L=4, S=5,
      attn_mask="bool2d", full="attn_row", self_attention=False)
    c("full_row_attn_float", "float attn_mask with query row 1 all -inf", L=4,
      attn_mask="float2d", full="attn_row")
    c("full_row_kpm_bool", "bool key_padding_mask masking every key of batch item 1", L=3,
      S=4, kpm="bool", full="kpm_batch", self_attention=False)
    c("full_row_kpm_float", "float key_padding_mask all -inf for batch item 0", L=3,
      kpm="float", full="kpm_batch0", average=False)
    c("full_row_one_head_3d", "bool attn_mask [N*H, L, S]: one head's row fully masked "
      "(output row mixes a zero head with live heads)", L=3, S=4, attn_mask="bool3d",
      full="head_row", self_attention=False, average=False)
    c("full_row_one_head_avg", "float attn_mask [N*H, L, S]: one head's row all -inf, averaged "
      "weights", L=3, attn_mask="float3d", full="head_row")
    c("full_row_causal_kpm", "causal + bool key_padding_mask masking key 0: query 0 sees "
      "nothing", L=4, causal=True, kpm="bool", full="kpm_key0")
    c("full_row_unbatched", "unbatched, bool attn_mask with a fully-masked row", N=1, L=3, S=4,
      attn_mask="bool2d", full="attn_row", batched=False, self_attention=False)
    c("full_row_seq_first_per_head", "batch_first=False, key_padding_mask all set for item 1,"
      " per-head weights", L=3, kpm="bool", full="kpm_batch", batch_first=False, average=False)
    c("full_row_no_weights", "fully-masked rows, need_weights=False", L=4, attn_mask="bool2d",
      kpm="bool", full="attn_row", need_weights=False)
    c("full_row_no_bias", "fully-masked row with bias=False: output row is zero", L=3,
      attn_mask="bool2d", full="attn_row", bias=False)
    c("full_row_kpm_bias_kv", "every real key padded but add_bias_kv keeps one key: no NaN",
      L=3, kpm="bool", full="kpm_batch", add_bias_kv=True)
    c("full_row_attn_zero_attn", "a fully-masked attn_mask row but add_zero_attn keeps one key",
      L=3, attn_mask="bool2d", full="attn_row", add_zero_attn=True, average=False)
    c("full_row_qdim", "q_dim=6 != embed, fully-masked row", L=3, S=4, q_dim=6,
      attn_mask="bool2d", full="attn_row", self_attention=False)

    # Per-head interleaved packed layout.
    c("per_head_self", "per-head interleaved in_proj (q, k, v rows of each head together)",
      L=4, layout="per_head")
    c("per_head_cross", "per-head interleaved in_proj, cross-attention", L=3, S=5,
      layout="per_head", self_attention=False)
    c("per_head_no_bias", "per-head interleaved in_proj, bias=False", E=12, H=3, L=4,
      layout="per_head", bias=False)
    c("per_head_masks_causal", "per-head interleaved, causal + float attn_mask + bool "
      "key_padding_mask", E=12, H=4, L=5, layout="per_head", causal=True, attn_mask="float2d",
      kpm="bool", average=False)
    c("per_head_bias_kv_zero_attn", "per-head interleaved, add_bias_kv + add_zero_attn", L=3,
      layout="per_head", add_bias_kv=True, add_zero_attn=True, batch_first=False)
    c("per_head_unbatched", "per-head interleaved, unbatched", N=1, L=4, layout="per_head",
      batched=False)
    c("per_head_qdim", "per-head interleaved packed in_proj [3E, q_dim], q_dim=12 != embed 8",
      L=4, q_dim=12, layout="per_head")

    # The seeds (/work/shared/seeds).
    c("seed_cross_dims", "seed 000: cross-attention, query dim 4, key dim 3, value dim 2, "
      "embed 6, 2 heads, batch 2, 3 queries, 4 keys, per-head weights", E=6, H=2, N=2, L=3,
      S=4, q_dim=4, kdim=3, vdim=2, self_attention=False, average=False)
    c("seed_self_512", "seed 001: self-attention d_model 512, 8 heads, batch 2, seq 10, with the "
      "per-head projected Q, K, V [N, H, L, 64]", E=512, H=8, N=2, L=10, average=False,
      weights_bf16=True, seed_kind="self_512")
    c("seed_fused_qkv", "seed 002: fused QKV Linear(1024, 3*512) in per-head interleaved "
      "layout, 8 heads, additive float mask [5, 5] (random, -inf above the diagonal), output "
      "projection 512->512; batch reduced from 30 to 4 to keep the file small", E=512, H=8,
      N=4, L=5, q_dim=1024, layout="per_head", attn_mask="float2d", average=False,
      weights_bf16=True, seed_kind="fused_qkv")
    c("seed_unbatched_cross", "seed 003: unbatched cross-attention, 1 query of dim 20, 10 "
      "keys/values of dim 20, 4 heads, per-head weights", E=20, H=4, N=1, L=1, S=10,
      batched=False, self_attention=False, average=False)

    # Attention variants (issue #30): each expected value comes from the named model's formula
    # (variant_formula64) and must equal reference64's literal conventions.
    v = dict(E=16, H=2, N=2, L=6, causal=True, average=False)
    c("rope_neox", "RoPE neox (theta 10000, rd = head_dim 8)", rope="neox", store_qkv=True,
      source="HF Llama rotate_half, emb = cat(freqs, freqs)", **v)
    c("rope_gptj", "RoPE gptj (theta 10000, rd = head_dim 8)", rope="gptj", store_qkv=True,
      source="HF GPT-J rotate_every_two with repeat_interleave(sin/cos, 2)", **v)
    c("rope_partial_neox", "RoPE neox on 4 of 16 components (rotary_pct 0.25), theta 10000",
      E=32, H=2, N=2, L=6, causal=True, rope="neox", rotary_dim=4, store_qkv=True,
      source="HF GPT-NeoX partial rotary: query[..., :rotary_ndims] rotate_half, rest passed")
    c("rope_linear_scale2", "RoPE neox with linear scaling 2 (positions / 2), theta 500000",
      rope="neox", rope_theta=500000.0, rope_scale=2.0,
      source="HF Llama linear scaling: inv_freq / factor", **v)
    c("rope_positions_offset", "RoPE neox at explicit positions 1000.. and 70000.. (stored "
      "`positions` [N, L] int64)", rope="neox", offsets=(1000, 70000), store_qkv=True,
      source="HF Llama rotate_half with position_ids", **v)
    c("alibi_h8", "ALiBi, 8 heads (slopes 2^-1..2^-8), causal", E=16, H=8, N=2, L=7,
      causal=True, alibi=True, average=False,
      source="HF BLOOM build_alibi_tensor (+slope * j; causal)")
    c("alibi_h12", "ALiBi, 12 heads (2^-1..2^-8 then 2^-0.5..2^-3.5), causal", E=24, H=12, N=1,
      L=7, causal=True, alibi=True,
      source="HF BLOOM build_alibi_tensor (+slope * j; causal)")
    c("window_causal", "sliding window W = 3, causal (i - 3 < j <= i)", E=8, H=2, N=2, L=9,
      causal=True, window=3, average=False,
      source="HF masking_utils sliding_window_overlay(3) & causal")
    c("window_bidirectional", "window W = 3 without causal (|i - j| < 3; HF sliding_window 2)",
      E=8, H=2, N=2, L=9, window=3, average=False,
      source="HF masking_utils sliding_window_bidirectional_overlay(2)")
    c("softcap_gemma2", "softcap 50 on scores scaled by query_pre_attn_scalar^-0.5 = 16^-0.5, "
      "query values x6 so that the cap bends the logits", E=16, H=2, N=2, L=6, causal=True,
      softcap=50.0, scale=0.25, input_scale=6.0, average=False,
      source="HF Gemma2 eager: scaling, /softcap, tanh, *softcap, then the mask")
    c("sinks_gptoss", "attention sinks [H] (weights sum to 1 - p_sink)", E=16, H=4, N=2, L=6,
      causal=True, sinks=True, average=False,
      source="HF gpt-oss eager: cat(logits, sinks), - max, softmax, drop the sink column")
    c("qknorm_qwen3", "QK-norm per head ([head_dim] weights, eps 1e-6) then RoPE neox",
      rope="neox", qk_norm="per_head", store_qkv=True,
      source="HF Qwen3: RMSNorm(head_dim) on q_proj(x).view(..., head_dim), then rotary", **v)
    c("qknorm_olmo2", "QK-norm over the whole projection ([E] / [kvE] weights, eps 1e-5) then "
      "RoPE neox, GQA 4/2 heads", E=16, H=4, kv_heads=2, N=2, L=6, causal=True, rope="neox",
      qk_norm="whole", qk_norm_eps=1e-5, store_qkv=True, average=False,
      source="HF OLMo2: RMSNorm(H * head_dim) on q_proj(x) before .view, then rotary")
    c("combo_gptoss", "GQA 4/2 heads + RoPE neox (theta 150000) + window 4 + sinks, causal",
      E=32, H=4, kv_heads=2, N=2, L=9, causal=True, rope="neox", rope_theta=150000.0,
      window=4, sinks=True, average=False,
      source="HF gpt-oss: rotate_half RoPE, repeat_kv, sliding_window, sink softmax")
    c("combo_gemma2", "RoPE neox + softcap 50 (query values x6) + window 4, scale 16^-0.5, "
      "GQA 4/2", E=32, H=4, kv_heads=2, N=2, L=9, causal=True, rope="neox", softcap=50.0,
      scale=0.25, input_scale=6.0, window=4,
      source="HF Gemma2: rotate_half RoPE, softcap, sliding_window")
    return cs


# ----------------------------------------------------------------------------------------------
# Random data.


def uniform(g, shape, bound):
    return (torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1) * bound


def make_params(case, g):
    """PyTorch-ordered parameters (state_dict names), float32."""
    E, qd, kd, vd = case.E, case.q_dim, case.kdim, case.vdim
    p = {}
    if case.packed:
        p["in_proj_weight"] = uniform(g, (3 * E, qd), math.sqrt(3.0 / qd))
    else:
        p["q_proj_weight"] = uniform(g, (E, qd), math.sqrt(3.0 / qd))
        p["k_proj_weight"] = uniform(g, (case.kvE, kd), math.sqrt(3.0 / kd))
        p["v_proj_weight"] = uniform(g, (case.kvE, vd), math.sqrt(3.0 / vd))
    if case.bias:
        p["in_proj_bias"] = uniform(g, (E + 2 * case.kvE,), 0.5)
    if case.add_bias_kv:
        p["bias_k"] = uniform(g, (1, 1, E), 1.0)
        p["bias_v"] = uniform(g, (1, 1, E), 1.0)
    p["out_proj.weight"] = uniform(g, (E, E), math.sqrt(3.0 / E))
    if case.bias:
        p["out_proj.bias"] = uniform(g, (E,), 0.5)
    if case.weights_bf16:
        for k in p:
            if k.endswith("weight"):
                p[k] = torch.from_numpy(safetensors_py.bf16_round(p[k].numpy()))
    return p


def per_head_permutation(E, H):
    """perm[r] = the interleaved row holding PyTorch-ordered row r of in_proj_weight."""
    hd = E // H
    perm = []
    for part in range(3):  # q, k, v
        for h in range(H):
            for d in range(hd):
                perm.append(h * 3 * hd + part * hd + d)
    return torch.tensor(perm, dtype=torch.long)


def to_interleaved(t, E, H):
    perm = per_head_permutation(E, H)
    out = torch.empty_like(t)
    out[perm] = t
    return out


def make_masks(case, g):
    """Returns (attn_mask, key_padding_mask) in batch-first logical form: attn [L, S] or
    [N*H, L, S]; kpm [N, S]. Bool masks are torch.bool, float masks float32."""
    N, H, L, S = case.N, case.H, case.L, case.S
    am = kpm = None
    if case.attn_mask:
        shape = (L, S) if case.attn_mask.endswith("2d") else (N * H, L, S)
        if case.attn_mask.startswith("bool"):
            am = torch.rand(shape, generator=g) < 0.3
        else:
            am = torch.randn(shape, generator=g)
            if case.mask_neginf:
                am = am.masked_fill(torch.rand(shape, generator=g) < 0.25, NEG_INF)
    if case.kpm:
        if case.kpm == "bool":
            kpm = torch.rand((N, S), generator=g) < 0.3
        else:
            kpm = torch.randn((N, S), generator=g)
            if case.mask_neginf:
                kpm = kpm.masked_fill(torch.rand((N, S), generator=g) < 0.25, NEG_INF)
    return am, kpm


def masked_value(t):
    return True if t.dtype == torch.bool else NEG_INF


def inject_full_rows(case, am, kpm):
    """Applies the case's fully-masked pattern to the masks (in place on copies)."""
    if case.full is None:
        return am, kpm
    am = None if am is None else am.clone()
    kpm = None if kpm is None else kpm.clone()
    if case.full == "attn_row":  # query row 1 (or 0 when L == 1) masked for every key
        am[..., min(1, case.L - 1), :] = masked_value(am)
    elif case.full == "head_row":  # 3-D mask: batch 0, head 1 (or 0), query 0
        am[min(1, case.H - 1), 0, :] = masked_value(am)
    elif case.full == "kpm_batch":  # every key of the last batch item
        kpm[-1, :] = masked_value(kpm)
    elif case.full == "kpm_batch0":
        kpm[0, :] = masked_value(kpm)
    elif case.full == "kpm_key0":  # key 0 of batch 0: with causal, query 0 sees nothing
        kpm[0, 0] = masked_value(kpm)
    else:
        raise ValueError(case.full)
    return am, kpm


# ----------------------------------------------------------------------------------------------
# The float64 implementation of mha's semantics (a port of tests/reference/reference_attention.cc).


def split_weights(params, case):
    """(wq, wk, wv, bq, bk, bv) in PyTorch order, float64."""
    E, kvE = case.E, case.kvE
    d = {k: v.double() for k, v in params.items()}
    if "in_proj_weight" in d:
        w = d["in_proj_weight"]
        wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
    else:
        wq, wk, wv = d["q_proj_weight"], d["k_proj_weight"], d["v_proj_weight"]
    if "in_proj_bias" in d:
        b = d["in_proj_bias"]
        bq, bk, bv = b[:E], b[E:E + kvE], b[E + kvE:]
    else:
        bq = bk = bv = None
    return wq, wk, wv, bq, bk, bv


def alibi_paper_slopes(n):
    """get_slopes(n) of the ALiBi paper (ofirpress/attention_with_linear_biases,
    fairseq/models/transformer.py), verbatim."""
    def get_slopes_power_of_2(n):
        start = (2 ** (-2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2) +
            alibi_paper_slopes(2 * closest_power_of_2)[0::2][:n - closest_power_of_2])


def literal_rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last dimension."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def literal_rope(case, x, pos):
    """mha's RoPE convention, written pair by pair: angle_i = p / rope_scale *
    theta^(-2i/rd); neox pairs (i, i + rd/2), gptj (2i, 2i + 1); (a, b) <- (a cos - b sin,
    b cos + a sin). x [N, heads, T, hd], pos [N, T] (int)."""
    hd = x.shape[-1]
    rd = case.rotary_dim or hd
    out = x.clone()
    p = pos.double().unsqueeze(1)  # [N, 1, T]
    for i in range(rd // 2):
        angle = p / case.rope_scale * case.rope_theta ** (-2.0 * i / rd)
        c, s_ = torch.cos(angle), torch.sin(angle)
        ia, ib = (i, i + rd // 2) if case.rope == "neox" else (2 * i, 2 * i + 1)
        a, b = x[..., ia], x[..., ib]
        out[..., ia] = a * c - b * s_
        out[..., ib] = b * c + a * s_
    return out


def reference64(case, params, query, key, value, am, kpm, extras=None, qpos=None, kpos=None):
    """mha semantics in float64. Inputs batch-first [N, L, *] (float32 tensors are promoted),
    masks in the logical form of make_masks. Returns a dict: output [N, L, E], weights
    [N, H, L, St], q [N, H, L, hd], k, v [N, kvH, St, hd], fully [N, H, L] (bool).
    Variant cases also pass `extras` (sinks, q_norm.weight, k_norm.weight: float tensors) and
    the positions qpos [N, L], kpos [N, S]; the variants follow issue #30's "Exact
    conventions" literally (QK-norm, RoPE, scale, softcap, ALiBi, masks and window, softmax with
    the sink)."""
    E, H = case.E, case.H
    hd = E // H
    kvH = case.kvE // hd
    extras = extras or {}
    N, L, S = query.shape[0], query.shape[1], key.shape[1]
    wq, wk, wv, bq, bk, bv = split_weights(params, case)
    q = F.linear(query.double(), wq, bq)
    k = F.linear(key.double(), wk, bk)
    if case.qk_norm == "whole":
        q = literal_rms_norm(q, extras["q_norm.weight"].double(), case.qk_norm_eps)
        k = literal_rms_norm(k, extras["k_norm.weight"].double(), case.qk_norm_eps)
    q = q.view(N, L, H, hd).permute(0, 2, 1, 3)
    k = k.view(N, S, kvH, hd).permute(0, 2, 1, 3)
    v = F.linear(value.double(), wv, bv).view(N, S, kvH, hd).permute(0, 2, 1, 3)
    if case.qk_norm == "per_head":
        q = literal_rms_norm(q, extras["q_norm.weight"].double(), case.qk_norm_eps)
        k = literal_rms_norm(k, extras["k_norm.weight"].double(), case.qk_norm_eps)
    if case.rope:
        q = literal_rope(case, q, qpos)
        k = literal_rope(case, k, kpos)
    add = torch.zeros((N, H, L, S), dtype=torch.float64)
    if am is not None:
        a = am if am.dim() == 2 else am.view(N, H, L, S)
        add = add + (torch.zeros_like(a, dtype=torch.float64).masked_fill(a, NEG_INF)
                     if a.dtype == torch.bool else a.double())
    if kpm is not None:
        m = (torch.zeros_like(kpm, dtype=torch.float64).masked_fill(kpm, NEG_INF)
             if kpm.dtype == torch.bool else kpm.double())
        add = add + m.view(N, 1, 1, S)
    if case.causal:
        tri = torch.triu(torch.ones(L, S, dtype=torch.bool), 1)
        add = add.masked_fill(tri, NEG_INF)
    if case.variant:
        dist = (qpos.view(N, 1, L, 1) - kpos.view(N, 1, 1, S)).abs()  # |p_i - p_j|
        if case.alibi:
            m = torch.tensor(alibi_paper_slopes(H), dtype=torch.float64).view(1, H, 1, 1)
            add = add - m * dist.double()
        if case.window:
            pi, pj = qpos.view(N, 1, L, 1), kpos.view(N, 1, 1, S)
            visible = ((pi - case.window < pj) & (pj <= pi)) if case.causal else \
                (dist < case.window)
            add = add.masked_fill(~visible, NEG_INF)
    extra = []
    if case.add_bias_kv:
        bk_ = params["bias_k"].double().view(1, H, 1, hd).expand(N, H, 1, hd)
        bv_ = params["bias_v"].double().view(1, H, 1, hd).expand(N, H, 1, hd)
        k = torch.cat([k, bk_], dim=2)
        v = torch.cat([v, bv_], dim=2)
        extra.append(1)
    if case.add_zero_attn:
        z = torch.zeros((N, H, 1, hd), dtype=torch.float64)
        k = torch.cat([k, z], dim=2)
        v = torch.cat([v, z], dim=2)
        extra.append(1)
    add = F.pad(add, (0, len(extra)))  # appended keys are never masked
    kr, vr = k, v
    if kvH != H:  # each K/V head serves H / kvH consecutive query heads
        kr = k.repeat_interleave(H // kvH, dim=1)
        vr = v.repeat_interleave(H // kvH, dim=1)
    if case.variant:
        s = torch.matmul(q, kr.transpose(-1, -2)) * (case.scale or 1.0 / math.sqrt(hd))
        if case.softcap:
            s = case.softcap * torch.tanh(s / case.softcap)
        scores = s + add
    else:
        scores = torch.matmul(q, kr.transpose(-1, -2)) / math.sqrt(hd) + add
    mx = scores.amax(dim=-1, keepdim=True)
    fully = torch.isneginf(mx).squeeze(-1)
    sink = None
    if case.sinks:  # one more logit per head, value zero: joins the max and the denominator
        sink = extras["sinks"].double().view(1, H, 1, 1)
        mx = torch.maximum(mx, sink)
    e = torch.where(fully.unsqueeze(-1), torch.zeros_like(scores),
                    torch.exp(scores - torch.where(fully.unsqueeze(-1), 0.0, mx)))
    ssum = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        ssum = ssum + torch.exp(sink - mx)
    w = torch.where(fully.unsqueeze(-1), torch.zeros_like(e), e / torch.where(ssum > 0, ssum, 1.0))
    heads = torch.matmul(w, vr)  # [N, H, L, hd]
    concat = heads.permute(0, 2, 1, 3).reshape(N, L, E)
    bo = params.get("out_proj.bias")
    out = F.linear(concat, params["out_proj.weight"].double(),
                   None if bo is None else bo.double())
    return {"output": out, "weights": w, "q": q, "k": k, "v": v, "fully": fully}


def seed_fused_qkv64(case, in_proj_interleaved, in_proj_bias, out_w, out_b, x, mask):
    """seed 002's intended math, literally, in float64: qkv = Linear(x); reshape to
    [N, L, H, 3*hd]; permute to [N, H, L, 3*hd]; chunk into q, k, v; softmax(qk^T/sqrt(hd) +
    mask) v; heads permuted back and concatenated; output Linear."""
    N, L, _ = x.shape
    H, hd = case.H, case.E // case.H
    qkv = F.linear(x.double(), in_proj_interleaved.double(), in_proj_bias.double())
    qkv = qkv.reshape(N, L, H, 3 * hd).permute(0, 2, 1, 3)
    q, k, v = qkv.chunk(3, dim=-1)
    scaled = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + mask.double()
    att = torch.softmax(scaled, dim=-1)
    vals = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(N, L, H * hd)
    return F.linear(vals, out_w.double(), out_b.double()), att


# ----------------------------------------------------------------------------------------------
# The variants' expected values, from the explicit formulas of the models that define each
# convention (design notes section 1), in float64. Independent of reference64's literal
# pair-by-pair form: generate_variant_case fails unless the two agree to 1e-10.


def hf_inv_freq(case, hd):
    """HF _compute_default_rope_parameters: 1 / base^(arange(0, dim, 2) / dim) with dim the
    rotary dim (Phi's partial_rotary_factor, NeoX's rotary_ndims); linear scaling divides it by
    the factor (_compute_linear_scaling_rope_parameters, = position_ids / factor)."""
    dim = case.rotary_dim or hd
    inv = 1.0 / (case.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    return inv / case.rope_scale


def llama_rotate_half(x):
    """transformers models/llama/modeling_llama.py rotate_half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def neox_rope(x, pos, inv_freq):
    """Llama apply_rotary_pos_emb (emb = cat(freqs, freqs), q*cos + rotate_half(q)*sin) on the
    first rotary_ndims components, the rest passed through (GPT-NeoX partial rotary).
    x [N, heads, T, hd], pos [N, T]."""
    rd = 2 * inv_freq.numel()
    freqs = pos.double()[..., None] * inv_freq  # [N, T, rd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat((x_rot * cos + llama_rotate_half(x_rot) * sin, x_pass), dim=-1)


def gptj_rotate_every_two(x):
    """transformers models/gptj/modeling_gptj.py rotate_every_two."""
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def gptj_rope(x, pos, inv_freq):
    """GPT-J apply_rotary_pos_emb: sin/cos of einsum(pos, inv_freq), repeat_interleave(2), on
    x[..., :rotary_dim]."""
    rd = 2 * inv_freq.numel()
    sinusoid = torch.einsum("nt,j->ntj", pos.double(), inv_freq)
    sin = torch.repeat_interleave(sinusoid.sin(), 2, dim=-1).unsqueeze(1)
    cos = torch.repeat_interleave(sinusoid.cos(), 2, dim=-1).unsqueeze(1)
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat((x_rot * cos + gptj_rotate_every_two(x_rot) * sin, x_pass), dim=-1)


def hf_rms_norm(x, weight, eps):
    """Qwen3RMSNorm / Olmo2RMSNorm: weight * (x * rsqrt(mean(x^2) + eps))."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def bloom_alibi(num_heads, key_positions):
    """transformers models/bloom/modeling_bloom.py build_alibi_tensor: slopes from base
    2^(-8/cp) and extra_base 2^(-4/cp) (odd powers), times the key position:
    alibi[n, h, j] = slope_h * pos_j (added to the scores). key_positions [N, S]."""
    closest_power_of_2 = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest_power_of_2) - 3))), dtype=torch.float64)
    powers = torch.arange(1, 1 + closest_power_of_2, dtype=torch.int32)
    slopes = torch.pow(base, powers)
    if closest_power_of_2 != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest_power_of_2) - 3))),
                                  dtype=torch.float64)
        num_remaining_heads = min(closest_power_of_2, num_heads - closest_power_of_2)
        extra_powers = torch.arange(1, 1 + 2 * num_remaining_heads, 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra_powers)], dim=0)
    return slopes.view(1, num_heads, 1, 1) * key_positions.double().view(
        key_positions.shape[0], 1, 1, -1)


def variant_formula64(case, params, q_bf, k_bf, v_bf, extras, qpos, kpos):
    """The attention forward as the case's source models write it, float64: q/k/v
    projections (nn.Linear), QK-norm (OLMo2 on the whole projection, Qwen3 per head), RoPE
    (Llama rotate_half or GPT-J rotate_every_two), repeat_kv, scores * scaling, Gemma 2's
    softcap, BLOOM's alibi, HF's causal and sliding-window masks, softmax or gpt-oss's sink
    softmax, o_proj. Returns (output [N, L, E], weights [N, H, L, S], q, k, v per head)."""
    E, H = case.E, case.H
    hd = E // H
    kvH = case.kvE // hd
    N, L, S = q_bf.shape[0], q_bf.shape[1], k_bf.shape[1]
    wq, wk, wv, bq, bk, bv = split_weights(params, case)
    q = F.linear(q_bf.double(), wq, bq)
    k = F.linear(k_bf.double(), wk, bk)
    v = F.linear(v_bf.double(), wv, bv)
    if case.qk_norm == "whole":  # OLMo2: q_norm(q_proj(x)) before .view
        q = hf_rms_norm(q, extras["q_norm.weight"].double(), case.qk_norm_eps)
        k = hf_rms_norm(k, extras["k_norm.weight"].double(), case.qk_norm_eps)
    q = q.view(N, L, H, hd).transpose(1, 2)
    k = k.view(N, S, kvH, hd).transpose(1, 2)
    v = v.view(N, S, kvH, hd).transpose(1, 2)
    if case.qk_norm == "per_head":  # Qwen3: q_norm(q_proj(x).view(..., head_dim))
        q = hf_rms_norm(q, extras["q_norm.weight"].double(), case.qk_norm_eps)
        k = hf_rms_norm(k, extras["k_norm.weight"].double(), case.qk_norm_eps)
    if case.rope:
        inv_freq = hf_inv_freq(case, hd)
        rope = neox_rope if case.rope == "neox" else gptj_rope
        q, k = rope(q, qpos, inv_freq), rope(k, kpos, inv_freq)
    n_rep = H // kvH  # repeat_kv
    kr = k[:, :, None].expand(N, kvH, n_rep, S, hd).reshape(N, H, S, hd)
    vr = v[:, :, None].expand(N, kvH, n_rep, S, hd).reshape(N, H, S, hd)
    scaling = case.scale if case.scale is not None else hd ** -0.5
    attn = torch.matmul(q, kr.transpose(2, 3)) * scaling
    if case.softcap:  # Gemma2: /softcap, tanh, *softcap, before the mask
        attn = torch.tanh(attn / case.softcap) * case.softcap
    if case.alibi:  # BLOOM: + slope * key position (causal: softmax drops the row constant)
        assert case.causal, case.name
        attn = attn + bloom_alibi(H, kpos)
    # HF masking_utils: causal_mask_function kv_idx <= q_idx; sliding_window_overlay
    # kv_idx > q_idx - sliding_window; sliding_window_bidirectional_overlay
    # |q_idx - kv_idx| <= sliding_window, whose sliding_window is mha's W - 1.
    q_idx = torch.arange(L).view(L, 1)
    kv_idx = torch.arange(S).view(1, S)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if case.causal:
        allowed &= kv_idx <= q_idx
    if case.window:
        assert case.offsets is None, case.name  # HF's predicates take indices
        if case.causal:
            allowed &= kv_idx > q_idx - case.window
        else:
            allowed &= (q_idx - kv_idx).abs() <= case.window - 1
    attn = attn.masked_fill(~allowed, NEG_INF)
    if case.sinks:  # gpt-oss eager_attention_forward
        sinks = extras["sinks"].double().reshape(1, -1, 1, 1).expand(N, -1, L, -1)
        combined_logits = torch.cat([attn, sinks], dim=-1)
        combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(combined_logits, dim=-1)
        weights = probs[..., :-1]
    else:
        weights = F.softmax(attn, dim=-1)
    out = torch.matmul(weights, vr).transpose(1, 2).reshape(N, L, E)
    bo = params.get("out_proj.bias")
    out = F.linear(out, params["out_proj.weight"].double(), None if bo is None else bo.double())
    return out, weights, q, k, v


def generate_variant_case(case):
    """A variant fixture: weights, inputs (and positions), the extra tensors under their
    state_dict names, expected values from variant_formula64, checked against reference64."""
    seed = case_seed(case.name)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    E, H, N, L, S = case.E, case.H, case.N, case.L, case.S
    hd = E // H
    assert case.batched and case.batch_first and case.packed is not None
    assert not (case.add_bias_kv or case.add_zero_attn or case.attn_mask or case.kpm)
    params = make_params(case, g)
    q_bf = torch.randn((N, L, case.q_dim), generator=g) * case.input_scale
    if case.self_attention:
        k_bf = v_bf = q_bf
    else:
        k_bf = torch.randn((N, S, case.kdim), generator=g)
        v_bf = torch.randn((N, S, case.vdim), generator=g)
    extras = {}
    if case.sinks:
        extras["sinks"] = torch.randn((H,), generator=g)
    if case.qk_norm:
        qn, kn = (E, case.kvE) if case.qk_norm == "whole" else (hd, hd)
        extras["q_norm.weight"] = 0.5 + torch.rand((qn,), generator=g)
        extras["k_norm.weight"] = 0.5 + torch.rand((kn,), generator=g)
    qpos = torch.arange(L, dtype=torch.int64).view(1, L).expand(N, L).contiguous()
    if case.offsets is not None:
        qpos = qpos + torch.tensor(case.offsets, dtype=torch.int64).view(N, 1)
    kpos = qpos if case.self_attention else \
        torch.arange(S, dtype=torch.int64).view(1, S).expand(N, S).contiguous()

    out, weights, fq, fk, fv = variant_formula64(case, params, q_bf, k_bf, v_bf, extras, qpos,
                                                 kpos)
    ref = reference64(case, params, q_bf, k_bf, v_bf, None, None, extras, qpos, kpos)
    assert not ref["fully"].any(), case.name
    for what, a, b in (("output", out, ref["output"]), ("weights", weights, ref["weights"]),
                       ("q", fq, ref["q"]), ("k", fk, ref["k"]), ("v", fv, ref["v"])):
        err = (a - b).abs().max().item()
        if not err <= 1e-10:
            raise AssertionError(f"{case.name}: {what}: the {case.source} formula and "
                                 f"reference64 differ by {err:.3g}")
    notes = []
    if case.rope == "neox" and case.name == "rope_neox":
        # HF's own float32 arithmetic (inv_freq @ positions in f32) at small positions agrees
        # to 1e-5: the layout, not the precision, is what neox pins.
        p32 = {k: v.float() for k, v in params.items()}
        o32, _, _, _, _ = variant_formula64(case, p32, q_bf.float(), k_bf.float(), v_bf.float(),
                                            extras, qpos, kpos)
        err32 = (o32.double() - out).abs().max().item()
        assert err32 <= 1e-5, (case.name, err32)
        notes.append(f"the same formula in float32 differs by {err32:.2g}")

    tensors = {k: v.float().numpy() for k, v in params.items()}
    for k, v in extras.items():
        tensors[k] = v.float().numpy()
    tensors["query"] = q_bf.contiguous().numpy()
    tensors["key"] = k_bf.contiguous().numpy()
    tensors["value"] = v_bf.contiguous().numpy()
    if case.offsets is not None:
        tensors["positions"] = qpos.numpy()
    tensors["attn_output"] = out.float().contiguous().numpy()
    if case.need_weights:
        w = weights.mean(dim=1) if case.average else weights
        tensors["attn_output_weights"] = w.float().contiguous().numpy()
    if case.store_qkv:
        tensors["expected_q"] = fq.float().contiguous().numpy()
        tensors["expected_k"] = fk.float().contiguous().numpy()
        tensors["expected_v"] = fv.float().contiguous().numpy()

    b = lambda x: "1" if x else "0"  # noqa: E731
    meta = {
        "embed_dim": str(E), "num_heads": str(H), "kdim": str(case.kdim), "vdim": str(case.vdim),
        "q_dim": str(case.q_dim), "bias": b(case.bias), "add_bias_kv": "0",
        "add_zero_attn": "0", "batch_first": "1", "need_weights": b(case.need_weights),
        "average_attn_weights": b(case.average), "causal": b(case.causal),
        "qkv_layout": case.layout, "self_attention": b(case.self_attention), "batched": "1",
        "batch_size": str(N), "tgt_len": str(L), "src_len": str(S), "fully_masked_rows": "0",
        "weights_dtype": "F32",
        "variants": "1",
        "num_kv_heads": str(case.kv_heads or H),
        "rope": case.rope or "none",
        "rope_theta": repr(case.rope_theta) if case.rope else "0",
        "rotary_dim": str(case.rotary_dim or 0),
        "rope_scale": repr(case.rope_scale) if case.rope else "0",
        "alibi": b(case.alibi),
        "window": str(case.window),
        "softcap": repr(case.softcap) if case.softcap else "0",
        "qk_norm_eps": repr(case.qk_norm_eps) if case.qk_norm else "0",
        "qk_norm_whole": b(case.qk_norm == "whole"),
        "convention": case.source,
        "expected_source": ("explicit torch float64 formulas of " + case.source +
                            ", cast to float32; equal to reference64 (mha's exact conventions) "
                            "within 1e-10"),
        "max_abs_err_vs_float64": "n/a",
        "seed": str(seed), "generator": f"tools/gen_fixtures.py, torch {torch.__version__}",
        "description": "; ".join([case.desc] + notes),
    }
    if case.scale is not None:
        meta["scale"] = repr(case.scale)
    return tensors, meta


# ----------------------------------------------------------------------------------------------
# One case.


def to_batch_first(case, x):
    if not case.batched:
        return x.unsqueeze(0)
    return x if case.batch_first else x.transpose(0, 1)


def from_batch_first(case, x):
    if not case.batched:
        return x.squeeze(0)
    return x if case.batch_first else x.transpose(0, 1)


def stored_mask(case, am, kpm):
    """The masks as passed to forward (unbatched: no batch dimension)."""
    if not case.batched:
        if kpm is not None:
            kpm = kpm.squeeze(0)
    return am, kpm


def torch_masks(case, am, kpm):
    """The masks PyTorch 1.13 is given to compute mha's semantics: causal becomes an explicit
    upper-triangular mask (OR-ed into a bool mask, -inf into a float one); a float
    key_padding_mask combined with any attn_mask is pre-added into one float [N*H, L, S] mask,
    because PyTorch 1.13 treats a float key_padding_mask as bool when attn_mask is bool and
    rejects it when attn_mask is float. Returns (attn_mask, key_padding_mask, notes)."""
    notes = []
    N, H, L, S = case.N, case.H, case.L, case.S
    if case.causal:
        tri = torch.triu(torch.ones(L, S), 1).bool()
        if am is None:
            am = tri
        elif am.dtype == torch.bool:
            am = am | tri
        else:
            am = am.masked_fill(tri, NEG_INF)
    if kpm is not None and kpm.dtype != torch.bool and am is not None:
        a = am if am.dim() == 3 else am.unsqueeze(0).expand(N * H, L, S)
        if a.dtype == torch.bool:
            a = torch.zeros(a.shape).masked_fill(a, NEG_INF)
        am = a + kpm.view(N, 1, 1, S).expand(N, H, 1, S).reshape(N * H, 1, S)
        kpm = None
        notes.append("PyTorch was given attn_mask and the float key_padding_mask pre-added into "
                     "one float [N*H, L, S] attn_mask (mha adds a float key_padding_mask)")
    if not case.batched and kpm is not None:
        kpm = kpm.squeeze(0)
    return am, kpm, notes


def build_module(case, params_pt):
    m = torch.nn.MultiheadAttention(case.E, case.H, dropout=0.0, bias=case.bias,
                                    add_bias_kv=case.add_bias_kv,
                                    add_zero_attn=case.add_zero_attn,
                                    kdim=case.kdim, vdim=case.vdim,
                                    batch_first=case.batch_first)
    m.eval()
    sd = m.state_dict()
    if sorted(sd.keys()) != sorted(params_pt.keys()):
        raise AssertionError(f"{case.name}: state_dict keys {sorted(sd)} != {sorted(params_pt)}")
    for k in sd:
        if tuple(sd[k].shape) != tuple(params_pt[k].shape):
            raise AssertionError(f"{case.name}: {k} shape {tuple(sd[k].shape)} != "
                                 f"{tuple(params_pt[k].shape)}")
    m.load_state_dict(params_pt)
    return m


def check_close(name, what, got, want, mask_rows=None):
    """Raises unless |got - want| <= atol + rtol |want| (outside mask_rows); returns max err."""
    got = got.double()
    want = want.double()
    if mask_rows is not None:
        got = got[~mask_rows]
        want = want[~mask_rows]
    if got.numel() == 0:
        return 0.0
    both_inf = torch.isinf(got) & torch.isinf(want) & (got == want)
    err = (got - want).abs().masked_fill(both_inf, 0.0)
    if torch.isnan(err).any():
        raise AssertionError(f"{name}: {what}: NaN outside fully-masked rows")
    bad = err > DEFAULT_ATOL * 0.25 + DEFAULT_RTOL * 0.25 * want.abs()
    if bad.any():
        raise AssertionError(f"{name}: {what}: max error {err.max().item():.3g} vs float64")
    return err.max().item()


def generate_case(case):
    if case.variant:
        return generate_variant_case(case)
    seed = case_seed(case.name)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    E, H, N, L, S = case.E, case.H, case.N, case.L, case.S
    notes = []

    params = make_params(case, g)
    # Inputs, batch-first logical form.
    q_bf = torch.randn((N, L, case.q_dim), generator=g)
    if case.self_attention:
        k_bf = v_bf = q_bf
    else:
        k_bf = torch.randn((N, S, case.kdim), generator=g)
        v_bf = torch.randn((N, S, case.vdim), generator=g)
    am, kpm = make_masks(case, g)
    if case.seed_kind == "fused_qkv":
        am = am.masked_fill(torch.triu(torch.ones(L, S), 1).bool(), NEG_INF)
    # Random masks must not fully mask a row unless the case asks for it.
    for _ in range(1000):
        ref = reference64(case, params, q_bf, k_bf, v_bf, am, kpm)
        if not ref["fully"].any():
            break
        am, kpm = make_masks(case, g)
    else:
        raise AssertionError(f"{case.name}: could not draw masks without fully-masked rows")
    am, kpm = inject_full_rows(case, am, kpm)
    ref = reference64(case, params, q_bf, k_bf, v_bf, am, kpm)
    fully = ref["fully"]  # [N, H, L]
    if case.full and not case.add_bias_kv and not case.add_zero_attn:
        assert fully.any(), case.name
    if (case.add_bias_kv or case.add_zero_attn):
        assert not fully.any(), case.name
    row_any = fully.any(dim=1)  # [N, L]

    # Inputs as passed to forward.
    query = from_batch_first(case, q_bf)
    if case.self_attention:
        key = value = query
    else:
        key = from_batch_first(case, k_bf)
        value = from_batch_first(case, v_bf)
    am_file, kpm_file = stored_mask(case, am, kpm)

    # Expected outputs.
    expected_source = ""
    max_err = 0.0  # PyTorch float32 vs the float64 implementation, outside fully-masked rows
    if case.module_capable:
        params_pt = dict(params)
        module = build_module(case, params_pt)
        am_t, kpm_t, mask_notes = torch_masks(case, am, kpm)
        notes += mask_notes
        # Grad stays enabled (the parameters require grad) so PyTorch takes its standard path,
        # never the eval "fast path" (_native_multi_head_attention), which in 1.13 converts a
        # float key_padding_mask to bool instead of adding it.
        with torch.enable_grad():
            out_t, w_t = module(query, key, value, key_padding_mask=kpm_t,
                                need_weights=case.need_weights, attn_mask=am_t,
                                average_attn_weights=case.average)
        out_t = out_t.detach()
        w_t = None if w_t is None else w_t.detach()
        out_bf = to_batch_first(case, out_t)  # [N, L, E]
        ref_out = ref["output"]
        max_err = check_close(case.name, "attn_output", out_bf, ref_out, row_any)
        nan_rows = torch.isnan(out_bf).any(dim=-1)
        if not torch.equal(nan_rows, row_any):
            raise AssertionError(f"{case.name}: PyTorch NaN rows {nan_rows.tolist()} != "
                                 f"fully-masked rows {row_any.tolist()}")
        out_bf = torch.where(row_any.unsqueeze(-1), ref_out.float(), out_bf)
        if case.need_weights:
            w_bf = w_t if case.batched else w_t.unsqueeze(0)
            if case.average:
                ref_w = ref["weights"].mean(dim=1)
                max_err = max(max_err, check_close(case.name, "attn_output_weights", w_bf, ref_w,
                                                   row_any))
                w_bf = torch.where(row_any.unsqueeze(-1), ref_w.float(), w_bf)
            else:
                ref_w = ref["weights"]
                max_err = max(max_err, check_close(case.name, "attn_output_weights", w_bf, ref_w,
                                                   fully))
                w_bf = torch.where(fully.unsqueeze(-1), ref_w.float(), w_bf)
        expected_source = "torch.nn.MultiheadAttention (float32)"
        if case.layout == "per_head":
            notes.append("in_proj_weight/in_proj_bias are stored per-head interleaved; the "
                         "module ran with them permuted to PyTorch's q|k|v order")
    else:
        out_bf = ref["output"].float()
        if case.need_weights:
            w = ref["weights"]
            w_bf = (w.mean(dim=1) if case.average else w).float()
        if case.seed_kind == "fused_qkv":
            out_s, att_s = seed_fused_qkv64(case, to_interleaved(params["in_proj_weight"], E, H),
                                            to_interleaved(params["in_proj_bias"], E, H),
                                            params["out_proj.weight"], params["out_proj.bias"],
                                            q_bf, am)
            assert torch.allclose(out_s, ref["output"], rtol=1e-12, atol=1e-12), case.name
            assert torch.allclose(att_s, ref["weights"], rtol=1e-12, atol=1e-12), case.name
            expected_source = ("explicit torch float64 ops (the seed's math: per-head q, k, v "
                               "chunks of the interleaved QKV, softmax(q k^T / 8 + mask) v, heads "
                               "concatenated, output Linear), cast to float32")
        else:
            # Check F.multi_head_attention_forward really refuses q_dim != embed_dim.
            try:
                wq, wk, wv, *_ = split_weights(params, case)
                F.multi_head_attention_forward(
                    to_batch_first(case, query).transpose(0, 1).float(),
                    k_bf.transpose(0, 1), v_bf.transpose(0, 1), E, H, None,
                    params.get("in_proj_bias"), None, None, False, 0.0,
                    params["out_proj.weight"], params.get("out_proj.bias"), training=False,
                    need_weights=False, use_separate_proj_weight=True,
                    q_proj_weight=wq.float(), k_proj_weight=wk.float(), v_proj_weight=wv.float())
                raise AssertionError("F.multi_head_attention_forward accepted q_dim != E: use it")
            except AssertionError as e:
                if "accepted" in str(e):
                    raise
            expected_source = ("explicit torch float64 ops cast to float32 (torch 1.13's "
                               "F.multi_head_attention_forward asserts query dim == embed_dim)")
    if fully.any():
        notes.append(f"{int(fully.sum())} (batch, head, query) rows are fully masked: PyTorch "
                     "gives NaN there; expected uses mha's semantics (zero attention weights, "
                     "the head contributes zero, so an output row whose every head is masked "
                     "equals out_proj.bias)")
    if case.causal:
        notes.append("causal: PyTorch got triu(ones(L, S), 1) as an explicit mask (OR-ed into "
                     "a bool attn_mask, -inf into a float one); the file stores only the causal "
                     "flag" + (" and the explicit attn_mask" if am is not None else ""))

    # Tensors.
    tensors = {}
    for k, v in params.items():
        if case.layout == "per_head" and k in ("in_proj_weight", "in_proj_bias"):
            v = to_interleaved(v, E, H)
        if case.weights_bf16 and k.endswith("weight"):
            tensors[k] = safetensors_py.bf16_from_f32(v.numpy())
        else:
            tensors[k] = v.float().numpy()
    tensors["query"] = query.contiguous().numpy()
    tensors["key"] = key.contiguous().numpy()
    tensors["value"] = value.contiguous().numpy()
    if am_file is not None:
        tensors["attn_mask"] = am_file.numpy()
        if not case.batched and am_file.dim() == 3:
            assert am_file.shape[0] == H
    if kpm_file is not None:
        tensors["key_padding_mask"] = kpm_file.numpy()
    tensors["attn_output"] = from_batch_first(case, out_bf).contiguous().numpy()
    if case.need_weights:
        tensors["attn_output_weights"] = (w_bf if case.batched else w_bf.squeeze(0)).contiguous() \
            .float().numpy()
    if case.seed_kind == "self_512":
        tensors["expected_q"] = ref["q"].float().contiguous().numpy()
        tensors["expected_k"] = ref["k"].float().contiguous().numpy()
        tensors["expected_v"] = ref["v"].float().contiguous().numpy()
        wq, wk, wv, bq, bk, bv = split_weights(params, case)
        hd = E // H
        for name, w, bb in (("expected_q", wq, bq), ("expected_k", wk, bk), ("expected_v", wv, bv)):
            lit = (q_bf.double() @ w.T + bb).view(N, L, H, hd).permute(0, 2, 1, 3)
            assert torch.allclose(lit.float(), torch.from_numpy(tensors[name]), atol=1e-6)

    b = lambda x: "1" if x else "0"  # noqa: E731
    meta = {
        "embed_dim": str(E), "num_heads": str(H), "kdim": str(case.kdim), "vdim": str(case.vdim),
        "q_dim": str(case.q_dim), "bias": b(case.bias), "add_bias_kv": b(case.add_bias_kv),
        "add_zero_attn": b(case.add_zero_attn), "batch_first": b(case.batch_first),
        "need_weights": b(case.need_weights), "average_attn_weights": b(case.average),
        "causal": b(case.causal), "qkv_layout": case.layout,
        "self_attention": b(case.self_attention), "batched": b(case.batched),
        "batch_size": str(N), "tgt_len": str(L), "src_len": str(S),
        "fully_masked_rows": str(int(fully.sum())),
        "weights_dtype": "BF16" if case.weights_bf16 else "F32",
        "expected_source": expected_source,
        "max_abs_err_vs_float64": f"{max_err:.3g}" if case.module_capable else "n/a",
        "seed": str(seed), "generator": f"tools/gen_fixtures.py, torch {torch.__version__}",
        "description": "; ".join([case.desc] + notes),
    }
    return tensors, meta


# ----------------------------------------------------------------------------------------------
# --verify: recompute every file from its stored tensors and metadata alone, with numpy (an
# implementation independent of the generator's), the way the C++ golden test reads them.


def verify_file(path):
    import numpy as np

    t, m = safetensors_py.load_file(path)
    if m.get("variants") == "1":
        return None  # checked at generation: model formula == reference64
    E, H = int(m["embed_dim"]), int(m["num_heads"])
    hd = E // H
    batched, bf = m["batched"] == "1", m["batch_first"] == "1"

    def bfirst(x):
        x = x.astype(np.float64)
        return x[None] if not batched else (x if bf else x.transpose(1, 0, 2))

    q_in, k_in, v_in = bfirst(t["query"]), bfirst(t["key"]), bfirst(t["value"])
    if m["self_attention"] == "1":
        assert np.array_equal(t["query"], t["key"]) and np.array_equal(t["query"], t["value"])
    N, L, S = q_in.shape[0], q_in.shape[1], k_in.shape[1]
    assert (N, L, S) == (int(m["batch_size"]), int(m["tgt_len"]), int(m["src_len"]))
    assert q_in.shape[2] == int(m["q_dim"]) and k_in.shape[2] == int(m["kdim"])
    assert v_in.shape[2] == int(m["vdim"])

    def deinterleave(x):  # per-head [H][q|k|v][hd] rows -> q, k, v blocks
        x = x.reshape((H, 3, hd) + x.shape[1:])
        return [x[:, i].reshape((E,) + x.shape[3:]) for i in range(3)]

    if "in_proj_weight" in t:
        w = t["in_proj_weight"].astype(np.float64)
        wq, wk, wv = deinterleave(w) if m["qkv_layout"] == "per_head" else np.split(w, 3)
    else:
        assert m["qkv_layout"] == "pytorch"
        wq, wk, wv = (t[n].astype(np.float64) for n in
                      ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    if "in_proj_bias" in t:
        b = t["in_proj_bias"].astype(np.float64)
        bq, bk, bv = deinterleave(b) if m["qkv_layout"] == "per_head" else np.split(b, 3)
    else:
        assert m["bias"] == "0"
        bq = bk = bv = np.zeros(E)
    bo = t["out_proj.bias"].astype(np.float64) if "out_proj.bias" in t else np.zeros(E)
    heads = lambda x: x.reshape(x.shape[0], x.shape[1], H, hd).transpose(0, 2, 1, 3)  # noqa
    q = heads(q_in @ wq.T + bq)
    k = heads(k_in @ wk.T + bk)
    v = heads(v_in @ wv.T + bv)
    if "expected_q" in t:
        for name, x in (("expected_q", q), ("expected_k", k), ("expected_v", v)):
            np.testing.assert_allclose(t[name], x, atol=DEFAULT_ATOL, rtol=DEFAULT_RTOL)
    add = np.zeros((N, H, L, S))
    with np.errstate(invalid="ignore"):
        if "attn_mask" in t:
            a = t["attn_mask"]
            a = a.reshape(N, H, L, S) if a.ndim == 3 else a
            add = add + (np.where(a, -np.inf, 0.0) if a.dtype == bool else a)
        if "key_padding_mask" in t:
            kp = t["key_padding_mask"].reshape(N, 1, 1, S)
            add = add + (np.where(kp, -np.inf, 0.0) if kp.dtype == bool else kp)
        if m["causal"] == "1":
            add = np.where(np.triu(np.ones((L, S), dtype=bool), 1), -np.inf, add)
    if m["add_bias_kv"] == "1":
        k = np.concatenate([k, np.broadcast_to(t["bias_k"].reshape(1, H, 1, hd), (N, H, 1, hd))],
                           axis=2)
        v = np.concatenate([v, np.broadcast_to(t["bias_v"].reshape(1, H, 1, hd), (N, H, 1, hd))],
                           axis=2)
        add = np.concatenate([add, np.zeros((N, H, L, 1))], axis=3)
    if m["add_zero_attn"] == "1":
        k = np.concatenate([k, np.zeros((N, H, 1, hd))], axis=2)
        v = np.concatenate([v, np.zeros((N, H, 1, hd))], axis=2)
        add = np.concatenate([add, np.zeros((N, H, L, 1))], axis=3)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + add
    mx = scores.max(axis=-1, keepdims=True)
    full = np.isneginf(mx)
    e = np.exp(scores - np.where(full, 0.0, mx))
    w = np.where(full, 0.0, e / np.where(full, 1.0, e.sum(axis=-1, keepdims=True)))
    assert int(full.sum()) == int(m["fully_masked_rows"]), path
    out = (w @ v).transpose(0, 2, 1, 3).reshape(N, L, E) @ t["out_proj.weight"].astype(
        np.float64).T + bo
    all_heads = full[..., 0].all(axis=1)  # [N, L]
    if all_heads.any():
        np.testing.assert_array_equal(out[all_heads], np.broadcast_to(bo, out[all_heads].shape))
    atol = float(m.get("atol", DEFAULT_ATOL))
    rtol = float(m.get("rtol", DEFAULT_RTOL))
    got = t["attn_output"].astype(np.float64)
    got = got[None] if not batched else (got if bf else got.transpose(1, 0, 2))
    np.testing.assert_allclose(got, out, atol=atol, rtol=rtol, err_msg=path)
    if all_heads.any():  # stored exactly: out_proj.bias (zero without bias)
        np.testing.assert_array_equal(got[all_heads],
                                      np.broadcast_to(bo, got[all_heads].shape), err_msg=path)
    if m["need_weights"] == "1":
        want = w.mean(axis=1) if m["average_attn_weights"] == "1" else w
        got_w = t["attn_output_weights"]
        got_w = got_w[None] if not batched else got_w
        np.testing.assert_allclose(got_w, want, atol=atol, rtol=rtol, err_msg=path)
    else:
        assert "attn_output_weights" not in t
    for x in t.values():
        assert not (x.dtype != bool and np.isnan(x).any()), path
    return np.abs(got - out).max()


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (%(default)s)")
    ap.add_argument("--only", default=None, help="regex: generate matching cases only")
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory and compare bytes with the files in --out")
    ap.add_argument("--list", action="store_true", help="print case names and exit")
    ap.add_argument("--verify", action="store_true",
                    help="recompute the files in --out from their contents with numpy")
    args = ap.parse_args()
    if args.verify:
        files = sorted(f for f in os.listdir(args.out) if f.endswith(".safetensors"))
        errs = [verify_file(os.path.join(args.out, f)) for f in files]
        worst = max(e for e in errs if e is not None)
        skipped = sum(e is None for e in errs)
        print(f"verified {len(files) - skipped} files ({skipped} variant files skipped); "
              f"max |attn_output - numpy float64| = {worst:.3g}")
        return 0

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cases = build_cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    if args.list:
        for c in cases:
            print(f"{c.name:40s} {c.desc}")
        return 0
    if args.only:
        cases = [c for c in cases if re.search(args.only, c.name)]
    os.makedirs(args.out, exist_ok=True)
    total = 0
    mismatches = []
    for c in cases:
        tensors, meta = generate_case(c)
        data = safetensors_py.serialize(tensors, meta)
        path = os.path.join(args.out, c.name + ".safetensors")
        total += len(data)
        if args.check:
            old = open(path, "rb").read() if os.path.exists(path) else b""
            if old != data:
                mismatches.append(c.name)
        else:
            with open(path, "wb") as f:
                f.write(data)
        print(f"{c.name:40s} {len(data):9d} B  sha256 {hashlib.sha256(data).hexdigest()[:16]}")
    if not args.only and not args.check:
        stale = sorted(set(f for f in os.listdir(args.out) if f.endswith(".safetensors")) -
                       set(n + ".safetensors" for n in names))
        for f in stale:
            os.remove(os.path.join(args.out, f))
            print(f"removed stale {f}")
    print(f"{len(cases)} cases, {total} bytes")
    if mismatches:
        print(f"--check: {len(mismatches)} files differ: {' '.join(mismatches)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
