"""The OpenVINO decode peer of tools/peers.py: one decode step of mha's layer as the stateful
graph OpenVINO's LLM exports (optimum-intel, openvino.genai) hand its CPU plugin, which fuses it
into its in-place KV-cache attention node (ScaledDotProductAttentionWithKVCache):

    qkv   = MatMul(x, w_qkv^T) + b_qkv                      x [B, 1, E]
    k_all = Concat(Gather(ReadValue("past_key"), beam_idx), k [B, KV_HEADS, 1, head_dim], 2)
    Assign(k_all, "past_key"), the same for v
    attn  = ScaledDotProductAttention(q [B, H, 1, head_dim], k_all, v_all)  (grouped-query
            layers: Unsqueeze -> Broadcast -> Reshape of k_all / v_all, as those exports)
    y     = MatMul(attn, w_out^T) + b_out

The plugin keeps the cache in its own buffer (KV_CACHE_PRECISION f32 here, as the other peers'
caches; its default on x86 is u8) and appends the step's key and value in place; beam_idx
(0..B-1) is the input those exports carry for beam search, which the fusion requires.

Quantized weights (--weights i8 / i4 / i4-128) are the decompression subgraph NNCF's
compress_weights emits and the plugin runs as compressed FullyConnected kernels: Constant i8
[N, K] -> Convert f32 -> Multiply by the row's scale [N, 1] (INT8_SYM), or Constant i4
[N, K / G, G] -> Convert -> Multiply by [N, K / G, 1] -> Reshape [N, K] (INT4_SYM, group G of 32
or 128), holding mha's codes and scales (so OpenVINO multiplies the values mha multiplies).
"openvino" runs them on f32 activations (DYNAMIC_QUANTIZATION_GROUP_SIZE 0, mha's arithmetic);
"openvino-int8" keeps the plugin's default, dynamic quantization of the activations to int8
(groups of 32 inputs on 2026.4 for x86): precision "int8".

A call appends one position, so the step cannot be rewound for free as mha's is: the cache is
set (VariableState.state, a copy into the plugin's buffer) to CONTEXT - WINDOW positions and one
call made, both untimed, then WINDOW - 1 calls are timed before the next reset. The timed calls
attend CONTEXT - WINDOW + 2 .. CONTEXT positions (at most WINDOW - 2 fewer than mha's step,
which can only favour OpenVINO). The untimed call takes the plugin's cache growth: a state set
to exactly n positions reallocates and copies on its first append. The first call, whose output
is compared with mha's, attends exactly mha's CONTEXT - 1 cached positions and its own token.
"""

WINDOW = 16


def decode_peer(case, data, threads, weights, int8_activations, np, Skip, packed_qkv_weight,
                weight_codes, pack_nibbles):
    """Returns (run, run_numpy, version, precision, context, between) as tools/peers.py's
    decode peers, between() being the untimed call before each timed one."""
    try:
        import openvino as ov
        import openvino.opset6 as ops6
        import openvino.opset13 as ops
        from openvino.op.util import Variable, VariableInfo
    except ImportError as err:
        raise Skip(f"openvino cannot be imported ({err}); tools/dev peers installs it",
                   unavailable=True)
    name = "openvino-int8" if int8_activations else "openvino"
    if int8_activations and weights == "f32":
        raise Skip("openvino-int8 quantizes the activations for compressed weights only: it "
                   "needs quantized weights (--weights-dtype i8, i4 or i4-128)",
                   unavailable=True)
    b, ctx, e, h, kvh = (case[k] for k in ("batch", "context", "embed", "heads", "kv_heads"))
    d = e // h
    kve, group = kvh * d, h // kvh
    if ctx <= WINDOW:
        raise Skip(f"{name} here needs a context above {WINDOW} (its timing window), got {ctx}")

    def i64(*v):
        return ops.constant(np.array(v, np.int64))

    def weight(w):  # w [N, K] (nn.Linear layout) as the MatMul's transposed operand
        if weights == "f32":
            return ops.constant(np.ascontiguousarray(w, np.float32))
        n, k = w.shape
        codes, scale = weight_codes(w, weights)  # [N, K / G, G], [N, K / G]
        if weights == "i8":  # one scale per row (G divides the row; every group repeats it)
            c = ops.constant(codes.reshape(n, k).astype(np.int8))
            return ops.multiply(ops.convert(c, ov.Type.f32), ops.constant(scale[:, :1].copy()))
        t = ov.Tensor(ov.Type.i4, ov.Shape(list(codes.shape)))  # two's complement nibbles
        t.data[...] = pack_nibbles(codes.astype(np.uint8) & 0xF).reshape(t.data.shape)
        c = ops.multiply(ops.convert(ov.op.Constant(t), ov.Type.f32),
                         ops.constant(scale[..., None].astype(np.float32)))
        return ops.reshape(c, i64(n, k), False)

    def linear(inp, w, bias):
        return ops.add(ops.matmul(inp, weight(w), False, True), ops.constant(bias))

    def heads(y, n):  # [B, 1, n * head_dim] -> [B, n, 1, head_dim]
        return ops.transpose(ops.reshape(y, i64(b, 1, n, d), False), i64(0, 2, 1, 3))

    x = ops.parameter([b, 1, e], np.float32, name="x")
    beam_idx = ops.parameter([b], np.int32, name="beam_idx")
    qkv = linear(x, packed_qkv_weight(data), data["in_proj_bias"])
    q, k, v = ops.variadic_split(qkv, ops.constant(np.int64(-1)), i64(e, kve, kve)).outputs()
    assigns = []

    def cached(new, variable_id):  # new [B, KV_HEADS, 1, head_dim] -> the whole cache
        info = VariableInfo()
        info.data_shape = ov.PartialShape([b, kvh, -1, d])
        info.data_type = ov.Type.f32
        info.variable_id = variable_id
        variable = Variable(info)
        past = ops6.read_value(ops.constant(np.zeros((b, kvh, 0, d), np.float32)), variable)
        whole = ops.concat([ops.gather(past, beam_idx, ops.constant(np.int64(0))), new], 2)
        assigns.append(ops6.assign(whole, variable))
        if group > 1:
            whole = ops.broadcast(ops.unsqueeze(whole, ops.constant(np.int64(2))),
                                  i64(b, kvh, group, 1, d), broadcast_spec="BIDIRECTIONAL")
            whole = ops.reshape(whole, i64(b, h, -1, d), False)
        return whole

    attn = ops.scaled_dot_product_attention(heads(q, h), cached(heads(k, kvh), "past_key"),
                                            cached(heads(v, kvh), "past_value"), causal=False)
    attn = ops.reshape(ops.transpose(attn, i64(0, 2, 1, 3)), i64(b, 1, e), False)
    y = linear(attn, data["out_proj.weight"], data["out_proj.bias"])
    model = ov.Model([ops.result(y)], assigns, [x, beam_idx], "mha_decode_peer")
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "KV_CACHE_PRECISION": "f32"}
    if not int8_activations:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    compiled = ov.Core().compile_model(model, "CPU", config)
    layers = {op.get_rt_info()["layerType"].astype(str)
              for op in compiled.get_runtime_model().get_ops()}
    # Fused, the attention node appends to the cache itself: no Concatenation is left.
    if "ScaledDotProductAttention" not in layers or "Concatenation" in layers:
        raise RuntimeError(f"the CPU plugin did not fuse the stateful attention (layers: "
                           f"{', '.join(sorted(fused))})")
    request = compiled.create_infer_request()
    request.set_input_tensor(0, ov.Tensor(np.ascontiguousarray(data["query"])))
    request.set_input_tensor(1, ov.Tensor(np.arange(b, dtype=np.int32)))
    states = {s.name: s for s in request.query_state()}
    past = {n: data[n] for n in ("past_key", "past_value")}  # [B, KV_HEADS, CONTEXT - 1, D]

    def set_cache(positions):
        for n, a in past.items():
            states[n].state = ov.Tensor(np.ascontiguousarray(a[:, :, :positions]))

    left = [0]  # timed calls before the next reset

    def between():
        if left[0] == 0:
            set_cache(ctx - WINDOW)
            request.infer()  # the cache's growth, untimed; it now holds CONTEXT - WINDOW + 1
            left[0] = WINDOW - 1
        left[0] -= 1

    def run():
        request.infer()

    def run_numpy():
        set_cache(ctx - 1)
        request.infer()
        left[0] = 0
        return request.get_output_tensor(0).data.copy()

    version = ov.get_version().split("-")[0]
    return run, run_numpy, version, "int8" if int8_activations else "f32", None, between
