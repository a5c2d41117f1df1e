"""Decoding's matrix products at the bandwidth limit (issue #36): for the linear layers of dolly-v2-3b
and a 1.1B LLaMA at 1 and 16 tokens, how close cuBLAS (`F.linear`, what kiln and Inductor call
today) comes to reading the weight at the copy bandwidth measured on the same card, against a
plain Triton GEMV (each program a block of output features over all of K, the weight read once,
no split-K pass) over a few tilings. A probe: it says whether a kiln GEMV template has headroom
over cuBLAS at these shapes, before one is built.

    python bench/gemv_probe.py [--out DIR] [--tokens 1,16]
    python bench/gemv_probe.py --kiln [--tokens 1,2,4,8]

`--kiln` times what a decoding layer runs, linear + GELU + residual add in bfloat16 (`kiln_layer`),
compiled by kiln in the default mode (`dynamic=False`): with its GEMV form ([Note: GEMV by default]
in kiln/codegen/triton/heuristics.py), one kernel; with the form turned off (`GEMV_DEFAULT_ROWS =
0`: cuBLAS, then one fused pointwise kernel, kiln before the form); and eagerly (cuBLAS and two
pointwise kernels), next to cuBLAS's product alone and the floor. It says which form kiln chose.

Times are CUDA-graph replays of 20 calls (launch cost out), median of 15, per call."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics

import torch
import triton
import triton.language as tl

from kiln.bench.decoding import copy_bandwidth

SHAPES = {  # name -> (K, N): in features, out features
    "dolly qkv": (2560, 7680), "dolly dense": (2560, 2560), "dolly fc1": (2560, 10240),
    "dolly fc2": (10240, 2560), "dolly head": (2560, 50280),
    "llama qkv": (2048, 2560), "llama o": (2048, 2048), "llama gate+up": (2048, 11264),
    "llama down": (5632, 2048), "llama head": (2048, 32000),
}
TILINGS = {  # tokens < 16: a multiply and row sum; 16 and more: a tensor-core dot
    "rows": [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn, bk, w in itertools.product((4, 8, 16, 32), (256, 512), (4, 8))],
    "dot": [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4) for bn, bk in itertools.product((16, 32, 64), (128, 256))],
}


@triton.jit
def _gemv(x_ptr, w_ptr, out_ptr, M, N, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for a handful of rows m: a multiply and a row sum per block."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    for m in range(0, BLOCK_M):   # M is tiny: one row of x at a time, the weight block reused from cache
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
            x = tl.load(x_ptr + m * K + rk, mask=(rk < K) & (m < M), other=0.0)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(out_ptr + m * N + rn, acc.to(out_ptr.dtype.element_ty), mask=(rn < N) & (m < M))


@triton.jit
def _gemv_dot(x_ptr, w_ptr, out_ptr, M, N, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The same product for 16 rows and more: one tensor-core dot per block, the weight read once."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        rk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(x, w)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemv(x, w, out, tiling):
    M, K = x.shape
    N = w.shape[0]
    grid = (triton.cdiv(N, tiling["BLOCK_N"]),)
    kernel = _gemv if M < 16 else _gemv_dot
    kernel[grid](x, w, out, M, N, K, BLOCK_M=M, BLOCK_N=tiling["BLOCK_N"],
                 BLOCK_K=tiling["BLOCK_K"], num_warps=tiling["num_warps"])


def per_call_us(fn, calls: int = 20, reps: int = 15) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def kiln_layer(x, w, b, r):
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) + r


def _kiln_compiled(gemv: bool, inputs):
    """kiln_layer compiled in the default mode, with or without the GEMV form; and the forms of the
    template kernels it built. Each compile gets an empty cache folder, so neither program is the
    other's from the disk cache."""
    import tempfile
    import kiln
    from kiln.codegen.triton import heuristics, launcher
    saved = heuristics.GEMV_DEFAULT_ROWS
    heuristics.GEMV_DEFAULT_ROWS = saved if gemv else 0
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-gemv-probe-")
    try:
        kiln.reset()
        before = {id(k) for k in launcher.BUILT}
        fn = kiln.compile(kiln_layer, dynamic=False)
        fn(*inputs)
        torch.cuda.synchronize()
    finally:
        heuristics.GEMV_DEFAULT_ROWS = saved
    built = [k for k in launcher.BUILT if id(k) not in before]
    return fn, [k.template["form"] for k in built if k.template] or ["extern"], len(built)


def kiln_rows(tokens, bandwidth) -> list[dict]:
    """--kiln: the layer compiled by kiln with and without the GEMV form, eager, cuBLAS alone."""
    rows = []
    for (name, (K, N)), M in itertools.product(SHAPES.items(), tokens):
        torch.manual_seed(0)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        x, b, r = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((M, K), (N,), (M, N)))
        inputs = (x, w, b, r)
        floor_us = (w.numel() + x.numel() + b.numel() + 2 * r.numel()) * 2 / bandwidth * 1e6
        ref = kiln_layer(*(t.double() for t in inputs))
        row = dict(shape=name, M=M, K=K, N=N, floor_us=floor_us,
                   cublas_us=per_call_us(lambda: torch.nn.functional.linear(x, w)),
                   eager_us=per_call_us(lambda: kiln_layer(*inputs)))
        for label, gemv in (("kiln_gemv", True), ("kiln_extern", False)):
            fn, forms, kernels = _kiln_compiled(gemv, inputs)
            err = ((fn(*inputs).double() - ref).abs().max() / ref.abs().max()).item()
            row[label + "_us"], row[label + "_forms"], row[label + "_kernels"], row[label + "_err"] = (
                per_call_us(lambda: fn(*inputs)), forms, kernels, err)
        rows.append(row)
        print(f"{name:14s} M={M:2d}: floor {floor_us:6.1f} us  cuBLAS alone {row['cublas_us']:6.1f}  "
              f"eager layer {row['eager_us']:6.1f}  kiln extern+epilogue {row['kiln_extern_us']:6.1f}  "
              f"kiln default {row['kiln_gemv_us']:6.1f} ({'+'.join(row['kiln_gemv_forms'])}, "
              f"{row['kiln_gemv_kernels']} kernel(s), rel err {row['kiln_gemv_err']:.1e}; "
              f"{floor_us / row['kiln_gemv_us']:4.0%} of floor)")
    for M in tokens:
        for model in ("dolly", "llama"):
            part = [r for r in rows if r["M"] == M and r["shape"].startswith(model)]
            print(f"| {model} M={M} | floor {sum(r['floor_us'] for r in part):.0f} us "
                  f"| eager {sum(r['eager_us'] for r in part):.0f} us "
                  f"| kiln extern+epilogue {sum(r['kiln_extern_us'] for r in part):.0f} us "
                  f"| kiln default {sum(r['kiln_gemv_us'] for r in part):.0f} us |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--tokens", default="1,16")
    p.add_argument("--kiln", action="store_true", help="time kiln's compiled linear + GELU + residual")
    a = p.parse_args()
    dev = "cuda"
    bandwidth = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    if a.kiln:
        rows = kiln_rows(list(map(int, a.tokens.split(","))), bandwidth)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "gemv_probe_kiln.json"), "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name(), bandwidth=bandwidth, rows=rows), f, indent=1)
        return
    rows = []
    for (name, (K, N)), M in itertools.product(SHAPES.items(), map(int, a.tokens.split(","))):
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        floor_us = (w.numel() + x.numel() + out.numel()) * 2 / bandwidth * 1e6
        ref = torch.nn.functional.linear(x.double(), w.double())
        cublas = per_call_us(lambda: torch.nn.functional.linear(x, w))
        best = None
        for tiling in TILINGS["rows" if M < 16 else "dot"]:
            try:
                gemv(x, w, out, tiling)
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                if err > 2e-2:
                    raise AssertionError(f"wrong result: relative error {err:.3g}")
                t = per_call_us(lambda: gemv(x, w, out, tiling))
            except Exception as e:   # a tiling Triton cannot compile here, say which
                print(f"  {name} M={M} {tiling}: {type(e).__name__}: {str(e)[:80]}")
                continue
            if best is None or t < best[0]:
                best = (t, tiling)
        row = dict(shape=name, M=M, K=K, N=N, floor_us=floor_us, cublas_us=cublas,
                   triton_us=best[0] if best else None, triton_tiling=best[1] if best else None)
        rows.append(row)
        print(f"{name:14s} M={M:2d}: floor {floor_us:6.1f} us  cuBLAS {cublas:6.1f} ({floor_us / cublas:4.0%})  "
              f"Triton GEMV {best[0] if best else float('nan'):6.1f} "
              f"({floor_us / best[0] if best else 0:4.0%}) {best[1] if best else ''}")
    for M in map(int, a.tokens.split(",")):
        sel = [r for r in rows if r["M"] == M and r["triton_us"]]
        for model in ("dolly", "llama"):
            part = [r for r in sel if r["shape"].startswith(model)]
            print(f"| {model} M={M} | floor {sum(r['floor_us'] for r in part):.0f} us | cuBLAS {sum(r['cublas_us'] for r in part):.0f} us "
                  f"| Triton GEMV (best tiling each) {sum(r['triton_us'] for r in part):.0f} us |")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "gemv_probe.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), bandwidth=bandwidth, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
