#!/usr/bin/env python3
"""Writes a Llama-3-8B-shaped Hugging Face checkpoint (config.json of Llama 3.1 8B: hidden 4096,
32 layers, 32 heads, 8 kv heads, head_dim 128, bf16, rope_scaling llama3; 4 shards of about
4 GB plus model.safetensors.index.json, tensors named and ordered as transformers saves them)
whose data regions are holes: each shard is a valid safetensors header followed by a region
made with truncate, so the 16 GB take a few kilobytes of disk and every weight reads as zero.
It measures how opening a layer scales with the checkpoint (bench/README.md "Opening a
checkpoint"), not any result.

    /usr/bin/python3 tools/sparse_hf_checkpoint.py /tmp/llama3-8b-sparse
    build/tools/mha-bench --hf /tmp/llama3-8b-sparse --layer 3 --weights-dtype bf16 ...
    rm -r /tmp/llama3-8b-sparse
"""

import json
import os
import struct
import sys

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 32, 8, 128
INTERMEDIATE, VOCAB = 14336, 128256
SHARDS = 4

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": VOCAB,
}


def tensors():
    """(name, shape) of every tensor, in the order transformers writes them."""
    yield "model.embed_tokens.weight", [VOCAB, HIDDEN]
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        yield p + "input_layernorm.weight", [HIDDEN]
        yield p + "mlp.down_proj.weight", [HIDDEN, INTERMEDIATE]
        yield p + "mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN]
        yield p + "mlp.up_proj.weight", [INTERMEDIATE, HIDDEN]
        yield p + "post_attention_layernorm.weight", [HIDDEN]
        yield p + "self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]
        yield p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]
        yield p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]
        yield p + "self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]
    yield "model.norm.weight", [HIDDEN]
    yield "lm_head.weight", [VOCAB, HIDDEN]


def nbytes(shape):
    n = 2  # bf16
    for d in shape:
        n *= d
    return n


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: sparse_hf_checkpoint.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    all_tensors = list(tensors())
    total = sum(nbytes(s) for _, s in all_tensors)
    # Consecutive tensors fill each shard up to a quarter of the total.
    shards = [[] for _ in range(SHARDS)]
    done = 0
    for name, shape in all_tensors:
        shards[min(SHARDS - 1, done * SHARDS // total)].append((name, shape))
        done += nbytes(shape)
    weight_map = {}
    for k, members in enumerate(shards):
        file = "model-%05d-of-%05d.safetensors" % (k + 1, SHARDS)
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in members:
            size = nbytes(shape)
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = file
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        path = os.path.join(out, file)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + offset)  # the data region: a hole, nothing written
        print("%s: %d tensors, %.2f GB" % (file, len(members), (8 + len(text) + offset) / 1e9))
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    print("total %.2f GB of bf16 tensors in %s" % (total / 1e9, out))


if __name__ == "__main__":
    main()
