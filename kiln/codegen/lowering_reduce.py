"""Lowering rules for reductions, scans and indexing, and the extern fallback.

Reductions always realize (a `Reduction` node into a fresh buffer); `keepdim` and dtype are views
and casts on top. Gathers (embedding, index_select, gather, index with tensors) become indirect
loads, so they fuse into their consumers. Every op with no rule runs as an `ExternKernel`.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.indexing import _bounds as index_range, simplify_index
from kiln.codegen.ir import Load, Op, indirect_var, loop_var
from kiln.codegen.lowering import (LoweringContext, LoweringError, TensorValue, broadcast_to, cast, constant,
                                   op_name, register, reindex, size_scalar, to_sympy)
from kiln.codegen.lowering_rules import _dims, _operand, _out, _value
from kiln.symbolic.decide import is_unbacked

# ---------------------------------------------------------------------------- reductions

REDUCTIONS = {"sum": "sum", "amax": "max", "amin": "min", "prod": "prod", "any": "any", "all": "all",
              "max": "max", "min": "min"}


def _keepdim(ctx, tv: TensorValue, meta, ndim_in: int, dims: list[int]) -> TensorValue:
    m = _out(meta)
    out = tuple(map(to_sympy, m.shape))
    if len(out) == tv.ndim:
        return tv
    idx = [loop_var(k) for k in range(len(out)) if k not in dims]  # kept dims, in order
    return reindex(tv, out, idx)


def _reduce(name: str):
    op = REDUCTIONS[name]

    def rule(ctx: LoweringContext, meta, **kw):
        x = kw.get("a", kw.get("self"))
        if isinstance(meta, (tuple, list)) or not isinstance(x, TensorValue) or kw.get("other") is not None:
            raise LoweringError("multi-output or non-tensor reduction")
        dims = kw.get("dims", kw.get("dim"))
        if name in ("max", "min") and dims is None and "dim" in kw and kw["dim"] is None:
            dims = None
        dims = _dims(dims, x.ndim)
        if x.ndim == 0 or (not dims and "dims" in kw):
            # Over no dims (a prim's `dims=[]`, a weight gradient with no batch dim left; ATen's
            # `dim=[]` means every dim) a reduction folds each element alone: the element, cast.
            # As a Reduction it was a stage with an accumulator and no reduction loop, which the
            # Triton printer had no place for (fuzz seed 200020 of --triton-interpret --half).
            return _value(meta, cast(x.expr, _out(meta).dtype))
        m = _out(meta)
        compute = m.dtype
        if op in ("any", "all"):
            expr = cast(x.expr, torch.bool)
        else:
            expr = cast(x.expr, compute)
        red = ctx.emit_reduction(TensorValue(x.sizes, compute, x.device, expr), dims, op, compute)
        return _keepdim(ctx, red, meta, x.ndim, dims)
    return rule


for _n in REDUCTIONS:
    register(_n)(_reduce(_n))


@register("mean")
def mean(ctx, meta, self=None, dim=None, keepdim=False, dtype=None, **_):
    m = _out(meta)
    dims = _dims(dim, self.ndim)
    if not dims or self.ndim == 0:
        return _value(meta, cast(self.expr, m.dtype))
    count = ir.product(self.sizes[d] for d in dims)
    red = ctx.emit_reduction(TensorValue(self.sizes, m.dtype, self.device, cast(self.expr, m.dtype)), dims,
                             "sum", m.dtype)
    expr = Op("truediv", (red.expr, size_scalar(count, m.dtype)), m.dtype)
    return _keepdim(ctx, TensorValue(red.sizes, m.dtype, red.device, expr), meta, self.ndim, dims)


@register("var")
def var(ctx, meta, a=None, self=None, dims=None, dim=None, correction=None, unbiased=None, keepdim=False, **_):
    x = a if a is not None else self
    m = _out(meta)
    if m.dtype not in (torch.float32, torch.float64):
        raise LoweringError("var of a non-float")
    dims = _dims(dims if dims is not None else dim, x.ndim)
    if correction is None:
        correction = 1 if unbiased in (None, True) else 0
    count = ir.product(x.sizes[d] for d in dims)
    src = TensorValue(x.sizes, m.dtype, x.device, cast(x.expr, m.dtype))
    m2 = ctx.emit_reduction(src, dims, "welford_m2", m.dtype)
    denom = sympy.Max(count - correction, 0)
    expr = Op("truediv", (m2.expr, size_scalar(denom, m.dtype)), m.dtype)
    return _keepdim(ctx, TensorValue(m2.sizes, m.dtype, m2.device, expr), meta, x.ndim, dims)


@register("var_mean")
def var_mean(ctx, meta, a=None, dims=None, **_):
    """(biased variance, mean) from one Welford pass: both halves of the pair reduce the same
    value, so printers compute them together (Triton's in eager's layer_norm order)."""
    var_meta, mean_meta = meta
    dtype = mean_meta.dtype
    if dtype not in (torch.float32, torch.float64):
        raise LoweringError("var_mean of a non-float")
    dims = _dims(dims, a.ndim)
    if not dims:
        return _value(var_meta, constant(0.0, dtype)), _value(mean_meta, cast(a.expr, dtype))
    src = TensorValue(a.sizes, dtype, a.device, cast(a.expr, dtype))
    m2 = ctx.emit_reduction(src, dims, "welford_m2", dtype)
    mean = ctx.emit_reduction(src, dims, "welford_mean", dtype)
    count = ir.product(a.sizes[d] for d in dims)
    var = TensorValue(m2.sizes, dtype, m2.device, Op("truediv", (m2.expr, size_scalar(count, dtype)), dtype))
    return var, mean


def _arg_reduce(op):
    def rule(ctx, meta, self=None, a=None, dim=None, keepdim=False, **_):
        x = self if self is not None else a
        if dim is None:
            flat = TensorValue((ir.product(x.sizes),), x.dtype, x.device, x.expr)
            from kiln.codegen.lowering import reshape_index
            flat = reindex(x, flat.sizes, reshape_index(x.sizes, flat.sizes)) if x.ndim != 1 else x
            red = ctx.emit_reduction(flat, [0], op, torch.int64)
            return _keepdim(ctx, red, meta, 1, [0]) if _out(meta).dim() == 0 else _value(meta, red.expr)
        dims = _dims(dim, x.ndim)
        if x.ndim == 0:
            return _value(meta, constant(0, torch.int64))
        red = ctx.emit_reduction(x, dims, op, torch.int64)
        return _keepdim(ctx, red, meta, x.ndim, dims)
    return rule


register("argmax")(_arg_reduce("argmax"))
register("argmin")(_arg_reduce("argmin"))


# ---------------------------------------------------------------------------- scans

SCANS = {"cumsum": "cumsum", "cumprod": "cumprod", "logcumsumexp": "logcumsumexp"}


def _scan(name):
    def rule(ctx, meta, a=None, self=None, dim=0, dtype=None, **_):
        x = a if a is not None else self
        m = _out(meta)
        if x.ndim == 0:
            return _value(meta, cast(x.expr, m.dtype))
        tv = TensorValue(x.sizes, m.dtype, x.device, cast(x.expr, m.dtype))
        return ctx.emit_scan(tv, dim % x.ndim, SCANS[name])
    return rule


for _n in SCANS:
    register(_n)(_scan(_n))


# ---------------------------------------------------------------------------- indexing

def _wrap(e: ir.ScalarExpr, size: sympy.Expr) -> ir.ScalarExpr:
    """An index value as int64. The index prims take indices in [0, size): the decompositions wrap
    negative ones where eager does (advanced indexing, `where(i < 0, i + size, i)`), not where it
    raises (embedding, index_select, gather, index_copy: -1 is an error there), and the kernel
    checks the rest ([Note: index bounds checks])."""
    return cast(e, torch.int64)


def _unwrapped(e: ir.ScalarExpr, size: sympy.Expr) -> ir.ScalarExpr:
    """The index `e` wraps if it is `where(i < 0, i + size, i)`, else `e`."""
    if not (isinstance(e, Op) and e.name == "where"):
        return e
    cond, added, raw = e.args
    if not (isinstance(cond, Op) and cond.name == "lt" and cond.args[0] == raw and _is_value(cond.args[1], 0)
            and isinstance(added, Op) and added.name == "add" and added.args[0] == raw
            and _is_value(added.args[1], size)):
        return e
    return raw


def _is_value(e: ir.ScalarExpr, value) -> bool:
    value = sympy.sympify(value)
    if isinstance(e, ir.Constant):
        return not isinstance(e.value, float) and sympy.Integer(int(e.value)) == value
    return isinstance(e, ir.IndexValue) and sympy.sympify(e.index) == value


def _gather_load(ctx, table: TensorValue, dim, index_expr, other_index: list, out_sizes) -> ir.ScalarExpr:
    """Read `table` at `other_index` with dim(s) `dim` replaced by the value(s) of `index_expr`
    (over the loop variables of `out_sizes`), each checked against its dim unless provably in it."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    exprs = [index_expr] if isinstance(dim, int) else list(index_expr)
    syms = {d: indirect_var(k) for k, d in enumerate(dims)}
    shifted = ir.subs_index(table.expr, {loop_var(k): syms.get(k, other_index[k]) for k in range(table.ndim)})
    if not isinstance(shifted, Load) or shifted.indirect or any(ld.indirect for e in exprs for ld in ir.loads_of(e)):
        raise LoweringError("gather from a computed table or nested gather")
    if any(sympy.sympify(table.sizes[d]) == 0 for d in dims):
        raise LoweringError("gather from an empty dim (every index is out of range; ATen raises)")
    binds = tuple((syms[d], _wrap(e, table.sizes[d])) for d, e in zip(dims, exprs))
    bounds = index_bounds_to_check(ctx, [(syms[d], e, table.sizes[d]) for d, e in zip(dims, exprs)], out_sizes)
    return Load(shifted.buffer, shifted.index, shifted.dtype, binds, bounds, ctx.check_origin if bounds else None)


# [Note: index bounds checks] An index tensor's values are data, and eager raises on one outside
# the dim it indexes ("index out of range in self"). So every gather (an indirect `Load`) and
# scatter (an indirect `Store`) carries `bounds`: each indirect symbol with the size of its dim.
# The C++ kernel records a failed check in its error value (a local max-reduction of OpenMP's:
# each thread and vector lane has its own, so neither races nor stops vectorizing; an atomic
# store per element made a 512-token embedding 4x slower) and skips the access; the host program raises an IndexError after the
# kernel. A Triton kernel `tl.device_assert`s the range (compiled with debug on for that kernel
# alone) and masks the access. A bound is left out where lowering proves the index in range, so
# the hot paths that compute their indices (argmax, a clamp, `%`, an arange) pay nothing:
# `_value_range` follows the index expression by interval arithmetic; a load of anything but an
# argmax/argmin result is unknown (a graph input such as a KV cache's `cache_position` is checked).
# The error is eager's for the op: a bound carries the user's op and line (`ir.CheckOrigin`, from
# the node's [Note: an op's origin] in kiln/aot/trace.py), and `ir.IndexCheck.error` raises
# RuntimeError for the ops whose ATen kernels do (gather, index_add, scatter), IndexError for the
# rest, with a message naming the op and line ("index out of range in index_select at model.py:12
# in forward: ..."). Ops that run as externs (scatter, scatter_add, scatter_reduce) raise ATen's
# own error, as eager, with the op and line added as a note (`INDEXING_EXTERNS`); index_reduce, an extern scatter_reduce too, reads its index through a checked
# gather first, for eager's IndexError. What the user's tensors hold after the error: [Note: a
# scatter into an input checks before it writes] in kiln/codegen/cpp.py.

def index_bounds_to_check(ctx, indices, out_sizes) -> tuple:
    """The (symbol, size) pairs of `indices` ((symbol, raw index expression, size) each, the
    expression over the loop variables of `out_sizes`) that may fall outside [-size, size)."""
    upper = {loop_var(k): to_sympy(s) for k, s in enumerate(out_sizes)}
    out = []
    for sym, e, size in indices:
        size = to_sympy(size)
        e = cast(e, torch.int64)
        raw = _unwrapped(e, size)       # wrapped from the end: in range if the raw one is in [-size, size)
        lo, hi = _value_range(ctx, raw, upper)
        first = -size if raw is not e else 0
        if not (_provably_nonnegative(lo - first) and _provably_nonnegative(size - 1 - hi)):
            out.append((sym, size))
    return tuple(out)


def _provably_nonnegative(e) -> bool:
    e = sympy.sympify(e)
    return e.is_finite is not False and e.is_nonnegative is True


_UNKNOWN = (-sympy.oo, sympy.oo)


def _value_range(ctx, e: ir.ScalarExpr, upper) -> tuple:
    """(min, max) of the integer value `e` can take, by interval arithmetic; +-oo where unknown."""
    if isinstance(e, ir.Constant):
        if isinstance(e.value, float) or e.dtype.is_floating_point:
            return _UNKNOWN
        return sympy.Integer(int(e.value)), sympy.Integer(int(e.value))
    if isinstance(e, ir.IndexValue):
        b = index_range(e.index, upper)
        return b if b is not None else _UNKNOWN
    if isinstance(e, Load):
        if e.dtype == torch.bool:
            return sympy.Integer(0), sympy.Integer(1)
        n = ctx.argmax_extent(e.buffer) if not e.indirect else None
        return (sympy.Integer(0), n - 1) if n is not None else _UNKNOWN
    if not isinstance(e, Op):
        return _UNKNOWN
    if e.name == "to_dtype":
        src = e.args[0].dtype
        if src.is_floating_point or e.dtype.is_floating_point or e.dtype == torch.bool:
            return _UNKNOWN
        return _value_range(ctx, e.args[0], upper)     # an integer narrowing could wrap: rare, unchecked
    if e.name in ("lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not"):
        return sympy.Integer(0), sympy.Integer(1)
    args = [_value_range(ctx, a, upper) for a in e.args]
    if e.name == "where":
        return sympy.Min(args[1][0], args[2][0]), sympy.Max(args[1][1], args[2][1])
    if e.name in ("maximum", "minimum"):
        f = sympy.Max if e.name == "maximum" else sympy.Min
        return f(args[0][0], args[1][0]), f(args[0][1], args[1][1])
    if e.name == "add":
        return args[0][0] + args[1][0], args[0][1] + args[1][1]
    if e.name == "sub":
        return args[0][0] - args[1][1], args[0][1] - args[1][0]
    if e.name == "remainder" and _provably_nonnegative(args[1][0] - 1):    # Python's: [0, divisor)
        return sympy.Integer(0), args[1][1] - 1
    return _UNKNOWN


@register("index")
def index(ctx, meta, a=None, self=None, indices=None, **_):
    """Advanced indexing by tensors on leading consecutive dims (the common case)."""
    x = a if a is not None else self
    if not indices or any(i is None for i in indices) or not all(isinstance(i, TensorValue) for i in indices):
        raise LoweringError("index with None or non-leading index tensors")
    if any(i.dtype == torch.bool for i in indices):
        raise LoweringError("boolean mask indexing")
    m = _out(meta)
    out = tuple(map(to_sympy, m.shape))
    indices = [_direct_index(ctx, i) for i in indices]
    k = len(indices)
    bnd = len(out) - (x.ndim - k)
    bshape = out[:bnd]
    exprs = [broadcast_to(i, bshape).expr for i in indices]
    table = ctx.load_buffer(ctx.realize(x))
    other = [None] * k + [loop_var(bnd + j) for j in range(x.ndim - k)]
    return _value(meta, _gather_load(ctx, table, list(range(k)), exprs, other, out))


def _direct_index(ctx, index: TensorValue) -> TensorValue:
    """An index tensor that is itself gathered (BERT's token types: a gather by position ids) is
    stored first: a load may bind one level of indirection, not two."""
    if any(ld.indirect for ld in ir.loads_of(index.expr)):
        return ctx.load_buffer(ctx.realize(index))
    return index


@register("embedding")
def embedding(ctx, meta, weight=None, indices=None, **_):
    m = _out(meta)
    indices = _direct_index(ctx, indices)
    table = ctx.load_buffer(ctx.realize(weight))
    n = indices.ndim
    index_expr = indices.expr  # over x0..x{n-1}
    return _value(meta, _gather_load(ctx, table, 0, index_expr, [None, loop_var(n)], m.shape))


@register("index_select")
def index_select(ctx, meta, self=None, dim=0, index=None, **_):
    if self.ndim == 0 or index.ndim != 1:
        raise LoweringError("index_select of a 0-dim tensor or with a 0-dim index")
    table = ctx.load_buffer(ctx.realize(self))
    dim = dim % max(self.ndim, 1)
    index_expr = ir.subs_index(index.expr, {loop_var(0): loop_var(dim)})
    return _value(meta, _gather_load(ctx, table, dim, index_expr, [loop_var(k) for k in range(self.ndim)],
                                     _out(meta).shape))


@register("gather")
def gather(ctx, meta, self=None, a=None, dim=0, index=None, **_):
    self = self if self is not None else a
    table = ctx.load_buffer(ctx.realize(self))
    dim = dim % max(self.ndim, 1)
    if self.ndim == 0:
        raise LoweringError("gather on a 0-dim tensor")
    return _value(meta, _gather_load(ctx, table, dim, index.expr, [loop_var(k) for k in range(self.ndim)],
                                     _out(meta).shape))


# ---------------------------------------------------------------------------- extern calls

def _extern_arg(ctx: LoweringContext, a, broadcast: bool = False):
    if isinstance(a, TensorValue):
        view = strided_view(ctx, a) or (broadcast_view(ctx, a) if broadcast else None)
        return view if view is not None else ir.BufferArg(ctx.realize(a).name)
    if isinstance(a, torch.SymInt):
        return ir.SizeArg(to_sympy(a))
    if isinstance(a, sympy.Basic):   # a size computed from symbols (a lowered sym_size)
        return int(a) if a.is_Integer else ir.SizeArg(a)
    if isinstance(a, (list, tuple)):
        return type(a)(_extern_arg(ctx, x, broadcast) for x in a)
    return a


def _matmuls() -> set:
    from kiln.prims.externs import EXTERN_OF_ATEN
    aten = torch.ops.aten
    ops = (aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default)
    return set(ops) | {EXTERN_OF_ATEN[op] for op in ops}


_TAKES_BROADCAST_VIEWS = _matmuls()


def _aligned_bias_arguments() -> dict:
    from kiln.prims.externs import EXTERN_OF_ATEN
    aten = torch.ops.aten
    positions = {aten._scaled_dot_product_efficient_attention.default: 3,
                 aten._scaled_dot_product_efficient_attention_backward.default: 4}
    return {**positions, **{EXTERN_OF_ATEN[op]: k for op, k in positions.items()}}


# the op -> the position of its attention bias, which the memory-efficient kernel reads with every
# stride but the last a multiple of 16 elements (ATen's `pad_bias`): a mask realized contiguous over
# 174 keys failed with "attn_bias is not correctly aligned (strideH)"
_ALIGNED_BIAS = _aligned_bias_arguments()
_BIAS_ALIGNMENT = 16


def _aligned_rows(ctx: LoweringContext, tv: TensorValue, arg):
    """`arg` (the extern argument made of `tv`) if its strides are aligned, else `tv` realized with
    its rows padded to the alignment (the outer sizes may be symbolic; a row length known only at
    run time keeps `arg`)."""
    strides = arg.strides if isinstance(arg, ir.ViewArg) else ctx.buffers[arg.name].strides
    if all(sympy.sympify(s).is_Integer and int(s) % _BIAS_ALIGNMENT == 0 for s in strides[:-1]):
        return arg
    if not sympy.sympify(tv.sizes[-1]).is_Integer:
        return arg
    pitch = -(-int(tv.sizes[-1]) // _BIAS_ALIGNMENT) * _BIAS_ALIGNMENT
    padded = [sympy.Integer(1)]
    for extent in ([pitch] + list(tv.sizes[-2:0:-1]))[:len(tv.sizes) - 1]:   # the row pitch, then outer dims
        padded.insert(0, padded[0] * extent)
    return ir.BufferArg(ctx.realize(tv, padded, fresh=True).name)


def broadcast_view(ctx: LoweringContext, tv: TensorValue) -> ir.ViewArg | None:
    """A value broadcast along some dims (its expression reads none of their loop variables),
    realized without them and handed on as a stride-0 view, as eager's `expand` is.

    `matmul` of a 4-D activation by a weight reaches ATen as `bmm` of the weight expanded to the
    batch: realized whole, convnext's MLP weights became 1 GB buffers written by a kernel each
    call (0.06x eager)."""
    if any(s == 0 for s in tv.sizes):
        # an empty value reads nothing (its index is 0 throughout): without its empty dims, it
        # would be one element computed from the empty inputs, out of their bounds
        return None
    read = set()
    for node in ir.walk(tv.expr):
        if isinstance(node, (Load, ir.IndexValue)):
            read |= sympy.sympify(node.index).free_symbols
    xs = [loop_var(k) for k in range(tv.ndim)]
    broadcast = [k for k, x in enumerate(xs) if x not in read and tv.sizes[k] != 1]
    if not broadcast:
        return None
    kept = [k for k in range(tv.ndim) if k not in broadcast]
    compact = TensorValue(tuple(tv.sizes[k] for k in kept), tv.dtype, tv.device,
                          ir.subs_index(tv.expr, {xs[k]: loop_var(i) for i, k in enumerate(kept)}))
    buf = ctx.realize(compact)
    strides = [sympy.Integer(0)] * tv.ndim
    for i, k in enumerate(kept):
        strides[k] = buf.strides[i]
    return ir.ViewArg(buf.name, tuple(tv.sizes), tuple(strides), sympy.Integer(0))


# Largest view whose div/mod index is checked point by point for being affine.
_CHECK_POINTS = 1 << 20


def strided_view(ctx: LoweringContext, tv: TensorValue) -> ir.ViewArg | None:
    """`tv` as a strided view of a buffer, when its index is affine in the loop variables."""
    e = tv.expr
    if not isinstance(e, Load) or e.indirect or e.buffer not in ctx.buffers:
        return None
    if ctx.buffers[e.buffer].dtype != tv.dtype:
        return None
    if ctx.buffer_of(tv) is not None:
        return None   # the buffer itself: a BufferArg
    xs = [loop_var(k) for k in range(tv.ndim)]
    index = simplify_index(e.index, dict(zip(xs, tv.sizes)))
    if any(ir.is_loop_var(s) for s in index.free_symbols - set(xs)):
        return None
    symbolic = not all(sympy.sympify(s).is_number for s in tv.sizes)
    zero = {x: 0 for x in xs}
    offset = index.xreplace(zero)
    # A dim of size 1 reads only its index 0: it does not count in the affine check, and keeps the
    # stride its variable has (eager's view has that stride; cuDNN's plan depends on strides).
    full = sympy.sympify(index)
    index = sympy.sympify(full.xreplace({x: 0 for k, x in enumerate(xs) if tv.sizes[k] == 1}))
    strides = []
    for k, x in enumerate(xs):
        if tv.sizes[k] == 1:
            step = sympy.expand(full.xreplace({**zero, x: 1}) - offset)
            strides.append(step if step.is_Integer and step >= 0 else sympy.Integer(0))
        else:
            strides.append(index.xreplace({**zero, x: 1}) - offset)
    affine = offset + sum((x * s for k, (x, s) in enumerate(zip(xs, strides)) if tv.sizes[k] != 1), sympy.Integer(0))
    if index.has(sympy.floor, sympy.Mod):
        if symbolic:
            return None   # no point-by-point check without sizes
        numel = int(ir.product(tv.sizes))
        if numel > _CHECK_POINTS or numel == 0:
            return None
        import numpy as np
        grids = np.meshgrid(*[np.arange(int(s)) for s in tv.sizes], indexing="ij") if tv.ndim else []
        fn = sympy.lambdify(xs, index - affine, modules="numpy")
        diff = fn(*grids) if tv.ndim else fn()
        if np.any(np.asarray(diff) != 0):
            return None
    elif sympy.expand(index - affine) != 0:
        return None
    if any(sympy.sympify(s).is_nonnegative is not True for s in (*strides, offset)):
        return None
    return ir.ViewArg(e.buffer, tuple(tv.sizes), tuple(strides), offset)


# [Note: host values] An extern may return Python values besides tensors: CUDA attention returns
# its max sequence lengths as SymInts next to the output (and philox state, None or tensors). The
# host program binds such a value to a local (`val7`) like a buffer, and a later extern or the
# graph's outputs read it by name: `SizeArg(Symbol("val7"))` prints as that name. No lowering rule
# sees one (`is_host_value` sends its consumers extern), so no kernel is built on a value known only
# when the program runs.

def host_value(name: str) -> ir.SizeArg:
    return ir.SizeArg(sympy.Symbol(name))


def is_host_value(v) -> bool:
    return isinstance(v, ir.SizeArg) and isinstance(v.expr, sympy.Symbol) and v.expr.name.startswith("val")


def _is_host_value(m) -> bool:
    """A non-tensor an extern returns that the host program can hold: numbers, and tuples of them."""
    if isinstance(m, (tuple, list)):
        return all(_is_host_value(x) for x in m)
    return isinstance(m, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _reads_storage_offset(target) -> bool:
    """ATen ops whose offset argument is absolute in their input's storage: an input of the graph,
    or a view, may start anywhere in its storage at run time, so such an op gets a copy of its own
    (which starts at offset 0, as the traced value did)."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") in ("as_strided", "as_strided_scatter", "as_strided_copy")




def extern_fallback(ctx: LoweringContext, target, args, kwargs, meta) -> Any:
    """Run `target` eagerly on whole tensors; its outputs become buffers of the meta's layout."""
    # Only matmuls take broadcast views: other kernels have layout demands of their own (CUDA
    # attention's bias must be aligned; a stride-0 one failed with a misaligned address).
    broadcast = target in _TAKES_BROADCAST_VIEWS
    call_args = tuple(_extern_arg(ctx, a, broadcast) for a in args)
    if _reads_storage_offset(target) and call_args and isinstance(args[0], TensorValue):
        call_args = (ir.BufferArg(ctx.realize(args[0], fresh=True).name),) + call_args[1:]
    bias = _ALIGNED_BIAS.get(target)
    if bias is not None and bias < len(args) and isinstance(args[bias], TensorValue):
        call_args = call_args[:bias] + (_aligned_rows(ctx, args[bias], call_args[bias]),) + call_args[bias + 1:]
    call_kwargs = tuple((k, _extern_arg(ctx, v, broadcast)) for k, v in kwargs.items())
    if ctx.device != "cpu":   # [Note: a CUDA program holds everything on its device] in lowering.py
        call_kwargs = tuple((k, torch.device(ctx.placed(v)) if isinstance(v, torch.device) else v)
                            for k, v in call_kwargs)
    flat = list(meta) if isinstance(meta, (tuple, list)) else [meta]
    names, values = [], []
    for m in flat:
        if isinstance(m, torch.Tensor):
            dev = ctx.placed(m.device)
            buf = ctx.add_buffer(ir.Buffer(ctx.new_name(), tuple(map(to_sympy, m.shape)),
                                           tuple(map(to_sympy, m.stride())), m.dtype, dev))
            names.append(buf.name)
            values.append(ctx.load_buffer(buf))
        elif m is None:
            names.append(None)
            values.append(None)
        elif is_unbacked(m) and isinstance(to_sympy(m), sympy.Symbol):
            # a size known only at run time (`.item()`): the host binds its symbol by name, and
            # kernels take it as any size ([Note: sizes bound by externs] in host.py). A size the
            # inputs already give (flash attention's max_seqlen_q is the query's length, `s1`) is
            # bound at the top of the program: naming the result `s1` too made the extern its
            # binding, after kernels that read it (UnboundLocalError on CUDA BERT, dynamic=True)
            names.append(to_sympy(m).name)
            values.append(to_sympy(m))
        elif _is_host_value(m):
            names.append(ctx.new_name("val"))
            values.append(host_value(names[-1]))
        else:
            raise LoweringError(f"extern {target} returns {type(m).__name__}, which kiln can hold neither "
                                "in a buffer nor as a Python value")
    origin = ctx.check_origin if op_name(target) in INDEXING_EXTERNS else None
    ctx.nodes.append(ir.ExternKernel(tuple(names), target, call_args, call_kwargs, origin))
    return tuple(values) if isinstance(meta, (tuple, list)) else values[0]


# Prims that read or write at indices from their data when they run as ATen kernels: ATen checks
# the indices and raises eager's error, to which the host program adds the user's op and line
# ([Note: index bounds checks])
INDEXING_EXTERNS = frozenset({"scatter", "scatter_reduce", "gather", "index", "index_put", "index_put_"})


@register("addmm")
def addmm(ctx, meta, self=None, mat1=None, mat2=None, beta=1, alpha=1, **_):
    """On CPU in float32 and float64, `bias + m1 @ m2` is the matmul and a pointwise add that fuses
    into its consumer (gelu, the residual add): MKL's addmm first copies the broadcast bias into
    the output, a whole pass over it (14% of the zoo vit's ATen time). Elsewhere the extern stays: cuBLAS's
    epilogue adds the bias for free, and in bfloat16 it rounds the sum once as eager does (mm then
    add rounds twice)."""
    from kiln.prims.externs import EXTERN_OF_ATEN
    m = _out(meta)
    if (ctx.device != "cpu" or m.dtype not in (torch.float32, torch.float64) or beta != 1 or alpha != 1
            or not isinstance(self, TensorValue)):
        raise LoweringError("addmm stays one extern call")
    product = extern_fallback(ctx, EXTERN_OF_ATEN[torch.ops.aten.mm.default], (mat1, mat2), {}, meta)
    sizes = tuple(map(to_sympy, m.shape))
    return _value(meta, Op("add", (product.expr, _operand(self, m.dtype, sizes)), m.dtype))
