"""Found by `python -m kiln.testing.fuzz` (seed 5127), shrunk: wrong.

call 1, outputs: result 0: integer results differ
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x3):
#     v9 = x3.roll(3, 1)
#     x3.mul_(2)
#     v12 = x3 * 2
#     return (v9,)

PROGRAM = Program(
    seed=5127,
    inputs=[
        Input(name='x3', shape=(2, 3, 5), dtype='int64', layout='contiguous', requires_grad=False, role='arg', seed=517828003),
    ],
    steps=[
        Step(lines=('v9 = x3.roll(3, 1)',), defines=('v9',), reads=('x3',), family='view'),
        Step(lines=('x3.mul_(2)', 'v12 = x3 * 2'), defines=('v12',), reads=('x3',), family='input_mutation'),
    ],
    outputs=['v9'],
    module=False,
)

test_fuzz_identity_roll_then_input_mutation = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_identity_roll_then_input_mutation()
