"""Found by `python -m kiln.testing.fuzz` (seed 100210), shrunk: wrong.

call 1, gradients: eager gave 2 results, compiled gave 1
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2, x3):
#     x2.copy_(x3)
#     v3 = x2 + 0
#     return (v3,)

PROGRAM = Program(
    seed=100210,
    inputs=[
        Input(name='x2', shape=(5,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=100210002),
        Input(name='x3', shape=(5,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=100210003),
    ],
    steps=[
        Step(lines=('x2.copy_(x3)', 'v3 = x2 + 0'), defines=('v3',), reads=('x2', 'x3'), family='inplace'),
    ],
    outputs=['v3'],
    module=False,
)

test_fuzz_input_copy_from_grad_value = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_input_copy_from_grad_value()
