"""The warm start: compiled graphs on disk, so a second process skips lowering, codegen and g++.

An entry is keyed by (graph code, input metadata, kiln/torch versions, device, printer) and holds
plain data: what `kiln.codegen.program_cache` wrote of a compiled program (the host program's
source, the kernels as the printer saved them, how to re-link externs and constants), which that
module reads back and links. The runtime knows programs, not how they were made: it keys, writes
and reads entries and imports no stage above it.

Entries are JSON documents in `kiln.runtime.store` (kind "graphs"): written atomically, checked
against their checksum when read ([Note: a cache safe to share]); they are data, never Python objects.
"""
from __future__ import annotations

import hashlib
import os
import sys
from typing import Any, Sequence

import torch

from kiln.runtime import store as files

FORMAT = 4
_CODE_HASH: list[str] = []


def _code_hash() -> str:
    """A hash of kiln's own source (but its benchmarks): a changed compiler never reuses stale
    entries, whichever stage changed (aot's output is cached too: `kiln.pipeline.warm_start`)."""
    if not _CODE_HASH:
        h = hashlib.sha256()
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # kiln/
        for root, dirs, files in os.walk(package):
            dirs[:] = sorted(d for d in dirs if not (root == package and d == "bench"))
            for name in sorted(files):
                if name.endswith(".py"):
                    h.update(os.path.relpath(os.path.join(root, name), package).encode())
                    with open(os.path.join(root, name), "rb") as f:
                        h.update(f.read())
        _CODE_HASH.append(h.hexdigest()[:16])
    return _CODE_HASH[0]


def versions() -> str:
    kiln = sys.modules.get("kiln")     # the package this module belongs to, loaded before it
    return (f"kiln={getattr(kiln, '__version__', '0')} code={_code_hash()} torch={torch.__version__} "
            f"format={FORMAT}")


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    h = hashlib.sha256()
    h.update(versions().encode())
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
            v = attribute(gm, node.target)
            if isinstance(v, torch.Tensor):
                h.update(repr((node.target, v.dtype, tuple(v.shape), v.stride())).encode())
        elif node.op == "call_function" and _op_name(node.target) in CHECKED_INDEX_PRIMS:
            # the op and line a failed index check names ([Note: an op's origin] in kiln/aot/trace.py):
            # `x[i] = v` and `x.index_put_((i,), v)` make one graph, and the other's error named the wrong line
            h.update(repr(node.meta.get("kiln_origin")).encode())
    return h.hexdigest()[:32]


# the prims whose kernels (or ATen's, as externs) check their indices at run time, and whose
# error names the user's op and line ([Note: index bounds checks] in kiln/codegen/lowering_reduce.py)
CHECKED_INDEX_PRIMS = frozenset({"index", "gather", "index_put", "index_put_", "scatter", "scatter_reduce"})


def _op_name(target) -> str:
    """`kiln_prims.index_put.default` -> "index_put"."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") if packet is not None else ""


def attribute(gm, target: str):
    """`gm`'s attribute at the dotted path `target` (a get_attr node's)."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def write_entry(key: str, entry: dict) -> None:
    """Keep a program's entry (plain data) under `key`."""
    files.write_json("graphs", f"{key}.json", entry)


def read_entry(key: str) -> dict | None:
    """The entry kept under `key`, or None (absent, or failed its checksum)."""
    return files.read_json("graphs", f"{key}.json")
