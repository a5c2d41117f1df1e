"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1000484), shrunk: wrong.

call 1, outputs: result 0: max abs diff 1.14e+30; RMSE vs float64: compiled 2.07e+29, eager 0 (limit 2x + 1e-05)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x3):
#     v7 = x3.transpose(0, 1).reshape(-1)
#     v10 = torch.cat([v7, v7.flip(0)], 0)
#     return (v10,)

PROGRAM = Program(
    seed=1000484,
    inputs=[
        Input(name='x3', shape=(5, 3), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1000484003),
    ],
    steps=[
        Step(lines=('v7 = x3.transpose(0, 1).reshape(-1)',), defines=('v7',), reads=('x3',), family='view'),
        Step(lines=('v10 = torch.cat([v7, v7.flip(0)], 0)',), defines=('v10',), reads=('v7',), family='view'),
    ],
    outputs=['v10'],
    module=False,
)

test_fuzz_flip_of_transposed_reshape_cat_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_flip_of_transposed_reshape_cat_interpreted()
