"""kiln's primitive op set and the decompositions of ATen ops into it (PrimTorch's role).

Public API (names kept stable for aot/ and codegen/):

    PRIMS: dict[str, Prim]             every prim by name; Prim.op is its OpOverload (graph target)
    Prim, Category                     the frozen record and the eight categories
    ops                                namespace of prim OpOverloads: ops.add(a, b), ops.sum(a, [0])
    DECOMPOSITIONS: dict[OpOverload, Callable]   ATen overload -> Python function over prims
    decompositions_for(backend_ops)    the table minus the ops a backend implements itself
    is_prim(op), is_extern(op)
    EXTERN_OPS                         the extern prims' graph targets (their operands are in memory)
    RECOMPUTABLE_MOVEMENT              movement prims that copy (cat, pad, flip, copy_strided) or
                                       gather (gather, index): cheap to recompute in a backward
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


# [Note: gathers recomputed in the backward] Movement prims that copy, and the gathers that only
# read (not the scatters), are memory-bound as pointwise prims are, so aot's min cut may run them
# again in the backward instead of saving their result. Were a gather not recomputable, it would be
# run in the forward and its (bigger) result saved: max pooling's gradient gathers each input
# position's window indices, and ResNet-50 saved four bool masks at the pool's input resolution
# (411 MB at batch 128) where the int64 indices at its output resolution take half that.
RECOMPUTABLE_MOVEMENT = frozenset(p.op for p in PRIMS.values()
                                  if p.name in ("cat", "copy_strided", "flip", "pad", "gather", "index"))

# Externs (matrix products, convolutions, attention) read their operands from memory: a value one
# consumes is written out by whatever computes it, never fused into the extern (aot's min cut asks,
# [Note: values materialized on both sides] in kiln/aot/partition.py).
EXTERN_OPS = frozenset(p.op for p in PRIMS.values() if p.category is Category.EXTERN)

__all__ = ["RECOMPUTABLE_MOVEMENT", "EXTERN_OPS", "PRIMS", "Prim", "Category", "ops", "DECOMPOSITIONS", "decompositions_for", "is_prim", "is_extern",
           "PrimEvaluator", "UndecomposedOp", "undecomposed_ops", "PrimArgumentError"]
