"""GB/s of memory-bound kernels through kiln, next to a plain copy on the same GPU, in one run.

    python -m kiln.bench.bandwidth [--size 8192] [--dtype float32] [--path kiln|backend]

Each program (a gelu chain, softmax, layer_norm over rows of a size x size tensor) reads its input
once and writes its output once when fused well, so its bytes moved are those of a copy; the
target is >= 90% of the copy's GB/s. `--path kiln` compiles through `kiln.compile` (capture and
all); `--path backend` hands an FX trace straight to the kiln backend (aot, prims, codegen), which
isolates the code generator when capture is the problem. Timing is Triton's `do_bench` (median
ms, L2 flushed between runs). The table lists each program's kernels and launch configs.
"""
from __future__ import annotations

import argparse
import math
import sys
import traceback

import torch
import torch.nn.functional as F


def gelu_chain(x):
    return F.gelu(x * 1.5 + 0.5) * torch.sigmoid(x)


def softmax(x):
    return torch.softmax(x, dim=-1)


def make_layer_norm(n: int, device, dtype):
    weight = torch.randn(n, device=device, dtype=dtype)
    bias = torch.randn(n, device=device, dtype=dtype)

    def layer_norm(x):
        return F.layer_norm(x, (n,), weight, bias, 1e-5)
    return layer_norm


def compile_with(path: str, fn, x):
    if path == "kiln":
        import kiln
        return kiln.compile(fn, dynamic=False, fullgraph=True)
    from kiln.pipeline import compile_graph_module
    gm = torch.fx.symbolic_trace(fn)
    call = compile_graph_module(gm, [x])
    return lambda inp: call(inp)


def measure(fn, x) -> float:
    import triton.testing
    return float(triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median"))


def kernels_of_last_build(before: set) -> list[str]:
    from kiln.codegen.triton.launcher import BUILT
    rows = []
    for k in list(BUILT):
        if id(k) in before:
            continue
        configs = ", ".join(c.describe() for c in k.configs.values()) or "not launched"
        rows.append(f"{k.layout.name} ({k.layout.kind}): {configs}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--path", default="kiln", choices=["kiln", "backend"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bandwidth: needs a CUDA device (this measures GPU kernels)", file=sys.stderr)
        return 2
    import triton
    from kiln.codegen.triton.launcher import BUILT

    device, dtype, n = "cuda", getattr(torch, args.dtype), args.size
    x = torch.randn(n, n, device=device, dtype=dtype)
    nbytes = 2 * x.numel() * x.element_size()          # one read and one write of the tensor
    print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"input {n}x{n} {args.dtype}; bytes per program {nbytes / 1e9:.3f} GB (read + write); path {args.path}")

    out = torch.empty_like(x)
    copy_ms = measure(lambda t: out.copy_(t), x)
    copy_gbs = nbytes / copy_ms / 1e6
    rows = [("copy (torch)", copy_ms, copy_gbs, "100.0%", "ok", [])]
    with torch.no_grad():
        for name, fn in [("gelu chain", gelu_chain), ("softmax", softmax),
                         ("layer_norm", make_layer_norm(n, device, dtype))]:
            before = {id(k) for k in BUILT}
            try:
                compiled = compile_with(args.path, fn, x)
                got = compiled(x)
                got = got[0] if isinstance(got, (tuple, list)) else got
                want = fn(x)
                tol = 1e-4 if dtype == torch.float32 else 2e-2
                status = "ok" if torch.allclose(got.float(), want.float(), rtol=tol, atol=tol) else "WRONG"
                ms = measure(compiled, x)
                gbs = nbytes / ms / 1e6
                rows.append((name, ms, gbs, f"{100 * gbs / copy_gbs:.1f}%", status, kernels_of_last_build(before)))
            except Exception as e:  # report and go on: one failing program should not hide the others
                traceback.print_exc()
                rows.append((name, math.nan, math.nan, "-", f"failed: {type(e).__name__}: {e}"[:120], []))
    print(f"\n{'program':<14} {'ms':>9} {'GB/s':>9} {'of copy':>8}  status")
    for name, ms, gbs, frac, status, kernels in rows:
        print(f"{name:<14} {ms:>9.4f} {gbs:>9.1f} {frac:>8}  {status}")
        for k in kernels:
            print(f"{'':<16}kernel {k}")
    ok = all(r[4] == "ok" for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
