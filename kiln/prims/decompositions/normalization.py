"""Decompositions of layer, batch and group normalization (forward and backward) and dropout.

Statistics are computed in float32 for float16/bfloat16 inputs (eager's accumulation type).
Batch norm's running statistics are updated with `copy_` into the running buffers, exactly as
eager mutates them; aot/ functionalizes that copy into an epilogue.
"""
from __future__ import annotations

import functools

import torch

from kiln.prims.decompositions.refs import (broadcast_to, computation_dtype, convert, full, has_elements, numel, reshape,
                                            shifted_mean)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


def _bcast(t, shape, dims):
    return p.broadcast_in_dim(t, list(shape), dims)


def _stats(x, dims, shifted: bool = False):
    """(mean, biased variance) over dims, without keepdim. `shifted`: the mean of [Note: shifted mean]
    (batch and group norm: their statistics run over dims where equal values come from broadcast
    inputs, or from a layer norm over one element, fuzz seed 2610; layer norm on the CPU, where the
    row's first element is one scalar load a row, hoisted out of the row's loops. Layer norm on
    CUDA keeps the plain mean, whose row kernel reads only whole vectors (the sm90 bandwidth test
    saw a scalar load of each row's first element), so it normalizes a row of equal values to
    noise / sqrt(eps) where eager's Welford gives exactly 0)."""
    n = numel([x.shape[d] for d in dims])
    if shifted and has_elements(x, dims):
        mean = shifted_mean(x, dims, n)
    else:
        mean = p.div(p.sum(x, dims), full([s for i, s in enumerate(x.shape) if i not in dims], n, x.dtype, x.device))
    kept = [i for i in range(x.ndim) if i not in dims]
    d = p.sub(x, _bcast(mean, x.shape, kept))
    var = p.div(p.sum(p.mul(d, d), dims), full(mean.shape, n, x.dtype, x.device))
    return mean, var


def _rsqrt_eps(var, eps):
    return p.rsqrt(p.add(var, full(var.shape, eps, var.dtype, var.device)))


@register(aten.native_layer_norm.default)
def native_layer_norm(a, normalized_shape, weight, bias, eps, device_type=None):
    """Statistics in two passes (mean, then the mean of squared deviations): the fastest form, and
    as accurate as eager's Welford. `device_type`: decompose as for that device instead of `a`'s
    (the offline CUDA compiles trace on the CPU)."""
    return _layer_norm(a, normalized_shape, weight, bias, eps, _layer_norm_stats(device_type or a.device.type))


def _layer_norm_stats(device_type: str):
    """Two-pass statistics, the mean shifted by each row's first element on the CPU ([Note: shifted
    mean]: a row of equal values normalizes to exactly 0, as in eager)."""
    return functools.partial(_stats, shifted=device_type == "cpu")


@register(aten.native_layer_norm.default, numerics="eager")
def native_layer_norm_in_eagers_order(a, normalized_shape, weight, bias, eps):
    """On CUDA, one `var_mean`: Triton kernels reduce it in the order of eager's own layer_norm
    kernel, so a compiled model normalizes bit for bit as eager does ([Note: eager's layer_norm
    statistics] in kiln/codegen/triton/reductions.py), at about two thirds of the two-pass kernel's
    bandwidth. Elsewhere two passes."""
    def stats(x, dims):
        return p.var_mean(x, dims)[::-1] if a.device.type == "cuda" else _layer_norm_stats(a.device.type)(x, dims)
    return _layer_norm(a, normalized_shape, weight, bias, eps, stats)


def _layer_norm(a, normalized_shape, weight, bias, eps, stats):
    axis = a.ndim - len(normalized_shape)
    dims = list(range(axis, a.ndim))
    kept = list(range(axis))
    x = convert(a, computation_dtype(a.dtype))
    mean, var = stats(x, dims)
    rstd = _rsqrt_eps(var, eps)
    out = p.mul(p.sub(x, _bcast(mean, x.shape, kept)), _bcast(rstd, x.shape, kept))
    if weight is not None:
        out = p.mul(out, broadcast_to(convert(weight, x.dtype), x.shape))
    if bias is not None:
        out = p.add(out, broadcast_to(convert(bias, x.dtype), x.shape))
    stat_shape = list(a.shape[:axis]) + [1] * len(normalized_shape)
    # ATen's dtype for mean and rstd: the accumulation type on CUDA, and on the CPU when the
    # weight is float32 and the input half ("mixed type"); else the input's. Rounded to float16,
    # the saved statistics differ from the forward's own, and a layer norm over 2 elements
    # (output +-1, gradient ~0) got a gradient of 1e-3 where eager's is 1e-7 (fuzz seed 1001487
    # of --triton-interpret --half, on the C++ path too).
    mixed = any(t is not None and t.dtype != a.dtype for t in (weight, bias))
    stat_dtype = x.dtype if a.device.type == "cuda" or mixed else a.dtype
    return (convert(out, a.dtype), convert(p.view(mean, stat_shape), stat_dtype),
            convert(p.view(rstd, stat_shape), stat_dtype))


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, a, normalized_shape, mean, rstd, weight, bias, output_mask):
    axis = a.ndim - len(normalized_shape)
    inner = list(range(axis, a.ndim))
    outer = list(range(axis))
    compute = computation_dtype(a.dtype)
    x, g = convert(a, compute), convert(grad, compute)
    m = broadcast_to(convert(mean, compute), x.shape)
    r = broadcast_to(convert(rstd, compute), x.shape)
    x_hat = p.mul(p.sub(x, m), r)
    gw = p.mul(g, broadcast_to(convert(weight, compute), x.shape)) if weight is not None else g
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        n = numel(normalized_shape)
        sum_g = _bcast(p.sum(gw, inner), x.shape, outer)
        sum_gx = _bcast(p.sum(p.mul(gw, x_hat), inner), x.shape, outer)
        inner_term = p.sub(p.sub(p.mul(gw, full(x.shape, n, compute, x.device)), sum_g), p.mul(x_hat, sum_gx))
        grad_input = convert(p.mul(p.div(r, full(x.shape, n, compute, x.device)), inner_term), a.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = convert(p.sum(p.mul(g, x_hat), outer), weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = convert(p.sum(g, outer), bias.dtype)
    return grad_input, grad_weight, grad_bias


def _channel_shape(a):
    return [a.shape[1]]


def _batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps, functional=False):
    compute = computation_dtype(a.dtype)
    x = convert(a, compute)
    reduce_dims = [0] + list(range(2, a.ndim))
    n = numel([a.shape[d] for d in reduce_dims])
    if training:
        mean, var = _stats(x, reduce_dims, shifted=True)
        invstd = _rsqrt_eps(var, eps)
        new_mean = new_var = None
        if running_mean is not None:
            unbiased = p.mul(var, full(var.shape, n / max(n - 1, 1), compute, a.device))
            keep = full(mean.shape, 1 - momentum, compute, a.device)
            mom = full(mean.shape, momentum, compute, a.device)
            new_mean = convert(p.add(p.mul(keep, convert(running_mean, compute)), p.mul(mom, mean)),
                               running_mean.dtype)
            new_var = convert(p.add(p.mul(keep, convert(running_var, compute)), p.mul(mom, unbiased)),
                              running_var.dtype)
        save_mean, save_invstd = mean, invstd
    else:
        mean, invstd = convert(running_mean, compute), _rsqrt_eps(convert(running_var, compute), eps)
        save_mean = save_invstd = None
        new_mean, new_var = running_mean, running_var
    out = p.mul(p.sub(x, _bcast(mean, x.shape, [1])), _bcast(invstd, x.shape, [1]))
    if weight is not None:
        out = p.mul(out, _bcast(convert(weight, compute), x.shape, [1]))
    if bias is not None:
        out = p.add(out, _bcast(convert(bias, compute), x.shape, [1]))
    return convert(out, a.dtype), save_mean, save_invstd, new_mean, new_var


def _empty_stat(a):
    """The empty statistics eval mode returns: in the input's dtype on the CPU (a bfloat16 input's
    are bfloat16 there), in the computation dtype elsewhere, as CUDA's kernel keeps them."""
    return full([0], 0, a.dtype if a.device.type == "cpu" else computation_dtype(a.dtype), a.device)


@register(aten.native_batch_norm.default)
def native_batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps):
    out, save_mean, save_invstd, new_mean, new_var = _batch_norm(a, weight, bias, running_mean, running_var,
                                                                 training, momentum, eps)
    if training and running_mean is not None:
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
    if not training:
        return out, _empty_stat(a), _empty_stat(a)
    # eager keeps the statistics in the running buffers' dtype (the input's when there are none)
    stat_dtype = running_mean.dtype if running_mean is not None else a.dtype
    return out, convert(save_mean, stat_dtype), convert(save_invstd, stat_dtype)


@register(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(a, weight, bias, running_mean, running_var, training, momentum, eps):
    return native_batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(a, weight, bias, training, momentum, eps):
    return native_batch_norm(a, weight, bias, None, None, training, momentum, eps)


@register(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(a, weight, bias, running_mean, running_var, momentum, eps):
    return native_batch_norm(a, weight, bias, running_mean, running_var, False, momentum, eps)


@register(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(a, weight, bias, running_mean, running_var, training, momentum, eps):
    out, save_mean, save_invstd, new_mean, new_var = _batch_norm(a, weight, bias, running_mean, running_var,
                                                                 training, momentum, eps)
    if not training:
        save_mean = save_invstd = _empty_stat(a)
    return out, save_mean, save_invstd, new_mean, new_var


@register(aten._batch_norm_with_update.default)
def batch_norm_with_update(a, weight, bias, running_mean, running_var, momentum, eps):
    out, save_mean, save_invstd = native_batch_norm(a, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, save_mean, save_invstd, full([0], 0, torch.uint8, a.device)


@register(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(a, weight, bias, running_mean, running_var, momentum, eps):
    out, save_mean, save_invstd, new_mean, new_var = _batch_norm(a, weight, bias, running_mean, running_var,
                                                                 True, momentum, eps)
    return out, save_mean, save_invstd, full([0], 0, torch.uint8, a.device), new_mean, new_var


@register(aten._batch_norm_no_update.default)
def batch_norm_no_update(a, weight, bias, running_mean, running_var, momentum, eps):
    out, save_mean, save_invstd = native_batch_norm(a, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, save_mean, save_invstd, full([0], 0, torch.uint8, a.device)


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad, a, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    compute = computation_dtype(a.dtype)
    x, g = convert(a, compute), convert(grad, compute)
    reduce_dims = [0] + list(range(2, a.ndim))
    n = numel([a.shape[d] for d in reduce_dims])
    if train:
        mean, invstd = convert(save_mean, compute), convert(save_invstd, compute)
    else:
        mean = convert(running_mean, compute)
        invstd = _rsqrt_eps(convert(running_var, compute), eps)
    w = convert(weight, compute) if weight is not None else full([a.shape[1]], 1, compute, a.device)
    x_mu = p.sub(x, _bcast(mean, x.shape, [1]))
    sum_g = p.sum(g, reduce_dims)
    dot = p.sum(p.mul(g, x_mu), reduce_dims)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            nn = full(mean.shape, n, compute, a.device)
            proj = p.div(p.mul(dot, p.mul(invstd, invstd)), nn)
            g_mean = p.div(sum_g, nn)
            gi = p.sub(p.sub(g, p.mul(x_mu, _bcast(proj, x.shape, [1]))), _bcast(g_mean, x.shape, [1]))
            grad_input = p.mul(gi, _bcast(p.mul(invstd, w), x.shape, [1]))
        else:
            grad_input = p.mul(g, _bcast(p.mul(invstd, w), x.shape, [1]))
        grad_input = convert(grad_input, a.dtype)
    if output_mask[1]:
        grad_weight = convert(p.mul(dot, invstd), weight.dtype if weight is not None else a.dtype)
    if output_mask[2]:
        grad_bias = convert(sum_g, weight.dtype if weight is not None else a.dtype)
    return grad_input, grad_weight, grad_bias


@register(aten.batch_norm_backward.default)
def batch_norm_backward(grad, a, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask,
                        reserve):
    return native_batch_norm_backward(grad, a, weight, running_mean, running_var, save_mean, save_var, update, eps,
                                      output_mask)


# [Note: cuDNN and MIOpen batch norm] On CUDA, at::batch_norm picks cuDNN (`_batch_norm_impl_index`
# is CompositeImplicit, so a dispatch mode sees `cudnn_batch_norm`, not native_batch_norm), MIOpen on
# ROCm. Their conventions (aten/src/ATen/native/cudnn/BatchNorm.cpp, derivatives.yaml): the saved
# statistics are the batch mean and the inverse standard deviation 1/sqrt(var + eps) (named save_var
# but cuDNN's "SaveInvVariance"), in the weight's dtype, empty in eval; the running buffers are
# updated in place with the unbiased variance, as native; cuDNN adds a uint8 reserve workspace that
# only its own backward reads. Decomposed, the reserve is empty: the backward below ignores it.
# The backward always trains (autograd calls native_batch_norm_backward for eval) and computes all
# three gradients; note its argument order, input before grad_output.

def _cudnn_style_batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps):
    out, save_mean, save_invstd, new_mean, new_var = _batch_norm(a, weight, bias, running_mean, running_var,
                                                                 training, momentum, eps)
    if not training:
        empty = full([0], 0, weight.dtype, a.device)
        return out, empty, empty
    if running_mean is not None:
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
    return out, convert(save_mean, weight.dtype), convert(save_invstd, weight.dtype)


@register(aten.cudnn_batch_norm.default)
def cudnn_batch_norm(a, weight, bias, running_mean, running_var, training, exponential_average_factor, epsilon):
    out, save_mean, save_invstd = _cudnn_style_batch_norm(a, weight, bias, running_mean, running_var, training,
                                                          exponential_average_factor, epsilon)
    return out, save_mean, save_invstd, full([0], 0, torch.uint8, a.device)


@register(aten.miopen_batch_norm.default)
def miopen_batch_norm(a, weight, bias, running_mean, running_var, training, exponential_average_factor, epsilon):
    return _cudnn_style_batch_norm(a, weight, bias, running_mean, running_var, training,
                                   exponential_average_factor, epsilon)


@register(aten.cudnn_batch_norm_backward.default)
def cudnn_batch_norm_backward(a, grad, weight, running_mean, running_var, save_mean, save_var, epsilon,
                              reserve):
    return native_batch_norm_backward(grad, a, weight, running_mean, running_var, save_mean, save_var, True,
                                      epsilon, [True, True, True])


@register(aten.miopen_batch_norm_backward.default)
def miopen_batch_norm_backward(a, grad, weight, running_mean, running_var, save_mean, save_var, epsilon):
    return native_batch_norm_backward(grad, a, weight, running_mean, running_var, save_mean, save_var, True,
                                      epsilon, [True, True, True])


# On CUDA, at::rms_norm (F.rms_norm, nn.RMSNorm, timm's RmsNorm) calls `_fused_rms_norm`, whose backward
# has CUDA kernels only; on CPU it is a composite of ordinary ops. rstd is 1/sqrt(mean(x^2) + eps) in
# the computation dtype, shaped like layer norm's statistics; eps None means the computation dtype's
# machine epsilon. Not in torch 2.11's every build: registered only where the op exists.
if hasattr(aten, "_fused_rms_norm") and hasattr(aten, "_fused_rms_norm_backward"):
    @register(aten._fused_rms_norm.default)
    def fused_rms_norm(a, normalized_shape, weight, eps):
        axis = a.ndim - len(normalized_shape)
        dims, kept = list(range(axis, a.ndim)), list(range(axis))
        compute = computation_dtype(a.dtype)
        x = convert(a, compute)
        mean_square = p.div(p.sum(p.mul(x, x), dims), full(a.shape[:axis], numel(normalized_shape), compute, a.device))
        rstd = _rsqrt_eps(mean_square, torch.finfo(compute).eps if eps is None else eps)
        out = p.mul(x, _bcast(rstd, x.shape, kept))
        if weight is not None:
            out = p.mul(out, broadcast_to(convert(weight, compute), x.shape))
        return convert(out, a.dtype), p.view(rstd, list(a.shape[:axis]) + [1] * len(normalized_shape))

    @register(aten._fused_rms_norm_backward.default)
    def fused_rms_norm_backward(grad, a, normalized_shape, rstd, weight, output_mask):
        axis = a.ndim - len(normalized_shape)
        inner, outer = list(range(axis, a.ndim)), list(range(axis))
        compute = computation_dtype(a.dtype)
        x, g = convert(a, compute), convert(grad, compute)
        r = broadcast_to(convert(rstd, compute), x.shape)
        x_hat = p.mul(x, r)
        grad_input = grad_weight = None
        if output_mask[0]:
            gw = p.mul(g, broadcast_to(convert(weight, compute), x.shape)) if weight is not None else g
            n = full(x.shape, numel(normalized_shape), compute, a.device)
            dot = _bcast(p.sum(p.mul(gw, x_hat), inner), x.shape, outer)
            grad_input = convert(p.mul(r, p.sub(gw, p.div(p.mul(x_hat, dot), n))), a.dtype)
        if output_mask[1] and weight is not None:
            grad_weight = convert(p.sum(p.mul(g, x_hat), outer), weight.dtype)
        return grad_input, grad_weight


@register(aten.native_group_norm.default)
def native_group_norm(a, weight, bias, N, C, HxW, group, eps):
    compute = computation_dtype(a.dtype)
    x = reshape(convert(a, compute), [N, group, -1])
    mean, var = _stats(x, [2], shifted=True)
    rstd = _rsqrt_eps(var, eps)
    out = p.mul(p.sub(x, _bcast(mean, x.shape, [0, 1])), _bcast(rstd, x.shape, [0, 1]))
    out = reshape(out, [N, C, -1])
    if weight is not None:
        out = p.mul(out, _bcast(convert(weight, compute), out.shape, [1]))
    if bias is not None:
        out = p.add(out, _bcast(convert(bias, compute), out.shape, [1]))
    return convert(reshape(out, list(a.shape)), a.dtype), convert(mean, a.dtype), convert(rstd, a.dtype)


@register(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, a, mean, rstd, weight, N, C, HxW, group, output_mask):
    compute = computation_dtype(a.dtype)
    x = reshape(convert(a, compute), [N, group, C // group, HxW])
    g = reshape(convert(grad, compute), [N, group, C // group, HxW])
    m = _bcast(convert(mean, compute), x.shape, [0, 1])
    r = _bcast(convert(rstd, compute), x.shape, [0, 1])
    x_hat = p.mul(p.sub(x, m), r)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        w = _bcast(reshape(convert(weight, compute), [group, C // group]), x.shape, [1, 2]) if weight is not None \
            else full(x.shape, 1, compute, a.device)
        gw = p.mul(g, w)
        n = (C // group) * HxW
        sum_g = _bcast(p.sum(gw, [2, 3]), x.shape, [0, 1])
        sum_gx = _bcast(p.sum(p.mul(gw, x_hat), [2, 3]), x.shape, [0, 1])
        term = p.sub(p.sub(p.mul(gw, full(x.shape, n, compute, a.device)), sum_g), p.mul(x_hat, sum_gx))
        grad_input = convert(reshape(p.mul(p.div(r, full(x.shape, n, compute, a.device)), term), list(a.shape)),
                             a.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = convert(reshape(p.sum(p.mul(g, x_hat), [0, 3]), [C]), weight.dtype)
    if output_mask[2]:
        grad_bias = convert(reshape(p.sum(g, [0, 3]), [C]), a.dtype)
    return grad_input, grad_weight, grad_bias


@register(aten.native_dropout.default)
def native_dropout(a, prob, train):
    if not train or prob == 0:
        return p.copy_strided(a, list(a.stride())), full(a.shape, True, torch.bool, a.device)
    if prob == 1:
        return full(a.shape, 0, a.dtype, a.device), full(a.shape, False, torch.bool, a.device)
    keep = p.ge(p.uniform(list(a.shape), dtype=torch.float32, device=a.device),
                full(a.shape, prob, torch.float32, a.device))
    scale = 1.0 / (1.0 - prob)
    out = p.mul(p.mul(convert(a, computation_dtype(a.dtype)), p.convert_element_type(keep, computation_dtype(a.dtype))),
                full(a.shape, scale, computation_dtype(a.dtype), a.device))
    return convert(out, a.dtype), keep


@register(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    if not (grad.dtype.is_floating_point or grad.dtype.is_complex):
        grad = convert(grad, torch.get_default_dtype())   # eager: grad * mask * scale promotes
    compute = computation_dtype(grad.dtype)
    out = p.mul(p.mul(convert(grad, compute), p.convert_element_type(mask, compute)),
                full(grad.shape, scale, compute, grad.device))
    return convert(out, grad.dtype)
