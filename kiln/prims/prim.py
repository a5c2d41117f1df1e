"""The `Prim` record and the one registration point for primitive ops.

Every primitive op is a `torch.library` operator in the `kiln_prims` namespace, so it appears in
FX graphs as an ordinary `OpOverload` (`torch.ops.kiln_prims.add.default`), runs on meta and fake
tensors through its meta rule, and runs eagerly through its reference implementation. `define`
registers both kernels and records the op in `PRIMS`; nothing else in kiln registers prims.

[Note: prims are strict] A prim never promotes dtypes or broadcasts shapes: a binary elementwise
prim takes two tensors of one shape and one dtype. Decompositions make promotion and broadcasting
explicit (`convert_element_type`, `broadcast_in_dim`), so a code generator lowers each prim with one
rule and no dtype tables. The meta rules enforce this, and the evaluator runs them beside the
references in tests, so a decomposition that leans on implicit promotion fails loudly.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import torch

NAMESPACE = "kiln_prims"


class Category(str, enum.Enum):
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    SCAN = "scan"
    VIEW = "view/movement"
    INDEXING = "indexing"
    CREATION = "creation"
    RANDOM = "random"
    EXTERN = "extern"


@dataclasses.dataclass(frozen=True)
class Prim:
    """One primitive op: its graph target, its rules, and what it means."""

    name: str
    op: torch._ops.OpOverload      # the callable FX graph target
    category: Category
    doc: str                       # one line, for docs/prims.md and error messages
    schema: str
    meta: Callable                 # (meta tensors, args) -> meta outputs; checks strictness
    reference: Callable            # eager torch implementation
    tags: tuple = ()


PRIMS: dict[str, Prim] = {}
PRIM_OF_OP: dict[torch._ops.OpOverload, Prim] = {}

_LIB = torch.library.Library(NAMESPACE, "DEF")


class PrimArgumentError(TypeError):
    """A prim was called with arguments that break its strict contract (a decomposition bug)."""


def check(condition: bool, prim: str, message: str) -> None:
    if not condition:
        raise PrimArgumentError(f"kiln prim {NAMESPACE}.{prim}: {message} "
                                "(prims are strict: decompositions must convert dtypes and broadcast "
                                "shapes explicitly)")


def define(schema: str, category: Category, doc: str, meta: Callable, reference: Callable,
           tags: tuple = ()) -> torch._ops.OpOverload:
    """Register one prim: its schema, meta kernel and reference kernel; return its OpOverload."""
    name = schema.split("(", 1)[0]
    if name in PRIMS:
        raise ValueError(f"prim {name!r} is defined twice")
    _LIB.define(schema, tags=tags)
    # The reference serves every backend key through CompositeExplicitAutograd; Meta overrides it
    # so fake tensors and meta tensors get the meta rule, never the eager computation.
    _LIB.impl(name, reference, "CompositeExplicitAutograd")
    _LIB.impl(name, meta, "Meta")
    op = getattr(torch.ops, NAMESPACE).__getattr__(name).default
    prim = Prim(name, op, category, doc, schema, meta, reference, tuple(tags))
    PRIMS[name] = prim
    PRIM_OF_OP[op] = prim
    return op


def is_prim(op) -> bool:
    return op in PRIM_OF_OP
