#!/usr/bin/env python3
"""Plots an mha-bench JSON report: GFLOP/s (or latency) against sequence length.

    /usr/bin/python3 tools/plot_bench.py bench.json -o bench.png [--metric gflops|latency]

Input: {"header": {...}, "results": [{"batch", "seq", "kv_seq", "embed", "heads", "causal",
"need_weights", "threads", "median_ms", "p10_ms", "p90_ms", "gflops", "efficiency",
"peers": {"torch": {"median_ms", ...}, ...} (optional, from --compare)}, ...]}. Results
carrying an "error" are skipped.

One line per series (embed, heads, causal), plus batch, kv_seq (cross-attention), need_weights
and threads when those vary across the file. mha is drawn solid with markers; where the results
carry a torch peer time (--compare torch), PyTorch is drawn dashed in the same colour (its GFLOP/s is mha's FLOP
count divided by its time). --metric latency plots the median in ms with a p10..p90 band for mha.
The sequence axis is log2; latency is log-scale, GFLOP/s linear from 0. Needs matplotlib (python3-matplotlib); runs
headless (Agg backend).
"""

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def as_int(v):
    return int(v)  # JSON may carry booleans (causal) or numbers


def series_fields(results):
    """The fields that name a series: always embed, heads, causal; batch, cross-attention,
    need_weights and threads only when they vary."""
    fields = ["embed", "heads", "causal"]
    for f in ("batch", "need_weights", "threads"):
        if len({as_int(r.get(f, 0)) for r in results}) > 1:
            fields.append(f)
    if len({as_int(r["kv_seq"]) == as_int(r["seq"]) for r in results}) > 1:
        fields.append("cross")
    elif any(as_int(r["kv_seq"]) != as_int(r["seq"]) for r in results):
        # every case is cross-attention: kv_seq may still vary
        if len({as_int(r["kv_seq"]) for r in results}) > 1:
            fields.append("kv_seq")
    return fields


def key_of(r, fields):
    out = []
    for f in fields:
        if f == "cross":
            out.append(as_int(r["kv_seq"]) != as_int(r["seq"]))
        else:
            out.append(as_int(r[f]))
    return tuple(out)


def label_of(key, fields):
    parts = []
    for f, v in zip(fields, key):
        if f == "embed":
            parts.append(f"E={v}")
        elif f == "heads":
            parts.append(f"H={v}")
        elif f == "causal":
            parts.append("causal" if v else "full")
        elif f == "batch":
            parts.append(f"B={v}")
        elif f == "need_weights":
            parts.append("weights" if v else "no weights")
        elif f == "threads":
            parts.append(f"{v} thr")
        elif f == "cross":
            parts.append("cross" if v else "self")
        elif f == "kv_seq":
            parts.append(f"S={v}")
    return " ".join(parts)


def header_line(header):
    items = []
    for k in ("cpu", "simd_target", "mha_version", "date"):
        if header.get(k):
            items.append(str(header[k]))
    torch_version = (header.get("peers", {}).get("torch") or {}).get("version")
    if torch_version:
        items.append("torch " + torch_version)
    if header.get("threads"):
        t = header["threads"]
        items.append("threads " + (",".join(map(str, t)) if isinstance(t, list) else str(t)))
    line = " | ".join(items)
    return line if len(line) <= 110 else line[:107] + "..."


def main():
    ap = argparse.ArgumentParser(description="Plot an mha-bench JSON report to a PNG.")
    ap.add_argument("json", help="mha-bench --json output")
    ap.add_argument("-o", "--output", default=None, help="PNG path (default: <json>.png)")
    ap.add_argument("--metric", choices=("gflops", "latency"), default="gflops")
    ap.add_argument("--title", default=None)
    ap.add_argument("--no-torch", action="store_true", help="do not draw the PyTorch lines")
    args = ap.parse_args()

    with open(args.json) as f:
        doc = json.load(f)
    header = doc.get("header", {})
    results = [r for r in doc.get("results", []) if not r.get("error")]
    if not results:
        sys.exit(f"{args.json}: no successful results to plot")
    output = args.output or (args.json[:-5] if args.json.endswith(".json") else args.json) + ".png"

    fields = series_fields(results)
    series = {}
    for r in results:
        series.setdefault(key_of(r, fields), []).append(r)

    fig, ax = plt.subplots(figsize=(10, 6), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    any_torch = False
    for i, key in enumerate(sorted(series)):
        rows = sorted(series[key], key=lambda r: as_int(r["seq"]))
        color = colors[i % len(colors)]
        label = label_of(key, fields)
        x = [as_int(r["seq"]) for r in rows]
        if args.metric == "gflops":
            y = [r["gflops"] for r in rows]
        else:
            y = [r["median_ms"] for r in rows]
            ax.fill_between(x, [r["p10_ms"] for r in rows], [r["p90_ms"] for r in rows],
                            color=color, alpha=0.15, linewidth=0)
        ax.plot(x, y, "-o", color=color, markersize=4, label=f"mha {label}")
        for r in rows:
            r["torch_median_ms"] = ((r.get("peers") or {}).get("torch") or {}).get("median_ms")
        torch_rows = [r for r in rows if r["torch_median_ms"]]
        if torch_rows and not args.no_torch:
            any_torch = True
            tx = [as_int(r["seq"]) for r in torch_rows]
            if args.metric == "gflops":
                ty = [r["gflops"] * r["median_ms"] / r["torch_median_ms"] for r in torch_rows]
            else:
                ty = [r["torch_median_ms"] for r in torch_rows]
            ax.plot(tx, ty, "--s", color=color, markersize=3, alpha=0.8,
                    label=f"torch {label}")

    ax.set_xscale("log", base=2)
    if args.metric == "latency":
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length (queries)")
    ax.set_ylabel("GFLOP/s" if args.metric == "gflops" else "median latency (ms)")
    title = args.title or ("mha" + (" vs PyTorch" if any_torch else "") +
                           (": throughput" if args.metric == "gflops" else ": latency"))
    ax.set_title(title + "\n" + header_line(header), fontsize=10)
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
    xs = sorted({as_int(r["seq"]) for r in results})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in xs])
    ax.legend(fontsize=8, ncol=2 if len(series) > 4 else 1)
    fig.tight_layout()
    fig.savefig(output)
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
