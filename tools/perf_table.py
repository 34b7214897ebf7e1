#!/usr/bin/env python3
"""Turns mha-bench --json files into the README's performance tables (markdown on stdout).

    /usr/bin/python3 tools/perf_table.py suite.json [more.json ...] \
        [--command "build/tools/mha-bench --threads 2 --compare all --json suite.json"]

Per file: a line naming the machine and the run (CPU model, SIMD target, BLIS architecture,
threads, mha version, date; not the load average, which a table of current facts does not
hold), a line with the version and precision of every peer compared, then one row per case and thread count: the shape (B, L, E, H), causal,
mha's median ms, its efficiency (GFLOP/s over the same run's BLIS sgemm, in percent), when the
file has them (mha-bench measures it with the sgemm) mha's and the fastest agreeing f32 peer's
percent of the multiply-add peak of the dispatched SIMD target ("peak %", "f32 peer peak %": the
roofline no f32 product passes; not for --compute bf16 files), and, per peer, its time over
mha's: "1.25×" means the peer took 1.25 times mha's time (mha faster), "0.90×" that the peer was
faster. A peer whose first output disagreed with mha's beyond its bound is marked "(!)"; a peer
that did not run the case (not installed, or lacking the feature) is "–". --command adds the
command that made the file. Only the standard library is needed.

A forward file of an mha-bench --compute bf16 run, given with --f32 FILE (the same suite with
f32 compute), gains the column "f32 / bf16": mha's f32 median over its bf16 median for the same
case and thread count ("–" where FILE lacks the case).

With --compact (forward f32 files: the README's one table per CPU family) a shape's non-causal
and causal cases share one row: mha's median ms of each and, for each, the fastest agreeing f32
peer's time over mha's with that peer's name ("1.10× ort"; "–" where none ran).

An mha-bench --decode file gives the decode table instead: per context, batch, kv heads and
cache storage, ms per step, tokens/s, the cache bytes read per step, read% (cache bytes per
step time over the machine's streaming read bandwidth measured in the same run), +weights%
(cache and projection weights) and attn% (the attention over the cache alone); with --compare,
per decode peer its f32 step time over mha's step time of the row (the bf16 and i8 rows against
the same f32 peer time). Its prefill rows follow as a second table: prompt tokens T, batch, E,
heads, kv heads, the medians of KvCache::Step of the prompt into an empty cache and of the
causal Forward of the same shape, and their ratio.
"""

import argparse
import json
import sys

# The peers' table titles and what each one is (mha-bench --help has the details).
PEER_TITLES = {
    "torch": "PyTorch nn.MHA",
    "sdpa": "PyTorch SDPA",
    "ort": "ONNX Runtime",
    "openvino": "OpenVINO f32",
    "openvino-bf16": "OpenVINO bf16",
}
# The decode peers' titles: the f32 decode step each one times (mha-bench --help).
DECODE_PEER_TITLES = {
    "ort": "ONNX Runtime GQA",
    "ort-int8": "ONNX Runtime GQA, int8 activations",
    "sdpa": "PyTorch SDPA",
}


def fail(message):
    sys.exit(f"perf_table.py: {message}")


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: expected an mha-bench --json file, got {type(e).__name__}: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("header"), dict) or \
            not isinstance(doc.get("results"), list):
        fail(f"{path}: expected an object with 'header' and 'results', got {type(doc).__name__} "
             f"with keys {sorted(doc) if isinstance(doc, dict) else []}")
    return doc


def fmt_ms(ms):
    """4 significant digits below 1000 ms, whole ms above (as mha-bench's table)."""
    return f"{ms:.0f}" if ms >= 1000 else f"{ms:.4g}"


def machine_line(h):
    threads = h.get("threads", [])
    threads = ",".join(str(t) for t in threads) if isinstance(threads, list) else str(threads)
    parts = [f"**{h.get('cpu', 'unknown CPU')}**", f"SIMD target {h.get('simd_target', '?')}",
             f"BLIS {h.get('blas_arch', '?')}", f"{threads} thread(s)",
             f"mha {h.get('mha_version', '?')}", str(h.get("date", "?"))[:10]]
    # The efficiency's baseline, when it is not the BLIS configuration named above.
    if h.get("sgemm_arch") and h.get("sgemm_arch") != h.get("blas_arch"):
        parts.append(f"sgemm baseline on BLIS {h['sgemm_arch']}")
    peak = h.get("fma_peak_gflops") or {}
    if peak and h.get("compute") != "bf16":
        parts.append("multiply-add peak " + ", ".join(
            f"{g:.0f} GFLOP/s on {t} thread(s)" for t, g in sorted(peak.items())))
    if h.get("prepack") is False:
        parts.append("--no-prepack")
    elif h.get("strassen") is True:
        parts.append("--strassen")
    if h.get("compute") == "bf16":
        parts.append(f"--compute bf16 ({h.get('bf16_kernel', '?')} kernel)")
    return " · ".join(parts)


def peers_line(h, titles=PEER_TITLES):
    peers = h.get("peers") or {}
    items = []
    for name in h.get("compare", []):
        info = peers.get(name) or {}
        version = info.get("version") or "not run"
        precision = info.get("precision")
        items.append(f"{titles.get(name, name)} ({name}) {version}" +
                     (f", {precision}" if precision and precision != "f32" else ""))
    return "Peers: " + "; ".join(items) + "." if items else ""


def peer_cell(result, name):
    p = (result.get("peers") or {}).get(name) or {}
    ratio = p.get("ratio")
    if not isinstance(ratio, (int, float)):
        return "–"
    return f"{ratio:.2f}×" + ("" if p.get("agrees", True) else " (!)")


def fastest_f32_peer_peak(result):
    """The largest peak_fraction among the f32 peers that ran and agreed, or None."""
    fractions = [p.get("peak_fraction") for p in (result.get("peers") or {}).values()
                 if p.get("precision") == "f32" and p.get("agrees") and
                 isinstance(p.get("peak_fraction"), (int, float))]
    return max(fractions) if fractions else None


def case_key(r):
    return (r.get("batch"), r.get("seq"), r.get("kv_seq"), r.get("embed"), r.get("heads"),
            bool(r.get("causal")), bool(r.get("need_weights")), r.get("threads"),
            json.dumps(r.get("variants"), sort_keys=True))


def table(doc, f32=None):
    h = doc["header"]
    compare = h.get("compare", [])
    results = doc["results"]
    several_threads = len({r.get("threads") for r in results}) > 1
    f32_ms = {case_key(r): r["median_ms"] for r in (f32 or {}).get("results", [])
              if not r.get("error") and isinstance(r.get("median_ms"), (int, float))}
    # The f32 multiply-add peak bounds f32 products only: no peak columns for bf16 compute.
    has_peak = h.get("compute") != "bf16" and \
        any(isinstance(r.get("peak_fraction"), (int, float)) for r in results)
    titles = ["(B, L, E, H)", "causal"] + (["threads"] if several_threads else []) + \
        ["mha ms", "eff %"] + (["peak %", "f32 peer peak %"] if has_peak else []) + \
        (["f32 / bf16"] if f32 else []) + [PEER_TITLES.get(p, p) for p in compare]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for r in results:
        shape = f"({r['batch']}, {r['seq']}, {r['embed']}, {r['heads']})"
        if r.get("kv_seq", r["seq"]) != r["seq"]:
            shape += f" S={r['kv_seq']}"
        if r.get("need_weights"):
            shape += " weights"
        row = [shape, "yes" if r.get("causal") else "no"]
        if several_threads:
            row.append(str(r.get("threads")))
        if r.get("error"):
            row += [f"error: {r['error']}", ""] + \
                [""] * ((2 if has_peak else 0) + (1 if f32 else 0) + len(compare))
        else:
            eff = r.get("efficiency")
            row += [fmt_ms(r["median_ms"]),
                    f"{100 * eff:.1f}" if isinstance(eff, (int, float)) else "–"]
            if has_peak:
                pct = lambda v: f"{100 * v:.1f}" if isinstance(v, (int, float)) else "–"
                row += [pct(r.get("peak_fraction")), pct(fastest_f32_peer_peak(r))]
            if f32:
                base = f32_ms.get(case_key(r))
                row.append(f"{base / r['median_ms']:.2f}×" if base else "–")
            row += [peer_cell(r, p) for p in compare]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def fastest_f32_peer_cell(result):
    """The smallest ratio among the f32 peers that ran and agreed, with the peer's name."""
    best = None
    for name, p in (result.get("peers") or {}).items():
        ratio = p.get("ratio")
        if p.get("precision") == "f32" and p.get("agrees") and isinstance(ratio, (int, float)):
            if best is None or ratio < best[0]:
                best = (ratio, name)
    return f"{best[0]:.2f}× {best[1]}" if best else "–"


def compact_table(doc):
    """One row per shape (and thread count): non-causal then causal, mha ms and the fastest f32
    peer's ratio."""
    rows, order = {}, []
    for r in doc["results"]:
        key = case_key(dict(r, causal=False))
        if key not in rows:
            rows[key] = {}
            order.append(key)
        rows[key][bool(r.get("causal"))] = r
    several_threads = len({r.get("threads") for r in doc["results"]}) > 1
    titles = ["(B, L, E, H)"] + (["threads"] if several_threads else []) + \
        ["mha ms", "fastest f32 peer / mha", "causal: mha ms", "fastest f32 peer / mha"]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for key in order:
        cases = rows[key]
        any_case = next(iter(cases.values()))
        row = [f"({any_case['batch']}, {any_case['seq']}, {any_case['embed']}, "
               f"{any_case['heads']})"]
        if several_threads:
            row.append(str(any_case.get("threads")))
        for causal in (False, True):
            r = cases.get(causal)
            if r is None:
                row += ["–", "–"]
            elif r.get("error"):
                row += [f"error: {r['error']}", ""]
            else:
                row += [fmt_ms(r["median_ms"]), fastest_f32_peer_cell(r)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def decode_machine_line(h):
    read = h.get("read_gbs") or {}
    bandwidth = ", ".join(f"{gbs:.1f} GB/s on {t} thread(s)" for t, gbs in sorted(read.items()))
    parts = [f"**{h.get('cpu', 'unknown CPU')}**", f"SIMD target {h.get('simd_target', '?')}",
             f"mha {h.get('mha_version', '?')}", f"streaming read bandwidth {bandwidth or '?'}"]
    if h.get("compute") == "bf16":
        parts.append(f"--compute bf16 ({h.get('bf16_kernel', '?')} kernel)")
    return " · ".join(parts)


def decode_table(doc):
    results = doc["results"]
    compare = doc["header"].get("compare", [])
    several_threads = len({r.get("threads") for r in results}) > 1
    titles = ["context", "batch", "kv heads", "cache"] + \
        (["threads"] if several_threads else []) + \
        ["ms / step", "tokens/s", "cache MiB", "read %", "+weights %", "attn %"] + \
        [DECODE_PEER_TITLES.get(p, p) for p in compare]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for r in results:
        row = [str(r["context"]), str(r["batch"]), str(r["kv_heads"]), r["cache_dtype"]]
        if several_threads:
            row.append(str(r.get("threads")))
        if r.get("error"):
            row += [f"error: {r['error']}"] + [""] * (5 + len(compare))
        else:
            pct = lambda key: f"{100 * r[key]:.0f}" if isinstance(r.get(key), (int, float)) \
                else "–"
            row += [f"{r['median_ms']:.3f}", f"{r['tokens_per_s']:.0f}",
                    f"{r['cache_bytes'] / 2**20:.1f}", pct("read_ratio"),
                    pct("total_read_ratio"), pct("attn_read_ratio")]
            row += [peer_cell(r, p) for p in compare]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def prefill_table(doc):
    rows = doc.get("prefill") or []
    if not rows:
        return []
    several_threads = len({r.get("threads") for r in rows}) > 1
    titles = ["T", "batch", "E", "heads", "kv heads"] + \
        (["threads"] if several_threads else []) + \
        ["Step ms (prefill)", "Forward ms (causal)", "Step / Forward"]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for r in rows:
        row = [str(r[k]) for k in ("tokens", "batch", "embed", "heads", "kv_heads")]
        if several_threads:
            row.append(str(r.get("threads")))
        if r.get("error"):
            row += [f"error: {r['error']}", "", ""]
        else:
            row += [fmt_ms(r["step_ms"]), fmt_ms(r["forward_ms"]), f"{r['ratio']:.2f}×"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def render(docs, command, f32=None, compact=False):
    out = []
    for doc in docs:
        h = doc["header"]
        if h.get("mode") == "decode":
            out.append(decode_machine_line(h) + "  ")
            peers = peers_line(h, DECODE_PEER_TITLES)
            if peers:
                out.append(peers + "  ")
                out.append("Peer columns: the peer's f32 decode step time over mha's step time "
                           "of the row (above 1×: mha is faster; the bf16 and i8 rows against the "
                           "same f32 peer time; (!): its output disagreed with mha's).")
            out += [""] + decode_table(doc) + [""]
            prefill = prefill_table(doc)
            if prefill:
                out += ["Prefill: `KvCache::Step` of T prompt tokens into an empty f32 cache "
                        "against `Forward` with causal of the same shape (medians, alternating):",
                        ""] + prefill + [""]
            continue
        out.append(machine_line(h) + "  ")
        peers = peers_line(h)
        if compact and h.get("compute") != "bf16":
            out += [peers + " Each ratio: that peer's time over mha's (above 1×: mha is faster).",
                    ""] + compact_table(doc) + [""]
            continue
        if peers:
            out.append(peers + "  ")
            out.append("Peer columns: the peer's time over mha's (above 1×: mha is faster; "
                       "(!): its output disagreed with mha's).")
        if f32 and h.get("compute") == "bf16":
            out.append("f32 / bf16: mha's f32 time (the same suite run with --compute f32) over "
                       "its bf16 time.")
        out.append("")
        out += table(doc, f32 if h.get("compute") == "bf16" else None)
        out.append("")
    if command:
        out += ["Made with:", "", "    " + command, ""]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description="mha-bench --json files -> markdown tables.")
    ap.add_argument("json", nargs="+", help="mha-bench --json output files")
    ap.add_argument("--command", default="", help="the command that made the files (printed)")
    ap.add_argument("--f32", default="",
                    help="for --compute bf16 files: the f32 run of the same suite (adds f32 / bf16)")
    ap.add_argument("--compact", action="store_true",
                    help="forward f32 files: one row per shape, its non-causal and causal cases "
                         "against the fastest f32 peer")
    args = ap.parse_args()
    sys.stdout.write(render([load(p) for p in args.json], args.command,
                            load(args.f32) if args.f32 else None, args.compact))
    return 0


if __name__ == "__main__":
    sys.exit(main())
