"""Decompositions of loss functions, forward and backward.

Losses reduce with `reduction` 0 (none), 1 (mean), 2 (sum), ATen's enum. The pointwise losses round
their float16/bfloat16 intermediates where eager's kernels do ([Note: a loss rounds as eager's kernel]).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from kiln.prims.decompositions.refs import (LOW_PRECISION, Promotion, broadcast_to, computation_dtype, convert, full,
                                            map_float, reshape, result_dtype, scalar_tensor)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten
NONE, MEAN, SUM = 0, 1, 2


def _s(x, value):
    return scalar_tensor(value, x)


def _reduce(loss, reduction):
    if reduction == NONE:
        return loss
    total = p.sum(loss, list(range(loss.ndim)))
    if reduction == SUM:
        return total
    return p.div(total, full([], max(loss.numel(), 0), loss.dtype, loss.device)) if loss.numel() else \
        full([], math.nan, loss.dtype, loss.device)


def _grad_scale(grad, like, reduction):
    """The loss's gradient spread over `like`'s elements, in its dtype. A mean divides by the
    count in the computation dtype, as eager's kernels scale by a double: a float16 count rounds
    above 2048 and is inf past 65504 (a gradient of 0: a 258 x 258 float16 mse_loss, fuzz seed
    1008808)."""
    if reduction == MEAN:
        compute = computation_dtype(like.dtype)
        g = broadcast_to(convert(grad, compute), like.shape)
        return convert(p.div(g, full(like.shape, like.numel(), compute, like.device)), like.dtype)
    return broadcast_to(convert(grad, like.dtype), like.shape)


# [Note: a loss rounds as eager's kernel] Eager's pointwise loss kernels compute in the inputs' dtype:
# `a - b` of two c10::Half (or BFloat16) values is a Half, so a float16 loss rounds the difference,
# and every later operation, to float16. Computing the whole formula in float32 and rounding once
# is closer to float64 on average but not on every input, and the accuracy rule holds kiln to
# eager's own error: fuzz seed 1005385 takes mse_loss(x3, round(v) + x3), where eager rounds
# x3 - (3 + x3) = -2.999 to exactly -3 and its float16 mean is exact; kiln's float32 difference
# left the mean 2 ulps off. So each loss rounds where its eager kernel does (checked bit for bit
# against torch 2.13's CPU kernels, tests/prims/test_losses_half.py):
#   - mse_loss: the difference (CPU and CUDA kernels alike); the square, as the result.
#   - l1_loss: |a - b| rounded once is the rounded difference's magnitude: nothing to add.
#   - huber_loss, smooth_l1_loss: on the CPU every operation, with delta (beta) itself rounded to
#     the dtype, except that ATen computes huber of float16 and smooth_l1 of bfloat16 in float32
#     throughout. ATen's CUDA kernels round the difference and delta, then compute in float32
#     (opmath); older releases rounded every operation there too (not checked on a GPU here).
#   - soft_margin_loss: eager composes ATen ops (neg, mul_, exp_, log1p_), each rounding its result.
# The reduction then sums the rounded losses in float32, as eager's mean and sum of float16 do.
_CPU_IN_FLOAT = {("huber_loss", torch.float16), ("smooth_l1_loss", torch.bfloat16)}
_COMPOSED = {"soft_margin_loss"}    # eager composes ATen ops: each rounds, on every device


@dataclasses.dataclass(frozen=True)
class Rounding:
    """Where a loss's float32 intermediates are rounded to its dtype and back ([Note: a loss rounds
    as eager's kernel]): `inputs` for the difference a - b and the loss's parameter (delta, beta),
    values eager's kernel holds in the dtype; `ops` for the result of every later operation."""
    inputs: Callable
    ops: Callable


def _unrounded(x):
    return x


def _rounding(op: str, dtype: torch.dtype, device_type: str) -> Rounding:
    if dtype not in LOW_PRECISION:
        return Rounding(_unrounded, _unrounded)

    def rounded(x):
        return convert(convert(x, dtype), x.dtype)
    if op in _COMPOSED or (device_type == "cpu" and (op, dtype) not in _CPU_IN_FLOAT):
        return Rounding(rounded, rounded)
    if device_type == "cpu":
        return Rounding(_unrounded, _unrounded)
    return Rounding(rounded, _unrounded)


def _pointwise_loss(fn, reduction, a, target, op: str, device_type=None):
    """The loss `op`: `fn(x, y, rounding)` per element in the computation dtype, then reduced in it."""
    rounding = _rounding(op, result_dtype(a, target), device_type or a.device.type)
    loss = map_float(lambda x, y: fn(x, y, rounding), a, target)
    compute = computation_dtype(loss.dtype)
    return convert(_reduce(convert(loss, compute), reduction), loss.dtype)


@register(aten.mse_loss.default)
def mse_loss(a, target, reduction=MEAN):
    def fn(x, y, r):
        d = r.inputs(p.sub(x, y))
        return p.mul(d, d)
    return _pointwise_loss(fn, reduction, a, target, "mse_loss")


@register(aten.mse_loss_backward.default)
def mse_loss_backward(grad, a, target, reduction):
    def fn(x, y):
        return p.mul(_s(x, 2), p.sub(x, y))
    d = map_float(fn, a, target)
    return p.mul(_grad_scale(grad, d, reduction), d)


@register(aten.l1_loss.default)
def l1_loss(a, target, reduction=MEAN):
    return _pointwise_loss(lambda x, y, r: p.abs(p.sub(x, y)), reduction, a, target, "l1_loss")


@register(aten.huber_loss.default)
def huber_loss(a, target, reduction=MEAN, delta=1.0, device_type=None):
    def fn(x, y, r):
        d = p.abs(r.inputs(p.sub(x, y)))
        k = r.inputs(_s(x, delta))
        quad = r.ops(p.mul(r.ops(p.mul(_s(x, 0.5), d)), d))
        linear = r.ops(p.mul(k, r.ops(p.sub(d, r.ops(p.mul(_s(x, 0.5), k))))))
        return p.where(p.lt(d, k), quad, linear)
    return _pointwise_loss(fn, reduction, a, target, "huber_loss", device_type)


@register(aten.huber_loss_backward.default)
def huber_loss_backward(grad, a, target, reduction, delta):
    def fn(x, y):
        d = p.sub(x, y)
        return p.where(p.lt(d, _s(x, -delta)), _s(x, -delta), p.where(p.gt(d, _s(x, delta)), _s(x, delta), d))
    d = map_float(fn, a, target)
    return p.mul(_grad_scale(grad, d, reduction), d)


@register(aten.smooth_l1_loss.default)
def smooth_l1_loss(a, target, reduction=MEAN, beta=1.0, device_type=None):
    def fn(x, y, r):
        d = p.abs(r.inputs(p.sub(x, y)))
        if beta == 0:
            return d
        b = r.inputs(_s(x, beta))
        quad = r.ops(p.div(r.ops(p.mul(r.ops(p.mul(_s(x, 0.5), d)), d)), b))
        return p.where(p.lt(d, b), quad, r.ops(p.sub(d, r.ops(p.mul(_s(x, 0.5), b)))))
    return _pointwise_loss(fn, reduction, a, target, "smooth_l1_loss", device_type)


@register(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad, a, target, reduction, beta):
    def fn(x, y):
        d = p.sub(x, y)
        sign = p.sub(p.convert_element_type(p.gt(d, _s(x, 0)), x.dtype), p.convert_element_type(p.lt(d, _s(x, 0)),
                                                                                                   x.dtype))
        if beta == 0:
            return sign
        return p.where(p.lt(p.abs(d), _s(x, beta)), p.div(d, _s(x, beta)), sign)
    d = map_float(fn, a, target)
    return p.mul(_grad_scale(grad, d, reduction), d)


@register(aten.soft_margin_loss.default)
def soft_margin_loss(a, target, reduction=MEAN):
    def fn(x, y, r):
        return p.log1p(r.ops(p.exp(r.ops(p.neg(p.mul(x, y))))))
    return _pointwise_loss(fn, reduction, a, target, "soft_margin_loss")


@register(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad, a, target, reduction):
    def fn(x, y):
        z = p.exp(p.neg(p.mul(x, y)))
        return p.div(p.neg(p.mul(y, z)), p.add(_s(x, 1), z))
    d = map_float(fn, a, target)
    return p.mul(_grad_scale(grad, d, reduction), d)


@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(a, target, weight=None, reduction=MEAN):
    def fn(x, y):
        log_x = p.maximum(p.log(x), _s(x, -100))
        log_1mx = p.maximum(p.log1p(p.neg(x)), _s(x, -100))
        return p.neg(p.add(p.mul(y, log_x), p.mul(p.sub(_s(x, 1), y), log_1mx)))
    loss = map_float(fn, a, target)
    if weight is not None:
        loss = p.mul(loss, broadcast_to(convert(weight, loss.dtype), loss.shape))
    return _reduce(loss, reduction)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, a, target, weight=None, reduction=MEAN):
    def fn(x, y):
        eps = _s(x, 1e-12)
        return p.div(p.sub(x, y), p.maximum(p.mul(p.sub(_s(x, 1), x), x), eps))
    d = map_float(fn, a, target)
    if weight is not None:
        d = p.mul(d, broadcast_to(convert(weight, d.dtype), d.shape))
    return p.mul(_grad_scale(grad, d, reduction), d)


@register(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(a, target, weight=None, pos_weight=None, reduction=MEAN):
    def fn(x, y):
        log_sig = p.sub(p.minimum(x, _s(x, 0)), p.log1p(p.exp(p.neg(p.abs(x)))))      # log(sigmoid(x))
        log_sig_neg = p.sub(log_sig, x)                                               # log(1 - sigmoid(x))
        return p.neg(p.add(p.mul(y, log_sig), p.mul(p.sub(_s(x, 1), y), log_sig_neg)))
    if pos_weight is not None:
        def fn(x, y, pw):  # noqa: F811  (the weighted form)
            log_sig = p.sub(p.minimum(x, _s(x, 0)), p.log1p(p.exp(p.neg(p.abs(x)))))
            return p.neg(p.add(p.mul(p.mul(pw, y), log_sig), p.mul(p.sub(_s(x, 1), y), p.sub(log_sig, x))))
        loss = map_float(fn, a, target, pos_weight)
    else:
        loss = map_float(fn, a, target)
    if weight is not None:
        loss = p.mul(loss, broadcast_to(convert(weight, loss.dtype), loss.shape))
    return _reduce(loss, reduction)


def _nll(a, target, weight, reduction, ignore_index):
    """Shared by nll_loss_forward and nll_loss2d_forward: class dim is 1 (or 0 for 1-d input)."""
    class_dim = 0 if a.ndim == 1 else 1
    t = convert(target, torch.int64)
    valid = p.ne(t, full(t.shape, ignore_index, torch.int64, t.device))
    safe_t = p.where(valid, t, full(t.shape, 0, torch.int64, t.device))
    if a.ndim > 1:
        index = p.broadcast_in_dim(safe_t, _with_one(a.shape, class_dim), _others(a.ndim, class_dim))
        picked = p.squeeze(p.gather(a, class_dim, index), [class_dim])
    else:
        picked = _pick_1d(a, safe_t)
    w = p.index(convert(weight, a.dtype), [safe_t]) if weight is not None else full(t.shape, 1, a.dtype, a.device)
    w = p.where(valid, w, full(t.shape, 0, a.dtype, a.device))
    loss = p.neg(p.mul(picked, w))
    total_weight = p.sum(w, list(range(w.ndim)))
    if reduction == NONE:
        return loss, full([], 0, a.dtype, a.device)
    total = p.sum(loss, list(range(loss.ndim)))
    if reduction == SUM:
        return total, total_weight
    return p.div(total, total_weight), total_weight


def _with_one(shape, dim):
    s = list(shape)
    s[dim] = 1
    return s


def _others(ndim, dim):
    return [i for i in range(ndim) if i != dim]


def _pick_1d(a, t):
    return p.view(p.index(a, [p.view(t, [1])]), [])


@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(a, target, weight, reduction, ignore_index):
    return _nll(a, target, weight, reduction, ignore_index)


@register(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad, a, target, weight, reduction, ignore_index, total_weight):
    class_dim = 0 if a.ndim == 1 else 1
    t = convert(target, torch.int64)
    valid = p.ne(t, full(t.shape, ignore_index, torch.int64, t.device))
    safe_t = p.where(valid, t, full(t.shape, 0, torch.int64, t.device))
    w = p.index(convert(weight, a.dtype), [safe_t]) if weight is not None else full(t.shape, 1, a.dtype, a.device)
    w = p.where(valid, w, full(t.shape, 0, a.dtype, a.device))
    g = convert(grad, a.dtype)
    if reduction == NONE:
        coef = p.neg(p.mul(broadcast_to(g, w.shape), w))
    else:
        g = broadcast_to(g, w.shape) if g.ndim == 0 else g
        coef = p.neg(p.mul(g, w))
        if reduction == MEAN:
            coef = p.div(coef, broadcast_to(convert(total_weight, a.dtype), coef.shape))
    zeros = full(a.shape, 0, a.dtype, a.device)
    if a.ndim == 1:
        return p.index_put(zeros, [p.view(safe_t, [1])], p.view(coef, [1]), False)
    idx = p.broadcast_in_dim(safe_t, _with_one(a.shape, class_dim), _others(a.ndim, class_dim))
    vals = p.broadcast_in_dim(coef, _with_one(a.shape, class_dim), _others(a.ndim, class_dim))
    return p.scatter(zeros, class_dim, idx, vals)


def _margin_terms(a, target, p_, margin, weight):
    """(per-element hinge terms z (N, C) before the power, the mask of active terms, x2d, w_y)."""
    x = a if a.ndim == 2 else p.view(a, [1, a.numel()])
    n, c = x.shape
    t = p.view(convert(target, torch.int64), [n])
    x_y = p.squeeze(p.gather(x, 1, p.view(t, [n, 1])), [1])
    z = p.add(p.sub(full([n, c], margin, x.dtype, x.device), p.broadcast_in_dim(x_y, [n, c], [0])), x)
    cls = p.broadcast_in_dim(p.iota(c, start=0, step=1, dtype=torch.int64, device=x.device), [n, c], [1])
    not_target = p.ne(cls, p.broadcast_in_dim(t, [n, c], [0]))
    active = p.bitwise_and(not_target, p.gt(z, full([n, c], 0, x.dtype, x.device)))
    w_y = p.index(convert(weight, x.dtype), [t]) if weight is not None else None
    return z, active, x, w_y, t


@register(aten.multi_margin_loss.default)
def multi_margin_loss(a, target, p_=1, margin=1, weight=None, reduction=MEAN):
    z, active, x, w_y, _ = _margin_terms(a, target, p_, margin, weight)
    n, c = x.shape
    zero = full([n, c], 0, x.dtype, x.device)
    h = p.where(active, z if p_ == 1 else p.mul(z, z), zero)
    if w_y is not None:
        h = p.mul(h, p.broadcast_in_dim(w_y, [n, c], [0]))
    per_sample = p.div(p.sum(h, [1]), full([n], c, x.dtype, x.device))
    if reduction == NONE:
        return per_sample if a.ndim == 2 else p.view(per_sample, [])
    return _reduce(per_sample if a.ndim == 2 else p.view(per_sample, []), reduction)


@register(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad, a, target, p_, margin, weight=None, reduction=MEAN):
    z, active, x, w_y, t = _margin_terms(a, target, p_, margin, weight)
    n, c = x.shape
    zero = full([n, c], 0, x.dtype, x.device)
    d = p.where(active, full([n, c], 1, x.dtype, x.device) if p_ == 1 else p.mul(_s(z, 2), z), zero)
    if w_y is not None:
        d = p.mul(d, p.broadcast_in_dim(w_y, [n, c], [0]))
    d = p.div(d, full([n, c], c, x.dtype, x.device))
    # the target column receives minus the sum of the others
    total = p.sum(d, [1])
    cls = p.broadcast_in_dim(p.iota(c, start=0, step=1, dtype=torch.int64, device=x.device), [n, c], [1])
    is_target = p.eq(cls, p.broadcast_in_dim(t, [n, c], [0]))
    d = p.where(is_target, p.neg(p.broadcast_in_dim(total, [n, c], [0])), d)
    g = convert(grad, x.dtype)
    if reduction == NONE and g.ndim:
        g = p.broadcast_in_dim(p.view(g, [n]), [n, c], [0])
    else:
        g = broadcast_to(p.view(g, []) if g.numel() == 1 else g, [n, c])
        if reduction == MEAN:
            g = p.div(g, full([n, c], n, x.dtype, x.device))
    out = p.mul(g, d)
    return out if a.ndim == 2 else p.view(out, list(a.shape))


def _multilabel_terms(a, target):
    """(x (N, C), active hinge mask (N, Ci, Cj) as float, hinge values, safe targets, valid, is_target)."""
    x = a if a.ndim == 2 else p.view(a, [1, a.numel()])
    n, c = x.shape
    t = p.view(convert(target, torch.int64), [n, c])
    # targets are read up to the first -1
    valid = p.convert_element_type(p.cumprod(p.convert_element_type(
        p.ne(t, full([n, c], -1, torch.int64, x.device)), torch.int64), 1), torch.bool)
    safe = p.where(valid, t, full([n, c], 0, torch.int64, x.device))
    is_target = p.scatter_reduce(full([n, c], 0, x.dtype, x.device), 1, safe, p.convert_element_type(valid, x.dtype),
                                 "amax", True)
    x_t = p.gather(x, 1, safe)                                                  # (N, Ci)
    shape = [n, c, c]
    hinge = p.add(p.sub(full(shape, 1, x.dtype, x.device), p.broadcast_in_dim(x_t, shape, [0, 1])),
                  p.broadcast_in_dim(x, shape, [0, 2]))
    active = p.bitwise_and(p.bitwise_and(p.broadcast_in_dim(valid, shape, [0, 1]),
                                         p.broadcast_in_dim(p.eq(is_target, full([n, c], 0, x.dtype, x.device)),
                                                            shape, [0, 2])),
                           p.gt(hinge, full(shape, 0, x.dtype, x.device)))
    return x, active, hinge, safe, valid, is_target


@register(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(a, target, reduction):
    x, active, hinge, _, _, is_target = _multilabel_terms(a, target)
    n, c = x.shape
    per_sample = p.div(p.sum(p.where(active, hinge, full(hinge.shape, 0, x.dtype, x.device)), [1, 2]),
                       full([n], c, x.dtype, x.device))
    if a.ndim < 2:
        per_sample = p.view(per_sample, [])
        is_target = p.view(is_target, list(a.shape))
    out = per_sample if reduction == NONE else _reduce(per_sample, reduction)
    return out, is_target


@register(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad, a, target, reduction, is_target):
    x, active, _, safe, valid, _ = _multilabel_terms(a, target)
    n, c = x.shape
    af = p.div(p.convert_element_type(active, x.dtype), full(active.shape, c, x.dtype, x.device))
    d = p.sum(af, [1])                                                           # + for each non-target j
    minus = p.where(valid, p.neg(p.sum(af, [2])), full([n, c], 0, x.dtype, x.device))
    d = p.scatter_reduce(d, 1, safe, minus, "sum", True)                         # - at each target
    g = convert(grad, x.dtype)
    if reduction == NONE and g.ndim:
        g = p.broadcast_in_dim(p.view(g, [n]), [n, c], [0])
    else:
        g = broadcast_to(p.view(g, []), [n, c])
        if reduction == MEAN:
            g = p.div(g, full([n, c], n, x.dtype, x.device))
    out = p.mul(g, d)
    return out if a.ndim == 2 else p.view(out, list(a.shape))
