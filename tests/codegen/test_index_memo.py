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
