"""The ggml decode peer of tools/peers.py: one decode step of mha's layer built from ggml's own
operators through ctypes, on the ggml libraries llama-cpp-python builds and ships.

A step is the graph llama.cpp builds for one token of one attention layer with flash attention
on (`-fa on`), without RoPE, norms nor a feed-forward, which mha-bench's decode layer lacks:

    qkv  = mul_mat(w_qkv, x) + b_qkv         w_qkv [E + 2 kvE rows of E] in the weights' type
    cpy(k, k_cache[:, CONTEXT - 1]), cpy(v, v_cache[:, CONTEXT - 1])
    attn = flash_attn_ext(q, k_cache, v_cache, mask none, scale 1 / sqrt(head_dim))
    y    = mul_mat(w_out, attn) + b_out

Tensors in ggml order: x [E, 1, B]; caches [head_dim, CONTEXT, KV_HEADS, B] f32 (mha's past
positions, the step's own token written at CONTEXT - 1 on every call); q, k, v are views of
qkv [head_dim, 1, heads, B]. Weights: f32 as given, or mha's dequantized i8 / i4 / i4-128
weights quantized by ggml_quantize_chunk to q8_0 / q4_0 / q4_0 (ggml's own formats: 32 inputs
per block with an f16 scale; ggml has no 128-input 4-bit block). ggml multiplies a quantized
weight with activations it quantizes to q8_0 (integer dot products): precision "int8".
Weights go into the CPU backend's repack buffer type (CPU_REPACK: q4_0 interleaved 8 rows at a
time on AVX2 CPUs) when it takes them, as llama.cpp loads a model; the version names it.
The graph is allocated once (ggml-alloc) and run by the CPU backend (ggml_backend_graph_compute,
its threads set to --threads), the call llama.cpp's scheduler makes for each token.
"""

import contextlib
import ctypes
import os
import sys

GGML_TYPE_F32, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 = 0, 2, 8
# --weights -> (ggml type, its name).
WEIGHT_TYPES = {"f32": (GGML_TYPE_F32, "f32"), "i8": (GGML_TYPE_Q8_0, "q8_0"),
                "i4": (GGML_TYPE_Q4_0, "q4_0"), "i4-128": (GGML_TYPE_Q4_0, "q4_0")}

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_size = ctypes.c_size_t


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", _size), ("mem_buffer", _p), ("no_alloc", ctypes.c_bool)]


# name: (restype, argtypes)
_SIGNATURES = {
    "ggml_version": (ctypes.c_char_p, []),
    "ggml_init": (_p, [_InitParams]),
    "ggml_free": (None, [_p]),
    "ggml_tensor_overhead": (_size, []),
    "ggml_graph_overhead": (_size, []),
    "ggml_row_size": (_size, [ctypes.c_int, _i64]),
    "ggml_nbytes": (_size, [_p]),
    "ggml_new_tensor_1d": (_p, [_p, ctypes.c_int, _i64]),
    "ggml_new_tensor_2d": (_p, [_p, ctypes.c_int, _i64, _i64]),
    "ggml_new_tensor_4d": (_p, [_p, ctypes.c_int, _i64, _i64, _i64, _i64]),
    "ggml_view_4d": (_p, [_p, _p, _i64, _i64, _i64, _i64, _size, _size, _size, _size]),
    "ggml_reshape_2d": (_p, [_p, _p, _i64, _i64]),
    "ggml_mul_mat": (_p, [_p, _p, _p]),
    "ggml_add": (_p, [_p, _p, _p]),
    "ggml_cpy": (_p, [_p, _p, _p]),
    "ggml_flash_attn_ext": (_p, [_p, _p, _p, _p, _p, ctypes.c_float, ctypes.c_float,
                                 ctypes.c_float]),
    "ggml_new_graph": (_p, [_p]),
    "ggml_build_forward_expand": (None, [_p, _p]),
    "ggml_quantize_chunk": (_size, [ctypes.c_int, _p, _p, _i64, _i64, _i64, _p]),
    "ggml_log_set": (None, [_p, _p]),
    "ggml_backend_cpu_init": (_p, []),
    "ggml_backend_cpu_set_n_threads": (None, [_p, ctypes.c_int]),
    "ggml_backend_cpu_reg": (_p, []),
    "ggml_backend_cpu_buffer_type": (_p, []),
    "ggml_backend_reg_dev_get": (_p, [_p, _size]),
    "ggml_backend_reg_get_proc_address": (_p, [_p, ctypes.c_char_p]),
    "ggml_backend_dev_supports_op": (ctypes.c_bool, [_p, _p]),
    "ggml_backend_buft_name": (ctypes.c_char_p, [_p]),
    "ggml_backend_alloc_ctx_tensors_from_buft": (_p, [_p, _p]),
    "ggml_backend_buffer_free": (None, [_p]),
    "ggml_backend_tensor_set": (None, [_p, _p, _size, _size]),
    "ggml_backend_tensor_get": (None, [_p, _p, _size, _size]),
    "ggml_backend_graph_compute": (ctypes.c_int, [_p, _p]),
    "ggml_gallocr_new": (_p, [_p]),
    "ggml_gallocr_alloc_graph": (ctypes.c_bool, [_p, _p]),
}


class Ggml:
    """ctypes bindings of the ggml functions above, from llama-cpp-python's lib/ folder."""

    def __init__(self, lib_dir):
        libs = [ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)
                for name in ("libggml-base.so", "libggml.so", "libggml-cpu.so")]
        for name, (restype, argtypes) in _SIGNATURES.items():
            for lib in libs:
                f = getattr(lib, name, None)
                if f is not None:
                    f.restype, f.argtypes = restype, argtypes
                    setattr(self, name[5:], f)  # ggml_add -> self.add
                    break
            else:
                raise OSError(f"{name} not found in {lib_dir}")
        # ggml logs every buffer it allocates to stderr: keep mha-bench's terminal quiet.
        self._quiet = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, _p)(
            lambda level, text, user: None)
        self.log_set(ctypes.cast(self._quiet, _p), None)


@contextlib.contextmanager
def _stderr_quiet():
    """File descriptor 2 on /dev/null for the block (what C code prints there is dropped)."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def _check(pointer, what):
    if not pointer:
        raise RuntimeError(f"ggml: {what} failed")
    return pointer


def decode_peer(case, data, threads, weights, np, Skip, decode_cache, packed_qkv_weight):
    """(run, run_numpy, version, precision, None) for tools/peers.py's time_peer."""
    try:
        import llama_cpp
        g = Ggml(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))
    except Exception as e:  # not installed, or a build without these libraries
        raise Skip(f"ggml: llama-cpp-python's ggml libraries cannot be loaded ({type(e).__name__}:"
                   f" {e}); tools/dev peers installs llama-cpp-python", unavailable=True)
    b, ctx, e, h, kvh = (case[k] for k in ("batch", "context", "embed", "heads", "kv_heads"))
    d = e // h
    kve = kvh * d
    wtype, wname = WEIGHT_TYPES[weights]
    if wtype != GGML_TYPE_F32 and e % 32:
        raise Skip(f"ggml's {wname} needs inputs ({e}) a multiple of its block (32)")

    backend = _check(g.backend_cpu_init(), "ggml_backend_cpu_init")
    g.backend_cpu_set_n_threads(backend, threads)
    reg = g.backend_cpu_reg()
    dev = g.backend_reg_dev_get(reg, 0)
    cpu_buft = g.backend_cpu_buffer_type()
    extra_bufts = []
    get_extra = g.backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if get_extra:
        array = ctypes.CFUNCTYPE(ctypes.POINTER(_p), _p)(get_extra)(dev)
        i = 0
        while array and array[i]:
            extra_bufts.append(array[i])
            i += 1
    keep = []  # contexts, buffers and host arrays that must outlive the graph

    def context(tensors):
        c = _check(g.init(_InitParams(g.tensor_overhead() * tensors + g.graph_overhead(), None,
                                      True)), "ggml_init")
        keep.append(c)
        return c

    def weight(w):
        """w [rows, E] (nn.Linear layout) as a ggml weight [E, rows] of wtype, in the first
        buffer type that multiplies it (an extra one first, as llama.cpp), and its buffer's
        name."""
        rows = w.shape[0]
        host = np.zeros(rows * g.row_size(wtype, e), np.uint8)
        src = np.ascontiguousarray(w, np.float32)
        written = g.quantize_chunk(wtype, src.ctypes.data, host.ctypes.data, 0, rows, e, None)
        if written != host.size:
            raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes, expected {host.size}")
        for buft in extra_bufts + [cpu_buft]:
            c = context(3)  # the weight, the probe's activations and its mul_mat
            t = g.new_tensor_2d(c, wtype, e, rows)
            buf = g.backend_alloc_ctx_tensors_from_buft(c, buft)
            if not buf:
                continue
            probe = g.mul_mat(c, t, g.new_tensor_2d(c, GGML_TYPE_F32, e, b))
            if buft == cpu_buft or g.backend_dev_supports_op(dev, probe):
                with _stderr_quiet():  # the repack's debug line bypasses ggml_log_set
                    g.backend_tensor_set(t, host.ctypes.data, 0, host.size)
                keep.append(buf)
                return t, g.backend_buft_name(buft).decode()
            g.backend_buffer_free(buf)
        raise RuntimeError("no ggml buffer type takes the weights")

    w_qkv, qkv_buft = weight(packed_qkv_weight(data))
    w_out, out_buft = weight(data["out_proj.weight"])

    # Inputs, biases and caches: host f32 tensors in one CPU buffer.
    c = context(6)
    x = g.new_tensor_2d(c, GGML_TYPE_F32, e, b)
    b_qkv = g.new_tensor_1d(c, GGML_TYPE_F32, e + 2 * kve)
    b_out = g.new_tensor_1d(c, GGML_TYPE_F32, e)
    k_cache = g.new_tensor_4d(c, GGML_TYPE_F32, d, ctx, kvh, b)
    v_cache = g.new_tensor_4d(c, GGML_TYPE_F32, d, ctx, kvh, b)
    keep.append(_check(g.backend_alloc_ctx_tensors_from_buft(c, cpu_buft), "input buffer"))
    host_k, host_v = decode_cache(data, case)  # [B, KV_HEADS, CONTEXT, head_dim]: ggml's order
    for t, a in ((x, data["query"]), (b_qkv, data["in_proj_bias"]),
                 (b_out, data["out_proj.bias"]), (k_cache, host_k), (v_cache, host_v)):
        a = np.ascontiguousarray(a, np.float32)
        g.backend_tensor_set(t, a.ctypes.data, 0, a.nbytes)

    # The step's graph; its intermediates in a buffer ggml-alloc sizes once.
    c = context(32)
    f4 = 4
    row = (e + 2 * kve) * f4  # bytes per entry of qkv [E + 2 kvE, B]
    qkv = g.add(c, g.mul_mat(c, w_qkv, x), b_qkv)

    def heads(offset, n):  # [head_dim, 1, n, B] view of qkv's n heads from `offset` floats
        return g.view_4d(c, qkv, d, 1, n, b, d * f4, d * f4, row, offset * f4)

    cache_row = d * f4
    graph = g.new_graph(c)
    for cache, offset in ((k_cache, e), (v_cache, e + kve)):
        slot = g.view_4d(c, cache, d, 1, kvh, b, cache_row, ctx * cache_row,
                         kvh * ctx * cache_row, (ctx - 1) * cache_row)
        g.build_forward_expand(graph, g.cpy(c, heads(offset, kvh), slot))
    attn = g.flash_attn_ext(c, heads(0, h), k_cache, v_cache, None, 1.0 / d ** 0.5, 0.0, 0.0)
    y = g.add(c, g.mul_mat(c, w_out, g.reshape_2d(c, attn, e, b)), b_out)
    g.build_forward_expand(graph, y)
    galloc = _check(g.gallocr_new(cpu_buft), "ggml_gallocr_new")
    keep.append(galloc)
    if not g.gallocr_alloc_graph(galloc, graph):
        raise RuntimeError("ggml_gallocr_alloc_graph failed")
    out = np.zeros((b, 1, e), np.float32)

    def run():
        status = g.backend_graph_compute(backend, graph)
        if status != 0:
            raise RuntimeError(f"ggml_backend_graph_compute returned {status}")

    def run_numpy():
        run()
        g.backend_tensor_get(y, out.ctypes.data, 0, out.nbytes)
        return out

    run.keep = (g, backend, keep)  # the libraries' objects live as long as run
    bufts = qkv_buft if qkv_buft == out_buft else f"{qkv_buft}, {out_buft}"
    version = (f"llama-cpp-python {llama_cpp.__version__} (ggml {g.version().decode()}, "
               f"{wname} weights in {bufts})")
    return run, run_numpy, version, "f32" if wtype == GGML_TYPE_F32 else "int8", None
