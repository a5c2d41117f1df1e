"""Index simplification with loop bounds: `floor(a/b)` and `Mod(a, b)` where the loop ranges prove
the remainder stays in `[0, b)`.

Reshapes lower to div/mod (lowering.reshape_index); once a consumer's loops are substituted in,
most of them cancel — `floor((32*x0 + x1)/32)` is `x0` when `0 <= x1 < 32` — but sympy cannot see
that without the bounds. Simplified indices let the scheduler prove that a read hits the element a
fused producer wrote, and keep divisions out of inner loops.
"""
from __future__ import annotations

from typing import Mapping

import sympy


def _bounds(expr: sympy.Expr, upper: Mapping[sympy.Symbol, sympy.Expr]) -> tuple | None:
    """(min, max) of an index `expr` over loop variables in [0, upper), or None if unknown.

    Interval arithmetic over sums, constant multiples, Min/Max (a clamped window index:
    pooling's `Max(0, 2*x1 - 1)`), floor division and Mod by positive integers."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return expr, expr
    if isinstance(expr, sympy.Symbol):
        bound = sympy.sympify(upper.get(expr)) if expr in upper else None
        if bound is None or not bound.is_number:
            return None
        return sympy.Integer(0), bound - 1
    if isinstance(expr, sympy.Add):
        lo = hi = sympy.Integer(0)
        for term in expr.args:
            b = _bounds(term, upper)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Rational or coeff == 1:
            return None
        b = _bounds(rest, upper)
        if b is None:
            return None
        return (coeff * b[0], coeff * b[1]) if coeff > 0 else (coeff * b[1], coeff * b[0])
    if isinstance(expr, (sympy.Min, sympy.Max)):
        bs = [_bounds(a, upper) for a in expr.args]
        if any(b is None for b in bs):
            return None
        pick = min if isinstance(expr, sympy.Min) else max
        return pick(b[0] for b in bs), pick(b[1] for b in bs)
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        b = _bounds(num, upper) if den.is_Integer and den > 0 else None
        if b is None:
            return None
        return sympy.floor(b[0] / den), sympy.floor(b[1] / den)
    if isinstance(expr, sympy.Mod):
        num, den = expr.args
        b = _bounds(num, upper) if den.is_Integer and den > 0 else None
        if b is None or b[0] < 0:
            return None
        if b[1] < den:
            return b
        return sympy.Integer(0), den - 1
    return None


index_bounds = _bounds   # the printers prove loads in bounds with it


def _split(num: sympy.Expr, den: sympy.Integer, upper) -> tuple | None:
    """num = den*q + r with r's range inside [0, den): return (q, r)."""
    q, r = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(num)):
        coeff, rest = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % int(den) == 0:
            q += (coeff // den) * rest
        else:
            r += term
    b = _bounds(r, upper)
    if b is None or b[0] < 0 or b[1] >= den:
        return None
    return q, r


def _split_factor(term: sympy.Expr, kind) -> tuple | None:
    """term = coefficient * f with f the one factor of type `kind`: (coefficient, f), else None."""
    factors = [f for f in sympy.Mul.make_args(term) if isinstance(f, kind)]
    if len(factors) != 1:
        return None
    return sympy.Mul(*[f for f in sympy.Mul.make_args(term) if f is not factors[0]]), factors[0]


def _merge_div_mod(e: sympy.Expr) -> sympy.Expr:
    """c*Mod(a, b) + c*b*floor(a/b) -> c*a: a split index put back together (c and b may be
    symbolic sizes), as often as it applies: a dim split in three (a reshape of 2304 into
    [3, 12, 64] and back, the fused qkv gradient of an attention block) is
    `Mod(x, 64) + 64*Mod(floor(x/64), 12) + 768*floor(x/768)`, where `floor(x/768)` is
    `floor(floor(x/64)/12)`: it merges into `64*floor(x/64)`, and that with `Mod(x, 64)` into `x`."""
    while True:
        merged = _merge_once(e)
        if merged == e:
            return e
        e = merged


def _merge_once(e: sympy.Expr) -> sympy.Expr:
    terms = list(sympy.Add.make_args(e))
    mods = {}
    for i, t in enumerate(terms):
        split = _split_factor(t, sympy.Mod)
        if split is not None:
            a, b = split[1].args
            mods[(a, b)] = (i, split[0], a, b)
            if isinstance(a, sympy.floor):     # Mod(floor(n/d), b) pairs with floor(n/(d*b)) too
                num, den = sympy.fraction(sympy.together(a.args[0]))
                mods.setdefault((num, den * b), (i, split[0], a, b))
    if not mods:
        return e
    used = set()
    for j, t in enumerate(terms):
        split = _split_factor(t, sympy.floor)
        if split is None:
            continue
        c2, rest = split
        num, den = sympy.fraction(sympy.together(rest.args[0]))
        hit = mods.get((num, den))
        if hit is None or hit[0] in used:
            continue
        i, c, a, b = hit
        if sympy.expand(c2 - c * b) == 0:
            terms[i], terms[j] = c * a, sympy.Integer(0)
            used.add(i)
    return sympy.Add(*terms)


def _decide_min_max(e, upper):
    """Min/Max whose winner the bounds decide (a clamp that never bites: `Min(15, x0)`, x0 < 16)."""
    bounds = [_bounds(a, upper) for a in e.args]
    if any(b is None for b in bounds):
        return e
    for a, (lo, hi) in zip(e.args, bounds):
        others = [b for b2, b in zip(e.args, bounds) if b2 is not a]
        if isinstance(e, sympy.Min) and all(hi <= o[0] for o in others):
            return a
        if isinstance(e, sympy.Max) and all(lo >= o[1] for o in others):
            return a
    return e


def simplify_index(expr, upper: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """Rewrite floor/Mod sub-terms of `expr` that the bounds `upper` (var -> exclusive bound) decide."""
    expr = sympy.sympify(expr)
    if not expr.has(sympy.floor, sympy.Mod, sympy.Min, sympy.Max):
        return expr

    def visit(e):
        if not e.args:
            return e
        e = e.func(*[visit(a) for a in e.args])
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den.is_Integer and den > 0:
                split = _split(num, den, upper)
                if split is not None:
                    return split[0]
        elif isinstance(e, sympy.Mod):
            num, den = e.args
            if den.is_Integer and den > 0:
                split = _split(num, den, upper)
                if split is not None:
                    return split[1]
        elif isinstance(e, (sympy.Min, sympy.Max)):
            return _decide_min_max(e, upper)
        elif isinstance(e, sympy.Add):
            return _merge_div_mod(e)
        return e
    return visit(expr)
