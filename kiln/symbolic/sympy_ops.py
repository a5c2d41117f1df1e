"""Integer-semantics sympy functions for symbolic sizes, and their printer to Python source.

sympy's own `/` is exact division and its `floor`/`Mod` know nothing of C++ or Python integer
semantics, so sizes need a few functions of their own (FloorDiv, Trunc, the bitwise ops). Each one
folds to a number when its arguments are numbers, so a size that becomes static prints as an int.

`to_python(expr, names)` prints any expression built here (and the sympy relations, And/Or/Not,
Min/Max, Piecewise) as Python source text; it is how guards become one Python function. The
printer is a table keyed by sympy type.
"""
from __future__ import annotations

import math
import operator
from typing import Callable, Mapping

import sympy


def _int_fold(pyop: Callable[[int, int], int]):
    """eval() for a binary integer function: fold when both arguments are integers."""

    @classmethod  # type: ignore[misc]
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(pyop(int(a), int(b)))
        return None

    return eval


class FloorDiv(sympy.Function):
    """Python's `a // b` on integers (rounds toward -inf)."""

    is_integer = True
    nargs = (2,)

    def _eval_is_nonnegative(self):
        a, b = self.args
        if a.is_nonnegative and b.is_positive:
            return True
        return None

    @classmethod
    def eval(cls, a, b):
        if b == 0:
            raise ZeroDivisionError(f"symbolic floor division {a} // 0")
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        # An exact multiple divides exactly: (4*s0) // 2 -> 2*s0, (s0*s1) // s1 -> s0.
        quotient = sympy.cancel(a / b)
        if quotient.is_integer:
            return quotient
        # (a // b) // c == a // (b * c) when b and c are positive.
        if isinstance(a, FloorDiv) and a.args[1].is_positive and b.is_positive:
            return FloorDiv(a.args[0], a.args[1] * b)
        return None


class Trunc(sympy.Function):
    """math.trunc: float to int toward zero."""

    is_integer = True
    nargs = (1,)

    @classmethod
    def eval(cls, a):
        if a.is_Number:
            return sympy.Integer(math.trunc(float(a)) if not a.is_Integer else int(a))
        if a.is_integer:
            return a
        return None


class Round(sympy.Function):
    """Python's round(x): half to even, to an int."""

    is_integer = True
    nargs = (1,)

    @classmethod
    def eval(cls, a):
        if a.is_Number:
            return sympy.Integer(round(float(a)))
        if a.is_integer:
            return a
        return None


class RoundDecimal(sympy.Function):
    """Python's round(x, ndigits) on a float."""

    nargs = (2,)

    @classmethod
    def eval(cls, a, ndigits):
        if a.is_Number and ndigits.is_Integer:
            return sympy.Float(round(float(a), int(ndigits)))
        return None


class BitwiseAnd(sympy.Function):
    is_integer = True
    nargs = (2,)
    eval = _int_fold(operator.and_)


class BitwiseOr(sympy.Function):
    is_integer = True
    nargs = (2,)
    eval = _int_fold(operator.or_)


class BitwiseXor(sympy.Function):
    is_integer = True
    nargs = (2,)
    eval = _int_fold(operator.xor)


class LShift(sympy.Function):
    is_integer = True
    nargs = (2,)
    eval = _int_fold(operator.lshift)


class RShift(sympy.Function):
    is_integer = True
    nargs = (2,)
    eval = _int_fold(operator.rshift)


def sym_ite(cond, then, other):
    """`then if cond else other`, folded when cond is known."""
    if cond is sympy.true:
        return then
    if cond is sympy.false:
        return other
    return sympy.Piecewise((then, cond), (other, True))


# ----------------------------------------------------------------------------------------------
# Printing to Python source.  Each entry takes (expr, printed args) and returns source text.

def _join(sep: str) -> Callable:
    return lambda e, a, p: "(" + sep.join(a) + ")"


def _print_mul(e, a, p):
    # sympy writes a/b as Mul(a, Pow(b, -1)); print exact rational quotients as true division.
    nums, dens = [], []
    for factor, text in zip(e.args, a):
        if isinstance(factor, sympy.Pow) and factor.exp.is_Integer and factor.exp < 0:
            dens.append(p(factor.base ** -factor.exp))
        elif factor.is_Rational and not factor.is_Integer:
            nums.append(str(factor.p))
            dens.append(str(factor.q))
        else:
            nums.append(text)
    text = "(" + " * ".join(nums or ["1"]) + ")"
    return f"({text} / ({' * '.join(dens)}))" if dens else text


def _print_pow(e, a, p):
    return f"({a[0]} ** {a[1]})"


def _print_rational(e, a, p):
    return f"({e.p} / {e.q})"


def _print_piecewise(e, a, p):
    (then, cond), (other, _) = e.args
    return f"({p(then)} if {p(cond)} else {p(other)})"


_PRINTERS: dict[type, Callable] = {
    sympy.Add: _join(" + "),
    sympy.Mul: _print_mul,
    sympy.Pow: _print_pow,
    sympy.Integer: lambda e, a, p: str(int(e)),
    sympy.Rational: _print_rational,
    sympy.Float: lambda e, a, p: repr(float(e)),
    sympy.Eq: lambda e, a, p: f"({a[0]} == {a[1]})",
    sympy.Ne: lambda e, a, p: f"({a[0]} != {a[1]})",
    sympy.Lt: lambda e, a, p: f"({a[0]} < {a[1]})",
    sympy.Le: lambda e, a, p: f"({a[0]} <= {a[1]})",
    sympy.Gt: lambda e, a, p: f"({a[0]} > {a[1]})",
    sympy.Ge: lambda e, a, p: f"({a[0]} >= {a[1]})",
    sympy.And: _join(" and "),
    sympy.Or: _join(" or "),
    sympy.Not: lambda e, a, p: f"(not {a[0]})",
    sympy.Min: lambda e, a, p: "min(" + ", ".join(a) + ")",
    sympy.Max: lambda e, a, p: "max(" + ", ".join(a) + ")",
    sympy.Abs: lambda e, a, p: f"abs({a[0]})",
    sympy.Mod: lambda e, a, p: f"({a[0]} % {a[1]})",
    sympy.floor: lambda e, a, p: f"math.floor({a[0]})",
    sympy.ceiling: lambda e, a, p: f"math.ceil({a[0]})",
    sympy.Piecewise: _print_piecewise,
    FloorDiv: lambda e, a, p: f"({a[0]} // {a[1]})",
    Trunc: lambda e, a, p: f"math.trunc({a[0]})",
    Round: lambda e, a, p: f"round({a[0]})",
    RoundDecimal: lambda e, a, p: f"round({a[0]}, {a[1]})",
    BitwiseAnd: lambda e, a, p: f"({a[0]} & {a[1]})",
    BitwiseOr: lambda e, a, p: f"({a[0]} | {a[1]})",
    BitwiseXor: lambda e, a, p: f"({a[0]} ^ {a[1]})",
    LShift: lambda e, a, p: f"({a[0]} << {a[1]})",
    RShift: lambda e, a, p: f"({a[0]} >> {a[1]})",
    type(sympy.true): lambda e, a, p: "True",
    type(sympy.false): lambda e, a, p: "False",
}

# Unary math functions used by SymFloat (math.sqrt(x) on a SymFloat and the like).
# sqrt prints through Pow (x ** 1/2) and log2 through log(x) / log(2).
MATH_FUNCTIONS: dict[str, Callable] = {
    "sqrt": sympy.sqrt, "cos": sympy.cos, "cosh": sympy.cosh, "sin": sympy.sin,
    "sinh": sympy.sinh, "tan": sympy.tan, "tanh": sympy.tanh, "asin": sympy.asin,
    "acos": sympy.acos, "atan": sympy.atan, "log2": lambda x: sympy.log(x, 2),
}
for _fn in (sympy.cos, sympy.cosh, sympy.sin, sympy.sinh, sympy.tan, sympy.tanh, sympy.asin,
            sympy.acos, sympy.atan, sympy.log, sympy.exp):
    _PRINTERS[_fn] = (lambda n: lambda e, a, p: f"math.{n}({', '.join(a)})")(_fn.__name__)


def to_python(expr: sympy.Basic, names: Mapping[sympy.Symbol, str]) -> str:
    """Python source for `expr`, with each symbol printed as `names[symbol]`; needs `math`."""

    def p(e) -> str:
        if isinstance(e, sympy.Symbol):
            if e not in names:
                raise KeyError(f"symbol {e} has no source among the guard function's inputs")
            return names[e]
        if isinstance(e, sympy.Piecewise):      # its args are (expr, cond) pairs, not exprs
            return _print_piecewise(e, [], p)
        for klass in type(e).__mro__:
            printer = _PRINTERS.get(klass)
            if printer is not None:
                return printer(e, [p(arg) for arg in e.args], p)
        raise NotImplementedError(f"kiln cannot print {type(e).__name__} ({e}) as Python")

    return p(sympy.sympify(expr))
