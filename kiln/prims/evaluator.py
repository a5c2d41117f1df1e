"""The prim evaluator: run a PyTorch program with every ATen op decomposed into prims.

`PrimEvaluator` is a TorchDispatchMode. Each ATen op that reaches it (below autograd, so forward
ops and the backward ops autograd runs) is replaced by its decomposition, applied recursively; each
prim runs its eager reference. With `check_meta=True` each prim also runs its meta rule on meta
copies of its inputs, and the evaluator checks that the rule predicts the reference's sizes and
dtypes. This tests decompositions and prims without aot/ or codegen/.

In-place and `out=` ATen overloads are evaluated as their functional overload followed by a copy:
aot/ functionalizes before decomposing, so only this evaluator needs that rule.
"""
from __future__ import annotations

import collections
import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from kiln.prims.decompositions import DECOMPOSITIONS
from kiln.prims.prim import PRIM_OF_OP, Category, PrimArgumentError

aten = torch.ops.aten

# Ops that carry no computation a backend sees (aot handles them while tracing): the evaluator
# runs them as they are.
PASSTHROUGH = {
    aten._local_scalar_dense.default,   # .item(): the value leaves the graph
    aten.is_same_size.default,
    aten.equal.default,                 # returns a Python bool
    aten.allclose.default,
    aten._linalg_check_errors.default,  # raises on bad info codes, computes nothing
    aten.set_.source_Tensor,
    aten.resize_.default,
    aten.resize_as_.default,
    # in-place view ops change only self's sizes and strides; aot rewrites them as views
    aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims, aten.unsqueeze_.default,
    aten.transpose_.default, aten.t_.default, aten.as_strided_.default, aten.swapdims_.default,
    aten.swapaxes_.default,
    aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
}


class UndecomposedOp(RuntimeError):
    """An ATen op reached the evaluator that has no decomposition and is not an extern."""


@dataclasses.dataclass
class EvaluationLog:
    prims: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    undecomposed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    passthrough: collections.Counter = dataclasses.field(default_factory=collections.Counter)


# In-place ops whose functional twin is not named by dropping the underscore.
_FUNCTIONAL_TWIN = {aten.normal_.default: aten.normal_functional.default}


def _functional_overload(func):
    """add_.Tensor -> add.Tensor; mul.out -> mul.Tensor/default; None when there is none."""
    if func in _FUNCTIONAL_TWIN:
        return _FUNCTIONAL_TWIN[func], "inplace"
    packet_name = func._schema.name.split("::")[1]
    overload = func._overloadname
    if packet_name.endswith("_") and not packet_name.endswith("__"):
        packet = getattr(aten, packet_name[:-1], None)
        if packet is not None and overload in packet.overloads():
            return getattr(packet, overload), "inplace"
    if overload == "out" or overload.endswith("_out"):
        packet = getattr(aten, packet_name)
        for candidate in (overload[:-4] if overload.endswith("_out") else "default", "Tensor", "default"):
            if candidate in packet.overloads():
                return getattr(packet, candidate), "out"
    return None, None


def _overlaps(result, out) -> bool:
    outs = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]
    ptr = result.untyped_storage().data_ptr()
    return any(o.untyped_storage().data_ptr() == ptr for o in outs)


def _meta_copy(a):
    if not isinstance(a, torch.Tensor):
        return a
    storage = torch.empty(a.untyped_storage().nbytes() // max(a.element_size(), 1), dtype=a.dtype, device="meta")
    return storage.as_strided(a.shape, a.stride(), a.storage_offset())


class PrimEvaluator(TorchDispatchMode):
    """Decompose every ATen op into prims and run the prims' references.

    strict: an op with no decomposition raises `UndecomposedOp` (else it runs eagerly and is
    logged in `log.undecomposed`). check_meta: compare each prim's meta rule with its reference.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False        # [Note: dispatch modes without dynamo] in kiln/symbolic/fake.py

    def __init__(self, decompositions=None, strict: bool = True, check_meta: bool = False):
        super().__init__()
        self.table = DECOMPOSITIONS if decompositions is None else decompositions
        self.strict = strict
        self.check_meta = check_meta
        self.log = EvaluationLog()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        prim = PRIM_OF_OP.get(func)
        if prim is not None:
            self.log.prims[prim.name] += 1
            out = func(*args, **kwargs)
            if self.check_meta and prim.category is not Category.EXTERN:
                self._check_meta(func, args, kwargs, out)
            return out
        decomposition = self.table.get(func)
        if decomposition is not None:
            with self:  # re-enter, so ATen ops a decomposition calls are decomposed in turn
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:  # a decomposition may decline some arguments
                return out
        if func in PASSTHROUGH:
            self.log.passthrough[str(func)] += 1
            return func(*args, **kwargs)
        functional, kind = _functional_overload(func)
        if functional is not None and (functional in self.table or functional in PRIM_OF_OP):
            return self._via_functional(functional, kind, args, kwargs)
        self.log.undecomposed[str(func)] += 1
        if self.strict:
            raise UndecomposedOp(f"kiln prims: ATen op {func} has no decomposition into prims and is not an "
                                 "extern; add a row to kiln/prims/decompositions (or an extern in "
                                 "kiln/prims/externs.py)")
        return func(*args, **kwargs)

    def _via_functional(self, functional, kind, args, kwargs):
        kwargs = dict(kwargs)
        out = kwargs.pop("out", None) if kind == "out" else args[0]
        with self:
            result = functional(*args, **kwargs)
        # The copy back is the evaluator's business, not a graph op: write with the mode off.
        result = tree_map(lambda r: r.clone() if isinstance(r, torch.Tensor) and _overlaps(r, out) else r, result)
        if isinstance(out, torch.Tensor):
            if kind == "out" and out.shape != result.shape:
                out.resize_(result.shape)
            out.copy_(result)
            return out
        for o, r in zip(out, result):
            if o.shape != r.shape:
                o.resize_(r.shape)
            o.copy_(r)
        return out

    def _check_meta(self, func, args, kwargs, out):
        meta_args, meta_kwargs = tree_map(_meta_copy, (args, kwargs))
        expected = func(*meta_args, **meta_kwargs)
        got, _ = tree_flatten(out)
        want, _ = tree_flatten(expected)
        for g, w in zip(got, want):
            if isinstance(g, torch.Tensor) and (g.shape != w.shape or g.dtype != w.dtype):
                raise PrimArgumentError(f"kiln prim {func}: meta rule gives {tuple(w.shape)} {w.dtype}, "
                                        f"reference gives {tuple(g.shape)} {g.dtype}")


def undecomposed_ops(fn, *args, backward: bool = True, **kwargs) -> collections.Counter:
    """ATen ops that would reach a backend undecomposed while running `fn(*args)` (and its
    backward, when some output requires grad): an empty Counter means prims and externs only."""
    evaluator = PrimEvaluator(strict=False)
    with evaluator:
        out = fn(*args, **kwargs)
        if backward:
            leaves = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
            inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a.requires_grad]
            if isinstance(fn, torch.nn.Module):
                inputs += [p for p in fn.parameters() if p.requires_grad]
            if leaves and inputs:
                torch.autograd.grad(leaves, inputs, [torch.ones_like(o) for o in leaves], allow_unused=True)
    return evaluator.log.undecomposed
