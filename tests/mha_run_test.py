#!/usr/bin/env python3
"""mha-run's contract: its outputs against PyTorch (modules exported by tools/export_torch.py)
and against golden fixtures, its error behaviour (non-zero exit, one line on stderr, no output
or temporary file left), --version, --help and --weights-png.

    mha_run_test.py MHA_RUN EXPORT_TORCH_PY GOLDEN_DIR

Exit codes: 0 pass, 1 fail, 77 skip (meson's code) when numpy is missing, or when torch is
missing (then the error and golden-fixture checks still run first, and must pass).
Tolerance: |mha - torch| <= 1e-5 + 1e-4 |torch|. Where PyTorch returns NaN (a query row whose
every key is masked), mha's documented result is checked instead: zero attention weights, and an
output row equal to out_proj.bias when every head of that row is masked.
"""

import os
import shlex
import struct
import subprocess
import sys
import tempfile

ATOL = 1e-5
RTOL = 1e-4
SKIP = 77

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not importable")
    sys.exit(SKIP)

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message)


# Under a cross build meson runs tests through an emulator (qemu) and names it here; mha-run is a
# target binary, the Python helpers are not.
WRAPPER = shlex.split(os.environ.get("MESON_EXE_WRAPPER", ""))


def run(cmd, **kw):
    cmd = [str(c) for c in cmd]
    if os.path.basename(cmd[0]) == "mha-run":
        cmd = WRAPPER + cmd
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def leftovers(directory, before):
    return sorted(set(os.listdir(directory)) - before)


class Checker:
    def __init__(self, mha_run, export_py, golden_dir, tmp):
        self.mha_run = mha_run
        self.export_py = export_py
        self.golden_dir = golden_dir
        self.tmp = tmp
        sys.path.insert(0, os.path.dirname(os.path.abspath(export_py)))
        import safetensors_py
        self.st = safetensors_py

    def path(self, name):
        return os.path.join(self.tmp, name)

    # -- comparisons ---------------------------------------------------------------------------

    def compare(self, label, got, want, out_bias=None, nan_rows_whole=True):
        """Compares got/want outputs; NaN rows of `want` are checked against mha's semantics."""
        for name, expected in want.items():
            if name not in ("attn_output", "attn_output_weights"):
                continue
            if name not in got:
                fail(f"{label}: output has no '{name}'")
                continue
            actual = got[name]
            if actual.shape != expected.shape:
                fail(f"{label}: {name} shape {actual.shape}, want {expected.shape}")
                continue
            nan = np.isnan(expected)
            ok = np.abs(actual - expected) <= ATOL + RTOL * np.abs(expected)
            ok |= nan
            if not ok.all():
                i = np.argwhere(~ok)[0]
                fail(f"{label}: {name}{tuple(i)} = {actual[tuple(i)]}, want {expected[tuple(i)]} "
                     f"({int((~ok).sum())} elements off, max err "
                     f"{np.nanmax(np.abs(actual - expected)):.3g})")
            if not nan.any():
                continue
            if not np.isfinite(actual[nan]).all():
                fail(f"{label}: {name} has non-finite values where PyTorch has NaN")
            elif name == "attn_output_weights" and (actual[nan] != 0).any():
                fail(f"{label}: {name}: fully masked rows must be zero")
            elif name == "attn_output" and out_bias is not None and nan_rows_whole:
                rows = np.isnan(expected).all(axis=-1)
                if rows.any() and not np.allclose(actual[rows], out_bias[None, :],
                                                  atol=ATOL, rtol=RTOL):
                    fail(f"{label}: fully masked output rows must equal out_proj.bias")

    def run_ok(self, label, args, out):
        r = run([self.mha_run] + args + ["--output", out])
        if r.returncode != 0:
            fail(f"{label}: mha-run exited {r.returncode}: {r.stderr.strip()}")
            return None
        tensors, _ = self.st.load_file(out)
        return tensors

    # -- against PyTorch ------------------------------------------------------------------------

    # (label, export_torch.py args, mha-run flags beyond --num-heads)
    TORCH_CASES = [
        ("self_default", ["--embed-dim", "16", "--num-heads", "4"], []),
        ("self_batch_first_weights",
         ["--embed-dim", "12", "--num-heads", "3", "--batch-first", "--need-weights"],
         ["--batch-first", "--need-weights"]),
        ("cross_kdim_vdim_masks_per_head_weights",
         ["--embed-dim", "16", "--num-heads", "4", "--kdim", "6", "--vdim", "5", "--kv-seq", "7",
          "--attn-mask", "float", "--key-padding-mask", "bool", "--need-weights",
          "--no-average-weights", "--prefix", "encoder.layers.0.self_attn."],
         ["--prefix", "encoder.layers.0.self_attn.", "--need-weights", "--no-average-weights"]),
        ("bias_kv_zero_attn_3d_mask",
         ["--embed-dim", "8", "--num-heads", "2", "--add-bias-kv", "--add-zero-attn",
          "--attn-mask", "bool", "--attn-mask-3d", "--batch-first", "--need-weights"],
         ["--add-zero-attn", "--batch-first", "--need-weights"]),
        ("causal_float_kpm_merged",
         ["--embed-dim", "16", "--num-heads", "2", "--key-padding-mask", "float", "--causal",
          "--kv-seq", "6", "--seq", "4"],
         ["--causal"]),
        ("per_head_layout",
         ["--embed-dim", "24", "--num-heads", "4", "--qkv-layout", "per-head", "--attn-mask",
          "bool", "--need-weights"],
         ["--qkv-layout", "per-head", "--need-weights"]),
        ("unbatched_full_row_no_bias",
         ["--embed-dim", "8", "--num-heads", "2", "--unbatched", "--attn-mask", "bool",
          "--full-row", "--no-bias", "--need-weights"],
         ["--need-weights"]),
        ("full_row_with_bias_seq_first",
         ["--embed-dim", "8", "--num-heads", "4", "--attn-mask", "float", "--full-row",
          "--batch", "3"],
         []),
        ("threads_1", ["--embed-dim", "32", "--num-heads", "8", "--seq", "9"], ["--threads", "1"]),
    ]

    def torch_cases(self):
        for label, export_args, flags in self.TORCH_CASES:
            w, i, x, o = (self.path(f"{label}.{s}.safetensors") for s in ("w", "in", "want", "out"))
            heads = export_args[export_args.index("--num-heads") + 1]
            r = run([sys.executable, self.export_py, "--out", w, "--inputs", i, "--expected", x,
                     "--seed", "3"] + export_args)
            if r.returncode != 0:
                fail(f"{label}: export_torch.py exited {r.returncode}: {r.stderr.strip()}")
                continue
            got = self.run_ok(label, ["--weights", w, "--inputs", i, "--num-heads", heads] + flags,
                              o)
            if got is None:
                continue
            want, _ = self.st.load_file(x)
            weights, _ = self.st.load_file(w)
            prefix = export_args[export_args.index("--prefix") + 1] if "--prefix" in export_args else ""
            bias = weights.get(prefix + "out_proj.bias")
            embed = int(export_args[export_args.index("--embed-dim") + 1])
            self.compare(label, got, want, bias if bias is not None else np.zeros(embed, np.float32))
            print(f"ok: torch {label}")

    def whole_model_state_dict(self):
        """export_torch.py --state-dict/--select on a model holding two attention layers."""
        import torch
        model = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16), 2)
        sd = self.path("model.pt")
        torch.save(model.state_dict(), sd)
        w = self.path("model_layer1.safetensors")
        r = run([sys.executable, self.export_py, "--state-dict", sd, "--select",
                 "layers.1.self_attn.", "--out", w])
        if r.returncode != 0:
            fail(f"state_dict export exited {r.returncode}: {r.stderr.strip()}")
            return
        names, _ = self.st.load_file(w)
        if not all(n.startswith("layers.1.self_attn.") for n in names) or len(names) != 4:
            fail(f"state_dict export wrote {sorted(names)}")
            return
        attn = model.layers[1].self_attn.eval()
        q = torch.rand(3, 2, 8)
        i = self.path("model_in.safetensors")
        self.st.save_file({"query": q}, i)
        got = self.run_ok("whole_model", ["--weights", w, "--prefix", "layers.1.self_attn.",
                                          "--num-heads", "2", "--inputs", i],
                          self.path("model_out.safetensors"))
        if got is not None:
            want = attn(q, q, q, need_weights=False)[0].detach().numpy()
            self.compare("whole_model", got, {"attn_output": want})
            print("ok: whole-model state_dict export with --select")

    # -- golden fixtures ------------------------------------------------------------------------

    GOLDEN = ["e12_h4", "per_head_masks_causal", "full_row_kpm_bool", "kdim_vdim_unbatched",
              "seed_cross_dims", "bias_kv_zero_attn_masks"]

    def golden(self):
        ran = 0
        for name in self.GOLDEN:
            path = os.path.join(self.golden_dir, name + ".safetensors")
            if not os.path.exists(path):
                continue
            want, meta = self.st.load_file(path)
            flags = ["--num-heads", meta["num_heads"]]
            for key, flag in (("batch_first", "--batch-first"), ("need_weights", "--need-weights"),
                              ("causal", "--causal"), ("add_zero_attn", "--add-zero-attn")):
                if meta.get(key) == "1":
                    flags.append(flag)
            if meta.get("need_weights") == "1" and meta.get("average_attn_weights") == "0":
                flags.append("--no-average-weights")
            if meta.get("qkv_layout") == "per_head":
                flags += ["--qkv-layout", "per-head"]
            got = self.run_ok(f"golden {name}", ["--weights", path, "--inputs", path] + flags,
                              self.path(f"golden_{name}.out.safetensors"))
            if got is None:
                continue
            # The fixtures already hold mha's values in fully-masked rows (no NaN).
            self.compare(f"golden {name}", got, want)
            print(f"ok: golden {name}")
            ran += 1
        if ran == 0:
            print(f"note: no golden fixtures under {self.golden_dir}")

    # -- errors and the rest of the command line --------------------------------------------------

    def expect_error(self, label, args, code=None, mention=None, out=None):
        out = out or self.path(f"err_{label}.safetensors")
        before = set(os.listdir(self.tmp))
        r = run([self.mha_run] + args + ["--output", out])
        lines = r.stderr.strip().splitlines()
        if r.returncode == 0:
            fail(f"error {label}: exit 0, expected a failure")
        elif code is not None and r.returncode != code:
            fail(f"error {label}: exit {r.returncode}, expected {code}")
        if len(lines) != 1 or not lines[0].startswith("mha-run: error: "):
            fail(f"error {label}: expected one 'mha-run: error: ' line on stderr, got {lines!r}")
        elif mention is not None and mention not in lines[0]:
            fail(f"error {label}: message {lines[0]!r} does not mention {mention!r}")
        left = leftovers(self.tmp, before)
        if left:
            fail(f"error {label}: files left behind: {left}")
        if r.stdout:
            fail(f"error {label}: unexpected stdout {r.stdout!r}")
        print(f"ok: error {label}: {lines[0] if lines else ''}")

    def errors(self):
        st = self.st
        rng = np.random.default_rng(1)
        E = 8
        w = self.path("err_w.safetensors")
        st.save_file({"in_proj_weight": rng.standard_normal((3 * E, E), dtype=np.float32),
                      "in_proj_bias": rng.standard_normal(3 * E, dtype=np.float32),
                      "out_proj.weight": rng.standard_normal((E, E), dtype=np.float32),
                      "out_proj.bias": rng.standard_normal(E, dtype=np.float32)}, w)
        good = self.path("err_in.safetensors")
        st.save_file({"query": rng.standard_normal((3, 2, E), dtype=np.float32)}, good)
        no_query = self.path("err_noquery.safetensors")
        st.save_file({"key": rng.standard_normal((3, 2, E), dtype=np.float32)}, no_query)
        bad_mask = self.path("err_badmask.safetensors")
        st.save_file({"query": rng.standard_normal((3, 2, E), dtype=np.float32),
                      "attn_mask": np.zeros((3, 4), dtype=np.bool_)}, bad_mask)
        int_query = self.path("err_intquery.safetensors")
        st.save_file({"query": np.zeros((3, 2, E), dtype=np.int64)}, int_query)
        garbage = self.path("err_garbage.safetensors")
        with open(garbage, "wb") as f:
            f.write(b"\xff" * 20)
        base = ["--weights", w, "--num-heads", "2", "--inputs", good]

        self.expect_error("missing_weights_file",
                          ["--weights", self.path("nope.safetensors"), "--num-heads", "2",
                           "--inputs", good], 1, "nope.safetensors")
        self.expect_error("num_heads_not_integer",
                          ["--weights", w, "--num-heads", "two", "--inputs", good], 2,
                          "--num-heads")
        self.expect_error("num_heads_zero", ["--weights", w, "--num-heads", "0", "--inputs", good],
                          2, "--num-heads")
        self.expect_error("num_heads_not_divisor",
                          ["--weights", w, "--num-heads", "3", "--inputs", good], 1, "num_heads")
        self.expect_error("missing_query", ["--weights", w, "--num-heads", "2", "--inputs", no_query],
                          1, "query")
        self.expect_error("bad_mask_shape",
                          ["--weights", w, "--num-heads", "2", "--inputs", bad_mask], 1, "attn_mask")
        self.expect_error("int_query", ["--weights", w, "--num-heads", "2", "--inputs", int_query],
                          1, "I64")
        self.expect_error("garbage_inputs",
                          ["--weights", w, "--num-heads", "2", "--inputs", garbage], 1, "err_garbage")
        self.expect_error("wrong_prefix", base + ["--prefix", "model."], 1, "model.out_proj.weight")
        self.expect_error("png_without_weights", base + ["--weights-png", self.path("x.png")], 2,
                          "--need-weights")
        self.expect_error("no_average_without_weights", base + ["--no-average-weights"], 2)
        self.expect_error("unknown_flag", base + ["--frobnicate"], 2, "--frobnicate")
        self.expect_error("missing_inputs_flag", ["--weights", w, "--num-heads", "2"], 2, "--inputs")
        self.expect_error("bad_layout", base + ["--qkv-layout", "zigzag"], 2, "zigzag")
        self.expect_error("bad_threads", base + ["--threads", "-1"], 2, "--threads")
        self.expect_error("output_dir_missing", base, 1, "no/dir/o.safetensors",
                          out=self.path("no/dir/o.safetensors"))

        # A failed run leaves an existing output file as it was (atomic writer).
        out = self.path("keep.safetensors")
        with open(out, "wb") as f:
            f.write(b"previous")
        r = run([self.mha_run, "--weights", w, "--num-heads", "2", "--inputs", no_query,
                 "--output", out])
        with open(out, "rb") as f:
            if r.returncode == 0 or f.read() != b"previous":
                fail("a failed run modified an existing output file")
        os.remove(out)

        r = run([self.mha_run, "--version"])
        if r.returncode != 0 or "mha-run " not in r.stdout or "SIMD target: " not in r.stdout \
                or "BLAS arch: " not in r.stdout:
            fail(f"--version: exit {r.returncode}, stdout {r.stdout!r}")
        r = run([self.mha_run, "--help"])
        if r.returncode != 0 or "--weights-png" not in r.stdout:
            fail(f"--help: exit {r.returncode}")

        # --weights-png: a valid PNG of the expected size (2 batch items x 2 heads of 3 x 3
        # cells, 16-pixel cells, 4-pixel gaps).
        png = self.path("heat.png")
        got = self.run_ok("weights_png", base + ["--need-weights", "--no-average-weights",
                                                 "--weights-png", png],
                          self.path("heat.safetensors"))
        if got is not None:
            with open(png, "rb") as f:
                head = f.read(24)
            width, height = struct.unpack(">II", head[16:24])
            if head[:8] != b"\x89PNG\r\n\x1a\n" or (width, height) != (2 * 48 + 12, 2 * 48 + 12):
                fail(f"--weights-png: signature {head[:8]!r}, size {width}x{height}")
            else:
                print("ok: --weights-png")

    # -- grouped-query layers and 16-bit weights (numpy reference, no torch needed) -------------

    @staticmethod
    def gqa_reference(x, wq, wk, wv, b, wo, bo, heads, kv_heads, causal=False):
        """float64 self-attention of x [L, N, E] (seq-first) with K/V heads repeated per group."""
        x = x.astype(np.float64)
        E = wq.shape[0]
        hd = E // heads
        kvE = kv_heads * hd
        q = x @ wq.T.astype(np.float64) + b[:E]
        k = x @ wk.T.astype(np.float64) + b[E:E + kvE]
        v = x @ wv.T.astype(np.float64) + b[E + kvE:]
        L, N, _ = x.shape
        out = np.zeros((L, N, E))
        for h in range(heads):
            g = h // (heads // kv_heads)
            qh = q[:, :, h * hd:(h + 1) * hd]
            kh = k[:, :, g * hd:(g + 1) * hd]
            vh = v[:, :, g * hd:(g + 1) * hd]
            s = np.einsum("lnd,snd->nls", qh, kh) / np.sqrt(hd)
            if causal:
                s = np.where(np.triu(np.ones((L, L), dtype=bool), 1), -np.inf, s)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            out[:, :, h * hd:(h + 1) * hd] = np.einsum("nls,snd->lnd", p, vh)
        return out @ wo.T.astype(np.float64) + bo

    def grouped_query_and_16bit(self):
        st = self.st
        rng = np.random.default_rng(7)
        E, H, KVH, L, N = 16, 4, 2, 5, 2
        kvE = E // H * KVH
        f32 = np.float32
        wq = (rng.standard_normal((E, E)) * 0.3).astype(f32)
        wk = (rng.standard_normal((kvE, E)) * 0.3).astype(f32)
        wv = (rng.standard_normal((kvE, E)) * 0.3).astype(f32)
        wo = (rng.standard_normal((E, E)) * 0.3).astype(f32)
        b = rng.standard_normal(E + 2 * kvE).astype(f32)
        bo = rng.standard_normal(E).astype(f32)
        x = rng.standard_normal((L, N, E)).astype(f32)
        inputs = self.path("gqa_in.safetensors")
        st.save_file({"query": x}, inputs)

        def save(path, conv):
            st.save_file({"q_proj_weight": conv(wq), "k_proj_weight": conv(wk),
                          "v_proj_weight": conv(wv), "in_proj_bias": b,
                          "out_proj.weight": conv(wo), "out_proj.bias": bo}, path)

        w32 = self.path("gqa_f32.safetensors")
        save(w32, lambda a: a)
        wbf = self.path("gqa_bf16.safetensors")
        save(wbf, st.bf16_from_f32)

        def f16_round(a):
            return a.astype(np.float16).astype(f32)  # round to nearest even

        def dequantized(a, qmax, block):
            # kernels/quant.h: per row (i8) or block of a row (i4) scale = max|w| / qmax in f32,
            # code = the nearest integer to w / scale (ties to even), weight = code * scale in f32.
            rows, cols = a.shape
            out = np.empty_like(a)
            for g in range(0, cols, block or cols):
                part = a[:, g:g + (block or cols)]
                scale = (np.abs(part).max(axis=1, keepdims=True) / f32(qmax)).astype(f32)
                with np.errstate(divide="ignore", invalid="ignore"):
                    code = np.where(scale > 0, np.rint(part.astype(np.float64) / scale), 0.0)
                out[:, g:g + (block or cols)] = np.clip(code, -qmax, qmax).astype(f32) * scale
            return out

        cases = [
            # (label, weights file, mha-run flags, the weights the layer really holds)
            ("gqa_f32", w32, [], lambda a: a),
            ("gqa_kv_heads_stated", w32, ["--kv-heads", "2"], lambda a: a),
            ("gqa_bf16_file_bf16_layer", wbf, ["--weights-dtype", "bf16"], st.bf16_round),
            ("gqa_bf16_file_f32_layer", wbf, [], st.bf16_round),
            ("gqa_f32_file_f16_layer", w32, ["--weights-dtype", "f16"], f16_round),
            ("gqa_f32_file_i8_layer", w32, ["--weights-dtype", "i8"],
             lambda a: dequantized(a, 127, 0)),
            ("gqa_bf16_file_i4_layer", wbf, ["--weights-dtype", "i4"],
             lambda a: dequantized(st.bf16_round(a), 7, 32)),
            ("gqa_f32_file_i4_128_layer", w32, ["--weights-dtype", "i4-128"],
             lambda a: dequantized(a, 7, 128)),
        ]
        for label, wfile, flags, held in cases:
            want = self.gqa_reference(x, held(wq), held(wk), held(wv), b, held(wo), bo, H, KVH)
            got = self.run_ok(label, ["--weights", wfile, "--num-heads", str(H), "--inputs",
                                      inputs] + flags, self.path(label + "_out.safetensors"))
            if got is None:
                continue
            self.compare(label, got, {"attn_output": want.astype(f32)})
            print(f"ok: {label}")
        base = ["--weights", w32, "--num-heads", str(H), "--inputs", inputs]
        self.expect_error("kv_heads_mismatch", base + ["--kv-heads", "4"], 1,
                          "--kv-heads 4: ")
        self.expect_error("kv_heads_zero", base + ["--kv-heads", "0"], 2, "--kv-heads")
        self.expect_error("weights_dtype_bad", base + ["--weights-dtype", "f64"], 2,
                          "--weights-dtype: expected f32, bf16, f16, i8, i4 or i4-128, got "
                          "'f64'")
        # --compute int8: int8 activations on the i8 layer, within their rounding of the i8
        # layer's output (tests/int8_compute_test.cc bounds it); refused without quantized weights.
        i8_want = self.gqa_reference(x, *(dequantized(m, 127, 0) for m in (wq, wk, wv)), b,
                                     dequantized(wo, 127, 0), bo, H, KVH)
        got = self.run_ok("gqa_i8_int8", base + ["--weights-dtype", "i8", "--compute", "int8"],
                          self.path("gqa_i8_int8.safetensors"))
        if got is not None:
            err = np.abs(got["attn_output"] - i8_want).max() / np.abs(i8_want).max()
            if not err < 4e-2:
                fail(f"gqa_i8_int8: error {err:.3g} of the output's largest magnitude")
            print(f"ok: gqa_i8_int8 (error {err:.2g})")
        self.expect_error("compute_int8_f32_weights", base + ["--compute", "int8"], 1,
                          "compute: kInt8 (int8 activations) expects weight_dtype I8 or I4, "
                          "got f32")
        # --kv-dtype: token-by-token decoding through a KV cache equals the causal forward
        # within the cache's accuracy (tests/kv_cache_test.cc derives the tolerances).
        causal = self.run_ok("gqa_causal", base + ["--causal"], self.path("gqa_causal.safetensors"))
        for dtype, tol in (("f32", 1e-5), ("bf16", 2e-2), ("f16", 4e-3), ("int8", 2e-2),
                           ("int8dot", 2e-2)):
            label = "gqa_kv_" + dtype
            got = self.run_ok(label, base + ["--kv-dtype", dtype],
                              self.path(label + "_out.safetensors"))
            if got is None or causal is None:
                continue
            a, want = got["attn_output"], causal["attn_output"]
            err = float(np.max(np.abs(a - want) / (1 + np.abs(want))))
            if a.shape != want.shape or not err <= tol:
                fail(f"{label}: max scaled error {err:.3g} against --causal, tolerance {tol}")
            else:
                print(f"ok: {label} (max scaled error {err:.3g} against --causal)")
        # --compute bf16: the products' inputs rounded to bf16; within the bound README "bf16
        # compute" states (of the output's scale), against the float64 reference, also decoding.
        want = self.gqa_reference(x, wq, wk, wv, b, wo, bo, H, KVH)
        scale = float(np.max(np.abs(want)))
        for label, flags in (("gqa_bf16_compute", ["--compute", "bf16"]),
                             ("gqa_bf16_compute_kv", ["--compute", "bf16", "--kv-dtype", "bf16"])):
            got = self.run_ok(label, base + flags, self.path(label + "_out.safetensors"))
            if got is None:
                continue
            ref = want if "--kv-dtype" not in flags else self.gqa_reference(
                x, wq, wk, wv, b, wo, bo, H, KVH, causal=True)
            err = float(np.max(np.abs(got["attn_output"] - ref))) / scale
            if got["attn_output"].shape != ref.shape or not err <= 3e-2:
                fail(f"{label}: max error {err:.3g} of the output scale, bound 3e-2")
            else:
                print(f"ok: {label} (max error {err:.3g} of the output scale)")
        self.expect_error("compute_bad", base + ["--compute", "f16"], 2,
                          "--compute: expected 'f32', 'bf16' or 'int8', got 'f16'")
        self.expect_error("kv_dtype_bad", base + ["--kv-dtype", "int4"], 2,
                          "--kv-dtype: expected 'f32', 'bf16', 'f16', 'int8' or 'int8dot', got "
                          "'int4'")
        self.expect_error("kv_dtype_need_weights", base + ["--kv-dtype", "int8",
                                                          "--need-weights"], 1,
                          "--kv-dtype: expected self-attention")


    # -- attention variants (numpy float64 reference of the README's formulas) ----------------

    @staticmethod
    def variant_reference(x, w, heads, kv_heads, causal=False, rope=None, theta=10000.0,
                          rotary_dim=0, rope_scale=1.0, alibi=False, window=0, softcap=0.0,
                          qk_eps=1e-6, positions=None, scale=None):
        """float64 self-attention of x [L, N, E] (seq-first) with the variants applied in the
        README's order: QK-norm, RoPE, scale, softcap, ALiBi, masks (causal by index, window by
        position), softmax with the sink logit. positions: [N, L] ints (default 0..L-1)."""
        x = x.astype(np.float64)
        L, N, E = x.shape
        hd = E // heads
        kvE = kv_heads * hd
        b = w["in_proj_bias"].astype(np.float64)
        q = (x @ w["q_proj_weight"].T.astype(np.float64) + b[:E]).reshape(L, N, heads, hd)
        k = (x @ w["k_proj_weight"].T.astype(np.float64) + b[E:E + kvE]).reshape(L, N, kv_heads, hd)
        v = (x @ w["v_proj_weight"].T.astype(np.float64) + b[E + kvE:]).reshape(L, N, kv_heads, hd)
        if "q_norm.weight" in w:
            def rms(t, g):
                return t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + qk_eps) * g
            q = rms(q, w["q_norm.weight"].astype(np.float64))
            k = rms(k, w["k_norm.weight"].astype(np.float64))
        p = (np.broadcast_to(np.arange(L), (N, L)) if positions is None
             else np.asarray(positions, dtype=np.int64).reshape(-1, L))
        p = np.broadcast_to(p, (N, L)).astype(np.float64)  # [N, L]
        if rope is not None:
            rd = rotary_dim or hd
            inv = theta ** (-2.0 * np.arange(rd // 2) / rd)
            ang = (p.T / rope_scale)[:, :, None] * inv  # [L, N, rd/2]
            c, sn = np.cos(ang)[:, :, None, :], np.sin(ang)[:, :, None, :]

            def rotate(t):
                t = t.copy()
                i1 = np.arange(rd // 2) if rope == "neox" else np.arange(0, rd, 2)
                i2 = i1 + rd // 2 if rope == "neox" else i1 + 1
                x1, x2 = t[..., i1].copy(), t[..., i2].copy()
                t[..., i1] = x1 * c - x2 * sn
                t[..., i2] = x2 * c + x1 * sn
                return t
            q, k = rotate(q), rotate(k)
        slopes = w.get("alibi_slopes")
        if alibi and slopes is None:
            slopes = 2.0 ** (-8.0 * (np.arange(heads) + 1) / heads)  # H a power of two
        sinks = w.get("sinks")
        out = np.zeros((L, N, E))
        for h in range(heads):
            g = h // (heads // kv_heads)
            s = np.einsum("lnd,snd->nls", q[:, :, h], k[:, :, g]) * (
                scale if scale is not None else 1.0 / np.sqrt(hd))
            if softcap:
                s = softcap * np.tanh(s / softcap)
            d = p[:, :, None] - p[:, None, :]  # p_i - p_j, [N, L, S]
            if slopes is not None:
                s = s - float(slopes[h]) * np.abs(d)
            visible = np.ones_like(s, dtype=bool)
            if causal:
                visible &= np.tril(np.ones((L, L), dtype=bool))[None]
            if window:
                visible &= (d < window) & (d >= 0) if causal else np.abs(d) < window
            s = np.where(visible, s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            if sinks is not None:
                m = np.maximum(m, float(sinks[h]))
            e = np.exp(s - m)
            den = e.sum(axis=-1, keepdims=True)
            if sinks is not None:
                den = den + np.exp(float(sinks[h]) - m)
            out[:, :, h * hd:(h + 1) * hd] = np.einsum("nls,snd->lnd", e / den, v[:, :, g])
        return out @ w["out_proj.weight"].T.astype(np.float64) + w["out_proj.bias"]

    def variants(self):
        st = self.st
        rng = np.random.default_rng(30)
        E, H, KVH, L, N = 32, 4, 2, 7, 2
        hd, kvE = E // H, E // H * KVH
        f32 = np.float32
        base_w = {"q_proj_weight": (rng.standard_normal((E, E)) * 0.3).astype(f32),
                  "k_proj_weight": (rng.standard_normal((kvE, E)) * 0.3).astype(f32),
                  "v_proj_weight": (rng.standard_normal((kvE, E)) * 0.3).astype(f32),
                  "in_proj_bias": rng.standard_normal(E + 2 * kvE).astype(f32),
                  "out_proj.weight": (rng.standard_normal((E, E)) * 0.3).astype(f32),
                  "out_proj.bias": rng.standard_normal(E).astype(f32)}
        extra = {"sinks": rng.standard_normal(H).astype(f32),
                 "alibi_slopes": (rng.random(H) * 0.5).astype(f32),
                 "q_norm.weight": (1 + 0.2 * rng.standard_normal(hd)).astype(f32),
                 "k_norm.weight": (1 + 0.2 * rng.standard_normal(hd)).astype(f32)}
        x = rng.standard_normal((L, N, E)).astype(f32)
        pos = (np.arange(L)[None, :] * np.array([[1], [2]]) + np.array([[3], [40]]))  # [N, L]
        prefix = "model.layers.0.self_attn."

        def weights(label, names):
            path = self.path(f"var_{label}_w.safetensors")
            tensors = dict(base_w)
            tensors.update({n: extra[n] for n in names})
            st.save_file({prefix + n: t for n, t in tensors.items()}, path)
            return path, tensors

        def inputs(label, positions=None):
            path = self.path(f"var_{label}_in.safetensors")
            t = {"query": x}
            if positions is not None:
                t["positions"] = positions
            st.save_file(t, path)
            return path

        # (label, extra weight tensors, positions tensor, mha-run flags, reference kwargs)
        cases = [
            ("rope_neox_partial_scaled", [], pos.astype(np.int32),
             ["--rope", "neox", "--rope-theta", "500", "--rotary-dim", "4", "--rope-scale", "2",
              "--causal"],
             dict(rope="neox", theta=500.0, rotary_dim=4, rope_scale=2.0, causal=True)),
            ("rope_gptj_i64_unbatched_positions", [], (np.arange(L) + 5).astype(np.int64),
             ["--rope", "gptj"], dict(rope="gptj")),
            ("alibi_standard", [], None, ["--alibi", "--causal"], dict(alibi=True, causal=True)),
            ("alibi_slopes_file", ["alibi_slopes"], pos.astype(np.int32), [],
             dict(alibi=True)),
            ("window_causal", [], None, ["--window", "3", "--causal"],
             dict(window=3, causal=True)),
            ("window_bidirectional", [], None, ["--window", "2"], dict(window=2)),
            ("softcap", [], None, ["--softcap", "0.7"], dict(softcap=0.7)),
            ("scale", [], None, ["--scale", "0.0625", "--causal"], dict(scale=0.0625, causal=True)),
            ("sinks", ["sinks"], None, ["--causal"], dict(causal=True)),
            ("qk_norm", ["q_norm.weight", "k_norm.weight"], None, ["--qk-norm-eps", "1e-5"],
             dict(qk_eps=1e-5)),
            ("combo_gptoss", ["sinks"], None,
             ["--rope", "neox", "--rope-theta", "150000", "--window", "4", "--causal"],
             dict(rope="neox", theta=150000.0, window=4, causal=True)),
        ]
        for label, names, positions, flags, kw in cases:
            wfile, tensors = weights(label, names)
            infile = inputs(label, positions)
            ref_pos = None if positions is None else np.broadcast_to(positions, (N, L))
            want = self.variant_reference(x, tensors, H, KVH, positions=ref_pos, **kw)
            got = self.run_ok("variant_" + label,
                              ["--weights", wfile, "--prefix", prefix, "--num-heads", str(H),
                               "--inputs", infile] + flags,
                              self.path(f"var_{label}_out.safetensors"))
            if got is None:
                continue
            before = len(failures)
            self.compare("variant_" + label, got, {"attn_output": want.astype(f32)})
            if len(failures) == before:
                print(f"ok: variant {label}")

        # Gemma's (1 + w) norm weights: the file holds w - 1.
        wfile, tensors = weights("qk_norm_add_one", [])
        shifted = dict(tensors)
        for n in ("q_norm.weight", "k_norm.weight"):
            shifted[n] = extra[n] - np.float32(1)
        st.save_file({prefix + n: t for n, t in shifted.items()}, wfile)
        tensors.update({n: extra[n] for n in ("q_norm.weight", "k_norm.weight")})
        want = self.variant_reference(x, tensors, H, KVH)
        got = self.run_ok("variant_qk_norm_add_one",
                          ["--weights", wfile, "--prefix", prefix, "--num-heads", str(H),
                           "--inputs", inputs("plain"), "--qk-norm-add-one"],
                          self.path("var_add_one_out.safetensors"))
        before = len(failures)
        if got is not None:
            self.compare("variant_qk_norm_add_one", got, {"attn_output": want.astype(f32)})
        if got is not None and len(failures) == before:
            print("ok: variant qk_norm_add_one")

        # Decoding through the KV cache (plain and as a ring of W positions) equals the forward.
        wfile, _ = weights("decode", ["sinks", "q_norm.weight", "k_norm.weight"])
        plain = inputs("plain")
        common = ["--weights", wfile, "--prefix", prefix, "--num-heads", str(H), "--inputs", plain,
                  "--rope", "neox", "--window", "3", "--softcap", "2"]
        fwd = self.run_ok("variant_decode_forward", common + ["--causal"],
                          self.path("var_dec_fwd.safetensors"))
        for label, flags in (("kv", []), ("kv_ring", ["--kv-ring"])):
            got = self.run_ok("variant_decode_" + label, common + ["--kv-dtype", "f32"] + flags,
                              self.path(f"var_dec_{label}.safetensors"))
            if got is None or fwd is None:
                continue
            a, want = got["attn_output"], fwd["attn_output"]
            err = float(np.max(np.abs(a - want) / (1 + np.abs(want))))
            if a.shape != want.shape or not err <= 1e-5:
                fail(f"variant_decode_{label}: max scaled error {err:.3g} against the forward")
            else:
                print(f"ok: variant decode {label} (max scaled error {err:.3g})")

        base = ["--weights", wfile, "--prefix", prefix, "--num-heads", str(H), "--inputs", plain]
        self.expect_error("rope_bad", base + ["--rope", "llama"], 2,
                          "--rope: expected 'neox' or 'gptj', got 'llama'")
        self.expect_error("rope_theta_negative", base + ["--rope", "neox", "--rope-theta", "-1"],
                          2, "--rope-theta: expected a finite number > 0, got '-1'")
        self.expect_error("rope_theta_without_rope", base + ["--rope-theta", "500"], 2,
                          "need --rope")
        self.expect_error("window_zero", base + ["--window", "0"], 2, "--window: expected")
        self.expect_error("kv_ring_without_window", base + ["--kv-dtype", "f32", "--kv-ring"], 2,
                          "--kv-ring: needs --kv-dtype and --window")
        self.expect_error("rotary_dim_odd", base + ["--rope", "neox", "--rotary-dim", "3"], 1,
                          "--rotary-dim 3")
        bad_pos = self.path("var_bad_pos_in.safetensors")
        st.save_file({"query": x, "positions": pos.astype(np.float32)}, bad_pos)
        self.expect_error("positions_float", base[:-1] + [bad_pos, "--rope", "neox"], 1,
                          "tensor 'positions': expected dtype I32 or I64, got F32")
        bad_norm = self.path("var_bad_norm_w.safetensors")
        t = {prefix + n: a for n, a in base_w.items()}
        t[prefix + "q_norm.weight"] = extra["q_norm.weight"][:hd - 1]
        t[prefix + "k_norm.weight"] = extra["k_norm.weight"]
        st.save_file(t, bad_norm)
        self.expect_error("qk_norm_bad_shape", ["--weights", bad_norm, "--prefix", prefix,
                                                "--num-heads", str(H), "--inputs", plain], 1,
                          f"tensor '{prefix}q_norm.weight': expected shape [{hd}]")

    # -- Hugging Face checkpoints (tests/data/hf: transformers' own outputs) -------------------

    HF_ATOL = 1e-4
    HF_RTOL = 1e-4

    def hf_checkpoints(self):
        """mha-run --hf on every fixture case exactly as a user types it: --layer or --prefix,
        the case's inputs file, attn_output against transformers within 1e-4 + 1e-4 |x|; the
        causal modules also through --kv-dtype f32 against transformers' token-by-token run
        (inputs without positions: the cache's positions are 0..L-1; entries that start
        elsewhere are compared where the attention depends only on p_i - p_j)."""
        import json
        hf_dir = os.path.join(os.path.dirname(os.path.abspath(self.golden_dir)), "hf")
        cases = sorted(d for d in os.listdir(hf_dir) if os.path.isdir(os.path.join(hf_dir, d)))
        if len(cases) < 25:
            fail(f"hf: expected the fixture cases under {hf_dir}, found {len(cases)}")
            return
        ran = decoded = 0
        for case in cases:
            d = os.path.join(hf_dir, case)
            meta = json.load(open(os.path.join(d, "case.json")))
            config = json.load(open(os.path.join(d, "checkpoint", "config.json")))
            rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
            rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
            length_dependent = rope_type in ("dynamic", "longrope", "su")
            expected, _ = self.st.load_file(os.path.join(d, "expected.safetensors"))
            inputs_path = os.path.join(d, "inputs.safetensors")
            inputs, _ = self.st.load_file(inputs_path)
            for m in meta["modules"]:
                which = (["--prefix", m["prefix"]] if m["prefix"] is not None
                         else ["--layer", str(m["layer"])])
                label = f"hf_{case}_{m['name']}"
                got = self.run_ok(label, ["--hf", os.path.join(d, "checkpoint")] + which +
                                  ["--inputs", inputs_path], self.path(label + ".safetensors"))
                if got is None:
                    continue
                want = expected[m["name"] + ".attn_output"]
                self.hf_compare(label, got["attn_output"], want)
                ran += 1
                if m["name"] + ".decode_output" not in expected:
                    continue
                query_only = self.path(label + "_query.safetensors")
                self.st.save_file({"query": inputs["query"]}, query_only)
                got = self.run_ok(label + "_decode", ["--hf", os.path.join(d, "checkpoint")] +
                                  which + ["--inputs", query_only, "--kv-dtype", "f32"],
                                  self.path(label + "_decode.safetensors"))
                if got is None:
                    continue
                want = expected[m["name"] + ".decode_output"]
                pos = inputs.get("positions")
                L = want.shape[1]
                rows = [n for n in range(want.shape[0])
                        if pos is None or (pos[n] == np.arange(L)).all()]
                if length_dependent and len(rows) < want.shape[0]:
                    continue  # the batch's largest position sets the length (README)
                rows = range(want.shape[0]) if not length_dependent else rows
                for n in rows:
                    self.hf_compare(f"{label}_decode[{n}]", got["attn_output"][n], want[n])
                decoded += 1
        if ran < 35 or decoded < 20:
            fail(f"hf: ran {ran} modules and decoded {decoded}, expected >= 35 and >= 20")
        print(f"ok: mha-run --hf on {len(cases)} checkpoints: {ran} modules, {decoded} decoded")
        d = os.path.join(hf_dir, "llama")
        args = ["--hf", os.path.join(d, "checkpoint"), "--inputs",
                os.path.join(d, "inputs.safetensors")]
        self.expect_error("hf_no_layer", args, 2, "--layer, --prefix: expected exactly one")
        self.expect_error("hf_num_heads", args + ["--layer", "1", "--num-heads", "4"], 2,
                          "--num-heads: not with --hf")
        self.expect_error("hf_weights", args + ["--layer", "1", "--weights", "x.safetensors"], 2,
                          "--weights: not with --hf")
        self.expect_error("hf_layer_without_hf", ["--weights", "w.safetensors", "--num-heads", "2",
                                                  "--layer", "1", "--inputs", "i.safetensors"], 2,
                          "--layer: needs --hf DIR")
        self.expect_error("hf_layer_out_of_range", args + ["--layer", "7"], 1, "layer")
        self.expect_error("hf_missing_folder", ["--hf", self.path("no_such_dir"), "--layer", "0",
                                                "--inputs", os.path.join(d, "inputs.safetensors")],
                          1, "config.json")
        self.expect_error("hf_kv_positions", args + ["--layer", "1", "--kv-dtype", "f32"], 1,
                          "positions other than 0..L-1")

    def hf_compare(self, label, got, want):
        if got.shape != want.shape:
            fail(f"{label}: shape {got.shape}, want {want.shape}")
            return
        bad = np.abs(got - want) > self.HF_ATOL + self.HF_RTOL * np.abs(want)
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            fail(f"{label}: attn_output{i} = {got[i]}, want {want[i]} ({int(bad.sum())} off)")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    mha_run, export_py, golden_dir = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="mha_run_test_") as tmp:
        c = Checker(os.path.abspath(mha_run), os.path.abspath(export_py), golden_dir, tmp)
        c.errors()
        c.golden()
        c.grouped_query_and_16bit()
        c.variants()
        c.hf_checkpoints()
        try:
            import torch  # noqa: F401
        except ImportError:
            torch = None
        if torch is not None:
            torch.set_num_threads(1)
            c.torch_cases()
            c.whole_model_state_dict()
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    if torch is None:
        print("SKIP: torch is not importable; error and golden checks passed")
        return SKIP
    print("all mha-run checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
