"""What an ATen op does to its arguments' storage, read once from its schema and cached.

Tracing, functionalization and partition all ask the same questions of an `OpOverload`: is it a
view (its output aliases an input), does it write into an argument, which out-of-place op computes
the same values. The answers live here, keyed by op, so every pass agrees.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class OpEffects:
    """How one op touches storage.

    view: the outputs alias argument `view_of` (no write).  identity: a view with the same metadata
    (detach, alias), which functionalization drops.  mutated: argument positions the op writes into.
    inplace_view: the op changes the metadata of its first argument (t_, squeeze_, ...).
    """

    view: bool
    identity: bool
    mutated: tuple[int, ...]
    inplace_view: bool
    random: bool


# Ops whose schema does not declare the writes they do (running statistics of batch norm).
_UNDECLARED_WRITES = {
    aten.native_batch_norm.default: (3, 4),
}
_IDENTITY_VIEWS = {aten.detach.default, aten.alias.default, aten.lift_fresh.default}


@functools.lru_cache(maxsize=None)
def effects(op) -> OpEffects:
    if not isinstance(op, OpOverload):
        return OpEffects(False, False, (), False, False)
    schema = op._schema
    args = schema.arguments
    mutated = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    mutated = mutated or _UNDECLARED_WRITES.get(op, ())
    aliased_return = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    reads_alias = any(a.alias_info is not None and not a.alias_info.is_write for a in args)
    inplace_view = torch.Tag.inplace_view in op.tags
    return OpEffects(view=(aliased_return and reads_alias) or inplace_view,
                     identity=op in _IDENTITY_VIEWS,
                     mutated=() if inplace_view else mutated,
                     inplace_view=inplace_view,
                     random=torch.Tag.nondeterministic_seeded in op.tags)


# In-place and out= ops whose functional form is not found by name.
_FUNCTIONAL = {
    aten.copy_.default: aten.copy.default,
    aten.native_batch_norm.default: aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit.default: aten._native_batch_norm_legit_functional.default,
}


@functools.lru_cache(maxsize=None)
def functional_variant(op: OpOverload) -> OpOverload | None:
    """The out-of-place op computing what `op` writes: `add_.Tensor` -> `add.Tensor`,
    `add.out` -> `add.Tensor`, `_foo` (mutating an argument) -> `_foo_functional`."""
    if op in _FUNCTIONAL:
        return _FUNCTIONAL[op]
    name = op._schema.name.split("::")[1]
    written = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    if name.endswith("_") and not name.endswith("__"):
        # add_.Tensor -> add.Tensor, but pow_.Scalar -> pow.Tensor_Scalar: match the arguments
        found = _overload_with(name[:-1], _signature(op, drop=()))
        if found is not None:
            return found
    if is_out_overload(op):
        found = _overload_with(name, _signature(op, drop=written))
        if found is not None:
            return found
    return _overload_with(name + "_functional", _signature(op, drop=()))


def is_out_overload(op: OpOverload) -> bool:
    """An `out=` overload (`add.out`); read from the schema, since torch 2.11 has no `Tag.out`."""
    return any(a.is_out for a in op._schema.arguments)


def _signature(op: OpOverload, drop) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in op._schema.arguments if a.name not in drop]


def _overload_with(name: str, signature: list[tuple[str, str]]) -> OpOverload | None:
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if not is_out_overload(candidate) and _signature(candidate, drop=()) == signature:
            return candidate
    return None


# View ops that change metadata in place, and the view op that computes the same new metadata.
INPLACE_VIEW_AS_VIEW = {
    aten.t_.default: aten.t.default,
    aten.transpose_.default: aten.transpose.int,
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.squeeze_.dims: aten.squeeze.dims,
    aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.as_strided_.default: aten.as_strided.default,
    aten.swapdims_.default: aten.transpose.int,
    aten.swapaxes_.default: aten.transpose.int,
}
