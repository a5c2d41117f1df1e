"""Decompositions of pooling (max, average, adaptive; 1-3 spatial dims) and their backward.

[Note: pooling as a gather] Every pooling op reads, for each output position and each offset in
its window, one element of the (padded) input: a flat int64 index tensor of shape
(outputs..., window...) built from iota ranges. Forward pooling is `index` + a reduction over the
window dims; backward is `index_put(accumulate=True)` (average) or `scatter_reduce` (max) of the
output gradient through the same indices. Spatial dims are flattened and moved to the front, and
the batch and channel dims ride along as one trailing dim, so one code path serves 1-d, 2-d, 3-d.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from kiln.prims.decompositions.refs import computation_dtype, contiguous, contiguous_strides, convert, full, reshape
from kiln.prims.decompositions.indexing import index
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class DimWindows:
    """One spatial dim: window start per output (as a rule) and the window length."""
    size: int            # input length along this dim (after padding for regular pools)
    outputs: int
    length: int          # max window length
    stride: int = 1
    dilation: int = 1
    adaptive: bool = False


def _positions(w: DimWindows, device):
    """(pos, valid): int64 (outputs, length) input positions and a mask of those inside the window."""
    o = p.broadcast_in_dim(p.iota(w.outputs, start=0, step=1, dtype=torch.int64, device=device),
                           [w.outputs, w.length], [0])
    j = p.broadcast_in_dim(p.iota(w.length, start=0, step=1, dtype=torch.int64, device=device),
                           [w.outputs, w.length], [1])
    shape = [w.outputs, w.length]
    if not w.adaptive:
        pos = p.add(p.mul(o, full(shape, w.stride, torch.int64, device)), p.mul(j, full(shape, w.dilation,
                                                                                          torch.int64, device)))
        return pos, None
    start = p.div(p.mul(o, full(shape, w.size, torch.int64, device)), full(shape, w.outputs, torch.int64, device))
    end = p.div(p.add(p.mul(p.add(o, full(shape, 1, torch.int64, device)), full(shape, w.size, torch.int64, device)),
                      full(shape, w.outputs - 1, torch.int64, device)), full(shape, w.outputs, torch.int64, device))
    pos = p.add(start, j)
    valid = p.lt(pos, end)
    pos = p.minimum(pos, full(shape, w.size - 1, torch.int64, device))
    return pos, valid


def _window_index(dims, device):
    """Flat index (outputs..., windows...) into the row-major spatial block, and the validity mask."""
    n = len(dims)
    out_shape = [w.outputs for w in dims] + [w.length for w in dims]
    strides = contiguous_strides([w.size for w in dims])
    flat, mask = full(out_shape, 0, torch.int64, device), None
    for d, w in enumerate(dims):
        pos, valid = _positions(w, device)
        flat = p.add(flat, p.broadcast_in_dim(p.mul(pos, full(pos.shape, strides[d], torch.int64, device)),
                                              out_shape, [d, n + d]))
        if valid is not None:
            v = p.broadcast_in_dim(valid, out_shape, [d, n + d])
            mask = v if mask is None else p.bitwise_and(mask, v)
    return flat, mask


def _spatial_first(x, k):
    """(B, *spatial) -> (prod(spatial), B): the gather runs over the leading dim."""
    lead = list(x.shape[:x.ndim - k])
    b = math.prod(lead)
    flat = reshape(contiguous(x), [b, -1])
    return p.permute(flat, [1, 0]), lead


def _gather_windows(x, k, dims, fill):
    """(values (outputs..., windows..., B), window mask or None, lead dims)."""
    xt, lead = _spatial_first(x, k)
    idx, mask = _window_index(dims, x.device)
    vals = p.index(xt, [idx])
    if mask is not None:
        m = p.broadcast_in_dim(mask, list(vals.shape), list(range(mask.ndim)))
        vals = p.where(m, vals, full(vals.shape, fill, vals.dtype, vals.device))
    return vals, mask, lead


def _to_batch_first(r, lead, k):
    """(outputs..., B) -> (lead..., outputs...)."""
    out_shape = list(r.shape[:k])
    r = p.permute(r, [k] + list(range(k)))
    return reshape(contiguous(r), lead + out_shape)


def _out_size(size, kernel, stride, pad, dilation, ceil_mode):
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _regular_dims(x, k, kernel, stride, padding, dilation, ceil_mode):
    """Pad amounts and DimWindows of a regular pool over the last k dims."""
    kernel = _expand(kernel, k)
    stride = _expand(stride, k) if stride else kernel
    padding, dilation = _expand(padding, k), _expand(dilation, k)
    sizes = list(x.shape[x.ndim - k:])
    dims, low, high = [], [], []
    for L, kk, s, pd, dl in zip(sizes, kernel, stride, padding, dilation):
        o = _out_size(L, kk, s, pd, dl, ceil_mode)
        need = (o - 1) * s + dl * (kk - 1) + 1
        low.append(pd)
        high.append(max(need - L - pd, 0))
        dims.append(DimWindows(L + pd + high[-1], o, kk, s, dl))
    return dims, low, high, kernel, stride, padding


def _expand(v, k):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * k if len(v) == 1 else v


def _pad_spatial(x, k, low, high, value):
    lo = [0] * (x.ndim - k) + low
    hi = [0] * (x.ndim - k) + high
    return p.pad(x, value, lo, hi, [0] * x.ndim)


# [Note: unrolled max pooling] A window of at most this many elements is pooled as a running
# maximum over strided slices of the padded input, one per window offset, keeping the position
# of the element it holds: pure views and pointwise prims, so the codegen fuses the pool and its
# indices with their producer into one kernel reading the input in place (no gather, no
# transposes; the gathered windows, their argmax and the index arithmetic after it took 2.6 ms of
# resnet50's training step on the H200, Inductor's one kernel 0.7 ms). Inference drops the
# indices as dead code. Larger windows take the gather path.
UNROLL_MAX_WINDOW = 32


def _max_pool(x, k, kernel, stride, padding, dilation, ceil_mode):
    dims, low, high, *_ = _regular_dims(x, k, kernel, stride, padding, dilation, ceil_mode)
    lowest = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    window = math.prod(w.length for w in dims)
    if 0 < window <= UNROLL_MAX_WINDOW and all(w.outputs > 0 for w in dims):
        return _max_pool_unrolled_with_indices(x, k, dims, low, high, lowest)
    xp = _pad_spatial(x, k, low, high, lowest)
    vals, _, lead = _gather_windows(xp, k, dims, lowest)
    outs = [w.outputs for w in dims]
    vals = reshape(contiguous(vals), outs + [window, vals.shape[-1]])
    best = _to_batch_first(p.amax(vals, [k]), lead, k)
    which = p.argmax(vals, k)                                  # (outputs..., B)
    # the chosen offset's position in the unpadded input, as a flat index
    idx, _ = _window_index(dims, x.device)
    idx = reshape(contiguous(idx), outs + [window])
    idx_b = p.broadcast_in_dim(idx, outs + [window, which.shape[-1]], list(range(k + 1)))
    padded_flat = p.squeeze(p.gather(idx_b, k, p.broadcast_in_dim(which, outs + [1, which.shape[-1]],
                                                                   list(range(k)) + [k + 1])), [k])
    sizes = list(x.shape[x.ndim - k:])
    padded_strides = contiguous_strides([w.size for w in dims])
    strides = contiguous_strides(sizes)
    flat = full(padded_flat.shape, 0, torch.int64, x.device)
    for d in range(k):
        coord = p.remainder(p.div(padded_flat, full(padded_flat.shape, padded_strides[d], torch.int64, x.device)),
                            full(padded_flat.shape, dims[d].size, torch.int64, x.device))
        coord = p.sub(coord, full(coord.shape, low[d], torch.int64, x.device))
        flat = p.add(flat, p.mul(coord, full(coord.shape, strides[d], torch.int64, x.device)))
    return best, _to_batch_first(flat, lead, k)


def _ints(n, value, device):
    """A 1-d int64 tensor of n copies of `value` (the index arithmetic of the unrolled pools)."""
    return full([n], value, torch.int64, device)


def _max_pool_unrolled_with_indices(x, k, dims, low, high, lowest):
    """[Note: unrolled max pooling] with its indices: a running maximum over the window offsets
    that also keeps which offset holds it, all pointwise. The choice is ATen's: the first element
    inside the input, then any later one that is greater or NaN.

    [Note: max pooling's indices as window offsets] The running choice is the offset's number in
    the window (int8: at most `UNROLL_MAX_WINDOW` offsets), and the flat input position is computed
    from it and the output position after the loop. Both are pointwise, so aot's min cut saves the
    one-byte offsets for the backward and recomputes the positions there: ResNet-50's stem saved
    int64 indices, 8 bytes an output (205 MB at batch 128; Inductor saves int8 offsets too)."""
    lead, sizes = x.ndim - k, list(x.shape[x.ndim - k:])
    out_shape = list(x.shape[:lead]) + [w.outputs for w in dims]
    strides = contiguous_strides(sizes)
    i64, i8 = torch.int64, torch.int8

    def along(d, values):      # an (outputs_d,) int64 tensor broadcast over the output
        return p.broadcast_in_dim(values, out_shape, [lead + d])
    starts = [p.sub(p.mul(p.iota(w.outputs, start=0, step=1, dtype=i64, device=x.device),
                          _ints(w.outputs, w.stride, x.device)), _ints(w.outputs, low[d], x.device))
              for d, w in enumerate(dims)]
    xp = _pad_spatial(x, k, low, high, lowest)
    best = which = seen = None
    for number, offsets in enumerate(itertools.product(*(range(w.length) for w in dims))):
        v = xp
        inside = None
        for d, (w, j) in enumerate(zip(dims, offsets)):
            v = p.slice(v, lead + d, j * w.dilation, j * w.dilation + (w.outputs - 1) * w.stride + 1, w.stride)
            pos = p.add(starts[d], _ints(w.outputs, j * w.dilation, x.device))
            ok = p.bitwise_and(p.ge(pos, _ints(w.outputs, 0, x.device)),
                               p.lt(pos, _ints(w.outputs, sizes[d], x.device)))
            inside = along(d, ok) if inside is None else p.bitwise_and(inside, along(d, ok))
        here = full(out_shape, number, i8, x.device)
        if best is None:
            best, which, seen = v, here, inside
            continue
        better = p.gt(v, best)
        if x.dtype.is_floating_point:
            better = p.bitwise_or(better, p.isnan(v))
        take = p.bitwise_and(inside, p.bitwise_or(better, p.bitwise_not(seen)))
        best, which, seen = p.where(take, v, best), p.where(take, here, which), p.bitwise_or(seen, inside)
    # the offset's number -> its coordinates in the window (row-major, as the loop counted) -> the flat
    # position of the element in the unpadded input
    number = convert(which, i64)
    flat = full(out_shape, 0, i64, x.device)
    inner = math.prod(w.length for w in dims)
    for d, w in enumerate(dims):
        inner //= w.length
        j = p.remainder(p.div(number, full(out_shape, inner, i64, x.device)), full(out_shape, w.length, i64, x.device))
        pos = p.add(along(d, starts[d]), p.mul(j, full(out_shape, w.dilation, i64, x.device)))
        flat = p.add(flat, p.mul(pos, full(out_shape, strides[d], i64, x.device)))
    return best, flat


def _max_pool_backward(grad, x, k, indices):
    """The scatter of each output's gradient to the input position its index names (any pool)."""
    lead = list(x.shape[:x.ndim - k])
    b = math.prod(lead)
    spatial = math.prod(x.shape[x.ndim - k:])
    compute = computation_dtype(grad.dtype)
    g = reshape(contiguous(convert(grad, compute)), [b, -1])
    i = reshape(contiguous(indices), [b, -1])
    out = p.scatter_reduce(full([b, spatial], 0, compute, x.device), 1, i, g, "sum", True)
    return convert(reshape(out, list(x.shape)), grad.dtype)


def _max_pool_backward_gathered(grad, x, k, kernel, stride, padding, dilation, ceil_mode, indices):
    """[Note: max pooling's gradient as a gather] Each input position sums the gradients of the
    few windows that contain it (ceil(kernel / stride) per dim) whose index names it: pointwise,
    reading the gradient and the indices in whatever layout they have (channels-last from a
    convolution), where the scatter needs both contiguous and adds through atomics on CUDA.
    Dilated pools keep the scatter."""
    dims, low, *_ = _regular_dims(x, k, kernel, stride, padding, dilation, ceil_mode)
    if any(w.dilation != 1 for w in dims):
        return _max_pool_backward(grad, x, k, indices)
    lead, sizes = x.ndim - k, list(x.shape[x.ndim - k:])
    strides = contiguous_strides(sizes)
    compute = computation_dtype(grad.dtype)
    i64 = torch.int64
    g = convert(grad, compute)
    here = full(list(x.shape), 0, i64, x.device)        # each input position's flat index
    for d, size in enumerate(sizes):
        here = p.add(here, p.broadcast_in_dim(p.mul(p.iota(size, start=0, step=1, dtype=i64, device=x.device),
                                                    _ints(size, strides[d], x.device)), list(x.shape), [lead + d]))
    candidates = []
    for d, (size, w) in enumerate(zip(sizes, dims)):
        h = p.add(p.iota(size, start=0, step=1, dtype=i64, device=x.device), _ints(size, low[d], x.device))
        last = p.div(h, _ints(size, w.stride, x.device))           # the last window starting at or before h
        per_dim = []
        for t in range(-(-w.length // w.stride)):
            o = p.sub(last, _ints(size, t, x.device))
            ok = p.bitwise_and(p.bitwise_and(p.ge(o, _ints(size, 0, x.device)),
                                             p.lt(o, _ints(size, w.outputs, x.device))),
                               p.lt(p.sub(h, p.mul(o, _ints(size, w.stride, x.device))),
                                    _ints(size, w.length, x.device)))
            clamped = p.minimum(p.maximum(o, _ints(size, 0, x.device)), _ints(size, w.outputs - 1, x.device))
            per_dim.append((clamped, ok))
        candidates.append(per_dim)
    total = full(list(x.shape), 0, compute, x.device)
    for choice in itertools.product(*candidates):
        picks = []
        ok = None
        for d, (o, valid) in enumerate(choice):
            view = [1] * k
            view[d] = sizes[d]
            picks.append(reshape(o, view))
            v = p.broadcast_in_dim(valid, list(x.shape), [lead + d])
            ok = v if ok is None else p.bitwise_and(ok, v)
        at = [None] * lead + picks
        named = p.eq(index(indices, at), here)
        total = p.add(total, p.where(p.bitwise_and(ok, named), index(g, at), full(list(x.shape), 0, compute, x.device)))
    return convert(total, grad.dtype)


for _k, _fwd, _bwd in ((2, aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default),
                       (3, aten.max_pool3d_with_indices.default, aten.max_pool3d_with_indices_backward.default)):
    def _make(k):
        def max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
            return _max_pool(x, k, kernel_size, stride, padding, dilation, ceil_mode)

        def max_pool_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
            return _max_pool_backward_gathered(grad, x, k, kernel_size, stride, padding, dilation, ceil_mode,
                                               indices)
        return max_pool_with_indices, max_pool_with_indices_backward
    _f, _b = _make(_k)
    register(_fwd)(_f)
    register(_bwd)(_b)


def _avg_divisor(x, k, dims_info, count_include_pad, divisor_override, dtype):
    dims, low, high, kernel, stride, padding = dims_info
    outs = [w.outputs for w in dims]
    if divisor_override:
        return full(outs, divisor_override, dtype, x.device)
    sizes = list(x.shape[x.ndim - k:])
    total = None
    for d, (L, w) in enumerate(zip(sizes, dims)):
        o = p.iota(w.outputs, start=0, step=1, dtype=torch.int64, device=x.device)
        start = p.sub(p.mul(o, full([w.outputs], stride[d], torch.int64, x.device)),
                      full([w.outputs], padding[d], torch.int64, x.device))
        end = p.minimum(p.add(start, full([w.outputs], kernel[d], torch.int64, x.device)),
                        full([w.outputs], L + padding[d], torch.int64, x.device))
        if not count_include_pad:
            start = p.maximum(start, full([w.outputs], 0, torch.int64, x.device))
            end = p.minimum(end, full([w.outputs], L, torch.int64, x.device))
        count = p.broadcast_in_dim(p.sub(end, start), outs, [d])
        total = count if total is None else p.mul(total, count)
    return p.convert_element_type(total, dtype)


def _avg_pool(x, k, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    info = _regular_dims(x, k, kernel, stride, padding, 1, ceil_mode)
    dims, low, high = info[0], info[1], info[2]
    compute = computation_dtype(x.dtype)
    xp = _pad_spatial(convert(x, compute), k, low, high, 0)
    vals, _, lead = _gather_windows(xp, k, dims, 0)
    s = p.sum(vals, list(range(k, 2 * k)))
    div = _avg_divisor(x, k, info, count_include_pad, divisor_override, compute)
    r = p.div(s, p.broadcast_in_dim(div, list(s.shape), list(range(k))))
    return convert(_to_batch_first(r, lead, k), x.dtype)


def _avg_pool_backward(grad, x, k, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    info = _regular_dims(x, k, kernel, stride, padding, 1, ceil_mode)
    dims, low, high = info[0], info[1], info[2]
    compute = computation_dtype(grad.dtype)
    gt, lead = _spatial_first(convert(grad, compute), k)     # (outputs_flat, B)
    outs = [w.outputs for w in dims]
    b = gt.shape[1]
    div = _avg_divisor(x, k, info, count_include_pad, divisor_override, compute)
    g = p.div(p.view(contiguous(gt), outs + [b]), p.broadcast_in_dim(div, outs + [b], list(range(k))))
    idx, _ = _window_index(dims, x.device)
    vals = p.broadcast_in_dim(g, list(idx.shape) + [b], list(range(k)) + [2 * k])
    padded = math.prod(w.size for w in dims)
    acc = p.index_put(full([padded, b], 0, compute, x.device), [idx], contiguous(vals), True)
    acc = p.view(p.permute(acc, [1, 0]), lead + [w.size for w in dims])
    for d in range(k):  # crop the padding
        dim = len(lead) + d
        acc = p.slice(acc, dim, low[d], low[d] + x.shape[x.ndim - k + d], 1)
    return convert(contiguous(acc), grad.dtype)


@register(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


@register(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


def _adaptive_dims(x, output_size):
    k = len(output_size)
    sizes = list(x.shape[x.ndim - k:])
    dims = []
    for L, o in zip(sizes, output_size):
        longest = max(-(-((i + 1) * L) // o) - (i * L) // o for i in range(o)) if o else 0
        dims.append(DimWindows(L, o, longest, adaptive=True))
    return dims


def _adaptive_avg(x, output_size):
    k = len(output_size)
    if x.numel() == 0:
        return full(list(x.shape[:x.ndim - k]) + list(output_size), 0, x.dtype, x.device)
    dims = _adaptive_dims(x, output_size)
    compute = computation_dtype(x.dtype)
    vals, mask, lead = _gather_windows(convert(x, compute), k, dims, 0)
    s = p.sum(vals, list(range(k, 2 * k)))
    count = p.sum(p.convert_element_type(mask, compute), list(range(k, 2 * k)))
    r = p.div(s, p.broadcast_in_dim(count, list(s.shape), list(range(k))))
    return convert(_to_batch_first(r, lead, k), x.dtype)


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, list(output_size))


@register(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, list(output_size))


def _adaptive_backward(grad, x, k):
    output_size = list(grad.shape[grad.ndim - k:])
    dims = _adaptive_dims(x, output_size)
    compute = computation_dtype(grad.dtype)
    idx, mask = _window_index(dims, x.device)
    count = p.sum(p.convert_element_type(mask, compute), list(range(k, 2 * k)))
    gt, lead = _spatial_first(convert(grad, compute), k)
    b = gt.shape[1]
    g = p.div(p.view(contiguous(gt), output_size + [b]), p.broadcast_in_dim(count, output_size + [b], list(range(k))))
    vals = p.broadcast_in_dim(g, list(idx.shape) + [b], list(range(k)) + [2 * k])
    vals = p.where(p.broadcast_in_dim(mask, list(vals.shape), list(range(2 * k))), vals,
                   full(vals.shape, 0, compute, x.device))
    spatial = math.prod(x.shape[x.ndim - k:])
    acc = p.index_put(full([spatial, b], 0, compute, x.device), [idx], contiguous(vals), True)
    return convert(reshape(contiguous(p.permute(acc, [1, 0])), list(x.shape)), grad.dtype)


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_backward(grad, x, 2)


@register(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_backward(grad, x, 3)


def _adaptive_max(x, output_size):
    k = len(output_size)
    dims = _adaptive_dims(x, output_size)
    lowest = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    vals, mask, lead = _gather_windows(x, k, dims, lowest)
    outs = list(output_size)
    window = math.prod(w.length for w in dims)
    b = vals.shape[-1]
    vals = reshape(contiguous(vals), outs + [window, b])
    best = p.amax(vals, [k])
    which = p.argmax(vals, k)
    idx, _ = _window_index(dims, x.device)
    idx_b = p.broadcast_in_dim(reshape(contiguous(idx), outs + [window]), outs + [window, b], list(range(k + 1)))
    flat = p.squeeze(p.gather(idx_b, k, p.broadcast_in_dim(which, outs + [1, b], list(range(k)) + [k + 1])), [k])
    return _to_batch_first(best, lead, k), _to_batch_first(flat, lead, k)


@register(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, list(output_size))


@register(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, list(output_size))


@register(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _max_pool_backward(grad, x, 2, indices)


@register(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _max_pool_backward(grad, x, 3, indices)
