"""A wrong evaluation of sympy's `Mod`, corrected while the installed sympy has it.

[Note: sympy's Mod of a product] sympy 1.14 evaluates `Mod(2*Mod(x, 8), 16)`, x an integer, to
`2*Mod(Mod(x, 8)**2, 8)`: for a product holding a Mod whose modulus is not the outer one, it
reduces the product's integer factors modulo q and then rebuilds the product from those factors
*and* the Mod factors, which were among them already, so each Mod factor comes back squared
(sympy issue 28744, fixed upstream by PR 28759, not in a release kiln can take). kiln's indices
meet it whenever a reshape's `Mod(2*x1 + x2, 16)` has `x1 := Mod(x0, 8)` substituted in: group
norm followed by batch norm read the wrong elements (fuzz seed 5843: a wrong result, no error).

While sympy's own evaluation gives the wrong answer for that probe, `install()` puts a correct
rule in front of it for exactly that case (an integer product with a Mod factor of another
modulus, an integer modulus): a common factor g of the product's coefficient and q comes out as
`g * Mod(p/g, q/g)`, a coefficient that q divides makes 0, and anything else stays unevaluated.
Every other `Mod` evaluates as sympy does. A sympy without the bug is left alone.
"""
from __future__ import annotations

import sympy


def _buggy() -> bool:
    x = sympy.Symbol("x", integer=True)
    return sympy.Mod(2 * sympy.Mod(x, 8), 16) != 2 * sympy.Mod(x, 8)


def _mod_of_a_product(cls, p, q):
    """(handled, value) for the case sympy gets wrong; value None: stays unevaluated."""
    if not (isinstance(p, sympy.Mul) and q.is_Integer and q > 1):
        return False, None
    mods = [a for a in p.args if isinstance(a, sympy.Mod)]
    if not mods or all(m.args[1] == q for m in mods) or not all(a.is_integer for a in p.args):
        return False, None
    coeff, rest = p.as_coeff_Mul()
    if not coeff.is_Integer:
        return True, None
    if coeff % q == 0:
        return True, sympy.S.Zero
    g = sympy.igcd(int(coeff), int(q))
    if g > 1:
        return True, g * cls(coeff // g * rest, q // g)
    return True, None


def install() -> None:
    if getattr(sympy.Mod, "_kiln_corrected", False) or not _buggy():
        return
    original = sympy.Mod.eval.__func__

    def eval(cls, p, q):
        handled, value = _mod_of_a_product(cls, p, q)
        return value if handled else original(cls, p, q)
    sympy.Mod.eval = classmethod(eval)
    sympy.Mod._kiln_corrected = True
    sympy.core.cache.clear_cache()       # the probe's (and any earlier) wrong answers are cached
