"""SymInt/SymFloat/SymBool arithmetic on kiln's SymNode against plain Python on the same values."""
import math
import os
import operator
import random

import pytest
import sympy
import torch

from kiln.symbolic import ShapeEnv
from kiln.symbolic.sympy_ops import to_python

INT_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "min": torch.sym_min, "max": torch.sym_max,
    "neg_floordiv": lambda a, b: (-a) // b, "neg_mod": lambda a, b: (-a) % b,
    "and": operator.and_, "or": operator.or_, "lshift": lambda a, b: a << 2,
}
CMP_OPS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
           "gt": operator.gt, "ge": operator.ge}


def _value_at(env, value, assignment):
    """Evaluate a SymInt/SymFloat/SymBool's expression at `assignment` (symbol -> int)."""
    expr = env.symbol_of(value) if not isinstance(value, (int, float, bool)) else value
    names = {s: f"v{i}" for i, s in enumerate(env.sources)}
    code = to_python(sympy.sympify(expr), names)
    scope = {"math": math, **{names[s]: assignment[s] for s in names}}
    return eval(code, scope)


@pytest.mark.parametrize("name", sorted(INT_OPS))
def test_int_ops_match_python_everywhere(name):
    fn = INT_OPS[name]
    rng = random.Random(name)
    env = ShapeEnv()
    a_hint, b_hint = 7, 3
    a, b = env.create_symint(a_hint, "a"), env.create_symint(b_hint, "b")
    result = fn(a, b)
    assert int(result) == fn(a_hint, b_hint) if not env.guards else True
    if env.guards:   # the op had to guard (e.g. pow): no claim beyond the traced values
        return
    sa, sb = env.symbol_of(a), env.symbol_of(b)
    for _ in range(20):
        x, y = rng.randint(2, 40), rng.randint(2, 40)
        assert _value_at(env, result, {sa: x, sb: y}) == fn(x, y), (name, x, y, result)


@pytest.mark.parametrize("name", sorted(CMP_OPS))
def test_comparisons_guard_on_their_answer(name):
    fn = CMP_OPS[name]
    env = ShapeEnv()
    a, b = env.create_symint(7, "a"), env.create_symint(3, "b")
    answer = bool(fn(a, b))
    assert answer == fn(7, 3)
    guard = env.guard_function("a", "b")
    rng = random.Random(name)
    for _ in range(30):
        x, y = rng.randint(2, 12), rng.randint(2, 12)
        assert guard(x, y) == (fn(x, y) == answer), (name, x, y, guard.source)


def test_known_facts_need_no_guard():
    env = ShapeEnv()
    a = env.create_symint(5, "a")
    assert a >= 2 and a != 1 and a != 0 and not (a < 2) and a * a > a
    assert env.guards == []
    assert env.create_symint(1, "one") == 1 and isinstance(env.create_symint(0, "z"), int)


def test_equality_guard_replaces_and_specializes():
    env = ShapeEnv()
    a, b, c = (env.create_symint(6, n) for n in "abc")
    assert a == b
    assert len(env.guards) == 1 and (a - b) == 0 and len(env.guards) == 1
    assert int(c + 1) == 7                      # int() specializes c to 6
    guard = env.guard_function("a", "b", "c")
    assert guard(9, 9, 6) and not guard(9, 8, 6) and not guard(9, 9, 7)


def test_bounds_are_learnt():
    env = ShapeEnv()
    n = env.create_symint(10, "n")
    assert n > 5
    assert n > 3 and n >= 6 and len(env.guards) == 1
    assert env.lower[env.symbol_of(n)] == 6


def test_floats_and_casts():
    env = ShapeEnv()
    n = env.create_symint(9, "n")
    half = n / 2
    assert isinstance(half, torch.SymFloat) and float(half) == 4.5
    assert math.floor(half) == 4 and math.ceil(half) == 5
    root = torch.sym_float(n) ** 0.5
    assert float(root) == 3.0
    assert int(torch.sym_int(half)) == 4


def test_symbool_logic_and_ite():
    env = ShapeEnv()
    a, b = env.create_symint(4, "a"), env.create_symint(9, "b")
    both = (a < b) & (b < 10)
    assert isinstance(both, torch.SymBool) and bool(both)
    # torch.sym_ite's Python wrapper insists on torch's own node class; C++ calls the node.
    picked = torch.SymInt((a > 5).node.sym_ite(a.node, b.node))
    assert int(picked) == 9
    guard = env.guard_function("a", "b")
    assert guard(4, 9) and guard(5, 9) and not guard(6, 9) and not guard(4, 8)
    assert not bool(torch.sym_not(a < b))


def test_sym_sum_and_str():
    env = ShapeEnv()
    xs = [env.create_symint(h, f"x{h}") for h in (2, 3, 4)]
    total = torch.sym_sum(xs)
    assert str(total) == "s0 + s1 + s2" and repr(total) == "s0 + s1 + s2"


def test_guard_records_user_line():
    env = ShapeEnv()
    n = env.create_symint(8, "n")
    if n % 4 == 0:                                   # the line the guard must name
        pass
    (guard,) = env.guards
    here = os.path.basename(__file__)
    assert guard.user_location.endswith(f"{here}:{_line_of('n % 4 == 0')}")
    assert guard.kernel_location is None          # asked by the user's code, not by a kernel
    assert [str(s) for s in guard.sources] == ["n"]
    with env.user_location("model.py:12"):
        assert n > 7
    assert env.guards[-1].user_location == "model.py:12"


def _line_of(text):
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return i
    raise AssertionError(text)


def test_divisibility_is_learnt():
    env = ShapeEnv()
    n, m = env.create_symint(12, "n"), env.create_symint(5, "m")
    assert n % 4 == 0
    count = len(env.guards)
    assert (n // 4) * 4 == n and n // 4 >= 1 and (n * m) % 2 == 0 and n >= 4
    assert len(env.guards) == count, env.format_guards()
    guard = env.guard_function("n", "m")
    assert guard(8, 3) and not guard(6, 3)


def test_upper_bounds_decide_later_questions():
    env = ShapeEnv()
    n = env.create_symint(10, "n")
    assert n <= 32
    assert n < 40 and not (n > 33) and n != 50 and len(env.guards) == 1, env.format_guards()
    guard = env.guard_function("n")
    assert guard(32) and not guard(33)
