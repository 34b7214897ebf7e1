#!/usr/bin/env python3
"""tools/perf_table.py on a recorded mha-bench --json file (tests/data/perf/), with and without
peers: the machine and peers lines, one row per result with mha's time, efficiency and each
peer's ratio, "–" for a peer that did not run, "(!)" for one that disagreed, the command line,
and one-line errors for files that are not forward-pass reports; and on --decode files: the
decode table with and without its peers (ONNX Runtime GQA, PyTorch SDPA) and the prefill table.

    /usr/bin/python3 tests/perf_table_test.py

Registered from tools/meson.build (suite 'tools'). Needs only the standard library.
"""

import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "tools", "perf_table.py")
RECORDED = os.path.join(HERE, "data", "perf", "suite_2threads.json")


def render(doc, *args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        return subprocess.run([sys.executable, SCRIPT, path] + list(args), capture_output=True,
                              text=True, timeout=60)


def table_rows(markdown):
    """The table's lines split into cells, title row first (separator dropped)."""
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows if "---" not in line]


class SgemmBaseline(unittest.TestCase):
    def test_baseline_named_when_not_blas_own(self):
        with open(RECORDED) as f:
            doc = json.load(f)
        doc["header"]["sgemm_arch"] = "skx"
        p = render(doc)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("sgemm baseline on BLIS skx", p.stdout)


class Compact(unittest.TestCase):
    """--compact: one row per shape, non-causal then causal, each with mha's ms and the fastest
    agreeing f32 peer's ratio and name; bf16 peers and disagreeing peers never count."""

    def test_rows_pair_causal_and_pick_the_fastest_agreeing_f32_peer(self):
        with open(RECORDED) as f:
            doc = json.load(f)
        results = doc["results"]
        # Make the fastest f32 peer of the first case disagree: the next one must be named.
        first = results[0]["peers"]
        f32 = {n: p for n, p in first.items() if p.get("precision") == "f32" and
               isinstance(p.get("ratio"), (int, float))}
        fastest = min(f32, key=lambda n: f32[n]["ratio"])
        first[fastest]["agrees"] = False
        p = render(doc, "--compact")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = table_rows(p.stdout)
        self.assertEqual(rows[0], ["(B, L, E, H)", "mha ms", "fastest f32 peer / mha",
                                   "causal: mha ms", "fastest f32 peer / mha"])
        shapes = []
        for r in results:
            shape = f"({r['batch']}, {r['seq']}, {r['embed']}, {r['heads']})"
            if shape not in shapes:
                shapes.append(shape)
        self.assertEqual([row[0] for row in rows[1:]], shapes)

        def expected(r):
            cells = [(p["ratio"], n) for n, p in r["peers"].items()
                     if p.get("precision") == "f32" and p.get("agrees") and
                     isinstance(p.get("ratio"), (int, float))]
            best = min(cells) if cells else None
            return f"{best[0]:.2f}× {best[1]}" if best else "–"

        for r in results:
            row = rows[1 + shapes.index(f"({r['batch']}, {r['seq']}, {r['embed']}, {r['heads']})")]
            col = 3 if r.get("causal") else 1
            self.assertEqual(row[col + 1], expected(r), (row, r["causal"]))
        self.assertNotIn(f"× {fastest}", rows[1][2])


class Recorded(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(RECORDED) as f:
            cls.doc = json.load(f)

    def test_recorded_file_has_every_peer(self):
        self.assertEqual(self.doc["header"]["compare"],
                         ["torch", "sdpa", "ort", "openvino", "openvino-bf16"])

    def test_machine_peers_and_rows(self):
        p = render(self.doc, "--command", "build/tools/mha-bench --threads 2 --compare all")
        self.assertEqual(p.returncode, 0, p.stderr)
        h = self.doc["header"]
        out = p.stdout
        for text in [h["cpu"], "SIMD target " + h["simd_target"], "BLIS " + h["blas_arch"],
                     "2 thread(s)", h["date"][:10], "mha " + h["mha_version"]]:
            self.assertIn(text, out)
        for name, info in h["peers"].items():
            self.assertIn(f"({name}) {info['version']}", out)
        self.assertIn("    build/tools/mha-bench --threads 2 --compare all", out)
        self.assertNotIn("sgemm baseline on", out)  # the recorded run predates sgemm_arch
        rows = table_rows(out)
        self.assertEqual(rows[0], ["(B, L, E, H)", "causal", "mha ms", "eff %", "PyTorch nn.MHA",
                                   "PyTorch SDPA", "ONNX Runtime", "OpenVINO f32",
                                   "OpenVINO bf16"])
        results = self.doc["results"]
        self.assertEqual(len(rows) - 1, len(results))
        for row, r in zip(rows[1:], results):
            self.assertEqual(row[0], f"({r['batch']}, {r['seq']}, {r['embed']}, {r['heads']})")
            self.assertEqual(row[1], "yes" if r["causal"] else "no")
            self.assertAlmostEqual(float(row[2]), r["median_ms"], delta=1e-3 * r["median_ms"])
            self.assertAlmostEqual(float(row[3]), 100 * r["efficiency"], delta=0.051)
            for cell, name in zip(row[4:], h["compare"]):
                peer = r["peers"][name]
                if peer["ratio"] is None:
                    self.assertEqual(cell, "–")
                else:
                    self.assertTrue(cell.startswith(f"{peer['ratio']:.2f}×"), (cell, peer))
                    self.assertEqual(cell.endswith("(!)"), not peer["agrees"], (cell, peer))

    def test_missing_and_disagreeing_peers(self):
        doc = copy.deepcopy(self.doc)
        first = doc["results"][0]["peers"]
        first["ort"].update({"median_ms": None, "ratio": None, "agrees": None,
                             "note": "onnxruntime cannot be imported"})
        first["sdpa"]["agrees"] = False
        p = render(doc)
        self.assertEqual(p.returncode, 0, p.stderr)
        row = table_rows(p.stdout)[1]
        self.assertEqual(row[6], "–")
        self.assertTrue(row[5].endswith("× (!)"), row[5])
        self.assertNotIn("Made with", p.stdout)

    def test_peak_columns(self):
        # With the multiply-add peak (mha-bench measures it with the sgemm): mha's percent of it
        # and the fastest agreeing f32 peer's; bf16 and disagreeing peers do not count.
        doc = copy.deepcopy(self.doc)
        doc["header"]["fma_peak_gflops"] = {"2": 401.5}
        for r in doc["results"]:
            r["peak_fraction"] = 0.5
            for name, peer in r["peers"].items():
                peer["peak_fraction"] = {"torch": 0.3, "sdpa": 0.9, "ort": 0.45,
                                         "openvino": 0.4, "openvino-bf16": 0.95}[name]
        doc["results"][0]["peers"]["sdpa"]["agrees"] = False
        doc["results"][1]["peers"]["ort"]["precision"] = "bf16"
        p = render(doc)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("multiply-add peak 402 GFLOP/s on 2 thread(s)", p.stdout)
        rows = table_rows(p.stdout)
        self.assertEqual(rows[0][2:7], ["mha ms", "eff %", "peak %", "f32 peer peak %",
                                        "PyTorch nn.MHA"])
        ran = lambda r, name: r["peers"][name]["ratio"] is not None
        for i, (row, r) in enumerate(zip(rows[1:], doc["results"])):
            self.assertEqual(row[4], "50.0")
            expected = [f for name, f in (("torch", 30), ("sdpa", 90), ("ort", 45),
                                          ("openvino", 40))
                        if ran(r, name) and r["peers"][name]["agrees"] and
                        r["peers"][name]["precision"] == "f32"]
            self.assertEqual(row[5], f"{max(expected):.1f}" if expected else "–", i)
        self.assertEqual(rows[1][5], "45.0")  # sdpa disagreed
        doc["results"][0]["peak_fraction"] = None  # no baseline in that case
        self.assertEqual(table_rows(render(doc).stdout)[1][4], "–")
        doc["header"]["compute"] = "bf16"  # the f32 peak does not bound bf16 products
        p = render(doc)
        self.assertNotIn("multiply-add peak", p.stdout)
        self.assertNotIn("peak %", table_rows(p.stdout)[0])

    def test_without_peers(self):
        doc = copy.deepcopy(self.doc)
        for key in ("compare", "peers", "peer_python"):
            doc["header"].pop(key)
        for r in doc["results"]:
            r.pop("peers")
        p = render(doc)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("Peers:", p.stdout)
        rows = table_rows(p.stdout)
        self.assertEqual(rows[0], ["(B, L, E, H)", "causal", "mha ms", "eff %"])
        self.assertEqual(len(rows) - 1, len(doc["results"]))

    def test_bf16_file_with_its_f32_run(self):
        bf16 = copy.deepcopy(self.doc)
        bf16["header"]["compute"] = "bf16"
        bf16["header"]["bf16_kernel"] = "amx"
        f32 = copy.deepcopy(self.doc)
        for r in bf16["results"]:
            r["median_ms"] = r["median_ms"] / 2
        f32["results"] = f32["results"][1:]  # the first case missing from the f32 run
        with tempfile.TemporaryDirectory() as d:
            f32_path = os.path.join(d, "f32.json")
            with open(f32_path, "w") as f:
                json.dump(f32, f)
            p = render(bf16, "--f32", f32_path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("--compute bf16 (amx kernel)", p.stdout)
        rows = table_rows(p.stdout)
        self.assertEqual(rows[0][:5], ["(B, L, E, H)", "causal", "mha ms", "eff %", "f32 / bf16"])
        self.assertEqual(rows[1][4], "–")
        self.assertEqual(rows[2][4], "2.00×")
        self.assertEqual(len(rows[0]), len(rows[2]))

    def test_several_thread_counts_add_a_column(self):
        doc = copy.deepcopy(self.doc)
        doc["results"][1]["threads"] = 1
        rows = table_rows(render(doc).stdout)
        self.assertEqual(rows[0][:4], ["(B, L, E, H)", "causal", "threads", "mha ms"])
        self.assertEqual(rows[2][2], "1")


class Errors(unittest.TestCase):
    def check_error(self, content, needle):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "bad.json")
            with open(path, "w") as f:
                f.write(content)
            p = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True,
                               timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stdout, "")
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn("perf_table.py: ", lines[0])
        self.assertIn("bad.json", lines[0])
        self.assertIn(needle, lines[0])

    def test_not_json(self):
        self.check_error("not json", "expected an mha-bench --json file")

    def test_wrong_shape(self):
        self.check_error("[1, 2]", "expected an object with 'header' and 'results'")


class Decode(unittest.TestCase):
    """An mha-bench --decode file gives the decode table: read% from the file's own ratios."""

    DOC = {"header": {"mode": "decode", "cpu": "Some CPU", "simd_target": "AVX2",
                      "mha_version": "0.1.0", "read_gbs": {"2": 24.9}},
           "results": [
               {"context": 8192, "batch": 8, "kv_heads": 16, "cache_dtype": "f32", "threads": 2,
                "error": "", "median_ms": 23.5, "tokens_per_s": 340.4,
                "cache_bytes": 512 * 2**20, "read_ratio": 0.917, "total_read_ratio": 0.945,
                "attn_read_ratio": 0.961},
               {"context": 512, "batch": 1, "kv_heads": 4, "cache_dtype": "i8", "threads": 2,
                "error": "KvCache::Step: failed"}]}

    def test_table(self):
        p = render(self.DOC)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("**Some CPU**", p.stdout)
        self.assertIn("streaming read bandwidth 24.9 GB/s on 2 thread(s)", p.stdout)
        rows = table_rows(p.stdout)
        self.assertEqual(rows[0], ["context", "batch", "kv heads", "cache", "ms / step",
                                   "tokens/s", "cache MiB", "read %", "+weights %", "attn %"])
        self.assertEqual(rows[1], ["8192", "8", "16", "f32", "23.500", "340", "512.0", "92",
                                   "94", "96"])
        self.assertEqual(rows[2][:5], ["512", "1", "4", "i8", "error: KvCache::Step: failed"])
        self.assertEqual(len(rows), 3)  # no prefill table, no peer columns
        self.assertNotIn("Peers:", p.stdout)
        self.assertNotIn("--compute bf16", p.stdout)

    def test_bf16_compute_named(self):
        doc = copy.deepcopy(self.DOC)
        doc["header"]["compute"] = "bf16"
        doc["header"]["bf16_kernel"] = "amx"
        p = render(doc)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("--compute bf16 (amx kernel)", p.stdout)
        self.assertNotIn("Prefill", p.stdout)

    def with_peers_and_prefill(self):
        doc = copy.deepcopy(self.DOC)
        doc["header"].update({"compare": ["ort", "sdpa"], "peer_python": "/venv/bin/python",
                              "peers": {"ort": {"version": "1.32.0 (onnx 1.23.2)",
                                                "precision": "f32"},
                                        "sdpa": {"version": None, "precision": None}}})
        doc["results"][0]["peers"] = {
            "ort": {"median_ms": 14.1, "ratio": 0.6, "agrees": True},
            "sdpa": {"median_ms": None, "ratio": None, "agrees": None,
                     "note": "torch cannot be imported"}}
        doc["results"][1]["peers"] = {"ort": {"ratio": None}, "sdpa": {"ratio": None}}
        doc["prefill"] = [
            {"tokens": 2048, "batch": 1, "embed": 1024, "heads": 16, "kv_heads": 4, "threads": 2,
             "error": "", "step_ms": 121.3, "forward_ms": 120.1, "ratio": 121.3 / 120.1},
            {"tokens": 512, "batch": 8, "embed": 768, "heads": 12, "kv_heads": 12, "threads": 2,
             "error": "KvCache::Step: out of memory"}]
        return doc

    def test_peers_columns(self):
        p = render(self.with_peers_and_prefill())
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("Peers: ONNX Runtime GQA (ort) 1.32.0 (onnx 1.23.2); PyTorch SDPA (sdpa) "
                      "not run.", p.stdout)
        self.assertIn("f32 decode step", p.stdout)
        rows = table_rows(p.stdout)
        self.assertEqual(rows[0][-3:], ["attn %", "ONNX Runtime GQA", "PyTorch SDPA"])
        self.assertEqual(rows[1][-2:], ["0.60×", "–"])
        self.assertEqual(len(rows[2]), len(rows[0]))  # an error row keeps every column

    def test_disagreeing_peer_is_marked(self):
        doc = self.with_peers_and_prefill()
        doc["results"][0]["peers"]["ort"]["agrees"] = False
        rows = table_rows(render(doc).stdout)
        self.assertEqual(rows[1][-2], "0.60× (!)")

    def test_prefill_table(self):
        p = render(self.with_peers_and_prefill())
        self.assertIn("Prefill:", p.stdout)
        rows = table_rows(p.stdout)
        at = [r[0] for r in rows].index("T")
        self.assertEqual(rows[at], ["T", "batch", "E", "heads", "kv heads", "Step ms (prefill)",
                                    "Forward ms (causal)", "Step / Forward"])
        self.assertEqual(rows[at + 1], ["2048", "1", "1024", "16", "4", "121.3", "120.1",
                                        "1.01×"])
        self.assertEqual(rows[at + 2][:6], ["512", "8", "768", "12", "12",
                                            "error: KvCache::Step: out of memory"])
        self.assertEqual(len(rows), at + 3)

    def test_prefill_threads_column(self):
        doc = self.with_peers_and_prefill()
        doc["prefill"][1].update({"threads": 1, "error": "", "step_ms": 150.0,
                                  "forward_ms": 140.0, "ratio": 150.0 / 140.0})
        rows = table_rows(render(doc).stdout)
        at = [r[0] for r in rows].index("T")
        self.assertEqual(rows[at][5], "threads")
        self.assertEqual(rows[at + 2][5:], ["1", "150", "140", "1.07×"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
