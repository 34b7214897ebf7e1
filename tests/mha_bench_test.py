#!/usr/bin/env python3
"""The command-line contract of mha-bench: argument errors (one line on stderr, exit code 2),
--help/--version, the --json and --csv schemas with sane values for a tiny custom case, and the
--trace file (valid Chrome trace JSON, one thread_name lane per worker, "X" events named after
the operator's stages), --compare with a stand-in peer script (MHA_BENCH_PEER_SCRIPT, so no peer
library is needed) and, where Debian's torch is installed, with tools/peers.py's torch peer, and
the --decode suite (its arguments, table, JSON and CSV, its prefill rows, and --compare ort,sdpa
with a stand-in decode peer that recomputes mha's step from the data file, and with the real
peers where the peers venv exists, or their notes where it does not). Never asserts a time,
only that times are positive and ordered.

    /usr/bin/python3 tests/mha_bench_test.py build/tools/mha-bench

Registered from tools/meson.build (suite 'tools').
"""

import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

BENCH = None  # path of the mha-bench executable, from argv[1]
# Under a cross build meson runs tests through an emulator (qemu) and says so here.
WRAPPER = shlex.split(os.environ.get("MESON_EXE_WRAPPER", ""))

# The tiny custom case of the schema tests; min-time/min-runs/sgemm-size keep it fast.
TINY = ["--batch", "1", "--seq", "8", "--embed", "16", "--heads", "2", "--min-time", "0.01",
        "--min-runs", "2", "--sgemm-size", "64"]

STAGES = {"qkv_projection", "scores", "softmax", "pv", "out_projection", "average_weights"}

RESULT_FIELDS = {"batch", "seq", "kv_seq", "embed", "heads", "causal", "need_weights",
                 "threads", "median_ms", "p10_ms", "p90_ms", "runs", "gflops", "efficiency",
                 "sgemm_gflops", "fma_peak_gflops", "peak_fraction", "workspace_bytes",
                 "arena_high_water", "peak_rss_mib", "max_abs_err", "rows_checked"}
HEADER_FIELDS = {"cpu", "simd_target", "blas_arch", "threads", "mha_version", "sgemm_gflops",
                 "sgemm_arch", "fma_peak_gflops", "date", "rounds"}
ROUND_FIELDS = {"sgemm_gflops", "runs", "median_ms", "gflops", "efficiency", "fma_peak_gflops",
                "peak_fraction"}
# Peer ratios are written with 4 decimals: a small ratio (a slow mha case under the sanitizers
# against a fast stand-in peer) is off by up to this much from the quotient of the written times.
RATIO_ROUNDING = 5e-5


def peers_venv_exists():
    """Whether mha-bench finds the peers' venv (tools/dev peers) beside its build or the
    source tree's build/."""
    build = os.path.dirname(os.path.dirname(BENCH))
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return any(os.access(os.path.join(d, "peers-venv", "bin", "python"), os.X_OK)
               for d in (build, os.path.join(source, "build")))


def run(args, timeout=240):
    return subprocess.run(WRAPPER + [BENCH] + args, capture_output=True, text=True, timeout=timeout)


def version_fields():
    """mha-bench --version's "name: value" lines as a dict (what this build and CPU can do)."""
    p = run(["--version"], timeout=60)
    if p.returncode != 0:
        raise AssertionError("mha-bench --version: exit status %d: %s" % (p.returncode, p.stderr))
    return dict(line.split(": ", 1) for line in p.stdout.splitlines() if ": " in line)


def run_json(test, args, timeout=240):
    """mha-bench with `args` and --json; `test` asserts exit status 0; the process and the
    document."""
    with tempfile.TemporaryDirectory() as tmp:
        jpath = os.path.join(tmp, "d.json")
        p = run(args + ["--json", jpath], timeout=timeout)
        test.assertEqual(p.returncode, 0, p.stderr)
        with open(jpath) as f:
            return p, json.load(f)


class ArgumentErrors(unittest.TestCase):
    # (arguments, text the one-line message must contain)
    CASES = [
        (["--threads", "0"], "--threads"),
        (["--threads", "1,,2"], "--threads"),
        (["--threads", "2,2"], "--threads"),
        (["--threads", "x"], "--threads"),
        (["--seq", "-3"], "--seq"),
        (["--seq", "0"], "--seq"),
        (["--batch", "99999999999999999999999"], "--batch"),
        (["--embed", "100", "--heads", "3"], "divisible"),
        (["--embed", "1.5"], "--embed"),
        (["--kv-seq", ""], "--kv-seq"),
        (["--bogus"], "unknown flag '--bogus'"),
        (["stray"], "unexpected argument 'stray'"),
        (["--min-time", "abc"], "--min-time"),
        (["--min-time", "-1"], "--min-time"),
        (["--min-time", "nan"], "--min-time"),
        (["--min-runs", "0"], "--min-runs"),
        (["--rounds", "0"], "--rounds"),
        (["--rounds", "101"], "--rounds"),
        (["--rounds", "two"], "--rounds"),
        (["--sgemm-size", "-1"], "--sgemm-size"),
        (["--tolerance", "x"], "--tolerance"),
        (["--seq"], "--seq: expected a value"),
        (["--causal=yes"], "--causal"),
        (["--json", ""], "--json"),
        (["--json", "/nonexistent-dir/x.json", "--seq", "8", "--embed", "16", "--heads", "2"],
         "--json"),
        (["--batch", "65536", "--seq", "65536", "--embed", "1024", "--heads", "8"], "2^31"),
        (["--compare", "bogus"], "--compare: expected a comma-separated list of torch, sdpa"),
        (["--compare", ""], "--compare"),
        (["--compare", "torch,,ort"], "--compare"),
        (["--compare", "torch,onnx"], "'onnx' in 'torch,onnx'"),
        (["--compare"], "--compare: expected a value"),
        (["--compare-torch=1"], "--compare-torch"),
        (["--decode", "--compare", "torch"],
         "--decode: expected --compare peers among ort, ort-int8, sdpa, openvino, "
         "openvino-int8, ggml"),
        (["--compare", "ggml"], "--compare: ggml times only a decode step"),
        (["--compare", "torch,ort-int8"], "--compare: ort-int8 times only a decode step"),
        (["--compare", "openvino-int8"], "--compare: openvino-int8 times only a decode step"),
        (["--decode", "--compare", "ort,openvino-bf16"], "'openvino-bf16'"),
        (["--decode", "--compare-torch"], "--decode"),
        (["--prefill", "512"], "--prefill: expected --decode as well"),
        (["--decode", "--prefill", "0"], "--prefill"),
        (["--decode", "--prefill", "64,64"], "--prefill"),
        (["--decode", "--prefill", "all"], "--prefill"),
    ]

    def test_bad_arguments_exit_2_with_one_line(self):
        for args, needle in self.CASES:
            with self.subTest(args=args):
                p = run(args, timeout=60)
                self.assertEqual(p.returncode, 2, p.stderr)
                lines = p.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, p.stderr)
                self.assertTrue(lines[0].startswith("mha-bench: "), lines[0])
                self.assertIn(needle, lines[0])
                self.assertEqual(p.stdout, "")

    def test_messages_name_expected_and_actual(self):
        p = run(["--threads", "0"])
        self.assertIn("expected", p.stderr)
        self.assertIn("'0'", p.stderr)
        p = run(["--embed", "100", "--heads", "3"])
        self.assertIn("100", p.stderr)
        self.assertIn("3", p.stderr)
        p = run(["--min-time", "abc"])
        self.assertIn("'abc'", p.stderr)


class HelpAndVersion(unittest.TestCase):
    def test_help_documents_flags_and_formula(self):
        p = run(["--help"])
        self.assertEqual(p.returncode, 0)
        for flag in ["--batch", "--seq", "--kv-seq", "--embed", "--heads", "--causal",
                     "--need-weights", "--threads", "--min-time", "--min-runs", "--breakdown",
                     "--json", "--csv", "--trace", "--compare-torch", "--version",
                     "--sgemm-size", "--tolerance", "--seed", "--rounds", "--compare LIST",
                     "MHA_BENCH_PEER_SCRIPT", "MHA_BENCH_PEER_PYTHON", "tools/dev peers",
                     "is_causal=True", "unidirectional", "ScaledDotProductAttention",
                     "INFERENCE_PRECISION_HINT", "openvino-bf16", "5e-2"]:
            self.assertIn(flag, p.stdout)
        self.assertIn("2*N*(L*q_dim*A + S*kdim*kvE + S*vdim*kvE + L*A*E)", p.stdout)
        self.assertIn("4*N*L*S*A, halved when causal", p.stdout)

    def test_sgemm_probe(self):
        # The child side of the skx baseline: "<GFLOP/s> <BLIS arch>", usage errors exit 2.
        p = run(["--sgemm-probe", "64", "1"])
        self.assertEqual(p.returncode, 0, p.stderr)
        gflops, arch = p.stdout.split()
        self.assertGreater(float(gflops), 0)
        self.assertTrue(arch)
        self.assertEqual(run(["--sgemm-probe", "0", "1"]).returncode, 2)

    def test_version(self):
        p = run(["--version"])
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"mha \d+\.\d+\.\d+")
        self.assertIn("SIMD target:", p.stdout)
        self.assertIn("BLIS arch:", p.stdout)
        self.assertRegex(p.stdout, r"(?m)^f32 prepacking: (yes|no)$")
        self.assertRegex(p.stdout,
                         r"(?m)^int8 kernel: (avx512_vnni|avx2|neon_dotprod|portable)$")


class Outputs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = cls.dir.name
        cls.json_path = os.path.join(d, "r.json")
        cls.csv_path = os.path.join(d, "r.csv")
        cls.trace_path = os.path.join(d, "t.json")
        cls.proc = run(TINY + ["--threads", "1,2", "--rounds", "3", "--breakdown", "--json",
                               cls.json_path, "--csv", cls.csv_path, "--trace", cls.trace_path])

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_exit_and_table(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        out = self.proc.stdout
        for text in ["CPU:", "SIMD:", "BLIS:", "mha 0.", "median_ms", "GFLOP/s", "max_err",
                     "Breakdown", "BLIS sgemm 64^3"]:
            self.assertIn(text, out)
        # Progress lines are for terminals only: the captured stderr stays empty.
        self.assertNotIn("\r", self.proc.stderr)

    def test_json_schema_and_values(self):
        with open(self.json_path) as f:
            doc = json.load(f)
        self.assertEqual(set(doc), {"header", "results"})
        header = doc["header"]
        self.assertNotIn("compare", header)
        self.assertNotIn("peers", header)
        self.assertTrue(HEADER_FIELDS <= set(header), set(header))
        self.assertEqual(header["threads"], [1, 2])
        self.assertEqual(set(header["sgemm_gflops"]), {"1", "2"})
        for g in header["sgemm_gflops"].values():
            self.assertGreater(g, 0)
        # The baseline's BLIS configuration: BLIS's own, or skx on an AVX-512 target (measured
        # by a child process), named in the table's header too.
        expected = {header["blas_arch"]}
        if header["simd_target"].startswith("AVX3"):
            expected.add("skx")
        self.assertIn(header["sgemm_arch"], expected)
        self.assertIn("BLIS sgemm 64^3 (%s kernels" % header["sgemm_arch"], self.proc.stdout)
        # The multiply-add peak: per thread count, measured with the baseline, named with the
        # dispatched target.
        self.assertEqual(set(header["fma_peak_gflops"]), {"1", "2"})
        for g in header["fma_peak_gflops"].values():
            self.assertGreater(g, 0)
        self.assertIn("multiply-add peak (%s, 12 chains" % header["simd_target"], self.proc.stdout)
        self.assertIn("peak%", self.proc.stdout)
        self.assertRegex(header["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        results = doc["results"]
        self.assertEqual([r["threads"] for r in results], [1, 2])
        for r in results:
            self.assertTrue(RESULT_FIELDS | {"breakdown"} <= set(r), set(r))
            self.assertNotIn("peers", r)
            self.assertEqual((r["batch"], r["seq"], r["kv_seq"], r["embed"], r["heads"]),
                             (1, 8, 8, 16, 2))
            self.assertIs(r["causal"], False)
            self.assertIs(r["need_weights"], False)
            self.assertGreater(r["median_ms"], 0)
            self.assertLessEqual(r["p10_ms"], r["median_ms"])
            self.assertLessEqual(r["median_ms"], r["p90_ms"])
            self.assertGreaterEqual(r["runs"], 2)
            self.assertGreater(r["gflops"], 0)
            self.assertGreater(r["efficiency"], 0)
            self.assertGreater(r["sgemm_gflops"], 0)
            # Three rounds, each a baseline and at least ceil(2 / 3) = 1 run of mha; together
            # they hold every run. The case's efficiency and sgemm are the rounds' medians.
            rounds = r["rounds"]
            self.assertEqual(len(rounds), 3)
            self.assertEqual(sum(rr["runs"] for rr in rounds), r["runs"])
            for rr in rounds:
                self.assertEqual(set(rr), ROUND_FIELDS)
                self.assertGreaterEqual(rr["runs"], 1)
                self.assertGreater(rr["median_ms"], 0)
                self.assertGreater(rr["sgemm_gflops"], 0)
                # gflops and sgemm_gflops are rounded to 3 decimals and efficiency to 5: under
                # an emulator both throughputs are small, so compare the product, not the
                # quotient.
                self.assertLessEqual(abs(rr["efficiency"] * rr["sgemm_gflops"] - rr["gflops"]),
                                     1e-3 * (1 + rr["efficiency"]) + 1e-5 * rr["sgemm_gflops"])
                self.assertGreater(rr["fma_peak_gflops"], 0)
                self.assertLessEqual(
                    abs(rr["peak_fraction"] * rr["fma_peak_gflops"] - rr["gflops"]),
                    1e-3 * (1 + rr["peak_fraction"]) + 1e-5 * rr["fma_peak_gflops"])
            for key in ("efficiency", "sgemm_gflops", "fma_peak_gflops", "peak_fraction"):
                self.assertEqual(r[key], sorted(rr[key] for rr in rounds)[1], key)
            self.assertGreater(r["workspace_bytes"], 0)
            self.assertGreaterEqual(r["arena_high_water"], r["workspace_bytes"] // 2)
            self.assertGreater(r["peak_rss_mib"], 0)
            self.assertLess(r["max_abs_err"], 1e-3)
            self.assertEqual(r["rows_checked"], 8)
            b = r["breakdown"]
            for stage in STAGES:
                self.assertGreaterEqual(b[stage + "_ms"], 0)
            self.assertGreater(b["qkv_projection_ms"], 0)
            self.assertGreater(b["wall_ms"], 0)
            self.assertIn("scheduling_overhead_ms", b)
            self.assertEqual(b["dropped_events"], 0)

    def test_csv_columns_match_json(self):
        with open(self.csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        with open(self.json_path) as f:
            results = json.load(f)["results"]
        self.assertEqual(len(rows), len(results))
        columns = set(rows[0])
        self.assertTrue(RESULT_FIELDS <= columns, columns)
        for stage in STAGES:
            self.assertIn("breakdown_" + stage + "_ms", columns)
        for row, r in zip(rows, results):
            for key in RESULT_FIELDS - {"causal", "need_weights"}:
                self.assertAlmostEqual(float(row[key]), float(r[key]), places=6, msg=key)
            self.assertEqual(row["error"], "")

    def test_trace_lanes_and_events(self):
        with open(self.trace_path) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        lanes = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
        # The trace is the first case's first thread count (1 here): one lane.
        self.assertEqual(sorted(e["tid"] for e in lanes), [0])
        xs = [e for e in events if e["ph"] == "X"]
        self.assertGreater(len(xs), 0)
        for e in xs:
            self.assertIn(e["name"], STAGES)
            self.assertEqual(e["pid"], 1)
            self.assertGreaterEqual(e["ts"], 0)
            self.assertGreaterEqual(e["dur"], 0)
            self.assertEqual(set(e["args"]), {"batch", "head", "block"})


class TraceTwoWorkers(unittest.TestCase):
    def test_one_lane_per_worker(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            p = run(TINY + ["--threads", "2", "--trace", path])
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(path) as f:
                doc = json.load(f)
        events = doc["traceEvents"]
        lanes = {e["tid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        self.assertEqual(lanes, {0: "worker 0", 1: "worker 1"})
        xs = [e for e in events if e["ph"] == "X"]
        self.assertTrue({e["name"] for e in xs} <= STAGES)
        self.assertIn("qkv_projection", {e["name"] for e in xs})
        self.assertTrue(all(e["tid"] in (0, 1) for e in xs))


class OtherShapes(unittest.TestCase):
    def test_cross_attention_causal_with_weights(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            p = run(["--batch", "2", "--seq", "5", "--kv-seq", "7", "--embed", "24", "--heads",
                     "3", "--causal", "--need-weights", "--threads", "2", "--min-time", "0",
                     "--min-runs", "2", "--sgemm-size", "0", "--json", path])
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(path) as f:
                doc = json.load(f)
        (r,) = doc["results"]
        self.assertEqual((r["batch"], r["seq"], r["kv_seq"], r["causal"], r["need_weights"]),
                         (2, 5, 7, True, True))
        # No sgemm baseline, and no multiply-add peak either.
        for key in ("efficiency", "sgemm_gflops", "fma_peak_gflops", "peak_fraction"):
            self.assertIsNone(r[key], key)
        self.assertEqual(len(r["rounds"]), 3)  # the default
        for rr in r["rounds"]:
            for key in ("efficiency", "sgemm_gflops", "fma_peak_gflops", "peak_fraction"):
                self.assertIsNone(rr[key], key)
        self.assertEqual(doc["header"]["sgemm_gflops"], {})
        self.assertEqual(doc["header"]["fma_peak_gflops"], {})
        self.assertLess(r["max_abs_err"], 1e-3)

    def test_header_says_how_the_weights_are_held(self):
        # The header's "weights:" follows what the configuration resolves to: prepacked only
        # where --version says f32 prepacking works here, bf16 packing with --compute bf16.
        prepacking = version_fields().get("f32 prepacking")
        self.assertIn(prepacking, ("yes", "no"))
        args = ["--seq", "8", "--embed", "32", "--heads", "2", "--threads", "1", "--min-time", "0",
                "--min-runs", "1", "--rounds", "1", "--sgemm-size", "0"]
        expected = {(): "prepacked at creation" if prepacking == "yes" else "kept as stored",
                    ("--no-prepack",): "not prepacked (--no-prepack)",
                    ("--compute", "bf16"): "packed as bf16 at creation (--compute bf16)"}
        for extra, phrase in expected.items():
            with self.subTest(extra=extra):
                p, doc = run_json(self, args + list(extra), timeout=120)
                self.assertIn("weights: " + phrase, p.stdout)
                self.assertEqual(doc["header"]["f32_prepacking"], prepacking == "yes")
                self.assertEqual(doc["header"]["weights_dtype"], "f32")

    def test_group_environment(self):
        # MHA_GROUP_ROWS / MHA_GROUP_MAX_KIB (runtime/forward_plan.h): 8 entries of 16 tokens in
        # groups of 2 on one thread take one group's buffers instead of all 8 entries'; 0 turns
        # the grouped forward off; a value that is no number is reported and ignored.
        # The forward groups only over prepacked f32 weights: where mha-bench --version says
        # "f32 prepacking: no" (Debian's arm64 BLIS) it never groups, and the arena is the same.
        prepacking = version_fields().get("f32 prepacking")
        self.assertIn(prepacking, ("yes", "no"))
        args = ["--batch", "8", "--seq", "16", "--embed", "64", "--heads", "2", "--threads", "1",
                "--min-time", "0", "--min-runs", "1", "--rounds", "1", "--sgemm-size", "0"]

        def arena(env):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "r.json")
                p = subprocess.run(WRAPPER + [BENCH] + args + ["--json", path],
                                   capture_output=True, text=True, timeout=120,
                                   env=dict(os.environ, **env))
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(path) as f:
                    (r,) = json.load(f)["results"]
            return r["arena_high_water"], p.stderr

        staged, _ = arena({"MHA_GROUP_ROWS": "0"})
        grouped, _ = arena({"MHA_GROUP_ROWS": "32", "MHA_GROUP_MAX_KIB": "65536"})
        if prepacking == "yes":
            self.assertLess(grouped, staged)
        else:
            self.assertEqual(grouped, staged)
        _, err = arena({"MHA_GROUP_ROWS": "many"})
        self.assertIn("MHA_GROUP_ROWS=many", err)
        self.assertIn("ignored", err)

    def test_error_above_tolerance_exits_3(self):
        # f32 results never match the double reference exactly on every element, so a zero
        # tolerance must fail the run (exit 3) after still printing the row.
        p = run(TINY + ["--threads", "1", "--tolerance", "0"])
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("exceeds the tolerance", p.stderr)
        self.assertIn("max_err", p.stdout)


# A stand-in for tools/peers.py: checks the data file mha-bench hands it (tensor names and
# shapes from the safetensors header), logs its call, and answers per peer as the real script
# can: torch agrees, sdpa disagrees, ort is unavailable (asked once), openvino prints nothing,
# openvino-bf16 agrees within the bf16 bound.
FAKE_PEERS = r"""
import json, os, struct, sys
args = sys.argv[1:]
arg = lambda name: args[args.index(name) + 1]
peer = arg("--peer")
b, l, s, e, h, c, nw = (int(x) for x in arg("--case").split(","))
with open(arg("--data"), "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
want = {"in_proj_weight": [3 * e, e], "in_proj_bias": [3 * e], "out_proj.weight": [e, e],
        "out_proj.bias": [e], "query": [b, l, e], "output": [b, l, e]}
if s != l:
    want.update({"key": [b, s, e], "value": [b, s, e]})
data_ok = shapes == want and all(v["dtype"] == "F32" for k, v in header.items()
                                 if k != "__metadata__")
with open(os.environ["FAKE_PEERS_LOG"], "a") as f:
    f.write(json.dumps({"peer": peer, "args": args, "data_ok": data_ok,
                        "python": sys.executable}) + "\n")
timed = lambda ms, err, precision: print(json.dumps(
    {"peer": peer, "version": "fake-" + peer, "precision": precision, "median_ms": ms,
     "p10_ms": ms * 0.9, "p90_ms": ms * 1.1, "runs": 7, "max_abs_err": err}))
if peer == "torch":
    print("a stray line that is not JSON")
    timed(5.0, 1e-7, "f32")
elif peer == "sdpa":
    timed(2.0, 0.5, "f32")
elif peer == "ort":
    print(json.dumps({"peer": peer, "skipped": "onnxruntime cannot be imported (fake)",
                      "unavailable": True}))
elif peer == "openvino":
    sys.exit(1)
else:
    timed(1.0, 0.01, "bf16")
"""

PEER_FIELDS = {"median_ms", "p10_ms", "p90_ms", "runs", "ratio", "max_abs_err", "agrees",
               "precision", "note", "peak_fraction"}
PEERS = ["torch", "sdpa", "ort", "openvino", "openvino-bf16"]


def run_with_peers(bench_args, script, extra_env=None, timeout=120):
    """Runs mha-bench with bench_args and --json/--csv in a temporary directory (also its
    TMPDIR), `script` (text; None: mha-bench's own choice of script and interpreter) being the
    peer script this interpreter runs. Returns the process, the calls the script logged, the
    JSON document, the CSV rows and the peers' data directories left behind."""
    with tempfile.TemporaryDirectory() as d:
        log, jpath, cpath = (os.path.join(d, n) for n in ("log", "r.json", "r.csv"))
        env = dict(os.environ, FAKE_PEERS_LOG=log, TMPDIR=d)
        if script is not None:
            path = os.path.join(d, "fake.py")
            with open(path, "w") as f:
                f.write(script)
            env.update(MHA_BENCH_PEER_SCRIPT=path, MHA_BENCH_PEER_PYTHON=sys.executable)
        env.update(extra_env or {})
        p = subprocess.run(WRAPPER + [BENCH] + bench_args + ["--json", jpath, "--csv", cpath],
                           capture_output=True, text=True, timeout=timeout, env=env)
        calls, doc, rows = [], None, None
        if os.path.exists(log):
            with open(log) as f:
                calls = [json.loads(line) for line in f]
        if os.path.exists(jpath):
            with open(jpath) as f:
                doc = json.load(f)
        if os.path.exists(cpath):
            with open(cpath, newline="") as f:
                rows = list(csv.DictReader(f))
        leftovers = [n for n in os.listdir(d) if n.startswith("mha-bench-peers")]
    return p, calls, doc, rows, leftovers


class Compare(unittest.TestCase):
    """--compare through the stand-in script: one call per peer, case and thread count, right
    after that case, on the case's data; the ratio, agreement, notes and empty cells."""

    def run_fake(self, compare_args, extra_env=None):
        return run_with_peers(TINY + ["--threads", "1,2"] + compare_args, FAKE_PEERS, extra_env)

    def test_all_peers(self):
        p, calls, doc, rows, leftovers = self.run_fake(["--compare", "all"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(leftovers, [])  # the temporary data files are removed
        # ort said it is unavailable: not asked again for the second thread count.
        self.assertEqual([c["peer"] for c in calls],
                         ["torch", "sdpa", "ort", "openvino", "openvino-bf16",
                          "torch", "sdpa", "openvino", "openvino-bf16"])
        for call, threads in zip(calls, ["1"] * 5 + ["2"] * 4):
            self.assertTrue(call["data_ok"], call)
            self.assertEqual(call["python"], sys.executable)
            args = call["args"]
            self.assertEqual(args[args.index("--case") + 1], "1,8,8,16,2,0,0")
            self.assertEqual(args[args.index("--threads") + 1], threads)
            self.assertEqual(args[args.index("--min-time") + 1], "0.01")
            self.assertEqual(args[args.index("--min-runs") + 1], "2")
        # One note each: the disagreeing sdpa (per case), ort unavailable, openvino silent.
        notes = [line for line in p.stderr.splitlines() if "note" in line]
        self.assertEqual(sum("sdpa" in n and "differs" in n for n in notes), 2, p.stderr)
        self.assertEqual(sum("ort" in n and "cannot be imported" in n for n in notes), 1, p.stderr)
        self.assertEqual(sum("openvino" in n and "no result" in n for n in notes), 1, p.stderr)
        for title in ["torch_ms", "torch/mha", "sdpa_err", "openvino-bf16/mha", "fake-torch"]:
            self.assertIn(title, p.stdout)
        self.assertIn("5.0e-01!", p.stdout)  # sdpa's disagreement is marked in the table

        header = doc["header"]
        self.assertEqual(header["compare"], PEERS)
        self.assertEqual(header["peer_python"], sys.executable)
        self.assertEqual(header["peers"]["torch"], {"version": "fake-torch", "precision": "f32"})
        self.assertEqual(header["peers"]["openvino-bf16"]["precision"], "bf16")
        self.assertEqual(header["peers"]["ort"], {"version": None, "precision": None})
        for r in doc["results"]:
            peers = r["peers"]
            self.assertEqual(set(peers), set(PEERS))
            for name in PEERS:
                self.assertEqual(set(peers[name]), PEER_FIELDS, name)
            t = peers["torch"]
            self.assertEqual(t["median_ms"], 5.0)
            self.assertEqual(t["runs"], 7)
            # The JSON rounds ratios to 4 decimals (5e-5 absolute) and medians to 1 ns.
            self.assertAlmostEqual(t["ratio"], 5.0 / r["median_ms"],
                                   delta=RATIO_ROUNDING + 1e-3 * t["ratio"])
            # The same flops in the peer's 5 ms: mha's fraction of the peak over the ratio.
            self.assertAlmostEqual(t["peak_fraction"], r["peak_fraction"] * r["median_ms"] / 5.0,
                                   delta=1e-5 + 1e-3 * t["peak_fraction"])
            self.assertIs(t["agrees"], True)
            self.assertEqual(t["note"], "")
            self.assertIs(peers["sdpa"]["agrees"], False)
            self.assertIs(peers["openvino-bf16"]["agrees"], True)  # 0.01 within the bf16 bound
            for name in ("ort", "openvino"):
                self.assertIsNone(peers[name]["median_ms"])
                self.assertIsNone(peers[name]["ratio"])
                self.assertIsNone(peers[name]["agrees"])
                self.assertIsNone(peers[name]["peak_fraction"])
                self.assertNotEqual(peers[name]["note"], "")
        self.assertEqual(len(rows), 2)
        for row, r in zip(rows, doc["results"]):
            for name in PEERS:
                for suffix, key in (("_ms", "median_ms"), ("_ratio", "ratio"),
                                    ("_max_abs_err", "max_abs_err"),
                                    ("_peak_fraction", "peak_fraction")):
                    value = r["peers"][name][key]
                    self.assertEqual(row[name + suffix], "" if value is None else
                                     json.dumps(value) if isinstance(value, float) else str(value))

    def test_compare_torch_is_an_alias(self):
        p, calls, doc, _, _ = self.run_fake(["--compare-torch"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([c["peer"] for c in calls], ["torch", "torch"])
        self.assertEqual(doc["header"]["compare"], ["torch"])
        self.assertEqual(set(doc["results"][0]["peers"]), {"torch"})
        p, calls, doc, _, _ = self.run_fake(["--compare", "ort,torch", "--compare-torch"])
        self.assertEqual(doc["header"]["compare"], ["torch", "ort"])  # the table's order

    def test_cross_attention_data(self):
        with tempfile.TemporaryDirectory() as d:
            script, log = os.path.join(d, "fake.py"), os.path.join(d, "log")
            with open(script, "w") as f:
                f.write(FAKE_PEERS)
            env = dict(os.environ, MHA_BENCH_PEER_SCRIPT=script, FAKE_PEERS_LOG=log,
                       MHA_BENCH_PEER_PYTHON=sys.executable)
            p = subprocess.run(WRAPPER + [BENCH, "--seq", "5", "--kv-seq", "7", "--embed", "8",
                                          "--heads", "2", "--threads", "1", "--min-time", "0",
                                          "--sgemm-size", "0", "--compare", "torch"],
                               capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(log) as f:
                (call,) = [json.loads(line) for line in f]
        self.assertTrue(call["data_ok"], call)  # key and value [1, 7, 8] present

    def test_missing_script_is_one_note(self):
        p, calls, doc, _, _ = self.run_fake(
            ["--compare", "torch,ort"], {"MHA_BENCH_PEER_SCRIPT": "/nonexistent/peers.py"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(calls, [])
        self.assertEqual(p.stderr.count("note"), 1, p.stderr)
        self.assertIn("/nonexistent/peers.py", p.stderr)
        self.assertIn("torch_ms", p.stdout)
        for r in doc["results"]:
            self.assertIsNone(r["peers"]["torch"]["median_ms"])
            self.assertNotEqual(r["peers"]["ort"]["note"], "")

    def test_missing_python_is_one_note(self):
        p, calls, doc, _, _ = self.run_fake(
            ["--compare", "sdpa"], {"MHA_BENCH_PEER_PYTHON": "/nonexistent/python"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr.count("note"), 1, p.stderr)
        self.assertIn("/nonexistent/python", p.stderr)
        self.assertEqual(calls, [])


def system_python_has(module):
    probe = subprocess.run(["/usr/bin/python3", "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


class PeersScript(unittest.TestCase):
    """tools/peers.py itself with Debian's python3: a peer library that cannot be imported is
    reported as unavailable (a stand-in module on PYTHONPATH raises ImportError), and Debian's
    torch, where installed, agrees with mha on the data mha-bench hands it."""

    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "peers.py")

    def setUp(self):
        if not system_python_has("numpy"):
            self.skipTest("numpy is not importable by /usr/bin/python3")

    def test_unimportable_peer_is_unavailable(self):
        with tempfile.TemporaryDirectory() as d:
            for name in ("onnxruntime", "openvino"):
                os.makedirs(os.path.join(d, name))
                with open(os.path.join(d, name, "__init__.py"), "w") as f:
                    f.write("raise ImportError('not installed (stand-in)')\n")
            log = os.path.join(d, "log")
            env = dict(os.environ, PYTHONPATH=d, MHA_BENCH_PEER_PYTHON="/usr/bin/python3",
                       MHA_BENCH_PEER_SCRIPT=self.SCRIPT, FAKE_PEERS_LOG=log)
            jpath = os.path.join(d, "r.json")
            p = subprocess.run(WRAPPER + [BENCH] + TINY + ["--threads", "1", "--compare",
                                                           "ort,openvino", "--json", jpath],
                               capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(jpath) as f:
                doc = json.load(f)
        peers = doc["results"][0]["peers"]
        for name in ("ort", "openvino"):
            self.assertIsNone(peers[name]["median_ms"])
            self.assertIn("cannot be imported", peers[name]["note"])
            self.assertIn("tools/dev peers", peers[name]["note"])

    def test_decode_peer_without_its_library_is_unavailable(self):
        for peer, module, message in (
                ("ggml", "llama_cpp", "llama-cpp-python's ggml libraries cannot be loaded"),
                ("openvino", "openvino", "openvino cannot be imported")):
            with self.subTest(peer=peer):
                self.check_decode_unavailable(peer, module, message)

    def check_decode_unavailable(self, peer, module, message):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, module))
            with open(os.path.join(d, module, "__init__.py"), "w") as f:
                f.write("raise ImportError('not installed (stand-in)')\n")
            env = dict(os.environ, PYTHONPATH=d, MHA_BENCH_PEER_PYTHON="/usr/bin/python3",
                       MHA_BENCH_PEER_SCRIPT=self.SCRIPT)
            jpath = os.path.join(d, "r.json")
            p = subprocess.run(WRAPPER + [BENCH, "--decode", "--contexts", "16", "--batches", "1",
                                          "--kv-dtypes", "f32", "--threads", "1", "--min-time",
                                          "0", "--min-runs", "2", "--prefill", "none",
                                          "--compare", peer, "--json", jpath],
                               capture_output=True, text=True, timeout=240, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(jpath) as f:
                doc = json.load(f)
        self.assertEqual(len(doc["results"]), 2)  # MHA and GQA: asked once, then not run
        for r in doc["results"]:
            self.assertIsNone(r["peers"][peer]["median_ms"])
        self.assertIn(message, doc["results"][0]["peers"][peer]["note"])
        self.assertIn("tools/dev peers", doc["results"][0]["peers"][peer]["note"])
        self.assertIn("unavailable", doc["results"][1]["peers"][peer]["note"])

    def test_debian_torch_agrees_with_mha(self):
        if not system_python_has("torch"):
            self.skipTest("torch is not importable by /usr/bin/python3")
        with tempfile.TemporaryDirectory() as d:
            jpath = os.path.join(d, "r.json")
            env = dict(os.environ, MHA_BENCH_PEER_PYTHON="/usr/bin/python3",
                       MHA_BENCH_PEER_SCRIPT=self.SCRIPT)
            for shape in (["--seq", "8", "--embed", "16", "--heads", "2", "--causal"],
                          ["--seq", "5", "--kv-seq", "7", "--embed", "24", "--heads", "3",
                           "--need-weights"]):
                with self.subTest(shape=shape):
                    p = subprocess.run(
                        WRAPPER + [BENCH] + shape + ["--batch", "2", "--threads", "1",
                                                     "--min-time", "0", "--min-runs", "2",
                                                     "--sgemm-size", "0", "--compare", "torch",
                                                     "--json", jpath],
                        capture_output=True, text=True, timeout=240, env=env)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    with open(jpath) as f:
                        t = json.load(f)["results"][0]["peers"]["torch"]
                    self.assertGreater(t["median_ms"], 0, t)
                    self.assertLess(t["max_abs_err"], 1e-5)
                    self.assertIs(t["agrees"], True)
                    self.assertGreaterEqual(t["runs"], 2)


class Decode(unittest.TestCase):
    """--decode: the KV-cache decoding suite's arguments, table, JSON and CSV."""

    DECODE_FIELDS = {"context", "batch", "embed", "heads", "kv_heads", "cache_dtype", "threads",
                     "error", "runs", "median_ms", "p10_ms", "p90_ms", "tokens_per_s",
                     "cache_bytes", "weight_bytes", "cache_gbs", "total_gbs", "copy_gbs",
                     "copy_ratio", "total_copy_ratio", "weights_dtype", "attn_ms", "attn_gbs",
                     "attn_copy_ratio", "read_gbs", "read_ratio", "total_read_ratio",
                     "attn_read_ratio", "head_dim"}

    def test_argument_errors(self):
        for args, text in [(["--decode", "--causal"], "--decode"),
                           (["--decode", "--seq", "4"], "--decode"),
                           (["--decode", "--trace", "x.json"], "--decode"),
                           (["--contexts", "512"], "--contexts"),
                           (["--decode", "--contexts", "0"], "--contexts"),
                           (["--decode", "--contexts", "8,8"], "--contexts"),
                           (["--decode", "--batches", "x"], "--batches"),
                           (["--decode", "--weights-dtype", "f64"], "--weights-dtype"),
                           (["--weights-dtype", "bf16"], "--weights-dtype"),
                           (["--decode", "--weights-dtype", "q4"], "i4-128, got 'q4'"),
                           (["--decode", "--compute", "int8"],
                            "--compute: int8 multiplies quantized weights"),
                           (["--decode", "--compute", "fp8"], "f32, bf16 or int8, got 'fp8'"),
                           (["--decode", "--decode-shape", "64,3,1"], "--decode-shape"),
                           (["--decode-shape", "64,4,1"], "--decode-shape: expected --decode"),
                           (["--kv-dtypes", "f16"], "--kv-dtypes: expected --decode as well"),
                           (["--decode", "--kv-dtypes", "f32,q4"], "'f32,q4'"),
                           (["--decode", "--kv-dtypes", "bf16,f32,bf16"], "'bf16' twice")]:
            with self.subTest(args=args):
                p = run(args, timeout=60)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(text, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)

    def test_help_documents_decode(self):
        p = run(["--help"])
        for text in ["--decode", "--contexts", "--batches", "tokens/s", "copy bandwidth",
                     "read bandwidth", "int8", "AppendProjected", "--prefill LIST", "step/fwd",
                     "GroupQueryAttention", "IOBinding", "seqlens_k", "total_sequence_length",
                     "enable_gqa", "<peer>/mha"]:
            self.assertIn(text, p.stdout)

    def test_json_csv_and_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            jpath = os.path.join(tmp, "d.json")
            cpath = os.path.join(tmp, "d.csv")
            p = run(["--decode", "--contexts", "16,300", "--batches", "1,2", "--threads", "1,2",
                     "--min-time", "0", "--min-runs", "2", "--prefill", "none", "--json", jpath,
                     "--csv", cpath])
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("copy bandwidth", p.stdout)
            self.assertIn("read bandwidth", p.stdout)
            self.assertIn("read%", p.stdout)
            self.assertIn("tokens/s", p.stdout)
            self.assertIn("+weights%", p.stdout)
            with open(jpath) as f:
                doc = json.load(f)
            with open(cpath) as f:
                rows = list(csv.DictReader(f))
        self.assertEqual(doc["header"]["mode"], "decode")
        self.assertNotIn("compare", doc["header"])
        self.assertEqual(doc["prefill"], [])
        self.assertNotIn("prefill", p.stdout)
        self.assertNotIn("ort_ms", p.stdout)
        self.assertEqual(set(doc["header"]["copy_gbs"]), {"1", "2"})
        self.assertEqual(set(doc["header"]["read_gbs"]), {"1", "2"})
        results = doc["results"]
        # contexts x batches x {MHA, GQA} x {f32, bf16, i8} x threads
        self.assertEqual(len(results), 2 * 2 * 2 * 3 * 2)
        self.assertEqual(len(rows), len(results))
        seen = set()
        for r in results:
            self.assertEqual(set(r), self.DECODE_FIELDS | {"rounds"})  # JSON only: the rounds
            self.assertEqual(r["rounds"], [{"median_ms": r["median_ms"]}])  # one by default
            self.assertEqual(r["error"], "")
            self.assertGreaterEqual(r["runs"], 2)
            self.assertGreater(r["median_ms"], 0)
            self.assertLessEqual(r["p10_ms"], r["median_ms"])
            self.assertLessEqual(r["median_ms"], r["p90_ms"])
            self.assertAlmostEqual(r["tokens_per_s"], r["batch"] / (r["median_ms"] * 1e-3),
                                   delta=1e-6 * r["tokens_per_s"])
            row = {"f32": 64 * 4, "bf16": 64 * 2, "i8": 64 + 4}[r["cache_dtype"]]
            self.assertEqual(r["cache_bytes"], 2 * r["batch"] * r["kv_heads"] * r["context"] * row)
            self.assertGreater(r["copy_gbs"], 0)
            self.assertGreater(r["total_gbs"], r["cache_gbs"])
            self.assertAlmostEqual(r["total_copy_ratio"], r["total_gbs"] / r["copy_gbs"],
                                   delta=1e-9 * r["total_copy_ratio"])
            self.assertAlmostEqual(r["copy_ratio"], r["cache_gbs"] / r["copy_gbs"],
                                   delta=1e-9 * r["copy_ratio"])
            # These caches fit in any last-level cache: the divisor is the header's probe (rows
            # beyond the LLC probe again right after the case).
            self.assertGreater(r["read_gbs"], 0)
            self.assertEqual(r["read_gbs"], doc["header"]["read_gbs"][str(r["threads"])])
            for ratio, gbs in [("read_ratio", "cache_gbs"), ("total_read_ratio", "total_gbs"),
                               ("attn_read_ratio", "attn_gbs")]:
                self.assertAlmostEqual(r[ratio], r[gbs] / r["read_gbs"], delta=1e-9 * r[ratio])
            self.assertEqual(r["weights_dtype"], "f32")
            self.assertEqual(r["weight_bytes"],
                             4 * (2 * 1024 * 1024 + 2 * r["kv_heads"] * 64 * 1024))
            # The attention over the cache is part of the step (trace events inside it).
            self.assertGreater(r["attn_ms"], 0)
            self.assertLessEqual(r["attn_ms"], r["p90_ms"] * 1.001)
            self.assertAlmostEqual(r["attn_gbs"], r["cache_bytes"] / (r["attn_ms"] * 1e-3) * 1e-9,
                                   delta=1e-6 * r["attn_gbs"])
            seen.add((r["context"], r["batch"], r["kv_heads"], r["cache_dtype"], r["threads"]))
        self.assertEqual(len(seen), len(results))
        self.assertEqual({k for (_, _, k, _, _) in seen}, {16, 4})
        self.assertEqual(set(rows[0]), self.DECODE_FIELDS)

    def run_json(self, args, timeout=240):
        """mha-bench with `args` and --json; the process (exit status 0) and the document."""
        return run_json(self, args, timeout)

    def test_sixteen_bit_weights(self):
        p, doc = self.run_json(["--decode", "--contexts", "40", "--batches", "1", "--threads",
                                "1", "--min-time", "0", "--min-runs", "1", "--weights-dtype",
                                "bf16", "--prefill", "none"])
        self.assertIn("weights: bf16", p.stdout)
        results = doc["results"]
        self.assertEqual(len(results), 6)
        for r in results:
            self.assertEqual(r["weights_dtype"], "bf16")
            self.assertEqual(r["weight_bytes"],
                             2 * (2 * 1024 * 1024 + 2 * r["kv_heads"] * 64 * 1024))

    def test_quantized_weights_and_own_shape(self):
        # --decode-shape: one layer for the decode and prefill rows; quantized weights stream
        # their codes and f32 scales (i8: a byte per weight and a scale per row; i4-128: half a
        # byte per weight and a scale per 128 inputs).
        for dtype, per_row in (("i8", lambda n: n + 4), ("i4-128", lambda n: n // 2 + n // 32)):
            with self.subTest(dtype=dtype):
                p, doc = self.run_json(["--decode", "--contexts", "40", "--batches", "1",
                                        "--threads", "1", "--min-time", "0", "--min-runs", "1",
                                        "--weights-dtype", dtype, "--decode-shape", "256,4,2",
                                        "--prefill", "64", "--kv-dtypes", "f32"])
                self.assertIn("weights: " + dtype, p.stdout)
                self.assertIn("model: E 256, 4 heads of 64", p.stdout)
                results = doc["results"]
                self.assertEqual(len(results), 1)
                r = results[0]
                self.assertEqual((r["embed"], r["heads"], r["kv_heads"]), (256, 4, 2))
                self.assertEqual(r["weights_dtype"], dtype)
                self.assertEqual(r["weight_bytes"], (2 * 256 + 2 * 128) * per_row(256))
                self.assertRegex(p.stdout, r"\n\s+64\s+1\s+256\s+4\s+2\s")

    def test_int8_activations(self):
        # --compute int8: the same layer with Compute::kInt8, named in the header and the JSON.
        p, doc = self.run_json(["--decode", "--contexts", "40", "--batches", "1", "--threads",
                                "1", "--min-time", "0", "--min-runs", "1", "--weights-dtype", "i4",
                                "--compute", "int8", "--decode-shape", "256,4,2", "--prefill",
                                "64", "--kv-dtypes", "f32"])
        kernel = version_fields()["int8 kernel"]
        self.assertIn("weights: i4  |  compute: int8 activations (%s)" % kernel, p.stdout)
        self.assertEqual(doc["header"]["compute"], "int8")
        self.assertEqual(doc["header"]["int8_kernel"], kernel)
        self.assertEqual(len(doc["results"]), 1)
        self.assertEqual(doc["results"][0]["error"], "")


    def test_cache_types(self):
        # Any subset, run f32 first (the peers' rows); f16 rows read 2 bytes per element, i8
        # and i8dot (int8 with integer dot products) one and a 4-byte scale per row.
        _, doc = self.run_json(["--decode", "--contexts", "40", "--batches", "1", "--threads",
                                "1", "--min-time", "0", "--min-runs", "1", "--kv-dtypes",
                                "i8dot,f16,f32,i8", "--prefill", "none"])
        results = doc["results"]
        kinds = [(16, "f32"), (16, "f16"), (16, "i8"), (16, "i8dot")]
        self.assertEqual([(r["kv_heads"], r["cache_dtype"]) for r in results],
                         kinds + [(4, k) for _, k in kinds])
        for r in results:
            self.assertEqual(r["error"], "")
            row = {"f32": 64 * 4, "f16": 64 * 2, "i8": 64 + 4, "i8dot": 64 + 4}[r["cache_dtype"]]
            self.assertEqual(r["cache_bytes"], 2 * r["batch"] * r["kv_heads"] * r["context"] * row)

    PREFILL_FIELDS = {"tokens", "batch", "embed", "heads", "kv_heads", "threads", "error", "runs",
                      "step_ms", "step_p10_ms", "step_p90_ms", "forward_ms", "forward_p10_ms",
                      "forward_p90_ms", "ratio", "max_abs_diff"}

    def test_prefill_rows(self):
        # 8 tokens: the step runs the decode kernels; 64: the causal forward (KvCache::Prefill).
        # Under an emulator (qemu in a cross build) both paths still run, on one thread and
        # timed once after the warm-up, with a longer limit: with two thread counts and two
        # runs the rows took more than 240 s (one thread, two runs: 194 s on a loaded 2-core
        # machine, the batch-8 layer's 64-token step 19 s a call). Threads split the same code
        # natively.
        threads, min_runs = ((1,), 1) if WRAPPER else ((1, 2), 2)
        p, doc = self.run_json(["--decode", "--contexts", "16", "--batches", "1", "--threads",
                                ",".join(map(str, threads)), "--min-time", "0", "--min-runs",
                                str(min_runs), "--prefill", "8,64"],
                               timeout=600 if WRAPPER else 240)
        for text in ["prefill:", "step_ms", "forward_ms", "step/fwd", "max_diff"]:
            self.assertIn(text, p.stdout)
        rows = doc["prefill"]
        # (E, heads, kv heads, batch) x tokens x threads; the batch-8 layer too at <= 512 tokens
        shapes = [(1024, 16, 16, 1), (1024, 16, 4, 1), (768, 12, 12, 8)]
        self.assertEqual(sorted((r["embed"], r["heads"], r["kv_heads"], r["batch"], r["tokens"],
                                 r["threads"]) for r in rows),
                         sorted(s + (t, th) for s in shapes for t in (8, 64) for th in threads))
        for r in rows:
            self.assertEqual(set(r), self.PREFILL_FIELDS)
            self.assertEqual(r["error"], "")
            self.assertGreaterEqual(r["runs"], min_runs)
            for what in ("step", "forward"):
                self.assertGreater(r[what + "_ms"], 0)
                self.assertLessEqual(r[what + "_p10_ms"], r[what + "_ms"])
                self.assertLessEqual(r[what + "_ms"], r[what + "_p90_ms"])
            self.assertAlmostEqual(r["ratio"], r["step_ms"] / r["forward_ms"],
                                   delta=1e-9 * r["ratio"])
            self.assertLess(r["max_abs_diff"], 1e-4)

    def test_prefill_skips_the_batched_layer_above_512_tokens(self):
        _, doc = self.run_json(["--decode", "--contexts", "16", "--batches", "1", "--threads",
                                "1", "--min-time", "0", "--min-runs", "1", "--prefill", "513"])
        rows = doc["prefill"]
        self.assertEqual(sorted((r["embed"], r["kv_heads"], r["batch"]) for r in rows),
                         [(1024, 4, 1), (1024, 16, 1)])


# A stand-in for tools/peers.py --decode: checks the data file mha-bench hands it (names, shapes,
# dtypes), recomputes mha's decode step from it with numpy where numpy is importable (the layer,
# the cached keys/values and the token must give mha's output), logs its call, and answers as
# the real script can: ort and ggml agree (their error is the recomputation's), sdpa disagrees.
FAKE_DECODE_PEERS = r"""
import json, os, struct, sys
args = sys.argv[1:]
arg = lambda name: args[args.index(name) + 1]
peer = arg("--peer")
b, ctx, e, h, kvh = (int(x) for x in arg("--decode").split(","))
d = e // h
kve = kvh * d
path = arg("--data")
with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
want = {"q_proj_weight": [e, e], "k_proj_weight": [kve, e], "v_proj_weight": [kve, e],
        "in_proj_bias": [e + 2 * kve], "out_proj.weight": [e, e], "out_proj.bias": [e],
        "past_key": [b, kvh, ctx - 1, d], "past_value": [b, kvh, ctx - 1, d],
        "query": [b, 1, e], "output": [b, 1, e]}
data_ok = shapes == want and all(v["dtype"] == "F32" for k, v in header.items()
                                 if k != "__metadata__")
err = None
try:
    import numpy as np
except ImportError:
    np = None
if np is not None and data_ok:
    t = {}
    with open(path, "rb") as f:
        f.seek(8 + n)
        blob = f.read()
    for k, v in header.items():
        if k != "__metadata__":
            lo, hi = v["data_offsets"]
            t[k] = np.frombuffer(blob[lo:hi], np.float32).reshape(v["shape"]).astype(np.float64)
    x = t["query"][:, 0]
    bias = t["in_proj_bias"]
    q = (x @ t["q_proj_weight"].T + bias[:e]).reshape(b, h, d)
    k = (x @ t["k_proj_weight"].T + bias[e:e + kve]).reshape(b, kvh, 1, d)
    v = (x @ t["v_proj_weight"].T + bias[e + kve:]).reshape(b, kvh, 1, d)
    keys = np.concatenate([t["past_key"], k], axis=2)
    values = np.concatenate([t["past_value"], v], axis=2)
    o = np.zeros((b, h, d))
    for head in range(h):
        g = head // (h // kvh)
        s = np.einsum("bd,bpd->bp", q[:, head], keys[:, g]) / np.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        o[:, head] = np.einsum("bp,bpd->bd", p, values[:, g])
    y = o.reshape(b, e) @ t["out_proj.weight"].T + t["out_proj.bias"]
    err = float(np.max(np.abs(y - t["output"][:, 0])))
with open(os.environ["FAKE_PEERS_LOG"], "a") as f:
    f.write(json.dumps({"peer": peer, "args": args, "data_ok": data_ok, "err": err}) + "\n")
ms = {"ort": 0.5, "ort-int8": 0.25, "sdpa": 3.0, "openvino": 0.625, "openvino-int8": 0.375,
      "ggml": 0.75}[peer]
# FAKE_PEERS_ROUND_SCALES "a,b,c": the peer's time times a on its first call of a case, b on the
# second, ... (--rounds: one call per round).
scales = os.environ.get("FAKE_PEERS_ROUND_SCALES")
if scales:
    with open(os.environ["FAKE_PEERS_LOG"]) as f:
        earlier = [json.loads(line) for line in f]
    calls = sum(c["peer"] == peer and c["args"][c["args"].index("--decode") + 1] ==
                arg("--decode") for c in earlier)
    ms *= [float(x) for x in scales.split(",")][calls - 1]
quantized = "--weights" in args
precision = "int8" if peer.endswith("-int8") or (peer == "ggml" and quantized) else "f32"
print(json.dumps({"peer": peer, "version": "fake-" + peer, "precision": precision, "median_ms": ms,
                  "p10_ms": ms * 0.9, "p90_ms": ms * 1.1, "runs": 3,
                  "max_abs_err": (err or 0.0) if peer != "sdpa" else 0.5}))
"""

DECODE_PEER_FIELDS = {"median_ms", "p10_ms", "p90_ms", "runs", "ratio", "max_abs_err", "agrees",
                      "precision", "note"}


class DecodeCompare(unittest.TestCase):
    """--decode --compare: the peers get each f32 row's layer, cache, token and mha's output,
    once per (context, batch, kv heads, threads); the columns, JSON and CSV carry their times."""

    def run_decode(self, extra_args, env=None, script=FAKE_DECODE_PEERS):
        return run_with_peers(["--decode", "--contexts", "16", "--batches", "1,2", "--threads",
                               "1", "--min-time", "0", "--min-runs", "2", "--prefill", "none"] +
                              extra_args, script, env, timeout=240)

    def test_stand_in_peers(self):
        for weights in ("f32", "bf16"):
            with self.subTest(weights=weights):
                self.check_stand_in(weights)

    def check_stand_in(self, weights):
        p, calls, doc, rows, leftovers = self.run_decode(["--compare", "all",
                                                          "--weights-dtype", weights])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(leftovers, [])
        # f32 rows only: {MHA, GQA} x batches {1, 2}, each ort, sdpa, openvino, ggml ("all":
        # the decode peers but the -int8 ones, which need quantized weights).
        self.assertEqual([(c["peer"], c["args"][c["args"].index("--decode") + 1]) for c in calls],
                         [(peer, f"{b},16,1024,16,{kvh}") for kvh in (16, 4) for b in (1, 2)
                          for peer in ("ort", "sdpa", "openvino", "ggml")])
        for c in calls:
            self.assertTrue(c["data_ok"], c)
            self.assertEqual(c["args"][c["args"].index("--threads") + 1], "1")
            self.assertEqual(c["args"][c["args"].index("--min-runs") + 1], "2")
            if c["err"] is not None:  # numpy: the file's layer, cache and token give mha's output
                self.assertLess(c["err"], 1e-4, c)
        for title in ["ort_ms", "ort/mha", "sdpa_ms", "sdpa/mha", "openvino_ms", "openvino/mha",
                      "ggml_ms", "ggml/mha", "fake-ort", "fake-sdpa", "fake-openvino",
                      "fake-ggml"]:
            self.assertIn(title, p.stdout)
        table = [line for line in p.stdout.splitlines() if line.strip().startswith("16 ")]
        self.assertEqual(len(table), 12)
        for line in table:
            self.assertEqual(line.count("!"), 1, line)  # sdpa disagrees: its ratio is marked
        notes = [line for line in p.stderr.splitlines() if "note" in line]
        self.assertEqual(sum("sdpa" in n and "differs" in n for n in notes), 4, p.stderr)

        header = doc["header"]
        self.assertEqual(header["compare"], ["ort", "sdpa", "openvino", "ggml"])
        self.assertEqual(header["peer_python"], sys.executable)
        self.assertEqual(header["peers"]["ort"], {"version": "fake-ort", "precision": "f32"})
        results = doc["results"]
        self.assertEqual(len(results), 12)
        for r in results:
            peers = r["peers"]
            self.assertEqual(set(peers), {"ort", "sdpa", "openvino", "ggml"})
            for name, ms in (("ort", 0.5), ("sdpa", 3.0), ("openvino", 0.625), ("ggml", 0.75)):
                self.assertEqual(set(peers[name]), DECODE_PEER_FIELDS)
                self.assertEqual(peers[name]["median_ms"], ms)
                # Every cache type's row: the f32 peer time over the row's own median.
                self.assertAlmostEqual(peers[name]["ratio"], ms / r["median_ms"],
                                       delta=RATIO_ROUNDING + 1e-3 * peers[name]["ratio"])
            self.assertIs(peers["ort"]["agrees"], True)
            self.assertIs(peers["sdpa"]["agrees"], False)
            self.assertIs(peers["openvino"]["agrees"], True)
            self.assertIs(peers["ggml"]["agrees"], True)
        self.assertEqual(len(rows), len(results))
        for row, r in zip(rows, results):
            for name in ("ort", "sdpa", "openvino", "ggml"):
                self.assertAlmostEqual(float(row[name + "_ms"]), r["peers"][name]["median_ms"])
                self.assertAlmostEqual(float(row[name + "_ratio"]), r["peers"][name]["ratio"],
                                       delta=RATIO_ROUNDING + 1e-3 * r["peers"][name]["ratio"])
                self.assertIn(name + "_max_abs_err", row)

    def test_rounds_alternate_mha_and_the_peers(self):
        # --rounds 3: after each of mha's three rounds of an f32 row, each peer times the same
        # share of --min-time and --min-runs; its time is the median of its rounds, <peer>/mha
        # the median of the rounds' paired ratios (the peer's round over mha's round before it).
        p, calls, doc, rows, leftovers = self.run_decode(
            ["--compare", "ort,ggml", "--batches", "1", "--kv-dtypes", "f32,bf16", "--rounds",
             "3", "--min-runs", "5", "--min-time", "0.03"],
            env={"FAKE_PEERS_ROUND_SCALES": "1,4,2"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(leftovers, [])
        self.assertIn("3 round(s)", p.stdout)
        # f32 rows of MHA and GQA: three rounds each, each round ort then ggml.
        self.assertEqual([(c["peer"], c["args"][c["args"].index("--decode") + 1]) for c in calls],
                         [(peer, f"1,16,1024,16,{kvh}") for kvh in (16, 4) for _ in range(3)
                          for peer in ("ort", "ggml")])
        for c in calls:
            self.assertTrue(c["data_ok"], c)
            self.assertEqual(c["args"][c["args"].index("--min-runs") + 1], "2")  # ceil(5 / 3)
            self.assertAlmostEqual(float(c["args"][c["args"].index("--min-time") + 1]), 0.01)
        results = doc["results"]
        self.assertEqual([r["cache_dtype"] for r in results], ["f32", "bf16"] * 2)
        for r, row in zip(results, rows):
            self.assertEqual(len(r["rounds"]), 3)
            self.assertGreaterEqual(r["runs"], 6)  # at least ceil(5 / 3) in each round
            for name, ms in (("ort", 0.5), ("ggml", 0.75)):
                peer = r["peers"][name]
                self.assertEqual(peer["median_ms"], 2 * ms)  # the median of ms, 4 ms, 2 ms
                self.assertAlmostEqual(peer["p10_ms"], 0.9 * ms)  # the rounds' extremes
                self.assertAlmostEqual(peer["p90_ms"], 1.1 * 4 * ms)
                self.assertEqual(peer["runs"], 9)
                if r["cache_dtype"] == "f32":
                    got = [rr["peers_ms"][name] for rr in r["rounds"]]
                    self.assertEqual(got, [ms, 4 * ms, 2 * ms])
                    want = sorted(g / rr["median_ms"] for g, rr in zip(got, r["rounds"]))[1]
                else:  # the bf16 row repeats the f32 row's peers, over its own median
                    self.assertTrue(all("peers_ms" not in rr for rr in r["rounds"]))
                    want = 2 * ms / r["median_ms"]
                self.assertAlmostEqual(peer["ratio"], want, delta=RATIO_ROUNDING + 1e-3 * want)
                self.assertAlmostEqual(float(row[name + "_ratio"]), want, delta=1e-6 * want)

    def test_quantized_weights_reach_the_int8_peers(self):
        # "all" with quantized weights adds ort-int8 and openvino-int8; the peers are told the
        # storage, and the data file holds the dequantized weights (the stand-in's recomputation
        # agrees).
        every = ["ort", "ort-int8", "sdpa", "openvino", "openvino-int8", "ggml"]
        p, calls, doc, _, _ = self.run_decode(["--compare", "all", "--weights-dtype", "i4",
                                               "--batches", "1"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([c["peer"] for c in calls], every * 2)
        for c in calls:
            self.assertTrue(c["data_ok"], c)
            self.assertEqual(c["args"][c["args"].index("--weights") + 1], "i4", c)
            if c["err"] is not None:
                self.assertLess(c["err"], 1e-4, c)
        self.assertEqual(doc["header"]["compare"], every)
        for name in ("ort-int8", "openvino-int8", "ggml"):
            self.assertEqual(doc["header"]["peers"][name]["precision"], "int8")
        self.assertEqual(doc["header"]["peers"]["openvino"]["precision"], "f32")
        self.assertIn("ort-int8/mha", p.stdout)
        self.assertIn("openvino-int8/mha", p.stdout)
        # Without quantized weights the -int8 peers have nothing to multiply: named, an error.
        for name in ("ort-int8", "openvino-int8"):
            p, calls, _, _, _ = self.run_decode(["--compare", "ort," + name])
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"--compare: {name} multiplies quantized weights", p.stderr)
            self.assertEqual(calls, [])

    def test_real_peers_or_their_note(self):
        # No stand-in: the interpreter mha-bench finds itself. With the peers venv (tools/dev
        # peers) ONNX Runtime and PyTorch run and must agree with mha; without it each peer is
        # a note and the run goes on.
        venv = peers_venv_exists()
        env = {k: "" for k in ("MHA_BENCH_PEER_PYTHON", "MHA_BENCH_PEER_SCRIPT")}
        p, _, doc, _, _ = self.run_decode(["--compare", "ort,sdpa", "--batches", "1"], env=env,
                                          script=None)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ort/mha", p.stdout)
        f32 = [r for r in doc["results"] if r["cache_dtype"] == "f32"]
        self.assertEqual(len(f32), 2)
        if venv:
            for r in f32:
                for name in ("ort", "sdpa"):
                    peer = r["peers"][name]
                    self.assertGreater(peer["median_ms"] or 0, 0, peer)
                    self.assertIs(peer["agrees"], True, peer)
                    self.assertLess(peer["max_abs_err"], 1e-4)
        else:
            notes = [line for line in p.stderr.splitlines() if "note" in line]
            self.assertTrue(any("ort" in n for n in notes), p.stderr)
            self.assertTrue(any("sdpa" in n for n in notes), p.stderr)
            for r in f32:
                for name in ("ort", "sdpa"):
                    self.assertIsNone(r["peers"][name]["median_ms"])
                    self.assertNotEqual(r["peers"][name]["note"], "")


# A stand-in peer script that logs its arguments and the data file's tensor shapes.
LOGGING_PEER = r"""
import json, os, struct, sys
args = sys.argv[1:]
with open(args[args.index("--data") + 1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
with open(os.environ["FAKE_PEERS_LOG"], "a") as f:
    f.write(json.dumps({"args": args, "shapes": shapes}) + "\n")
peer = args[args.index("--peer") + 1]
print(json.dumps({"peer": peer, "skipped": "logged only", "unavailable": False}))
"""


class Variants(unittest.TestCase):
    """The attention-variant flags: errors, the case they run, its JSON/CSV fields, the suite's
    variant cases, and what the peers are handed."""

    TINY_VARIANTS = TINY + ["--threads", "1", "--embed", "32", "--heads", "4", "--seq", "12",
                            "--causal"]

    def test_argument_errors(self):
        cases = [
            (["--rope", "llama"], "--rope: expected 'neox' or 'gptj', got 'llama'"),
            (["--heads", "4", "--kv-heads", "3"], "--kv-heads: expected a divisor of heads (4), got 3"),
            (["--heads", "8", "--embed", "64", "--rope", "neox", "--rotary-dim", "3"],
             "--rotary-dim: expected an even number <= head_dim (8), got 3"),
            (["--rope-theta", "500"], "need --rope neox|gptj"),
            (["--qk-norm-eps", "1e-5"], "--qk-norm-eps: expected --qk-norm as well"),
            (["--window", "0"], "--window: expected an integer in [1,"),
            (["--softcap", "-1"], "--softcap"),
            (["--softcap", "0"], "--softcap: expected a finite number > 0, got '0'"),
            (["--alibi", "--decode"], "--decode: expected no"),
            (["--sinks=1"], "--sinks: expected no value"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                p = run(args, timeout=60)
                self.assertEqual(p.returncode, 2, p.stderr)
                lines = p.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, p.stderr)
                self.assertIn(needle, lines[0])

    def test_help_documents_variants(self):
        p = run(["--help"])
        for text in ["--kv-heads K", "--rope S", "--rope-theta F", "--rotary-dim N",
                     "--rope-scale F", "--alibi", "--window W", "--softcap F", "--sinks",
                     "--qk-norm", "--qk-norm-eps F", "Llama-style (1,1024,4096,32)",
                     "(1,4096,1024,16) with window 1024 and sinks"]:
            self.assertIn(text, p.stdout)

    def test_variant_case_runs_and_is_checked(self):
        for flags, label in [
                (["--kv-heads", "2", "--window", "5", "--sinks", "--softcap", "3", "--alibi"],
                 "kv_heads=2 alibi window=5 softcap=3 sinks"),
                (["--rope", "gptj", "--rope-theta", "500", "--rotary-dim", "4", "--rope-scale",
                  "2", "--qk-norm", "--qk-norm-eps", "1e-05"],
                 "rope=gptj theta=500 rotary_dim=4 rope_scale=2 qk_norm eps=1e-05")]:
            with self.subTest(flags=flags), tempfile.TemporaryDirectory() as d:
                jpath, cpath = os.path.join(d, "r.json"), os.path.join(d, "r.csv")
                p = run(self.TINY_VARIANTS + flags + ["--json", jpath, "--csv", cpath])
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn(label, p.stdout)
                with open(jpath) as f:
                    (r,) = json.load(f)["results"]
                self.assertEqual(r["variants"], label)
                self.assertEqual(r["kv_heads"], 2 if "--kv-heads" in flags else 4)
                self.assertTrue(r["rows_checked"] > 0)
                self.assertLessEqual(r["max_abs_err"], 1e-3)
                with open(cpath, newline="") as f:
                    (row,) = list(csv.DictReader(f))
                self.assertEqual(row["variants"], label)

    def test_window_flops_count_the_band(self):
        with tempfile.TemporaryDirectory() as d:
            jpath = os.path.join(d, "r.json")
            p = run(self.TINY_VARIANTS + ["--window", "3", "--json", jpath])
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(jpath) as f:
                (r,) = json.load(f)["results"]
        # L = 12, W = 3, causal: 1 + 2 + 3 * 10 = 33 visible pairs; E = 32, N = 1.
        flops = 2 * (12 * 32 * 32 * 4) + 4 * 32 * 33
        self.assertAlmostEqual(r["gflops"], flops / (r["median_ms"] * 1e6), delta=r["gflops"] * 0.01)

    def test_breakdown_columns_match_their_header(self):
        p = run(self.TINY_VARIANTS + ["--window", "4", "--breakdown"])
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        i = next(i for i, line in enumerate(lines) if line.startswith("Breakdown"))
        header, row = lines[i + 1].split(), lines[i + 2].split()
        self.assertEqual(header[-2:], ["overhead", "wall"])
        self.assertIn("cache_att", header)
        # The row: the header's columns, then the variants' label.
        self.assertEqual(row[len(header):], ["window=4"])
        for name in ("scores", "softmax", "pv", "qkv_proj", "out_proj"):
            float(row[header.index(name)])

    def test_peers_get_the_variants_and_the_grouped_weights(self):
        p, calls, doc, rows, leftovers = run_with_peers(
            self.TINY_VARIANTS + ["--kv-heads", "2", "--sinks", "--qk-norm", "--compare", "ort"],
            LOGGING_PEER)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(calls), 1, calls)
        args, shapes = calls[0]["args"], calls[0]["shapes"]
        self.assertEqual(args[args.index("--variants") + 1], "kv_heads=2 sinks qk_norm")
        # E 32, kvE 2 * 8 = 16: q, k, v rows.
        self.assertEqual(shapes["in_proj_weight"], [64, 32])
        self.assertEqual(shapes["in_proj_bias"], [64])
        self.assertEqual(shapes["sinks"], [4])
        self.assertEqual(shapes["q_norm.weight"], [8])
        self.assertEqual(shapes["k_norm.weight"], [8])

    def test_real_ort_agrees_on_variants_or_notes(self):
        # With the peers venv (tools/dev peers), ONNX Runtime's GroupQueryAttention must agree
        # with mha on grouped-query heads, RoPE, a window, softcap and sinks; without it, a note.
        venv = peers_venv_exists()
        env = {k: "" for k in ("MHA_BENCH_PEER_PYTHON", "MHA_BENCH_PEER_SCRIPT")}
        p, _, doc, _, _ = run_with_peers(
            self.TINY_VARIANTS + ["--embed", "64", "--kv-heads", "2", "--rope", "neox",
                                  "--window", "5", "--softcap", "3", "--sinks",
                                  "--compare", "ort"], None, env)
        self.assertEqual(p.returncode, 0, p.stderr)
        (r,) = doc["results"]
        peer = r["peers"]["ort"]
        if venv:
            self.assertIs(peer["agrees"], True, peer)
            self.assertLess(peer["max_abs_err"], 1e-4)
        else:
            self.assertIsNone(peer["median_ms"])
            self.assertNotEqual(peer["note"], "")

    def test_peers_script_skips_variants_it_lacks(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                              "peers.py")
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not importable")
        sys.path.insert(0, os.path.dirname(script))
        import safetensors_py
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "case.safetensors")
            safetensors_py.save_file({"query": np.zeros((1, 8, 16), np.float32),
                                      "output": np.zeros((1, 8, 16), np.float32)}, data)
            for peer, variants, reason in [
                    ("torch", "window=4", "torch has no attention variants here (window=4)"),
                    ("openvino", "rope=neox", "openvino has no attention variants here"),
                    ("ort", "kv_heads=1 alibi qk_norm", "ort (GroupQueryAttention) has no "
                                                        "alibi, qk_norm"),
                    ("ort", "rope=neox rotary_dim=8", "rotary_dim / 2 not a multiple of 8")]:
                p = subprocess.run([sys.executable, script, "--peer", peer, "--case",
                                    "1,8,8,16,2,1,0", "--variants", variants, "--data", data],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                r = json.loads(p.stdout.strip().splitlines()[-1])
                self.assertIn(reason, r.get("skipped", ""), r)
                self.assertFalse(r["unavailable"], r)
        p = subprocess.run([sys.executable, script, "--peer", "ort", "--case", "1,8,8,16,2,1,0",
                            "--variants", "window=x", "--data", "/nonexistent"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown item 'window=x'", p.stderr)


HF_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")


def hf_checkpoint(case):
    return os.path.join(HF_DATA, case, "checkpoint")


class HuggingFace(unittest.TestCase):
    """--hf DIR --layer I / --prefix P: a committed tiny checkpoint's layer timed with its
    config's shapes (forward and --decode), the report naming the model, FLOPs from the layer's
    own widths, and the flags --hf refuses."""

    QUICK = ["--threads", "1", "--min-time", "0", "--min-runs", "2", "--rounds", "1",
             "--sgemm-size", "0"]

    def run_json(self, args):
        return run_json(self, args)

    def check_flops(self, r, visible_pairs):
        # 2*N*(L*E*A + 2*S*E*kvE + L*A*E) + 4*N*A*pairs; N = 1, pairs = L*S (halved when
        # causal; with a window, the visible query-key pairs).
        e, a = r["embed"], r["heads"] * r["head_dim"]
        kve = r["kv_heads"] * r["head_dim"]
        flops = (2 * (r["seq"] * e * a + 2 * r["kv_seq"] * e * kve + r["seq"] * a * e) +
                 4 * a * visible_pairs)
        self.assertAlmostEqual(r["gflops"], flops / (r["median_ms"] * 1e6),
                               delta=1e-3 + 1e-3 * r["gflops"])

    def test_llama_layer_forward(self):
        p, doc = self.run_json(["--hf", hf_checkpoint("llama"), "--layer", "1", "--seq", "8"] +
                               self.QUICK)
        self.assertIn("llama, layer 1 (model.layers.1.self_attn.): hidden 64, 4 heads, "
                      "2 kv heads, head_dim 16, causal", p.stdout)
        self.assertIn("weights f32", p.stdout)
        hf = doc["header"]["hf"]
        self.assertEqual((hf["model_type"], hf["layer"], hf["prefix"], hf["hidden"], hf["heads"],
                          hf["kv_heads"], hf["head_dim"], hf["causal"]),
                         ("llama", 1, "model.layers.1.self_attn.", 64, 4, 2, 16, True))
        self.assertGreater(hf["load_ms"], 0)
        (r,) = doc["results"]
        self.assertEqual((r["batch"], r["seq"], r["kv_seq"], r["embed"], r["heads"],
                          r["kv_heads"], r["head_dim"], r["causal"]),
                         (1, 8, 8, 64, 4, 2, 16, True))
        self.assertIsNone(r["max_abs_err"])  # no double reference of a checkpoint's layer
        self.assertEqual(r["rows_checked"], 0)
        self.check_flops(r, visible_pairs=8 * 8 / 2)  # causal: half of L * S

    def test_gemma2_head_dim_and_window(self):
        # Layer 0 is a sliding layer (window 4) with heads * head_dim = 128 != hidden 64; its
        # bf16 weights viewed where they are stored.
        p, doc = self.run_json(["--hf", hf_checkpoint("gemma2"), "--layer", "0", "--seq", "12",
                                "--weights-dtype", "bf16", "--binding", "view"] + self.QUICK)
        self.assertIn("gemma2, layer 0", p.stdout)
        self.assertIn("head_dim 32", p.stdout)
        self.assertIn("weights bf16, viewed in place", p.stdout)
        self.assertEqual(doc["header"]["hf"]["binding"], "view")
        (r,) = doc["results"]
        self.assertEqual((r["embed"], r["heads"], r["head_dim"], r["kv_heads"]), (64, 4, 32, 2))
        self.assertIn("head_dim=32", r["variants"])
        self.assertIn("window=4", r["variants"])
        # L = 12, W = 4, causal: 1 + 2 + 3 + 4 * 9 = 42 visible pairs.
        self.check_flops(r, visible_pairs=42)

    def test_whisper_cross_attention_prefix(self):
        _, doc = self.run_json(["--hf", hf_checkpoint("whisper"), "--prefix",
                                "model.decoder.layers.0.encoder_attn.", "--seq", "3",
                                "--kv-seq", "5"] + self.QUICK)
        self.assertIs(doc["header"]["hf"]["cross_attention"], True)
        self.assertIsNone(doc["header"]["hf"]["layer"])
        (r,) = doc["results"]
        self.assertEqual((r["seq"], r["kv_seq"], r["causal"]), (3, 5, False))
        self.check_flops(r, visible_pairs=3 * 5)

    def test_llama_layer_decode(self):
        p, doc = self.run_json(["--hf", hf_checkpoint("llama"), "--layer", "1", "--decode",
                                "--contexts", "16", "--batches", "1", "--kv-dtypes", "f32",
                                "--prefill", "8", "--threads", "1", "--min-time", "0",
                                "--min-runs", "1"])
        self.assertIn("model: checkpoint ", p.stdout)
        self.assertIn("llama, layer 1 (model.layers.1.self_attn.)", p.stdout)
        self.assertEqual(doc["header"]["hf"]["model_type"], "llama")
        (r,) = doc["results"]
        self.assertEqual(r["error"], "")
        self.assertEqual((r["context"], r["embed"], r["heads"], r["kv_heads"], r["head_dim"]),
                         (16, 64, 4, 2, 16))
        self.assertEqual(r["cache_bytes"], 2 * 2 * 16 * 16 * 4)
        self.assertEqual(r["weight_bytes"], 4 * (2 * 64 * 64 + 2 * 2 * 16 * 64))
        (pre,) = doc["prefill"]
        self.assertEqual((pre["tokens"], pre["batch"], pre["embed"], pre["kv_heads"]),
                         (8, 1, 64, 2))
        self.assertLess(pre["max_abs_diff"], 1e-3)

    def test_errors(self):
        llama = hf_checkpoint("llama")
        usage = [
            (["--hf", llama, "--layer", "1", "--heads", "4"],
             "--heads: not with --hf (the checkpoint's config.json decides it)"),
            (["--hf", llama, "--layer", "1", "--rope", "neox"], "--rope: not with --hf"),
            (["--hf", llama, "--layer", "1", "--causal"], "--causal: not with --hf"),
            (["--hf", llama, "--layer", "1", "--compare", "torch"], "--compare: not with --hf"),
            (["--hf", llama], "--layer, --prefix: expected exactly one with --hf, got neither"),
            (["--hf", llama, "--layer", "0", "--prefix", "x."], "got both"),
            (["--layer", "1"], "--layer: needs --hf DIR"),
            (["--binding", "view"], "--binding: needs --hf DIR"),
            (["--hf", llama, "--layer", "1", "--binding", "mmap"],
             "--binding: expected copy or view, got 'mmap'"),
            (["--hf", llama, "--layer", "1", "--kv-seq", "4"] + self.QUICK,
             "--kv-seq: not with the self-attention module"),
            (["--hf", hf_checkpoint("bert"), "--layer", "0", "--decode"],
             "bidirectional self-attention"),
        ]
        failures = [
            (["--hf", "/nonexistent-hf-folder", "--layer", "0"],
             "--hf /nonexistent-hf-folder: "),
            (["--hf", llama, "--layer", "7"], "layer"),
            # f32 storage cannot view the stored bf16 tensors.
            (["--hf", llama, "--layer", "1", "--binding", "view"], "binding kView"),
        ]
        for args, needle, code in [(a, n, 2) for a, n in usage] + [(a, n, 1) for a, n in failures]:
            with self.subTest(args=args):
                p = run(args, timeout=60)
                self.assertEqual(p.returncode, code, p.stderr)
                lines = p.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, p.stderr)
                self.assertTrue(lines[0].startswith("mha-bench: "), lines[0])
                self.assertIn(needle, lines[0])
                self.assertEqual(p.stdout, "")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: mha_bench_test.py PATH/TO/mha-bench [unittest args]")
    BENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
