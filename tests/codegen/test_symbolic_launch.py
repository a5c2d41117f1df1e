"""Kernels of symbolic sizes as the static ones at the same sizes (issue #17, item 3): index
expressions over symbolic sizes simplify as they do over numbers ([Note: symbolic index bounds]).
"""
from __future__ import annotations

import pytest
import sympy

from kiln.codegen.indexing import simplify_index
from kiln.codegen.ir import loop_var, reduction_var

S0, S1 = (sympy.Symbol(f"s{i}", integer=True, positive=True) for i in range(2))
X0, X1, X2, X3 = (loop_var(k) for k in range(4))
R0 = reduction_var(0)


@pytest.mark.parametrize("index, upper, expected", [
    # a reshape's split put back together (layer_norm's epilogue read of its reduction's row)
    (S1 * sympy.floor((S1 * X0 + X1) / S1) + sympy.Mod(X1, S1), {X0: S0, X1: S1}, S1 * X0 + X1),
    # heads split off a row of 64*s1: the quotient is 0, the remainder the index itself
    (64 * sympy.Mod(X1, S1) + 64 * S1 * sympy.floor((X3 + 64 * X1) / (64 * S1)), {X1: S1, X3: 64}, 64 * X1),
    # a [s1, s1] block walked through one flat reduction index
    (S1 * sympy.Mod(X2 + sympy.floor(R0 / S1), S1) + S1 ** 2 * sympy.floor((R0 + X2 * S1) / S1 ** 2)
     + sympy.Mod(R0, S1), {X2: S1, R0: S1}, R0 + S1 * X2),
    # not decided: x1 runs to s0, not s1
    (sympy.Mod(X1, S1), {X1: S0}, sympy.Mod(X1, S1)),
    (sympy.floor((S1 * X0 + X1) / S1), {X0: S0, X1: S1 + 1}, sympy.floor((S1 * X0 + X1) / S1)),
    # numbers as before
    (sympy.floor((32 * X0 + X1) / 32) + sympy.Mod(32 * X0 + X1, 32), {X0: 4, X1: 32}, X0 + X1),
])
def test_symbolic_bounds_decide_div_and_mod(index, upper, expected):
    assert sympy.expand(simplify_index(index, upper) - expected) == 0
