"""The warm start of a captured graph: a second process skips aot too, not only lowering and g++.

[Note: warm start of a captured graph] The program cache (`kiln.runtime.cache`, whose entries
`kiln.codegen.program_cache` writes and links) is keyed by a prim graph, which exists only once
aot has traced, decomposed, functionalized and partitioned the captured graph: most of what a
warm start still spent on CPU. So a captured graph gets an entry
of its own (kind "aot"), keyed by the torch-level graph, its inputs' metadata and everything aot's
output depends on (grad mode, autocast, which inputs, parameters and buffers require grad, kiln's source).
It holds what aot hands its runtime, as data: the joint graph's input and output specs, the
outputs' pytree spec, what the forward saves for the backward, and the program-cache keys of the
forward and backward programs. A hit builds the `AotRuntime` from it without tracing anything.

Graphs this cannot describe as data are traced as before: symbolic sizes (the trace adds shape
guards capture must keep), outputs that alias an input (their view chains hold ops and nodes),
and programs the program cache did not keep (constants, externs without a qualified name).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from kiln import log
from kiln.codegen import program_cache
from kiln.runtime import cache, store


def _autocast_state() -> tuple:
    state = []
    for device in ("cpu", "cuda"):
        try:
            state.append((device, torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device))))
        except (AttributeError, RuntimeError, TypeError):   # an older torch, or no such device type
            state.append((device, None))
    return tuple(state)


def key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], variant: str) -> str | None:
    """The entry's key, or None when this graph is traced every time (symbolic sizes, a probe)."""
    from kiln.codegen import check
    if check.enabled() or store.disabled():
        return None
    for x in example_inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        if isinstance(x, torch.Tensor) and (type(x) is not torch.Tensor or
                                            any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride()))):
            return None
    h = hashlib.sha256(cache.graph_key(gm, example_inputs).encode())
    h.update(repr((torch.is_grad_enabled(), _autocast_state(), variant,
                   [x.requires_grad for x in example_inputs if isinstance(x, torch.Tensor)],
                   # a buffer too: one written with a value requiring grad requires grad (fuzz seed 1003200)
                   [(n, t.requires_grad) for n, t in sorted(gm.named_parameters()) + sorted(gm.named_buffers())])).encode())
    return h.hexdigest()[:32]


def store_runtime(entry_key: str, runtime) -> None:
    """Keep what `runtime` (an `AotRuntime`) needs to be rebuilt, when all of it is data."""
    from kiln.aot.runtime import AotRuntime, concrete_inputs
    if not isinstance(runtime, AotRuntime) or any(s.alias is not None for s in runtime.joint.outputs):
        return
    programs = [_program_key(runtime.fw), _program_key(runtime.bw) if runtime.bw is not None else ""]
    if None in programs:
        return
    try:
        out_spec = pytree.treespec_dumps(runtime.joint.out_spec)
    except Exception:      # an output type pytree cannot name (a user's container): traced each time
        return
    store.write_json("aot", f"{entry_key}.json", {
        "inputs": [dataclasses.asdict(s) for s in runtime.joint.inputs],
        "outputs": [dataclasses.asdict(s) for s in runtime.joint.outputs],
        "out_spec": out_spec, "info": dataclasses.asdict(runtime.info),
        "functional": runtime.joint.functional, "fw": programs[0], "bw": programs[1],
        "grad_tangents": [sorted(t) for t in runtime.grad_tangents],
        "concrete_size": list(concrete_inputs(runtime.joint))})


def _program_key(program) -> str | None:
    inner = getattr(program, "program", program)          # a CudaGraphed wraps the program
    return getattr(inner, "kiln_cache_key", None)


def load_runtime(entry_key: str, gm: torch.fx.GraphModule, wrap: Callable[[Callable, tuple], Callable]):
    """The `AotRuntime` kept under `entry_key`, or None. `wrap(program, meta)` gives a loaded
    program the wrapper the backend's compiler would (CUDA graphs), `meta` as a traced graph's."""
    from kiln.aot.partition import SavedInfo
    from kiln.aot.runtime import AotRuntime, forward_meta
    from kiln.aot.trace import InputSpec, JointGraph, OutputSpec
    entry = store.read_json("aot", f"{entry_key}.json")
    if entry is None:
        return None
    try:
        inputs = tuple(InputSpec(**s) for s in entry["inputs"])
        outputs = tuple(OutputSpec(**s) for s in entry["outputs"])
        joint = JointGraph(None, inputs, outputs, pytree.treespec_loads(entry["out_spec"]), entry["functional"])
        info = SavedInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry["info"].items()})
    except (KeyError, TypeError, ValueError):
        return None
    fw = program_cache.load(entry["fw"], None)
    bw = program_cache.load(entry["bw"], None) if entry["bw"] else None
    if fw is None or (entry["bw"] and bw is None):
        return None      # the programs' own entries are gone or damaged: trace and compile afresh
    meta = forward_meta(joint, info, concrete_size=tuple(entry.get("concrete_size", ())))
    runtime = AotRuntime(gm, joint, wrap(fw, meta), wrap(bw, {}) if bw is not None else None, info)
    runtime.graphs = None      # never traced in this process
    runtime.grad_tangents = [frozenset(t) for t in entry.get("grad_tangents", ())] or runtime.grad_tangents
    log.count("graphs from the cache")              # aot skipped
    log.count("programs from the cache", 1 + (bw is not None))
    return runtime
