"""Decompositions of padding modes, interpolation (upsample), im2col/col2im and max_unpool.

[Note: separable resampling] Reflection/replication padding and nearest/linear/cubic upsampling
act on each spatial dim independently. Per dim they are a few *taps*: an int64 source position
per output position and an optional weight. Forward gathers the taps along the dim and sums them
weighted; backward is the transpose: `scatter_reduce(sum)` of the weighted gradient through the
same positions. So one forward and one backward routine serve all of these ops.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from kiln.prims.decompositions.pooling import _regular_dims, _spatial_first, _window_index, _pad_spatial
from kiln.prims.decompositions.refs import computation_dtype, contiguous, convert, full, reshape
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Tap:
    index: torch.Tensor            # int64 [out_len]: source position along the dim
    weight: torch.Tensor | None    # [out_len] in the computation dtype, or None for weight 1


def _along(t, x, dim):
    shape = list(x.shape)
    shape[dim] = t.shape[0]
    return p.broadcast_in_dim(t, shape, [dim])


def _apply_taps(x, dim, taps):
    out = None
    for tap in taps:
        v = p.gather(x, dim, _along(tap.index, x, dim))
        if tap.weight is not None:
            v = p.mul(v, _along(tap.weight, v, dim))
        out = v if out is None else p.add(out, v)
    return out


def _transpose_taps(g, dim, size, taps):
    shape = list(g.shape)
    shape[dim] = size
    out = full(shape, 0, g.dtype, g.device)
    for tap in taps:
        v = g if tap.weight is None else p.mul(g, _along(tap.weight, g, dim))
        out = p.scatter_reduce(out, dim, contiguous(_along(tap.index, g, dim)), v, "sum", True)
    return out


def _ramp(n, device, dtype=torch.int64):
    return p.convert_element_type(p.iota(n, start=0, step=1, dtype=torch.int64, device=device), dtype)


def _int(v, n, device):
    return full([n], v, torch.int64, device)


# ---- padding modes -------------------------------------------------------------------------------

def _pad_taps(size, low, high, mode, device):
    n = size + low + high
    src = p.sub(_ramp(n, device), _int(low, n, device))
    if mode == "reflect":
        last = _int(size - 1, n, device)
        src = p.sub(last, p.abs(p.sub(last, p.abs(src))))
    else:
        src = p.minimum(p.maximum(src, _int(0, n, device)), _int(size - 1, n, device))
    return [Tap(src, None)]


def _pads(x_ndim, pad):
    k = len(pad) // 2
    return [(x_ndim - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(k)]


def _pad_forward(x, pad, mode):
    out = x
    for dim, lo, hi in _pads(x.ndim, pad):
        out = _apply_taps(out, dim, _pad_taps(x.shape[dim], lo, hi, mode, x.device))
    return out


def _pad_backward(grad, x, pad, mode):
    g = convert(grad, computation_dtype(grad.dtype))
    for dim, lo, hi in reversed(_pads(x.ndim, pad)):
        g = _transpose_taps(g, dim, x.shape[dim], _pad_taps(x.shape[dim], lo, hi, mode, x.device))
    return convert(g, grad.dtype)


for _mode, _name in (("reflect", "reflection_pad"), ("replicate", "replication_pad")):
    for _k in (1, 2, 3):
        def _make(mode):
            def pad_forward(x, padding):
                return _pad_forward(x, padding, mode)

            def pad_backward(grad, x, padding):
                return _pad_backward(grad, x, padding, mode)
            return pad_forward, pad_backward
        _f, _b = _make(_mode)
        register(getattr(aten, f"{_name}{_k}d").default)(_f)
        register(getattr(aten, f"{_name}{_k}d_backward").default)(_b)


@register(aten._pad_circular.default)
def pad_circular(x, pad):
    out = x
    for dim, lo, hi in _pads(x.ndim, pad):
        size = x.shape[dim]
        n = size + lo + hi
        src = p.remainder(p.sub(_ramp(n, x.device), _int(lo, n, x.device)), _int(size, n, x.device))
        out = _apply_taps(out, dim, [Tap(src, None)])
    return out


# ---- upsampling ----------------------------------------------------------------------------------

def _scale(in_size, out_size, scale, align_corners=False):
    """eager's area_pixel_compute_scale / compute_scales_value."""
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else in_size / out_size


def _nearest_taps(in_size, out_size, scale, exact, device):
    s = _scale(in_size, out_size, scale)
    dst = _ramp(out_size, device, torch.float32)
    if exact:
        dst = p.add(dst, full([out_size], 0.5, torch.float32, device))
    src = p.convert_element_type(p.floor(p.mul(dst, full([out_size], s, torch.float32, device))), torch.int64)
    return [Tap(p.minimum(src, _int(in_size - 1, out_size, device)), None)]


def _source_index(in_size, out_size, scale, align_corners, cubic, dtype, device):
    s = _scale(in_size, out_size, scale, align_corners)
    dst = _ramp(out_size, device, dtype)
    if align_corners:
        return p.mul(dst, full([out_size], s, dtype, device))
    src = p.sub(p.mul(full([out_size], s, dtype, device), p.add(dst, full([out_size], 0.5, dtype, device))),
                full([out_size], 0.5, dtype, device))
    return src if cubic else p.maximum(src, full([out_size], 0, dtype, device))


def _linear_taps(in_size, out_size, scale, align_corners, dtype, device):
    src = _source_index(in_size, out_size, scale, align_corners, False, dtype, device)
    i0 = p.minimum(p.convert_element_type(p.floor(src), torch.int64), _int(in_size - 1, out_size, device))
    i1 = p.minimum(p.add(i0, _int(1, out_size, device)), _int(in_size - 1, out_size, device))
    w1 = p.sub(src, p.convert_element_type(i0, dtype))
    w0 = p.sub(full([out_size], 1, dtype, device), w1)
    return [Tap(i0, w0), Tap(i1, w1)]


def _cubic_taps(in_size, out_size, scale, align_corners, dtype, device):
    A = -0.75
    src = _source_index(in_size, out_size, scale, align_corners, True, dtype, device)
    f = p.floor(src)
    t = p.sub(src, f)
    i = p.convert_element_type(f, torch.int64)

    def c(v):
        return full([out_size], v, dtype, device)

    def conv1(x):  # |x| <= 1
        return p.add(p.mul(p.mul(p.sub(p.mul(c(A + 2), x), c(A + 3)), x), x), c(1))

    def conv2(x):  # 1 < |x| < 2
        return p.sub(p.mul(p.add(p.mul(p.sub(p.mul(c(A), x), c(5 * A)), x), c(8 * A)), x), c(4 * A))
    weights = [conv2(p.add(t, c(1))), conv1(t), conv1(p.sub(c(1), t)), conv2(p.sub(c(2), t))]
    taps = []
    for k, w in zip((-1, 0, 1, 2), weights):
        idx = p.minimum(p.maximum(p.add(i, _int(k, out_size, device)), _int(0, out_size, device)),
                        _int(in_size - 1, out_size, device))
        taps.append(Tap(idx, w))
    return taps


def _upsample(x, output_size, scales, kind, align_corners=False):
    k = len(output_size)
    compute = computation_dtype(x.dtype) if x.dtype.is_floating_point else torch.float32
    out = convert(x, compute) if kind in ("linear", "cubic") else x
    for d in range(k):
        dim = x.ndim - k + d
        out = _apply_taps(out, dim, _taps(kind, x.shape[dim], output_size[d], scales[d], align_corners, compute,
                                          x.device))
    return convert(out, x.dtype)


def _upsample_backward(grad, output_size, input_size, scales, kind, align_corners=False):
    k = len(output_size)
    compute = computation_dtype(grad.dtype)
    g = convert(grad, compute)
    for d in reversed(range(k)):
        dim = grad.ndim - k + d
        g = _transpose_taps(g, dim, input_size[dim],
                            _taps(kind, input_size[dim], output_size[d], scales[d], align_corners, compute,
                                  grad.device))
    return convert(g, grad.dtype)


def _taps(kind, in_size, out_size, scale, align_corners, dtype, device):
    if kind in ("nearest", "nearest_exact"):
        return _nearest_taps(in_size, out_size, scale, kind == "nearest_exact", device)
    if kind == "linear":
        return _linear_taps(in_size, out_size, scale, align_corners, dtype, device)
    return _cubic_taps(in_size, out_size, scale, align_corners, dtype, device)


def _scales(k, *given):
    given = list(given)[:k]
    return given + [None] * (k - len(given))


def _register_upsample(name, k, kind, has_align):
    forward = getattr(aten, name).default
    backward = getattr(aten, f"{name}_backward").default
    if has_align:
        def fwd(x, output_size, align_corners, *scales):
            return _upsample(x, list(output_size), _scales(k, *scales), kind, align_corners)

        def bwd(grad, output_size, input_size, align_corners, *scales):
            return _upsample_backward(grad, list(output_size), list(input_size), _scales(k, *scales), kind,
                                      align_corners)
    else:
        def fwd(x, output_size, *scales):
            return _upsample(x, list(output_size), _scales(k, *scales), kind)

        def bwd(grad, output_size, input_size, *scales):
            return _upsample_backward(grad, list(output_size), list(input_size), _scales(k, *scales), kind)
    fwd.__name__, bwd.__name__ = name, f"{name}_backward"
    register(forward)(fwd)
    register(backward)(bwd)
    vec = getattr(getattr(aten, name), "vec", None)
    if vec is not None:
        def fwd_vec(x, output_size, *rest):
            align = rest[0] if has_align else False
            factors = rest[-1]
            if output_size is None:
                output_size = [int(math.floor(x.shape[x.ndim - k + d] * factors[d])) for d in range(k)]
            return _upsample(x, list(output_size), list(factors) if factors else [None] * k, kind, align)
        fwd_vec.__name__ = f"{name}_vec"
        register(vec)(fwd_vec)


for _name, _k, _kind, _align in (
        ("upsample_nearest1d", 1, "nearest", False), ("upsample_nearest2d", 2, "nearest", False),
        ("upsample_nearest3d", 3, "nearest", False), ("_upsample_nearest_exact1d", 1, "nearest_exact", False),
        ("_upsample_nearest_exact2d", 2, "nearest_exact", False),
        ("_upsample_nearest_exact3d", 3, "nearest_exact", False),
        ("upsample_linear1d", 1, "linear", True), ("upsample_bilinear2d", 2, "linear", True),
        ("upsample_trilinear3d", 3, "linear", True), ("upsample_bicubic2d", 2, "cubic", True)):
    _register_upsample(_name, _k, _kind, _align)


# ---- im2col / col2im / max_unpool -----------------------------------------------------------------

@register(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    x4 = x if batched else p.broadcast_in_dim(x, [1, *x.shape], [1, 2, 3])
    n, c = x4.shape[0], x4.shape[1]
    dims, low, high, *_ = _regular_dims(x4, 2, kernel_size, stride, padding, dilation, False)
    if n * c == 0:
        k = math.prod(kernel_size)
        out = full([n, c * k, dims[0].outputs * dims[1].outputs], 0, x.dtype, x.device)
        return out if batched else p.squeeze(out, [0])
    xp = _pad_spatial(x4, 2, list(padding) if isinstance(padding, (list, tuple)) else [padding] * 2,
                      [max(h, 0) for h in high], 0)
    xp = p.slice(p.slice(xp, 2, 0, dims[0].size, 1), 3, 0, dims[1].size, 1) if \
        (xp.shape[2], xp.shape[3]) != (dims[0].size, dims[1].size) else xp
    xt, _ = _spatial_first(xp, 2)
    idx, _ = _window_index(dims, x.device)                       # (oh, ow, kh, kw)
    vals = p.index(xt, [idx])                                    # (oh, ow, kh, kw, n*c)
    oh, ow, kh, kw = idx.shape
    vals = p.permute(reshape(contiguous(vals), [oh, ow, kh, kw, n, c]), [4, 5, 2, 3, 0, 1])
    out = reshape(contiguous(vals), [n, c * kh * kw, oh * ow])
    return out if batched else p.squeeze(out, [0])


@register(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    batched = cols.ndim == 3
    cols3 = cols if batched else p.broadcast_in_dim(cols, [1, *cols.shape], [1, 2])
    kh, kw = kernel_size
    n, ckk = cols3.shape[0], cols3.shape[1]
    c = ckk // (kh * kw)
    template = full([n, c, *output_size], 0, cols.dtype, cols.device)
    dims, low, high, *_ = _regular_dims(template, 2, kernel_size, stride, padding, dilation, False)
    oh, ow = dims[0].outputs, dims[1].outputs
    idx, _ = _window_index(dims, cols.device)
    compute = computation_dtype(cols.dtype)
    vals = p.permute(reshape(contiguous(convert(cols3, compute)), [n, c, kh, kw, oh, ow]), [4, 5, 2, 3, 0, 1])
    vals = reshape(contiguous(vals), [oh, ow, kh, kw, n * c])
    size = dims[0].size * dims[1].size
    acc = p.index_put(full([size, n * c], 0, compute, cols.device), [idx], vals, True)
    acc = p.view(p.permute(acc, [1, 0]), [n, c, dims[0].size, dims[1].size])
    acc = p.slice(p.slice(acc, 2, low[0], low[0] + output_size[0], 1), 3, low[1], low[1] + output_size[1], 1)
    out = convert(contiguous(acc), cols.dtype)
    return out if batched else p.squeeze(out, [0])


def _max_unpool(x, indices, spatial_out):
    k = len(spatial_out)
    lead = list(x.shape[:x.ndim - k])
    b = math.prod(lead)
    flat_in = reshape(contiguous(x), [b, -1])
    idx = reshape(contiguous(indices), [b, -1])
    out = p.scatter(full([b, math.prod(spatial_out)], 0, x.dtype, x.device), 1, idx, flat_in)
    return reshape(out, lead + list(spatial_out))


@register(aten.max_unpool2d.default)
def max_unpool2d(x, indices, output_size):
    return _max_unpool(x, indices, list(output_size))


@register(aten.max_unpool3d.default)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _max_unpool(x, indices, list(output_size))


# ---- grid sampling -------------------------------------------------------------------------------

def _unnormalize(coord, size, align_corners):
    one = full(coord.shape, 1, coord.dtype, coord.device)
    if align_corners:
        return p.mul(p.div(p.add(coord, one), full(coord.shape, 2, coord.dtype, coord.device)),
                     full(coord.shape, size - 1, coord.dtype, coord.device))
    return p.div(p.sub(p.mul(p.add(coord, one), full(coord.shape, size, coord.dtype, coord.device)), one),
                 full(coord.shape, 2, coord.dtype, coord.device))


@register(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    """Bilinear (0) and nearest (1) sampling with zeros (0) or border (1) padding; bicubic and
    reflection padding are left to ATen (the decomposition declines with NotImplemented)."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1):
        return NotImplemented
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    compute = computation_dtype(x.dtype)
    g = convert(grid, compute)
    gx = p.squeeze(p.slice(g, 3, 0, 1, 1), [3])            # (n, ho, wo)
    gy = p.squeeze(p.slice(g, 3, 1, 2, 1), [3])
    fx, fy = _unnormalize(gx, w, align_corners), _unnormalize(gy, h, align_corners)
    if padding_mode == 1:
        fx = p.minimum(p.maximum(fx, full(fx.shape, 0, compute, x.device)), full(fx.shape, w - 1, compute, x.device))
        fy = p.minimum(p.maximum(fy, full(fy.shape, 0, compute, x.device)), full(fy.shape, h - 1, compute, x.device))
    flat = reshape(contiguous(convert(x, compute)), [n, c, h * w])

    def corner(ix, iy, weight):
        inside = p.bitwise_and(p.bitwise_and(p.ge(ix, _zero(ix)), p.lt(ix, _const(ix, w))),
                               p.bitwise_and(p.ge(iy, _zero(iy)), p.lt(iy, _const(iy, h))))
        cx = p.minimum(p.maximum(ix, _zero(ix)), _const(ix, w - 1))
        cy = p.minimum(p.maximum(iy, _zero(iy)), _const(iy, h - 1))
        idx = reshape(p.add(p.mul(cy, _const(cy, w)), cx), [n, 1, ho * wo])
        vals = p.gather(flat, 2, p.broadcast_in_dim(p.view(idx, [n, ho * wo]), [n, c, ho * wo], [0, 2]))
        wgt = p.where(inside, weight, full(weight.shape, 0, compute, x.device))
        return p.mul(vals, p.broadcast_in_dim(reshape(wgt, [n, ho * wo]), [n, c, ho * wo], [0, 2]))

    if interpolation_mode == 1:
        ix = p.convert_element_type(p.round(fx), torch.int64)
        iy = p.convert_element_type(p.round(fy), torch.int64)
        out = corner(ix, iy, full(fx.shape, 1, compute, x.device))
    else:
        x0, y0 = p.floor(fx), p.floor(fy)
        tx, ty = p.sub(fx, x0), p.sub(fy, y0)
        one = full(fx.shape, 1, compute, x.device)
        ix0, iy0 = p.convert_element_type(x0, torch.int64), p.convert_element_type(y0, torch.int64)
        ix1, iy1 = p.add(ix0, _const(ix0, 1)), p.add(iy0, _const(iy0, 1))
        out = corner(ix0, iy0, p.mul(p.sub(one, tx), p.sub(one, ty)))
        out = p.add(out, corner(ix1, iy0, p.mul(tx, p.sub(one, ty))))
        out = p.add(out, corner(ix0, iy1, p.mul(p.sub(one, tx), ty)))
        out = p.add(out, corner(ix1, iy1, p.mul(tx, ty)))
    return convert(p.view(out, [n, c, ho, wo]), x.dtype)


@register(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """The transpose of grid_sampler_2d: each corner's weighted gradient scatter-added into the
    input, and the weights' derivatives (bilinear) for the grid. Declines what the forward does."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1):
        return NotImplemented
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    m = ho * wo
    compute = computation_dtype(x.dtype)
    g = convert(grid, compute)
    gx = p.squeeze(p.slice(g, 3, 0, 1, 1), [3])
    gy = p.squeeze(p.slice(g, 3, 1, 2, 1), [3])
    fx, fy = _unnormalize(gx, w, align_corners), _unnormalize(gy, h, align_corners)
    scale_x = (w - 1) / 2 if align_corners else w / 2
    scale_y = (h - 1) / 2 if align_corners else h / 2
    dx = full(fx.shape, scale_x, compute, x.device)
    dy = full(fy.shape, scale_y, compute, x.device)
    if padding_mode == 1:   # clipped coordinates pass no gradient to the grid, nor (as eager's) the borders
        dx = p.where(p.bitwise_and(p.gt(fx, _zero(fx)), p.lt(fx, _const(fx, w - 1))), dx, _zero(dx))
        dy = p.where(p.bitwise_and(p.gt(fy, _zero(fy)), p.lt(fy, _const(fy, h - 1))), dy, _zero(dy))
        fx = p.minimum(p.maximum(fx, _zero(fx)), _const(fx, w - 1))
        fy = p.minimum(p.maximum(fy, _zero(fy)), _const(fy, h - 1))
    gout = reshape(contiguous(convert(grad, compute)), [n, c, m])
    flat = reshape(contiguous(convert(x, compute)), [n, c, h * w])
    grad_input = full([n, c, h * w], 0, compute, x.device)

    def spread(t):     # (n, ho, wo) -> (n, c, m)
        return p.broadcast_in_dim(reshape(t, [n, m]), [n, c, m], [0, 2])

    def corner(ix, iy):
        inside = p.bitwise_and(p.bitwise_and(p.ge(ix, _zero(ix)), p.lt(ix, _const(ix, w))),
                               p.bitwise_and(p.ge(iy, _zero(iy)), p.lt(iy, _const(iy, h))))
        cx = p.minimum(p.maximum(ix, _zero(ix)), _const(ix, w - 1))
        cy = p.minimum(p.maximum(iy, _zero(iy)), _const(iy, h - 1))
        idx = spread(p.add(p.mul(cy, _const(cy, w)), cx))
        return idx, spread(p.convert_element_type(inside, compute))

    if interpolation_mode == 1:
        idx, inside = corner(p.convert_element_type(p.round(fx), torch.int64),
                             p.convert_element_type(p.round(fy), torch.int64))
        grad_input = p.scatter_reduce(grad_input, 2, idx, p.mul(gout, inside), "sum", True)
        grad_grid = full([n, ho, wo, 2], 0, compute, x.device)
    else:
        x0, y0 = p.floor(fx), p.floor(fy)
        tx, ty = p.sub(fx, x0), p.sub(fy, y0)
        one = full(fx.shape, 1, compute, x.device)
        ix0, iy0 = p.convert_element_type(x0, torch.int64), p.convert_element_type(y0, torch.int64)
        ix1, iy1 = p.add(ix0, _const(ix0, 1)), p.add(iy0, _const(iy0, 1))
        # (corner x, corner y, weight, d weight / d tx, d weight / d ty)
        corners = [(ix0, iy0, p.mul(p.sub(one, tx), p.sub(one, ty)), p.neg(p.sub(one, ty)), p.neg(p.sub(one, tx))),
                   (ix1, iy0, p.mul(tx, p.sub(one, ty)), p.sub(one, ty), p.neg(tx)),
                   (ix0, iy1, p.mul(p.sub(one, tx), ty), p.neg(ty), p.sub(one, tx)),
                   (ix1, iy1, p.mul(tx, ty), ty, tx)]
        grad_fx = grad_fy = full([n, c, m], 0, compute, x.device)
        for ix, iy, wgt, dwx, dwy in corners:
            idx, inside = corner(ix, iy)
            grad_input = p.scatter_reduce(grad_input, 2, idx, p.mul(p.mul(gout, spread(wgt)), inside), "sum", True)
            val_g = p.mul(p.mul(p.gather(flat, 2, idx), inside), gout)
            grad_fx = p.add(grad_fx, p.mul(val_g, spread(dwx)))
            grad_fy = p.add(grad_fy, p.mul(val_g, spread(dwy)))
        gx_ = p.mul(reshape(p.sum(grad_fx, [1]), [n, ho, wo]), dx)
        gy_ = p.mul(reshape(p.sum(grad_fy, [1]), [n, ho, wo]), dy)
        grad_grid = p.cat([p.broadcast_in_dim(gx_, [n, ho, wo, 1], [0, 1, 2]),
                           p.broadcast_in_dim(gy_, [n, ho, wo, 1], [0, 1, 2])], 3)
    grad_input = convert(p.view(grad_input, [n, c, h, w]), x.dtype) if output_mask[0] else None
    return grad_input, convert(grad_grid, grid.dtype)


def _zero(t):
    return full(t.shape, 0, t.dtype, t.device)


def _const(t, v):
    return full(t.shape, v, t.dtype, t.device)
