"""Host time of a compiled step: the model at a batch so small that the GPU waits for the host, so a
step's wall time is (almost) its host time; eager, Inductor and kiln interleaved in one process.
Then the cost of the pieces a kiln host program is made of (a Triton launch, an allocation, an
extern call), and a cProfile of kiln's step by own time.

    python bench/host_overhead.py timm:resnet50:train hf:GPT2LMHeadModel:infer --batch 2
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

import kiln
from kiln.bench.case import SuiteCase


def _per_call_us(fn, n: int = 2000) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def pieces() -> None:
    """Microsecond costs of one launch, allocation and extern call, host side."""
    dev = torch.device("cuda")
    a, b = torch.randn(1024, device=dev), torch.randn(1024, device=dev)
    fn = kiln.compile(lambda x, y: (x * y + 1).relu())
    fn(a, b)
    from kiln.codegen.triton.launcher import BUILT
    kernel = next(k for k in BUILT if k.spec.arg_dtypes == ("torch.float32",) * 3)
    out = torch.empty_like(a)
    rows = {
        "kiln Triton launch, 3 tensors (TritonKernel.__call__)": _per_call_us(lambda: kernel(a, b, out)),
        "torch.empty_strided, device string": _per_call_us(
            lambda: torch.empty_strided((128, 64, 56, 56), (200704, 1, 3584, 64), dtype=torch.bfloat16, device="cuda:0")),
        "torch.empty_strided, device object": _per_call_us(
            lambda: torch.empty_strided((128, 64, 56, 56), (200704, 1, 3584, 64), dtype=torch.bfloat16, device=dev)),
        "eager a * b (one ATen kernel)": _per_call_us(lambda: a * b),
        "compiled (x*y+1).relu(), whole call": _per_call_us(lambda: fn(a, b)),
    }
    direct = next(iter(kernel.direct.values()), None)
    if direct is not None:
        rows["kiln direct launch (_DirectLaunch.launch)"] = _per_call_us(lambda: direct.launch((a, b, out)))
    x = torch.randn(2, 64, 8, 8, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    conv = torch.ops.aten.convolution.default
    rows["aten.convolution.default (OpOverload)"] = _per_call_us(
        lambda: conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), 500)
    rows["F.conv2d"] = _per_call_us(lambda: torch.nn.functional.conv2d(x, w, None, 1, 1), 500)
    for name, us in rows.items():
        print(f"  {us:8.2f} us  {name}")


def host_time(spec: str, batch: int, steps: int, top: int) -> None:
    built = SuiteCase.build(spec, "cuda", batch)
    kiln.reset()
    compiled = {"eager": built.model, "inductor": torch.compile(built.model), "kiln": kiln.compile(built.model)}
    run = {label: built.step(fn) for label, fn in compiled.items()}
    for step in run.values():
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {label: [] for label in run}
    for _ in range(steps):
        for label, step in run.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times[label].append((time.perf_counter() - start) * 1e3)
    ms = {label: statistics.median(t) for label, t in times.items()}
    print(f"== {spec} batch {batch}: step wall ms (median of {steps}): "
          + ", ".join(f"{label} {v:.2f}" for label, v in ms.items())
          + f"; kiln / inductor {ms['inductor'] / ms['kiln']:.2f}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        run["kiln"]()
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="suite:model:mode")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    pieces()
    for spec in a.cases:
        host_time(spec, a.batch, a.steps, a.top)


if __name__ == "__main__":
    main()
