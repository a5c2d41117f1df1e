"""The one decomposition table: ATen OpOverload -> Python function over prims.

Modules of this package add rows with `@register(aten.x.default, ...)`; importing the package
fills the table. A function receives exactly the ATen op's arguments and returns what the ATen op
returns, built from prims (and from other rows of this table, called as Python functions), or
`NotImplemented` to decline arguments it does not handle (the op then stays an ATen op).
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

DECOMPOSITIONS: dict = {}

# [Note: numerics] `options={"numerics": ...}` of kiln.compile. "fast" (the default): every row is
# the fastest decomposition that passes the benchmark's accuracy rule. "eager": rows registered
# under it replace those, computing in the order of eager's own kernels so a compiled model gives
# eager's bits (layer_norm's statistics; Triton's division, square root and libdevice already
# round as eager's CUDA kernels in both). The variants are rows of the same table, per numerics.
NUMERICS = ("fast", "eager")
VARIANTS: dict[str, dict] = {"eager": {}}


def register(*overloads, numerics: str = "fast"):
    table = DECOMPOSITIONS if numerics == "fast" else VARIANTS[numerics]

    def add(fn: Callable) -> Callable:
        for overload in overloads:
            if overload in table:
                raise ValueError(f"{overload} has two {numerics} decompositions: {table[overload].__name__} "
                                 f"and {fn.__name__}")
            table[overload] = fn
        return fn
    return add


def decompositions_for(backend_ops: set, numerics: str = "fast", device_type: str | None = None) -> dict:
    """The rows a backend needs: every decomposition except of the ops it implements itself, with
    the variants of `numerics` in place of the fast rows ([Note: numerics]). `device_type`:
    decompose as for that device, whatever the traced tensors' (offline CUDA compiles and plans
    trace on the CPU); a row that decomposes by device takes it as its `device_type` keyword."""
    rows = {**DECOMPOSITIONS, **VARIANTS.get(numerics, {})}
    table = {op: fn for op, fn in rows.items() if op not in backend_ops}
    if device_type is not None:
        for op, fn in table.items():
            if "device_type" in inspect.signature(fn).parameters:
                table[op] = functools.partial(fn, device_type=device_type)
    return table


def add_inplace_rows() -> int:
    """Give each in-place twin of a decomposed op (`add_.Tensor` of `add.Tensor`) a row: the
    functional decomposition, then `self.copy_(result)`. A tracer records the one `copy_` as the
    mutation (aot functionalizes it); everything computed before it is prims. Returns rows added."""
    import torch
    aten = torch.ops.aten
    added = 0
    for functional, fn in list(DECOMPOSITIONS.items()):
        name = functional._schema.name.split("::")[1]
        if name.endswith("_") or name == "copy":  # copy_ is the mutation itself
            continue
        if any(r.alias_info is not None for r in functional._schema.returns):
            continue  # squeeze_, t_, ...: in-place views change metadata, not values
        packet = getattr(aten, name + "_", None)
        if packet is None or functional._overloadname not in packet.overloads():
            continue
        inplace = getattr(packet, functional._overloadname)
        if inplace in DECOMPOSITIONS or not inplace._schema.arguments or \
                not inplace._schema.arguments[0].alias_info or not inplace._schema.arguments[0].alias_info.is_write:
            continue

        def row(self, *args, _fn=fn, **kwargs):
            return self.copy_(_fn(self, *args, **kwargs))
        row.__name__ = f"{fn.__name__}_inplace"
        DECOMPOSITIONS[inplace] = row
        added += 1
    return added
