"""Index expressions (sympy over loop variables and size symbols) as Triton text.

A Triton program walks a flat `xindex` over the kernel's outer ranges (and a flat `rindex` over a
stage's reduction ranges). Writing a load's offset through per-dim indices
(`x0 = xindex // s1`, `x1 = xindex % s1`, offset `x0*s1 + x1`) hides from Triton that the access
is contiguous, and contiguous accesses are what become 128-bit vector loads. So the linear part of
an offset is regrouped by runs of dims that are laid out one inside the other:

    [Note: collapsing runs of dims]
    With ranges r_0..r_{n-1}, flat index f = sum_d x_d * S_d where S_d = r_{d+1} * ... * r_{n-1}.
    If an offset's coefficients satisfy c_{d-1} = c_d * r_d for d in a..b, then
    sum_{d=a..b} c_d x_d = c_b * ((f // S_b) % (r_a * ... * r_b)). The `% ...` is dropped when
    a = 0 (f < numel) and `// S_b` when b = n-1 (S_b = 1). A contiguous tensor's offset is just `f`,
    a row vector broadcast over rows is `f % s1`, a per-row value `f // s1`.

Terms that are not linear in one loop variable (floor, Mod, products of indirect values) are
printed with per-dim index variables, which the kernel defines from the flat index.

    [Note: one division per symbolic dim]
    A division by a constant compiles to a multiply and a shift; by a size that arrives at run time
    (dynamic=True's sequence length s1) it is a few dozen instructions, per element. Printed run by
    run, the head split of a BERT layer's q/k/v over (s0, 12, s1, 64) divided by `768*s1`, `64*s1`
    and `s1` for every element: by instruction counts (not measured yet) enough integer work to
    bound a copy that moves a few bytes an element, which the static kernel does in a few
    instructions. So in an x space with a symbolic range the quotients `q_b = xindex // S_b` are
    named once at the top of the kernel as a chain, `q_d = q_{d+1} // r_{d+1}` (one division per
    dim, a runtime one only for a symbolic r), and a run's remainder `q_b % (r_a*...*r_b)` of a
    symbolic extent is `q_b - q_{a-1} * (r_a*...*r_b)`.
    Spaces of static ranges print as before.

Hands on: `IndexPrinter` (`expr(e)`, `offset(e)`), `dims_of(expr)`.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import sympy

from kiln.codegen.indexing import nonnegative
from kiln.codegen.ir import is_loop_var


def _kind(sym: sympy.Symbol) -> str:
    return sym.name[0] if is_loop_var(sym) else "s"


def dims_of(expr: sympy.Expr) -> frozenset[str]:
    """Which flat indices an index expression depends on: a subset of {"x", "r", "t"}."""
    return frozenset(_kind(s) for s in sympy.sympify(expr).free_symbols if _kind(s) != "s")


@dataclasses.dataclass
class LoopSpace:
    """One flattened loop: its variables' symbols, their ranges, and the flat index's name."""

    prefix: str                       # "x" or "r"
    ranges: tuple[sympy.Expr, ...]
    flat: str                         # the name of the flat index in the kernel ("xindex")

    def strides(self) -> list[sympy.Expr]:
        out, running = [], sympy.Integer(1)
        for r in reversed(self.ranges):
            out.append(running)
            running = running * r
        return list(reversed(out))

    def var(self, d: int) -> sympy.Symbol:
        return sympy.Symbol(f"{self.prefix}{d}", integer=True, nonnegative=True)

    def per_dim_name(self, d: int) -> str:
        return f"{self.prefix}{d}_"

    def per_dim_text(self, d: int, printer: "IndexPrinter") -> str:
        """The kernel line defining dim d's index from the flat index."""
        return printer.remainder(self, d, d) if d > 0 else printer.quotient(self, 0)

    def chained(self) -> bool:
        """Whether quotients of the flat index are named as a chain ([Note: one division per
        symbolic dim]): an x space with a symbolic range."""
        return self.prefix == "x" and any(not sympy.sympify(r).is_number for r in self.ranges)

    def quotient_name(self, b: int) -> str:
        return f"{self.prefix}q{b}_"


def _same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


class IndexPrinter:
    """Prints index expressions for one kernel; `used_dims` collects per-dim variables to define."""

    def __init__(self, spaces: Sequence[LoopSpace], names: Mapping[str, str]):
        self.spaces = {s.prefix: s for s in spaces}
        self.names = dict(names)      # size symbol / indirect symbol name -> kernel text
        self.used_dims: set[tuple[str, int]] = set()
        self.used_quotients: set[tuple[str, int]] = set()   # [Note: one division per symbolic dim]

    # -- the flat index's quotients and remainders
    def quotient(self, space: LoopSpace, b: int) -> str:
        """`flat // S_b` (S_b: the product of the ranges inside dim b)."""
        stride = space.strides()[b]
        if stride == 1:
            return space.flat
        if not space.chained():
            return f"({space.flat} // {self.expr(stride)})"
        self.used_quotients.add((space.prefix, b))
        return space.quotient_name(b)

    def remainder(self, space: LoopSpace, a: int, b: int) -> str:
        """`(flat // S_b) % (r_a * ... * r_b)`, for a > 0."""
        extent = sympy.Mul(*space.ranges[a:b + 1])
        q = self.quotient(space, b)
        if not space.chained() or extent.is_number:
            return f"({q} % {self.expr(extent)})"
        return f"({q} - {self.quotient(space, a - 1)} * {self.expr(extent)})"

    def quotient_lines(self, space: LoopSpace) -> list[str]:
        """The chain of named quotients the printed text uses, innermost first: `name = text`."""
        used = [b for p, b in self.used_quotients if p == space.prefix]
        if not used:
            return []
        lines, inner, n = [], space.flat, len(space.ranges)
        for d in range(n - 2, min(used) - 1, -1):
            r = sympy.sympify(space.ranges[d + 1])
            text = inner if r == 1 else f"({inner} // {self.expr(r)})"
            lines.append(f"{space.quotient_name(d)} = {text}")
            inner = space.quotient_name(d)
        return lines

    # -- plain printing of sympy
    def expr(self, e) -> str:
        e = sympy.sympify(e)
        printer = _PRINTERS.get(type(e).__name__) or _PRINTERS.get(e.func.__name__)
        if printer is None:
            for base in type(e).__mro__:
                printer = _PRINTERS.get(base.__name__)
                if printer is not None:
                    break
        if printer is None:
            raise NotImplementedError(f"the Triton printer cannot print index expression {e} "
                                      f"({type(e).__name__}); kiln.codegen.triton.index handles "
                                      f"{sorted(_PRINTERS)}")
        return printer(self, e)

    def symbol(self, s: sympy.Symbol) -> str:
        if is_loop_var(s) and s.name[0] in self.spaces:
            space = self.spaces[s.name[0]]
            d = int(s.name[1:])
            self.used_dims.add((space.prefix, d))
            return space.per_dim_name(d)
        if s.name in self.names:
            return self.names[s.name]
        if is_loop_var(s):
            raise NotImplementedError(f"index variable {s} has no loop in this kernel")
        return s.name

    def _drop_unit_dims(self, e) -> sympy.Expr:
        """`e` with the variables of size-1 dims (always 0) replaced by 0."""
        zero = {space.var(d): 0 for space in self.spaces.values()
                for d, r in enumerate(space.ranges) if r == 1}
        e = sympy.sympify(e)
        return e.xreplace(zero) if zero else e

    def dims(self, e) -> frozenset[str]:
        """The block dims ("x", "r") an index expression really varies along in this kernel."""
        return dims_of(self._drop_unit_dims(e)) - {"t"}

    # -- offsets with contiguous runs collapsed
    def offset(self, e) -> str:
        e = sympy.expand(self._drop_unit_dims(e))
        linear: dict[sympy.Symbol, sympy.Expr] = {}
        rest = []
        for term in sympy.Add.make_args(e):
            loop_syms = [s for s in term.free_symbols if is_loop_var(s) and s.name[0] in self.spaces]
            if len(loop_syms) == 1:
                coeff, dep = term.as_independent(loop_syms[0], as_Add=False)
                if dep == loop_syms[0] and not any(is_loop_var(s) for s in coeff.free_symbols):
                    linear[dep] = linear.get(dep, 0) + coeff
                    continue
            rest.append(term)
        pieces = []
        for space in self.spaces.values():
            pieces += self._runs(space, linear)
        if rest:
            pieces.append(self.expr(sympy.Add(*rest)))
        return " + ".join(pieces) if pieces else "0"

    def _runs(self, space: LoopSpace, linear: Mapping[sympy.Symbol, sympy.Expr]) -> list[str]:
        # Size-1 dims are always 0: they neither contribute nor break a run.
        dims = [d for d, r in enumerate(space.ranges) if r != 1]
        coeffs = {d: sympy.sympify(linear.get(space.var(d), 0)) for d in dims}
        out, i = [], 0
        while i < len(dims):
            if coeffs[dims[i]] == 0:
                i += 1
                continue
            start = i
            while (i + 1 < len(dims) and coeffs[dims[i + 1]] != 0
                   and _same(coeffs[dims[i]], coeffs[dims[i + 1]] * space.ranges[dims[i + 1]])):
                i += 1
            a, b = dims[start], dims[i]
            if start > 0 or any(r != 1 for r in space.ranges[:a]):
                text = self.remainder(space, a, b)
            else:
                text = self.quotient(space, b)
            out.append(text if coeffs[b] == 1 else f"{self.expr(coeffs[b])} * {text}")
            i += 1
        return out


def _p_add(p: IndexPrinter, e) -> str:
    return "(" + " + ".join(p.expr(a) for a in e.args) + ")"


def _p_mul(p: IndexPrinter, e) -> str:
    num, den = sympy.fraction(e)
    if den != 1:
        raise NotImplementedError(f"index expression {e} divides outside floor(); lowering should use floor")
    coeff, rest = e.as_coeff_Mul()
    factors = [p.expr(a) for a in sympy.Mul.make_args(rest)]
    if coeff == -1:
        return "(-" + " * ".join(factors) + ")"
    if coeff != 1:
        factors.insert(0, p.expr(coeff))
    return "(" + " * ".join(factors) + ")"


# Triton's integer `//` and `%` truncate toward zero, as C's; sympy's floor and Mod round down.
# They agree on non-negative operands (`indexing.nonnegative`); the others print floor forms, as
# the C++ printer's kiln_floordiv / kiln_remainder do: a flip of a transposed view read by a cat
# indexes `Mod(4 - Max(0, x0 - 15), 5)`, whose dividend goes negative on rows the cat selects
# (fuzz seed 1000484 of --triton-interpret: every such element read out of bounds).
def _p_floor(p: IndexPrinter, e) -> str:
    num, den = sympy.fraction(sympy.together(e.args[0]))
    if den == 1:
        return p.expr(num)
    num = sympy.expand(num)
    if nonnegative(num) and nonnegative(den):
        return f"({p.expr(num)} // {p.expr(den)})"
    a, b = p.expr(num), p.expr(den)
    return f"(({a} - {_floor_mod(a, b, nonnegative(den))}) // {b})"


def _p_mod(p: IndexPrinter, e) -> str:
    a, b = e.args
    if nonnegative(a) and nonnegative(b):
        return f"({p.expr(a)} % {p.expr(b)})"
    return _floor_mod(p.expr(a), p.expr(b), nonnegative(b))


def _floor_mod(a: str, b: str, positive_divisor: bool) -> str:
    """`a` mod `b` with the sign of `b` (sympy's Mod) from C's truncating `%`."""
    if positive_divisor:
        return f"((({a} % {b}) + {b}) % {b})"
    return f"tl.where((({a} % {b}) != 0) & ((({a} % {b}) < 0) != ({b} < 0)), ({a} % {b}) + {b}, {a} % {b})"


def _p_pow(p: IndexPrinter, e) -> str:
    base, exp = e.args
    if exp.is_Integer and exp > 0:
        return "(" + " * ".join([p.expr(base)] * int(exp)) + ")"
    raise NotImplementedError(f"index expression {e}: only positive integer powers print")


def _p_minmax(fn: str):
    def printer(p: IndexPrinter, e) -> str:
        args = [p.expr(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    return printer


_PRINTERS = {
    "Integer": lambda p, e: str(int(e)),
    "Zero": lambda p, e: "0",
    "One": lambda p, e: "1",
    "NegativeOne": lambda p, e: "-1",
    "Symbol": lambda p, e: p.symbol(e),
    "Add": _p_add,
    "Mul": _p_mul,
    "floor": _p_floor,
    "FloorDiv": lambda p, e: f"({p.expr(e.args[0])} // {p.expr(e.args[1])})",
    "Mod": _p_mod,
    "Pow": _p_pow,
    "Min": _p_minmax("tl.minimum"),
    "Max": _p_minmax("tl.maximum"),
}
