"""Found by `python -m kiln.testing.fuzz` (seed 2), shrunk: wrong.

call 1, gradients: result 0: max abs diff 0.0538; RMSE vs float64: compiled 0.038, eager 0 (limit 2x + 0.0001)

Cause: the mean as sum/n rounds for equal values (3v is not always a float), so the variance of
equal rows came out tiny but not 0, and std's backward divided noise by noise where eager's
Welford gives exactly 0 and takes its `std == 0` branch ([Note: shifted mean] in
kiln/prims/decompositions/reductions.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v4 = x0.std(0)
#     return (v4,)

PROGRAM = Program(
    seed=2,
    inputs=[
        Input(name='x0', shape=(8, 2), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=2000),
    ],
    steps=[
        Step(lines=('v4 = x0.std(0)',), defines=('v4',), reads=('x0',), family='reduction'),
    ],
    outputs=['v4'],
    module=False,
)

test_fuzz_std_of_equal_rows = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_std_of_equal_rows()
