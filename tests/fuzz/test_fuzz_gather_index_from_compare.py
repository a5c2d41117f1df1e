"""Found by `python -m kiln.testing.fuzz` (seed 21513), shrunk: wrong.

call 1, gradients: result 0: max abs diff 0.692; RMSE vs float64: compiled 0.514, eager 5.22e-08 (limit 2x + 0.0001)

Cause: scatter_add's backward gathers the gradient at `eq(x, x).long()`; the C++ kernel computed
that index inline from the compare, and g++ 12's vectorizer used the vector compare's mask (-1)
as the index: `t[-1]` was read where eager reads `t[1]`. A wrong value with no error, forward
too. Such kernels are now printed scalar ([Note: g++ 12 and indices made from compares] in
kiln/codegen/cpp.py).
"""
import pytest
import torch

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2, x3):
#     v2 = torch.eq(x2, x2)
#     v6 = torch.hypot(x3, x2)
#     v7 = v6.scatter_add(0, (v2.long().abs() % 2), v6 * 2)
#     return (v7,)

PROGRAM = Program(
    seed=21513,
    inputs=[
        Input(name='x2', shape=(2,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=21513002),
        Input(name='x3', shape=(2,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=21513003),
    ],
    steps=[
        Step(lines=('v2 = torch.eq(x2, x2)',), defines=('v2',), reads=('x2',), family='binary'),
        Step(lines=('v6 = torch.hypot(x3, x2)',), defines=('v6',), reads=('x3', 'x2'), family='binary'),
        Step(lines=('v7 = v6.scatter_add(0, (v2.long().abs() % 2), v6 * 2)',), defines=('v7',), reads=('v6', 'v2'), family='indexing'),
    ],
    outputs=['v7'],
    module=False,
)

test_fuzz_21513 = regression_test(PROGRAM)


@pytest.mark.parametrize("fn", [
    lambda x, t: t.gather(0, (x > -100).long()),
    lambda x, t: t.gather(0, torch.eq(x, x).long() % 2) * 2 + t,
    lambda x, t: t[(x > 0).long()],
    lambda x, t: t.gather(0, (x > -100).long()).sum(),
], ids=["gather", "gather_mod", "index", "gather_sum"])
@pytest.mark.parametrize("n", [2, 37])
def test_an_index_made_from_a_compare(fn, n):
    x, t = torch.randn(n), torch.randn(n)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn)(x, t), fn(x, t))
