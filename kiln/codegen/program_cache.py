"""A compiled program as plain data for the runtime's cache (`kiln.runtime.cache`), and back.

`store` writes what a second process needs to rebuild a program without lowering or printing: the
host program's source, the kernels as `kiln.codegen.compile.save_kernels` saved them (C++: the
libraries' sources, whose binaries `cpp_build` caches by source hash; Triton: each kernel's
KernelSpec, whose binaries Triton's cache holds, and where it filed each static kernel's: [Note:
warm binaries]), and how to re-link the rest: extern ops by qualified name, constants by graph
attribute. Only programs whose host program is fully serializable are stored. `load` reads the
entry back, restores the kernels through the printer module it names and links the host program.
The runtime keys and keeps the entries; how a program is made and linked stays here.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

from kiln import log
from kiln.codegen.host import HostProgram, link
from kiln.runtime import cache

# The printer modules an entry may name (an entry names what restores its kernels; nothing else is imported).
PRINTERS = ("kiln.codegen.cpp", "kiln.codegen.triton")

# Functions that register kiln's own ops (random ops, prims), called before an entry naming one is
# linked: a warm start may not have imported their modules, as it neither traces nor decomposes.
# Filled by the stage above that knows where they are defined (`kiln.pipeline`).
KILN_OP_LIBRARIES: list[Callable[[], None]] = []


def _op_name(op) -> str | None:
    if isinstance(op, torch._ops.OpOverload):
        ns, rest = op._schema.name.split("::", 1)
        return f"{ns}::{rest}.{op._overloadname}"
    return None


def _resolve_op(name: str):
    ns, rest = name.split("::", 1)
    if ns.startswith("kiln"):   # kiln's own ops exist once their modules registered them
        for register in KILN_OP_LIBRARIES:
            register()
    packet, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, ns), packet), overload)


def store(key: str, program, printer: str, built: dict | None, gm: torch.fx.GraphModule, constants: dict,
          output_strides: tuple = ()) -> bool:
    """Keep `program` under `key`: its host source, the kernels as the printer module named
    `printer` saved them (`printer.saved`), and how to re-link externs and constants. Whether it
    was kept."""
    externs = [(g, _op_name(op)) for g, op in program.externs]
    if any(n is None for _, n in externs):
        return False
    targets = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            for cname, value in constants.items():
                if cache.attribute(gm, node.target) is value:
                    targets[cname] = node.target
    if set(targets) != set(constants):
        return False
    entry = {"host": program.source, "printer": printer, "built": built, "kernels": program.kernels,
             "externs": externs, "constants": targets, "output_strides": output_strides}
    cache.write_entry(key, entry)
    return True


def load(key: str, gm: torch.fx.GraphModule):
    """The linked callable for `key`, or None when it is not cached (or cannot be re-linked)."""
    entry = cache.read_entry(key)
    if entry is None or entry.get("printer") not in PRINTERS:
        return None
    try:
        fns = {}
        if entry["built"] is not None:
            from kiln.codegen.compile import restore_kernels   # compile.py stores and loads through here
            fns = restore_kernels(importlib.import_module(entry["printer"]), entry["built"])
        externs = tuple((g, _resolve_op(n)) for g, n in entry["externs"])
        constants = {c: cache.attribute(gm, t) for c, t in entry["constants"].items()}
        program = HostProgram(entry["host"], tuple(map(tuple, entry["kernels"])), externs,
                              tuple(constants), True)
        call = link(program, fns, constants)
        call.kiln_compiled = True
        call.kiln_warm = True
        call.output_strides = tuple(None if s is None else tuple(s) for s in entry.get("output_strides", ()))
        if not constants:
            call.kiln_cache_key = key        # found again by key alone ([Note: warm start of a captured graph])
        return call
    except Exception as e:  # a stale entry (an op or attribute gone): compile afresh, and say why
        log.emit("perf", f"cache entry {key} not re-linked ({type(e).__name__}: {e}); compiling it again")
        return None
