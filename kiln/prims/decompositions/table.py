"""The one decomposition table: ATen OpOverload -> Python function over prims.

Modules of this package add rows with `@register(aten.x.default, ...)`; importing the package
fills the table. A function receives exactly the ATen op's arguments and returns what the ATen op
returns, built from prims (and from other rows of this table, called as Python functions).
"""
from __future__ import annotations

from typing import Callable

DECOMPOSITIONS: dict = {}


def register(*overloads):
    def add(fn: Callable) -> Callable:
        for overload in overloads:
            if overload in DECOMPOSITIONS:
                raise ValueError(f"{overload} has two decompositions: {DECOMPOSITIONS[overload].__name__} "
                                 f"and {fn.__name__}")
            DECOMPOSITIONS[overload] = fn
        return fn
    return add


def decompositions_for(backend_ops: set) -> dict:
    """The rows a backend needs: every decomposition except of the ops it implements itself."""
    return {op: fn for op, fn in DECOMPOSITIONS.items() if op not in backend_ops}
