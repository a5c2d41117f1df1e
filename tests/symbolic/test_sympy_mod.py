"""[Note: sympy's Mod of a product] in kiln/symbolic/sympy_mod.py: with kiln imported, Mod of a
product holding a Mod of another modulus evaluates to what it is, checked point by point against
Python's integers."""
from __future__ import annotations

import pytest
import sympy

import kiln.symbolic  # noqa: F401  (installs the correction)

x = sympy.Symbol("x", integer=True, nonnegative=True)
y = sympy.Symbol("y", integer=True, nonnegative=True)
M, F = sympy.Mod, sympy.floor

CASES = {   # sympy expression, the same in Python ints
    "2*Mod(x,8) mod 16": (M(2 * M(x, 8), 16), lambda x, y: (2 * (x % 8)) % 16),
    "8*Mod(x//64,4) mod 64": (M(8 * M(F(x / 64), 4), 64), lambda x, y: (8 * ((x // 64) % 4)) % 64),
    "128*Mod(x,3) mod 356": (M(128 * M(x, 3), 356), lambda x, y: (128 * (x % 3)) % 356),
    "3*Mod(x,8) mod 16": (M(3 * M(x, 8), 16), lambda x, y: (3 * (x % 8)) % 16),
    "6*Mod(x,5)*y mod 9": (M(6 * M(x, 5) * y, 9), lambda x, y: (6 * (x % 5) * y) % 9),
    "16*Mod(x,8)*y mod 16": (M(16 * M(x, 8) * y, 16), lambda x, y: (16 * (x % 8) * y) % 16),
    "2*Mod(x,8)+1 mod 16": (M(2 * M(x, 8) + 1, 16), lambda x, y: (2 * (x % 8) + 1) % 16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_evaluated_mod_equals_python_at_every_point(name):
    expr, reference = CASES[name]
    for i in range(0, 300, 7):
        for j in range(5):
            assert expr.subs({x: i, y: j}) == reference(i, j), (name, expr, i, j)
