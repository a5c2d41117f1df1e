"""One prim graph to one callable: the named passes of the code generator, in order.

    lower (lowering.py) -> common buffers (dedupe.py) -> layouts (layout.py)
    -> matmul templates (matmul_templates.py; printers that tile products: every product and 2-D
       convolution (conv_templates.py) under max-autotune, which the Triton printer times
       (triton/matmul_autotune.py), else only the
       printer's `default_matmul_configs`, decoding's GEMVs, products of one A as one GEMV kernel
       first: `group_sibling_gemvs`)
    -> attention templates (attention_templates.py; printers with `attention_configs`: decoding's
       attention) -> schedule (scheduler.py)
    -> common kernels (dedupe.py) -> print + build kernels in parallel parts (cpp.py / triton)
    -> host program (host.py) -> link

`KILN_LOG=kernels` prints each graph's IR, schedule, refused fusions, kernel source and host
program; every pass is a stage of `kiln.log` ([Note: compile stages]), printed under `KILN_LOG=perf`. `KILN_CHECK=kernels` checks every
buffer a kernel writes against the graph run eagerly (`check.py`).
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import sympy
import torch

from kiln import log, trace
from kiln.codegen import ir, program_cache
from kiln.codegen.attention_templates import use_attention_templates
from kiln.codegen.dedupe import common_kernels, dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.host import HostProgram, link, plan_host
from kiln.codegen.lowering import KERNEL_DTYPES, lower_graph, program_device
from kiln.codegen.matmul_templates import group_sibling_gemvs, use_matmul_templates
from kiln.codegen.reinplace import reinplace_input_writes
from kiln.codegen.scheduler import schedule
from kiln.runtime import cache
from kiln.symbolic.decide import oblivious_sizes, shape_envs


def printer_for(device: str):
    """The printer module for a device: C++ for CPU, Triton for CUDA (see ir.py's interface)."""
    if device == "cpu":
        from kiln.codegen import cpp
        return cpp
    from kiln.codegen import triton as triton_printer  # written on the same IR by the Triton engineer
    return triton_printer


def compile_prim_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], printer=None,
                       use_cache: bool | None = None, boxed: bool = False, wait: bool = True,
                       max_autotune: bool = False):
    """Compile one prim- (or ATen-) level graph into a callable `call(*inputs) -> tuple`, or
    `call(inputs: list) -> tuple` when `boxed` (see host.py's [Note: boxed programs]).

    `printer` (a printer module) overrides the device's own: tests run the Triton printer on CPU
    tensors (Triton's interpreter). `use_cache`: look the program up in, and store it into, the
    warm-start cache (default: unless a printer is chosen). `wait=False`: start building the
    kernels and return a `PendingProgram` at once ([Note: parallel builds]). `max_autotune`: matrix
    products become template kernels where the printer tiles them ([Note: matmul templates])."""
    from kiln.codegen import check

    reinplace_input_writes(gm)
    chosen = printer
    probe = check.enabled()
    use_cache = (chosen is None if use_cache is None else use_cache) and not probe
    boxed = boxed and not probe   # the checker calls the program with the inputs it keeps
    # the target printer's dtype policy decides what lowering leaves to externs
    policy = chosen or printer_for(_graph_device(gm, example_inputs))
    if use_cache:
        with log.stage("cache key"):
            key = (cache.graph_key(gm, example_inputs) + _size_facts_key(example_inputs) + "-" + policy.__name__
                   + ("-boxed" if boxed else "") + ("-max-autotune" if max_autotune else ""))
        with log.stage("cache load"):
            hit = program_cache.load(key, gm)
        trace.emit("cache", cache="graph program", hit=hit is not None, key=key)
        if hit is not None:
            log.count("programs from the cache")
            return hit
    log.count("programs compiled")
    with oblivious_sizes([example_inputs, [n.meta.get("val") for n in gm.graph.nodes]]):
        return _compile_lowered(gm, example_inputs, policy, chosen, probe, boxed, use_cache, key if use_cache else None,
                                wait, max_autotune)


def _compile_lowered(gm, example_inputs, policy, chosen, probe, boxed, use_cache, key, wait, max_autotune=False):
    """compile_prim_graph past the cache: lower, schedule, print and build."""
    from kiln.codegen import check
    with log.stage("lower"):
        graph, constants = lower_graph(gm, example_inputs, getattr(policy, "KERNEL_DTYPES", KERNEL_DTYPES),
                                       getattr(policy, "SPLIT_REDUCTIONS", False))
    with log.stage("dedupe"):
        graph = dedupe_buffers(graph)
    with log.stage("layouts"):
        graph = optimize_layouts(graph, _saved_outputs(graph, gm.meta.get("kiln_user_outputs")))
    configs_for = getattr(policy, "matmul_configs", None)
    default_configs = getattr(policy, "default_matmul_configs", None)
    decisions = []       # the timed choice of each product ([Note: matmul autotuning])
    if max_autotune and configs_for is not None:
        with log.stage("matmul templates"):
            tune = getattr(policy, "tune_matmuls", None)
            if tune is not None:
                graph, decisions = tune(graph, configs_for)
            else:
                graph = use_matmul_templates(graph, configs_for)
    elif default_configs is not None:    # untimed: only where a template surely wins (GEMVs)
        with log.stage("matmul templates"):
            siblings = getattr(policy, "default_sibling_gemv_config", None)
            if siblings is not None:     # products of one A as one GEMV kernel ([Note: sibling GEMVs])
                graph = group_sibling_gemvs(graph, siblings)
            graph = use_matmul_templates(graph, default_configs)
    attention_configs = getattr(policy, "attention_configs", None)
    if attention_configs is not None:    # [Note: decode attention]
        with log.stage("attention templates"):
            graph = use_attention_templates(graph, attention_configs)
    output_strides = _output_strides(graph)
    if log.enabled("kernels"):          # printing the IR costs ~7% of a small graph's compile
        log.emit("kernels", "loop IR", str(graph))
    with log.stage("schedule"):
        sched = schedule(graph)
    if log.enabled("kernels"):
        log.emit("kernels", "schedule", str(sched))
    device = next((b.device for b in graph.buffers if b.device != "cpu"), "cpu")
    printer = chosen or printer_for(device)
    kernels = [s for s in sched.steps if isinstance(s, ir.Kernel)]
    log.count("kernels", len(kernels))
    buffers = graph.buffer_map()
    with log.stage("host program"):
        program, binds = plan_host(graph, sched, takes_pointers=getattr(printer, "TAKES_POINTERS", False),
                                   probe=probe, boxed=boxed, keep=device == "cpu",
                                   index_errors=getattr(printer, "RETURNS_INDEX_ERRORS", False))
    with log.stage("print"):
        built = save_kernels(printer, kernels, buffers, size_hints(example_inputs)) if kernels else None
    if trace.active():
        from kiln.codegen.trace_events import schedule_event
        schedule_event(printer, graph, sched, buffers, program.source, [d.as_json() for d in decisions])
    if log.enabled("kernels"):
        log.emit("kernels", "kernel source", printer.print_module(kernels, buffers) if kernels else "")
    log.emit("kernels", "host program", program.source)

    def finish():
        with log.stage("load"):           # the printer's own stages claim compiling ([Note: compile stages])
            fns = restore_kernels(printer, built) if kernels else {}
            call = link(program, fns, constants, binds)
        log.count("kernels compiled", len(kernels))
        if probe:
            return _boxed(check.checked(call, gm, dict(graph.origins), fns))
        call.output_strides = output_strides
        if use_cache and program.cacheable and program_cache.store(key, program, printer.__name__, built, gm, constants, output_strides) \
                and not constants:
            call.kiln_cache_key = key        # found again by key alone ([Note: warm start of a captured graph])
        return _boxed(call)
    if wait or probe or not kernels:
        return finish()
    start_builds(printer, built)
    return PendingProgram(finish, output_strides)


class PendingProgram:
    """A program whose kernels are building: `finish()` waits for them and returns the linked
    callable (the backend finishes a forward after lowering its backward: [Note: parallel builds])."""

    def __init__(self, finish, output_strides: tuple = ()):
        self._finish, self._call = finish, None
        self.output_strides = output_strides

    def finish(self):
        if self._call is None:
            self._call = self._finish()
        return self._call

    def __call__(self, *args):
        return self.finish()(*args)


# [Note: parallel builds] Printers whose `restore` builds one library per call (g++ per
# translation unit) get a graph's distinct kernels in up to one part per core, every part's build
# started before the first is waited for (`PREFETCH`); a part holds MIN_KERNELS_PER_PART at least,
# since each g++ run pays for the prelude's headers. Triton compiles kernel by kernel already.
# The backend also compiles with wait=False: a forward's builds run while aot's backward is lowered,
# and both are finished (waited for, linked) before the backend returns, so a build error is still
# the backend's error.
PARALLEL_PARTS = {"kiln.codegen.cpp": os.cpu_count() or 1}
MIN_KERNELS_PER_PART = 8


def _prefetch_cpp(part: dict) -> None:
    from kiln.codegen.cpp import PRELUDE
    from kiln.runtime.cpp_build import compile_async
    compile_async(part["module"], header=PRELUDE)   # cpp.saved: the library's source


PREFETCH = {"kiln.codegen.cpp": _prefetch_cpp}


def save_kernels(printer, kernels: Sequence[ir.Kernel], buffers, hints: dict[str, int] | None = None) -> dict:
    """What builds `kernels` (and the warm-start cache keeps): the distinct ones (`common_kernels`)
    as the printer saves them, in parts ([Note: parallel builds]), and which kernel repeats which.
    `hints`: the size symbols' values in the call being compiled (`size_hints`)."""
    unique, same = common_kernels(list(kernels), buffers)
    n = max(1, min(PARALLEL_PARTS.get(printer.__name__, 1), len(unique) // MIN_KERNELS_PER_PART))
    size = -(-len(unique) // n)
    parts = [printer.saved(unique[i:i + size], buffers, hints) for i in range(0, len(unique), size)]
    log.count("kernels repeated", len(same))
    return {"parts": parts, "same": same}


def start_builds(printer, built: dict) -> None:
    """Start building every part of `built` (where the printer's builds can run ahead)."""
    prefetch = PREFETCH.get(printer.__name__)
    if prefetch is not None:
        for part in built["parts"]:
            prefetch(part)


def size_hints(values) -> dict[str, int]:
    """Each size symbol's value in the call being compiled, by name: the hints of the shape
    environments whose sizes `values` (example inputs: tensors and ints, possibly symbolic) hold."""
    return {s.name: int(v) for env in shape_envs(list(values)) for s, v in getattr(env, "hints", {}).items()}


def restore_kernels(printer, built: dict) -> dict:
    """`save_kernels`' kernels loaded (built where no cache has them): name -> callable."""
    if len(built["parts"]) > 1:
        start_builds(printer, built)
    fns = {}
    for part in built["parts"]:
        fns.update(printer.restore(part))
    fns.update({name: fns[first] for name, first in built["same"].items()})
    return fns


def _saved_outputs(graph: ir.Graph, user_outputs: int | None) -> frozenset:
    """The buffers a forward returns only for its backward ([Note: saved values in the layout of
    their producer]): outputs after the first `user_outputs` that are no user output too."""
    if user_outputs is None:
        return frozenset()
    users = {o for o in graph.outputs[:user_outputs] if isinstance(o, str)}
    return frozenset(o for o in graph.outputs[user_outputs:] if isinstance(o, str) and o not in users)


def _output_strides(graph: ir.Graph) -> tuple:
    """Each output's strides as the program returns them (static ints), None where not known here."""
    buffers = graph.buffer_map()
    out = []
    for o in graph.outputs:
        buf = buffers.get(o) if isinstance(o, str) else None
        strides = [sympy.sympify(s) for s in buf.strides] if buf is not None else []
        out.append(tuple(int(s) for s in strides) if buf is not None and all(s.is_Integer for s in strides) else None)
    return tuple(out)


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
    """The device of the graph's program: see `lowering.program_device`."""
    return program_device((list(example_inputs), [n.meta.get("val") for n in gm.graph.nodes]))


def _boxed(call):
    """The compiler contract: the callable takes the graph's inputs positionally."""
    call.kiln_compiled = True
    return call
