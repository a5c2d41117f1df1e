"""Where a compiled step's GPU time goes: one steady step under torch.profiler, its kernels sorted
into categories, and the time the GPU sat idle waiting for the host.

`profile_step(step, wall_ms)` runs `step` once under the profiler and returns a `StepProfile`:
per category the summed kernel time and kernel count, the GPU's busy time (the union of kernel
intervals, so overlapping streams are not counted twice) and the idle time, the step's unprofiled
wall time (measured by the caller, without the profiler's overhead) minus busy. Categories are
decided from kernel names alone (`category_of`): ATen's and the vendor libraries' kernels have
stable names, and both code generators name their kernels by kind (kiln: `kiln_poi_` / `kiln_red_`
/ `kiln_sca_`, see `kiln.codegen.triton.printer.canonical`; Inductor: `triton_poi_` / `triton_red_` /
`triton_per_` / `triton_tem_`). `side_by_side` prints several compilers' profiles of one case.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

import torch

CATEGORIES = ("matmul", "convolution", "attention", "pointwise", "reduction", "copy/cast",
              "other aten", "idle (host-bound)")

# The op words of a generated kernel's name that move or cast data and compute nothing: kiln's
# (`to_dtype`) and Inductor's (the ATen op names it fuses: `clone`, `_to_copy`, `convolution` for a
# layout change before a convolution, ...). A kernel whose name holds nothing else is a copy or cast.
_MOVEMENT_WORDS = {"to", "dtype", "clone", "copy", "convert", "element", "type", "permute", "view", "cat",
                   "constant", "pad", "nd", "slice", "select", "expand", "transpose", "contiguous", "reshape",
                   "unsqueeze", "squeeze", "as", "strided", "convolution", "fused", "zeros", "full",
                   "new", "empty", "unsafe", "stack"}

_RULES = (  # (category, pattern over the lower-cased kernel name); the first that matches wins
    ("attention", r"flash|fmha|sdpa|attention|attn"),
    ("reduction", r"bn_fw|bn_bw|batch_norm|layer_norm|softmax|reduce"),
    ("convolution", r"conv|fprop|dgrad|wgrad|winograd|implicit_gemm|cudnn::|nchw|nhwc"),
    ("matmul", r"gemm|cutlass|cublas|nvjet|xmma|splitk|sm90_|sm80_|ampere_|hopper|matmul"),
    ("copy/cast", r"copy|catarray|transpose|permute"),
)


def category_of(name: str) -> str:
    """The category of one kernel, by its name."""
    low = name.lower()
    generated = re.match(r"(kiln|triton)_(poi|red|per|sca|tem)_?(.*)", low)
    if generated:
        kind, rest = generated.group(2), generated.group(3)
        if kind == "tem":
            return "matmul"
        if kind != "poi":
            return "reduction"
        # the trailing digest (kiln) or index (Inductor), then the op words
        words = set(re.sub(r"_?([0-9a-f]{8}|\d+)$", "", rest).split("_")) - {""}
        return "copy/cast" if words <= _MOVEMENT_WORDS else "pointwise"
    for category, pattern in _RULES:
        if re.search(pattern, low):
            return category
    return "other aten"


@dataclasses.dataclass
class StepProfile:
    wall_ms: float                                       # the step unprofiled (the caller's median)
    busy_ms: float                                       # union of kernel intervals in the step
    by_category: dict[str, tuple[float, int]]            # category -> (ms, kernels)
    top: list[tuple[str, float, int]]                    # (kernel, ms, launches), most time first

    @property
    def idle_ms(self) -> float:
        return max(self.wall_ms - self.busy_ms, 0.0)

    def to_json(self) -> dict:
        return {"wall_ms": self.wall_ms, "busy_ms": self.busy_ms, "idle_ms": self.idle_ms,
                "by_category": {k: list(v) for k, v in self.by_category.items()},
                "top": [list(t) for t in self.top]}


def profile_step(step: Callable[[], object], wall_ms: float, top: int = 8) -> StepProfile:
    """Profile one call of `step` (already warm) on the GPU."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and e.device_time_total > 0]
    by_category: dict[str, list] = {c: [0.0, 0] for c in CATEGORIES[:-1]}
    by_name: dict[str, list] = {}
    intervals = []
    for e in kernels:
        ms = e.device_time_total / 1e3
        if e.name.lower().startswith(("memcpy", "memset")):
            cat = "copy/cast"
        else:
            cat = category_of(e.name)
        by_category[cat][0] += ms
        by_category[cat][1] += 1
        entry = by_name.setdefault(e.name, [0.0, 0])
        entry[0] += ms
        entry[1] += 1
        start = e.time_range.start
        intervals.append((start, start + e.device_time_total))
    busy = _union_us(intervals) / 1e3
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return StepProfile(wall_ms, busy, {k: (v[0], v[1]) for k, v in by_category.items()},
                       [(name[:100], ms, n) for name, (ms, n) in ranked])


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def side_by_side(title: str, profiles: dict[str, dict]) -> str:
    """A markdown table: one row per category, one column per compiler (ms and kernel count), from
    `StepProfile.to_json()` dicts keyed by compiler."""
    names = list(profiles)
    lines = [f"### {title}", "", "| category | " + " | ".join(f"{n} ms (kernels)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for cat in CATEGORIES[:-1]:
        cells = []
        for n in names:
            ms, count = profiles[n]["by_category"].get(cat, (0.0, 0))
            cells.append(f"{ms:.2f} ({count})" if count else "-")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    lines.append("| idle (host-bound) | " + " | ".join(f"{profiles[n]['idle_ms']:.2f}" for n in names) + " |")
    lines.append("| **step wall** | " + " | ".join(f"**{profiles[n]['wall_ms']:.2f}**" for n in names) + " |")
    lines.append("")
    for n in names:
        tops = "; ".join(f"{ms:.2f} ms x{k} {name[:60]}" for name, ms, k in profiles[n]["top"][:5])
        lines.append(f"- {n} top kernels: {tops}")
    return "\n".join(lines) + "\n"
