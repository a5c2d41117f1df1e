"""View steps: how a view is replayed from its base, and how a write into it is scattered back.

A view of a tensor is described by the chain of `ViewStep`s leading from its base (the tensor that
owns the storage). Functionalization replays a chain to regenerate a view after its base changed,
and walks it backwards with `SCATTERS` to turn a write into the view into a new value of the base.
The runtime replays chains on real tensors to return outputs that alias inputs, as eager does; the
sizes of a chain traced over symbolic sizes are computed from the real inputs.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable

import torch
import torch.fx as fx

from kiln.aot import schema
from kiln.aot.symbols import evaluate
from kiln.errors import NotYetImplemented

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ViewStep:
    """`op(base, *args, **kwargs)`, then `[index]` when the op returns a list of views."""

    op: Any
    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()
    index: int | None = None

    def apply(self, base, inputs: dict | None = None):
        """Run the step on a real (or fake) tensor; a size node among the arguments is computed
        from `inputs`, the real values of the placeholders it reads (`symbols.evaluate`)."""
        op = schema.INPLACE_VIEW_AS_VIEW.get(self.op, self.op)
        args, kwargs = self.args, dict(self.kwargs)
        if not self.static:
            args, kwargs = fx.node.map_arg((args, kwargs), lambda n: evaluate(n, inputs))
        out = op(base, *args, **kwargs)
        return out if self.index is None else out[self.index]

    @functools.cached_property
    def size_nodes(self) -> tuple[fx.Node, ...]:
        """The arguments that are graph values: symbolic sizes (`s0` in `view(x, [6, s0])`)."""
        found: list = []
        fx.node.map_arg((self.args, dict(self.kwargs)), found.append)
        return tuple(found)

    @property
    def static(self) -> bool:
        return not self.size_nodes


def replay(chain: tuple[ViewStep, ...], base, inputs: dict | None = None):
    for step in chain:
        base = step.apply(base, inputs)
    return base


def _arg(step: ViewStep, i: int, name: str, default=None):
    if i < len(step.args):
        return step.args[i]
    return dict(step.kwargs).get(name, default)


def _inverse_permutation(dims):
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d % len(dims)] = i
    return inverse


def _split_bounds(step: ViewStep, base_val) -> tuple[int, int, int]:
    """(dim, start, end) of the piece `step.index` of a split."""
    dim = _arg(step, 1, "dim", 0)
    if step.op is aten.split_with_sizes.default:
        sizes = list(_arg(step, 0, "split_sizes"))
    else:
        size = _arg(step, 0, "split_size")
        total = base_val.shape[dim]
        sizes = [min(size, total - s) for s in range(0, total, size)] if size else [total]
    start = sum(sizes[:step.index])
    return dim, start, start + sizes[step.index]


# Each entry: (emit, base node, base meta, new value of the view node, step) -> new base node.
Emit = Callable[..., fx.Node]
SCATTERS: dict[Any, Callable] = {
    aten.select.int: lambda e, b, bv, v, s: e(aten.select_scatter.default, b, v, *s.args),
    aten.slice.Tensor: lambda e, b, bv, v, s: e(aten.slice_scatter.default, b, v, *s.args),
    aten.diagonal.default: lambda e, b, bv, v, s: e(aten.diagonal_scatter.default, b, v, *s.args),
    aten.as_strided.default: lambda e, b, bv, v, s: e(aten.as_strided_scatter.default, b, v, *s.args),
    aten.t.default: lambda e, b, bv, v, s: e(aten.t.default, v),
    aten.transpose.int: lambda e, b, bv, v, s: e(aten.transpose.int, v, *s.args),
    aten.permute.default: lambda e, b, bv, v, s: e(aten.permute.default, v, _inverse_permutation(s.args[0])),
    aten.unsqueeze.default: lambda e, b, bv, v, s: e(aten.squeeze.dim, v, s.args[0]),
    aten.unbind.int: lambda e, b, bv, v, s: e(aten.select_scatter.default, b, v, _arg(s, 0, "dim", 0), s.index),
    aten.split.Tensor: lambda e, b, bv, v, s: e(aten.slice_scatter.default, b, v, *_split_bounds(s, bv)),
    aten.split_with_sizes.default: lambda e, b, bv, v, s: e(aten.slice_scatter.default, b, v, *_split_bounds(s, bv)),
    aten.view.dtype: lambda e, b, bv, v, s: e(aten.view.dtype, v, bv.dtype),
}
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default, aten.squeeze.default,
             aten.squeeze.dim, aten.squeeze.dims, aten.view_as_real.default, aten.view_as_complex.default)


def scatter_step(emit: Emit, base: fx.Node, base_val, value: fx.Node, step: ViewStep, view_val) -> fx.Node:
    """The new value of `base` after its view `step(base)` took the value `value`."""
    if schema.effects(step.op).identity:
        return value
    step = dataclasses.replace(step, op=schema.INPLACE_VIEW_AS_VIEW.get(step.op, step.op))
    rule = SCATTERS.get(step.op)
    if rule is not None:
        return rule(emit, base, base_val, value, step)
    if step.op in _RESHAPES and view_val.dtype == base_val.dtype:
        return emit(aten._reshape_copy.default, value, list(base_val.shape))
    if step.op is aten.expand.default:
        raise NotYetImplemented("kiln.aot: a write into an expanded view (all copies share memory) is not "
                                "functionalized; clone the tensor before writing into it")
    # Any other view: write through its strides. ATen's as_strided_scatter reads them in its
    # input's storage, offset included, and a base's storage at run time need not be the traced
    # one (an input view with a storage offset, a transposed clone): the base is first copied into
    # a contiguous tensor of its own, and the view's layout taken in that copy, by replaying the
    # step on a contiguous stand-in.
    if not step.static or not all(isinstance(d, int) for d in base_val.shape):
        # [Note: writes through views of symbolic sizes] The stand-in below would be a meta
        # tensor of kiln's SymInts, on which torch's dispatch asserts (fuzz seed 26 of
        # --triton-interpret --half: `x[0] = 3` under dynamic=True), and its layout could not be
        # passed as ints anyway. The prim views a write reaches there have inverses that need no
        # layout: a slice is scattered back by `slice_scatter`, a permute and a squeeze undone by
        # the inverse permute and by unsqueezes, a broadcast_in_dim that only adds size-1 dims
        # (eager refuses writes into a real broadcast) by a squeeze, a view by a reshape to the
        # base's sizes (read from the base node). Static sizes keep the strided path, as before.
        rule = _symbolic_scatter(step, base_val, view_val)
        if rule is not None:
            return rule(emit, base, value)
        raise NotYetImplemented(f"kiln.aot: a write through {step.op} into a tensor of symbolic sizes "
                                f"{tuple(base_val.shape)} is not functionalized; mark the sizes static "
                                "(dynamic=False) or clone the tensor before writing into it")
    stand_in = step.apply(torch.empty(base_val.shape, dtype=base_val.dtype, device="meta"))
    dense = emit(aten.clone.default, base, memory_format=torch.contiguous_format)
    return emit(aten.as_strided_scatter.default, dense, value, list(stand_in.shape), list(stand_in.stride()),
                stand_in.storage_offset())


def _symbolic_scatter(step: ViewStep, base_val, view_val) -> Callable[[Emit, fx.Node, fx.Node], fx.Node] | None:
    """[Note: writes through views of symbolic sizes]: the inverse of a prim view, or None."""
    prims = torch.ops.kiln_prims
    if step.op is prims.view.default and view_val.dtype == base_val.dtype:
        def reshaped(e, b, v):    # the base's symbolic sizes read from the base itself
            sizes = [d if isinstance(d, int) else e(aten.sym_size.int, b, k) for k, d in enumerate(base_val.shape)]
            return e(aten._reshape_copy.default, v, sizes)
        return reshaped
    if step.op is prims.slice.default:
        return lambda e, b, v: e(aten.slice_scatter.default, b, v, *step.args)
    if step.op is prims.permute.default:
        return lambda e, b, v: e(aten.permute.default, v, _inverse_permutation(step.args[0]))
    if step.op is prims.squeeze.default:
        def unsqueezed(e, b, v):
            for d in sorted(step.args[0]):
                v = e(aten.unsqueeze.default, v, d)
            return v
        return unsqueezed
    if step.op is prims.broadcast_in_dim.default:
        shape, kept = step.args[0], set(step.args[1])
        added = [d for d in range(len(shape)) if d not in kept]
        if all(isinstance(view_val.shape[d], int) and view_val.shape[d] == 1 for d in added):
            return lambda e, b, v: e(aten.squeeze.dims, v, added)
    return None


def emit_step(emit: Emit, base: fx.Node, step: ViewStep) -> fx.Node:
    """Append the view `step(base)` to a functional graph (identity views vanish)."""
    if schema.effects(step.op).identity:
        return base
    op = schema.INPLACE_VIEW_AS_VIEW.get(step.op, step.op)
    out = emit(op, base, *step.args, **dict(step.kwargs))
    return out if step.index is None else emit(operator.getitem, out, step.index)
