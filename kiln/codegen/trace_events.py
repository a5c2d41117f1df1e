"""Codegen's `schedule` event for the event log (`kiln.trace`, [Note: the event log]).

`compile.py` calls `schedule_event` once per compiled prim graph, only when the log is on: the
loop IR, each kernel (name, the graph nodes fused into it, its source as the printer prints it,
how it is launched), every fusion the scheduler refused with its reason, the extern calls, the
host program, and under max-autotune each matrix product's timed choice (`matmuls`: the
`MatmulDecision`s of [Note: matmul autotuning], as JSON).

How a kernel is launched is the printer's business, so it is one function per printer module in
`LAUNCH`: the C++ printer's OpenMP loops, the Triton printer's grid and block sizes.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import sympy

from kiln import trace
from kiln.codegen import ir


def _cpp_launch(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], source: str) -> str:
    pragmas = [line.strip()[len("#pragma omp "):] for line in source.splitlines()
               if line.strip().startswith("#pragma omp")]
    parts = [f"loops over {ir._fmt_ranges(kernel.ranges)}"]
    inner = [ir._fmt_ranges(s.reduction_ranges) for s in kernel.stages if s.reduction_ranges]
    if inner:
        parts.append("reducing over " + ", ".join(inner))
    parts += [f"#pragma omp {p}" for p in pragmas] or ["no OpenMP pragma"]
    return "; ".join(parts)


def _triton_launch(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], source: str) -> str:
    from kiln.codegen.triton import heuristics
    from kiln.codegen.triton.printer import layout_of
    layout = layout_of(kernel)
    if isinstance(kernel.template, ir.AttentionProduct):
        from kiln.codegen.triton.attention import launch
        return f"{layout.kind}, grid=({layout.xnumel},), {launch(dataclasses.asdict(kernel.template.config)).describe()}"
    if kernel.template is not None:
        config = heuristics.template_launch(dataclasses.asdict(kernel.template.config))
        return f"{layout.kind}, grid=({layout.xnumel},), {config.describe()}"
    sizes = [layout.xnumel, *layout.rnumels]
    if not all(sympy.sympify(s).is_number for s in sizes):
        return f"{layout.kind}, xnumel={layout.xnumel}: block sizes chosen at the first launch (symbolic sizes)"
    xnumel, rnumel = int(layout.xnumel), int(max(layout.rnumels, default=1))
    config = heuristics.choose(layout.kind, xnumel, rnumel, layout.rows_contiguous)
    grid = (xnumel + config.XBLOCK - 1) // config.XBLOCK
    return f"{layout.kind}, xnumel={xnumel}, rnumel={rnumel}, grid=({grid},), {config.describe()} (heuristic)"


LAUNCH: dict[str, Callable[[ir.Kernel, Mapping[str, ir.Buffer], str], str]] = {
    "kiln.codegen.cpp": _cpp_launch,
    "kiln.codegen.triton": _triton_launch,
}


def schedule_event(printer, graph: ir.Graph, sched, buffers: Mapping[str, ir.Buffer], host: str = "",
                   matmuls: list | None = None) -> None:
    launch = LAUNCH.get(printer.__name__, lambda kernel, buffers, source: "")
    kernels, externs = [], []
    for step in sched.steps:
        if isinstance(step, ir.Kernel):
            try:
                source = printer.print_kernel(step, buffers)
            except Exception as e:   # a report never breaks a compile
                source = f"# could not print: {type(e).__name__}: {e}"
            kernels.append({"name": step.name, "origins": list(step.origins), "source": source,
                            "launch": launch(step, buffers, source)})
        elif isinstance(step, ir.ExternKernel):
            externs.append({"outputs": [o for o in step.outputs if o], "op": str(step.op)})
    refused = [{"node": w.node, "group": list(w.group), "reason": w.reason} for w in sched.refused]
    trace.emit("schedule", printer=printer.__name__, ir=str(graph), kernels=kernels, refused=refused,
               externs=externs, host=host, matmuls=matmuls or [])
