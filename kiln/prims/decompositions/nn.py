"""Decompositions of neural-network ATen ops: matmul family, activations (and their backward),
softmax, normalization, losses, dropout.

Backward ops (`*_backward`) are the formulas eager's autograd uses, over prims. Normalizations and
softmax compute in float32 for float16/bfloat16 inputs, as eager's kernels do.
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import (Promotion, broadcast_to, canonical_dim, canonical_dims, computation_dtype,
                                            contiguous, convert, elementwise, full, map_float, reshape, restore_dims,
                                            scalar_tensor)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p
from kiln.symbolic.decide import guard_or_true

aten = torch.ops.aten


def _s(x, value):
    return scalar_tensor(value, x)


# ---- matmul family: mm/bmm externs plus elementwise epilogues -----------------------------------

def _scale(x, value):
    return x if value == 1 else p.mul(x, full(x.shape, value, x.dtype, x.device))


def _epilogue(product, bias, beta, alpha):
    out = _scale(product, alpha)
    if beta == 0:
        return out
    b = broadcast_to(convert(bias, out.dtype), out.shape)
    return p.add(_scale(b, beta), out)


@register(aten.addbmm.default)
def addbmm(bias, b1, b2, *, beta=1, alpha=1):
    # sum_b b1[b] @ b2[b] is one matmul over the joined (batch, inner) dim: one accumulation, as eager
    nb, n, m = b1.shape
    q = b2.shape[2]
    left = reshape(contiguous(p.permute(b1, [1, 0, 2])), [n, nb * m])
    right = reshape(contiguous(b2), [nb * m, q])
    return _epilogue(p.mm(left, right), bias, beta, alpha)


@register(aten.mv.default)
def mv(m, v):
    return p.view(p.mm(m, p.view(v, [v.shape[0], 1])), [m.shape[0]])


@register(aten.addmv.default)
def addmv(bias, m, v, *, beta=1, alpha=1):
    return _epilogue(mv(m, v), bias, beta, alpha)


@register(aten.addr.default)
def addr(bias, v1, v2, *, beta=1, alpha=1):
    outer = p.mul(p.broadcast_in_dim(v1, [v1.shape[0], v2.shape[0]], [0]),
                  p.broadcast_in_dim(v2, [v1.shape[0], v2.shape[0]], [1]))
    if outer.dtype == torch.bool:
        b = broadcast_to(convert(bias, torch.bool), outer.shape)
        return p.bitwise_or(p.bitwise_and(b, full(b.shape, bool(beta), torch.bool, b.device)), outer) if beta else outer
    return _epilogue(outer, bias, beta, alpha)


@register(aten.dot.default)
def dot(a, b):
    return p.view(p.mm(p.view(a, [1, a.shape[0]]), p.view(b, [b.shape[0], 1])), [])


@register(aten.vdot.default)
def vdot(a, b):
    """dot with the first vector conjugated (the same as dot on real ones)."""
    return dot(_conj(a), b)


def _conj(x):
    return p.conj(x) if x.dtype.is_complex else x


# ---- activations -------------------------------------------------------------------------------

@register(aten.relu.default)
def relu(a):
    return elementwise(lambda x: p.maximum(x, _s(x, 0)), a, promotion=Promotion.NO_OPMATH)


@register(aten.threshold.default)
def threshold(a, threshold, value):
    return elementwise(lambda x: p.where(p.le(x, _s(x, threshold)), _s(x, value), x), a,
                       promotion=Promotion.NO_OPMATH)


@register(aten.threshold_backward.default)
def threshold_backward(grad, a, threshold):
    return elementwise(lambda g, x: p.where(p.le(x, _s(x, threshold)), _s(g, 0), g), grad, a,
                       promotion=Promotion.NO_OPMATH)


@register(aten.gelu.default)
def gelu(a, *, approximate="none"):
    def fn(x):
        if approximate == "tanh":
            inner = p.mul(_s(x, math.sqrt(2 / math.pi)), p.add(x, p.mul(_s(x, 0.044715), p.mul(x, p.mul(x, x)))))
            return p.mul(p.mul(_s(x, 0.5), x), p.add(_s(x, 1), p.tanh(inner)))
        return p.mul(p.mul(_s(x, 0.5), x), p.add(_s(x, 1), p.erf(p.mul(x, _s(x, 1 / math.sqrt(2))))))
    return map_float(fn, a)


@register(aten.gelu_backward.default)
def gelu_backward(grad, a, *, approximate="none"):
    def fn(g, x):
        if approximate == "tanh":
            k, c = math.sqrt(2 / math.pi), 0.044715
            x3 = p.mul(x, p.mul(x, x))
            t = p.tanh(p.mul(_s(x, k), p.add(x, p.mul(_s(x, c), x3))))
            dt = p.mul(p.sub(_s(x, 1), p.mul(t, t)), p.mul(_s(x, k), p.add(_s(x, 1), p.mul(_s(x, 3 * c), p.mul(x, x)))))
            d = p.add(p.mul(_s(x, 0.5), p.add(_s(x, 1), t)), p.mul(p.mul(_s(x, 0.5), x), dt))
            return p.mul(g, d)
        cdf = p.mul(_s(x, 0.5), p.add(_s(x, 1), p.erf(p.mul(x, _s(x, 1 / math.sqrt(2))))))
        pdf = p.mul(_s(x, 1 / math.sqrt(2 * math.pi)), p.exp(p.mul(_s(x, -0.5), p.mul(x, x))))
        return p.mul(g, p.add(cdf, p.mul(x, pdf)))
    return map_float(fn, grad, a)


@register(aten.silu.default)
def silu(a):
    return map_float(lambda x: p.mul(x, p.sigmoid(x)), a)


@register(aten.silu_backward.default)
def silu_backward(grad, a):
    def fn(g, x):
        s = p.sigmoid(x)
        return p.mul(g, p.mul(s, p.add(_s(x, 1), p.mul(x, p.sub(_s(x, 1), s)))))
    return map_float(fn, grad, a)


@register(aten.sigmoid_backward.default)
def sigmoid_backward(grad, y):
    return map_float(lambda g, s: p.mul(g, _conj(p.mul(s, p.sub(_s(s, 1), s)))), grad, y, promotion=Promotion.DEFAULT)


@register(aten.tanh_backward.default)
def tanh_backward(grad, y):
    return map_float(lambda g, t: p.mul(g, _conj(p.sub(_s(t, 1), p.mul(t, t)))), grad, y, promotion=Promotion.DEFAULT)


@register(aten.mish.default)
def mish(a):
    return map_float(lambda x: p.mul(x, p.tanh(_softplus(x, 1, 20))), a)


@register(aten.mish_backward.default)
def mish_backward(grad, a):
    def fn(g, x):
        sp = _softplus(x, 1, 20)
        t = p.tanh(sp)
        return p.mul(g, p.add(t, p.mul(x, p.mul(p.sub(_s(x, 1), p.mul(t, t)), p.sigmoid(x)))))
    return map_float(fn, grad, a)


def _softplus(x, beta, threshold):
    bx = p.mul(x, _s(x, beta))
    soft = p.div(p.log1p(p.exp(bx)), _s(x, beta))
    return p.where(p.gt(bx, _s(x, threshold)), x, soft)


@register(aten.softplus.default)
def softplus(a, beta=1, threshold=20):
    return map_float(lambda x: _softplus(x, beta, threshold), a)


@register(aten.softplus_backward.default)
def softplus_backward(grad, a, beta, threshold):
    def fn(g, x):
        bx = p.mul(x, _s(x, beta))
        z = p.exp(bx)
        return p.where(p.gt(bx, _s(x, threshold)), g, p.div(p.mul(g, z), p.add(z, _s(x, 1))))
    return map_float(fn, grad, a)


@register(aten.hardsigmoid.default)
def hardsigmoid(a):
    return map_float(lambda x: p.div(p.minimum(p.maximum(p.add(x, _s(x, 3)), _s(x, 0)), _s(x, 6)), _s(x, 6)), a)


@register(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad, a):
    def fn(g, x):
        inside = p.bitwise_and(p.gt(x, _s(x, -3)), p.lt(x, _s(x, 3)))
        return p.where(inside, p.div(g, _s(g, 6)), _s(g, 0))
    return map_float(fn, grad, a)


@register(aten.hardswish.default)
def hardswish(a):
    return map_float(lambda x: p.div(p.mul(x, p.minimum(p.maximum(p.add(x, _s(x, 3)), _s(x, 0)), _s(x, 6))),
                                     _s(x, 6)), a)


@register(aten.hardswish_backward.default)
def hardswish_backward(grad, a):
    def fn(g, x):
        mid = p.mul(g, p.add(p.div(x, _s(x, 3)), _s(x, 0.5)))
        out = p.where(p.lt(x, _s(x, -3)), _s(g, 0), p.where(p.le(x, _s(x, 3)), mid, g))
        return out
    return map_float(fn, grad, a)


@register(aten.hardtanh.default)
def hardtanh(a, min_val=-1, max_val=1):
    return elementwise(lambda x: p.minimum(p.maximum(x, _s(x, min_val)), _s(x, max_val)), a,
                       promotion=Promotion.NO_OPMATH)


@register(aten.hardtanh_backward.default)
def hardtanh_backward(grad, a, min_val, max_val):
    def fn(g, x):
        outside = p.bitwise_or(p.le(x, _s(x, min_val)), p.ge(x, _s(x, max_val)))
        return p.where(outside, _s(g, 0), g)
    return map_float(fn, grad, a, promotion=Promotion.DEFAULT)


@register(aten.leaky_relu.default)
def leaky_relu(a, negative_slope=0.01):
    return map_float(lambda x: p.where(p.gt(x, _s(x, 0)), x, p.mul(x, _s(x, negative_slope))), a,
                     promotion=Promotion.DEFAULT)


@register(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad, a, negative_slope, self_is_result):
    return map_float(lambda g, x: p.where(p.gt(x, _s(x, 0)), g, p.mul(g, _s(g, negative_slope))), grad, a,
                     promotion=Promotion.DEFAULT)


@register(aten.elu.default)
def elu(a, alpha=1, scale=1, input_scale=1):
    def fn(x):
        neg = p.mul(_s(x, alpha * scale), p.expm1(p.mul(x, _s(x, input_scale))))
        return p.where(p.gt(x, _s(x, 0)), p.mul(x, _s(x, scale)), neg)
    return map_float(fn, a, promotion=Promotion.DEFAULT)


@register(aten.elu_backward.default)
def elu_backward(grad, alpha, scale, input_scale, is_result, a):
    def fn(g, x):
        if is_result:
            neg = p.mul(g, p.mul(_s(x, input_scale), p.add(x, _s(x, alpha * scale))))
        else:
            neg = p.mul(g, p.mul(_s(x, input_scale * alpha * scale), p.exp(p.mul(x, _s(x, input_scale)))))
        return p.where(p.gt(x, _s(x, 0)), p.mul(g, _s(g, scale)), neg)
    return map_float(fn, grad, a, promotion=Promotion.DEFAULT)


@register(aten.celu.default)
def celu(a, alpha=1.0):
    return elu(a, alpha, 1, 1 / alpha)


@register(aten.hardshrink.default)
def hardshrink(a, lambd=0.5):
    return map_float(lambda x: p.where(p.gt(p.abs(x), _s(x, lambd)), x, _s(x, 0)), a, promotion=Promotion.DEFAULT)


@register(aten.hardshrink_backward.default)
def hardshrink_backward(grad, a, lambd):
    return map_float(lambda g, x: p.where(p.gt(p.abs(x), _s(x, lambd)), g, _s(g, 0)), grad, a,
                     promotion=Promotion.DEFAULT)


@register(aten.softshrink.default)
def softshrink(a, lambd=0.5):
    def fn(x):
        return p.where(p.gt(x, _s(x, lambd)), p.sub(x, _s(x, lambd)),
                       p.where(p.lt(x, _s(x, -lambd)), p.add(x, _s(x, lambd)), _s(x, 0)))
    return map_float(fn, a, promotion=Promotion.DEFAULT)


@register(aten.softshrink_backward.default)
def softshrink_backward(grad, a, lambd):
    return map_float(lambda g, x: p.where(p.gt(p.abs(x), _s(x, lambd)), g, _s(g, 0)), grad, a,
                     promotion=Promotion.DEFAULT)


@register(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(a):
    def fn(x):
        m = p.minimum(x, _s(x, 0))
        z = p.exp(p.neg(p.abs(x)))
        return p.sub(m, p.log1p(z)), z
    compute = computation_dtype(a.dtype)
    out, buf = fn(convert(a, compute))
    return convert(out, a.dtype), convert(buf, a.dtype)


@register(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad, a, buffer):
    def fn(g, x):
        return p.mul(g, p.sigmoid(p.neg(x)))
    return map_float(fn, grad, a, promotion=Promotion.DEFAULT)


@register(aten.glu.default)
def glu(a, dim=-1):
    dim = canonical_dim(dim, a.ndim)
    half = a.shape[dim] // 2
    first, second = p.slice(a, dim, 0, half, 1), p.slice(a, dim, half, 2 * half, 1)
    return map_float(lambda x, y: p.mul(x, p.sigmoid(y)), first, second, promotion=Promotion.DEFAULT)


@register(aten.glu_backward.default)
def glu_backward(grad, a, dim):
    dim = canonical_dim(dim, a.ndim)
    half = a.shape[dim] // 2
    first, second = p.slice(a, dim, 0, half, 1), p.slice(a, dim, half, 2 * half, 1)
    compute = computation_dtype(a.dtype)
    g, x, y = (convert(t, compute) for t in (grad, first, second))
    s = p.sigmoid(y)
    ga = p.mul(g, s)
    gb = p.mul(p.mul(g, x), p.mul(s, p.sub(_s(s, 1), s)))
    return convert(p.cat([ga, gb], dim), a.dtype)


@register(aten._prelu_kernel.default)
def prelu(a, weight):
    return map_float(lambda x, w: p.where(p.gt(x, _s(x, 0)), x, p.mul(w, x)), a, weight, promotion=Promotion.DEFAULT)


@register(aten._prelu_kernel_backward.default)
def prelu_backward(grad, a, weight):
    gx = map_float(lambda g, x, w: p.where(p.gt(x, _s(x, 0)), g, p.mul(w, g)), grad, a, weight,
                   promotion=Promotion.DEFAULT)
    gw = map_float(lambda g, x: p.where(p.gt(x, _s(x, 0)), _s(g, 0), p.mul(x, g)), grad, a,
                   promotion=Promotion.DEFAULT)
    return gx, gw


@register(aten.rrelu_with_noise.default)
def rrelu_with_noise(a, noise, lower=1 / 8, upper=1 / 3, training=False, generator=None):
    if not training:
        return leaky_relu(a, (lower + upper) / 2)
    # negative inputs get a slope drawn from U(lower, upper); eager writes the slopes into `noise`
    compute = computation_dtype(a.dtype)
    x = convert(a, compute)
    u = p.uniform(list(a.shape), dtype=compute, device=a.device)
    slope = p.add(p.mul(u, _s(u, upper - lower)), _s(u, lower))
    negative = p.le(x, _s(x, 0))
    r = p.where(negative, slope, _s(x, 1))
    noise.copy_(convert(r, noise.dtype))
    return convert(p.mul(x, r), a.dtype)


@register(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad, a, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:
        return p.mul(grad, noise)
    return leaky_relu_backward(grad, a, (lower + upper) / 2, self_is_result)


# ---- softmax -----------------------------------------------------------------------------------

def _softmax(x, dim, log):
    if x.ndim == 0:
        return _s(x, 0) if log else _s(x, 1)
    kept = [i for i in range(x.ndim) if i != dim]
    m = p.amax(x, [dim]) if guard_or_true(x.shape[dim] != 0) else full([x.shape[i] for i in kept], 0, x.dtype, x.device)
    m = p.where(p.isinf(m), full(m.shape, 0, x.dtype, x.device), m)
    shifted = p.sub(x, p.broadcast_in_dim(m, list(x.shape), kept))
    e = p.exp(shifted)
    s = p.broadcast_in_dim(p.sum(e, [dim]), list(x.shape), kept)
    return p.sub(shifted, p.log(s)) if log else p.div(e, s)


@register(aten._softmax.default)
def softmax(a, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else a.dtype
    x = convert(a, computation_dtype(a.dtype))
    return convert(_softmax(x, canonical_dim(dim, a.ndim), False), out_dtype)


@register(aten._log_softmax.default)
def log_softmax(a, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else a.dtype
    x = convert(a, computation_dtype(a.dtype))
    return convert(_softmax(x, canonical_dim(dim, a.ndim), True), out_dtype)


@register(aten._safe_softmax.default)
def safe_softmax(a, dim, dtype=None):
    x = convert(a, dtype or a.dtype)
    compute = computation_dtype(x.dtype)
    xc = convert(x, compute)
    dim = canonical_dim(dim, a.ndim)
    out = _softmax(xc, dim, False)
    all_masked = p.amin(p.eq(xc, full(xc.shape, -math.inf, compute, xc.device)), [dim])
    mask = p.broadcast_in_dim(all_masked, list(xc.shape), [i for i in range(xc.ndim) if i != dim])
    return convert(p.where(mask, full(xc.shape, 0, compute, xc.device), out), x.dtype)


@register(aten._softmax_backward_data.default)
def softmax_backward(grad, out, dim, input_dtype):
    compute = computation_dtype(grad.dtype)
    g, y = convert(grad, compute), convert(out, compute)
    dim = canonical_dim(dim, y.ndim)
    gy = p.mul(g, y)
    if y.ndim == 0:
        return convert(p.sub(gy, p.mul(y, gy)), input_dtype)
    kept = [i for i in range(y.ndim) if i != dim]
    s = p.broadcast_in_dim(p.sum(gy, [dim]), list(y.shape), kept)
    return convert(p.sub(gy, p.mul(y, s)), input_dtype)


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad, out, dim, input_dtype):
    compute = computation_dtype(grad.dtype)
    g, y = convert(grad, compute), convert(out, compute)
    if y.ndim == 0:
        return convert(p.sub(g, p.mul(p.exp(y), g)), input_dtype)
    dim = canonical_dim(dim, y.ndim)
    kept = [i for i in range(y.ndim) if i != dim]
    s = p.broadcast_in_dim(p.sum(g, [dim]), list(y.shape), kept)
    return convert(p.sub(g, p.mul(p.exp(y), s)), input_dtype)


@register(aten._trilinear.default)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    def spread(t, dims):
        for d in sorted(dims):
            shape = list(t.shape)
            shape.insert(d, 1)
            t = p.broadcast_in_dim(t, shape, [i for i in range(len(shape)) if i != d])
        return t
    a, b, c = spread(i1, expand1), spread(i2, expand2), spread(i3, expand3)
    prod = elementwise(p.mul, elementwise(p.mul, a, b), c)
    return p.sum(prod, sorted(sumdim)) if sumdim else prod


@register(aten.logit_backward.default)
def logit_backward(grad, a, eps=None):
    def fn(g, x):
        body = p.div(g, p.mul(x, p.sub(_s(x, 1), x)))
        if eps is None:
            return body
        inside = p.bitwise_and(p.ge(x, _s(x, eps)), p.le(x, _s(x, 1 - eps)))
        return p.where(inside, body, _s(x, 0))
    return map_float(fn, grad, a, promotion=Promotion.DEFAULT)
