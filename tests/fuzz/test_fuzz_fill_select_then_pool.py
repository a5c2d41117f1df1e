"""Found by `python -m kiln.testing.fuzz` (seed 1167), shrunk: crash.

call 1: RuntimeError: setStorage: sizes [1, 8, 1], strides [16, 2, 1], storage offset 0, and itemsize 4 requiring a storage size of 60 are out of bounds for storage of size 32
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v2 = torch.take_along_dim(x0, torch.argsort(x0, dim=1), 1)
#     v2.select(2, 0).fill_(7)
#     v14 = F.max_pool2d(v2, 1)
#     return (v14,)

PROGRAM = Program(
    seed=1167,
    inputs=[
        Input(name='x0', shape=(1, 8, 2, 1), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=1167000),
    ],
    steps=[
        Step(lines=('v2 = torch.take_along_dim(x0, torch.argsort(x0, dim=1), 1)',), defines=('v2',), reads=('x0',), family='indexing'),
        Step(lines=('v2.select(2, 0).fill_(7)',), defines=(), reads=('v2',), family='inplace'),
        Step(lines=('v14 = F.max_pool2d(v2, 1)',), defines=('v14',), reads=('v2',), family='convolution'),
    ],
    outputs=['v14'],
    module=False,
)

test_fuzz_fill_select_then_pool = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_fill_select_then_pool()
