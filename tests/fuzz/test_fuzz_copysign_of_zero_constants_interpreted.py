"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1000340), shrunk: crash.

call 1: InterpreterError: InterpreterError("ZeroDivisionError('float division by zero')")
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v1 = x1.new_zeros((2, 3))
#     v3 = torch.copysign(v1, v1)
#     return (v3,)

PROGRAM = Program(
    seed=1000340,
    inputs=[
        Input(name='x1', shape=(5, 6), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=101034341001),
    ],
    steps=[
        Step(lines=('v1 = x1.new_zeros((2, 3))',), defines=('v1',), reads=('x1',), family='view'),
        Step(lines=('v3 = torch.copysign(v1, v1)',), defines=('v3',), reads=('v1',), family='binary'),
    ],
    outputs=['v3'],
    module=False,
)

test_fuzz_copysign_of_zero_constants_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_copysign_of_zero_constants_interpreted()
