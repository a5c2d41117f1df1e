"""Found by `python -m kiln.testing.fuzz` (seed 1117), shrunk: crash.

call 1: RuntimeError: setStorage: sizes [3, 6], strides [24, 4], storage offset 0, and itemsize 4 requiring a storage size of 276 are out of bounds for storage of size 72
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v2 = x0.clone()
#     v5 = torch.log1p(v2.abs())
#     v6 = v5.amax(0)
#     v7 = v6.clone()
#     v9 = v7.clone()
#     v9.select(0, 0).fill_(7)
#     v10 = v9.view(-1)
#     v9[:, :, 0] = 0
#     v11 = v9.view(-1)
#     return (v10, v11)

PROGRAM = Program(
    seed=1117,
    inputs=[
        Input(name='x0', shape=(6, 3, 6, 4), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1117000),
    ],
    steps=[
        Step(lines=('v2 = x0.clone()',), defines=('v2',), reads=('x0',), family='view'),
        Step(lines=('v5 = torch.log1p(v2.abs())',), defines=('v5',), reads=('v2',), family='unary'),
        Step(lines=('v6 = v5.amax(0)',), defines=('v6',), reads=('v5',), family='reduction'),
        Step(lines=('v7 = v6.clone()',), defines=('v7',), reads=('v6',), family='view'),
        Step(lines=('v9 = v7.clone()', 'v9.select(0, 0).fill_(7)', 'v10 = v9.view(-1)'), defines=('v9', 'v10'), reads=('v7',), family='inplace'),
        Step(lines=('v9[:, :, 0] = 0', 'v11 = v9.view(-1)'), defines=('v11',), reads=('v9',), family='inplace'),
    ],
    outputs=['v10', 'v11'],
    module=False,
)

test_fuzz_writes_through_views_of_clone = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_writes_through_views_of_clone()
