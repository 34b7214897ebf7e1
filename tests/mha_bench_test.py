#!/usr/bin/env python3
"""The command-line contract of mha-bench: argument errors (one line on stderr, exit code 2),
--help/--version, the --json and --csv schemas with sane values for a tiny custom case, and the
--trace file (valid Chrome trace JSON, one thread_name lane per worker, "X" events named after
the operator's stages), and the --decode suite (its arguments, table, JSON and CSV). Never
asserts a time, only that times are positive and ordered.

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
                 "sgemm_gflops", "workspace_bytes", "arena_high_water", "peak_rss_mib", "max_abs_err",
                 "rows_checked"}
HEADER_FIELDS = {"cpu", "simd_target", "blas_arch", "threads", "mha_version", "sgemm_gflops",
                 "date", "rounds"}
ROUND_FIELDS = {"sgemm_gflops", "runs", "median_ms", "gflops", "efficiency"}


def run(args, timeout=240):
    return subprocess.run(WRAPPER + [BENCH] + args, capture_output=True, text=True, timeout=timeout)


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
        (["--decode", "--rounds", "2"], "--rounds"),
        (["--sgemm-size", "-1"], "--sgemm-size"),
        (["--tolerance", "x"], "--tolerance"),
        (["--seq"], "--seq: expected a value"),
        (["--causal=yes"], "--causal"),
        (["--json", ""], "--json"),
        (["--json", "/nonexistent-dir/x.json", "--seq", "8", "--embed", "16", "--heads", "2"],
         "--json"),
        (["--batch", "65536", "--seq", "65536", "--embed", "1024", "--heads", "8"], "2^31"),
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
                     "--sgemm-size", "--tolerance", "--seed", "--rounds", "MHA_COMPARE_TORCH"]:
            self.assertIn(flag, p.stdout)
        self.assertIn("2*N*(L*q_dim*E + S*kdim*E + S*vdim*E + L*E*E)", p.stdout)
        self.assertIn("4*N*L*S*E, halved when causal", p.stdout)

    def test_version(self):
        p = run(["--version"])
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"mha \d+\.\d+\.\d+")
        self.assertIn("SIMD target:", p.stdout)
        self.assertIn("BLIS arch:", p.stdout)


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
        self.assertTrue(HEADER_FIELDS <= set(header), set(header))
        self.assertEqual(header["threads"], [1, 2])
        self.assertEqual(set(header["sgemm_gflops"]), {"1", "2"})
        for g in header["sgemm_gflops"].values():
            self.assertGreater(g, 0)
        self.assertRegex(header["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        results = doc["results"]
        self.assertEqual([r["threads"] for r in results], [1, 2])
        for r in results:
            self.assertTrue(RESULT_FIELDS | {"breakdown"} <= set(r), set(r))
            self.assertNotIn("torch_median_ms", r)
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
            self.assertEqual(r["efficiency"], sorted(rr["efficiency"] for rr in rounds)[1])
            self.assertEqual(r["sgemm_gflops"], sorted(rr["sgemm_gflops"] for rr in rounds)[1])
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
        self.assertIsNone(r["efficiency"])  # no sgemm baseline
        self.assertIsNone(r["sgemm_gflops"])
        self.assertEqual(len(r["rounds"]), 3)  # the default
        for rr in r["rounds"]:
            self.assertIsNone(rr["sgemm_gflops"])
            self.assertIsNone(rr["efficiency"])
        self.assertEqual(doc["header"]["sgemm_gflops"], {})
        self.assertLess(r["max_abs_err"], 1e-3)

    def test_error_above_tolerance_exits_3(self):
        # f32 results never match the double reference exactly on every element, so a zero
        # tolerance must fail the run (exit 3) after still printing the row.
        p = run(TINY + ["--threads", "1", "--tolerance", "0"])
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("exceeds the tolerance", p.stderr)
        self.assertIn("max_err", p.stdout)

    def test_compare_torch_missing_script_is_a_note(self):
        env = dict(os.environ, MHA_COMPARE_TORCH="/nonexistent/compare_torch.py")
        p = subprocess.run(WRAPPER + [BENCH] + TINY + ["--threads", "1", "--compare-torch"],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("note", p.stderr)
        self.assertIn("torch_ms", p.stdout)


FAKE_TORCH = r"""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_TORCH_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
if os.environ.get("FAKE_TORCH_SKIP"):
    print(json.dumps({"skipped": "torch is not importable (fake)"}))
    sys.exit(0)
b, s, kv, e, h, c, nw = (int(x) for x in args[args.index("--case") + 1].split(","))
print(json.dumps({"batch": b, "seq": s, "kv_seq": kv, "embed": e, "heads": h, "causal": c,
                  "need_weights": nw, "threads": int(args[args.index("--threads") + 1]),
                  "median_ms": 5.0, "torch_version": "fake-1.0"}))
"""


class CompareTorch(unittest.TestCase):
    """--compare-torch through a stand-in script (MHA_COMPARE_TORCH): one call per case and
    thread count, right after that case, and the speedup it reports."""

    def run_fake(self, extra_env):
        with tempfile.TemporaryDirectory() as d:
            script, log, path = (os.path.join(d, n) for n in ("fake.py", "log", "r.json"))
            with open(script, "w") as f:
                f.write(FAKE_TORCH)
            env = dict(os.environ, MHA_COMPARE_TORCH=script, FAKE_TORCH_LOG=log, **extra_env)
            p = subprocess.run(WRAPPER + [BENCH] + TINY + ["--threads", "1,2", "--compare-torch",
                                                           "--json", path],
                               capture_output=True, text=True, timeout=120, env=env)
            calls, doc = [], None
            if os.path.exists(log):
                with open(log) as f:
                    calls = f.read().splitlines()
            if os.path.exists(path):
                with open(path) as f:
                    doc = json.load(f)
        return p, calls, doc

    def test_one_call_per_case_and_thread_count(self):
        p, calls, doc = self.run_fake({})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(calls), 2, calls)
        for call, threads in zip(calls, ["1", "2"]):
            words = call.split()
            self.assertEqual(words.count("--case"), 1, call)
            self.assertEqual(words[words.index("--case") + 1], "1,8,8,16,2,0,0")
            self.assertEqual(words[words.index("--threads") + 1], threads)
        self.assertIn("torch fake-1.0", p.stdout)
        self.assertEqual(doc["header"]["torch_version"], "fake-1.0")
        for r in doc["results"]:
            self.assertEqual(r["torch_median_ms"], 5.0)
            self.assertAlmostEqual(r["speedup"], 5.0 / r["median_ms"], delta=1e-3 * r["speedup"])

    def test_torch_missing_is_one_note(self):
        p, calls, doc = self.run_fake({"FAKE_TORCH_SKIP": "1"})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(calls), 1, calls)  # not tried again for the second thread count
        self.assertEqual(p.stderr.count("note"), 1, p.stderr)
        for r in doc["results"]:
            self.assertIsNone(r["torch_median_ms"])


class Decode(unittest.TestCase):
    """--decode: the KV-cache decoding suite's arguments, table, JSON and CSV."""

    DECODE_FIELDS = {"context", "batch", "embed", "heads", "kv_heads", "cache_dtype", "threads",
                     "error", "runs", "median_ms", "p10_ms", "p90_ms", "tokens_per_s",
                     "cache_bytes", "weight_bytes", "cache_gbs", "total_gbs", "copy_gbs",
                     "copy_ratio", "total_copy_ratio", "weights_dtype", "attn_ms", "attn_gbs",
                     "attn_copy_ratio"}

    def test_argument_errors(self):
        for args, text in [(["--decode", "--causal"], "--decode"),
                           (["--decode", "--seq", "4"], "--decode"),
                           (["--decode", "--trace", "x.json"], "--decode"),
                           (["--contexts", "512"], "--contexts"),
                           (["--decode", "--contexts", "0"], "--contexts"),
                           (["--decode", "--contexts", "8,8"], "--contexts"),
                           (["--decode", "--batches", "x"], "--batches"),
                           (["--decode", "--weights-dtype", "f64"], "--weights-dtype"),
                           (["--weights-dtype", "bf16"], "--weights-dtype")]:
            with self.subTest(args=args):
                p = run(args, timeout=60)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(text, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)

    def test_help_documents_decode(self):
        p = run(["--help"])
        for text in ["--decode", "--contexts", "--batches", "tokens/s", "copy bandwidth",
                     "AppendProjected"]:
            self.assertIn(text, p.stdout)

    def test_json_csv_and_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            jpath = os.path.join(tmp, "d.json")
            cpath = os.path.join(tmp, "d.csv")
            p = run(["--decode", "--contexts", "16,300", "--batches", "1,2", "--threads", "1,2",
                     "--min-time", "0", "--min-runs", "2", "--json", jpath, "--csv", cpath])
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("copy bandwidth", p.stdout)
            self.assertIn("tokens/s", p.stdout)
            self.assertIn("+weights%", p.stdout)
            with open(jpath) as f:
                doc = json.load(f)
            with open(cpath) as f:
                rows = list(csv.DictReader(f))
        self.assertEqual(doc["header"]["mode"], "decode")
        self.assertEqual(set(doc["header"]["copy_gbs"]), {"1", "2"})
        results = doc["results"]
        # contexts x batches x {MHA, GQA} x {f32, bf16} x threads
        self.assertEqual(len(results), 2 * 2 * 2 * 2 * 2)
        self.assertEqual(len(rows), len(results))
        seen = set()
        for r in results:
            self.assertEqual(set(r), self.DECODE_FIELDS)
            self.assertEqual(r["error"], "")
            self.assertGreaterEqual(r["runs"], 2)
            self.assertGreater(r["median_ms"], 0)
            self.assertLessEqual(r["p10_ms"], r["median_ms"])
            self.assertLessEqual(r["median_ms"], r["p90_ms"])
            self.assertAlmostEqual(r["tokens_per_s"], r["batch"] / (r["median_ms"] * 1e-3),
                                   delta=1e-6 * r["tokens_per_s"])
            size = 4 if r["cache_dtype"] == "f32" else 2
            self.assertEqual(r["cache_bytes"],
                             2 * r["batch"] * r["kv_heads"] * r["context"] * 64 * size)
            self.assertGreater(r["copy_gbs"], 0)
            self.assertGreater(r["total_gbs"], r["cache_gbs"])
            self.assertAlmostEqual(r["total_copy_ratio"], r["total_gbs"] / r["copy_gbs"],
                                   delta=1e-9 * r["total_copy_ratio"])
            self.assertAlmostEqual(r["copy_ratio"], r["cache_gbs"] / r["copy_gbs"],
                                   delta=1e-9 * r["copy_ratio"])
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

    def test_sixteen_bit_weights(self):
        with tempfile.TemporaryDirectory() as tmp:
            jpath = os.path.join(tmp, "d.json")
            p = run(["--decode", "--contexts", "40", "--batches", "1", "--threads", "1",
                     "--min-time", "0", "--min-runs", "1", "--weights-dtype", "bf16",
                     "--json", jpath])
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("weights: bf16", p.stdout)
            with open(jpath) as f:
                results = json.load(f)["results"]
        self.assertEqual(len(results), 4)
        for r in results:
            self.assertEqual(r["weights_dtype"], "bf16")
            self.assertEqual(r["weight_bytes"],
                             2 * (2 * 1024 * 1024 + 2 * r["kv_heads"] * 64 * 1024))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: mha_bench_test.py PATH/TO/mha-bench [unittest args]")
    BENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
