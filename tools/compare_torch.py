#!/usr/bin/env python3
"""Times torch.nn.MultiheadAttention on the CPU, for comparison with mha-bench.

    /usr/bin/python3 tools/compare_torch.py --case 1,128,128,512,8,0,0 --threads 2 --min-time 0.3

Each --case is batch,seq,kv_seq,embed,heads,causal,need_weights (repeatable). Inputs are
batch_first float32 randn; self-attention (one tensor passed as query, key and value) when
kv_seq == seq, otherwise cross-attention with one [batch, kv_seq, embed] memory tensor as key and
value. causal=1 passes a float [seq, kv_seq] attn_mask with -inf above the diagonal (torch 1.13
has no is_causal). need_weights=1 asks for head-averaged weights. The module is in eval mode and
runs under torch.inference_mode() with torch.set_num_threads(threads), so PyTorch picks its
fastest path (its fused "fast path" for self-attention without attn_mask).

glibc's malloc is put in the state a long-running process reaches (fixed mmap threshold of 32
MiB, no trimming; what PyTorch's CPU tuning guide gets with jemalloc or tcmalloc): in a fresh
process, torch's temporaries of a few hundred KiB are mmapped and unmapped on every call until
the first large free raises glibc's dynamic threshold, which made (1, 128, 512, 8) measure
4.6-4.9 ms as the first case of a process and 4.0-4.1 ms after (2 threads, this machine). Set
MHA_COMPARE_TORCH_MALLOC=default to measure without it.

Per case: warm-up runs (at least 2 and ~10% of --min-time), then timed runs until both
--min-time seconds and --min-runs runs are reached. Prints one JSON object per case on stdout:
{"batch", "seq", "kv_seq", "embed", "heads", "causal", "need_weights", "threads", "median_ms",
"p10_ms", "p90_ms", "runs", "torch_version"}. If torch cannot be imported it prints
{"skipped": "<reason>"} once and exits 0.
"""

import argparse
import json
import sys
import time


def parse_case(text):
    parts = text.split(",")
    if len(parts) != 7:
        raise argparse.ArgumentTypeError(
            f"--case {text!r}: expected 7 comma-separated integers "
            "batch,seq,kv_seq,embed,heads,causal,need_weights")
    try:
        b, s, kv, e, h, causal, nw = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--case {text!r}: not all integers")
    if min(b, s, kv, e, h) < 1 or causal not in (0, 1) or nw not in (0, 1):
        raise argparse.ArgumentTypeError(
            f"--case {text!r}: sizes must be >= 1, causal and need_weights 0 or 1")
    if e % h:
        raise argparse.ArgumentTypeError(f"--case {text!r}: embed {e} not divisible by heads {h}")
    return {"batch": b, "seq": s, "kv_seq": kv, "embed": e, "heads": h, "causal": causal,
            "need_weights": nw}


def percentile(sorted_values, p):
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    x = (len(sorted_values) - 1) * p / 100.0
    lo = int(x)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (x - lo)


def time_case(torch, case, threads, min_time, min_runs):
    torch.manual_seed(0)
    b, s, kv, e, h = case["batch"], case["seq"], case["kv_seq"], case["embed"], case["heads"]
    module = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
    x = torch.randn(b, s, e)
    mem = x if kv == s else torch.randn(b, kv, e)
    mask = None
    if case["causal"]:
        mask = torch.triu(torch.full((s, kv), float("-inf")), diagonal=1)
    need_weights = bool(case["need_weights"])

    def run():
        return module(x, mem, mem, attn_mask=mask, need_weights=need_weights)

    with torch.inference_mode():
        warm_start = time.perf_counter()
        warm_runs = 0
        while warm_runs < 2 or time.perf_counter() - warm_start < 0.1 * min_time:
            run()
            warm_runs += 1
        samples = []
        start = time.perf_counter()
        while len(samples) < min_runs or time.perf_counter() - start < min_time:
            t0 = time.perf_counter()
            run()
            samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    result = dict(case)
    result.update({
        "threads": threads,
        "median_ms": round(percentile(samples, 50), 6),
        "p10_ms": round(percentile(samples, 10), 6),
        "p90_ms": round(percentile(samples, 90), 6),
        "runs": len(samples),
        "torch_version": torch.__version__,
    })
    return result


def steady_malloc():
    """glibc mallopt: M_MMAP_THRESHOLD (-3) 32 MiB, M_TRIM_THRESHOLD (-1) 1 GiB. No-op elsewhere."""
    import ctypes
    import os
    if os.environ.get("MHA_COMPARE_TORCH_MALLOC") == "default":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)
        libc.mallopt(-1, 1 << 30)
    except (OSError, AttributeError):
        pass


def main():
    ap = argparse.ArgumentParser(
        description="Time torch.nn.MultiheadAttention; one JSON object per case on stdout.")
    ap.add_argument("--case", type=parse_case, action="append", required=True,
                    metavar="B,SEQ,KV_SEQ,EMBED,HEADS,CAUSAL,NEED_WEIGHTS",
                    help="a shape to time (repeatable)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="minimum timed seconds per case (default 1.0)")
    ap.add_argument("--min-runs", type=int, default=5, help="minimum timed runs (default 5)")
    args = ap.parse_args()
    if args.threads < 1 or args.min_runs < 1 or args.min_time < 0:
        ap.error("--threads and --min-runs must be >= 1, --min-time >= 0")

    steady_malloc()
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising something else
        print(json.dumps({"skipped": f"torch cannot be imported ({sys.executable}): "
                                     f"{type(e).__name__}: {e}"}))
        return 0
    torch.set_num_threads(args.threads)
    for case in args.case:
        print(json.dumps(time_case(torch, case, args.threads, args.min_time, args.min_runs)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
