"""[Note: index memo] in kiln/codegen/indexing.py: simplify_index and subs_index remember results,
keyed by the expression and its bounds or substitution, never by the expression alone; each answer
is the one the memo-less work gives."""
import sympy
import torch

from kiln.codegen import indexing, ir
from kiln.codegen.ir import Load, loop_var


def test_simplify_index_memo_keys_on_the_bounds():
    x0, x1 = loop_var(0), loop_var(1)
    e = sympy.floor((32 * x0 + x1) / 32)
    for _ in range(2):                                     # a second call is answered by the memo
        assert indexing.simplify_index(e, {x0: 4, x1: 32}) == x0
        kept = indexing.simplify_index(e, {x0: 4, x1: 64})  # x1 may reach 63: the floor stays
        assert kept == indexing._simplify_index(e, {x0: 4, x1: 64}) and kept != x0
    again = sympy.floor((32 * loop_var(0) + loop_var(1)) / 32)   # equal, built anew
    assert indexing.simplify_index(again, {x0: 4, x1: 32}) == x0


def test_subs_index_memo_keys_on_the_mapping():
    x0, x1 = loop_var(0), loop_var(1)
    load = Load("buf", 3 * x0 + x1, torch.float32)
    for _ in range(2):
        assert ir.subs_index(load, {x0: x1}).index == 4 * x1
        assert ir.subs_index(load, {x0: 2 * x1}).index == 7 * x1
        assert ir.subs_index(load, {x1: 0}).index == 3 * x0
    assert ir.subs_index(load, {}) is load


def test_relaid_index_equals_the_element_offset_in_the_new_layout():
    """layout._relaid_index builds its floor/Mod unevaluated and lets the bounds decide them: the
    result is the element's offset in the new strides, at every point (checked against the plain
    definition), and cached for the next equal load."""
    import itertools

    from kiln.codegen import layout
    from kiln.codegen.layout import channels_last_strides
    n, c, h, w = 2, 3, 4, 5
    old = ir.Buffer("b", (n, c, h, w), (c * h * w, h * w, w, 1), torch.float32)
    new = channels_last_strides(old.sizes)
    xs = [loop_var(k) for k in range(4)]
    upper = dict(zip(xs, (n, c, h, w)))
    cases = [(old.index(xs), upper),                                   # a pointwise read of every element
             (xs[0], {xs[0]: n * c * h * w})]                          # a flat loop over the buffer
    for index, bounds in cases:
        for _ in range(2):
            got = layout._relaid_index(index, old, new, bounds)
            assert not got.has(sympy.floor, sympy.Mod) or index == xs[0]
            for point in itertools.product(*(range(int(bounds[v])) for v in bounds)):
                flat = int(index.subs(dict(zip(bounds, point))))
                coords = (flat // (c * h * w), flat // (h * w) % c, flat // w % h, flat % w)
                want = sum(i * s for i, s in zip(coords, new))
                assert int(got.subs(dict(zip(bounds, point)))) == want, (index, point)
