"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 1010033), shrunk: crash,
on the C++ path too: "RecursionError: maximum recursion depth exceeded". The backward of
`x.split(2, 0)[0]` of a 4096-row input is a cat of the tangent and 2047 zero pieces; lowering built
it as a chain of 2047 nested `where`s, which hashing recursed through. A cat of more than
`MAX_CAT_PIECES` pieces is now an extern copy (kiln/codegen/lowering_rules.py)."""
import torch

import kiln
from kiln.codegen.lowering_rules import MAX_CAT_PIECES
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2):
#     v21 = x2.split(2, 0)[0]
#     return (v21,)
SPLIT_OF_EXPANDED = Program(
    seed=1010033,
    inputs=[
        Input(name='x2', shape=(4096, 64), dtype='float16', layout='expanded', requires_grad=True, role='arg', seed=1010033002),
    ],
    steps=[
        Step(lines=('v21 = x2.split(2, 0)[0]',), defines=('v21',), reads=('x2',), family='view'),
    ],
    outputs=['v21'],
    module=False,
)

test_fuzz_1010033_triton_interpret = regression_test(SPLIT_OF_EXPANDED, target='triton-interpret')
test_fuzz_1010033_cpp = regression_test(SPLIT_OF_EXPANDED, target='cpp')


def test_cat_of_more_pieces_than_a_kernel_takes_matches_eager():
    def f(xs):
        return torch.cat([x * 2 for x in xs], 1) + 1
    for n in (MAX_CAT_PIECES, MAX_CAT_PIECES + 1, 100):
        xs = [torch.randn(3, k % 4 + 1) for k in range(n)]
        torch.testing.assert_close(kiln.compile(f)(xs), f(xs))


if __name__ == "__main__":
    test_fuzz_1010033_triton_interpret()
    test_fuzz_1010033_cpp()
    test_cat_of_more_pieces_than_a_kernel_takes_matches_eager()
