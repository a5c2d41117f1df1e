"""Found by `python -m kiln.testing.fuzz` (seed 1184), shrunk: wrong.

call 1, inputs after the call: result 0: integer results differ
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2):
#     x2[:, 0] = 0
#     return ()

PROGRAM = Program(
    seed=1184,
    inputs=[
        Input(name='x2', shape=(4, 1), dtype='int64', layout='offset', requires_grad=False, role='arg', seed=1184002),
    ],
    steps=[
        Step(lines=('x2[:, 0] = 0',), defines=(), reads=('x2',), family='inplace'),
    ],
    outputs=[],
    module=False,
)

test_fuzz_setitem_offset_input = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_setitem_offset_input()
