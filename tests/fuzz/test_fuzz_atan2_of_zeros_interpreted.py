"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 200043), shrunk: wrong.

call 1, outputs: result 0: max abs diff nan (the interpreter's atan2(0, 0) was atan(0 / 0))
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2, x3):
#     v1 = x2 - x2
#     v2 = torch.matmul(v1, x3.t())
#     v4 = v1.norm(dim=-2, keepdim=True)
#     v5 = torch.atan2(v2, x2)
#     v7 = torch.atan2(v4, v5)
#     return (v7,)

PROGRAM = Program(
    seed=200043,
    inputs=[
        Input(name='x2', shape=(1, 6, 5), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=200043002),
        Input(name='x3', shape=(5, 5), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=200043003),
    ],
    steps=[
        Step(lines=('v1 = x2 - x2',), defines=('v1',), reads=('x2',), family='binary'),
        Step(lines=('v2 = torch.matmul(v1, x3.t())',), defines=('v2',), reads=('v1', 'x3'), family='matmul'),
        Step(lines=('v4 = v1.norm(dim=-2, keepdim=True)',), defines=('v4',), reads=('v1',), family='reduction'),
        Step(lines=('v5 = torch.atan2(v2, x2)',), defines=('v5',), reads=('v2', 'x2'), family='binary'),
        Step(lines=('v7 = torch.atan2(v4, v5)',), defines=('v7',), reads=('v4', 'v5'), family='binary'),
    ],
    outputs=['v7'],
    module=False,
)

test_fuzz_atan2_of_zeros_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_atan2_of_zeros_interpreted()
