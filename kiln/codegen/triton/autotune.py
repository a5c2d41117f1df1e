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
import statistics
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


# [Note: kiln's GPU timer] One small loop, as Triton's `do_bench` times: the call once (compiles,
# allocates), a first estimate over 5 calls, then enough calls to fill about `rep_ms` (5 at least,
# 500 at most) after `warmup_ms` of warm-up, each between a pair of CUDA events and each after a
# write of 256 MiB (more than any GPU's L2), so no call finds its operands in cache that the model
# would not; the median of the calls, in milliseconds. Used by `tune` (launch configs of ordinary
# kernels) and `matmul_autotune` (the extern against each template tiling).
L2_FLUSH_BYTES = 256 * 2 ** 20


def gpu_timer(fn: Callable[[], None], warmup_ms: float = 5.0, rep_ms: float = 25.0) -> float:
    """Median milliseconds of `fn` on the current CUDA device ([Note: kiln's GPU timer])."""
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    n = min(500, max(5, int(rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


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
