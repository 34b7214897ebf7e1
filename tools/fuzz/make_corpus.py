#!/usr/bin/python3
"""Writes the safetensors fuzz seed corpus (tests/fuzz_corpus/safetensors/).

Small valid files (every supported dtype, rank 0..4, metadata, nn.MultiheadAttention layouts
with and without the "m." prefix) and small invalid ones (one per validation rule), so the
fuzzer starts from inputs that reach deep into both the validator and the weight loader.
Standard library only; deterministic output. Usage: tools/fuzz/make_corpus.py [out_dir]
"""
import json
import os
import struct
import sys


def pack(header, data=b"", pad=True):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def build(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return pack(header, data)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def f16(values):
    return struct.pack("<%de" % len(values), *values)


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def mha(prefix, e, packed=True, bias=True, bias_kv=False, dims=None, conv=f32, dtype="F32"):
    t = []
    if packed:
        t.append((prefix + "in_proj_weight", dtype, [3 * e, e], conv([0.5] * (3 * e * e))))
    else:
        for n, d in zip(("q", "k", "v"), dims):
            t.append((prefix + n + "_proj_weight", dtype, [e, d], conv([0.25] * (e * d))))
    if bias:
        t.append((prefix + "in_proj_bias", dtype, [3 * e], conv([1.0] * (3 * e))))
    t.append((prefix + "out_proj.weight", dtype, [e, e], conv([-1.0] * (e * e))))
    if bias:
        t.append((prefix + "out_proj.bias", dtype, [e], conv([2.0] * e)))
    if bias_kv:
        t.append((prefix + "bias_k", dtype, [1, 1, e], conv([3.0] * e)))
        t.append((prefix + "bias_v", dtype, [1, 1, e], conv([4.0] * e)))
    return t


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/fuzz_corpus/safetensors")
    os.makedirs(out, exist_ok=True)
    ok_entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    files = {
        # Valid.
        "valid_empty": pack({}),
        "valid_metadata_only": pack({"__metadata__": {"format": "pt"}}),
        "valid_dtypes": build([
            ("f32", "F32", [2, 2], f32([1, 2, 3, 4])),
            ("f16", "F16", [3], f16([1.5, -0.0, 65504.0])),
            ("bf16", "BF16", [2], bf16([1.0, -2.0])),
            ("bool", "BOOL", [1, 3], b"\x00\x01\x02"),
            ("u8", "U8", [2, 1, 1, 2], b"\x01\x02\x03\x04"),
            ("scalar", "F32", [], f32([7])),
            ("empty", "F32", [0, 4], b""),
        ], {"format": "pt"}),
        "valid_other_dtypes": build([
            ("d", "F64", [1], struct.pack("<d", 1.0)),
            ("i", "I64", [1], struct.pack("<q", -1)),
            ("f8", "F8_E4M3", [2], b"\x38\x40"),
            ("r5", "F32", [1, 1, 1, 1, 1], f32([1])),
        ]),
        "valid_mha_packed_bias": build(mha("", 2)),
        "valid_mha_packed_nobias": build(mha("", 2, bias=False)),
        "valid_mha_separate": build(mha("", 2, packed=False, dims=(1, 3, 2))),
        "valid_mha_prefix_bias_kv": build(mha("m.", 2, bias_kv=True)),
        "valid_mha_prefix_f16": build(mha("m.", 2, conv=f16, dtype="F16")),
        "valid_mha_bf16": build(mha("", 2, conv=bf16, dtype="BF16", bias_kv=True)),
        # The attention variants' tensors (E 2: one head of 2, or 2 heads of 1) and positions.
        "valid_mha_variants": build(mha("m.", 2) + [
            ("m.sinks", "F32", [2], f32([0.5, -1.0])),
            ("m.alibi_slopes", "F16", [2], f16([0.5, 0.25])),
            ("m.q_norm.weight", "BF16", [2], bf16([1.0, 2.0])),
            ("m.k_norm.weight", "F32", [2], f32([1.0, 0.5])),
            ("positions", "I32", [1, 2], struct.pack("<2i", 0, 1)),
            ("key_positions", "I64", [2], struct.pack("<2q", 3, 4))]),
        "bad_mha_variants_one_norm": build(mha("", 2) + [
            ("q_norm.weight", "F32", [1], f32([1.0]))]),
        "valid_unpadded_misaligned": pack({"a": {"dtype": "F32", "shape": [1],
                                                 "data_offsets": [0, 4]}}, f32([1]), pad=False),
        # Invalid: one per validation rule.
        "bad_7_bytes": b"\x10\x00\x00\x00\x00\x00\x00",
        "bad_header_beyond_file": struct.pack("<Q", 4096) + b"{}",
        "bad_header_huge": b"\xff" * 8 + b"{}",
        "bad_not_json": pack(b"{nope}"),
        "bad_array": pack(b"[1,2]"),
        "bad_utf8": pack(b'{"a\xff":{}}'),
        "bad_deep_nesting": pack(b'{"a":{"dtype":"F32","shape":' + b"[" * 200),
        "bad_unknown_dtype": pack({"a": dict(ok_entry, dtype="F33")}, b"\0" * 8),
        "bad_negative_dim": pack({"a": dict(ok_entry, shape=[-2])}, b"\0" * 8),
        "bad_shape_overflow": pack({"a": dict(ok_entry, shape=[2**32, 2**32])}, b"\0" * 8),
        "bad_offsets_reversed": pack({"a": dict(ok_entry, data_offsets=[8, 0])}, b"\0" * 8),
        "bad_byte_count": pack({"a": dict(ok_entry, shape=[3])}, b"\0" * 8),
        "bad_overlap": pack({"a": ok_entry, "b": dict(ok_entry, data_offsets=[4, 12])}, b"\0" * 12),
        "bad_hole": pack({"a": dict(ok_entry, shape=[1], data_offsets=[0, 4]),
                          "b": dict(ok_entry, shape=[1], data_offsets=[8, 12])}, b"\0" * 12),
        "bad_duplicate": pack(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                              b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
        "bad_metadata_value": pack({"__metadata__": {"k": 1}, "a": ok_entry}, b"\0" * 8),
        "bad_offsets_len3": pack({"a": dict(ok_entry, data_offsets=[0, 8, 8])}, b"\0" * 8),
        "bad_mha_both_layouts": build(mha("", 2) + [("k_proj_weight", "F32", [2, 2], f32([0] * 4))]),
        "bad_mha_bias_k_only": build(mha("m.", 2) +
                                     [("m.bias_k", "F32", [1, 1, 2], f32([0, 0]))]),
    }
    for name, data in sorted(files.items()):
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(files), out))


if __name__ == "__main__":
    main()
