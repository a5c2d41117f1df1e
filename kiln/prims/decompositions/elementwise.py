"""Decompositions of ATen's elementwise ops: direct maps to one prim (tables) and compositions.

The tables say which prim an ATen op becomes and with which promotion rule; `elementwise` in
refs.py does the promotion, broadcasting and opmath casts. Compositions below are each the formula
eager computes (checked against eager by the op sweep in tests/prims).
"""
from __future__ import annotations

import math

import torch

from kiln.prims.decompositions.refs import (Promotion, broadcast_shapes, broadcast_to, complex_parts, convert,
                                            elementwise, is_float, magnitude, map_float, result_dtype, scalar_tensor)
from kiln.prims.decompositions.table import register
from kiln.prims.ops import ops as p

aten = torch.ops.aten
D, F, B, N = Promotion.DEFAULT, Promotion.INT_TO_FLOAT, Promotion.ALWAYS_BOOL, Promotion.NO_OPMATH

# ATen packet: (prim, promotion). Every overload of the packet whose arguments are just the
# operands (self, other / Tensor or Scalar) maps through the same row.
UNARY = {
    aten.neg: (p.neg, N),
    aten.exp: (p.exp, F), aten.exp2: (p.exp2, F), aten.expm1: (p.expm1, F), aten.log: (p.log, F),
    aten.log1p: (p.log1p, F), aten.log2: (p.log2, F), aten.log10: (p.log10, F), aten.sqrt: (p.sqrt, F),
    aten.rsqrt: (p.rsqrt, F), aten.sin: (p.sin, F), aten.cos: (p.cos, F),
    aten.tan: (p.tan, F), aten.asin: (p.asin, F), aten.acos: (p.acos, F), aten.atan: (p.atan, F),
    aten.sinh: (p.sinh, F), aten.cosh: (p.cosh, F), aten.tanh: (p.tanh, F), aten.asinh: (p.asinh, F),
    aten.acosh: (p.acosh, F), aten.atanh: (p.atanh, F), aten.sigmoid: (p.sigmoid, F), aten.erf: (p.erf, F),
    aten.erfc: (p.erfc, F), aten.erfinv: (p.erfinv, F), aten.special_erfcx: (p.erfcx, F),
    aten.lgamma: (p.lgamma, F), aten.digamma: (p.digamma, F), aten.i0: (p.i0, F),
    aten.special_i0e: (p.i0e, F), aten.special_i1: (p.i1, F), aten.special_i1e: (p.i1e, F),
    aten.special_ndtri: (p.ndtri, F), aten.special_log_ndtr: (p.log_ndtr, F),
    aten.special_bessel_j0: (p.bessel_j0, F), aten.special_bessel_j1: (p.bessel_j1, F),
    aten.special_bessel_y0: (p.bessel_y0, F), aten.special_bessel_y1: (p.bessel_y1, F),
    aten.special_modified_bessel_i0: (p.modified_bessel_i0, F),
    aten.special_modified_bessel_i1: (p.modified_bessel_i1, F),
    aten.special_modified_bessel_k0: (p.modified_bessel_k0, F),
    aten.special_modified_bessel_k1: (p.modified_bessel_k1, F),
    aten.special_scaled_modified_bessel_k0: (p.scaled_modified_bessel_k0, F),
    aten.special_scaled_modified_bessel_k1: (p.scaled_modified_bessel_k1, F),
    aten.special_spherical_bessel_j0: (p.spherical_bessel_j0, F), aten.special_airy_ai: (p.airy_ai, F),
    aten.bitwise_not: (p.bitwise_not, N),
}

BINARY = {
    aten.mul: (p.mul, D), aten.maximum: (p.maximum, N), aten.minimum: (p.minimum, N),
    aten.atan2: (p.atan2, F), aten.fmod: (p.fmod, N), aten.remainder: (p.remainder, N),
    aten.hypot: (p.hypot, F), aten.nextafter: (p.nextafter, N), aten.copysign: (p.copysign, F),
    aten.igamma: (p.igamma, F), aten.igammac: (p.igammac, F), aten.special_zeta: (p.zeta, F),
    aten.gcd: (p.gcd, N), aten.bitwise_and: (p.bitwise_and, N), aten.bitwise_or: (p.bitwise_or, N),
    aten.bitwise_xor: (p.bitwise_xor, N), aten.bitwise_left_shift: (p.shift_left, N),
    aten.bitwise_right_shift: (p.shift_right, N), aten.__lshift__: (p.shift_left, N),
    aten.__rshift__: (p.shift_right, N),
    aten.eq: (p.eq, B), aten.ne: (p.ne, B), aten.lt: (p.lt, B), aten.le: (p.le, B), aten.gt: (p.gt, B),
    aten.ge: (p.ge, B),
    aten.special_chebyshev_polynomial_t: (p.chebyshev_polynomial_t, F),
    aten.special_chebyshev_polynomial_u: (p.chebyshev_polynomial_u, F),
    aten.special_chebyshev_polynomial_v: (p.chebyshev_polynomial_v, F),
    aten.special_chebyshev_polynomial_w: (p.chebyshev_polynomial_w, F),
    aten.special_shifted_chebyshev_polynomial_t: (p.shifted_chebyshev_polynomial_t, F),
    aten.special_shifted_chebyshev_polynomial_u: (p.shifted_chebyshev_polynomial_u, F),
    aten.special_shifted_chebyshev_polynomial_v: (p.shifted_chebyshev_polynomial_v, F),
    aten.special_shifted_chebyshev_polynomial_w: (p.shifted_chebyshev_polynomial_w, F),
    aten.special_hermite_polynomial_h: (p.hermite_polynomial_h, F),
    aten.special_hermite_polynomial_he: (p.hermite_polynomial_he, F),
    aten.special_laguerre_polynomial_l: (p.laguerre_polynomial_l, F),
    aten.special_legendre_polynomial_p: (p.legendre_polynomial_p, F),
}

_FUNCTIONAL_OPERAND_OVERLOADS = ("default", "Tensor", "Scalar", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor",
                                 "self_Scalar", "other_Scalar", "self", "x_Scalar", "n_Scalar")


def _rows(packet):
    for name in packet.overloads():
        if name in _FUNCTIONAL_OPERAND_OVERLOADS:
            yield getattr(packet, name)


def _unary_row(prim, promotion):
    def decomposition(a):
        return elementwise(prim, a, promotion=promotion)
    decomposition.__name__ = f"unary_{prim.__name__}"
    return decomposition


def _binary_row(prim, promotion):
    def decomposition(a, b):
        return elementwise(prim, a, b, promotion=promotion)
    decomposition.__name__ = f"binary_{prim.__name__}"
    return decomposition


def _reciprocal(x):
    """1 / x: one correctly rounded division, which is what a reciprocal prim would compute."""
    return p.div(p.full(list(x.shape), 1, dtype=x.dtype, device=x.device), x)


_reciprocal.__name__ = "reciprocal"
UNARY[aten.reciprocal] = (_reciprocal, F)
for _packet, (_prim, _promotion) in UNARY.items():
    register(*_rows(_packet))(_unary_row(_prim, _promotion))
for _packet, (_prim, _promotion) in BINARY.items():
    register(*_rows(_packet))(_binary_row(_prim, _promotion))


@register(aten.add.Tensor, aten.add.Scalar)
def add(a, b, alpha=1):
    if alpha != 1:
        b = _scaled(b, alpha)
    return elementwise(p.add, a, b)


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, alpha=1):
    if alpha != 1:
        b = _scaled(b, alpha)
    if result_dtype(a, b) == torch.bool:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported.")
    return elementwise(p.sub, a, b)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, alpha=1):
    return sub(b, a, alpha)


def _scaled(b, alpha):
    if isinstance(b, torch.Tensor):
        return elementwise(p.mul, b, alpha, out_dtype=result_dtype(b, alpha)) \
            if b.dtype != torch.bool else elementwise(p.bitwise_and, b, bool(alpha))
    return b * alpha


@register(aten.div.Tensor, aten.div.Scalar)
def div(a, b):
    return elementwise(p.div, a, b, promotion=F)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        return div(a, b)
    if rounding_mode == "trunc":
        if is_float(result_dtype(a, b)):
            return map_float(lambda x, y: p.trunc(p.div(x, y)), a, b, promotion=D)
        return elementwise(p.div, a, b, promotion=N)
    return floor_divide(a, b)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a, b):
    if is_float(result_dtype(a, b)):
        return map_float(_float_floor_divide, a, b, promotion=D)
    return elementwise(_int_floor_divide, a, b, promotion=N)


def _float_floor_divide(x, y):
    # Python's floor division on floats: (x - fmod(x, y)) / y, then floored, with the sign fix-ups
    # eager's kernel applies so that e.g. -1 // 3 == -1 and division by zero gives +-inf / nan.
    mod = p.fmod(x, y)
    div = p.div(p.sub(x, mod), y)
    zero = scalar_tensor(0, x)
    fix = p.bitwise_and(p.ne(mod, zero), p.ne(p.lt(y, zero), p.lt(mod, zero)))
    div = p.where(fix, p.sub(div, scalar_tensor(1, x)), div)
    floor = p.floor(div)
    floor = p.where(p.gt(p.sub(div, floor), scalar_tensor(0.5, x)), p.add(floor, scalar_tensor(1, x)), floor)
    fallback = p.div(x, y)
    return p.where(p.ne(div, zero), floor, p.where(p.eq(y, zero), fallback, p.mul(zero, fallback)))


def _int_floor_divide(x, y):
    q = p.div(x, y)
    zero = scalar_tensor(0, x)
    inexact = p.ne(p.mul(q, y), x)
    negative = p.ne(p.lt(x, zero), p.lt(y, zero))
    return p.where(p.bitwise_and(inexact, negative), p.sub(q, scalar_tensor(1, x)), q)


@register(aten.true_divide.Tensor, aten.true_divide.Scalar)
def true_divide(a, b):
    return div(a, b)


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow(a, b):
    if isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(a, torch.Tensor) and b == 2:
        a = convert(a, result_dtype(a, b))
        return elementwise(p.mul, a, a)
    return elementwise(p.pow, a, b)


@register(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar, aten.float_power.Scalar)
def float_power(a, b):
    dtype = torch.complex128 if result_dtype(a, b).is_complex else torch.float64
    a = convert(a, dtype) if isinstance(a, torch.Tensor) else a
    b = convert(b, dtype) if isinstance(b, torch.Tensor) else b
    return elementwise(p.pow, a, b)


@register(aten.where.self)
def where(pred, a, b):
    dtype = result_dtype(a, b)
    tensors = [t for t in (pred, a, b) if isinstance(t, torch.Tensor)]
    shape = broadcast_shapes(*(t.shape for t in tensors))
    device = pred.device
    ops = [broadcast_to(convert(t, dtype), shape) if isinstance(t, torch.Tensor) else
           p.full(shape, t, dtype=dtype, device=device) for t in (a, b)]
    return p.where(broadcast_to(convert(pred, torch.bool), shape), *ops)


@register(aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where_scalar(pred, a, b):
    return where(pred, a, b)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(a, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    out = a
    if min is not None:
        out = elementwise(p.maximum, out, min, promotion=N) if not _nan_scalar(min) else \
            elementwise(lambda x, m: p.where(p.isnan(m), m, p.maximum(x, m)), out, min, promotion=N)
    if max is not None:
        out = elementwise(p.minimum, out, max, promotion=N) if not _nan_scalar(max) else \
            elementwise(lambda x, m: p.where(p.isnan(m), m, p.minimum(x, m)), out, max, promotion=N)
    return out


def _nan_scalar(x):
    return isinstance(x, torch.Tensor) or (isinstance(x, float) and math.isnan(x))


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(a, min):
    return clamp(a, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(a, max):
    return clamp(a, None, max)


def _unary(a, fn, promotion=N):
    return elementwise(fn, a, promotion=promotion)


@register(aten.ceil.default)
def ceil(a):
    return _unary(a, p.ceil) if is_float(a.dtype) else _identity(a)


@register(aten.floor.default)
def floor(a):
    return _unary(a, p.floor) if is_float(a.dtype) else _identity(a)


@register(aten.trunc.default)
def trunc(a):
    return _unary(a, p.trunc) if is_float(a.dtype) else _identity(a)


@register(aten.round.default)
def round(a):
    return _unary(a, p.round) if is_float(a.dtype) else _identity(a)


@register(aten.round.decimals)
def round_decimals(a, decimals=0):
    if decimals == 0:
        return round(a)
    scale = 10.0 ** abs(decimals)
    if decimals > 0:
        return map_float(lambda x: p.div(p.round(p.mul(x, scalar_tensor(scale, x))), scalar_tensor(scale, x)), a)
    return map_float(lambda x: p.mul(p.round(p.div(x, scalar_tensor(scale, x))), scalar_tensor(scale, x)), a)


def _identity(a):
    return p.copy_strided(a, list(a.stride())) if a.ndim else p.copy_strided(a, [])


@register(aten.frac.default)
def frac(a):
    return map_float(lambda x: p.sub(x, p.trunc(x)), a, promotion=D)


@register(aten.sign.default)
def sign(a):
    if a.dtype == torch.bool:
        return _identity(a)
    def fn(x):
        zero = scalar_tensor(0, x)
        pos = p.convert_element_type(p.gt(x, zero), x.dtype)
        neg = p.convert_element_type(p.lt(x, zero), x.dtype)
        out = p.sub(pos, neg)
        return p.where(p.isnan(x), x, out) if is_float(x.dtype) else out
    return elementwise(fn, a, promotion=N)


@register(*_rows(aten.abs))
def abs_(a):
    return magnitude(a) if a.dtype.is_complex else elementwise(p.abs, a, promotion=N)


@register(aten.sgn.default)
def sgn(a):
    """sign for real dtypes; z / |z| for complex ones, 0 at 0, as eager's."""
    if not a.dtype.is_complex:
        return sign(a)
    size = magnitude(a)
    at_zero = p.eq(size, p.full(list(a.shape), 0, dtype=size.dtype, device=a.device))
    return p.where(at_zero, p.full(list(a.shape), 0, dtype=a.dtype, device=a.device),
                   p.div(a, p.convert_element_type(size, a.dtype)))


@register(aten.signbit.default)
def signbit(a):
    if a.dtype == torch.bool:
        return elementwise(p.ne, a, a)
    return elementwise(p.signbit, a, promotion=B) if is_float(a.dtype) else \
        elementwise(p.lt, a, 0, promotion=B)


@register(aten.isnan.default)
def isnan(a):
    return elementwise(p.isnan, a, promotion=B)


@register(aten.isinf.default)
def isinf(a):
    return elementwise(p.isinf, a, promotion=B)


@register(aten.isposinf.default)
def isposinf(a):
    return elementwise(p.eq, a, math.inf, promotion=B) if is_float(a.dtype) else elementwise(p.ne, a, a, promotion=B)


@register(aten.isneginf.default)
def isneginf(a):
    return elementwise(p.eq, a, -math.inf, promotion=B) if is_float(a.dtype) else elementwise(p.ne, a, a, promotion=B)


@register(aten.isfinite.default)
def isfinite(a):
    if not is_float(a.dtype):
        return elementwise(p.eq, a, a, promotion=B)
    return elementwise(lambda x: p.bitwise_not(p.bitwise_or(p.isnan(x), p.isinf(x))), a, out_dtype=torch.bool)


@register(aten.logical_not.default)
def logical_not(a):
    return elementwise(p.eq, a, scalar_tensor(0, a) if a.ndim else 0, promotion=B) if a.dtype != torch.bool \
        else elementwise(p.bitwise_not, a, promotion=N)


def _logical(prim):
    def fn(a, b):
        return elementwise(prim, _as_bool(a), _as_bool(b), promotion=N)
    fn.__name__ = f"logical_{prim.__name__}"
    return fn


def _as_bool(a):
    return a if a.dtype == torch.bool else elementwise(p.ne, a, 0, promotion=B)


register(aten.logical_and.default)(_logical(p.bitwise_and))
register(aten.logical_or.default)(_logical(p.bitwise_or))
register(aten.logical_xor.default)(_logical(p.bitwise_xor))


@register(aten.square.default)
def square(a):
    return elementwise(p.mul, a, a, promotion=Promotion.BOOL_TO_LONG)


@register(aten.fmax.default)
def fmax(a, b):
    return elementwise(lambda x, y: p.where(p.isnan(y), x, p.where(p.isnan(x), y, p.maximum(x, y)))
                       if is_float(x.dtype) else p.maximum(x, y), a, b, promotion=N)


@register(aten.fmin.default)
def fmin(a, b):
    return elementwise(lambda x, y: p.where(p.isnan(y), x, p.where(p.isnan(x), y, p.minimum(x, y)))
                       if is_float(x.dtype) else p.minimum(x, y), a, b, promotion=N)


@register(aten.heaviside.default)
def heaviside(a, values):
    def fn(x, v):
        zero = scalar_tensor(0, x)
        return p.where(p.eq(x, zero), v, p.convert_element_type(p.gt(x, zero), x.dtype))
    return elementwise(fn, a, values, promotion=N)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(start, end, weight):
    def fn(s, e, w):
        diff = p.sub(e, s)
        low = p.add(s, p.mul(w, diff))
        high = p.sub(e, p.mul(diff, p.sub(scalar_tensor(1, w), w)))
        size = abs_(w)        # eager: |w| < 0.5, a complex weight's magnitude too
        return p.where(p.lt(size, scalar_tensor(0.5, size)), low, high)
    return map_float(fn, start, end, weight, promotion=D)


@register(aten.addcmul.default)
def addcmul(a, t1, t2, value=1):
    return map_float(lambda x, y, z: p.add(x, p.mul(p.mul(scalar_tensor(value, y), y), z)), a, t1, t2, promotion=D) \
        if is_float(result_dtype(a, t1, t2)) else \
        elementwise(lambda x, y, z: p.add(x, p.mul(p.mul(scalar_tensor(value, y), y), z)), a, t1, t2)


@register(aten.addcdiv.default)
def addcdiv(a, t1, t2, value=1):
    return map_float(lambda x, y, z: p.add(x, p.mul(scalar_tensor(value, y), p.div(y, z))), a, t1, t2, promotion=D)


@register(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def xlogy(a, b):
    def fn(x, y):
        zero = scalar_tensor(0, x)
        out = p.where(p.eq(x, zero), zero, p.mul(x, p.log(y)))
        return p.where(p.isnan(y), y, out)
    return map_float(fn, a, b)


@register(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar)
def xlog1py(a, b):
    def fn(x, y):
        zero = scalar_tensor(0, x)
        out = p.where(p.eq(x, zero), zero, p.mul(x, p.log1p(y)))
        return p.where(p.isnan(y), y, out)
    return map_float(fn, a, b)


@register(aten.special_entr.default)
def entr(a):
    def fn(x):
        zero = scalar_tensor(0, x)
        body = p.neg(p.mul(x, p.log(x)))
        out = p.where(p.eq(x, zero), zero, p.where(p.lt(x, zero), scalar_tensor(-math.inf, x), body))
        return p.where(p.isnan(x), x, out)
    return map_float(fn, a)


@register(aten.logit.default)
def logit(a, eps=None):
    def fn(x):
        if eps is not None:
            x = p.minimum(p.maximum(x, scalar_tensor(eps, x)), scalar_tensor(1 - eps, x))
        return p.log(p.div(x, p.sub(scalar_tensor(1, x), x)))
    return map_float(fn, a)


@register(aten.deg2rad.default)
def deg2rad(a):
    return map_float(lambda x: p.mul(x, scalar_tensor(math.pi / 180, x)), a)


@register(aten.rad2deg.default)
def rad2deg(a):
    return map_float(lambda x: p.mul(x, scalar_tensor(180 / math.pi, x)), a)


@register(aten.sinc.default)
def sinc(a):
    def fn(x):
        pix = p.mul(x, scalar_tensor(math.pi, x))
        return p.where(p.eq(x, scalar_tensor(0, x)), scalar_tensor(1, x), p.div(p.sin(pix), pix))
    return map_float(fn, a)


@register(aten.logaddexp.default)
def logaddexp(a, b):
    def fn(x, y):
        hi, lo = p.maximum(x, y), p.minimum(x, y)
        out = p.add(hi, p.log1p(p.exp(p.sub(lo, hi))))
        same_inf = p.bitwise_and(p.isinf(x), p.eq(x, y))
        return p.where(same_inf, x, out)
    return map_float(fn, a, b, promotion=D)


@register(aten.logaddexp2.default)
def logaddexp2(a, b):
    def fn(x, y):
        hi, lo = p.maximum(x, y), p.minimum(x, y)
        ln2 = scalar_tensor(math.log(2), x)
        out = p.add(hi, p.div(p.log1p(p.exp2(p.sub(lo, hi))), ln2))
        same_inf = p.bitwise_and(p.isinf(x), p.eq(x, y))
        return p.where(same_inf, x, out)
    return map_float(fn, a, b, promotion=D)


@register(aten.nan_to_num.default)
def nan_to_num(a, nan=0.0, posinf=None, neginf=None):
    if not is_float(a.dtype):
        return _identity(a)
    info = torch.finfo(a.dtype)
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    def fn(x):
        out = p.where(p.isnan(x), scalar_tensor(nan, x), x)
        out = p.where(p.eq(x, scalar_tensor(math.inf, x)), scalar_tensor(posinf, x), out)
        return p.where(p.eq(x, scalar_tensor(-math.inf, x)), scalar_tensor(neginf, x), out)
    return elementwise(fn, a, promotion=N)


@register(aten.ldexp.Tensor)
def ldexp(a, b):
    return map_float(lambda x, e: p.mul(x, p.exp2(e)), a, b)


@register(aten.mvlgamma.default)
def mvlgamma(a, p_):
    def fn(x):
        out = scalar_tensor(p_ * (p_ - 1) / 4 * math.log(math.pi), x)
        for j in range(p_):
            out = p.add(out, p.lgamma(p.sub(x, scalar_tensor(j / 2, x))))
        return out
    return map_float(fn, a)


@register(aten.polygamma.default)
def polygamma(n, a):
    if n == 0:
        return elementwise(p.digamma, a, promotion=F)
    return map_float(lambda x: p.polygamma(scalar_tensor(float(n), x), x), a)


@register(aten.special_polygamma.default)
def special_polygamma(n, a):
    return polygamma(n, a)


@register(aten.angle.default)
def angle(a):
    if a.dtype.is_complex:     # arg z, real as eager's
        real, imag = complex_parts(a)
        return p.atan2(imag, real)

    def fn(x):
        zero = scalar_tensor(0, x)
        out = p.where(p.lt(x, zero), scalar_tensor(math.pi, x), zero)
        return p.where(p.isnan(x), x, out)
    return map_float(fn, a)


@register(aten.positive.default)
def positive(a):
    return a


@register(aten.lcm.default)
def lcm(a, b):
    def fn(x, y):
        g = p.gcd(x, y)
        zero = scalar_tensor(0, g)
        safe = p.where(p.eq(g, zero), scalar_tensor(1, g), g)
        return p.abs(p.mul(p.div(x, safe), y))
    return elementwise(fn, a, b, promotion=N)
