"""Decompositions of ATen's reductions and scans.

Sums accumulate in float32 for float16/bfloat16 inputs and in int64 for integers and bool (eager's
rules), with the cast written as `convert_element_type` around one `sum` prim. Statistics (mean,
var, std, norms, logsumexp) are formulas over `sum`, `amax` and elementwise prims.
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import (broadcast_to, canonical_dim, canonical_dims, complex_parts,
                                            computation_dtype, convert, full, has_elements, is_float, magnitude,
                                            numel, reshape, restore_dims, scalar_tensor, shifted_mean)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


def _sum_dtype(a, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if not is_float(a.dtype) else a.dtype


def reduce_sum(a, dims, keepdim=False, dtype=None):
    dims = canonical_dims(dims, a.ndim)
    out_dtype = _sum_dtype(a, dtype)
    x = convert(a, computation_dtype(out_dtype))
    r = p.sum(x, dims)
    return restore_dims(convert(r, out_dtype), a, dims, keepdim)


@register(aten.sum.default)
def sum_(a, *, dtype=None):
    return reduce_sum(a, None, False, dtype)


@register(aten.sum.dim_IntList)
def sum_dim(a, dim, keepdim=False, *, dtype=None):
    return reduce_sum(a, dim, keepdim, dtype)


@register(aten.nansum.default)
def nansum(a, dim=None, keepdim=False, *, dtype=None):
    if is_float(a.dtype):
        a = p.where(p.isnan(a), full(a.shape, 0, a.dtype, a.device), a)
    return reduce_sum(a, dim, keepdim, dtype)


@register(aten.prod.default)
def prod(a, *, dtype=None):
    return prod_dim(a, None, False, dtype=dtype, all_dims=True)


@register(aten.prod.dim_int)
def prod_dim(a, dim, keepdim=False, *, dtype=None, all_dims=False):
    dims = canonical_dims(None if all_dims else [dim], a.ndim)
    out_dtype = _sum_dtype(a, dtype)
    r = p.prod(convert(a, computation_dtype(out_dtype)), dims)
    return restore_dims(convert(r, out_dtype), a, dims, keepdim)


def _count(a, dims):
    return numel([a.shape[d] for d in dims]) if a.ndim else 1


@register(aten.mean.default)
def mean(a, *, dtype=None):
    return mean_dim(a, None, False, dtype=dtype)


@register(aten.mean.dim)
def mean_dim(a, dim, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, a.ndim)
    out_dtype = dtype or a.dtype
    if not is_float(out_dtype):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {out_dtype}")
    compute = computation_dtype(out_dtype)
    s = p.sum(convert(a, compute), dims)
    r = p.div(s, full(s.shape, _count(a, dims), compute, a.device))
    return restore_dims(convert(r, out_dtype), a, dims, keepdim)


def _var(a, dims, correction, keepdim):
    """(variance in the computation dtype, mean with kept dims) over dims."""
    compute = computation_dtype(a.dtype)
    x = convert(a, compute)
    n = _count(a, dims)
    kept = [i for i in range(a.ndim) if i not in dims]
    if has_elements(a, dims):
        m = shifted_mean(x, dims, n)             # [Note: shifted mean] in refs.py
    else:
        s = p.sum(x, dims)
        m = p.div(s, full(s.shape, n, compute, a.device))
    m_b = p.broadcast_in_dim(m, list(a.shape), kept) if a.ndim else m
    d = p.sub(x, m_b)
    if d.dtype.is_complex:       # |d|^2: a complex input's variance is real
        real, imag = complex_parts(d)
        squares = p.add(p.mul(real, real), p.mul(imag, imag))
    else:
        squares = p.mul(d, d)
    ss = p.sum(squares, dims)
    denom = max(n - correction, 0)
    v = p.div(ss, full(ss.shape, denom, ss.dtype, a.device))
    return v, m


def _correction(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@register(aten.var.correction)
def var(a, dim=None, *, correction=None, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    v, _ = _var(a, dims, _correction(correction), keepdim)
    return restore_dims(convert(v, a.dtype.to_real()), a, dims, keepdim)


@register(aten.std.correction)
def std(a, dim=None, *, correction=None, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    v, _ = _var(a, dims, _correction(correction), keepdim)
    return restore_dims(convert(p.sqrt(v), a.dtype.to_real()), a, dims, keepdim)


@register(aten.var_mean.correction)
def var_mean(a, dim=None, *, correction=None, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    v, m = _var(a, dims, _correction(correction), keepdim)
    return (restore_dims(convert(v, a.dtype.to_real()), a, dims, keepdim),
            restore_dims(convert(m, a.dtype), a, dims, keepdim))


@register(aten.std_mean.correction)
def std_mean(a, dim=None, *, correction=None, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    v, m = _var(a, dims, _correction(correction), keepdim)
    return (restore_dims(convert(p.sqrt(v), a.dtype.to_real()), a, dims, keepdim),
            restore_dims(convert(m, a.dtype), a, dims, keepdim))


def _extreme(prim, a, dim, keepdim):
    dims = canonical_dims(dim, a.ndim)
    if a.numel() == 0 and any(a.shape[d] == 0 for d in dims):
        raise IndexError(f"{prim.__name__}(): Expected reduction dim to have non-zero size.")
    return restore_dims(prim(a, dims), a, dims, keepdim)


@register(aten.amax.default)
def amax(a, dim=(), keepdim=False):
    return _extreme(p.amax, a, dim, keepdim)


@register(aten.amin.default)
def amin(a, dim=(), keepdim=False):
    return _extreme(p.amin, a, dim, keepdim)


@register(aten.max.default)
def max_(a):
    return _extreme(p.amax, a, None, False)


@register(aten.min.default)
def min_(a):
    return _extreme(p.amin, a, None, False)


def _arg(prim, a, dim, keepdim):
    if dim is None:
        flat = reshape(a, [-1])
        r = prim(flat, 0)
        return p.view(r, [1] * a.ndim) if keepdim else r
    dim = canonical_dim(dim, a.ndim)
    if a.ndim == 0:
        return full([], 0, torch.int64, a.device)
    return restore_dims(prim(a, dim), a, [dim], keepdim)


@register(aten.argmax.default)
def argmax(a, dim=None, keepdim=False):
    return _arg(p.argmax, a, dim, keepdim)


@register(aten.argmin.default)
def argmin(a, dim=None, keepdim=False):
    return _arg(p.argmin, a, dim, keepdim)


@register(aten.max.dim)
def max_dim(a, dim, keepdim=False):
    return amax(a, [dim], keepdim), argmax(a, dim, keepdim)


@register(aten.min.dim)
def min_dim(a, dim, keepdim=False):
    return amin(a, [dim], keepdim), argmin(a, dim, keepdim)


@register(aten.aminmax.default)
def aminmax(a, *, dim=None, keepdim=False):
    return amin(a, [] if dim is None else [dim], keepdim), amax(a, [] if dim is None else [dim], keepdim)


def _bool_reduce(prim, a, dims, keepdim):
    b = a if a.dtype == torch.bool else p.ne(a, full(a.shape, 0, a.dtype, a.device))
    dims = canonical_dims(dims, a.ndim)
    r = prim(b, dims)
    out = restore_dims(r, a, dims, keepdim)
    return convert(out, torch.uint8) if a.dtype == torch.uint8 else out


@register(aten.any.default)
def any_(a):
    return _bool_reduce(p.amax, a, None, False)


@register(aten.any.dim, aten.any.dims)
def any_dim(a, dim=None, keepdim=False):
    return _bool_reduce(p.amax, a, dim, keepdim)


@register(aten.all.default)
def all_(a):
    return _bool_reduce(p.amin, a, None, False)


@register(aten.all.dim, aten.all.dims)
def all_dim(a, dim=None, keepdim=False):
    return _bool_reduce(p.amin, a, dim, keepdim)


@register(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(a, dim=None):
    nz = p.convert_element_type(p.ne(a, full(a.shape, 0, a.dtype, a.device)), torch.int64)
    return reduce_sum(nz, dim if dim is None or isinstance(dim, (list, tuple)) else [dim])


@register(aten.logsumexp.default)
def logsumexp(a, dim, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    if not is_float(a.dtype):
        a = convert(a, torch.get_default_dtype())
    compute = computation_dtype(a.dtype)
    x = convert(a, compute)
    if a.numel() == 0:
        r = p.log(p.sum(p.exp(x), dims))
        return restore_dims(convert(r, a.dtype), a, dims, keepdim)
    m = p.amax(x, dims)
    m = p.where(p.isinf(m), full(m.shape, 0, compute, a.device), m)
    kept = [i for i in range(a.ndim) if i not in dims]
    m_b = p.broadcast_in_dim(m, list(a.shape), kept) if a.ndim else m
    r = p.add(p.log(p.sum(p.exp(p.sub(x, m_b)), dims)), m)
    return restore_dims(convert(r, a.dtype), a, dims, keepdim)


@register(aten.linalg_vector_norm.default)
def vector_norm(a, ord=2, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, a.ndim)
    if a.dtype.is_complex:    # the norm of the magnitudes, real as eager's
        a = magnitude(convert(a, dtype) if dtype is not None else a)
        dtype = None
    out_dtype = dtype or a.dtype
    compute = computation_dtype(out_dtype)
    x = p.abs(convert(a, compute))
    if ord == math.inf:
        r = p.amax(x, dims)
    elif ord == -math.inf:
        r = p.amin(x, dims)
    elif ord == 0:
        r = p.sum(p.convert_element_type(p.ne(x, full(x.shape, 0, compute, a.device)), compute), dims)
    elif ord == 1:
        r = p.sum(x, dims)
    elif ord == 2:
        r = p.sqrt(p.sum(p.mul(x, x), dims))
    else:
        s = p.sum(p.pow(x, full(x.shape, ord, compute, a.device)), dims)
        r = p.pow(s, full(s.shape, 1.0 / ord, compute, a.device))
    return restore_dims(convert(r, out_dtype), a, dims, keepdim)


@register(aten.norm.ScalarOpt_dim, aten.norm.Scalar, aten.norm.ScalarOpt_dim_dtype, aten.norm.ScalarOpt_dtype)
def norm(a, p_=2, dim=None, keepdim=False, dtype=None):
    return vector_norm(a, 2 if p_ is None else p_, dim, keepdim, dtype=dtype)


@register(aten.dist.default)
def dist(a, b, p_=2):
    from kiln.prims.decompositions.elementwise import sub
    return vector_norm(sub(a, b), p_)


@register(aten.cumsum.default)
def cumsum(a, dim, *, dtype=None):
    out_dtype = _sum_dtype(a, dtype)
    if a.ndim == 0:
        return convert(p.copy_strided(a, []), out_dtype)
    return convert(p.cumsum(convert(a, computation_dtype(out_dtype)), canonical_dim(dim, a.ndim)), out_dtype)


@register(aten.cumprod.default)
def cumprod(a, dim, *, dtype=None):
    out_dtype = _sum_dtype(a, dtype)
    if a.ndim == 0:
        return convert(p.copy_strided(a, []), out_dtype)
    return convert(p.cumprod(convert(a, computation_dtype(out_dtype)), canonical_dim(dim, a.ndim)), out_dtype)


def _cum_extreme(prim, a, dim):
    if a.ndim == 0:
        return p.copy_strided(a, []), full([], 0, torch.int64, a.device)
    return tuple(prim(a, canonical_dim(dim, a.ndim)))


@register(aten.cummax.default)
def cummax(a, dim):
    return _cum_extreme(p.cummax, a, dim)


@register(aten.cummin.default)
def cummin(a, dim):
    return _cum_extreme(p.cummin, a, dim)


@register(aten.logcumsumexp.default)
def logcumsumexp(a, dim):
    if a.ndim == 0:
        return p.copy_strided(a, [])
    dim = canonical_dim(dim, a.ndim)
    compute = computation_dtype(a.dtype)
    x = convert(a, compute)
    # shift by the running maximum is not a scan prim; the per-slice maximum keeps exp in range
    m = p.amax(x, [dim])
    m = p.where(p.isinf(m), full(m.shape, 0, compute, a.device), m)
    m_b = p.broadcast_in_dim(m, list(a.shape), [i for i in range(a.ndim) if i != dim])
    r = p.add(p.log(p.cumsum(p.exp(p.sub(x, m_b)), dim)), m_b)
    return convert(r, a.dtype)


@register(aten.trace.default)
def trace(a):
    from kiln.prims.decompositions.shapes import diagonal
    return reduce_sum(diagonal(a), None)


def _sorted_along(a, dim):
    values, indices = p.sort(a, dim, False)
    return values, indices


def _pick(t, dim, k):
    """t[..., k, ...] along dim; k an int or an int64 tensor of t's shape without dim."""
    if isinstance(k, int):
        return p.squeeze(p.slice(t, dim, k, k + 1, 1), [dim])
    shape = list(t.shape)
    shape[dim] = 1
    return p.squeeze(p.gather(t, dim, p.broadcast_in_dim(k, shape, [i for i in range(t.ndim) if i != dim])), [dim])


def _median(a, dim, ignore_nan):
    """(values, indices) of the lower median along dim (a has at least one dim)."""
    n = a.shape[dim]
    values, indices = _sorted_along(a, dim)
    if not is_float(a.dtype):
        k = (n - 1) // 2
        return _pick(values, dim, k), _pick(indices, dim, k)
    nan = p.isnan(a)
    kept_shape = [s for i, s in enumerate(a.shape) if i != dim]
    if ignore_nan:
        # NaNs sort last: the median of the c non-NaN values sits at (c - 1) // 2
        count = p.sum(p.convert_element_type(p.bitwise_not(nan), torch.int64), [dim])
        k = p.div(p.maximum(p.sub(count, full(kept_shape, 1, torch.int64, a.device)),
                            full(kept_shape, 0, torch.int64, a.device)), full(kept_shape, 2, torch.int64, a.device))
        return _pick(values, dim, k), _pick(indices, dim, k)
    k = (n - 1) // 2
    has_nan = p.amax(nan, [dim])
    first_nan = p.argmax(nan, dim)
    v = p.where(has_nan, full(kept_shape, math.nan, a.dtype, a.device), _pick(values, dim, k))
    i = p.where(has_nan, first_nan, _pick(indices, dim, k))
    return v, i


@register(aten.median.default)
def median(a):
    return _median(reshape(a, [-1]), 0, False)[0]


@register(aten.nanmedian.default)
def nanmedian(a):
    return _median(reshape(a, [-1]), 0, True)[0]


@register(aten.median.dim)
def median_dim(a, dim, keepdim=False):
    return _median_dim(a, dim, keepdim, False)


@register(aten.nanmedian.dim)
def nanmedian_dim(a, dim, keepdim=False):
    return _median_dim(a, dim, keepdim, True)


def _median_dim(a, dim, keepdim, ignore_nan):
    if a.ndim == 0:
        return p.copy_strided(a, []), full([], 0, torch.int64, a.device)
    dim = canonical_dim(dim, a.ndim)
    v, i = _median(a, dim, ignore_nan)
    return restore_dims(v, a, [dim], keepdim), restore_dims(i, a, [dim], keepdim)


@register(aten.var.dim)
def var_dim(a, dim=None, unbiased=True, keepdim=False):
    return var(a, dim, correction=1 if unbiased else 0, keepdim=keepdim)


@register(aten.std.dim)
def std_dim(a, dim=None, unbiased=True, keepdim=False):
    return std(a, dim, correction=1 if unbiased else 0, keepdim=keepdim)
