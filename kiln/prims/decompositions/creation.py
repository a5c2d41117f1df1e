"""Decompositions of ATen's creation ops: full/zeros/ones/empty and their _like/new_ forms,
arange, linspace, logspace, eye, fill.

Everything becomes `full`, `iota` or `empty_strided` (plus elementwise arithmetic for ranges);
a layout other than contiguous is made with one `copy_strided`.
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import broadcast_to, contiguous_strides, convert, to_device
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p
from kiln.symbolic.decide import nonnegative_size

aten = torch.ops.aten


def _default(x, fallback):
    return fallback if x is None else x


def _dtype(dtype):
    return torch.get_default_dtype() if dtype is None else dtype


def _device(device):
    return torch.device("cpu") if device is None else torch.device(device)


@register(aten.full.default)
def full_(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        dtype = torch.bool if isinstance(fill_value, bool) else torch.int64 if isinstance(fill_value, int) else \
            torch.get_default_dtype()
    return p.full(list(size), fill_value, dtype=dtype, device=_device(device))


@register(aten.scalar_tensor.default)
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.full([], value, dtype=_dtype(dtype), device=_device(device))


@register(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.full(list(size), 0, dtype=_dtype(dtype), device=_device(device))


@register(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.full(list(size), 1, dtype=_dtype(dtype), device=_device(device))


@register(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    size = list(size)
    strides = _strides_for(size, memory_format)
    return p.empty_strided(size, strides, dtype=_dtype(dtype), device=_device(device))


def _strides_for(size, memory_format):
    if memory_format == torch.channels_last and len(size) == 4:
        n, c, h, w = size
        return [h * w * c, 1, w * c, c]
    return contiguous_strides(size)


@register(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.empty_strided(list(size), list(stride), dtype=_dtype(dtype), device=_device(device))


@register(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    physical = [size[i] for i in physical_layout]
    phys_strides = contiguous_strides(physical)
    strides = [0] * len(size)
    for pos, i in enumerate(physical_layout):
        strides[i] = phys_strides[pos]
    return p.empty_strided(list(size), strides, dtype=_dtype(dtype), device=_device(device))


def _like_strides(a, memory_format):
    if memory_format in (None, torch.preserve_format):
        from kiln.prims.decompositions.refs import _dense
        return list(a.stride()) if _dense(a) else contiguous_strides(a.shape)
    return _strides_for(list(a.shape), memory_format)


def _filled_like(a, value, dtype, device, memory_format):
    dtype = a.dtype if dtype is None else dtype
    device = a.device if device is None else torch.device(device)
    strides = _like_strides(a, memory_format)
    filled = p.full(list(a.shape), value, dtype=dtype, device=device)
    return filled if strides == contiguous_strides(a.shape) else p.copy_strided(filled, strides)


@register(aten.empty_like.default)
def empty_like(a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return p.empty_strided(list(a.shape), _like_strides(a, memory_format), dtype=a.dtype if dtype is None else dtype,
                           device=a.device if device is None else torch.device(device))


@register(aten.full_like.default)
def full_like(a, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled_like(a, fill_value, dtype, device, memory_format)


@register(aten.zeros_like.default)
def zeros_like(a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled_like(a, 0, dtype, device, memory_format)


@register(aten.ones_like.default)
def ones_like(a, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled_like(a, 1, dtype, device, memory_format)


@register(aten.new_empty.default)
def new_empty(a, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.empty_strided(list(size), contiguous_strides(size), dtype=_default(dtype, a.dtype),
                           device=a.device if device is None else torch.device(device))


@register(aten.new_empty_strided.default)
def new_empty_strided(a, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.empty_strided(list(size), list(stride), dtype=_default(dtype, a.dtype),
                           device=a.device if device is None else torch.device(device))


@register(aten.new_full.default)
def new_full(a, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.full(list(size), fill_value, dtype=_default(dtype, a.dtype),
                  device=a.device if device is None else torch.device(device))


@register(aten.new_zeros.default)
def new_zeros(a, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return new_full(a, size, 0, dtype=dtype, device=device)


@register(aten.new_ones.default)
def new_ones(a, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return new_full(a, size, 1, dtype=dtype, device=device)


@register(aten.fill.Scalar, aten.fill.Tensor)
def fill(a, value):
    if isinstance(value, torch.Tensor):
        return p.copy_strided(broadcast_to(convert(to_device(value, a.device), a.dtype), a.shape), list(a.stride()))
    return _filled_like(a, value, None, None, None)


@register(aten.zero.default)
def zero(a):
    return _filled_like(a, 0, None, None, None)


@register(aten.arange.start_step)
def arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    integral = all(isinstance(x, (int, torch.SymInt)) for x in (start, end, step))
    if dtype is None:
        dtype = torch.int64 if integral else torch.get_default_dtype()
    if integral and isinstance(step, int) and step > 0:
        length = (end - start + step - 1) // step   # exact on symbolic sizes, no float round trip
    else:
        length = math.ceil((end - start) / step)
    length = nonnegative_size(length)
    if dtype.is_floating_point:
        # eager computes start + i * step in double precision, then rounds once
        ramp = p.iota(length, start=0, step=1, dtype=torch.int64, device=_device(device))
        values = p.add(p.mul(p.convert_element_type(ramp, torch.float64),
                             p.full([length], float(step), dtype=torch.float64, device=_device(device))),
                       p.full([length], float(start), dtype=torch.float64, device=_device(device)))
        return p.convert_element_type(values, dtype)
    start, step = (x if isinstance(x, torch.SymInt) else int(x) for x in (start, step))
    return p.iota(length, start=start, step=step, dtype=dtype, device=_device(device))


@register(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_start_step(start, end, 1, dtype=dtype, device=device)


@register(aten.arange.default)
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_start_step(0, end, 1, dtype=dtype, device=device)


def _complex(dtype, *bounds) -> bool:
    """A complex range (its dtype, or a bound, eager's dtype inference then picks complex)."""
    return dtype.is_complex or any(isinstance(b, complex) or isinstance(b, torch.Tensor) and b.is_complex()
                                   for b in bounds)


@register(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _dtype(dtype)
    if _complex(dtype, start, end):       # left to ATen: the formula below is real
        return NotImplemented
    device = _device(device)
    if steps == 0:
        return p.full([0], 0, dtype=dtype, device=device)
    if steps == 1:
        return p.full([1], start, dtype=dtype, device=device)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    if not dtype.is_floating_point:
        compute = torch.float64
    step = (end - start) / (steps - 1)
    i = p.convert_element_type(p.iota(steps, start=0, step=1, dtype=torch.int64, device=device), compute)
    # eager fills the first half forward from start and the second half backward from end
    fwd = p.add(p.full([steps], start, dtype=compute, device=device),
                p.mul(p.full([steps], step, dtype=compute, device=device), i))
    rev_i = p.sub(p.full([steps], steps - 1, dtype=compute, device=device), i)
    bwd = p.sub(p.full([steps], end, dtype=compute, device=device),
                p.mul(p.full([steps], step, dtype=compute, device=device), rev_i))
    half = p.lt(i, p.full([steps], steps // 2, dtype=compute, device=device))
    out = p.where(half, fwd, bwd)
    if not dtype.is_floating_point:
        out = p.trunc(out)
    return p.convert_element_type(out, dtype)


def _two_sided(lo, hi, steps, device):
    """lo .. hi in `steps` points (lo and hi: tensors of [steps], their dtype the computation's), as
    eager fills a range: the first half forward from lo, the second half backward from hi."""
    dtype = lo.dtype
    i = p.convert_element_type(p.iota(steps, start=0, step=1, dtype=torch.int64, device=device), dtype)
    last = p.full([steps], steps - 1, dtype=dtype, device=device)
    step = p.div(p.sub(hi, lo), last)
    fwd = p.add(lo, p.mul(step, i))
    bwd = p.sub(hi, p.mul(step, p.sub(last, i)))
    return p.where(p.lt(i, p.full([steps], steps // 2, dtype=dtype, device=device)), fwd, bwd)


@register(aten.logspace.default)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _logspace(start, end, steps, base, _dtype(dtype), _device(device))


def _logspace(start, end, steps, base, dtype, device):
    """base ** exponent with the bounds rounded to `dtype` as eager's kernel reads them, the
    exponents (two-sided, as linspace's) and the power in double, and one rounding at the end.
    An exponent rounded to bfloat16 before the power is off by 2**-8 of itself: 10**38 by 30%.
    Eager's CPU kernel takes float32 exponents for float32, an ulp from these at times."""
    if _complex(dtype, start, end):       # complex exponents: left to ATen
        return NotImplemented
    f64 = torch.float64

    def as_double(v, rounded):
        t = convert(v, f64) if isinstance(v, torch.Tensor) else p.full([], v, dtype=f64, device=device)
        if rounded:
            t = p.convert_element_type(p.convert_element_type(t, dtype), f64)
        return p.broadcast_in_dim(p.view(t, []), [steps], [])
    if steps == 0:
        return p.full([0], 0, dtype=dtype, device=device)
    powers = p.full([steps], base, dtype=f64, device=device)
    if steps == 1:   # eager takes the power of the bound as given, unrounded
        return p.convert_element_type(p.pow(powers, as_double(start, rounded=False)), dtype)
    exps = _two_sided(as_double(start, rounded=True), as_double(end, rounded=True), steps, device)
    return p.convert_element_type(p.pow(powers, exps), dtype)


@register(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    m = n if m is None else m
    device = _device(device)
    r = p.broadcast_in_dim(p.iota(n, start=0, step=1, dtype=torch.int64, device=device), [n, m], [0])
    c = p.broadcast_in_dim(p.iota(m, start=0, step=1, dtype=torch.int64, device=device), [n, m], [1])
    return p.convert_element_type(p.eq(r, c), _dtype(dtype))





@register(aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace_tensor(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    """linspace with 0-d tensor bounds: the same two-sided formula as `linspace`, on tensors."""
    dtype = _dtype(dtype)
    if _complex(dtype, start, end):
        return NotImplemented
    some = start if isinstance(start, torch.Tensor) else end
    device = _device(device) if device is not None else some.device
    compute = torch.float64 if dtype == torch.float64 or not dtype.is_floating_point else torch.float32

    def bound(v):
        t = convert(v, compute) if isinstance(v, torch.Tensor) else p.full([], v, dtype=compute, device=device)
        return p.broadcast_in_dim(p.view(t, []), [steps], [])
    lo, hi = bound(start), bound(end)
    if steps == 1:
        return p.convert_element_type(lo, dtype)
    out = _two_sided(lo, hi, steps, device)
    if not dtype.is_floating_point:
        out = p.trunc(out)
    return p.convert_element_type(out, dtype)


@register(aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace_tensor(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    some = start if isinstance(start, torch.Tensor) else end
    return _logspace(start, end, steps, base, _dtype(dtype), _device(device) if device is not None else some.device)


@register(aten._efficientzerotensor.default)
def efficient_zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return p.full(list(size), 0, dtype=_dtype(dtype), device=_device(device))
