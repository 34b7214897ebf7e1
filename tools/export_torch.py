#!/usr/bin/env python3
"""Exports torch.nn.MultiheadAttention weights to safetensors for mha (mha-run, the C and C++
APIs), and optionally random inputs plus PyTorch's output to check mha-run against.

Weights are written under their state_dict names (in_proj_weight or q/k/v_proj_weight,
in_proj_bias, out_proj.weight, out_proj.bias, bias_k, bias_v), each preceded by --prefix, which
is what runtime/weights.h's LoadMhaWeights and `mha-run --prefix` read.

    # a fresh random module (seeded), its weights, inputs and torch's expected output
    export_torch.py --embed-dim 16 --num-heads 4 --out w.safetensors \\
        --inputs in.safetensors --expected want.safetensors --batch 2 --seq 5 --kv-seq 7
    mha-run --weights w.safetensors --num-heads 4 --inputs in.safetensors --output got.safetensors

    # the attention tensors of a whole saved model (torch.save(model.state_dict(), "m.pt"))
    export_torch.py --state-dict m.pt --select encoder.layers.0.self_attn. --out w.safetensors
    mha-run --weights w.safetensors --prefix encoder.layers.0.self_attn. ...

Inputs file: `query`, and for cross-attention (--kv-seq, or kdim/vdim != embed_dim) `key` and
`value`, in the module's layout ([L, N, E], [N, L, E] with --batch-first, [L, E] with
--unbatched); optional `attn_mask` ([L, S], or [N*H, L, S] with --attn-mask-3d) and
`key_padding_mask` ([N, S]), BOOL (True = masked) or F32 (added). Random masks never mask key 0,
so no row is fully masked unless --full-row asks for query row 0 to be (PyTorch then returns NaN
there; mha returns zero attention, i.e. out_proj.bias).

Expected file: `attn_output` and, with --need-weights, `attn_output_weights`, from the module in
eval mode (float32), plus the options as metadata. --causal is mha's flag (key j > query i
masked, top-left aligned): PyTorch 1.13 has no is_causal, so it gets the equivalent mask.

Run with /usr/bin/python3 (Debian's, with python3-torch). Writes through tools/safetensors_py.py.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("export_torch.py: error: torch is not importable (use /usr/bin/python3 with "
                 "python3-torch)")
    return torch


def per_head_rows(embed_dim, num_heads):
    """Row permutation from PyTorch's packed order (q | k | v) to the per-head interleaved one:
    row h*3*hd + part*hd + d of the result is row part*E + h*hd + d of PyTorch's."""
    hd = embed_dim // num_heads
    return [part * embed_dim + h * hd + d
            for h in range(num_heads) for part in range(3) for d in range(hd)]


def module_tensors(module, prefix="", qkv_layout="pytorch"):
    """The module's state_dict as {prefix + name: float32 CPU tensor}. With qkv_layout
    'per-head' the packed in_proj_weight / in_proj_bias rows are reordered per head."""
    out = {}
    for name, value in module.state_dict().items():
        value = value.detach().to("cpu").float().contiguous()
        if qkv_layout == "per-head" and name in ("in_proj_weight", "in_proj_bias"):
            value = value[per_head_rows(module.embed_dim, module.num_heads)].contiguous()
        out[prefix + name] = value
    return out


def export_module(module, path, prefix="", qkv_layout="pytorch", metadata=None):
    """Writes an nn.MultiheadAttention's weights to `path` (safetensors)."""
    safetensors_py.save_file(module_tensors(module, prefix, qkv_layout), path, metadata)


def export_state_dict(state_dict, path, select=""):
    """Writes the floating-point tensors of a (whole model's) state_dict whose names start with
    `select`, keeping their full names; raises ValueError when none match."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()
               if k.startswith(select) and v.is_floating_point()}
    if not tensors:
        raise ValueError(f"no floating-point tensor name starts with {select!r}")
    safetensors_py.save_file(tensors, path)
    return sorted(tensors)


def _random_inputs(torch, args, gen):
    """Returns (query, key, value, attn_mask, key_padding_mask, torch_attn_mask,
    torch_kpm); key/value are None for self-attention."""
    E = args.embed_dim
    kdim = args.kdim or E
    vdim = args.vdim or E
    N, L = args.batch, args.seq
    cross = args.kv_seq is not None or kdim != E or vdim != E
    S = args.kv_seq if args.kv_seq is not None else L

    def seq(tokens, features):
        if args.unbatched:
            shape = (tokens, features)
        elif args.batch_first:
            shape = (N, tokens, features)
        else:
            shape = (tokens, N, features)
        return torch.rand(shape, generator=gen) * 2 - 1

    query = seq(L, E)
    key = seq(S, kdim) if cross else None
    value = seq(S, vdim) if cross else None

    H = args.num_heads
    attn_mask = kpm = None
    # Random masks leave key 0 allowed everywhere so that no row is fully masked by accident.
    if args.attn_mask != "none":
        shape = ((N if not args.unbatched else 1) * H, L, S) if args.attn_mask_3d else (L, S)
        masked = torch.rand(shape, generator=gen) < 0.3
        masked[..., 0] = False
        if args.full_row:
            masked[..., 0, :] = True
        if args.attn_mask == "bool":
            attn_mask = masked
        else:
            attn_mask = torch.rand(shape, generator=gen) - 0.5
            attn_mask = attn_mask.masked_fill(masked, float("-inf"))
    elif args.full_row:
        sys.exit("export_torch.py: error: --full-row needs --attn-mask bool or float")
    if args.key_padding_mask != "none":
        shape = (S,) if args.unbatched else (N, S)
        masked = torch.rand(shape, generator=gen) < 0.3
        masked[..., 0] = False
        if args.key_padding_mask == "bool":
            kpm = masked
        else:
            kpm = (torch.rand(shape, generator=gen) - 0.5).masked_fill(masked, float("-inf"))

    # What PyTorch 1.13 is given: the causal mask merged into attn_mask, and a float
    # key_padding_mask combined with another mask pre-added into one float [N*H, L, S] mask
    # (1.13 reinterprets it as bool next to a bool attn_mask and rejects it next to a float one).
    torch_attn, torch_kpm = attn_mask, kpm
    causal = torch.triu(torch.ones(L, S, dtype=torch.bool), 1) if args.causal else None
    if causal is not None:
        if torch_attn is None:
            torch_attn = causal
        elif torch_attn.dtype == torch.bool:
            torch_attn = torch_attn | causal
        else:
            torch_attn = torch_attn.masked_fill(causal, float("-inf"))
    if kpm is not None and kpm.dtype != torch.bool and torch_attn is not None:
        batches = 1 if args.unbatched else N
        merged = torch.zeros(batches, H, L, S)
        if torch_attn.dtype == torch.bool:
            extra = torch.zeros(torch_attn.shape).masked_fill(torch_attn, float("-inf"))
        else:
            extra = torch_attn
        merged = merged + extra.reshape((batches, H, L, S) if extra.dim() == 3 else (L, S))
        merged = merged + kpm.reshape(batches, 1, 1, S)
        torch_attn = merged.reshape(batches * H, L, S)
        if args.unbatched:
            torch_attn = torch_attn.reshape(H, L, S)
        torch_kpm = None
    return query, key, value, attn_mask, kpm, torch_attn, torch_kpm


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--embed-dim", type=int, help="E (a new random module)")
    p.add_argument("--num-heads", type=int, help="H, divides E")
    p.add_argument("--kdim", type=int, default=None)
    p.add_argument("--vdim", type=int, default=None)
    p.add_argument("--bias", dest="bias", action="store_true", default=True,
                   help="in_proj/out_proj biases (default)")
    p.add_argument("--no-bias", dest="bias", action="store_false")
    p.add_argument("--add-bias-kv", action="store_true")
    p.add_argument("--add-zero-attn", action="store_true")
    p.add_argument("--batch-first", action="store_true")
    p.add_argument("--qkv-layout", choices=["pytorch", "per-head"], default="pytorch",
                   help="row order of the written in_proj_weight/in_proj_bias")
    p.add_argument("--prefix", default="", help="prepended to every weight name")
    p.add_argument("--state-dict", help="instead of a new module: a torch.save()d state_dict "
                   "(e.g. a whole model's), filtered by --select")
    p.add_argument("--select", default="", help="with --state-dict: keep names starting with this")
    p.add_argument("--out", required=True, help="weights file to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inputs", help="also write random inputs here")
    p.add_argument("--expected", help="and torch's output here (needs --inputs)")
    p.add_argument("--batch", type=int, default=2, help="N")
    p.add_argument("--seq", type=int, default=5, help="L, query length")
    p.add_argument("--kv-seq", type=int, default=None, help="S: cross-attention with S keys")
    p.add_argument("--unbatched", action="store_true", help="2-D inputs [L, E]")
    p.add_argument("--attn-mask", choices=["none", "bool", "float"], default="none")
    p.add_argument("--attn-mask-3d", action="store_true", help="attn_mask [N*H, L, S]")
    p.add_argument("--key-padding-mask", choices=["none", "bool", "float"], default="none")
    p.add_argument("--full-row", action="store_true",
                   help="mask every key of query row 0 in attn_mask")
    p.add_argument("--causal", action="store_true", help="mha's causal flag")
    p.add_argument("--need-weights", action="store_true")
    p.add_argument("--no-average-weights", action="store_true")
    args = p.parse_args(argv)

    torch = _torch()
    if args.state_dict:
        state = torch.load(args.state_dict, map_location="cpu")
        if hasattr(state, "state_dict"):
            state = state.state_dict()
        try:
            names = export_state_dict(state, args.out, args.select)
        except ValueError as e:
            p.error(f"--select: {e}")
        print(f"wrote {len(names)} tensors to {args.out}")
        return 0

    if args.embed_dim is None or args.num_heads is None:
        p.error("--embed-dim and --num-heads are required (or --state-dict)")
    if args.embed_dim <= 0 or args.num_heads <= 0 or args.embed_dim % args.num_heads:
        p.error(f"--embed-dim must be a positive multiple of --num-heads, got "
                f"{args.embed_dim} and {args.num_heads}")
    if args.expected and not args.inputs:
        p.error("--expected needs --inputs")
    if args.qkv_layout == "per-head" and ((args.kdim or args.embed_dim) != args.embed_dim or
                                          (args.vdim or args.embed_dim) != args.embed_dim):
        p.error("--qkv-layout per-head needs the packed in_proj_weight (kdim == vdim == E)")

    torch.manual_seed(args.seed)
    module = torch.nn.MultiheadAttention(
        args.embed_dim, args.num_heads, dropout=0.0, bias=args.bias,
        add_bias_kv=args.add_bias_kv, add_zero_attn=args.add_zero_attn, kdim=args.kdim,
        vdim=args.vdim, batch_first=args.batch_first)
    # PyTorch initializes the biases to zero; random ones make the check meaningful.
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("bias"):
                param.uniform_(-0.3, 0.3)
    module.eval()
    meta = {"embed_dim": str(args.embed_dim), "num_heads": str(args.num_heads),
            "add_zero_attn": str(int(args.add_zero_attn)),
            "batch_first": str(int(args.batch_first)), "qkv_layout": args.qkv_layout}
    export_module(module, args.out, args.prefix, args.qkv_layout, meta)
    if not args.inputs:
        return 0

    gen = torch.Generator().manual_seed(args.seed + 1)
    query, key, value, attn_mask, kpm, torch_attn, torch_kpm = _random_inputs(torch, args, gen)
    inputs = {"query": query}
    if key is not None:
        inputs["key"] = key
        inputs["value"] = value
    if attn_mask is not None:
        inputs["attn_mask"] = attn_mask
    if kpm is not None:
        inputs["key_padding_mask"] = kpm
    safetensors_py.save_file({k: v.contiguous() for k, v in inputs.items()}, args.inputs)
    if not args.expected:
        return 0

    # Grad mode stays on so PyTorch takes its standard path, not the eval "fast path"
    # (_native_multi_head_attention), which in 1.13 treats masks differently.
    k = key if key is not None else query
    v = value if value is not None else query
    out, weights = module(query, k, v, key_padding_mask=torch_kpm,
                          need_weights=args.need_weights, attn_mask=torch_attn,
                          average_attn_weights=not args.no_average_weights)
    expected = {"attn_output": out.detach().contiguous()}
    if args.need_weights:
        expected["attn_output_weights"] = weights.detach().contiguous()
    meta.update({"causal": str(int(args.causal)), "need_weights": str(int(args.need_weights)),
                 "average_attn_weights": str(int(not args.no_average_weights))})
    safetensors_py.save_file(expected, args.expected, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
