"""Fake rules for ops whose output sizes depend on the values in a tensor.

`nonzero`, `masked_select`, indexing by a boolean mask, the `unique` family, `repeat_interleave`
with a tensor of repeats and `_local_scalar_dense` (`t.item()`, `int(t)`, a tensor passed where a
size is expected) cannot have their output metadata computed from their inputs' metadata: a meta
kernel has no values. Each rule here gives the outputs a fresh unbacked symbol of the ShapeEnv
where the count goes ([Note: unbacked sizes] in shape_env.py), bounded by what the inputs' sizes
allow (nonzero of 12 elements finds at most 12), and lays the outputs out as eager's CPU kernel
does. histogramdd's steps are here too: their output sizes follow from `bins` alone, but torch has
no meta kernel for them, their values coming from the data's range. So is linalg_lstsq: no meta
kernel, and residuals that exist or not by the rank of A ([Note: lstsq's residuals]). The rules are
keyed by ATen overload in `RULES`; an extern prim that mirrors one of these overloads
(kiln/prims/externs.py) is given the same rule with `fake.alias_rule`.

One rule per op, one fresh symbol per call: two `nonzero` calls on the same mask get two symbols,
which the program never needs to know are equal (an op that requires it, `x[m] + y[m]`, assumes
it: ShapeEnv.expect_true).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from kiln.symbolic.strides import contiguous_strides

aten = torch.ops.aten


def _count(mode, upper) -> torch.SymInt | int:
    """An unbacked count of at most `upper` things (0 when there is nothing to count)."""
    upper = upper if isinstance(upper, int) else math.inf
    if upper == 0:
        return 0
    return mode.shape_env.unbacked_symint(size=True, upper=upper)


def _numel(t: torch.Tensor):
    n = t.numel()
    return n if isinstance(n, int) else None


def _new(mode, like: torch.Tensor, sizes, strides=None, dtype=None) -> torch.Tensor:
    from kiln.symbolic.fake import FakeTensor
    dtype = like.dtype if dtype is None else dtype
    with torch._C._DisableTorchDispatch():
        if strides is None:
            meta = torch.empty(list(sizes), dtype=dtype, device="meta")
        else:
            meta = torch.empty_strided(list(sizes), list(strides), dtype=dtype, device="meta")
    return FakeTensor(meta, like.device, mode)


def nonzero(mode, func, args, kwargs) -> torch.Tensor:
    (x,) = args
    n = _count(mode, _numel(x))
    # eager's CPU and CUDA kernels both write the indices column by column: strides (1, n)
    return _new(mode, x, (n, x.dim()), (1, n), torch.int64)


def masked_select(mode, func, args, kwargs) -> torch.Tensor:
    x, mask = args
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    numel = math.prod(shape) if all(isinstance(d, int) for d in shape) else None
    return _new(mode, x, (_count(mode, numel),))


def index(mode, func, args, kwargs) -> torch.Tensor:
    """`x[mask]`: each boolean index becomes the k index vectors of its nonzero positions, all of
    one unbacked length; then the ordinary (meta) rule of advanced indexing."""
    x, indices = args
    expanded = []
    for idx in indices:
        if idx is not None and idx.dtype in (torch.bool, torch.uint8):
            n = _count(mode, _numel(idx))
            expanded += [_new(mode, idx, (n,), dtype=torch.int64)] * max(idx.dim(), 1)
        else:
            expanded.append(idx)
    return mode.run(aten.index.Tensor, (x, expanded), {})


def _unique_outputs(mode, x, dim, return_inverse, return_counts, always_both=False):
    """(values, inverse, counts) as eager's CPU kernels shape them; with a dim the CPU kernel
    returns inverse and counts whether asked or not."""
    if dim is None:
        n = _count(mode, _numel(x))
        values = _new(mode, x, (n,))
        inverse_shape = tuple(x.shape)
    else:
        dim = dim % max(x.dim(), 1)
        size = x.shape[dim]
        n = _count(mode, size if isinstance(size, int) else None)
        values = _new(mode, x, (*x.shape[:dim], n, *x.shape[dim + 1:]))
        inverse_shape = (size,)
    both = always_both and dim is not None
    inverse = _new(mode, x, inverse_shape if return_inverse or both else (0,), dtype=torch.int64)
    counts = _new(mode, x, (n,) if return_counts or both else (0,), dtype=torch.int64)
    return values, inverse, counts


def unique2(mode, func, args, kwargs) -> tuple:
    bound = func._schema.arguments
    a = _bind(bound, args, kwargs)
    return _unique_outputs(mode, a["self"], None, a["return_inverse"], a["return_counts"])


def unique(mode, func, args, kwargs) -> tuple:
    a = _bind(func._schema.arguments, args, kwargs)
    values, inverse, _ = _unique_outputs(mode, a["self"], None, a["return_inverse"], False)
    return values, inverse


def unique_dim(mode, func, args, kwargs) -> tuple:
    a = _bind(func._schema.arguments, args, kwargs)
    return _unique_outputs(mode, a["self"], a["dim"], a["return_inverse"], a["return_counts"], True)


def unique_consecutive(mode, func, args, kwargs) -> tuple:
    a = _bind(func._schema.arguments, args, kwargs)
    x, dim = a["self"], a["dim"]
    if dim == 0 and x.dim() == 1:      # ATen's kernel takes its flat path here (only for dim 0, not -1)
        dim = None
    return _unique_outputs(mode, x, dim, a["return_inverse"], a["return_counts"], True)


def repeat_interleave(mode, func, args, kwargs) -> torch.Tensor:
    a = _bind(func._schema.arguments, args, kwargs)
    repeats, size = a["repeats"], a.get("output_size")
    if size is None:
        size = _count(mode, math.inf)
    return _new(mode, repeats, (size,))


def local_scalar_dense(mode, func, args, kwargs) -> Any:
    """`t.item()`: an unbacked int for an integer tensor; for a bool tensor an unbacked SymBool
    `Eq(u, 1)` over an unbacked u in [0, 1] (as torch.compile does), which `torch._check` can assume
    and a branch on stays a graph break. A float read from a tensor stays a data-dependent op
    (DataDependentOp): no kernel could take it as a size."""
    from kiln.symbolic.fake import DataDependentOp, FakeTensor
    (x,) = args
    if isinstance(x, FakeTensor) and x.constant is not None:
        return x.constant.item()       # torch.tensor(3) made in traced code: its value is known
    if x.dtype.is_floating_point or x.dtype.is_complex:
        raise DataDependentOp(func)
    # the same tensor read twice, unchanged in between (its version), is the same number
    memo = getattr(x, "_item_memo", None)
    if memo is not None and memo[0] == x._version:
        return memo[1]
    value = mode.shape_env.unbacked_symbool() if x.dtype == torch.bool else \
        mode.shape_env.unbacked_symint(size=False)
    x._item_memo = (x._version, value)
    return value


def histogramdd_bin_edges(mode, func, args, kwargs) -> list:
    """The edges' values come from the data's range, their sizes only from `bins` (torch has no
    meta kernel for either histogramdd step)."""
    a = _bind(func._schema.arguments, args, kwargs)
    return [_new(mode, a["self"], (b + 1,)) for b in a["bins"]]


def histogramdd_counts(mode, func, args, kwargs) -> torch.Tensor:
    a = _bind(func._schema.arguments, args, kwargs)
    bins = a["bins"]
    sizes = [b.shape[0] - 1 for b in bins] if bins and isinstance(bins[0], torch.Tensor) else list(bins)
    return _new(mode, a["self"], sizes)


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")
_LSTSQ_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def linalg_lstsq(mode, func, args, kwargs) -> tuple:
    """[Note: lstsq's residuals] torch has no meta kernel for linalg_lstsq. Its outputs, as ATen's
    `linalg_lstsq_out_info` lays them out for A (*a, m, n) and B (*b, m, k) or a vector B (*b, m)
    (batch *a and *b broadcast to *bb):
      * solution (*bb, n, k), column-major inside the (*bb, max(m, n), k) buffer LAPACK wrote
        (strides (.., 1, max(m, n))); (*bb, n) with strides (.., 1) for a vector B;
      * rank (*a) for every driver but gels, else (0,); singular_values (*a, min(m, n)) for gelsd
        and gelss, else (0,);
      * residuals, the squared norm of each column of B - A X: only when m > n and the driver is not
        gelsy, (*bb, k) ((*bb, 1) for a vector B); else (0,). gelsd and gelss compute them only when
        every matrix of A has rank n, which depends on A's values. For one matrix that is a length
        known only at run time, k or 0: an unbacked size, as nonzero's count. For a batch the
        number of dims changes with the data ((*bb, k) or (0,)), which no size can say: that call
        is a data-dependent op (the graph breaks there; rank-deficient batches are why eager
        returns an empty tensor).
    Errors are eager's, in eager's order, so a compiled call refuses what eager refuses."""
    from kiln.symbolic.fake import DataDependentOp
    a = _bind(func._schema.arguments, args, kwargs)
    A, B = a["self"], a["b"]
    if A.dim() < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if B.dim() < 1:
        raise RuntimeError("torch.linalg.lstsq: other must have at least 1 dimension.")
    if A.dtype != B.dtype:
        raise RuntimeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
                           f"input's dtype {A.dtype} and other's dtype {B.dtype}")
    if not 0 <= A.dim() - B.dim() <= 1:
        raise RuntimeError("torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    vector = B.dim() == 1 or (A.dim() - 1 == B.dim() and tuple(B.shape) == tuple(A.shape[:-1]))
    if A.dim() - B.dim() == 1 and not vector:
        # eager broadcasts A's batch with B's leading dims, then refuses B's rows
        torch.broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-1]))
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    B2 = B.unsqueeze(-1) if vector else B
    if A.shape[-2] != B2.shape[-2]:
        raise RuntimeError(f"torch.linalg.lstsq: input.size(-2) should match other.size({-1 if vector else -2})")
    driver = a.get("driver")
    cuda = A.device.type == "cuda"
    driver = ("gels" if cuda else "gelsy") if driver is None else driver.lower()
    if cuda and driver != "gels":
        raise RuntimeError("torch.linalg.lstsq: `driver` other than `gels` is not supported on CUDA")
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if A.dtype not in _LSTSQ_DTYPES:
        raise RuntimeError("This function doesn't handle types other than float and double")

    m, n, k = A.shape[-2], A.shape[-1], B2.shape[-1]
    batch = tuple(torch.broadcast_shapes(tuple(A.shape[:-2]), tuple(B2.shape[:-2])))
    real = A.dtype.to_real()
    rows = torch.sym_max(m, n)
    if vector:
        solution = _new(mode, A, (*batch, n), (*contiguous_strides((*batch, rows))[:-1], 1))
    else:
        strides = (*contiguous_strides((*batch, k, rows))[:-2], 1, torch.sym_max(rows, 1))
        solution = _new(mode, A, (*batch, n, k), strides)
    residuals = _new(mode, A, (0,), dtype=real)
    if m > n and driver != "gelsy":
        # gelsd, gelss: `rank == n` of every matrix; nothing to test for no column or no matrix
        by_rank = driver in ("gelsd", "gelss") and n != 0 and all(d != 0 for d in A.shape[:-2])
        if by_rank and A.dim() > 2:
            raise DataDependentOp(func, "with driver gelsd or gelss and more rows than columns, its residuals "
                                  "are (*batch, k) where every matrix of the batch has full rank and empty (0,) "
                                  "otherwise: their number of dims depends on the data (driver gels or gelsy, "
                                  "or one matrix per call, compiles to one graph)")
        if by_rank:
            residuals = _new(mode, A, (_count(mode, k if isinstance(k, int) else math.inf),), dtype=real)
        else:
            residuals = _new(mode, A, (*batch, k), dtype=real)
    rank = _new(mode, A, (0,) if driver == "gels" else tuple(A.shape[:-2]), dtype=torch.int64)
    singular = _new(mode, A, (*A.shape[:-2], torch.sym_min(m, n)) if driver in ("gelsd", "gelss") else (0,),
                    dtype=real)
    return solution, residuals, rank, singular


def _bind(arguments, args, kwargs) -> dict:
    bound = {}
    for i, arg in enumerate(arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


# [Note: indices read from data] `out[start:end] = v` with bounds read from a tensor (aria's experts,
# pixtral's block mask) and `y[i] = v` with `i = t.argmax().item()`: eager wraps a negative index
# (`i + size`) and clamps slice bounds to the dim, so where the sign of an unbacked index is unknown
# neither the view's size nor its storage offset has one expression. As torch.compile's fake
# kernels do, the view gets fresh unbacked symbols for them (a size of at most the dim's); the
# graph runs the real op, which wraps and clamps as eager does. A select out of range still raises
# at run time: Tensor indexing checks it (`expect_true`: assumed here, `aten.select` raises there).
def _sign_unknown(v) -> bool:
    if not isinstance(v, torch.SymInt):
        return False
    env = v.node.shape_env
    expr = env.simplify(v.node.expr)
    return env.has_unbacked(expr) and env.static_value(expr >= 0) is None


def _view(mode, x: torch.Tensor, sizes, strides, offset) -> torch.Tensor:
    from kiln.symbolic.fake import FakeTensor
    with torch._C._DisableTorchDispatch():
        meta = x._meta.as_strided(list(sizes), list(strides), offset)
    return FakeTensor(meta, x.device, mode)


def _has_sign_unknown_index(func, args, kwargs) -> bool:
    return any(_sign_unknown(a) for a in (*args[2:], *kwargs.values()))


def select(mode, func, args, kwargs) -> torch.Tensor:
    x, dim, _ = args
    dim = dim % x.dim()
    offset = mode.shape_env.unbacked_symint(size=True)     # index or index + size: not one expression
    keep = [d for d in range(x.dim()) if d != dim]
    return _view(mode, x, [x.shape[d] for d in keep], [x.stride()[d] for d in keep], offset)


def slice_tensor(mode, func, args, kwargs) -> torch.Tensor:
    a = _bind(func._schema.arguments, args, kwargs)
    x, dim, step = a["self"], a["dim"] % a["self"].dim(), a["step"]
    size = x.shape[dim]
    length = _count(mode, size if isinstance(size, int) else None)
    sizes, strides = list(x.shape), list(x.stride())
    sizes[dim] = length if step == 1 else (length + step - 1) // step
    strides[dim] = strides[dim] * step
    start = a["start"]
    offset = x.storage_offset() + (start if start is not None else 0) * x.stride()[dim] \
        if not _sign_unknown(start) else mode.shape_env.unbacked_symint(size=True)
    return _view(mode, x, sizes, strides, offset)


def _is_bool_index(func, args, kwargs) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])


RULES: dict[Any, Callable] = {
    aten.nonzero.default: nonzero,
    aten.masked_select.default: masked_select,
    aten._unique2.default: unique2,
    aten._unique.default: unique,
    aten.unique_dim.default: unique_dim,
    aten.unique_consecutive.default: unique_consecutive,
    aten.repeat_interleave.Tensor: repeat_interleave,
    aten._local_scalar_dense.default: local_scalar_dense,
    aten._histogramdd_bin_edges.default: histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: histogramdd_counts,
    aten._histogramdd_from_bin_tensors.default: histogramdd_counts,
    aten.linalg_lstsq.default: linalg_lstsq,
}
# Ops that are data-dependent for some arguments only: (test, rule); otherwise their meta kernel.
CONDITIONAL: dict[Any, tuple[Callable, Callable]] = {
    aten.index.Tensor: (_is_bool_index, index),
    aten.select.int: (_has_sign_unknown_index, select),
    aten.slice.Tensor: (_has_sign_unknown_index, slice_tensor),
}
