"""max-autotune's Triton matmul templates on the GPU (issue #40): for a few matrix-product shapes
with a pointwise epilogue (bias, GELU, residual add), one process, eager / Inductor (default) /
kiln (default: cuBLAS + a fused epilogue kernel) / kiln max-autotune-no-cudagraphs (a template
with the epilogue in its store) interleaved; prints each one's median time, the ratios, and the
error against float64 next to eager's.

    python bench/matmul_template_probe.py [--dtype bf16] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

import kiln

SHAPES = [  # (M, N, K): a batch of tokens times a layer's weight
    (512, 768, 768), (2048, 3072, 768), (4096, 4096, 4096), (8192, 1024, 4096), (128, 11008, 4096),
]


def _fn(x, w, b, r):
    return torch.nn.functional.gelu(torch.addmm(b, x, w)) + r


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    forms = {
        "eager": _fn,
        "inductor": torch.compile(_fn, dynamic=False),
        "kiln": kiln.compile(_fn, dynamic=False),
        "kiln-max-autotune": kiln.compile(_fn, dynamic=False, mode="max-autotune-no-cudagraphs"),
    }
    rows = []
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
        w = (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).to(dtype)
        b = torch.randn(n, device="cuda", generator=g).to(dtype)
        r = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        inputs = (x, w, b, r)
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
