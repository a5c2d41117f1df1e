"""Issue #17, item 3 at the kernel level: BERT-base's memory-bound pieces compiled by kiln with a
symbolic sequence length (`dynamic=True`, one program) and statically (`dynamic=False`, a program
per length), timed at each length; `dyn/static` is the symbolic program's speed relative to the
static one (the target: >= 0.90 everywhere). Attention and the matrix products are left out (cuBLAS
and SDPA run them the same either way), so what this shows is kiln's own kernels: index math over
runtime sizes ([Note: one division per symbolic dim]), fusion ([Note: symbolic index bounds]) and
launch configs (chosen per call from the sizes in both).

    python bench/dynamic_kernels.py [--device cuda] [--dtype bfloat16] [--batch 16]
                                    [--lengths 128,200,256,317,384,450,512] [--json out.jsonl]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

import kiln

HIDDEN, HEADS, FFN = 768, 12, 3072


def split_heads(x, bias):
    """The q/k/v bias add and head split before SDPA: [b, t, 768] -> [b, 12, t, 64]."""
    b, t, _ = x.shape
    return (x + bias).view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2).contiguous()


def merge_heads(a):
    """SDPA's output back to rows: [b, 12, t, 64] -> [b, t, 768]."""
    b, h, t, d = a.shape
    return a.transpose(1, 2).reshape(b, t, h * d)


def bias_gelu(x, bias):
    return F.gelu(x + bias)


def add_layer_norm(x, residual, weight, bias):
    return F.layer_norm(x + residual, (HIDDEN,), weight, bias, 1e-12)


def _inputs(name: str, batch: int, length: int, device, dtype):
    def r(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)
    return {"split_heads": lambda: (r(batch, length, HIDDEN), r(HIDDEN)),
            "merge_heads": lambda: (r(batch, HEADS, length, HIDDEN // HEADS),),
            "bias_gelu": lambda: (r(batch, length, FFN), r(FFN)),
            "add_layer_norm": lambda: (r(batch, length, HIDDEN), r(batch, length, HIDDEN), r(HIDDEN), r(HIDDEN)),
            }[name]()


PROGRAMS = {"split_heads": split_heads, "merge_heads": merge_heads, "bias_gelu": bias_gelu,
            "add_layer_norm": add_layer_norm}


def _time(fn, device: str, steps: int = 50) -> float:
    """Median milliseconds of fn (Triton's do_bench on CUDA, which flushes L2 between runs)."""
    if device == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _run(dynamic: bool, lengths, a, device, dtype) -> dict:
    kiln.reset()
    out = {}
    for name, fn in PROGRAMS.items():
        compiled = kiln.compile(fn, dynamic=dynamic, options={"cache_size_limit": len(lengths) + 8})
        for length in lengths:
            args = _inputs(name, a.batch, length, device, dtype)
            torch.testing.assert_close(compiled(*args), fn(*args), rtol=2e-2, atol=2e-2)   # compiles, checks
            out[(name, length)] = _time(lambda: compiled(*args), device)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lengths", default="128,200,256,317,384,450,512")
    p.add_argument("--json", help="append one JSON line per (program, length) to this file")
    a = p.parse_args()
    lengths = tuple(int(x) for x in a.lengths.split(","))
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = _run(True, lengths, a, a.device, dtype)
        static = _run(False, lengths, a, a.device, dtype)
    print(f"kiln kernels, {a.device}, {a.dtype}, batch {a.batch}: dynamic=True vs dynamic=False")
    print(f"{'program':>15} {'length':>6} {'dynamic ms':>10} {'static ms':>9} {'dyn/static':>10}")
    rows = []
    for (name, length), ms in dynamic.items():
        ratio = static[(name, length)] / ms
        rows.append({"program": name, "length": length, "dynamic_ms": ms, "static_ms": static[(name, length)],
                     "ratio": ratio})
        print(f"{name:>15} {length:>6} {ms:>10.4f} {static[(name, length)]:>9.4f} {ratio:>9.2f}x")
    print(f"slowest relative to static: {min(r['ratio'] for r in rows):.2f}x (target >= 0.90)")
    if a.json:
        with open(a.json, "a") as f:
            for row in rows:
                f.write(json.dumps({"device": a.device, "dtype": a.dtype, "batch": a.batch, **row}) + "\n")


if __name__ == "__main__":
    main()
