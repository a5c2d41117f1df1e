"""Found by `python -m kiln.testing.fuzz` (seed 1), shrunk: wrong.

call 1, gradients: result 0: max abs diff 0.815; RMSE vs float64: compiled 0.306, eager 2.62e-08 (limit 2x + 0.0001)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v4 = torch.softmax(x1, -2)
#     v10 = v4.transpose(1, 0)
#     v16 = torch.cat([v10, v10.flip(0)], 0)
#     v21 = v16.unfold(0, 2, 1)
#     return (v21,)

PROGRAM = Program(
    seed=1,
    inputs=[
        Input(name='x1', shape=(4, 4, 3), dtype='float32', layout='transposed', requires_grad=True, role='arg', seed=103001),
    ],
    steps=[
        Step(lines=('v4 = torch.softmax(x1, -2)',), defines=('v4',), reads=('x1',), family='reduction'),
        Step(lines=('v10 = v4.transpose(1, 0)',), defines=('v10',), reads=('v4',), family='view'),
        Step(lines=('v16 = torch.cat([v10, v10.flip(0)], 0)',), defines=('v16',), reads=('v10',), family='view'),
        Step(lines=('v21 = v16.unfold(0, 2, 1)',), defines=('v21',), reads=('v16',), family='view'),
    ],
    outputs=['v21'],
    module=False,
)

test_fuzz_unfold_backward = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_unfold_backward()
