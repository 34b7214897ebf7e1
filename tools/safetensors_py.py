#!/usr/bin/env python3
"""A tiny pure-Python safetensors reader/writer (Debian 12 has no python3-safetensors).

Format (https://github.com/huggingface/safetensors): an 8-byte little-endian u64 N, then N bytes
of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus
an optional "__metadata__" object of string -> string, then the data region (row-major,
little-endian elements, offsets relative to its first byte).

The writer is deterministic (same inputs -> same bytes) and produces files the strict readers
accept (the Rust reference and mha's runtime/safetensors.h): compact JSON, "__metadata__"
first, the header padded with spaces to a multiple of 8 bytes, tensors tiling the data region
with no hole, ordered by element size (largest first) then name, so every tensor starts at an
offset aligned to its element size.

Values given to save_file may be numpy arrays (bool, uint8, int8..int64, uint16..uint64, float16,
float32, float64), torch tensors (moved to CPU; torch.bfloat16 is written as BF16), or Raw
objects (a dtype string, a shape and the little-endian bytes). load_file returns numpy arrays;
BF16 tensors are widened exactly to float32.

Run with /usr/bin/python3 (numpy is needed; torch is optional).
"""

import json
import struct

import numpy as np

_NUMPY_TO_ST = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint64): "U64",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
}
_ST_TO_NUMPY = {v: k for k, v in _NUMPY_TO_ST.items()}
_ST_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "BF16": 2, "F16": 2, "I32": 4,
            "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class Raw:
    """A tensor given as raw little-endian bytes, for dtypes numpy lacks (BF16)."""

    def __init__(self, dtype, shape, data):
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.data = bytes(data)
        count = 1
        for d in self.shape:
            count *= d
        if len(self.data) != count * _ST_SIZE[dtype]:
            raise ValueError(f"Raw {dtype} {self.shape}: expected {count * _ST_SIZE[dtype]} "
                             f"bytes, got {len(self.data)}")


def bf16_from_f32(array):
    """Rounds float32 values to bfloat16 (round to nearest even) and returns a Raw BF16 tensor.

    NaN is kept a quiet NaN. Values that are already bfloat16-exact are stored unchanged.
    """
    a = np.ascontiguousarray(array, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(a)
    out = np.where(nan, (bits >> 16) | 0x40, rounded).astype("<u2")
    return Raw("BF16", a.shape, out.tobytes())


def bf16_round(array):
    """float32 values rounded to the nearest bfloat16, as float32."""
    raw = bf16_from_f32(array)
    bits = np.frombuffer(raw.data, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(raw.shape).copy()


def _to_raw(name, value):
    if isinstance(value, Raw):
        return value
    if type(value).__module__.startswith("torch"):
        import torch  # only when torch tensors are given

        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return Raw("BF16", t.shape, t.view(torch.int16).numpy().astype("<i2").tobytes())
        value = t.numpy()
    a = np.asarray(value)
    if a.dtype not in _NUMPY_TO_ST:
        raise TypeError(f"{name}: unsupported dtype {a.dtype}")
    dtype = _NUMPY_TO_ST[a.dtype]
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return Raw(dtype, a.shape, a.tobytes())


def serialize(tensors, metadata=None):
    """Returns the bytes of a safetensors file holding `tensors` (name -> value)."""
    raws = {name: _to_raw(name, value) for name, value in tensors.items()}
    order = sorted(raws, key=lambda n: (-_ST_SIZE[raws[n].dtype], n))
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"__metadata__ must map str to str, got {k!r}: {v!r}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in order:
        r = raws[name]
        header[name] = {"dtype": r.dtype, "shape": list(r.shape),
                        "data_offsets": [offset, offset + len(r.data)]}
        offset += len(r.data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(raws[n].data for n in order)


def save_file(tensors, path, metadata=None):
    data = serialize(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def parse(data, name="<buffer>"):
    """Returns (tensors, metadata) from the bytes of a safetensors file."""
    if len(data) < 8:
        raise ValueError(f"{name}: {len(data)} bytes, need at least 8")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{name}: header length {n} exceeds file size {len(data)}")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + n:]
    tensors = {}
    end_max = 0
    for key, info in header.items():
        dtype, shape = info["dtype"], tuple(info["shape"])
        begin, end = info["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if dtype not in _ST_SIZE or end - begin != count * _ST_SIZE[dtype] or end > len(body):
            raise ValueError(f"{name}: tensor {key}: bad dtype/shape/offsets {info}")
        end_max = max(end_max, end)
        raw = bytes(body[begin:end])
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32).reshape(shape).copy()
        elif dtype == "BOOL":
            arr = np.frombuffer(raw, dtype=np.uint8).reshape(shape) != 0
        else:
            arr = np.frombuffer(raw, dtype=_ST_TO_NUMPY[dtype].newbyteorder("<")).reshape(shape)
            arr = arr.astype(_ST_TO_NUMPY[dtype]).copy()
        tensors[key] = arr
    if end_max != len(body):
        raise ValueError(f"{name}: data region is {len(body)} bytes, tensors cover {end_max}")
    return tensors, metadata


def load_file(path):
    """Returns (tensors, metadata): name -> numpy array, and the __metadata__ dict."""
    with open(path, "rb") as f:
        return parse(f.read(), path)


def load_header(path):
    """Returns the parsed JSON header (tensor entries and __metadata__) without the data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8"))


if __name__ == "__main__":
    import sys

    for p in sys.argv[1:]:
        hdr = load_header(p)
        meta = hdr.pop("__metadata__", {})
        print(p)
        for k in sorted(meta):
            print(f"  @{k} = {meta[k]}")
        for k, v in hdr.items():
            print(f"  {k}: {v['dtype']} {v['shape']}")
