"""Found by `python -m kiln.testing.fuzz` (seed 0), shrunk: crash.

call 1: RuntimeError: setStorage: sizes [1], strides [17], storage offset 8, and itemsize 4 requiring a storage size of 36 are out of bounds for storage of size 32
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v3 = x1.clamp(min=0.1)
#     v12 = v3[1::2]
#     v13 = v12.diagonal()
#     return (v13,)

PROGRAM = Program(
    seed=0,
    inputs=[
        Input(name='x1', shape=(2, 8), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=1),
    ],
    steps=[
        Step(lines=('v3 = x1.clamp(min=0.1)',), defines=('v3',), reads=('x1',), family='unary'),
        Step(lines=('v12 = v3[1::2]',), defines=('v12',), reads=('v3',), family='view'),
        Step(lines=('v13 = v12.diagonal()',), defines=('v13',), reads=('v12',), family='view'),
    ],
    outputs=['v13'],
    module=False,
)

test_fuzz_diagonal_of_slice = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_diagonal_of_slice()
