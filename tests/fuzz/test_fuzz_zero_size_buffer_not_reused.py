"""Found by `python -m kiln.testing.fuzz` (seed 20729), shrunk by hand: crash.

call 1: RuntimeError: setStorage: sizes [1, 2, 1], strides [2, 1, 1], storage offset 0, and itemsize 4 requiring a storage size of 8 are out of bounds for storage of size 0

Cause: the host program reuses a dead buffer's storage for a new buffer of the same extent, and
the extent of a buffer with a zero-size dim was taken from its strides (1 + sum((n - 1) * stride):
2 for sizes (3, 0), strides (1, 1)), where it holds no element: amin's 2-element result took the
storage of the zero-size write into `x0` (kiln/codegen/host.py, `_storage_key`).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x1):
#     v7 = x1.sin()
#     v11 = v7.amin(-1, keepdim=True)
#     x0[0] = 3
#     v21 = x0 * 2
#     return (v11,)

PROGRAM = Program(
    seed=20729,
    inputs=[
        Input(name='x0', shape=(4, 3, 0), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=20729000),
        Input(name='x1', shape=(1, 2, 1, 2), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=20729001),
    ],
    steps=[
        Step(lines=('v7 = x1.sin()',), defines=('v7',), reads=('x1',), family='unary'),
        Step(lines=('v11 = v7.amin(-1, keepdim=True)',), defines=('v11',), reads=('v7',), family='reduction'),
        Step(lines=('x0[0] = 3', 'v21 = x0 * 2'), defines=('v21',), reads=('x0',), family='input_mutation'),
    ],
    outputs=['v11'],
    module=False,
)

test_fuzz_zero_size_buffer_not_reused = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_zero_size_buffer_not_reused()
