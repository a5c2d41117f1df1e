"""max-autotune's Triton matmul templates on the GPU (issue #40): for a few matrix-product shapes
with a pointwise epilogue (bias, GELU, residual add), one process, eager / Inductor (default) /
kiln (default: cuBLAS + a fused epilogue kernel) / kiln max-autotune-no-cudagraphs (a template
with the epilogue in its store) interleaved; prints each one's median time, the ratios, and the
error against float64 next to eager's.

    python bench/matmul_template_probe.py [--dtype bf16] [--out DIR]

`--autotune` instead shows the autotuner ([Note: matmul autotuning]): for each of `AUTOTUNE_SHAPES`
(`x @ w`, or with `--epilogue` `gelu(x @ w + b) + r`) a kiln max-autotune-no-cudagraphs compile in a
fresh cache (so every candidate is timed), then its pick, the pick's time and cuBLAS's (as the
autotuner timed them), the configurations benchmarked, the compile's seconds, the compiled call
against eager timed again, and the error against float64; then a second compile (kiln.reset(),
same cache) that must benchmark 0. One GPU call, under two minutes.

    python bench/matmul_template_probe.py --autotune [--epilogue] [--dtype bf16] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import kiln

SHAPES = [  # (M, N, K): a batch of tokens times a layer's weight
    (512, 768, 768), (2048, 3072, 768), (4096, 4096, 4096), (8192, 1024, 4096), (128, 11008, 4096),
]


# (M, N, K): a layer, a square product, one token of decoding, GPT-2's logits
AUTOTUNE_SHAPES = [(512, 768, 768), (4096, 4096, 4096), (1, 4096, 4096), (2048, 50257, 768)]


def _mm(x, w, b, r):
    return x @ w


def _fn(x, w, b, r):
    return torch.nn.functional.gelu(torch.addmm(b, x, w)) + r


def _inputs(m: int, n: int, k: int, dtype: torch.dtype) -> tuple:
    """(x, w, bias, residual) for an m x n x k product, the same numbers for every form."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=g).to(dtype)
    r = torch.randn(m, n, device="cuda", generator=g).to(dtype)
    return x, w, b, r


def _time(fn, args, reps=30) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rmse(a, ref) -> float:
    return ((a.double() - ref) ** 2).mean().sqrt().item()


def _decisions(folder: str) -> list[dict]:
    from kiln.trace import TRACE_FILE
    with open(os.path.join(folder, TRACE_FILE)) as f:
        return [d for e in map(json.loads, f) if e["kind"] == "schedule" for d in e.get("matmuls", [])]


def autotune_main(args, dtype) -> None:
    from kiln import trace
    from kiln.codegen.triton.autotune import gpu_timer
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-autotune-probe-")   # every candidate timed
    fn = _fn if args.epilogue else _mm
    rows = []
    for m, n, k in AUTOTUNE_SHAPES:
        inputs = _inputs(m, n, k, dtype)
        row = {"shape": f"{m}x{n}x{k}", "dtype": args.dtype, "fn": fn.__name__}
        for attempt in ("cold", "warm"):
            kiln.reset()
            folder = tempfile.mkdtemp(prefix="kiln-autotune-trace-")
            trace.configure(folder=folder, log="")
            started = time.perf_counter()
            try:
                compiled = kiln.compile(fn, dynamic=False, mode="max-autotune-no-cudagraphs")
                out = compiled(*inputs)
                torch.cuda.synchronize()
            except Exception as e:  # a row that says why
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                break
            finally:
                trace.configure(folder="", log="")
            row[f"{attempt}_compile_s"] = time.perf_counter() - started
            decisions = _decisions(folder)
            row[f"{attempt}_benchmarked"] = sum(d["benchmarked"] for d in decisions)
            if attempt == "cold":
                row["decisions"] = decisions
        if "error" not in row:
            ref = fn(*(t.double() for t in inputs))
            row["rmse"], row["eager_rmse"] = _rmse(out, ref), _rmse(fn(*inputs), ref)
            row["compiled_ms"] = gpu_timer(lambda: compiled(*inputs))
            row["eager_ms"] = gpu_timer(lambda: fn(*inputs))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| shape | pick | pick ms | cuBLAS ms (+ epilogue pass) | pick / cuBLAS | benchmarked cold / warm "
          "| compile s cold / warm | compiled ms | eager ms | rmse / eager |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['shape']} | {row['error']} |")
            continue
        if not row["decisions"]:
            print(f"| {row['shape']} | extern only: no template candidate | | | | | | {row['compiled_ms']:.4f} "
                  f"| {row['eager_ms']:.4f} | |")
        for d in row["decisions"]:
            t = d["timings"]
            extern = t.get("extern", float("nan")) + t.get("epilogue pass", 0.0)
            pick = extern if d["choice"] == "extern" else t.get(d["choice"], float("nan"))
            print(f"| {row['shape']} | {d['choice']} | {pick:.4f} | {extern:.4f} | {extern / pick:.2f}x "
                  f"| {row['cold_benchmarked']} / {row['warm_benchmarked']} "
                  f"| {row['cold_compile_s']:.1f} / {row['warm_compile_s']:.1f} | {row['compiled_ms']:.4f} "
                  f"| {row['eager_ms']:.4f} | {row['rmse'] / row['eager_rmse']:.2f} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "matmul_autotune_probe.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--out", default=None)
    p.add_argument("--autotune", action="store_true", help="the autotuner's pick against cuBLAS")
    p.add_argument("--epilogue", action="store_true", help="with --autotune: gelu(x @ w + b) + r, not x @ w")
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if args.autotune:
        return autotune_main(args, dtype)
    forms = {
        "eager": _fn,
        "inductor": torch.compile(_fn, dynamic=False),
        "kiln": kiln.compile(_fn, dynamic=False),
        "kiln-max-autotune": kiln.compile(_fn, dynamic=False, mode="max-autotune-no-cudagraphs"),
    }
    rows = []
    for m, n, k in SHAPES:
        inputs = _inputs(m, n, k, dtype)
        ref = _fn(*(t.double() for t in inputs))
        row = {"shape": f"{m}x{n}x{k}", "dtype": args.dtype}
        for name, fn in forms.items():
            try:
                out = fn(*inputs)
                row[f"{name}_rmse"] = _rmse(out, ref)
            except Exception as e:  # a row that says why
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        times = {name: [] for name in forms if f"{name}_rmse" in row}
        for _ in range(5):  # interleaved rounds
            for name in times:
                times[name].append(_time(forms[name], inputs, reps=10))
        for name, t in times.items():
            row[f"{name}_ms"] = statistics.median(t)
        flops = 2 * m * n * k
        if "kiln-max-autotune_ms" in row:
            row["template_tflops"] = flops / row["kiln-max-autotune_ms"] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n| shape | eager ms | Inductor ms | kiln ms | kiln max-autotune ms | template / kiln | template / Inductor "
          f"| template TFLOP/s | rmse template / eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        t = {name: row.get(f"{name}_ms") for name in forms}
        def ratio(a, b):
            return f"{t[a] / t[b]:.2f}x" if t[a] and t[b] else "-"
        err = (f"{row['kiln-max-autotune_rmse'] / row['eager_rmse']:.2f}"
               if "kiln-max-autotune_rmse" in row and row["eager_rmse"] else row.get("kiln-max-autotune_error", "-"))
        fmt = lambda v: f"{v:.3f}" if v else "-"
        print(f"| {row['shape']} | {fmt(t['eager'])} | {fmt(t['inductor'])} | {fmt(t['kiln'])} "
              f"| {fmt(t['kiln-max-autotune'])} | {ratio('kiln', 'kiln-max-autotune')} "
              f"| {ratio('inductor', 'kiln-max-autotune')} | {row.get('template_tflops', 0):.0f} | {err} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "matmul_template_probe.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
