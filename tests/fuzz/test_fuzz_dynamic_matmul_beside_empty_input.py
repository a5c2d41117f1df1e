"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 1000316), shrunk: crash, on
the C++ path too. Under dynamic=True a program given an unused strided input with a dim of 0 (a
(0, 6, 1) bfloat16 slice) raised `Trying to create tensor with negative dimension 2*s5 - 2*s6` at
its first call (seeds 1001407, 1001662, 1002363 the same; the matmul is incidental, a program
without it failed the same way). The fake tensor of a dynamic input gets a storage of its
symbolic extent, offset + 1 + sum((size - 1) * stride), where a size-0 dim takes its stride off.
An empty input's fake now keeps its real storage's size, as a static one does.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x1, x2, x3):
#     v1 = F.softplus(x1)
#     v2 = torch.matmul(x0, x3.t())
#     return (v1, v2)

PROGRAM = Program(
    seed=1000316,
    inputs=[
        Input(name='x0', shape=(2, 3, 7, 6), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1000316000),
        Input(name='x1', shape=(1, 5), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1000316001),
        Input(name='x2', shape=(0, 6, 1), dtype='bfloat16', layout='strided', requires_grad=False, role='arg', seed=1000316002),
        Input(name='x3', shape=(5, 6), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=1000316003),
    ],
    steps=[
        Step(lines=('v1 = F.softplus(x1)',), defines=('v1',), reads=('x1',), family='unary'),
        Step(lines=('v2 = torch.matmul(x0, x3.t())',), defines=('v2',), reads=('x0', 'x3'), family='matmul'),
    ],
    outputs=['v1', 'v2'],
    module=False,
    resized={'x0': (3, 3, 7, 6), 'x3': (6, 6)},
)

test_fuzz_dynamic_matmul_beside_empty_input = regression_test(PROGRAM, target="triton-interpret")
