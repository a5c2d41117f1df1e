"""Decompositions of ATen's indexing ops onto gather/scatter/index/index_put and `where`.

Advanced indexing (`index.Tensor`, `index_put`) is normalized here so the prims stay simple: the
indexed dims move to the front, `None` entries are filled by iota ranges, bool masks would need
data-dependent sizes (nonzero, an extern), and all index tensors broadcast to one shape. Eager
puts the indexed block first when the indexed dims are not adjacent, and in place otherwise.
"""
from __future__ import annotations

import torch

from kiln.prims.decompositions.refs import (broadcast_shapes, broadcast_to, canonical_dim, contiguous, convert, full,
                                            reshape, scalar_tensor, to_device)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p
from kiln.symbolic.decide import guard_or_false, guard_or_true, known_true

aten = torch.ops.aten


def _wrap_negative(index, size):
    index = convert(index, torch.int64)
    zero = full(index.shape, 0, torch.int64, index.device)
    return p.where(p.lt(index, zero), p.add(index, full(index.shape, size, torch.int64, index.device)), index)


def _expand_bool_indices(indices):
    out = []
    for idx in indices:
        if idx is not None and idx.dtype in (torch.bool, torch.uint8):
            nz = p.nonzero(idx)
            for k in range(idx.ndim):
                out.append(p.squeeze(p.slice(nz, 1, k, k + 1, 1), [1]))
        else:
            out.append(idx)
    return out


def _normalize(a, indices, wrap=True):
    """(a with indexed dims first, broadcast int64 indices, where the indexed block goes).
    `wrap`: negative indices count from the end (advanced indexing); else they are left for the
    kernels' bounds checks to refuse, as embedding's, index_select's and index_copy's are by eager
    (the index prims take indices in [0, size): [Note: index bounds checks] in codegen)."""
    indices = _expand_bool_indices(list(indices))
    indices += [None] * (a.ndim - len(indices))
    positions = [i for i, idx in enumerate(indices) if idx is not None]
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    order = positions + [i for i in range(a.ndim) if i not in positions]
    moved = p.permute(a, order) if order != list(range(a.ndim)) else a
    shape = broadcast_shapes(*(indices[i].shape for i in positions))
    idx = [to_device(indices[i], a.device) for i in positions]
    idx = [broadcast_to(_wrap_negative(i, a.shape[d]) if wrap else convert(i, torch.int64), shape)
           for i, d in zip(idx, positions)]
    block_at = positions[0] if adjacent else 0
    return moved, idx, shape, block_at, positions


@register(aten.index.Tensor)
def index(a, indices, wrap=True):
    moved, idx, shape, block_at, positions = _normalize(a, indices, wrap)
    out = p.index(moved, idx)
    if block_at == 0:
        return out
    # move the indexed block (len(shape) dims at the front) to where the first indexed dim was
    k, rest = len(shape), out.ndim - len(shape)
    order = list(range(k, k + block_at)) + list(range(k)) + list(range(k + block_at, k + rest))
    return p.permute(out, order)


@register(aten._unsafe_index.Tensor)
def unsafe_index(a, indices):
    return index(a, indices)


@register(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(a, indices, values, accumulate=False, wrap=True):
    moved, idx, shape, block_at, positions = _normalize(a, indices, wrap)
    rest = [moved.shape[i] for i in range(len(positions), moved.ndim)]
    target = list(shape) + rest
    values = convert(to_device(values, a.device), a.dtype)
    if block_at:
        # values are laid out with the block in place; broadcast there, then move the block first
        k = len(shape)
        inplace = rest[:block_at] + list(shape) + rest[block_at:]
        values = broadcast_to(values, inplace)
        order = list(range(block_at, block_at + k)) + list(range(block_at)) + list(range(block_at + k, len(inplace)))
        values = p.permute(values, order)
    values = contiguous(broadcast_to(values, target))
    out = p.index_put(contiguous(moved), idx, values, accumulate)
    order = positions + [i for i in range(a.ndim) if i not in positions]
    inverse = [order.index(i) for i in range(a.ndim)]
    return p.permute(out, inverse) if inverse != list(range(a.ndim)) else out


@register(aten.gather.default)
def gather(a, dim, index, *, sparse_grad=False):
    if a.ndim == 0:
        return p.view(a, [1] * index.ndim) if index.ndim else p.copy_strided(a, [])
    return p.gather(a, canonical_dim(dim, a.ndim), convert(index, torch.int64))


@register(aten.take_along_dim.default)
def take_along_dim(a, indices, dim=None):
    if dim is None:
        return gather(reshape(a, [-1]), 0, reshape(indices, [-1]))
    dim = canonical_dim(dim, a.ndim)
    shape = broadcast_shapes([s for i, s in enumerate(a.shape) if i != dim], [s for i, s in enumerate(indices.shape)
                                                                             if i != dim])
    a_shape, i_shape = list(shape), list(shape)
    a_shape.insert(dim, a.shape[dim])
    i_shape.insert(dim, indices.shape[dim])
    return p.gather(broadcast_to(a, a_shape), dim, broadcast_to(_wrap_negative(indices, a.shape[dim]), i_shape))


def _scatter_src(a, index, src):
    if isinstance(src, torch.Tensor):
        src = convert(src, a.dtype)
        if list(src.shape) != list(index.shape):
            src = contiguous(p.as_strided(src, list(index.shape), list(src.stride()), src.storage_offset()))
        return src
    return full(index.shape, src, a.dtype, a.device)


@register(aten.scatter.src, aten.scatter.value)
def scatter(a, dim, index, src):
    if a.ndim == 0 or index.numel() == 0:
        return p.copy_strided(a, list(a.stride())) if index.numel() == 0 else p.view(
            _scatter_src(a, index, src), [])
    return p.scatter(a, canonical_dim(dim, a.ndim), index, _scatter_src(a, index, src))


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_legacy_reduce(a, dim, index, src, *, reduce):
    mode = {"add": "sum", "multiply": "prod"}[reduce]
    return p.scatter_reduce(a, canonical_dim(dim, a.ndim), index, _scatter_src(a, index, src), mode, True)


@register(aten.scatter_add.default)
def scatter_add(a, dim, index, src):
    if index.numel() == 0:
        return p.copy_strided(a, list(a.stride()))
    return p.scatter_reduce(a, canonical_dim(dim, a.ndim), index, _scatter_src(a, index, src), "sum", True)


@register(aten.scatter_reduce.two)
def scatter_reduce(a, dim, index, src, reduce, *, include_self=True):
    if index.numel() == 0:
        return p.copy_strided(a, list(a.stride()))
    return p.scatter_reduce(a, canonical_dim(dim, a.ndim), index, _scatter_src(a, index, src), reduce, include_self)


@register(aten.index_select.default)
def index_select(a, dim, idx):
    if a.ndim == 0:
        return p.copy_strided(a, [])
    dim = canonical_dim(dim, a.ndim)
    indices = [None] * dim + [reshape(idx, [-1])]
    return index(a, indices, wrap=False)


def _index_dim_values(a, dim, index, source):
    """source laid out with dim first, so index_put over the moved operand accepts it."""
    order = [dim] + [i for i in range(a.ndim) if i != dim]
    return p.permute(convert(source, a.dtype), order) if source.ndim else source


@register(aten.index_add.default)
def index_add(a, dim, index, source, *, alpha=1):
    if a.ndim == 0:
        return p.add(a, p.mul(convert(p.view(source, []), a.dtype), full([], alpha, a.dtype, a.device)))
    dim = canonical_dim(dim, a.ndim)
    if alpha != 1:
        source = p.mul(convert(source, a.dtype), full(source.shape, alpha, a.dtype, a.device))
    return index_put(a, [None] * dim + [reshape(index, [-1])], convert(source, a.dtype), True, wrap=False)


@register(aten.index_copy.default)
def index_copy(a, dim, index, source):
    if a.ndim == 0:
        return p.copy_strided(convert(p.view(source, []), a.dtype), [])
    dim = canonical_dim(dim, a.ndim)
    return index_put(a, [None] * dim + [reshape(index, [-1])], convert(source, a.dtype), False, wrap=False)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(a, dim, index, value):
    if a.ndim == 0:
        v = as_tensor_value(value, a)
        v = convert(p.view(v, []), a.dtype) if isinstance(v, torch.Tensor) else full([], v, a.dtype, a.device)
        return p.copy_strided(v, [])
    dim = canonical_dim(dim, a.ndim)
    flat = reshape(index, [-1])
    shape = list(a.shape)
    shape[dim] = flat.shape[0]
    v = as_tensor_value(value, a)
    values = broadcast_to(convert(v, a.dtype), shape) if isinstance(v, torch.Tensor) else full(shape, v, a.dtype,
                                                                                               a.device)
    return index_put(a, [None] * dim + [flat], values, False)


def as_tensor_value(value, like):
    return to_device(value, like.device) if isinstance(value, torch.Tensor) else value


@register(aten.index_reduce.default)
def index_reduce(a, dim, index, source, reduce, *, include_self=True):
    if a.ndim == 0:
        out = index_reduce(p.view(a, [1]), 0, reshape(index, [1]), reshape(source, [1]), reduce,
                           include_self=include_self)
        return p.view(out, [])
    dim = canonical_dim(dim, a.ndim)
    shape = [1] * a.ndim
    shape[dim] = index.shape[0] if index.ndim else 1
    # ATen's scatter_reduce (an extern) raises RuntimeError for an index outside the dim, where
    # eager's index_reduce raises IndexError: the index is read through a checked gather of the
    # positions first, which raises eager's error and names the op ([Note: index bounds checks])
    positions = p.iota(a.shape[dim], start=0, step=1, dtype=torch.int64, device=a.device)
    index = p.index(positions, [convert(reshape(index, [-1]), torch.int64)])
    idx = broadcast_to(p.broadcast_in_dim(index, list(source.shape), [dim]), source.shape)
    return p.scatter_reduce(a, dim, contiguous(idx), convert(source, a.dtype), reduce, include_self)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(a, mask, value):
    from kiln.prims.decompositions.elementwise import where
    if isinstance(value, torch.Tensor):
        value = convert(to_device(value, a.device), a.dtype)
    elif not a.dtype.is_floating_point and not a.dtype.is_complex and isinstance(value, float):
        value = int(value) if a.dtype != torch.bool else bool(value)
    # the result broadcasts `a` with the mask, as eager's does (a mask larger than `a` widens it)
    return where(mask, value if isinstance(value, torch.Tensor) else full([], value, a.dtype, a.device), a)


@register(aten.take.default)
def take(a, index):
    return index_flat(a, index)


def index_flat(a, idx):
    flat = reshape(a, [-1])
    return p.index(flat, [_wrap_negative(idx, flat.shape[0])])


@register(aten.put.default)
def put(a, index, source, accumulate=False):
    flat = reshape(contiguous(a), [-1])
    out = p.index_put(flat, [reshape(_wrap_negative(index, flat.shape[0]), [-1])],
                      reshape(contiguous(convert(source, a.dtype)), [-1]), accumulate)
    return p.view(out, list(a.shape))


@register(aten.masked_scatter.default)
def masked_scatter(a, mask, source):
    shape = broadcast_shapes(a.shape, mask.shape)
    a_b = broadcast_to(a, shape)
    m = broadcast_to(mask, shape)
    # the k-th true position of the mask takes source's k-th element: a running count
    pos = p.sub(p.cumsum(p.convert_element_type(reshape(contiguous(m), [-1]), torch.int64), 0),
                full([numel_of(shape)], 1, torch.int64, a.device))
    pos = p.maximum(pos, full(pos.shape, 0, torch.int64, a.device))
    src = reshape(contiguous(convert(source, a.dtype)), [-1])
    if guard_or_false(src.shape[0] == 0):
        return contiguous(a_b)
    if not known_true(src.shape[0] >= 1):
        # a source whose length is known only at run time (masked_select's gradient) may be empty:
        # one element of padding keeps every gather in bounds, and `where` never picks it then
        src = p.pad(src, 0, [0], [1], [0])
    picked = p.view(p.index(src, [p.minimum(pos, full(pos.shape, src.shape[0] - 1, torch.int64, a.device))]),
                    list(shape))
    return p.where(m, picked, contiguous(a_b))


def numel_of(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@register(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    from kiln.prims.decompositions.elementwise import where
    zeros = full([], 0, grad.dtype, grad.device)
    picked = p.masked_select(where(mask, grad, zeros), broadcast_to(mask, grad.shape))
    total = numel_of(sizes)
    pad = total - picked.shape[0]
    flat = p.pad(picked, 0, [0], [pad], [0]) if guard_or_true(pad > 0) else picked
    return p.view(flat, list(sizes))


@register(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return index(weight, [indices], wrap=False)


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = reshape(convert(indices, torch.int64), [-1])
    g = reshape(contiguous(grad), [idx.shape[0], grad.shape[-1]])
    if scale_grad_by_freq:
        ones = full(idx.shape, 1, torch.int64, grad.device)
        counts = p.index_put(full([num_weights], 0, torch.int64, grad.device), [idx], ones, True)
        freq = p.index(counts, [idx])
        g = p.div(g, p.broadcast_in_dim(convert(freq, g.dtype), list(g.shape), [0]))
    if padding_idx >= 0:
        keep = p.ne(idx, full(idx.shape, padding_idx, torch.int64, grad.device))
        g = p.where(p.broadcast_in_dim(keep, list(g.shape), [0]), g, full(g.shape, 0, g.dtype, g.device))
    compute = torch.float32 if g.dtype in (torch.float16, torch.bfloat16) else g.dtype
    out = p.index_put(full([num_weights, grad.shape[-1]], 0, compute, grad.device), [idx], convert(g, compute), True)
    return convert(out, grad.dtype)
