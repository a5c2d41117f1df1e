"""Decompositions of ATen's random ops onto the `uniform` and `normal` prims.

Each draws standard samples and transforms them (inverse CDFs, comparisons, sorting), so a
backend implements two random prims (aot/ makes them functional with a seed and offset). The
values differ from eager's draws; the op sweep compares random ops by shape and dtype.
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import Promotion, broadcast_to, computation_dtype, convert, map_float, scalar_tensor
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten


def _s(x, value):
    return scalar_tensor(value, x)


def _uniform_like(a, dtype=None):
    return p.uniform(list(a.shape), dtype=dtype or computation_dtype(a.dtype), device=a.device)


@register(aten.uniform.default)
def uniform(a, low=0.0, high=1.0, *, generator=None):
    u = _uniform_like(a)
    return convert(p.add(p.mul(u, _s(u, high - low)), _s(u, low)), a.dtype)


@register(aten.normal_functional.default)
def normal_functional(a, mean=0.0, std=1.0, *, generator=None):
    z = p.normal(list(a.shape), dtype=computation_dtype(a.dtype), device=a.device)
    return convert(p.add(p.mul(z, _s(z, std)), _s(z, mean)), a.dtype)


@register(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor)
def normal_tensor(mean, std, *, generator=None):
    return map_float(lambda m, s: p.add(p.mul(p.normal(list(m.shape), dtype=m.dtype, device=m.device), s), m),
                     mean, std, promotion=Promotion.DEFAULT)


@register(aten.normal.float_float)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    z = p.normal(list(size), dtype=dtype, device=torch.device(device or "cpu"))
    return p.add(p.mul(z, _s(z, std)), _s(z, mean))


@register(aten.rand.default)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    return p.uniform(list(size), dtype=dtype or torch.get_default_dtype(), device=torch.device(device or "cpu"))


@register(aten.randn.default)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    return p.normal(list(size), dtype=dtype or torch.get_default_dtype(), device=torch.device(device or "cpu"))


@register(aten.rand_like.default)
def rand_like(a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, generator=None):
    return p.uniform(list(a.shape), dtype=dtype or a.dtype, device=torch.device(device) if device else a.device)


@register(aten.randn_like.default)
def randn_like(a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, generator=None):
    return p.normal(list(a.shape), dtype=dtype or a.dtype, device=torch.device(device) if device else a.device)


@register(aten.randint.low, aten.randint.default)
def randint(*args, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    low, high, size = (0, *args) if len(args) == 2 else args
    u = p.uniform(list(size), dtype=torch.float64, device=torch.device(device or "cpu"))
    v = p.floor(p.add(p.mul(u, _s(u, high - low)), _s(u, low)))
    return p.convert_element_type(v, dtype or torch.int64)


@register(aten.randint_like.default, aten.randint_like.low_dtype)
def randint_like(a, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, generator=None):
    low, high = (0, args[0]) if len(args) == 1 else args
    return randint(low, high, list(a.shape), dtype=dtype or a.dtype, device=device or a.device)


@register(aten.bernoulli.default)
def bernoulli(a, *, generator=None):
    u = _uniform_like(a)
    return convert(p.lt(u, convert(a, u.dtype)), a.dtype)


@register(aten.bernoulli.p)
def bernoulli_p(a, prob=0.5, *, generator=None):
    u = _uniform_like(a)
    return convert(p.lt(u, _s(u, prob)), a.dtype)


@register(aten.bernoulli.Tensor)
def bernoulli_tensor(a, prob, *, generator=None):
    u = _uniform_like(a)
    return convert(p.lt(u, broadcast_to(convert(prob, u.dtype), u.shape)), a.dtype)


@register(aten.exponential.default)
def exponential(a, lambd=1.0, *, generator=None):
    u = _uniform_like(a)
    return convert(p.div(p.neg(p.log1p(p.neg(u))), _s(u, lambd)), a.dtype)


@register(aten.cauchy.default)
def cauchy(a, median=0.0, sigma=1.0, *, generator=None):
    u = _uniform_like(a)
    return convert(p.add(_s(u, median), p.mul(_s(u, sigma), p.tan(p.mul(_s(u, math.pi), p.sub(u, _s(u, 0.5)))))),
                   a.dtype)


@register(aten.log_normal.default)
def log_normal(a, mean=1.0, std=2.0, *, generator=None):
    z = p.normal(list(a.shape), dtype=computation_dtype(a.dtype), device=a.device)
    return convert(p.exp(p.add(p.mul(z, _s(z, std)), _s(z, mean))), a.dtype)


@register(aten.geometric.default)
def geometric(a, prob, *, generator=None):
    u = _uniform_like(a, torch.float64)
    v = p.ceil(p.div(p.log1p(p.neg(u)), _s(u, math.log1p(-prob))))
    return convert(v, a.dtype)


@register(aten.bernoulli_.float)
def bernoulli_inplace(a, prob=0.5, *, generator=None):
    return a.copy_(bernoulli_p(a, prob))


@register(aten.bernoulli_.Tensor)
def bernoulli_inplace_tensor(a, prob, *, generator=None):
    return a.copy_(bernoulli_tensor(a, prob))


@register(aten.randperm.default)
def randperm(n, *, dtype=torch.int64, layout=None, device=None, pin_memory=None, generator=None):
    # the order that sorts n uniform samples is a uniformly random permutation
    keys = p.uniform([n], dtype=torch.float64, device=torch.device(device or "cpu"))
    return p.convert_element_type(p.sort(keys, 0, False)[1], dtype or torch.int64)
