"""The warm start: compiled graphs on disk, so a second process skips lowering, codegen and g++.

An entry is keyed by (graph code, input metadata, kiln/torch versions, device, printer) and holds
the host program's source, the kernels as `kiln.codegen.compile.save_kernels` saved them (C++: the libraries' sources,
whose binaries `cpp_build` caches by source hash; Triton: each kernel's KernelSpec, whose binaries
Triton's cache holds, and where it filed each static kernel's: [Note: warm binaries]), and how to re-link the rest: extern ops by qualified name, constants by
graph attribute. Only graphs whose host program is fully serializable are stored.

Entries are JSON documents in `kiln.runtime.store` (kind "graphs"): written atomically, checked
against their checksum when read ([Note: a cache safe to share]); they are data, never Python objects.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Sequence

import torch

from kiln.runtime import store as files

FORMAT = 4
# The printer modules an entry may name (an entry names what restores its kernels; nothing else is imported).
PRINTERS = ("kiln.codegen.cpp", "kiln.codegen.triton")


_CODE_HASH: list[str] = []


def _code_hash() -> str:
    """A hash of kiln's own source (but its benchmarks): a changed compiler never reuses stale
    entries, whichever stage changed (aot's output is cached too: `kiln.codegen.warm_start`)."""
    if not _CODE_HASH:
        import kiln
        h = hashlib.sha256()
        package = os.path.dirname(kiln.__file__)
        for root, dirs, files in os.walk(package):
            dirs[:] = sorted(d for d in dirs if not (root == package and d == "bench"))
            for name in sorted(files):
                if name.endswith(".py"):
                    h.update(os.path.relpath(os.path.join(root, name), package).encode())
                    with open(os.path.join(root, name), "rb") as f:
                        h.update(f.read())
        _CODE_HASH.append(h.hexdigest()[:16])
    return _CODE_HASH[0]


def _versions() -> str:
    import kiln
    return (f"kiln={getattr(kiln, '__version__', '0')} code={_code_hash()} torch={torch.__version__} "
            f"format={FORMAT}")


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    h = hashlib.sha256()
    h.update(_versions().encode())
    h.update(gm.code.encode())
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            h.update(repr((x.dtype, x.device.type, tuple(x.shape), x.stride())).encode())
        else:
            h.update(repr((type(x).__name__, x)).encode())
    for name, value in sorted(gm.named_buffers()) + sorted(gm.named_parameters()):
        h.update(repr((name, value.dtype, tuple(value.shape), value.stride())).encode())
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            v = _attr(gm, node.target)
            if isinstance(v, torch.Tensor):
                h.update(repr((node.target, v.dtype, tuple(v.shape), v.stride())).encode())
    return h.hexdigest()[:32]


def _attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _op_name(op) -> str | None:
    if isinstance(op, torch._ops.OpOverload):
        ns, rest = op._schema.name.split("::", 1)
        return f"{ns}::{rest}.{op._overloadname}"
    return None


def _resolve_op(name: str):
    ns, rest = name.split("::", 1)
    if ns.startswith("kiln"):   # kiln's own ops exist once their modules registered them (a warm start
        import kiln.aot.rng     # may not have imported them: it neither traces nor decomposes)
        import kiln.prims  # noqa: F401
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
                if _attr(gm, node.target) is value:
                    targets[cname] = node.target
    if set(targets) != set(constants):
        return False
    entry = {"host": program.source, "printer": printer, "built": built, "kernels": program.kernels,
             "externs": externs, "constants": targets, "output_strides": output_strides}
    files.write_json("graphs", f"{key}.json", entry)
    return True


def load(key: str, gm: torch.fx.GraphModule):
    """The linked callable for `key`, or None when it is not cached (or cannot be re-linked)."""
    entry = files.read_json("graphs", f"{key}.json")
    if entry is None or entry.get("printer") not in PRINTERS:
        return None
    import importlib
    from kiln.codegen.host import HostProgram, link
    try:
        fns = {}
        if entry["built"] is not None:
            from kiln.codegen.compile import restore_kernels
            fns = restore_kernels(importlib.import_module(entry["printer"]), entry["built"])
        externs = tuple((g, _resolve_op(n)) for g, n in entry["externs"])
        constants = {c: _attr(gm, t) for c, t in entry["constants"].items()}
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
        from kiln import log
        log.emit("perf", f"cache entry {key} not re-linked ({type(e).__name__}: {e}); compiling it again")
        return None
