"""max-autotune for kiln's Triton kernels: time a few launch configs on the first call, keep the
fastest, and remember it on disk so later processes skip the timing.

The choice is keyed by (source hash, numels): one kernel serves every size of a symbolic dim, and
the best blocks differ by size. Candidates come from `heuristics.autotune_candidates` (the
heuristic's choice first). Buffers the kernel writes are cloned for timing, so a kernel that
updates a buffer in place is launched for real exactly once.

Hands on: `tune(kernel, numels, args, timer=None) -> LaunchConfig`, `cache_name(kernel)`.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Sequence

import torch

from kiln.codegen.triton import heuristics
from kiln.codegen.triton.heuristics import LaunchConfig
from kiln.codegen.triton.source_cache import source_hash
from kiln.runtime import store

Timer = Callable[[Callable[[], None]], float]


def cache_name(kernel) -> str:
    """The cache entry (`kiln.runtime.store`, kind "autotune") of `kernel`'s choices."""
    return f"{source_hash(kernel.source)}.json"


def _read(kernel) -> dict:
    return store.read_json("autotune", cache_name(kernel)) or {}


def gpu_timer(fn: Callable[[], None]) -> float:
    """Median milliseconds of `fn` on the GPU (Triton's benchmark: flushes L2 between runs)."""
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def tune(kernel, numels: tuple[int, ...], args: Sequence, timer: Timer | None = None) -> LaunchConfig:
    """The fastest of the candidate configs for `kernel` (a `TritonKernel`) at these numels."""
    key = ",".join(map(str, numels))
    table = _read(kernel)
    if key in table:
        return LaunchConfig(**table[key])
    layout = kernel.layout
    candidates = heuristics.autotune_candidates(layout.kind, numels[0], max(numels[1:], default=1),
                                                layout.rows_contiguous)
    scratch = list(args)
    for i in kernel.spec.written:
        if isinstance(args[i], torch.Tensor):
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
    table = _read(kernel)         # another process may have written meanwhile: merge
    table[key] = dataclasses.asdict(best)
    store.write_json("autotune", cache_name(kernel), table)
    return best
