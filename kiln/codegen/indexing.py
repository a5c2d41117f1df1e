"""Index simplification with loop bounds: `floor(a/b)` and `Mod(a, b)` where the loop ranges prove
the remainder stays in `[0, b)`, for numbers and for symbolic sizes alike ([Note: symbolic index
bounds]).

Reshapes lower to div/mod (lowering.reshape_index); once a consumer's loops are substituted in,
most of them cancel — `floor((32*x0 + x1)/32)` is `x0` when `0 <= x1 < 32` — but sympy cannot see
that without the bounds. Simplified indices let the scheduler prove that a read hits the element a
fused producer wrote, and keep divisions out of inner loops.
"""
from __future__ import annotations

from typing import Mapping

import sympy


class _NumbersOnly:
    """[Note: clamps that do not compare] sympy's Min and Max order their arguments as they are
    built, proving inequalities between them through the assumptions system: about 3 ms for a loop
    variable against a symbolic size, which it can never decide (neither bounds the other), and
    paid again at each substitution (xreplace rebuilds the node): 2.9 s of a 32-layer decode
    step's lowering went to its key/value cats' clamps, and 3 s more of its scheduling once those
    were built unevaluated. The clamps kiln writes into indices (cat and pad reading inside their
    piece, matmul padding) are these `Min` / `Max`, which fold numbers and nested clamps only;
    whether a clamp bites is decided against the loop ranges by `simplify_index`. They print, and
    are tested with isinstance, as sympy's."""

    @classmethod
    def _collapse_arguments(cls, args, **assumptions):
        numbers = [a for a in args if a.is_number]
        if len(numbers) < 2:
            return args
        keep = (min if issubclass(cls, sympy.Min) else max)(numbers)
        return [a for a in args if not a.is_number] + [keep]

    @classmethod
    def _find_localzeros(cls, values, **options):
        return values


class Min(_NumbersOnly, sympy.Min):
    pass


class Max(_NumbersOnly, sympy.Max):
    pass


def _size(e: sympy.Expr) -> bool:
    """Whether `e` is a constant of the loop nest: a number, or an expression of size symbols
    (positive integers; loop variables are only nonnegative, gather variables of unknown sign)."""
    return all(s.is_positive for s in e.free_symbols)


def _le(a, b) -> bool:
    """a <= b, proven (for every value of the size symbols)."""
    d = sympy.expand(b - a)
    return bool(d >= 0) if d.is_number else d.is_nonnegative is True


def _bounds(expr: sympy.Expr, upper: Mapping[sympy.Symbol, sympy.Expr]) -> tuple | None:
    """(min, max) of an index `expr` over loop variables in [0, upper), or None if unknown.

    Interval arithmetic over sums, multiples by constants (numbers or size expressions: `s1*x0`),
    Min/Max (a clamped window index: pooling's `Max(0, 2*x1 - 1)`), floor division and Mod by
    positive constants. A bound is an expression of the size symbols where a bound or a factor is
    symbolic ([Note: symbolic index bounds])."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return expr, expr
    if isinstance(expr, sympy.Symbol):
        if expr in upper:
            bound = sympy.sympify(upper[expr])
            return (sympy.Integer(0), bound - 1) if _size(bound) else None
        return (expr, expr) if expr.is_positive else None
    if isinstance(expr, sympy.Add):
        lo = hi = sympy.Integer(0)
        for term in expr.args:
            b = _bounds(term, upper)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if isinstance(expr, sympy.Mul):
        factors = sympy.Mul.make_args(expr)
        const = sympy.Mul(*[f for f in factors if _size(f)])
        rest = [f for f in factors if not _size(f)]
        if len(rest) != 1 or const == 1:
            return None
        b = _bounds(rest[0], upper)
        if b is None:
            return None
        if const.is_nonnegative:
            return const * b[0], const * b[1]
        return (const * b[1], const * b[0]) if const.is_nonpositive else None
    if _size(expr):
        return expr, expr           # a power or product of sizes
    if isinstance(expr, (sympy.Min, sympy.Max)):
        bs = [_bounds(a, upper) for a in expr.args]
        if any(b is None for b in bs) or not all(x.is_number for b in bs for x in b):
            return None
        pick = min if isinstance(expr, sympy.Min) else max
        return pick(b[0] for b in bs), pick(b[1] for b in bs)
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        b = _bounds(num, upper) if _positive_constant(den) else None
        if b is None:
            return None
        return sympy.floor(b[0] / den), sympy.floor(b[1] / den)
    if isinstance(expr, sympy.Mod):
        num, den = expr.args
        b = _bounds(num, upper) if _positive_constant(den) else None
        if b is None or not _le(0, b[0]):
            return None
        if _le(b[1] + 1, den):
            return b
        return sympy.Integer(0), den - 1
    return None


def _positive_constant(den: sympy.Expr) -> bool:
    return (den.is_Integer and den > 0) or (not den.is_number and _size(den) and den.is_positive is True)


def index_bounds(expr: sympy.Expr, upper: Mapping[sympy.Symbol, sympy.Expr]) -> tuple | None:
    """`_bounds` where both are numbers (the printers prove loads in bounds with it, and the
    scheduler folds comparisons), else None."""
    b = _bounds(expr, upper)
    return b if b is not None and b[0].is_number and b[1].is_number else None


# [Note: symbolic index bounds] With a symbolic size (dynamic=True's sequence length s1), a
# reshape's div/mod is by `s1` or `768*s1`, and the loop bounds are `x1 < s1`: the same proof as
# for numbers, with the comparisons decided by sympy over positive size symbols (`64*s1 - 1 <
# 64*s1`). Without it a symbolic graph kept `s1*floor((s1*x0 + x1)/s1) + Mod(x1, s1)` where the
# static graph has `128*x0 + x1`: the scheduler could not prove a layer_norm's epilogue reads what
# its reduction wrote (one kernel more, and a pass over the activations), and kernels divided by
# runtime sizes per element.


def _split(num: sympy.Expr, den: sympy.Expr, upper) -> tuple | None:
    """num = den*q + r with r's range inside [0, den): return (q, r). `den` is a positive integer
    or a size expression ([Note: symbolic index bounds])."""
    q, r = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(num)):
        if den.is_Integer:
            coeff, rest = term.as_coeff_Mul()
            if coeff.is_Integer and int(coeff) % int(den) == 0:
                q += (coeff // den) * rest
                continue
        else:
            quotient = sympy.cancel(term / den)
            if sympy.fraction(quotient)[1] == 1 and quotient.as_coeff_Mul()[0].is_Integer:
                q += quotient
                continue
        r += term
    b = _bounds(r, upper)
    if b is None or not _le(0, b[0]) or not _le(b[1] + 1, den):
        return None
    return q, r


def _scaled_split(num: sympy.Expr, den: sympy.Integer, upper) -> tuple | None:
    """num = den*q + r where the exact split fails but num's terms are multiples of a divisor `c`
    of `den` but for a remainder in [0, c): floor(num/den) = floor((num - R)/c / (den/c)). An index
    of a dim split in two, relaid: the channel shuffle's `[b, 58, 2, h, w]` read as `[b, 116, h, w]`
    is `784*x1 + 28*x2 + x3` in contiguous strides; its dim of stride 1568 is
    `floor((784*x1 + 28*x2 + x3)/1568)`, which is `floor(x1/2)` as `28*x2 + x3 < 784`."""
    q, rest = sympy.Integer(0), []
    for term in sympy.Add.make_args(sympy.expand(num)):
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % int(den) == 0:
            q += term / den
        else:
            rest.append(term)
    divisors = sorted({sympy.gcd(t.as_coeff_Mul()[0], den) for t in rest if t.as_coeff_Mul()[0].is_Integer}, reverse=True)
    for c in divisors:
        if c in (1, den):
            continue
        big = [t for t in rest if t.as_coeff_Mul()[0].is_Integer and t.as_coeff_Mul()[0] % c == 0]
        small = sympy.Add(*[t for t in rest if not any(t is b for b in big)])
        b = _bounds(small, upper)
        if b is None or not _le(0, b[0]) or not _le(b[1] + 1, c):
            continue
        inner = sympy.expand(sympy.Add(*big) / c)
        d = den // c
        q_in, r_in = simplify_index(sympy.floor(inner / d), upper), simplify_index(sympy.Mod(inner, d), upper)
        return q + q_in, c * r_in + small
    return None


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
    bounds = [index_bounds(a, upper) for a in e.args]
    if any(b is None for b in bounds):
        return e
    for a, (lo, hi) in zip(e.args, bounds):
        others = [b for b2, b in zip(e.args, bounds) if b2 is not a]
        if isinstance(e, sympy.Min) and all(hi <= o[0] for o in others):
            return a
        if isinstance(e, sympy.Max) and all(lo >= o[1] for o in others):
            return a
    return e


# [Note: index memo] Lowering and scheduling meet the same index expressions over and over: the
# layers of a model are one layer repeated, and their kernels index alike (GPT-2's twelve blocks:
# 233 of 264 kernels repeat one another). sympy rebuilds and re-simplifies each from scratch, most
# of a cold compile's lowering and scheduling time, so the pure functions of an expression and its
# loop bounds remember their results: simplify_index here, ir.subs_index's substitutions. sympy
# expressions are immutable and compare by structure (assumptions included), so a hit is the
# answer the work would give. Bounded: cleared when full.
_MEMO_LIMIT = 200_000
_SIMPLIFIED: dict = {}


def _decided_before_evaluation(e: sympy.Expr, args: list, upper) -> sympy.Expr | None:
    """A floor or Mod the bounds decide, answered from its (simplified) arguments before sympy
    rebuilds the node: sympy's own floor and Mod evaluation of a long sum costs tenths of a second
    each (layout.py builds its relaid indices unevaluated for this). The split is exact whenever
    it applies, as after evaluation."""
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(args[0]))
        which = 0
    elif isinstance(e, sympy.Mod):
        (num, den), which = args, 1
    else:
        return None
    if not (den.is_Integer and den > 0):
        return None
    split = _split(num, den, upper) or _scaled_split(num, den, upper)
    return None if split is None else split[which]


def simplify_index(expr, upper: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """Rewrite floor/Mod sub-terms of `expr` that the bounds `upper` (var -> exclusive bound) decide."""
    expr = sympy.sympify(expr)
    if not expr.has(sympy.floor, sympy.Mod, sympy.Min, sympy.Max):
        return expr
    key = (expr, frozenset(upper.items()))         # [Note: index memo]
    done = _SIMPLIFIED.get(key)
    if done is None:
        if len(_SIMPLIFIED) >= _MEMO_LIMIT:
            _SIMPLIFIED.clear()
        done = _SIMPLIFIED[key] = _simplify_index(expr, upper)
    return done


def _simplify_index(expr: sympy.Expr, upper: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:

    def visit(e):
        if not e.args:
            return e
        args = [visit(a) for a in e.args]
        decided = _decided_before_evaluation(e, args, upper)
        if decided is not None:
            return decided
        e = e.func(*args)
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if _positive_constant(den):
                split = _split(num, den, upper)
                if split is not None:
                    return split[0]
        elif isinstance(e, sympy.Mod):
            num, den = e.args
            if _positive_constant(den):
                split = _split(num, den, upper)
                if split is not None:
                    return split[1]
        elif isinstance(e, (sympy.Min, sympy.Max)):
            return _decide_min_max(e, upper)
        elif isinstance(e, sympy.Add):
            return _merge_div_mod(e)
        return e
    return visit(expr)


def nonnegative(e) -> bool:
    """Whether index expression `e` is >= 0 by its form: loop variables and sizes are, and so are
    sums and products of them with non-negative coefficients, Mods and floors of such. The
    printers print C's truncating `/` and `%` (C++'s, Triton's) only where this holds: sympy's
    floor and Mod round down."""
    e = sympy.sympify(e)
    if e.is_number:
        return bool(e >= 0)
    if e.is_Symbol or isinstance(e, sympy.Mod):
        return True
    if isinstance(e, sympy.floor):
        return nonnegative(e.args[0])
    if e.is_Add or e.is_Mul or isinstance(e, sympy.Min):
        return all(nonnegative(t) for t in e.args)
    if isinstance(e, sympy.Max):
        return any(nonnegative(t) for t in e.args)
    if e.is_Pow:
        return e.exp.is_Integer and e.exp > 0 and nonnegative(e.base)
    return False
