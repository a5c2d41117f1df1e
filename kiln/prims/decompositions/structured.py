"""Decompositions of ATen ops that rearrange or combine whole tensors: cross products, distances,
channel/pixel shuffles, unfold's backward, chunked concatenation, masked indexing, frexp, isin.
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import (Promotion, broadcast_shapes, broadcast_to, canonical_dim, computation_dtype,
                                            contiguous, convert, elementwise, full, reshape, result_dtype,
                                            scalar_tensor)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


@register(aten.linalg_cross.default)
def linalg_cross(a, b, dim=-1):
    shape = broadcast_shapes(a.shape, b.shape)
    dtype = result_dtype(a, b)
    a, b = broadcast_to(convert(a, dtype), shape), broadcast_to(convert(b, dtype), shape)
    dim = canonical_dim(dim, len(shape))

    def comp(t, i):
        return p.slice(t, dim, i, i + 1, 1)
    parts = [p.sub(p.mul(comp(a, (i + 1) % 3), comp(b, (i + 2) % 3)), p.mul(comp(a, (i + 2) % 3), comp(b, (i + 1) % 3)))
             for i in range(3)]
    return p.cat(parts, dim)


def _pairwise_diff(x1, x2):
    """(..., P, R, M) differences x1[..., i, :] - x2[..., j, :]."""
    batch = broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    P, R, M = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    nb = len(batch)
    a = p.broadcast_in_dim(broadcast_to(x1, batch + [P, M]), batch + [P, R, M], list(range(nb)) + [nb, nb + 2])
    b = p.broadcast_in_dim(broadcast_to(x2, batch + [R, M]), batch + [P, R, M], list(range(nb)) + [nb + 1, nb + 2])
    return p.sub(a, b)


@register(aten._cdist_forward.default)
def cdist_forward(x1, x2, p_, compute_mode=None):
    compute = computation_dtype(x1.dtype)
    d = p.abs(_pairwise_diff(convert(x1, compute), convert(x2, compute)))
    last = d.ndim - 1
    if p_ == 0:
        r = p.sum(p.convert_element_type(p.ne(d, full(d.shape, 0, compute, d.device)), compute), [last])
    elif p_ == math.inf:
        r = p.amax(d, [last]) if d.shape[last] else full(d.shape[:-1], 0, compute, d.device)
    elif p_ == 1:
        r = p.sum(d, [last])
    elif p_ == 2:
        r = p.sqrt(p.sum(p.mul(d, d), [last]))
    else:
        s = p.sum(p.pow(d, full(d.shape, p_, compute, d.device)), [last])
        r = p.pow(s, full(s.shape, 1.0 / p_, compute, d.device))
    return convert(r, x1.dtype)


@register(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p_, cdist):
    compute = computation_dtype(x1.dtype)
    diff = _pairwise_diff(convert(x1, compute), convert(x2, compute))
    shape = list(diff.shape)
    nb = diff.ndim - 3
    keep = list(range(nb + 2))
    dist = p.broadcast_in_dim(convert(cdist, compute), shape, keep)
    g = p.broadcast_in_dim(convert(grad, compute), shape, keep)
    zero = full(shape, 0, compute, diff.device)
    sign = p.sub(p.convert_element_type(p.gt(diff, zero), compute), p.convert_element_type(p.lt(diff, zero), compute))
    if p_ == 0:
        term = zero
    elif p_ == 1:
        term = sign
    elif p_ == math.inf:
        term = p.mul(sign, p.convert_element_type(p.eq(p.abs(diff), dist), compute))
    elif p_ == 2:
        term = p.where(p.eq(dist, zero), zero, p.div(diff, dist))
    else:
        num = p.mul(diff, p.pow(p.abs(diff), full(shape, p_ - 2, compute, diff.device)))
        term = p.where(p.eq(dist, zero), zero, p.div(num, p.pow(dist, full(shape, p_ - 1, compute, diff.device))))
    r = p.sum(p.mul(g, term), [nb + 1])
    return convert(r, x1.dtype)


@register(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(x, groups):
    n, c = x.shape[0], x.shape[1]
    rest = list(x.shape[2:])
    y = reshape(x, [n, groups, c // groups] + rest)
    y = p.permute(y, [0, 2, 1] + list(range(3, y.ndim)))
    return reshape(contiguous(y), list(x.shape))


@register(aten.pixel_shuffle.default)
def pixel_shuffle(x, r):
    lead = list(x.shape[:-3])
    c, h, w = x.shape[-3:]
    nl = len(lead)
    y = reshape(x, lead + [c // (r * r), r, r, h, w])
    y = p.permute(y, list(range(nl)) + [nl, nl + 3, nl + 1, nl + 4, nl + 2])
    return reshape(contiguous(y), lead + [c // (r * r), h * r, w * r])


@register(aten.pixel_unshuffle.default)
def pixel_unshuffle(x, r):
    lead = list(x.shape[:-3])
    c, h, w = x.shape[-3:]
    nl = len(lead)
    y = reshape(x, lead + [c, h // r, r, w // r, r])
    y = p.permute(y, list(range(nl)) + [nl, nl + 2, nl + 4, nl + 1, nl + 3])
    return reshape(contiguous(y), lead + [c * r * r, h // r, w // r])


@register(aten.unfold_backward.default)
def unfold_backward(grad, input_sizes, dim, size, step):
    ndim = len(input_sizes)
    dim = canonical_dim(dim, ndim)
    if ndim == 0:
        return reshape(grad, [])
    count = grad.shape[dim]
    # (..., count, ..., size) -> (count, size, ...rest) -> (count * size, ...rest)
    order = [dim, grad.ndim - 1] + [i for i in range(grad.ndim - 1) if i != dim]
    g = reshape(contiguous(p.permute(grad, order)), [count * size] + [s for i, s in enumerate(input_sizes)
                                                                       if i != dim])
    windows = p.broadcast_in_dim(p.iota(count, start=0, step=step, dtype=torch.int64, device=grad.device),
                                 [count, size], [0])
    offsets = p.broadcast_in_dim(p.iota(size, start=0, step=1, dtype=torch.int64, device=grad.device),
                                 [count, size], [1])
    idx = reshape(p.add(windows, offsets), [-1])
    compute = computation_dtype(grad.dtype)
    base = full([input_sizes[dim]] + [s for i, s in enumerate(input_sizes) if i != dim], 0, compute, grad.device)
    acc = p.index_put(base, [idx], convert(g, compute), True)
    inverse = list(range(1, dim + 1)) + [0] + list(range(dim + 1, ndim))
    return convert(contiguous(p.permute(acc, inverse)), grad.dtype)


@register(aten._chunk_cat.default)
def chunk_cat(tensors, dim, num_chunks):
    dim = canonical_dim(dim, tensors[0].ndim)
    dtype = result_dtype(*tensors)
    pieces = []
    for t in tensors:
        size = t.shape[dim]
        per = -(-size // num_chunks)
        low = [0] * t.ndim
        high = [0] * t.ndim
        high[dim] = per * num_chunks - size
        padded = p.pad(convert(t, dtype), 0, low, high, [0] * t.ndim) if high[dim] else convert(t, dtype)
        lead = list(t.shape[:dim])
        pieces.append(reshape(contiguous(padded), lead + [num_chunks, -1]))
    return p.cat(pieces, dim + 1) if len(pieces) > 1 else contiguous(pieces[0])


def _clamped_indices(x, indices):
    """Indices forced into range: masked-out positions may hold anything, and are never read."""
    out = []
    for d, i in enumerate(indices):
        if i is None:
            out.append(None)
            continue
        size = x.shape[d]
        out.append(p.minimum(p.maximum(i, full(i.shape, -size, i.dtype, i.device)),
                             full(i.shape, max(size - 1, 0), i.dtype, i.device)))
    return out


@register(aten._unsafe_masked_index.default)
def unsafe_masked_index(x, mask, indices, fill):
    from kiln.prims.decompositions.indexing import index
    picked = index(x, _clamped_indices(x, indices))
    return p.where(broadcast_to(mask, picked.shape), picked, full(picked.shape, fill, x.dtype, x.device))


@register(aten._unsafe_masked_index_put_accumulate.default)
def unsafe_masked_index_put_accumulate(x, mask, indices, values):
    from kiln.prims.decompositions.indexing import index_put
    shape = broadcast_shapes(values.shape, mask.shape)
    v = broadcast_to(convert(values, x.dtype), shape)
    v = p.where(broadcast_to(mask, shape), v, full(shape, 0, x.dtype, x.device))
    return index_put(x, _clamped_indices(x, indices), v, True)


@register(aten.frexp.Tensor)
def frexp(a):
    compute = torch.float64 if a.dtype == torch.float64 else torch.float32
    x = convert(a, compute)
    zero = full(x.shape, 0, compute, x.device)
    special = p.bitwise_or(p.bitwise_or(p.eq(x, zero), p.isnan(x)), p.isinf(x))
    safe = p.where(special, full(x.shape, 1, compute, x.device), p.abs(x))
    e = p.add(p.floor(p.log2(safe)), full(x.shape, 1, compute, x.device))
    m = p.div(x, p.exp2(e))
    # log2 can round across a power of two: renormalize the mantissa into [0.5, 1)
    big = p.ge(p.abs(m), full(x.shape, 1, compute, x.device))
    m = p.where(big, p.div(m, full(x.shape, 2, compute, x.device)), m)
    e = p.where(big, p.add(e, full(x.shape, 1, compute, x.device)), e)
    small = p.lt(p.abs(m), full(x.shape, 0.5, compute, x.device))
    m = p.where(small, p.mul(m, full(x.shape, 2, compute, x.device)), m)
    e = p.where(small, p.sub(e, full(x.shape, 1, compute, x.device)), e)
    m = p.where(special, x, m)
    e = p.where(special, zero, e)
    return convert(m, a.dtype), p.convert_element_type(e, torch.int32)


@register(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test, *, assume_unique=False, invert=False):
    e = elements if isinstance(elements, torch.Tensor) else full([], elements, test.dtype, test.device)
    t = test if isinstance(test, torch.Tensor) else full([], test, e.dtype, e.device)
    dtype = result_dtype(e, t)
    flat = reshape(convert(t, dtype), [-1])
    n = flat.shape[0]
    shape = list(e.shape) + [n]
    eq = p.eq(p.broadcast_in_dim(convert(e, dtype), shape, list(range(e.ndim))),
              p.broadcast_in_dim(flat, shape, [e.ndim]))
    found = p.amax(eq, [e.ndim]) if n else full(list(e.shape), False, torch.bool, e.device)
    return p.bitwise_not(found) if invert else found


@register(aten.renorm.default)
def renorm(a, p_, dim, maxnorm):
    from kiln.prims.decompositions.reductions import vector_norm
    dim = canonical_dim(dim, a.ndim)
    others = [i for i in range(a.ndim) if i != dim]
    compute = computation_dtype(a.dtype)
    norms = vector_norm(convert(a, compute), p_, others, True)
    factor = p.where(p.gt(norms, full(norms.shape, maxnorm, compute, a.device)),
                     p.div(full(norms.shape, maxnorm, compute, a.device),
                           p.add(norms, full(norms.shape, 1e-7, compute, a.device))),
                     full(norms.shape, 1, compute, a.device))
    return convert(p.mul(convert(a, compute), broadcast_to(factor, a.shape)), a.dtype)


@register(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def conj(a):
    return p.conj(a)


@register(aten.complex.default)
def complex_(real, imag):
    dtype = result_dtype(real, imag)
    shape = broadcast_shapes(real.shape, imag.shape)
    parts = [p.broadcast_in_dim(broadcast_to(convert(t, dtype), shape), shape + [1], list(range(len(shape))))
             for t in (real, imag)]
    return p.view_as_complex(p.cat(parts, len(shape)))


@register(aten.polar.default)
def polar(magnitude, angle):
    shape = broadcast_shapes(magnitude.shape, angle.shape)     # a 0-d angle with a vector magnitude
    magnitude, angle = broadcast_to(magnitude, shape), broadcast_to(angle, shape)
    return complex_(p.mul(magnitude, p.cos(angle)), p.mul(magnitude, p.sin(angle)))


@register(aten.bucketize.Tensor)
def bucketize(a, boundaries, *, out_int32=False, right=False):
    return p.searchsorted_Tensor(boundaries, a, out_int32=out_int32, right=right)


def _tri_index_pairs(row, col, offset, lower, device):
    """(rows, cols) of the lower (upper) triangle, row-major, as int64 tensors built from iotas."""
    rows, cols = [], []
    for r in range(row):
        lo, hi = (0, min(col, max(r + offset + 1, 0))) if lower else (min(max(r + offset, 0), col), col)
        if hi > lo:
            rows.append(p.full([hi - lo], r, dtype=torch.int64, device=device))
            cols.append(p.iota(hi - lo, start=lo, step=1, dtype=torch.int64, device=device))
    if not rows:
        return p.full([0], 0, dtype=torch.int64, device=device), p.full([0], 0, dtype=torch.int64, device=device)
    return (p.cat(rows, 0) if len(rows) > 1 else rows[0]), (p.cat(cols, 0) if len(cols) > 1 else cols[0])


def _tri_indices(row, col, offset, dtype, device, lower):
    device = torch.device("cpu") if device is None else torch.device(device)
    r, c = _tri_index_pairs(row, col, offset, lower, device)
    shape = [1, r.shape[0]]
    out = p.cat([p.view(r, shape), p.view(c, shape)], 0)
    return convert(out, dtype or torch.int64)


@register(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, dtype, device, True)


@register(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, dtype, device, False)


@register(aten._pdist_forward.default)
def pdist_forward(a, p_=2):
    n = a.shape[0]
    d = cdist_forward(p.view(a, [1, *a.shape]), p.view(a, [1, *a.shape]), p_)
    r, c = _tri_index_pairs(n, n, 1, False, a.device)
    return p.index(p.view(d, [n, n]), [r, c])


@register(aten._pdist_backward.default)
def pdist_backward(grad, a, p_, pdist):
    # pdist is cdist(a, a) read at the pairs i < j; spreading the gradient symmetrically over the
    # full matrix turns it into cdist's gradient with respect to its first operand.
    n = a.shape[0]
    r, c = _tri_index_pairs(n, n, 1, False, a.device)
    zeros = full([n, n], 0, grad.dtype, grad.device)
    upper = p.index_put(zeros, [r, c], grad, False)
    sym = p.add(upper, p.permute(upper, [1, 0]))
    full_dist = cdist_forward(p.view(a, [1, *a.shape]), p.view(a, [1, *a.shape]), p_)
    g = cdist_backward(p.view(sym, [1, n, n]), p.view(a, [1, *a.shape]), p.view(a, [1, *a.shape]), p_, full_dist)
    return p.view(g, list(a.shape))
