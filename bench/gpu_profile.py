"""Where a kiln step spends its time on the GPU: the step's wall time against the summed time of the
kernels it ran (the difference is host time: Python, launches), and the kernels that take the most,
for eager and kiln side by side. bf16 autocast.

    python bench/gpu_profile.py timm:convnext_tiny:infer hf:GPT2LMHeadModel:train
"""
from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import kiln
from kiln.bench.case import SuiteCase


def _wall_ms(step, n: int = 10) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def profile_one(suite: str, name: str, mode: str, top: int = 12) -> None:
    built = SuiteCase.build(f"{suite}:{name}:{mode}", "cuda")
    kiln.reset()
    for label, fn in (("eager", built.model), ("kiln", kiln.compile(built.model))):
        step = built.step(fn)
        for _ in range(3):
            step()
        wall = _wall_ms(step)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        gpu_ms = sum(e.self_device_time_total for e in events) / 1e3
        launches = sum(e.count for e in events)
        print(f"== {suite}:{name}:{mode} {label}: step {wall:.2f} ms wall, {gpu_ms:.2f} ms in {launches} kernels "
              f"(host-bound share {max(0.0, 1 - gpu_ms / wall):.0%})")
        ranked = sorted(events, key=lambda e: -e.self_device_time_total)
        for e in ranked[:top]:
            print(f"   {e.self_device_time_total / 1e3:8.3f} ms  x{e.count:<4d} {e.key[:110]}")
        if label == "kiln":
            _print_sources([e.key for e in ranked if e.key.startswith("kiln_")][:6])
        sys.stdout.flush()


def _print_sources(names: list[str]) -> None:
    """The source and launch plans of kiln's Triton kernels among `names` (the slowest)."""
    from kiln.codegen.triton.launcher import BUILT
    shown = set()
    for kernel in list(BUILT):
        if kernel.function in shown or not any(n.startswith(kernel.function) for n in names):
            continue
        shown.add(kernel.function)
        plans = {sizes: (p.numels, p.config) for sizes, p in kernel.plans.items() if p is not None}
        print(f"---- {kernel.function}: plans {plans}\n{kernel.source}")


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        profile_one(*spec.split(":"))
