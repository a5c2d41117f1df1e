"""Lowering rules for writes at loaded indices: `index_put` and `index_put_` (what aot and the
decompositions make of `index_copy_`, `x[idx] = v`, `index_put_(accumulate=True)`, `index_add`)
become `ir.Scatter` nodes: a kernel of kiln's own whose store address is computed from the index
tensor's values, as a gather's load address is ([Note: scatters write in place] in ir.py).

A static KV cache writes one position of every layer's cache each token: as an extern that was an
ATen index kernel per write (64 launches a token on dolly, 8% of its decoding step on the H100).
As a scatter, the write is one generated kernel, into which the new key's producers (the rotary
embedding, the projection's bias) fuse.

- `index_put_(a, ...)`, which codegen's reinplace pass makes for an input aot writes back, writes
  into the input's storage: `a` must read a graph input whole (through any permutation).
- `index_put(a, ...)` writes into a fresh copy of `a` that nothing else reads.
- Indices wrap from the end as eager's do; an index outside the dim is an error, as eager's
  ([Note: index bounds checks] in lowering_reduce.py).
- `accumulate=True` adds atomically, for the dtypes both printers add atomically (float32/64,
  int32/64); under `torch.use_deterministic_algorithms` it stays an extern (atomics sum in no
  fixed order).
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.ir import Load, indirect_var, loop_var
from kiln.codegen.lowering import LoweringContext, LoweringError, TensorValue, broadcast_to, cast, register
from kiln.codegen.lowering_reduce import _direct_index, _wrap, index_bounds_to_check

ATOMIC_DTYPES = frozenset({torch.float32, torch.float64, torch.int32, torch.int64})


@register("index_put_")
def index_put_into_input(ctx: LoweringContext, meta, a=None, indices=None, values=None, accumulate=False, **_):
    """`index_put_` on (a permutation of) a graph input: written into the input itself."""
    if not isinstance(a, TensorValue) or not isinstance(a.expr, Load) or a.expr.indirect:
        raise LoweringError("index_put_ into a computed value")
    into = ctx.buffers.get(a.expr.buffer)
    if into is None or not into.name.startswith("arg") or sympy.sympify(into.numel - ir.product(a.sizes)) != 0:
        raise LoweringError("index_put_ into a buffer that is no whole graph input")
    return _scatter(ctx, a, into, indices, values, accumulate)


@register("index_put")
def index_put(ctx: LoweringContext, meta, a=None, indices=None, values=None, accumulate=False, **_):
    """`index_put` out of place: a fresh copy of `a`, then the write into it."""
    if not isinstance(a, TensorValue):
        raise LoweringError("index_put of a non-tensor")
    _check(a, indices, values, accumulate)
    into = ctx.realize(a, fresh=True)
    return _scatter(ctx, ctx.load_buffer(into), into, indices, values, accumulate)


def _check(a: TensorValue, indices, values, accumulate) -> None:
    if not indices or not all(isinstance(i, TensorValue) for i in indices) or not isinstance(values, TensorValue):
        raise LoweringError("index_put with None indices or non-tensor values")
    if accumulate and (a.dtype not in ATOMIC_DTYPES or torch.are_deterministic_algorithms_enabled()):
        raise LoweringError(f"accumulating index_put of {a.dtype} (atomic adds) or in deterministic mode")
    if any(s == 0 for s in a.sizes):
        raise LoweringError("index_put into an empty tensor")


def _scatter(ctx: LoweringContext, target: TensorValue, into: ir.Buffer, indices, values, accumulate) -> TensorValue:
    """Write `values` into `into` where `target` (a load of `into`, any permutation of its dims)
    has its leading dims at the index tensors' values; the result reads the written buffer as
    `target` reads `into`."""
    _check(target, indices, values, accumulate)
    k = len(indices)
    indices = [_direct_index(ctx, i) for i in indices]     # one level of indirection per address
    shape = indices[0].sizes
    ranges = tuple(shape) + tuple(target.sizes[k:])
    values = broadcast_to(values, ranges)
    exprs = [broadcast_to(i, shape).expr for i in indices]
    syms = [indirect_var(d) for d in range(k)]
    rest = len(shape)
    address = {loop_var(d): syms[d] if d < k else loop_var(rest + d - k) for d in range(target.ndim)}
    written = ctx.add_buffer(dataclasses.replace(into, name=ctx.new_name()))
    bounds = index_bounds_to_check(ctx, [(s, e, target.sizes[d]) for d, (s, e) in enumerate(zip(syms, exprs))],
                                   ranges)
    body = ir.Scatter(ranges, into.name, ir.subs_index(target.expr, address).index,
                      tuple((s, _wrap(e, target.sizes[d])) for d, (s, e) in enumerate(zip(syms, exprs))),
                      bounds, cast(values.expr, target.dtype), bool(accumulate),
                      ctx.check_origin if bounds else None)
    ctx.nodes.append(ir.ComputedBuffer(written.name, body))
    return dataclasses.replace(target, expr=dataclasses.replace(target.expr, buffer=written.name))
