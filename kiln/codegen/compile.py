"""One prim graph to one callable: the named passes of the code generator, in order.

    lower (lowering.py) -> common buffers (dedupe.py) -> layouts (layout.py) -> schedule (scheduler.py) -> print + build kernels (cpp.py / triton)
    -> host program (host.py) -> link

`KILN_LOG=kernels` prints each graph's IR, schedule, refused fusions, kernel source and host
program; every pass logs its name and time under `KILN_LOG=perf`. `KILN_CHECK=kernels` checks every
buffer a kernel writes against the graph run eagerly (`check.py`).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Sequence

import torch

from kiln.codegen import ir
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.host import HostProgram, link, plan_host
from kiln.codegen.lowering import KERNEL_DTYPES, lower_graph
from kiln.codegen.scheduler import schedule


def _log_enabled(topic: str) -> bool:
    return topic in os.environ.get("KILN_LOG", "").split(",")


def _log(topic: str, title: str, text) -> None:
    """`text`: a string, or a callable making it: printing the loop IR and the schedule cost ~7%
    of a small graph's compile (the fuzzer's programs), so they print only when the topic is on."""
    if _log_enabled(topic):
        print(f"[kiln {topic}] {title}\n{text() if callable(text) else text}", file=sys.stderr)


class _Timer:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        _log("perf", f"pass {self.name}", f"{(time.perf_counter() - self.start) * 1e3:.1f} ms")


def printer_for(device: str):
    """The printer module for a device: C++ for CPU, Triton for CUDA (see ir.py's interface)."""
    if device == "cpu":
        from kiln.codegen import cpp
        return cpp
    from kiln.codegen import triton as triton_printer  # written on the same IR by the Triton engineer
    return triton_printer


def compile_prim_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], printer=None,
                       use_cache: bool | None = None, boxed: bool = False):
    """Compile one prim- (or ATen-) level graph into a callable `call(*inputs) -> tuple`, or
    `call(inputs: list) -> tuple` when `boxed` (see host.py's [Note: boxed programs]).

    `printer` (a printer module) overrides the device's own: tests run the Triton printer on CPU
    tensors (Triton's interpreter). `use_cache`: look the program up in, and store it into, the
    warm-start cache (default: unless a printer is chosen)."""
    from kiln.codegen import check
    from kiln.runtime import cache

    chosen = printer
    probe = check.enabled()
    use_cache = (chosen is None if use_cache is None else use_cache) and not probe
    boxed = boxed and not probe   # the checker calls the program with the inputs it keeps
    # the target printer's dtype policy decides what lowering leaves to externs
    policy = chosen or printer_for(_graph_device(gm, example_inputs))
    if use_cache:
        key = (cache.graph_key(gm, example_inputs) + _size_facts_key(example_inputs) + "-" + policy.__name__
               + ("-boxed" if boxed else ""))
        hit = cache.load(key, gm)
        if hit is not None:
            return hit
    with _Timer("lower"):
        graph, constants = lower_graph(gm, example_inputs, getattr(policy, "KERNEL_DTYPES", KERNEL_DTYPES),
                                       getattr(policy, "SPLIT_REDUCTIONS", False))
    with _Timer("dedupe"):
        graph = dedupe_buffers(graph)
    with _Timer("layouts"):
        graph = optimize_layouts(graph)
    _log("kernels", "loop IR", lambda: str(graph))
    with _Timer("schedule"):
        sched = schedule(graph)
    _log("kernels", "schedule", lambda: str(sched))
    device = next((b.device for b in graph.buffers), "cpu")
    printer = chosen or printer_for(device)
    kernels = [s for s in sched.steps if isinstance(s, ir.Kernel)]
    buffers = graph.buffer_map()
    with _Timer("codegen"):
        program, binds = plan_host(graph, sched, takes_pointers=getattr(printer, "TAKES_POINTERS", False),
                                   probe=probe, boxed=boxed, keep=device == "cpu")
        built = printer.saved(kernels, buffers) if kernels else None
    if _log_enabled("kernels"):
        _log("kernels", "kernel source", printer.print_module(kernels, buffers) if kernels else "")
    _log("kernels", "host program", program.source)
    with _Timer("build"):
        fns = printer.restore(built) if kernels else {}
    call = link(program, fns, constants, binds)
    if probe:
        return _boxed(check.checked(call, gm, dict(graph.origins), fns))
    if use_cache and program.cacheable:
        cache.store(key, program, printer.__name__, built, gm, constants)
    return _boxed(call)


def _size_facts_key(example_inputs: Sequence[Any]) -> str:
    """Lowering applies the equalities the guards check (s2 == 16) to symbolic sizes, which the
    inputs' shapes do not show: they are part of what a cached program was built for."""
    import hashlib
    for x in example_inputs:
        sizes = (*x.shape, *x.stride()) if isinstance(x, torch.Tensor) else (x,)
        for d in sizes:
            env = getattr(getattr(d, "node", None), "shape_env", None) if isinstance(d, torch.SymInt) else None
            if env is not None and getattr(env, "replacements", None):
                facts = repr(sorted((str(k), str(v)) for k, v in env.replacements.items()))
                return "-" + hashlib.sha256(facts.encode()).hexdigest()[:16]
    return ""


def _graph_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """The device of the graph's tensors: its inputs', else its values' (a graph of factories)."""
    vals = [n.meta.get("val") for n in gm.graph.nodes]
    for v in torch.utils._pytree.tree_leaves((list(example_inputs), vals)):
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            return v.device.type
    return "cpu"


def _boxed(call):
    """The compiler contract: the callable takes the graph's inputs positionally."""
    call.kiln_compiled = True
    return call
