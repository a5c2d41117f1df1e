"""Found by `python -m kiln.testing.fuzz` (seed 1677), shrunk: wrong.

call 1, outputs: result 0: max abs diff 0.0419; RMSE vs float64: compiled 0.0419, eager 0 (limit 2x + 1e-05)

Cause: an input that requires grad was traced as a contiguous clone at offset 0; the view
output (unfold: an as_strided with the clone's storage offset) was rebuilt on the real input,
whose storage offset is 3: the wrong element, no error (kiln/aot/trace.py, _program_copy).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x9):
#     v29 = x9.unfold(0, 1, 1)
#     return (v29,)

PROGRAM = Program(
    seed=1677,
    inputs=[
        Input(name='x9', shape=(1,), dtype='float32', layout='offset', requires_grad=True, role='arg', seed=1677009),
    ],
    steps=[
        Step(lines=('v29 = x9.unfold(0, 1, 1)',), defines=('v29',), reads=('x9',), family='view'),
    ],
    outputs=['v29'],
    module=False,
)

test_fuzz_unfold_of_offset_input = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_unfold_of_offset_input()
