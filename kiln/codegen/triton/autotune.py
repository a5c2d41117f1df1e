"""max-autotune for kiln's Triton kernels: time a few launch configs on the first call, keep the
fastest, and remember it on disk so later processes skip the timing.

The choice is keyed by (source hash, numels): one kernel serves every size of a symbolic dim, and
the best blocks differ by size. Candidates come from `heuristics.autotune_candidates` (the
heuristic's choice first). Buffers the kernel writes are cloned for timing, so a kernel that
updates a buffer in place is launched for real exactly once.

Hands on: `tune(kernel, numels, args, timer=None) -> LaunchConfig`, `cache_file(kernel)`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import warnings
from typing import Callable, Sequence

import torch

from kiln.codegen import ir
from kiln.codegen.triton import heuristics
from kiln.codegen.triton.heuristics import LaunchConfig
from kiln.codegen.triton.source_cache import cache_dir, source_hash

Timer = Callable[[Callable[[], None]], float]


def cache_file(kernel) -> str:
    return os.path.join(cache_dir(), "autotune", f"{source_hash(kernel.source)}.json")


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write(path: str, table: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def gpu_timer(fn: Callable[[], None]) -> float:
    """Median milliseconds of `fn` on the GPU (Triton's benchmark: flushes L2 between runs)."""
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def _written(kernel: ir.Kernel) -> set[str]:
    return {s.buffer for stage in kernel.stages for s in stage.body if isinstance(s, ir.Store)}


def tune(kernel, numels: tuple[int, ...], args: Sequence, timer: Timer | None = None) -> LaunchConfig:
    """The fastest of the candidate configs for `kernel` (a `TritonKernel`) at these numels."""
    path = cache_file(kernel)
    key = ",".join(map(str, numels))
    table = _read(path)
    if key in table:
        return LaunchConfig(**table[key])
    layout = kernel.layout
    candidates = heuristics.autotune_candidates(layout.kind, numels[0], max(numels[1:], default=1),
                                                layout.rows_contiguous)
    written = _written(kernel.kernel)
    scratch = list(args)
    for i, name in enumerate(kernel.kernel.buffer_args):
        if name in written and isinstance(args[i], torch.Tensor):
            scratch[i] = args[i].clone()
    timer = timer or gpu_timer
    timings = []
    for config in candidates:
        try:
            elapsed = timer(lambda c=config: kernel.launch(c, scratch, numels))
        except Exception as e:  # a config that does not compile (too many registers) is skipped
            warnings.warn(f"kiln autotune: kernel {layout.name} with {config.describe()} failed "
                          f"({type(e).__name__}: {e}); trying the other configs")
            continue
        timings.append((elapsed, config))
    if not timings:
        raise RuntimeError(f"autotune of Triton kernel {layout.name}: every config failed; "
                           f"run without mode='max-autotune' to use the heuristic blocks")
    best = min(timings, key=lambda t: t[0])[1]
    table = _read(path)           # another process may have written meanwhile: merge
    table[key] = dataclasses.asdict(best)
    _write(path, table)
    return best
