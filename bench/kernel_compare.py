"""Kernel by kernel: one steady step of a suite model under Inductor and under kiln (bf16 autocast),
each kernel's summed GPU time and launches, most time first, side by side; then the loop IR and
launch plan of kiln's costliest generated kernels. What `kiln bench --profile`'s categories say in
aggregate, this says per kernel.

    python bench/kernel_compare.py timm:resnet50:train [--top 30] [--sources 8] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import kiln
from kiln.bench.case import SuiteCase


def _kernels(step) -> dict[str, list[float]]:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            entry = by_name.setdefault(e.name, [0.0, 0])
            entry[0] += e.device_time_total / 1e3
            entry[1] += 1
    return by_name


def _wall_ms(step, n: int = 15) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def compare(spec: str, top: int, sources: int, out: str | None) -> None:
    built = SuiteCase.build(spec, "cuda")
    kiln.reset()
    steps = {"inductor": built.step(torch.compile(built.model)), "kiln": built.step(kiln.compile(built.model))}
    tables = {}
    for label, step in steps.items():
        for _ in range(3):
            step()
        wall = _wall_ms(step)
        kernels = _kernels(step)
        busy = sum(ms for ms, _ in kernels.values())
        launches = sum(n for _, n in kernels.values())
        print(f"== {spec} {label}: wall {wall:.2f} ms, kernels {busy:.2f} ms in {launches} launches")
        tables[label] = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    for label, rows in tables.items():
        print(f"-- {label}, top {top}")
        for kname, (ms, n) in rows[:top]:
            print(f"   {ms:7.3f} ms x{n:<4d} {ms / n * 1e3:8.1f} us  {kname[:100]}")
    if out:
        _write_sources([k for k, _ in tables["kiln"] if k.startswith("kiln_")][:sources],
                       os.path.join(out, f"{built.case.model}_{built.case.mode}_kiln_sources.txt"))


def _write_sources(names: list[str], path: str) -> None:
    from kiln.codegen.triton.launcher import BUILT
    by_function = {k.function: k for k in BUILT}
    with open(path, "w") as f:
        for n in names:
            k = by_function.get(n.removesuffix("_looped")) or by_function.get(n)
            if k is None:
                continue
            f.write(f"---- {n}: plans {{{', '.join(f'{s}: {p.numels} {p.config}' for s, p in k.plans.items() if p)}}}\n")
            f.write(k.source + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help="suite:model:mode")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sources", type=int, default=8)
    p.add_argument("--out", default=os.environ.get("OUT"))
    a = p.parse_args()
    for spec in a.cases:
        compare(spec, a.top, a.sources, a.out)


if __name__ == "__main__":
    main()
