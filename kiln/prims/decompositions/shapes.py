"""Decompositions of ATen's view, movement and creation ops.

Every view becomes one of the six view prims (mostly `as_strided`-free: `permute`, `slice`,
`squeeze`, `broadcast_in_dim`, `view`), so a code generator sees index arithmetic it can fuse.
Scatter-style inverses of views (`slice_scatter`, `select_scatter`, ...) become `pad` + `where`,
which fuse as pointwise ops instead of writing into a copy.
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import (broadcast_to, canonical_dim, canonical_dims, clone, contiguous,
                                            contiguous_strides, convert, full, infer_size, reshape, result_dtype,
                                            to_device)
from kiln.prims.decompositions.table import DECOMPOSITIONS, register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


def _default(x, fallback):
    return fallback if x is None else x


def fresh_view(fn):
    """ATen view ops must return a new tensor object even when nothing changes (autograd's rule)."""
    def decomposition(a, *args, **kwargs):
        out = fn(a, *args, **kwargs)
        return p.view(a, list(a.shape)) if out is a else out
    decomposition.__name__ = fn.__name__
    return decomposition


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
@fresh_view
def view(a, shape):
    return reshape(a, shape)


@register(aten.expand.default)
@fresh_view
def expand(a, shape, *, implicit=False):
    shape = list(shape)
    offset = len(shape) - a.ndim
    shape = [a.shape[i - offset] if isinstance(s, int) and s == -1 else s for i, s in enumerate(shape)]
    return broadcast_to(a, shape)


@register(aten.permute.default)
def permute(a, dims):
    return p.permute(a, [canonical_dim(d, a.ndim) for d in dims])


@register(aten.transpose.int)
def transpose(a, dim0, dim1):
    if a.ndim == 0:
        return p.view(a, [])
    dims = list(range(a.ndim))
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return p.permute(a, dims)


@register(aten.t.default)
def t(a):
    return transpose(a, 0, 1) if a.ndim == 2 else p.view(a, list(a.shape))


@register(aten.squeeze.default)
def squeeze(a):
    return p.squeeze(a, [i for i, s in enumerate(a.shape) if s == 1])


@register(aten.squeeze.dim, aten.squeeze.dims)
def squeeze_dims(a, dims):
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = sorted({canonical_dim(d, a.ndim) for d in dims}) if a.ndim else []
    return p.squeeze(a, [d for d in dims if a.shape[d] == 1])


@register(aten.unsqueeze.default)
def unsqueeze(a, dim):
    dim = canonical_dim(dim, a.ndim + 1)
    shape = list(a.shape)
    shape.insert(dim, 1)
    return p.broadcast_in_dim(a, shape, [i for i in range(a.ndim + 1) if i != dim])


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


@register(aten.slice.Tensor)
def slice_(a, dim=0, start=None, end=None, step=1):
    dim = canonical_dim(dim, a.ndim)
    return p.slice(a, dim, *_slice_bounds(a.shape[dim], start, end, step))


@register(aten.select.int)
def select(a, dim, index):
    dim = canonical_dim(dim, a.ndim)
    if index < 0:
        index += a.shape[dim]
    return p.squeeze(p.slice(a, dim, index, index + 1, 1), [dim])


@register(aten.narrow.default)
def narrow(a, dim, start, length):
    dim = canonical_dim(dim, a.ndim)
    start = start + a.shape[dim] if start < 0 else start
    return p.slice(a, dim, start, start + length, 1)


@register(aten.as_strided.default)
def as_strided(a, size, stride, storage_offset=None):
    return p.as_strided(a, list(size), list(stride), a.storage_offset() if storage_offset is None else storage_offset)


@register(aten.diagonal.default)
def diagonal(a, offset=0, dim1=0, dim2=1):
    d1, d2 = canonical_dim(dim1, a.ndim), canonical_dim(dim2, a.ndim)
    length = max(min(a.shape[d1], a.shape[d2] - offset) if offset >= 0 else
                 min(a.shape[d1] + offset, a.shape[d2]), 0)
    start = a.storage_offset()
    if length > 0:
        start += offset * a.stride(d2) if offset >= 0 else -offset * a.stride(d1)
    sizes = [s for i, s in enumerate(a.shape) if i not in (d1, d2)] + [length]
    strides = [s for i, s in enumerate(a.stride()) if i not in (d1, d2)] + [a.stride(d1) + a.stride(d2)]
    return p.as_strided(a, sizes, strides, start)


@register(aten.unfold.default)
def unfold(a, dim, size, step):
    dim = canonical_dim(dim, a.ndim) if a.ndim else 0
    if a.ndim == 0:
        return p.view(a, [1])
    count = (a.shape[dim] - size) // step + 1
    sizes = list(a.shape)
    sizes[dim] = count
    strides = list(a.stride())
    strides[dim] = step * a.stride(dim)
    return p.as_strided(a, sizes + [size], strides + [a.stride(dim)], a.storage_offset())


@register(aten.alias.default, aten.lift_fresh.default, aten.detach.default)
def alias(a):
    return p.view(a, list(a.shape))


@register(aten.split.Tensor, aten.unsafe_split.Tensor)
def split(a, split_size, dim=0):
    dim = canonical_dim(dim, a.ndim)
    size = a.shape[dim]
    if split_size == 0:
        return [p.slice(a, dim, 0, 0, 1)] if size == 0 else []
    sizes = [min(split_size, size - i) for i in range(0, size, split_size)] or [0]
    return split_with_sizes(a, sizes, dim)


@register(aten.split_with_sizes.default, aten.unsafe_split_with_sizes.default)
def split_with_sizes(a, sizes, dim=0):
    dim = canonical_dim(dim, a.ndim)
    out, start = [], 0
    for s in sizes:
        out.append(p.slice(a, dim, start, start + s, 1))
        start += s
    return out


@register(aten.unbind.int)
def unbind(a, dim=0):
    dim = canonical_dim(dim, a.ndim)
    return [select(a, dim, i) for i in range(a.shape[dim])]


@register(aten.chunk.default)
def chunk(a, chunks, dim=0):
    dim = canonical_dim(dim, a.ndim)
    return split(a, math.ceil(a.shape[dim] / chunks), dim)


# Copy variants: the view, then a fresh contiguous tensor.
def _copy_variant(view_fn):
    def fn(*args, **kwargs):
        return contiguous_copy(view_fn(*args, **kwargs))
    fn.__name__ = f"{view_fn.__name__}_copy"
    return fn


def contiguous_copy(x):
    if isinstance(x, (list, tuple)):
        return [contiguous_copy(t) for t in x]
    return p.copy_strided(x, contiguous_strides(x.shape))


for _name in ("view", "expand", "permute", "t", "transpose", "squeeze", "unsqueeze", "slice", "select",
              "diagonal", "as_strided", "unfold", "alias", "split_with_sizes", "unbind", "split", "detach"):
    _copy_packet = getattr(aten, f"{_name}_copy", None)
    if _copy_packet is None:
        continue
    for _overload in _copy_packet.overloads():
        _base = getattr(getattr(aten, _name), _overload, None)
        if _base is not None and _base in DECOMPOSITIONS and _overload != "out":
            register(getattr(_copy_packet, _overload))(_copy_variant(DECOMPOSITIONS[_base]))


@register(aten.narrow_copy.default)
def narrow_copy(a, dim, start, length):
    return contiguous_copy(narrow(a, dim, start, length))


@register(aten.clone.default)
def clone_(a, *, memory_format=None):
    return clone(a, memory_format)


@register(aten.contiguous.default)
def contiguous_(a, memory_format=torch.contiguous_format):
    return contiguous(a)


@register(aten._to_copy.default)
def to_copy(a, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    out = a
    if device is not None and torch.device(device) != a.device:
        out = p.device_put(out, torch.device(device))
    if dtype is not None and dtype != a.dtype:
        return clone(p.convert_element_type(out, dtype), memory_format) if memory_format not in (
            None, torch.preserve_format) else p.convert_element_type(out, dtype)
    return clone(out, memory_format) if out is a else out


@register(aten.copy.default)
def copy(dst, src, non_blocking=False):
    value = broadcast_to(convert(to_device(src, dst.device), dst.dtype), dst.shape)
    return p.copy_strided(value, list(dst.stride()))


@register(aten.cat.default)
def cat(tensors, dim=0):
    # Legacy rule: 1-d empty tensors are skipped whatever the other operands' rank.
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    dtype = result_dtype(*tensors)
    dim = canonical_dim(dim, tensors[0].ndim)
    tensors = [convert(t, dtype) for t in tensors]
    if len(tensors) == 1:
        return clone(tensors[0])
    return p.cat(tensors, dim)


@register(aten.stack.default)
def stack(tensors, dim=0):
    dim = canonical_dim(dim, tensors[0].ndim + 1)
    return cat([unsqueeze(t, dim) for t in tensors], dim)


@register(aten.flip.default)
def flip(a, dims):
    return p.flip(a, canonical_dims(dims, a.ndim) if dims else [])


@register(aten.roll.default)
def roll(a, shifts, dims=()):
    if not dims:
        return view(roll(reshape(a, [-1]), shifts, [0]), list(a.shape))
    out = a
    for shift, dim in zip(shifts, dims):
        dim = canonical_dim(dim, a.ndim)
        size = a.shape[dim]
        if size == 0:
            continue
        shift %= size
        if shift:
            out = p.cat([p.slice(out, dim, size - shift, size, 1), p.slice(out, dim, 0, size - shift, 1)], dim)
    return out if out is not a else clone(a)


@register(aten.rot90.default)
def rot90(a, k=1, dims=(0, 1)):
    k %= 4
    d0, d1 = dims
    if k == 1:
        return transpose(flip(a, [d1]), d0, d1)
    if k == 2:
        return flip(a, [d0, d1])
    if k == 3:
        return flip(transpose(a, d0, d1), [d1])
    return clone(a)


@register(aten.repeat.default)
def repeat(a, repeats):
    repeats = list(repeats)
    lead = len(repeats) - a.ndim
    src_shape = [1] * lead + list(a.shape)
    x = reshape(a, src_shape)
    expanded = []
    dims = []
    for i, (r, s) in enumerate(zip(repeats, src_shape)):
        expanded += [r, s]
        dims.append(2 * i + 1)
    x = p.broadcast_in_dim(x, expanded, dims)
    return reshape(contiguous(x), [r * s for r, s in zip(repeats, src_shape)])


@register(aten.constant_pad_nd.default)
def constant_pad_nd(a, pad, value=0):
    low, high = [0] * a.ndim, [0] * a.ndim
    for i in range(len(pad) // 2):
        d = a.ndim - 1 - i
        low[d], high[d] = pad[2 * i], pad[2 * i + 1]
    out = a
    for d in range(a.ndim):  # negative padding crops
        if low[d] < 0 or high[d] < 0:
            start, end = max(-low[d], 0), out.shape[d] - max(-high[d], 0)
            out = p.slice(out, d, start, max(end, start), 1)
    return p.pad(out, value, [max(x, 0) for x in low], [max(x, 0) for x in high], [0] * a.ndim)


def _tri_mask(a, diagonal, upper):
    rows, cols = a.shape[-2], a.shape[-1]
    r = p.broadcast_in_dim(p.iota(rows, start=0, step=1, dtype=torch.int64, device=a.device), [rows, cols], [0])
    c = p.broadcast_in_dim(p.iota(cols, start=0, step=1, dtype=torch.int64, device=a.device), [rows, cols], [1])
    diff = p.sub(c, r)
    bound = p.full([rows, cols], diagonal, dtype=torch.int64, device=a.device)
    mask = p.ge(diff, bound) if upper else p.le(diff, bound)
    return broadcast_to(mask, a.shape)


@register(aten.tril.default)
def tril(a, diagonal=0):
    return p.where(_tri_mask(a, diagonal, False), a, full(a.shape, 0, a.dtype, a.device))


@register(aten.triu.default)
def triu(a, diagonal=0):
    return p.where(_tri_mask(a, diagonal, True), a, full(a.shape, 0, a.dtype, a.device))


def _scatter_into(base, src, dim, start, step):
    """`base` with `src` placed at positions start, start+step, ... of `dim`: pad, then select."""
    size = base.shape[dim]
    count = src.shape[dim]
    low = [0] * base.ndim
    high = [0] * base.ndim
    interior = [0] * base.ndim
    low[dim] = start
    interior[dim] = step - 1
    used = start + (count - 1) * step + 1 if count else start
    high[dim] = size - used
    if count == 0:
        return clone(base)
    src = convert(src, base.dtype)
    padded = p.pad(src, 0, low, high, interior)
    mask_1d = p.pad(p.full([count], True, dtype=torch.bool, device=base.device), False, [start], [size - used],
                    [step - 1])
    mask = p.broadcast_in_dim(mask_1d, list(base.shape), [dim])
    return p.where(mask, padded, base)


@register(aten.slice_scatter.default)
def slice_scatter(base, src, dim=0, start=None, end=None, step=1):
    dim = canonical_dim(dim, base.ndim)
    start, end, step = _slice_bounds(base.shape[dim], start, end, step)
    return _scatter_into(base, src, dim, start, step)


@register(aten.select_scatter.default)
def select_scatter(base, src, dim, index):
    dim = canonical_dim(dim, base.ndim)
    index = index + base.shape[dim] if index < 0 else index
    return _scatter_into(base, unsqueeze(src, dim), dim, index, 1)


@register(aten.slice_backward.default)
def slice_backward(grad, input_sizes, dim, start, end, step):
    base = full(input_sizes, 0, grad.dtype, grad.device)
    return slice_scatter(base, grad, dim, start, end, step)


@register(aten.select_backward.default)
def select_backward(grad, input_sizes, dim, index):
    return select_scatter(full(input_sizes, 0, grad.dtype, grad.device), grad, dim, index)


@register(aten.diagonal_scatter.default)
def diagonal_scatter(base, src, offset=0, dim1=0, dim2=1):
    d1, d2 = canonical_dim(dim1, base.ndim), canonical_dim(dim2, base.ndim)
    rows, cols = base.shape[d1], base.shape[d2]
    r = p.broadcast_in_dim(p.iota(rows, start=0, step=1, dtype=torch.int64, device=base.device), [rows, cols], [0])
    c = p.broadcast_in_dim(p.iota(cols, start=0, step=1, dtype=torch.int64, device=base.device), [rows, cols], [1])
    on_diag = p.eq(p.sub(c, r), p.full([rows, cols], offset, dtype=torch.int64, device=base.device))
    others = [i for i in range(base.ndim) if i not in (d1, d2)]
    mask = p.broadcast_in_dim(on_diag, list(base.shape), [d1, d2] if d1 < d2 else [d2, d1]) if d1 < d2 else \
        p.broadcast_in_dim(p.permute(on_diag, [1, 0]), list(base.shape), [d2, d1])
    # Spread src (batch..., diag) over (rows, cols): index along the row dim (col dim for offset < 0).
    length = src.shape[-1]
    pos = r if offset >= 0 else c
    pos_clamped = p.minimum(pos, p.full([rows, cols], max(length - 1, 0), dtype=torch.int64, device=base.device))
    src = convert(src, base.dtype)
    batch_shape = [base.shape[i] for i in others]
    gather_index = broadcast_to(pos_clamped, batch_shape + [rows, cols])
    src_b = p.broadcast_in_dim(src, batch_shape + [length, cols], list(range(len(batch_shape))) + [len(batch_shape)])
    spread = p.gather(src_b, len(batch_shape), gather_index) if length else full(batch_shape + [rows, cols], 0,
                                                                                   base.dtype, base.device)
    # spread is (others..., rows, cols); move to base's dim order
    order = others + [d1, d2]
    inverse = [order.index(i) for i in range(base.ndim)]
    spread = p.permute(spread, inverse)
    return p.where(mask, spread, base)


@register(aten.diagonal_backward.default)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(full(input_sizes, 0, grad.dtype, grad.device), grad, offset, dim1, dim2)


@register(aten.as_strided_scatter.default)
def as_strided_scatter(base, src, size, stride, storage_offset=None):
    # Scatter through a flat index: every element of the strided view names one element of base.
    offset = 0 if storage_offset is None else storage_offset
    flat_index = full(list(size), offset, torch.int64, base.device)
    for d, (s, st) in enumerate(zip(size, stride)):
        ramp = p.iota(s, start=0, step=st, dtype=torch.int64, device=base.device)
        flat_index = p.add(flat_index, p.broadcast_in_dim(ramp, list(size), [d]))
    flat = reshape(contiguous(base), [-1])
    values = reshape(contiguous(convert(src, base.dtype)), [-1])
    out = p.index_put(flat, [reshape(flat_index, [-1])], values, False)
    return p.view(out, list(base.shape))


@register(aten.diag_embed.default)
def diag_embed(a, offset=0, dim1=-2, dim2=-1):
    n = a.shape[-1] + abs(offset)
    ndim = a.ndim + 1
    d1, d2 = canonical_dim(dim1, ndim), canonical_dim(dim2, ndim)
    if d1 > d2:
        d1, d2, offset = d2, d1, -offset
    # out[..., i, j] = a[..., min(i, j)] where j - i == offset: broadcast a along the other dim
    batch = [i for i in range(ndim) if i not in (d1, d2)]
    shape = [0] * ndim
    for pos, i in enumerate(batch):
        shape[i] = a.shape[pos]
    shape[d1] = shape[d2] = n
    r = p.broadcast_in_dim(p.iota(n, start=0, step=1, dtype=torch.int64, device=a.device), [n, n], [0])
    c = p.broadcast_in_dim(p.iota(n, start=0, step=1, dtype=torch.int64, device=a.device), [n, n], [1])
    on_diag = p.eq(p.sub(c, r), p.full([n, n], offset, dtype=torch.int64, device=a.device))
    mask = p.broadcast_in_dim(on_diag, shape, [d1, d2])
    # the diagonal element k lives at row k (offset >= 0) or column k (offset < 0)
    along = d1 if offset >= 0 else d2
    other = d2 if offset >= 0 else d1
    src = p.pad(a, 0, [0] * a.ndim, [0] * (a.ndim - 1) + [abs(offset)], [0] * a.ndim) if offset else a
    # src's dims (batch..., diagonal) land at batch + [along]: permuted into that order first, as
    # broadcast_in_dim places input dims in increasing output positions
    targets = batch + [along]
    order = sorted(range(len(targets)), key=lambda k: targets[k])
    if order != list(range(len(targets))):
        src = p.permute(src, order)
    values = p.broadcast_in_dim(src, shape, sorted(targets))
    return p.where(mask, values, full(shape, 0, a.dtype, a.device))


@register(aten.block_diag.default)
def block_diag(tensors):
    mats = [t if t.ndim == 2 else reshape(t, [1, -1]) if t.ndim == 1 else reshape(t, [1, 1]) for t in tensors]
    dtype = result_dtype(*mats)
    cols = sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        right = cols - left - m.shape[1]
        rows.append(p.pad(convert(m, dtype), 0, [0, left], [0, right], [0, 0]))
        left += m.shape[1]
    return p.cat(rows, 0) if len(rows) > 1 else rows[0]
