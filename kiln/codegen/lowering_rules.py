"""The lowering rules: one function per op name, registered in `lowering.LOWERINGS`.

A rule gets the lowering context, the node's output value (a meta/fake tensor: sizes, dtype) and
the op's arguments by schema name; it returns a `TensorValue` (or a tuple of them). Names cover
kiln's prims and their ATen namesakes; prims are strict (same dtype and shape), ATen ops promote
and broadcast, and the rules below do both by casting to the output's dtype and broadcasting to
its shape. A rule raises `LoweringError` for arguments it does not handle; the node then runs as
an extern call (`extern_fallback`).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.indexing import Max, Min
from kiln.codegen.ir import Constant, IndexValue, Load, Op, loop_var
from kiln.codegen.lowering import (LoweringContext, LoweringError, TensorValue, broadcast_to, cast, constant,
                                   floordiv, modulo, register, reindex, reshape_index, size_scalar,
                                   to_sympy)

# ---------------------------------------------------------------------------- elementwise

UNARY = ("neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
         "asinh acosh atanh erf erfc erfinv lgamma digamma sigmoid reciprocal floor ceil round trunc sign "
         "bitwise_not relu frac").split()
UNARY_TO_BOOL = "isnan isinf isfinite signbit logical_not".split()
BINARY = {n: n for n in ("add sub mul pow atan2 maximum minimum hypot copysign nextafter fmod remainder "
                         "bitwise_and bitwise_or bitwise_xor").split()}
BINARY.update({"shift_left": "left_shift", "shift_right": "right_shift", "bitwise_left_shift": "left_shift",
               "bitwise_right_shift": "right_shift", "floor_divide": "floordiv"})
COMPARE = {n: n for n in "eq ne lt le gt ge logical_and logical_or logical_xor".split()}


def _out(meta) -> torch.Tensor:
    if not isinstance(meta, torch.Tensor):
        raise LoweringError("expected a tensor result")
    return meta


def _operand(x, dtype: torch.dtype, sizes) -> Any:
    """A tensor or Python number as a scalar expression of `dtype`, broadcast to `sizes`."""
    if isinstance(x, TensorValue):
        return cast(broadcast_to(x, sizes).expr, dtype)
    if isinstance(x, (bool, int, float)):
        return constant(x, dtype)
    if isinstance(x, sympy.Expr):   # a symbolic size used as a number
        return size_scalar(x, dtype)
    raise LoweringError(f"unsupported operand {type(x).__name__}")


def _common_dtype(values) -> torch.dtype:
    tensors = [v for v in values if isinstance(v, TensorValue)]
    dims = [v for v in tensors if v.ndim > 0]
    pool = dims or tensors
    dtype = pool[0].dtype
    for v in pool[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    scalars = [v for v in values if isinstance(v, (bool, int, float)) and not isinstance(v, TensorValue)]
    scalars += [1 for v in values if isinstance(v, sympy.Expr)]   # a symbolic size: a weak int
    for s in scalars:  # weak scalars move only across categories (int -> float)
        if isinstance(s, float) and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        elif isinstance(s, int) and not isinstance(s, bool) and dtype == torch.bool:
            dtype = torch.int64
    if len(dims) < len(tensors):  # 0-dim tensors act like weak scalars of their category
        for v in tensors:
            if v.ndim == 0 and v.dtype.is_floating_point and not dtype.is_floating_point:
                dtype = v.dtype
    return dtype


def _value(meta, expr) -> TensorValue:
    m = _out(meta)
    return TensorValue(tuple(map(to_sympy, m.shape)), m.dtype, m.device.type, expr)


def _unary(name):
    def rule(ctx, meta, **kw):
        m = _out(meta)
        x = kw.get("a", kw.get("self"))
        compute = m.dtype if m.dtype != torch.bool or name in ("bitwise_not",) else x.dtype
        sizes = tuple(map(to_sympy, m.shape))
        op_name = "logical_not" if name == "bitwise_not" and m.dtype == torch.bool else name
        if name == "relu":
            e = _operand(x, compute, sizes)
            return _value(meta, Op("maximum", (e, constant(0, compute)), compute))
        if name == "abs" and compute == torch.bool:
            return _value(meta, _operand(x, compute, sizes))
        return _value(meta, Op(op_name, (_operand(x, compute, sizes),), m.dtype))
    return rule


def _unary_to_bool(name):
    def rule(ctx, meta, **kw):
        x = kw.get("a", kw.get("self"))
        sizes = tuple(map(to_sympy, _out(meta).shape))
        arg = _operand(x, torch.bool if name == "logical_not" else x.dtype, sizes)
        return _value(meta, Op(name, (arg,), torch.bool))
    return rule


def _binary(name, scalar_op):
    def rule(ctx, meta, **kw):
        m = _out(meta)
        a, b = kw.get("a", kw.get("self")), kw.get("b", kw.get("other"))
        if b is None:
            b = kw.get("exponent")
        if a is None and "self" in kw:
            raise LoweringError("missing operand")
        sizes = tuple(map(to_sympy, m.shape))
        ea, eb = _operand(a, m.dtype, sizes), _operand(b, m.dtype, sizes)
        alpha = kw.get("alpha")
        if alpha not in (None, 1):
            eb = Op("mul", (eb, constant(alpha, m.dtype)), m.dtype)
        if m.dtype == torch.bool and scalar_op in ("add", "mul", "maximum", "minimum"):
            scalar_op_b = {"add": "logical_or", "mul": "logical_and", "maximum": "logical_or",
                           "minimum": "logical_and"}[scalar_op]
            return _value(meta, Op(scalar_op_b, (ea, eb), m.dtype))
        return _value(meta, Op(scalar_op, (ea, eb), m.dtype))
    return rule


def _compare(name):
    def rule(ctx, meta, **kw):
        a, b = kw.get("a", kw.get("self")), kw.get("b", kw.get("other"))
        sizes = tuple(map(to_sympy, _out(meta).shape))
        dtype = torch.bool if name.startswith("logical") else _common_dtype([a, b])
        return _value(meta, Op(name, (_operand(a, dtype, sizes), _operand(b, dtype, sizes)), torch.bool))
    return rule


for _n in UNARY:
    register(_n)(_unary(_n))
for _n in UNARY_TO_BOOL:
    register(_n)(_unary_to_bool(_n))
for _n, _op in BINARY.items():
    register(_n)(_binary(_n, _op))
for _n, _op in COMPARE.items():
    register(_n)(_compare(_n))


@register("div")
def div(ctx, meta, a=None, b=None, self=None, other=None, rounding_mode=None, **_):
    m = _out(meta)
    a, b = (a if a is not None else self), (b if b is not None else other)
    sizes = tuple(map(to_sympy, m.shape))
    if rounding_mode is None and not m.dtype.is_floating_point:
        # a prim `div` on integers truncates (C division)
        ea, eb = _operand(a, m.dtype, sizes), _operand(b, m.dtype, sizes)
        return _value(meta, Op("truediv", (ea, eb), m.dtype))
    if rounding_mode is None:
        return _value(meta, Op("truediv", (_operand(a, m.dtype, sizes), _operand(b, m.dtype, sizes)), m.dtype))
    if rounding_mode == "floor":
        return _value(meta, Op("floordiv", (_operand(a, m.dtype, sizes), _operand(b, m.dtype, sizes)), m.dtype))
    if not m.dtype.is_floating_point:
        return _value(meta, Op("truediv", (_operand(a, m.dtype, sizes), _operand(b, m.dtype, sizes)), m.dtype))
    q = Op("truediv", (_operand(a, m.dtype, sizes), _operand(b, m.dtype, sizes)), m.dtype)
    return _value(meta, Op("trunc", (q,), m.dtype))


@register("where")
def where(ctx, meta, pred=None, a=None, b=None, condition=None, self=None, other=None, **_):
    m = _out(meta)
    cond = pred if pred is not None else condition
    a, b = (a if a is not None else self), (b if b is not None else other)
    sizes = tuple(map(to_sympy, m.shape))
    return _value(meta, Op("where", (_operand(cond, torch.bool, sizes), _operand(a, m.dtype, sizes),
                                     _operand(b, m.dtype, sizes)), m.dtype))


@register("convert_element_type", "_to_copy", "clone", "contiguous", "alias", "lift_fresh_copy", "to")
def convert(ctx, meta, **kw):
    m = _out(meta)
    x = kw.get("a", kw.get("self"))
    if not isinstance(x, TensorValue):
        raise LoweringError("convert of a non-tensor")
    # values are traced on meta tensors, so the call's own device argument tells a device copy
    device = kw.get("device") or (m.device if m.device.type != "meta" else None)
    if device is not None and ctx.placed(device) != ctx.placed(x.device):
        raise LoweringError("device copy")
    return _value(meta, cast(broadcast_to(x, tuple(map(to_sympy, m.shape))).expr, m.dtype))


@register("clamp")
def clamp(ctx, meta, self=None, min=None, max=None, **_):
    m = _out(meta)
    sizes = tuple(map(to_sympy, m.shape))
    e = _operand(self, m.dtype, sizes)
    if min is not None:
        e = Op("maximum", (e, _operand(min, m.dtype, sizes)), m.dtype)
    if max is not None:
        e = Op("minimum", (e, _operand(max, m.dtype, sizes)), m.dtype)
    return _value(meta, e)


# ---------------------------------------------------------------------------- views

def _dims(d, ndim) -> list[int]:
    if d is None:
        return list(range(ndim))
    if isinstance(d, int):
        d = [d]
    return sorted({(x + ndim) % ndim if ndim else 0 for x in d})


@register("broadcast_in_dim")
def broadcast_in_dim(ctx, meta, a=None, shape=None, broadcast_dimensions=None, **_):
    shape = tuple(map(to_sympy, shape))
    idx = []
    for k, d in enumerate(broadcast_dimensions):
        idx.append(sympy.Integer(0) if (a.sizes[k] == 1 and shape[d] != 1) else loop_var(d))
    return reindex(a, shape, idx)


@register("expand")
def expand(ctx, meta, self=None, size=None, **_):
    return broadcast_to(self, tuple(map(to_sympy, _out(meta).shape)))


@register("permute", "transpose", "t", "numpy_T")
def permute(ctx, meta, self=None, a=None, dims=None, dim0=None, dim1=None, permutation=None, **_):
    x = self if self is not None else a
    dims = dims if dims is not None else permutation
    n = x.ndim
    if dims is None:
        dims = list(range(n))
        if n >= 2:
            d0, d1 = (dim0 % n, dim1 % n) if dim0 is not None else (0, 1)
            dims[d0], dims[d1] = dims[d1], dims[d0]
    dims = [d % n for d in dims]
    idx = [None] * n
    for k, d in enumerate(dims):
        idx[d] = loop_var(k)
    return reindex(x, [x.sizes[d] for d in dims], idx)


@register("view", "reshape", "_unsafe_view", "_reshape_alias", "view_copy", "flatten", "unflatten")
def reshape(ctx, meta, **kw):
    x = kw.get("self", kw.get("a"))
    new = tuple(map(to_sympy, _out(meta).shape))
    if tuple(x.sizes) == new:
        return x
    return reindex(x, new, reshape_index(x.sizes, new))


@register("unsqueeze", "squeeze")
def squeeze_like(ctx, meta, **kw):
    x = kw.get("self", kw.get("a"))
    new = tuple(map(to_sympy, _out(meta).shape))
    return reindex(x, new, reshape_index(x.sizes, new))


@register("slice")
def slice_(ctx, meta, self=None, a=None, dim=0, start=None, end=None, step=1, **_):
    x = self if self is not None else a
    if x is None:
        raise LoweringError("slice without a tensor")
    dim = dim % x.ndim
    size = x.sizes[dim]
    if size.is_number and all(isinstance(v, (int, type(None))) for v in (start, end, step)):
        start, _, step = slice(start, end, step).indices(int(size))
    else:
        start, step = _symbolic_slice_start(size, start, step)
    idx = [loop_var(k) for k in range(x.ndim)]
    idx[dim] = start + step * loop_var(dim)
    return reindex(x, tuple(map(to_sympy, _out(meta).shape)), idx)


def _symbolic_slice_start(size: sympy.Expr, start, step) -> tuple[sympy.Expr, int]:
    """The first index a slice reads when its dim or bounds are symbolic. Only the start matters:
    the output's size (from the trace) already says how many elements follow, and a start past
    the end gives an empty output that reads nothing."""
    if not isinstance(step, int) or step <= 0:
        raise LoweringError("slice with a symbolic or non-positive step")
    start = to_sympy(0 if start is None else start)
    if start.is_nonnegative:
        return start, step
    if start.is_negative:  # counts from the end, clamped at 0 as Python does
        return sympy.Max(size + start, 0), step
    raise LoweringError(f"slice start {start} of unknown sign")


@register("select")
def select(ctx, meta, self=None, dim=0, index=0, **_):
    dim = dim % self.ndim
    size = self.sizes[dim]
    index = to_sympy(index)
    if index.is_negative:
        index = index + size
    elif not index.is_nonnegative:
        raise LoweringError(f"select index {index} of unknown sign")
    idx = [loop_var(k if k < dim else k - 1) for k in range(self.ndim)]
    idx[dim] = to_sympy(index)
    return reindex(self, tuple(map(to_sympy, _out(meta).shape)), idx)


@register("as_strided")
def as_strided(ctx, meta, self=None, a=None, size=None, stride=None, storage_offset=None, **_):
    """[Note: as_strided positions] `size`, `stride` and `storage_offset` address the input's
    *storage*, whose layout is its fake's (strides, storage offset), while a buffer of ours holds
    only the input's elements: a slice realized on its own has a storage of its own. So a storage
    position is first turned into the input element it lands on (or read straight from a buffer
    laid out as that storage). Every as_strided the decompositions emit (diagonal, unfold, a view's
    as_strided) stays within its input's elements; one that reads outside them is refused."""
    self = self if self is not None else a
    sizes, strides = tuple(map(to_sympy, size)), tuple(map(to_sympy, stride))
    offset = to_sympy(storage_offset or 0)
    a_meta = ctx.arg_metas[0] if ctx.arg_metas and isinstance(ctx.arg_metas[0], torch.Tensor) else None
    buf = ctx.buffer_of(self)
    position = offset + sum((loop_var(k) * s for k, s in enumerate(strides)), sympy.Integer(0))
    layout = None if a_meta is None else (tuple(map(to_sympy, a_meta.stride())), to_sympy(a_meta.storage_offset()))
    if layout is None:
        if buf is None or buf.strides != ir.contiguous_strides(buf.sizes):
            buf = ctx.realize(self)
        return TensorValue(sizes, self.dtype, self.device, Load(buf.name, buf.offset + position, buf.dtype))
    if not all(e.is_Integer for e in (*layout[0], layout[1], *sizes, *strides, offset, *self.sizes)):
        # Symbolic layouts or input sizes: no element can be found by dividing positions (nor
        # checked against the sizes: a static window of a dynamic input, fuzz seed 1004118's
        # scatter_add source), so the input is read from a buffer laid out as its storage (its own,
        # or a copy in its traced strides). A contiguous copy read at the storage's positions gave
        # a transposed input's unfold under dynamic=True the wrong elements (fuzz seed 1001165).
        a_strides, a_offset = layout
        if buf is None or tuple(buf.strides) != a_strides:
            buf = ctx.realize(self, strides=a_strides)
        return TensorValue(sizes, self.dtype, self.device, Load(buf.name, buf.offset + position - a_offset, buf.dtype))
    a_strides, a_offset = layout
    element = (_element_by_strides(offset - a_offset, sizes, strides, self.sizes, a_strides)
               or _element_at(position - a_offset, self.sizes, a_strides, sizes))
    if element is None:
        from kiln.errors import NotYetImplemented
        raise NotYetImplemented(f"kiln codegen: as_strided{tuple(size), tuple(stride), storage_offset} reads "
                                f"storage outside its input's elements (sizes {tuple(a_meta.shape)}, strides "
                                f"{tuple(a_meta.stride())}, offset {a_meta.storage_offset()})")
    if buf is not None and tuple(buf.strides) == a_strides:   # the buffer is laid out as the storage
        return TensorValue(sizes, self.dtype, self.device,
                           Load(buf.name, buf.offset + position - a_offset, buf.dtype))
    return reindex(self, sizes, element)


def _element_by_strides(rel_offset, out_sizes, out_strides, a_sizes, a_strides) -> list | None:
    """The input element at each output position, found by matching strides: each output dim's
    stride is a whole multiple of one input dim's stride (the largest that divides it), so its loop
    variable moves that input index alone. When every input index so built stays within its size,
    position = a_offset + sum(index * stride) holds exactly: the element is right without
    enumerating positions. This is what decides an as_strided over an input that is itself an
    overlapping view (unfold of unfold: halo attention's windows), where a storage position has
    several elements and `_element_at`'s greedy division picks none; and it has no size limit."""
    dims = [d for d in range(len(a_sizes)) if a_sizes[d] != 1 and a_strides[d] > 0]
    if rel_offset < 0 or any(s < 0 for s in out_strides):
        return None
    element: list = [sympy.Integer(0)] * len(a_sizes)
    high = [0] * len(a_sizes)            # each input index's largest value
    rest = int(rel_offset)
    for d in sorted(dims, key=lambda d: -int(a_strides[d])):
        element[d], high[d] = sympy.Integer(rest // int(a_strides[d])), rest // int(a_strides[d])
        rest %= int(a_strides[d])
    if rest:
        return None
    for k, (size, stride) in enumerate(zip(out_sizes, out_strides)):
        if size == 1 or stride == 0:
            continue
        divides = [d for d in dims if int(stride) % int(a_strides[d]) == 0]
        if not divides:
            return None
        d = max(divides, key=lambda d: int(a_strides[d]))
        factor = int(stride) // int(a_strides[d])
        element[d] += loop_var(k) * factor
        high[d] += (int(size) - 1) * factor
    if any(high[d] >= int(a_sizes[d]) for d in range(len(a_sizes))):
        return None
    return element


def _element_at(rel: sympy.Expr, a_sizes, a_strides, out_sizes) -> list | None:
    """The input element (per-dim indices) at storage position `a_offset + rel`, as expressions in
    the output's loop variables, when every output element lands on one; else None."""
    import numpy as np
    dims = sorted((d for d in range(len(a_sizes)) if a_sizes[d] != 1 and a_strides[d] != 0),
                  key=lambda d: -int(a_strides[d]))
    element: list = [sympy.Integer(0)] * len(a_sizes)
    rest = rel
    for d in dims:
        element[d] = floordiv(rest, a_strides[d])
        rest = modulo(rest, a_strides[d])
    numel = int(ir.product(out_sizes))
    if numel == 0:
        return element
    if numel > 1 << 20:
        return None
    xs = [loop_var(k) for k in range(len(out_sizes))]
    grids = np.meshgrid(*[np.arange(int(s)) for s in out_sizes], indexing="ij") if out_sizes else []
    pos = sympy.lambdify(xs, rel, modules="numpy")(*grids) + np.zeros(tuple(int(s) for s in out_sizes), dtype=np.int64)
    left = pos.copy()
    for d in dims:
        j, left = np.floor_divide(left, int(a_strides[d])), np.mod(left, int(a_strides[d]))
        if np.any(j < 0) or np.any(j >= int(a_sizes[d])):
            return None
    if np.any(left != 0) or np.any(pos < 0):
        return None
    return element


# ---------------------------------------------------------------------------- creation

@register("full", "full_like", "scalar_tensor", "new_full", "fill")
def full(ctx, meta, **kw):
    m = _out(meta)
    value = None
    for key in ("fill_value", "value", "s"):
        if key in kw:
            value = kw[key]
    if isinstance(value, TensorValue):
        if value.ndim != 0:
            raise LoweringError("fill with a non-scalar tensor")
        return _value(meta, cast(broadcast_to(value, tuple(map(to_sympy, m.shape))).expr, m.dtype))
    if isinstance(value, sympy.Expr):
        return _value(meta, size_scalar(value, m.dtype))
    if not isinstance(value, (bool, int, float)):
        raise LoweringError("fill value is not a number")
    return _value(meta, constant(value, m.dtype))


def _constant_rule(v):
    def rule(ctx, meta, **kw):
        return _value(meta, constant(v, _out(meta).dtype))
    return rule


for _n, _v in {"zeros": 0, "zeros_like": 0, "new_zeros": 0, "ones": 1, "ones_like": 1, "new_ones": 1}.items():
    register(_n)(_constant_rule(_v))


@register("iota", "arange")
def iota(ctx, meta, start=0, step=1, end=None, **kw):
    m = _out(meta)
    if m.dim() != 1 or not all(isinstance(v, (int, float, sympy.Expr)) for v in (start, step)):
        raise LoweringError("iota arguments")
    if any(isinstance(v, sympy.Expr) for v in (start, step)):
        if any(isinstance(v, float) for v in (start, step)):
            raise LoweringError("iota with a float and a symbolic argument")
        return _value(meta, cast(IndexValue(to_sympy(start) + to_sympy(step) * loop_var(0)), m.dtype))
    if m.dtype.is_floating_point:
        scaled = Op("mul", (cast(IndexValue(loop_var(0)), m.dtype), constant(step, m.dtype)), m.dtype)
        return _value(meta, Op("add", (constant(start, m.dtype), scaled), m.dtype))
    return _value(meta, cast(IndexValue(start + step * loop_var(0)), m.dtype))


@register("empty_strided", "empty", "empty_like", "new_empty", "new_empty_strided")
def empty(ctx, meta, **kw):
    return _value(meta, constant(0, _out(meta).dtype))


@register("copy_strided")
def copy_strided(ctx, meta, a=None, stride=None, **_):
    """A copy into a given layout: the layout matters to whoever reads the buffer's memory."""
    return ctx.load_buffer(ctx.realize(a, stride))


@register("flip")
def flip(ctx, meta, a=None, self=None, dims=None, **_):
    x = a if a is not None else self
    dims = _dims(dims, x.ndim)
    idx = [(x.sizes[k] - 1 - loop_var(k)) if k in dims else loop_var(k) for k in range(x.ndim)]
    return reindex(x, x.sizes, idx)


# A cat of more pieces is an extern copy, as in eager: a kernel's element would evaluate a chain
# of one `where` and one load per piece (every load is evaluated), and split's backward of a
# 4096-row input in pieces of 2 (a cat of 2048) nested wheres past Python's recursion limit
# (fuzz seed 1010033).
MAX_CAT_PIECES = 32


@register("cat")
def cat(ctx, meta, tensors=None, dim=0, **_):
    m = _out(meta)
    parts = [t for t in tensors if isinstance(t, TensorValue) and not (t.ndim == 1 and t.sizes[0] == 0)]
    if not parts:
        raise LoweringError("cat of nothing")
    if len(parts) > MAX_CAT_PIECES:
        raise LoweringError(f"cat of {len(parts)} pieces: an extern copy")
    dim = dim % m.dim()
    var = loop_var(dim)
    expr, offset = None, sympy.Integer(0)
    pieces = []
    for i, t in enumerate(parts):
        idx = [loop_var(k) for k in range(t.ndim)]
        # every piece's load is evaluated (a GPU load is not skipped by the `where` around it), so its
        # index is clamped into the piece: unclamped, LLaMA's rotary cat read out of bounds on the H200.
        # The first piece starts at 0 and the last ends at the output's end, so each needs one side
        # only ([Note: clamps that do not compare] for the Min and Max).
        local = var - offset
        if i + 1 < len(parts):
            local = Min(local, t.sizes[dim] - 1)
        if i > 0:
            local = Max(0, local)
        idx[dim] = local
        shifted = ir.subs_index(cast(t.expr, m.dtype), {loop_var(k): idx[k] for k in range(t.ndim)})
        pieces.append((offset + t.sizes[dim], shifted))
        offset = offset + t.sizes[dim]
    expr = pieces[-1][1]
    for end, e in reversed(pieces[:-1]):
        expr = Op("where", (Op("lt", (IndexValue(var), IndexValue(end)), torch.bool), e, expr), m.dtype)
    return _value(meta, expr)


@register("pad")
def pad(ctx, meta, a=None, value=0, low=None, high=None, interior=None, **_):
    if any(i != 0 for i in interior or ()):
        raise LoweringError("interior padding")
    m = _out(meta)
    x = a
    conds, idx = [], []
    for k in range(x.ndim):
        lo = to_sympy(low[k])
        v = loop_var(k) - lo
        idx.append(v)
        if lo != 0 or to_sympy(high[k]) != 0:
            conds.append(Op("ge", (IndexValue(v), IndexValue(sympy.Integer(0))), torch.bool))
            conds.append(Op("lt", (IndexValue(v), IndexValue(x.sizes[k])), torch.bool))
    inner = ir.subs_index(x.expr, {loop_var(k): idx[k] for k in range(x.ndim)})
    if not conds:
        return _value(meta, inner)
    cond = conds[0]
    for c in conds[1:]:
        cond = Op("logical_and", (cond, c), torch.bool)
    # out-of-range reads are guarded by `where` in C++ (?:) only if the load is not evaluated:
    # clamp the index instead so the read is always in bounds.
    safe = ir.subs_index(x.expr, {loop_var(k): Max(0, Min(idx[k], x.sizes[k] - 1))
                                  for k in range(x.ndim)})
    return _value(meta, Op("where", (cond, safe, constant(value, m.dtype)), m.dtype))
