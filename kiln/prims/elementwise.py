"""Elementwise prims: unary, binary and ternary maps over tensors of one shape, and the dtype cast.

Each row of the tables below is one prim: its name, its one-line doc, its eager reference, and its
dtype rule. Operands must share shape and dtype (see [Note: prims are strict] in prim.py); the
output has the operands' shape and layout, and either their dtype or bool. Float-only prims refuse
integer inputs: a decomposition converts first, which is where eager's promotion happens.
"""
from __future__ import annotations

import torch

from kiln.prims.prim import Category, check, define
from kiln.symbolic.strides import contiguous_strides, dense, pointwise_strides  # noqa: F401 (importers of kiln.prims.elementwise)

# Which input dtypes a prim accepts: a code generator may rely on this.
FLOAT, NUMBER, REAL, INTEGRAL, ANY = "float", "number", "real", "integral", "any"


def _accepts(kind: str, dtype: torch.dtype) -> bool:
    if kind == FLOAT:
        return dtype.is_floating_point or dtype.is_complex
    if kind == INTEGRAL:
        return not dtype.is_floating_point and not dtype.is_complex
    if kind == NUMBER:
        return dtype != torch.bool
    if kind == REAL:
        return dtype != torch.bool and not dtype.is_complex
    return True


def _check_operands(name: str, kind: str, tensors) -> None:
    first = tensors[0]
    for t in tensors:
        check(isinstance(t, torch.Tensor), name, f"expects tensors, got {type(t).__name__}")
        check(t.shape == first.shape, name, f"operand shapes differ: {[tuple(x.shape) for x in tensors]}")
        check(t.dtype == first.dtype, name, f"operand dtypes differ: {[x.dtype for x in tensors]}")
        check(t.device == first.device, name, f"operand devices differ: {[x.device for x in tensors]}")
    check(_accepts(kind, first.dtype), name, f"does not accept dtype {first.dtype} (accepts {kind})")


def pointwise_like(tensors, dtype: torch.dtype) -> torch.Tensor:
    """An empty output of a pointwise op on `tensors`, laid out as eager lays it out."""
    first = tensors[0]
    return torch.empty_strided(first.shape, pointwise_strides(tensors), dtype=dtype, device=first.device)


def _make_meta(name: str, kind: str, arity: int, bool_out: bool):
    def meta(*tensors):
        _check_operands(name, kind, tensors)
        return pointwise_like(tensors, torch.bool if bool_out else tensors[0].dtype)
    return meta


def _make_reference(name: str, kind: str, reference):
    # The reference checks the contract too, so the evaluator catches a sloppy decomposition even
    # when it does not run meta rules.
    def checked(*tensors):
        _check_operands(name, kind, tensors)
        return reference(*tensors)
    checked.__name__ = name
    return checked


def _div(a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def _polygamma(n, x):
    # polygamma's order is an int in ATen; as a prim it is a tensor so the prim stays binary and
    # elementwise. Orders vary per element only in principle: decompositions pass one value.
    return torch.polygamma(int(n.reshape(-1)[0].item()) if n.numel() else 0, x)


# name: (doc, reference, accepted dtypes)
UNARY = {
    "abs": ("absolute value of a real number (a complex magnitude, of a real dtype, is decomposed)", torch.abs, REAL),
    "neg": ("negation", torch.neg, NUMBER),
    "exp": ("e to the power x", torch.exp, FLOAT),
    "exp2": ("2 to the power x", torch.exp2, FLOAT),
    "expm1": ("exp(x) - 1, accurate near 0", torch.expm1, FLOAT),
    "log": ("natural logarithm", torch.log, FLOAT),
    "log1p": ("log(1 + x), accurate near 0", torch.log1p, FLOAT),
    "log2": ("base-2 logarithm", torch.log2, FLOAT),
    "log10": ("base-10 logarithm", torch.log10, FLOAT),
    "sqrt": ("square root", torch.sqrt, FLOAT),
    "rsqrt": ("1 / sqrt(x)", torch.rsqrt, FLOAT),
    "sin": ("sine", torch.sin, FLOAT),
    "cos": ("cosine", torch.cos, FLOAT),
    "tan": ("tangent", torch.tan, FLOAT),
    "asin": ("arcsine", torch.asin, FLOAT),
    "acos": ("arccosine", torch.acos, FLOAT),
    "atan": ("arctangent", torch.atan, FLOAT),
    "sinh": ("hyperbolic sine", torch.sinh, FLOAT),
    "cosh": ("hyperbolic cosine", torch.cosh, FLOAT),
    "tanh": ("hyperbolic tangent", torch.tanh, FLOAT),
    "asinh": ("inverse hyperbolic sine", torch.asinh, FLOAT),
    "acosh": ("inverse hyperbolic cosine", torch.acosh, FLOAT),
    "atanh": ("inverse hyperbolic tangent", torch.atanh, FLOAT),
    "sigmoid": ("logistic function 1 / (1 + exp(-x))", torch.sigmoid, FLOAT),
    "erf": ("error function", torch.erf, FLOAT),
    "erfc": ("complementary error function 1 - erf(x)", torch.erfc, FLOAT),
    "erfinv": ("inverse error function", torch.erfinv, FLOAT),
    "erfcx": ("scaled complementary error function exp(x^2) * erfc(x)", torch.special.erfcx, FLOAT),
    "lgamma": ("log of the absolute gamma function", torch.lgamma, FLOAT),
    "digamma": ("derivative of lgamma", torch.digamma, FLOAT),
    "i0": ("modified Bessel function of the first kind, order 0", torch.i0, FLOAT),
    "i0e": ("exponentially scaled i0", torch.special.i0e, FLOAT),
    "i1": ("modified Bessel function of the first kind, order 1", torch.special.i1, FLOAT),
    "i1e": ("exponentially scaled i1", torch.special.i1e, FLOAT),
    "ndtri": ("inverse of the standard normal CDF", torch.special.ndtri, FLOAT),
    "log_ndtr": ("log of the standard normal CDF", torch.special.log_ndtr, FLOAT),
    "bessel_j0": ("Bessel function of the first kind, order 0", torch.special.bessel_j0, FLOAT),
    "bessel_j1": ("Bessel function of the first kind, order 1", torch.special.bessel_j1, FLOAT),
    "bessel_y0": ("Bessel function of the second kind, order 0", torch.special.bessel_y0, FLOAT),
    "bessel_y1": ("Bessel function of the second kind, order 1", torch.special.bessel_y1, FLOAT),
    "modified_bessel_i0": ("modified Bessel function I0", torch.special.modified_bessel_i0, FLOAT),
    "modified_bessel_i1": ("modified Bessel function I1", torch.special.modified_bessel_i1, FLOAT),
    "modified_bessel_k0": ("modified Bessel function K0", torch.special.modified_bessel_k0, FLOAT),
    "modified_bessel_k1": ("modified Bessel function K1", torch.special.modified_bessel_k1, FLOAT),
    "scaled_modified_bessel_k0": ("exp(x) * K0(x)", torch.special.scaled_modified_bessel_k0, FLOAT),
    "scaled_modified_bessel_k1": ("exp(x) * K1(x)", torch.special.scaled_modified_bessel_k1, FLOAT),
    "spherical_bessel_j0": ("spherical Bessel function j0", torch.special.spherical_bessel_j0, FLOAT),
    "airy_ai": ("Airy function Ai", torch.special.airy_ai, FLOAT),
    "ceil": ("round up to an integer value", torch.ceil, FLOAT),
    "floor": ("round down to an integer value", torch.floor, FLOAT),
    "round": ("round half to even", torch.round, FLOAT),
    "trunc": ("round toward zero", torch.trunc, FLOAT),
    "conj": ("complex conjugate (identity on real dtypes)", torch.conj_physical, ANY),
    "bitwise_not": ("bitwise not (logical not on bool)", torch.bitwise_not, INTEGRAL),
}

UNARY_TO_BOOL = {
    "isnan": ("true where x is NaN", torch.isnan, ANY),
    "isinf": ("true where x is +-inf", torch.isinf, ANY),
    "signbit": ("true where the sign bit is set (including -0.0)", torch.signbit, NUMBER),
}

BINARY = {
    "add": ("a + b", torch.add, ANY),
    "sub": ("a - b", torch.sub, NUMBER),
    "mul": ("a * b", torch.mul, ANY),
    "div": ("a / b: true division on floats, truncating on integers", _div, NUMBER),
    "pow": ("a to the power b", torch.pow, NUMBER),
    "maximum": ("elementwise max, NaN-propagating", torch.maximum, ANY),
    "minimum": ("elementwise min, NaN-propagating", torch.minimum, ANY),
    "atan2": ("arctangent of a / b in the right quadrant", torch.atan2, FLOAT),
    "fmod": ("C remainder: sign of a", torch.fmod, NUMBER),
    "remainder": ("Python remainder: sign of b", torch.remainder, NUMBER),
    "hypot": ("sqrt(a^2 + b^2) without overflow", torch.hypot, FLOAT),
    "nextafter": ("next float after a toward b", torch.nextafter, FLOAT),
    "copysign": ("magnitude of a, sign of b", torch.copysign, FLOAT),
    "igamma": ("regularized lower incomplete gamma", torch.igamma, FLOAT),
    "igammac": ("regularized upper incomplete gamma", torch.igammac, FLOAT),
    "zeta": ("Hurwitz zeta function", torch.special.zeta, FLOAT),
    "polygamma": ("polygamma of order a (an integral-valued float) at b", lambda n, x: _polygamma(n, x), FLOAT),
    "chebyshev_polynomial_t": ("Chebyshev polynomial T_b(a)", torch.special.chebyshev_polynomial_t, FLOAT),
    "chebyshev_polynomial_u": ("Chebyshev polynomial U_b(a)", torch.special.chebyshev_polynomial_u, FLOAT),
    "chebyshev_polynomial_v": ("Chebyshev polynomial V_b(a)", torch.special.chebyshev_polynomial_v, FLOAT),
    "chebyshev_polynomial_w": ("Chebyshev polynomial W_b(a)", torch.special.chebyshev_polynomial_w, FLOAT),
    "shifted_chebyshev_polynomial_t": ("shifted Chebyshev polynomial T*_b(a)",
                                       torch.special.shifted_chebyshev_polynomial_t, FLOAT),
    "shifted_chebyshev_polynomial_u": ("shifted Chebyshev polynomial U*_b(a)",
                                       torch.special.shifted_chebyshev_polynomial_u, FLOAT),
    "shifted_chebyshev_polynomial_v": ("shifted Chebyshev polynomial V*_b(a)",
                                       torch.special.shifted_chebyshev_polynomial_v, FLOAT),
    "shifted_chebyshev_polynomial_w": ("shifted Chebyshev polynomial W*_b(a)",
                                       torch.special.shifted_chebyshev_polynomial_w, FLOAT),
    "hermite_polynomial_h": ("physicists' Hermite polynomial H_b(a)", torch.special.hermite_polynomial_h, FLOAT),
    "hermite_polynomial_he": ("probabilists' Hermite polynomial He_b(a)",
                              torch.special.hermite_polynomial_he, FLOAT),
    "laguerre_polynomial_l": ("Laguerre polynomial L_b(a)", torch.special.laguerre_polynomial_l, FLOAT),
    "legendre_polynomial_p": ("Legendre polynomial P_b(a)", torch.special.legendre_polynomial_p, FLOAT),
    "gcd": ("greatest common divisor (non-negative)", torch.gcd, INTEGRAL),
    "bitwise_and": ("bitwise and (logical and on bool)", torch.bitwise_and, INTEGRAL),
    "bitwise_or": ("bitwise or (logical or on bool)", torch.bitwise_or, INTEGRAL),
    "bitwise_xor": ("bitwise xor (logical xor on bool)", torch.bitwise_xor, INTEGRAL),
    "shift_left": ("a << b", torch.bitwise_left_shift, INTEGRAL),
    "shift_right": ("a >> b, arithmetic", torch.bitwise_right_shift, INTEGRAL),
}

BINARY_TO_BOOL = {
    "eq": ("a == b", torch.eq, ANY),
    "ne": ("a != b", torch.ne, ANY),
    "lt": ("a < b", torch.lt, ANY),
    "le": ("a <= b", torch.le, ANY),
    "gt": ("a > b", torch.gt, ANY),
    "ge": ("a >= b", torch.ge, ANY),
}

_POINTWISE = (torch.Tag.pointwise,)

for _table, _arity, _bool_out in ((UNARY, 1, False), (UNARY_TO_BOOL, 1, True),
                                  (BINARY, 2, False), (BINARY_TO_BOOL, 2, True)):
    for _name, (_doc, _ref, _kind) in _table.items():
        _args = "Tensor a" if _arity == 1 else "Tensor a, Tensor b"
        define(f"{_name}({_args}) -> Tensor", Category.ELEMENTWISE, _doc,
               _make_meta(_name, _kind, _arity, _bool_out), _make_reference(_name, _kind, _ref), _POINTWISE)


def _where_check(pred, a, b):
    check(pred.dtype == torch.bool, "where", f"predicate must be bool, got {pred.dtype}")
    check(pred.shape == a.shape == b.shape, "where",
          f"operand shapes differ: {tuple(pred.shape)}, {tuple(a.shape)}, {tuple(b.shape)}")
    check(a.dtype == b.dtype, "where", f"value dtypes differ: {a.dtype}, {b.dtype}")


define("where(Tensor pred, Tensor a, Tensor b) -> Tensor", Category.ELEMENTWISE,
       "a where pred is true, else b", lambda pred, a, b: (_where_check(pred, a, b), pointwise_like((pred, a, b), a.dtype))[1],
       lambda pred, a, b: (_where_check(pred, a, b), torch.where(pred, a, b))[1], _POINTWISE)


def _convert_meta(a, dtype):
    return pointwise_like((a,), dtype)


def _convert(a, dtype):
    return a.to(dtype, copy=True)


define("convert_element_type(Tensor a, ScalarType dtype) -> Tensor", Category.ELEMENTWISE,
       "cast to dtype (C semantics: float to int truncates)", _convert_meta, _convert, _POINTWISE)
