#!/usr/bin/env python3
"""Times one peer library's multi-head attention on the CPU, for mha-bench --compare.

    build/peers-venv/bin/python tools/peers.py --peer ort --case 1,128,128,512,8,0,0 \
        --data case.safetensors --threads 2 --min-time 0.5 --min-runs 5
    build/peers-venv/bin/python tools/peers.py --peer ort --decode 1,4096,1024,16,4 \
        --data step.safetensors --threads 2 --min-time 0.5 --min-runs 5

mha-bench runs it once per case, thread count and peer, right after timing the same case, with
a safetensors file (--data) holding mha's weights, inputs and output for that case:
in_proj_weight [3E, E], in_proj_bias [3E], out_proj.weight [E, E], out_proj.bias [E] (the
nn.MultiheadAttention state_dict names), query [N, L, E], key and value [N, S, E] (only for
cross-attention, S != L; self-attention uses query), output [N, L, E] (mha's result). --case is
batch,seq,kv_seq,embed,heads,causal,need_weights; inputs are batch-first f32.

Peers (each in its own process, so that one library's thread pool or allocator state never
meets another's):
  torch          torch.nn.MultiheadAttention(E, H, batch_first=True).eval(), need_weights as
                 the case asks; causal as a float -inf attn_mask plus is_causal=True (PyTorch 2's
                 fast path; torch 1.x has no is_causal and gets the mask alone)
  sdpa           F.linear (fused QKV) + F.scaled_dot_product_attention(is_causal=causal) +
                 F.linear
  ort            ONNX Runtime: the com.microsoft Attention contrib op (one fused QKV GEMM,
                 unidirectional=1 for causal) + MatMul/Add out-projection, CPU provider,
                 intra_op_num_threads = threads; self-attention only
  openvino       OpenVINO CPU plugin: MatMul/Add (fused QKV) -> ScaledDotProductAttention(causal)
                 -> MatMul/Add, INFERENCE_PRECISION_HINT f32, INFERENCE_NUM_THREADS = threads
  openvino-bf16  the same with INFERENCE_PRECISION_HINT bf16 (OpenVINO's default on CPUs with
                 bf16 instructions); "precision" reports what the compiled model runs
Torch peers run under torch.inference_mode() with torch.set_num_threads(threads). The first
call's output is compared with mha's (max_abs_err).

--variants "kv_heads=8 rope=neox theta=500000 window=1024 ..." (mha-bench's label of a variant
case; README "Attention variants") adds attention variants; the data file then holds
in_proj_weight [E + 2 kvE, E] and in_proj_bias [E + 2 kvE] (q, k, v rows) and, when the case
has them, sinks [H], q_norm.weight and k_norm.weight [head_dim]. Only ort runs variants:
com.microsoft GroupQueryAttention (always causal) with kv_num_heads, do_rotary (cos/sin caches
of the angles p / rope_scale * theta^(-2i/rd), computed here in float64; rotary_interleaved=1
for gptj), local_window_size, softcap and head_sink. It and every other peer skip a case
with a variant they lack (ALiBi, QK-norm, non-causal; ort: rotary_dim / 2 not a multiple of 8).
ORT's local_window_size is W - 1 in older CPU kernels (i - lws <= j <= i) and W in newer ones
(i - lws < j <= i): probed once per case on a 2-token prompt. Sinks go to GroupQueryAttention's
head_sink input, which older versions lack (the peer then reports its failure).

--decode B,CONTEXT,EMBED,HEADS,KV_HEADS (mha-bench --decode --compare) times one decode step
instead: B entries each add one token to a cache that holds CONTEXT - 1 positions and attend
all CONTEXT of them. The data file holds the layer (q_proj_weight [E, E], k_proj_weight and
v_proj_weight [kvE, E] with kvE = KV_HEADS * head_dim, in_proj_bias [E + 2 kvE] for q, k, v,
out_proj.weight, out_proj.bias), the cached keys and values past_key and past_value
[B, KV_HEADS, CONTEXT - 1, head_dim] (projected, as mha's cache holds them), the token query
[B, 1, E] and mha's output [B, 1, E]. Each peer but openvino allocates a cache of CONTEXT
positions once, fills the first CONTEXT - 1 and writes the step's key and value at position
CONTEXT - 1 on every call (so every call does the same work, as mha's step rewound after each
run):
  ort   ONNX Runtime's com.microsoft GroupQueryAttention, the op its generative decoders use:
        one MatMul + Add for q, k and v (packed into GroupQueryAttention's query input), then
        GroupQueryAttention(num_heads, kv_num_heads) with past_key/past_value [B, KV_HEADS,
        CONTEXT, head_dim] (BNSH) bound through IOBinding to the same OrtValues as its
        present_key/present_value outputs (shared buffer: the op writes the new token in place
        and copies nothing per step), seqlens_k = CONTEXT - 1 per entry (total length - 1) and
        total_sequence_length = CONTEXT, then MatMul + Add; output bound to a preallocated
        buffer; intra_op_num_threads = threads
  sdpa  PyTorch: F.linear (packed q, k, v weights), the new key and value written into a
        preallocated cache tensor, F.scaled_dot_product_attention over it (grouped-query
        layers: enable_gqa=True where torch has it, else repeat_interleave of the cache),
        F.linear
  With --weights i8|i4|i4-128 (mha's quantized storage; the data file holds the dequantized
  weights) ort's two products are com.microsoft MatMulNBits (8 bits in blocks of 128 inputs
  repeating the row's scale, 4 bits in blocks of 32 or 128) on the codes and scales recovered
  from those weights, accuracy_level 0 (f32 activations, as mha); sdpa multiplies the
  dequantized weights in f32.
  ort-int8  the same MatMulNBits with accuracy_level 4 (ONNX Runtime quantizes the activations
        to int8 per block and multiplies integers: its fastest CPU mode); quantized weights
        only; reports precision "int8"
  openvino  the stateful graph OpenVINO's LLM exports run (ReadValue -> Gather(beam_idx) ->
        Concat -> ScaledDotProductAttention, Assign), fused by its CPU plugin into its in-place
        KV-cache attention (KV_CACHE_PRECISION f32), MatMul + Add around it, in
        tools/peers_openvino.py. A call appends a position: the cache is set back untimed
        every WINDOW - 1 calls, so the timed calls attend up to WINDOW - 2 positions fewer than
        CONTEXT (that file's doc). With --weights i8|i4|i4-128 the products are NNCF's
        compressed-weight pattern (i8 [N, K] * row scale, i4 groups of 32 / 128) holding mha's
        codes and scales, on f32 activations (DYNAMIC_QUANTIZATION_GROUP_SIZE 0)
  openvino-int8  the same with the plugin's default dynamic quantization of the activations to
        int8 for its compressed-weight products; quantized weights only; precision "int8"
  ggml  llama.cpp's graph for one token of the layer with flash attention, built from ggml's
        operators on llama-cpp-python's libraries (tools/peers_ggml.py): mul_mat + add for q, k
        and v, the new key and value copied into f32 caches, flash_attn_ext, mul_mat + add, run
        by ggml's CPU backend on `threads` threads. With --weights i8|i4|i4-128 the weights are
        ggml's q8_0 / q4_0 / q4_0 quantized by ggml from the dequantized weights (its products
        quantize the activations to q8_0: precision "int8"), in the CPU_REPACK buffer where ggml
        takes them, as llama.cpp loads a model
The other peers have no decode step here and report themselves unavailable. Timed calls are
the library's Python call as a user makes it, inputs already in the library's tensor type.

glibc's malloc is put in the state a long-running process reaches (fixed mmap threshold of 32
MiB, no trimming; what PyTorch's CPU tuning guide gets with jemalloc or tcmalloc): in a fresh
process, temporaries of a few hundred KiB are mmapped and unmapped on every call until the
first large free raises glibc's dynamic threshold, which made torch's (1, 128, 512, 8) measure
4.6-4.9 ms as the first case of a process and 4.0-4.1 ms after (2 threads). Set
MHA_PEERS_MALLOC=default to measure without it.

Per peer: warm-up calls (at least 3 and ~20% of --min-time: OpenVINO and ONNX Runtime pick and
JIT their kernels in the first calls), then timed calls until both --min-time seconds and
--min-runs calls are reached. Prints one JSON object on stdout:
  {"peer", "version", "precision", "median_ms", "p10_ms", "p90_ms", "runs", "max_abs_err"}
or, when the library cannot be imported or lacks a feature the case needs,
  {"peer", "skipped": "<reason>", "unavailable": true|false}
(unavailable: the peer cannot run any case, so mha-bench stops asking). Exit status 0 in both
cases; 2 for a bad command line.
"""

import argparse
import collections
import json
import os
import sys
import time

PEERS = ("torch", "sdpa", "ort", "ort-int8", "openvino", "openvino-bf16", "openvino-int8",
         "ggml")
DECODE_PEERS = ("ort", "ort-int8", "sdpa", "openvino", "openvino-int8", "ggml")
# What make_peer / make_decode_peer return: the timed call, a call returning the output as a numpy
# array, the library's version, the precision it computes in, a context manager the calls run in
# (or None), and an untimed call made before each timed one (or None).
Peer = collections.namedtuple("Peer", "run run_numpy version precision context between",
                              defaults=(None,))
# --weights of a decode step: (bits, MatMulNBits block) of mha's quantized storage. i8 has one
# scale per row; every 128-input block of a row repeats it (a block must be a power of 2).
QUANTIZED = {"i8": (8, 128), "i4": (4, 32), "i4-128": (4, 128)}


class Skip(Exception):
    """The peer cannot run this case (unavailable=True: nor any other)."""

    def __init__(self, reason, unavailable=False):
        super().__init__(reason)
        self.unavailable = unavailable


def parse_ints(flag, text, names):
    """`text` as len(names) comma-separated integers, else argparse's error naming them."""
    parts = text.split(",")
    if len(parts) != len(names):
        raise argparse.ArgumentTypeError(
            f"{flag} {text!r}: expected {len(names)} comma-separated integers {','.join(names)}")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: not all integers")


def parse_case(text):
    b, s, kv, e, h, causal, nw = parse_ints(
        "--case", text, ["batch", "seq", "kv_seq", "embed", "heads", "causal", "need_weights"])
    if min(b, s, kv, e, h) < 1 or causal not in (0, 1) or nw not in (0, 1):
        raise argparse.ArgumentTypeError(
            f"--case {text!r}: sizes must be >= 1, causal and need_weights 0 or 1")
    if e % h:
        raise argparse.ArgumentTypeError(f"--case {text!r}: embed {e} not divisible by heads {h}")
    return {"batch": b, "seq": s, "kv_seq": kv, "embed": e, "heads": h, "causal": bool(causal),
            "need_weights": bool(nw)}


def parse_decode(text):
    b, ctx, e, h, kvh = parse_ints("--decode", text,
                                   ["batch", "context", "embed", "heads", "kv_heads"])
    if min(b, ctx, e, h, kvh) < 1 or e % h or h % kvh:
        raise argparse.ArgumentTypeError(
            f"--decode {text!r}: sizes must be >= 1, embed divisible by heads, heads by kv_heads")
    return {"batch": b, "context": ctx, "embed": e, "heads": h, "kv_heads": kvh}


def percentile(sorted_values, p):
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    x = (len(sorted_values) - 1) * p / 100.0
    lo = int(x)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (x - lo)


def steady_malloc():
    """glibc mallopt: M_MMAP_THRESHOLD (-3) 32 MiB, M_TRIM_THRESHOLD (-1) 1 GiB. No-op elsewhere."""
    import ctypes
    if os.environ.get("MHA_PEERS_MALLOC") == "default":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)
        libc.mallopt(-1, 1 << 30)
    except (OSError, AttributeError):
        pass


def import_or_skip(name):
    try:
        return __import__(name, fromlist=["_"])
    except Exception as e:  # ImportError, or a broken install raising something else
        raise Skip(f"{name} cannot be imported by {sys.executable} ({type(e).__name__}: {e}); "
                   "tools/dev peers installs it", unavailable=True)


def parse_variants(text):
    """{"kv_heads": 8, "rope": "neox", "window": 1024, "sinks": True, ...} from mha-bench's
    label "kv_heads=8 rope=neox window=1024 sinks"."""
    known_int = {"kv_heads", "rotary_dim", "window"}
    known_float = {"theta", "rope_scale", "softcap", "eps"}
    known_flag = {"alibi", "sinks", "qk_norm"}
    out = {}
    for item in text.split():
        name, _, value = item.partition("=")
        try:
            if name in known_int and value:
                out[name] = int(value)
            elif name in known_float and value:
                out[name] = float(value)
            elif name == "rope" and value in ("neox", "gptj"):
                out[name] = value
            elif name in known_flag and not value:
                out[name] = True
            else:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"--variants {text!r}: unknown item {item!r}")
    return out


def no_variants(case, peer):
    """Peers without attention variants run only the plain cases."""
    if case.get("variants"):
        raise Skip(f"{peer} has no attention variants here ({case['variants_text']})")


def self_attention_only(case, peer):
    if case["kv_seq"] != case["seq"]:
        raise Skip(f"{peer} runs self-attention only here, the case has kv_seq "
                   f"{case['kv_seq']} != seq {case['seq']}")


def no_weights(case, peer):
    if case["need_weights"]:
        raise Skip(f"{peer} does not return attention weights (need_weights)")


# ---- peers: each returns (run, version, precision); run() returns the output as numpy ---------

def torch_peer(case, data, threads, fused):
    no_variants(case, "sdpa" if fused else "torch")
    torch = import_or_skip("torch")
    F = torch.nn.functional
    name = "sdpa" if fused else "torch"
    major = int(torch.__version__.split(".")[0])
    if fused:
        no_weights(case, name)
        if not hasattr(F, "scaled_dot_product_attention"):
            raise Skip(f"torch {torch.__version__} has no F.scaled_dot_product_attention",
                       unavailable=True)
    torch.set_num_threads(threads)
    t = {k: torch.from_numpy(v) for k, v in data.items()}
    b, l, s, e, h = case["batch"], case["seq"], case["kv_seq"], case["embed"], case["heads"]
    x = t["query"]
    key = t.get("key", x)
    value = t.get("value", x)
    causal = case["causal"]
    if fused:
        w, bias, wo, bo = (t["in_proj_weight"], t["in_proj_bias"], t["out_proj.weight"],
                           t["out_proj.bias"])
        d = e // h

        def heads(y, n):  # [B, n, E] -> [B, H, n, D]
            return y.view(b, n, h, d).transpose(1, 2)

        def run():
            if s == l:
                q, k, v = F.linear(x, w, bias).chunk(3, dim=-1)
            else:
                q = F.linear(x, w[:e], bias[:e])
                k = F.linear(key, w[e:2 * e], bias[e:2 * e])
                v = F.linear(value, w[2 * e:], bias[2 * e:])
            o = F.scaled_dot_product_attention(heads(q, l), heads(k, s), heads(v, s),
                                               is_causal=causal)
            return F.linear(o.transpose(1, 2).reshape(b, l, e), wo, bo)
    else:
        module = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
        module.load_state_dict({k: t[k] for k in ("in_proj_weight", "in_proj_bias",
                                                  "out_proj.weight", "out_proj.bias")})
        kwargs = {"need_weights": case["need_weights"]}
        if causal:
            kwargs["attn_mask"] = torch.triu(torch.full((l, s), float("-inf")), diagonal=1)
            if major >= 2:
                kwargs["is_causal"] = True
        if s == l:
            key = value = x  # one tensor: the fast path's self-attention test is identity

        def run():
            return module(x, key, value, **kwargs)[0]

    def run_numpy():
        with torch.inference_mode():
            return run().numpy()

    # The timed call stays inside one inference_mode block (see time_peer's `context`).
    return run, run_numpy, torch.__version__, "f32", torch.inference_mode


def ort_session(ort, helper, graph, threads):
    """An ONNX Runtime CPU session of `graph` (opset 17 plus the com.microsoft contrib ops) on
    `threads` intra-op threads, every graph optimization on."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_window_offset(ort, helper, TensorProto, np):
    """W - local_window_size for this ONNX Runtime's GroupQueryAttention: 1 where it keeps
    local_window_size + 1 keys (i - lws <= j <= i, older CPU kernels), 0 where it keeps
    local_window_size (i - lws < j <= i, newer ones). Probed on a 2-token prompt with lws = 1
    and equal scores: the second query averages both values (0.5) or sees only its own (0)."""
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"],
                            ["o", "pk", "pv"], domain="com.microsoft", num_heads=1,
                            kv_num_heads=1, local_window_size=1)
    graph = helper.make_graph(
        [node], "window_probe",
        [helper.make_tensor_value_info(n, f32, [1, 2, 8]) for n in ("q", "k", "v")] +
        [helper.make_tensor_value_info("seqlens_k", i32, [1]),
         helper.make_tensor_value_info("total", i32, [1])],
        [helper.make_tensor_value_info("o", f32, [1, 2, 8])])
    session = ort_session(ort, helper, graph, 1)
    zeros = np.zeros((1, 2, 8), np.float32)  # head_size 8: the op needs a multiple of 8
    values = np.zeros((1, 2, 8), np.float32)
    values[0, 0] = 1.0  # key 0 carries 1, key 1 carries 0
    out = session.run(["o"], {"q": zeros, "k": zeros, "v": values,
                              "seqlens_k": np.array([1], np.int32),
                              "total": np.array([2], np.int32)})[0]
    return 1 if out[0, 1, 0] > 0.25 else 0  # equal weights over both keys: 0.5


def ort_gqa_peer(case, data, threads):
    """A variant case through com.microsoft GroupQueryAttention (prompt mode: no past)."""
    v = case["variants"]
    lacking = [name for name in ("alibi", "qk_norm") if v.get(name)]
    if not case["causal"]:
        lacking.append("non-causal attention (GroupQueryAttention is causal)")
    d = case["embed"] // case["heads"]
    if "rope" in v and (v.get("rotary_dim", d) // 2) % 8 != 0:
        lacking.append("rotary_dim / 2 not a multiple of 8 (its cos/sin cache rule)")
    if lacking:
        raise Skip("ort (GroupQueryAttention) has no " + ", ".join(lacking))
    no_weights(case, "ort")
    self_attention_only(case, "ort (GroupQueryAttention)")
    ort = import_or_skip("onnxruntime")
    onnx = import_or_skip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    b, l, e, h = case["batch"], case["seq"], case["embed"], case["heads"]
    kvh = v.get("kv_heads", h)
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(data["in_proj_weight"].T), "qkv_w"),
        numpy_helper.from_array(data["in_proj_bias"], "qkv_b"),
        numpy_helper.from_array(np.ascontiguousarray(data["out_proj.weight"].T), "out_w"),
        numpy_helper.from_array(data["out_proj.bias"], "out_b"),
    ]
    attrs = {"num_heads": h, "kv_num_heads": kvh}
    gqa_inputs = ["qkv", "", "", "", "", "seqlens_k", "total_sequence_length"]
    if "rope" in v:
        rd = v.get("rotary_dim", d)
        inv = v.get("theta", 10000.0) ** (-2.0 * np.arange(rd // 2) / rd)
        angles = (np.arange(l, dtype=np.float64) / v.get("rope_scale", 1.0))[:, None] * inv
        inits += [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos_cache"),
                  numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin_cache")]
        gqa_inputs += ["cos_cache", "sin_cache"]
        attrs.update(do_rotary=1, rotary_interleaved=1 if v["rope"] == "gptj" else 0)
    if "window" in v:
        attrs["local_window_size"] = v["window"] - ort_window_offset(ort, helper, TensorProto, np)
    if "softcap" in v:
        attrs["softcap"] = v["softcap"]
    if v.get("sinks"):
        # head_sink [H], GroupQueryAttention's 12th input (gpt-oss sinks; newer ONNX Runtime).
        while len(gqa_inputs) < 11:
            gqa_inputs.append("")
        gqa_inputs.append("head_sink")
        inits.append(numpy_helper.from_array(data["sinks"], "head_sink"))
    nodes = [
        helper.make_node("MatMul", ["x", "qkv_w"], ["qkv_raw"]),
        helper.make_node("Add", ["qkv_raw", "qkv_b"], ["qkv"]),
        helper.make_node("GroupQueryAttention", gqa_inputs,
                         ["attn", "present_key", "present_value"], domain="com.microsoft",
                         **attrs),
        helper.make_node("MatMul", ["attn", "out_w"], ["proj"]),
        helper.make_node("Add", ["proj", "out_b"], ["y"]),
    ]
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    graph = helper.make_graph(
        nodes, "mha_gqa_peer",
        [helper.make_tensor_value_info("x", f32, [b, l, e]),
         helper.make_tensor_value_info("seqlens_k", i32, [b]),
         helper.make_tensor_value_info("total_sequence_length", i32, [1])],
        [helper.make_tensor_value_info("y", f32, [b, l, e])], initializer=inits)
    session = ort_session(ort, helper, graph, threads)
    # Prompt mode: seqlens_k = total length - 1 per entry.
    feed = {"x": data["query"], "seqlens_k": np.full(b, l - 1, np.int32),
            "total_sequence_length": np.array([l], np.int32)}

    def run():
        return session.run(["y"], feed)[0]

    return run, run, f"{ort.__version__} (onnx {onnx.__version__})", "f32", None


def ort_peer(case, data, threads):
    if case.get("variants"):
        return ort_gqa_peer(case, data, threads)
    no_weights(case, "ort")
    self_attention_only(case, "ort (com.microsoft Attention)")
    ort = import_or_skip("onnxruntime")
    onnx = import_or_skip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    e, h = case["embed"], case["heads"]
    inits = [
        # Attention computes input @ weights: [E, 3E], columns Q | K | V.
        numpy_helper.from_array(np.ascontiguousarray(data["in_proj_weight"].T), "qkv_w"),
        numpy_helper.from_array(data["in_proj_bias"], "qkv_b"),
        numpy_helper.from_array(np.ascontiguousarray(data["out_proj.weight"].T), "out_w"),
        numpy_helper.from_array(data["out_proj.bias"], "out_b"),
    ]
    nodes = [
        helper.make_node("Attention", ["x", "qkv_w", "qkv_b"], ["attn"], domain="com.microsoft",
                         num_heads=h, unidirectional=1 if case["causal"] else 0),
        helper.make_node("MatMul", ["attn", "out_w"], ["proj"]),
        helper.make_node("Add", ["proj", "out_b"], ["y"]),
    ]
    dims = ["batch", "seq", e]
    graph = helper.make_graph(
        nodes, "mha_peer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], initializer=inits)
    session = ort_session(ort, helper, graph, threads)
    feed = {"x": data["query"]}

    def run():
        return session.run(None, feed)[0]

    return run, run, f"{ort.__version__} (onnx {onnx.__version__})", "f32", None


def openvino_peer(case, data, threads, precision):
    no_variants(case, "openvino")
    name = "openvino" if precision == "f32" else "openvino-bf16"
    no_weights(case, name)
    ov = import_or_skip("openvino")
    ops = import_or_skip("openvino.opset13")
    import numpy as np
    b, l, s, e, h = case["batch"], case["seq"], case["kv_seq"], case["embed"], case["heads"]
    d = e // h
    x = ops.parameter([b, l, e], np.float32, name="query")
    params = [x]

    def linear(inp, w, bias):
        return ops.add(ops.matmul(inp, ops.constant(w), False, True), ops.constant(bias))

    def heads(y, n):  # [B, n, E] -> [B, H, n, D]
        y = ops.reshape(y, ops.constant(np.array([b, n, h, d], np.int64)), False)
        return ops.transpose(y, ops.constant(np.array([0, 2, 1, 3], np.int64)))

    w, bias = data["in_proj_weight"], data["in_proj_bias"]
    if s == l:
        q, k, v = ops.split(linear(x, w, bias), ops.constant(np.int64(-1)), 3).outputs()
    else:
        mem_k = ops.parameter([b, s, e], np.float32, name="key")
        mem_v = ops.parameter([b, s, e], np.float32, name="value")
        params += [mem_k, mem_v]
        q = linear(x, w[:e], bias[:e])
        k = linear(mem_k, w[e:2 * e], bias[e:2 * e])
        v = linear(mem_v, w[2 * e:], bias[2 * e:])
    attn = ops.scaled_dot_product_attention(heads(q, l), heads(k, s), heads(v, s),
                                            causal=case["causal"])
    attn = ops.reshape(ops.transpose(attn, ops.constant(np.array([0, 2, 1, 3], np.int64))),
                       ops.constant(np.array([b, l, e], np.int64)), False)
    y = linear(attn, data["out_proj.weight"], data["out_proj.bias"])
    model = ov.Model([y], params, "mha_peer")
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                      "INFERENCE_NUM_THREADS": threads})
    actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "f32", "bf16"
    request = compiled.create_infer_request()
    inputs = [data["query"]] + ([data["key"], data["value"]] if s != l else [])
    for i, a in enumerate(inputs):
        request.set_input_tensor(i, ov.Tensor(np.ascontiguousarray(a)))

    def run():
        request.infer()
        return request.get_output_tensor(0).data

    # "2026.4.1-22982-<commit>-releases/2026/4": the release is the part before the build.
    return run, run, ov.get_version().split("-")[0], actual, None


# ---- decode peers: the same (run, run_numpy, version, precision, context) ----------------------

def packed_qkv_weight(data):
    """The q, k and v projections as one [E + 2 kvE, E] matrix (nn.Linear layout)."""
    import numpy as np
    return np.concatenate([data["q_proj_weight"], data["k_proj_weight"], data["v_proj_weight"]])


def decode_cache(data, case):
    """Key and value caches [B, kv_heads, context, head_dim]: the first context - 1 positions
    from the data file, the last one for the step's own token."""
    import numpy as np
    b, ctx, kvh = case["batch"], case["context"], case["kv_heads"]
    d = case["embed"] // case["heads"]
    caches = []
    for name in ("past_key", "past_value"):
        c = np.zeros((b, kvh, ctx, d), np.float32)
        c[:, :, :ctx - 1] = data[name]
        caches.append(c)
    return caches


def weight_codes(w, weights):
    """The codes and scales mha quantized w [N, K] (its dequantized weights, nn.Linear layout)
    from, recovered: groups of G inputs (QUANTIZED's block), scale max |w| / 127 per row (i8;
    every group of a row repeats it) or / 7 per group (i4), codes rint(w / scale). Returns codes
    [N, K / G, G] (int32, -127..127 or -7..7) and scales [N, K / G] (f32)."""
    import numpy as np
    bits, block = QUANTIZED[weights]
    n, k = w.shape
    if k % block:
        raise Skip(f"the peers' quantized weights need inputs ({k}) a multiple of {block}")
    qmax = 2 ** (bits - 1) - 1
    blocks = w.reshape(n, k // block, block)
    group = np.abs(w).max(1)[:, None] if bits == 8 else np.abs(blocks).max(2)
    scale = (group / qmax).astype(np.float32)
    scale[scale == 0] = 1
    if bits == 8:
        scale = np.repeat(scale, k // block, axis=1)
    return np.rint(blocks / scale[..., None]).astype(np.int32), scale


def pack_nibbles(values):
    """4-bit values (uint8, 0..15) two per byte along the last axis: element 2i in the low
    nibble, 2i + 1 in the high one, the order MatMulNBits and OpenVINO's i4 constants read."""
    import numpy as np
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def matmul_nbits(w, weights, accuracy_level, name, x, y, helper, numpy_helper):
    """com.microsoft MatMulNBits y = x w^T for w [N, K] holding mha's dequantized weights: its
    codes and scales (weight_codes) stored with ORT's default zero point 2^(bits-1), so ORT
    multiplies the values mha multiplies. Returns (node, initializers)."""
    import numpy as np
    bits, block = QUANTIZED[weights]
    n, k = w.shape
    codes, scale = weight_codes(w, weights)
    packed = (codes + 2 ** (bits - 1)).astype(np.uint8)
    if bits == 4:
        packed = pack_nibbles(packed)
    inits = [numpy_helper.from_array(packed, name + "_q"),
             numpy_helper.from_array(scale.reshape(-1), name + "_scales")]
    node = helper.make_node("MatMulNBits", [x, name + "_q", name + "_scales"], [y],
                            domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                            accuracy_level=accuracy_level)
    return node, inits


def ort_decode_peer(case, data, threads, weights, int8_activations):
    ort = import_or_skip("onnxruntime")
    onnx = import_or_skip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    b, ctx, e, h, kvh = (case[k] for k in ("batch", "context", "embed", "heads", "kv_heads"))
    d = e // h
    if int8_activations and weights not in QUANTIZED:
        raise Skip("ort-int8 runs MatMulNBits on int8 activations: it needs quantized weights "
                   "(--weights-dtype i8, i4 or i4-128)", unavailable=True)
    inits = [
        numpy_helper.from_array(data["in_proj_bias"], "qkv_b"),
        numpy_helper.from_array(data["out_proj.bias"], "out_b"),
    ]
    products = []
    for w, name, x, y in ((packed_qkv_weight(data), "qkv_w", "x", "qkv_raw"),
                          (data["out_proj.weight"], "out_w", "attn", "proj")):
        if weights in QUANTIZED:
            node, more = matmul_nbits(w, weights, 4 if int8_activations else 0, name, x, y,
                                      helper, numpy_helper)
            inits += more
        else:
            node = helper.make_node("MatMul", [x, name], [y])
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), name))
        products.append(node)
    nodes = [
        products[0],
        helper.make_node("Add", ["qkv_raw", "qkv_b"], ["qkv"]),
        # Packed q|k|v in `query`, key and value omitted.
        helper.make_node("GroupQueryAttention",
                         ["qkv", "", "", "past_key", "past_value", "seqlens_k",
                          "total_sequence_length"],
                         ["attn", "present_key", "present_value"], domain="com.microsoft",
                         num_heads=h, kv_num_heads=kvh),
        products[1],
        helper.make_node("Add", ["proj", "out_b"], ["y"]),
    ]
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    cache = [b, kvh, ctx, d]
    graph = helper.make_graph(
        nodes, "mha_decode_peer",
        [helper.make_tensor_value_info("x", f32, [b, 1, e]),
         helper.make_tensor_value_info("past_key", f32, cache),
         helper.make_tensor_value_info("past_value", f32, cache),
         helper.make_tensor_value_info("seqlens_k", i32, [b]),
         helper.make_tensor_value_info("total_sequence_length", i32, [1])],
        [helper.make_tensor_value_info("y", f32, [b, 1, e]),
         helper.make_tensor_value_info("present_key", f32, cache),
         helper.make_tensor_value_info("present_value", f32, cache)],
        initializer=inits)
    session = ort_session(ort, helper, graph, threads)
    k_cache, v_cache = decode_cache(data, case)
    value = ort.OrtValue.ortvalue_from_numpy
    keys, values = value(k_cache), value(v_cache)
    y = value(np.zeros((b, 1, e), np.float32))
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", value(np.ascontiguousarray(data["query"])))
    # past and present share one buffer: GroupQueryAttention writes the new token in place.
    binding.bind_ortvalue_input("past_key", keys)
    binding.bind_ortvalue_output("present_key", keys)
    binding.bind_ortvalue_input("past_value", values)
    binding.bind_ortvalue_output("present_value", values)
    binding.bind_ortvalue_input("seqlens_k", value(np.full(b, ctx - 1, np.int32)))
    binding.bind_ortvalue_input("total_sequence_length", value(np.array([ctx], np.int32)))
    binding.bind_ortvalue_output("y", y)

    def run():
        session.run_with_iobinding(binding)

    def run_numpy():
        run()
        return y.numpy()

    precision = "int8" if int8_activations else "f32"
    return run, run_numpy, f"{ort.__version__} (onnx {onnx.__version__})", precision, None


def sdpa_decode_peer(case, data, threads):
    torch = import_or_skip("torch")
    F = torch.nn.functional
    if not hasattr(F, "scaled_dot_product_attention"):
        raise Skip(f"torch {torch.__version__} has no F.scaled_dot_product_attention",
                   unavailable=True)
    torch.set_num_threads(threads)
    b, ctx, e, h, kvh = (case[k] for k in ("batch", "context", "embed", "heads", "kv_heads"))
    d, kve, group = e // h, kvh * (e // h), h // kvh
    w = torch.from_numpy(packed_qkv_weight(data))
    bias, wo, bo = (torch.from_numpy(data[k]) for k in ("in_proj_bias", "out_proj.weight",
                                                         "out_proj.bias"))
    x = torch.from_numpy(data["query"])
    k_cache, v_cache = (torch.from_numpy(c) for c in decode_cache(data, case))
    pos = ctx - 1
    enable_gqa = False
    if group > 1:
        try:  # torch >= 2.5
            F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8),
                                           torch.zeros(1, 1, 1, 8), enable_gqa=True)
            enable_gqa = True
        except TypeError:
            pass

    def attend(q):
        if group == 1:
            return F.scaled_dot_product_attention(q, k_cache, v_cache)
        if enable_gqa:
            return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k_cache.repeat_interleave(group, 1),
                                              v_cache.repeat_interleave(group, 1))

    def run():
        q, k, v = F.linear(x, w, bias).split([e, kve, kve], dim=-1)
        k_cache[:, :, pos] = k.view(b, kvh, d)
        v_cache[:, :, pos] = v.view(b, kvh, d)
        o = attend(q.view(b, 1, h, d).transpose(1, 2))
        return F.linear(o.transpose(1, 2).reshape(b, 1, e), wo, bo)

    def run_numpy():
        with torch.inference_mode():
            return run().numpy()

    return run, run_numpy, torch.__version__, "f32", torch.inference_mode


def make_decode_peer(peer, case, data, threads, weights):
    if peer in ("ort", "ort-int8"):
        return ort_decode_peer(case, data, threads, weights, peer == "ort-int8")
    if peer == "sdpa":
        return sdpa_decode_peer(case, data, threads)
    if peer in ("openvino", "openvino-int8"):
        import numpy as np
        from peers_openvino import decode_peer
        return decode_peer(case, data, threads, weights, peer == "openvino-int8", np, Skip,
                           packed_qkv_weight, weight_codes, pack_nibbles)
    if peer == "ggml":
        import numpy as np
        from peers_ggml import decode_peer
        return decode_peer(case, data, threads, weights, np, Skip, decode_cache,
                           packed_qkv_weight)
    raise Skip(f"{peer} has no decode step here (--decode compares {', '.join(DECODE_PEERS)})",
               unavailable=True)


def make_peer(peer, case, data, threads, weights):
    if peer in ("ort-int8", "openvino-int8", "ggml"):
        needs = " with quantized weights" if peer.endswith("-int8") else ""
        raise Skip(f"{peer} has only a decode step here (--decode{needs})", unavailable=True)
    if peer in ("torch", "sdpa"):
        return torch_peer(case, data, threads, fused=peer == "sdpa")
    if peer == "ort":
        return ort_peer(case, data, threads)
    return openvino_peer(case, data, threads, "f32" if peer == "openvino" else "bf16")


def time_peer(peer, expected, min_time, min_runs):
    """Returns (max_abs_err of the first call, sorted call times in ms)."""
    import contextlib
    import numpy as np
    run, between = peer.run, peer.between or (lambda: None)
    got = np.asarray(peer.run_numpy(), dtype=np.float32)
    if got.shape != expected.shape:
        raise RuntimeError(f"output shape {got.shape}, expected {expected.shape}")
    err = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0
    with (peer.context() if peer.context else contextlib.nullcontext()):
        warm_start = time.perf_counter()
        warm_runs = 0
        while warm_runs < 3 or time.perf_counter() - warm_start < 0.2 * min_time:
            between()
            run()
            warm_runs += 1
        samples = []
        start = time.perf_counter()
        while len(samples) < min_runs or time.perf_counter() - start < min_time:
            between()
            t0 = time.perf_counter()
            run()
            samples.append((time.perf_counter() - t0) * 1e3)
    return err, sorted(samples)


def main():
    ap = argparse.ArgumentParser(
        description="Time one peer's multi-head attention; one JSON object on stdout.")
    ap.add_argument("--peer", required=True, choices=PEERS)
    shape = ap.add_mutually_exclusive_group(required=True)
    shape.add_argument("--case", type=parse_case,
                       metavar="B,SEQ,KV_SEQ,EMBED,HEADS,CAUSAL,NEED_WEIGHTS")
    shape.add_argument("--decode", type=parse_decode, metavar="B,CONTEXT,EMBED,HEADS,KV_HEADS",
                       help="time one decode step over a cache (see the module doc)")
    ap.add_argument("--variants", default="",
                    help="attention variants of --case, e.g. 'kv_heads=8 rope=neox window=1024'")
    ap.add_argument("--weights", default="f32", choices=("f32",) + tuple(QUANTIZED),
                    help="--decode: mha's weight storage; the data file holds the dequantized "
                         "values (default f32: float weights)")
    ap.add_argument("--data", required=True, help="safetensors file from mha-bench")
    ap.add_argument("--threads", type=int, default=1, help="threads the peer may use (default 1)")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="minimum timed seconds (default 1.0)")
    ap.add_argument("--min-runs", type=int, default=5, help="minimum timed calls (default 5)")
    args = ap.parse_args()
    if args.threads < 1 or args.min_runs < 1 or args.min_time < 0:
        ap.error("--threads and --min-runs must be >= 1, --min-time >= 0")
    try:
        variants = parse_variants(args.variants)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))

    steady_malloc()
    result = {"peer": args.peer}
    try:
        np = import_or_skip("numpy")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from safetensors_py import load_file
        data = {k: np.ascontiguousarray(v, dtype=np.float32)
                for k, v in load_file(args.data)[0].items()}
        make = make_decode_peer if args.decode else make_peer
        case = args.decode or args.case
        if args.case is not None:
            case = dict(case, variants=variants, variants_text=args.variants)
        peer = Peer(*make(args.peer, case, data, args.threads, args.weights))
        err, samples = time_peer(peer, data["output"].astype(np.float64), args.min_time,
                                 args.min_runs)
        result.update({"version": peer.version, "precision": peer.precision,
                       "median_ms": round(percentile(samples, 50), 6),
                       "p10_ms": round(percentile(samples, 10), 6),
                       "p90_ms": round(percentile(samples, 90), 6),
                       "runs": len(samples), "max_abs_err": err})
    except Skip as s:
        result.update({"skipped": str(s), "unavailable": s.unavailable})
    except Exception as e:  # the library failed on this case: report it, the run goes on
        result.update({"skipped": f"{args.peer} failed: {type(e).__name__}: {e}",
                       "unavailable": False})
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
