"""kiln's primitive op set and the decompositions of ATen ops into it (PrimTorch's role).

Public API (names kept stable for aot/ and codegen/):

    PRIMS: dict[str, Prim]             every prim by name; Prim.op is its OpOverload (graph target)
    Prim, Category                     the frozen record and the eight categories
    ops                                namespace of prim OpOverloads: ops.add(a, b), ops.sum(a, [0])
    DECOMPOSITIONS: dict[OpOverload, Callable]   ATen overload -> Python function over prims
    decompositions_for(backend_ops)    the table minus the ops a backend implements itself
    is_prim(op), is_extern(op)
    COPYING_MOVEMENT                   movement prims that copy (cat, pad, flip, copy_strided): cheap
                                       to recompute in a backward, as views are
    PrimEvaluator                      TorchDispatchMode: decompose every ATen op, run prim references
    undecomposed_ops(fn, *args)        ATen ops that would reach a backend undecomposed

The prims are defined in elementwise.py, reductions.py, views.py, indexing.py and externs.py; the
decompositions live in kiln/prims/decompositions/. aot/ applies `decompositions_for(...)` below
autograd while tracing; codegen/ lowers every non-extern prim and calls externs through ATen.
"""
from __future__ import annotations

from kiln.prims.prim import PRIMS, PRIM_OF_OP, Category, Prim, PrimArgumentError, is_prim
from kiln.prims import elementwise, reductions, views, indexing, externs  # noqa: F401  (registers prims)
from kiln.prims.ops import ops
from kiln.prims.decompositions import DECOMPOSITIONS, decompositions_for
from kiln.prims.evaluator import PrimEvaluator, UndecomposedOp, undecomposed_ops


def is_extern(op) -> bool:
    prim = PRIM_OF_OP.get(op)
    return prim is not None and prim.category is Category.EXTERN


COPYING_MOVEMENT = frozenset(p.op for p in PRIMS.values()
                             if p.category is Category.VIEW and p.name in ("cat", "copy_strided", "flip", "pad"))

__all__ = ["COPYING_MOVEMENT", "PRIMS", "Prim", "Category", "ops", "DECOMPOSITIONS", "decompositions_for", "is_prim", "is_extern",
           "PrimEvaluator", "UndecomposedOp", "undecomposed_ops", "PrimArgumentError"]
