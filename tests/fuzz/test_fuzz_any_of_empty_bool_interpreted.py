"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 510336), shrunk: crash.

call 1: InterpreterError: AttributeError("'bool' object has no attribute 'to'")

`any()` of an empty bool input: a load from an empty buffer is read as 0 (seed 510290), and that
0 was printed as a Python `False`, which the reduction then cast with `.to(tl.int8)`; it is a
typed block now (kiln/codegen/triton/printer.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x5):
#     v10 = x5.any()
#     return (v10,)

PROGRAM = Program(
    seed=510336,
    inputs=[
        Input(name='x5', shape=(0, 2, 6), dtype='bool', layout='contiguous', requires_grad=False, role='arg', seed=510336005),
    ],
    steps=[
        Step(lines=('v10 = x5.any()',), defines=('v10',), reads=('x5',), family='reduction'),
    ],
    outputs=['v10'],
    module=False,
)

test_fuzz_510336_triton_interpret = regression_test(PROGRAM, target='triton-interpret')
test_fuzz_510336 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_510336_triton_interpret()
