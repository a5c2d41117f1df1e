"""kiln's SymNode: the object inside every `torch.SymInt`, `torch.SymFloat` and `torch.SymBool`.

A SymNode is a sympy expression over the shape environment's symbols plus its concrete value (the
hint) for the real inputs it was traced with; None when the expression holds an unbacked symbol,
a value known only at run time ([Note: unbacked sizes] in shape_env.py), and so does any node
computed from one. ATen's C++ meta kernels and torch's Python magic
methods call back into it: arithmetic builds a new node, and any question whose answer the
program branches on (`guard_bool`, `guard_int`, `int_`, `bool_`, ...) is answered from the hint
and recorded as a guard by the `ShapeEnv` (see shape_env.py), unless the answer is already known
from the facts. The method set is the protocol of torch's `PythonSymNodeImpl` (C++) and of the
magic methods installed on `torch.SymInt` & co; they are defined from tables below, one row per
operation, so an operation is added in one place.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import Any, Callable

import sympy

from kiln.symbolic import sympy_ops as S

_SAME = "same"  # result has the type of the left operand


def _is_logical(e) -> bool:
    # sympy's Symbol subclasses Boolean, but every kiln symbol is an integer.
    return isinstance(e, sympy.logic.boolalg.Boolean) and not isinstance(e, sympy.Symbol)


def _bool_eq(a, b):
    return sympy.Equivalent(a, b) if _is_logical(a) or _is_logical(b) else sympy.Eq(a, b)


def _bool_ne(a, b):
    return sympy.Xor(a, b) if _is_logical(a) or _is_logical(b) else sympy.Ne(a, b)


def _int_pow(a, b):
    if b.is_Integer and b < 0:
        raise ValueError(f"pow_by_natural with a negative exponent {b}")
    return a ** b


# name -> (sympy builder, Python op on hints, result type)
BINARY: dict[str, tuple[Callable, Callable, Any]] = {
    "add": (operator.add, operator.add, _SAME),
    "sub": (operator.sub, operator.sub, _SAME),
    "mul": (operator.mul, operator.mul, _SAME),
    "mod": (sympy.Mod, operator.mod, _SAME),
    "int_floordiv": (S.FloorDiv, operator.floordiv, int),
    "float_truediv": (operator.truediv, operator.truediv, float),
    "int_truediv": (operator.truediv, operator.truediv, float),
    "pow_by_natural": (_int_pow, operator.pow, int),
    "float_pow": (operator.pow, lambda a, b: float(a) ** b, float),
    "and_": (sympy.And, lambda a, b: bool(a and b), bool),
    "or_": (sympy.Or, lambda a, b: bool(a or b), bool),
    "bitwise_and": (S.BitwiseAnd, operator.and_, int),
    "bitwise_or": (S.BitwiseOr, operator.or_, int),
    "bitwise_xor": (S.BitwiseXor, operator.xor, int),
    "lshift": (S.LShift, operator.lshift, int),
    "rshift": (S.RShift, operator.rshift, int),
    "eq": (_bool_eq, operator.eq, bool),
    "ne": (_bool_ne, operator.ne, bool),
    "lt": (sympy.Lt, operator.lt, bool),
    "le": (sympy.Le, operator.le, bool),
    "gt": (sympy.Gt, operator.gt, bool),
    "ge": (sympy.Ge, operator.ge, bool),
    "sym_min": (sympy.Min, min, _SAME),
    "sym_max": (sympy.Max, max, _SAME),
}
# C++ binds only these generic names for division and pow.
BINARY_ALIASES = {"truediv": "float_truediv", "floordiv": "int_floordiv", "pow": "float_pow"}

UNARY: dict[str, tuple[Callable, Callable, Any]] = {
    "neg": (operator.neg, operator.neg, _SAME),
    "pos": (lambda a: a, operator.pos, _SAME),
    "abs": (sympy.Abs, abs, _SAME),
    "floor": (sympy.floor, math.floor, int),
    "ceil": (sympy.ceiling, math.ceil, int),
    "trunc": (S.Trunc, math.trunc, int),
    "sym_int": (S.Trunc, math.trunc, int),
    "sym_float": (lambda a: a, float, float),
    "sym_not": (sympy.Not, operator.not_, bool),
    "is_integer": (lambda a: sympy.Eq(sympy.floor(a), a), lambda a: float(a).is_integer(), bool),
}
for _name, _fn in S.MATH_FUNCTIONS.items():
    UNARY[f"sym_{_name}"] = (_fn, getattr(math, _name), float)


def _contiguous_in_order(sizes, strides, order):
    """sizes/strides are contiguous when walked in `order` (innermost first), or empty."""
    result = sympy.true
    expected = sympy.Integer(1)
    for d in order:
        result = result & (sympy.Eq(sizes[d], 1) | sympy.Eq(strides[d], expected))
        expected = expected * sizes[d]
    for size in sizes:
        result = result | sympy.Eq(size, 0)
    return result


def _channels_last_strides(sizes, strides, order):
    """c10's is_channels_last_strides_{2,3}d: strides increase along `order`, as a predicate."""
    if len(sizes) != len(order):
        return sympy.false
    result = sympy.Ne(strides[1], 0)
    minimum = sympy.Integer(0)
    for d in order:
        result = result & sympy.Ne(sizes[d], 0) & sympy.Ge(strides[d], minimum)
        if d == 0:
            result = result & sympy.Ne(minimum, strides[1])
        minimum = strides[d] * sympy.Max(sizes[d], 1)
    return result


def _rank_order(n):
    return list(range(n - 1, -1, -1))


SIZES_STRIDES: dict[str, Callable] = {
    "is_contiguous": lambda z, s: _contiguous_in_order(z, s, _rank_order(len(z))),
    "is_channels_last_contiguous_2d":
        lambda z, s: _contiguous_in_order(z, s, [1, 3, 2, 0]) if len(z) == 4 else sympy.false,
    "is_channels_last_contiguous_3d":
        lambda z, s: _contiguous_in_order(z, s, [1, 4, 3, 2, 0]) if len(z) == 5 else sympy.false,
    "is_channels_last_strides_2d": lambda z, s: _channels_last_strides(z, s, [1, 3, 2, 0]),
    "is_channels_last_strides_3d": lambda z, s: _channels_last_strides(z, s, [1, 4, 3, 2, 0]),
}


class SymNode:
    """A sympy expression over shape symbols plus its value for the traced inputs."""

    __slots__ = ("expr", "shape_env", "pytype", "hint")

    def __init__(self, expr: sympy.Basic, shape_env, pytype: type, hint: Any):
        self.expr = expr
        self.shape_env = shape_env
        self.pytype = pytype
        self.hint = hint

    # --- what the node is -------------------------------------------------------------------
    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self):
        return None

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        # torch's magic methods turn constant SymInt/SymBool results into plain ints and bools
        # (they cannot do so for SymFloat).
        if self.pytype is int:
            return bool(self.expr.is_Integer)
        return self.pytype is bool and self.expr in (sympy.true, sympy.false)

    def has_hint(self) -> bool:
        return self.hint is not None

    def maybe_as_int(self) -> int | None:
        return int(self.expr) if self.expr.is_Integer else None

    def maybe_as_float(self) -> float | None:
        return float(self.expr) if self.expr.is_Number else None

    def maybe_as_bool(self) -> bool | None:
        return {sympy.true: True, sympy.false: False}.get(self.expr)

    def clone(self) -> "SymNode":
        return self

    def str(self) -> str:
        return str(self.expr)

    __str__ = str

    def _graph_repr(self) -> str:
        return str(self.expr)

    def __repr__(self) -> str:
        return f"SymNode({self.expr}, hint={self.hint})"

    # torch's Python helpers read these private names of its own SymNode.
    @property
    def _hint(self) -> Any:
        return self.hint

    @property
    def _expr(self) -> sympy.Basic:
        return self.expr

    # --- making nodes -----------------------------------------------------------------------
    def _make(self, expr, pytype, hint) -> "SymNode":
        if pytype is not None and hint is not None:
            hint = pytype(hint)
        return SymNode(self.shape_env.simplify(expr), self.shape_env, pytype, hint)

    def wrap_int(self, num: int) -> "SymNode":
        return SymNode(sympy.Integer(num), self.shape_env, int, num)

    def wrap_float(self, num: float) -> "SymNode":
        return SymNode(sympy.Float(num), self.shape_env, float, num)

    def wrap_bool(self, num: bool) -> "SymNode":
        return SymNode(sympy.true if num else sympy.false, self.shape_env, bool, num)

    def sym_sum(self, args: list["SymNode"]) -> "SymNode":
        return self._make(sympy.Add(*[a.expr for a in args]), int,
                          _hinted(sum, [a.hint for a in args]))

    def sym_ite(self, then: "SymNode", other: "SymNode") -> "SymNode":
        hint = None if self.hint is None else (then.hint if self.hint else other.hint)
        return self._make(S.sym_ite(self.expr, then.expr, other.expr), then.pytype, hint)

    def round(self, ndigits: int | None = None) -> "SymNode":
        if ndigits is None:
            return self._make(S.Round(self.expr), int, _hinted(round, self.hint))
        return self._make(S.RoundDecimal(self.expr, sympy.Integer(ndigits)), float,
                          _hinted(round, self.hint, ndigits))

    def is_non_overlapping_and_dense(self, sizes, strides) -> "SymNode":
        """True when some order of the dims is contiguous.

        The order is taken from the hints; when the hinted tensor is dense we return "contiguous
        in that order", which implies density for every value. When it is not, we return the
        negation of a reason it stays not dense (`_not_dense_reason`), so a guard on it holds for
        other sizes of the same layout; only a layout with no such reason specializes every size
        (a kernel asking this of an expanded or sliced input pinned the sequence length, one
        compile per length).
        """
        size_exprs = [s.expr for s in sizes]
        stride_exprs = [s.expr for s in strides]
        if any(n.hint is None for n in (*sizes, *strides)):
            return self._unbacked_dense(size_exprs, stride_exprs)
        hints = [(st.hint, sz.hint, d) for d, (sz, st) in enumerate(zip(sizes, strides))]
        order = [d for _, _, d in sorted(hints)]
        dense = _contiguous_in_order(size_exprs, stride_exprs, order)
        hint_dense = _dense_at_hint([s.hint for s in sizes], [s.hint for s in strides])
        if hint_dense:
            return self._make(dense, bool, True)
        reason = _not_dense_reason(sizes, strides)
        if reason is not None:
            return self._make(sympy.Not(reason), bool, False)
        pinned = [sympy.Eq(n.expr, n.hint) for n in (*sizes, *strides) if not n.expr.is_number]
        return self._make(sympy.Not(sympy.And(*pinned)), bool, False)

    def _unbacked_dense(self, sizes, strides) -> "SymNode":
        """Density of a layout with unbacked sizes: no hints to order the dims by, so the orders
        tried are innermost-last (a fresh tensor's) and then each other the facts decide; the
        answer is False where none is decided (a copy where a view might have done, never a guard)."""
        n = len(sizes)
        orders = [_rank_order(n)]
        static = {d: self.shape_env.static_value(st) for d, st in enumerate(strides)}
        if all(isinstance(v, int) for v in static.values()):
            orders.append(sorted(range(n), key=lambda d: static[d]))
        for order in orders:
            if self.shape_env.static_value(_contiguous_in_order(sizes, strides, order)) is True:
                return self._make(sympy.true, bool, True)
        return self._make(sympy.false, bool, False)

    def is_non_overlapping_and_dense_indicator(self, sizes, strides) -> "SymNode":
        dense = self.is_non_overlapping_and_dense(sizes, strides)
        return self._make(S.sym_ite(dense.expr, sympy.Integer(1), sympy.Integer(0)), int,
                          _hinted(int, dense.hint))

    # --- the guard protocol: answers the program branches on ---------------------------------
    def guard_bool(self, file: str, line: int) -> bool:
        return bool(self.shape_env.evaluate(self, file, line))

    def guard_int(self, file: str, line: int) -> int:
        return int(self.shape_env.evaluate(self, file, line))

    def guard_float(self, file: str, line: int) -> float:
        return float(self.shape_env.evaluate(self, file, line))

    # [Note: unbacked sizes] in shape_env.py: on a backed expression these all guard on the hint;
    # on an unbacked one none guards.
    def expect_true(self, file: str, line: int) -> bool:
        return self.shape_env.expect_true(self)

    def guard_size_oblivious(self, file: str, line: int) -> bool:
        return bool(self.shape_env.size_oblivious(self))

    def guard_or_false(self, file: str, line: int) -> bool:
        return bool(self.shape_env.evaluate(self, file, line, fallback=False))

    def guard_or_true(self, file: str, line: int) -> bool:
        return bool(self.shape_env.evaluate(self, file, line, fallback=True))

    def expect_size(self, file: str, line: int) -> bool:
        # Older torch asks this of sizes it is about to allocate: a size is never negative.
        return bool(self.ge(self.wrap_int(0)).guard_bool(file, line))

    def nested_int_coeff(self):
        return None

    def statically_known_true(self, file: str, line: int) -> bool:
        return self.shape_env.static_value(self.expr) is True

    def int_(self) -> int:
        return self.guard_int("", 0)

    def bool_(self) -> bool:
        return self.guard_bool("", 0)

    def evaluate(self):
        return self.shape_env.evaluate(self, "", 0)


def _not_dense_reason(sizes, strides) -> sympy.Basic | None:
    """A condition, true at the hints, under which the tensor is not non-overlapping-and-dense:
    a stride-0 dim of size >= 2 (it overlaps), or the strides of the dims of size >= 2 in the same
    strict order as at the hints with one of them off the running product of the sizes before it
    (density in any order means density in the order of the strides). None when no such reason
    covers the hints (a size 0, equal strides)."""
    if any(n.hint == 0 for n in sizes):
        return None
    for size, stride in zip(sizes, strides):
        if stride.expr == 0 and size.hint >= 2:
            return sympy.Ge(size.expr, 2)
    dims = sorted((d for d, n in enumerate(sizes) if n.hint >= 2), key=lambda d: strides[d].hint)
    if any(strides[a].hint == strides[b].hint for a, b in zip(dims, dims[1:])):
        return None
    conditions = [sympy.Lt(strides[a].expr, strides[b].expr) for a, b in zip(dims, dims[1:])]
    conditions += [sympy.Ge(sizes[d].expr, 2) for d in dims]
    expected, expected_hint = sympy.Integer(1), 1
    for d in dims:
        if strides[d].hint != expected_hint:
            return sympy.And(*conditions, sympy.Ne(strides[d].expr, expected))
        expected, expected_hint = expected * sizes[d].expr, expected_hint * sizes[d].hint
    return None


def _dense_at_hint(sizes: list[int], strides: list[int]) -> bool:
    expected = 1
    for stride, size in sorted(zip(strides, sizes)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _hinted(fn: Callable, *hints) -> Any:
    """fn over hints, or None where one is missing (an unbacked value has no hint)."""
    flat = hints[0] if len(hints) == 1 and isinstance(hints[0], list) else hints
    return None if any(h is None for h in flat) else fn(*hints)


def _constant(value: Any, pytype: type) -> sympy.Basic:
    if pytype is bool:
        return sympy.true if value else sympy.false
    return sympy.Integer(value) if pytype is int else sympy.Float(value)


def _binary(name: str, build: Callable, pyop: Callable, rtype: Any):
    # Meta kernels ask the same few questions over and over (s0 == 1, s0 * 4, ...); sympy's
    # constructors are slow (assumption queries), so results are memoized per expression pair.
    build = functools.lru_cache(maxsize=8192)(build)

    def method(self: SymNode, other: SymNode) -> SymNode:
        pytype = self.pytype if rtype is _SAME else rtype
        if rtype is _SAME and float in (self.pytype, other.pytype):
            pytype = float
        a, b = self.hint, other.hint
        hint = None if a is None or b is None else pyop(a, b)
        if self.expr.is_Integer and other.expr.is_Integer and pytype in (int, bool):
            return SymNode(_constant(hint, pytype), self.shape_env, pytype, pytype(hint))
        return self._make(build(self.expr, other.expr), pytype, hint)

    method.__name__ = name
    return method


def _unary(name: str, build: Callable, pyop: Callable, rtype: Any):
    build = functools.lru_cache(maxsize=4096)(build)

    def method(self: SymNode) -> SymNode:
        pytype = self.pytype if rtype is _SAME else rtype
        return self._make(build(self.expr), pytype, _hinted(pyop, self.hint))

    method.__name__ = name
    return method


def _sizes_strides(name: str, build: Callable):
    def method(self: SymNode, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        expr = build([s.expr for s in sizes], [s.expr for s in strides])
        if any(s.hint is None for s in (*sizes, *strides)):
            value = sizes[0].shape_env.static_value(expr) if sizes else None
            return self._make(expr, bool, value)
        hint = build([sympy.Integer(s.hint) for s in sizes], [sympy.Integer(s.hint) for s in strides])
        return self._make(expr, bool, bool(hint))

    method.__name__ = name
    return method


for _name, _row in BINARY.items():
    setattr(SymNode, _name, _binary(_name, *_row))
for _alias, _target in BINARY_ALIASES.items():
    setattr(SymNode, _alias, getattr(SymNode, _target))
for _name, _row in UNARY.items():
    setattr(SymNode, _name, _unary(_name, *_row))
for _name, _build in SIZES_STRIDES.items():
    setattr(SymNode, _name, _sizes_strides(_name, _build))
# C++ names the logical operations on SymBool sym_and / sym_or; Python's magic methods use and_ / or_.
SymNode.sym_and = SymNode.and_
SymNode.sym_or = SymNode.or_
