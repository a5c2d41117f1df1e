"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 100010), shrunk: crash.

call 1: InterpreterError: TypeError("ufunc 'bitwise_or' not supported for the input types") ([Note: interpreted comparisons are bool])
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x2):
#     v2 = torch.minimum(x0, x2)
#     return (v2,)

PROGRAM = Program(
    seed=100010,
    inputs=[
        Input(name='x0', shape=(), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=100010000),
        Input(name='x2', shape=(2, 2), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=100010002),
    ],
    steps=[
        Step(lines=('v2 = torch.minimum(x0, x2)',), defines=('v2',), reads=('x0', 'x2'), family='binary'),
    ],
    outputs=['v2'],
    module=False,
)

test_fuzz_scalar_comparison_in_block_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_scalar_comparison_in_block_interpreted()
