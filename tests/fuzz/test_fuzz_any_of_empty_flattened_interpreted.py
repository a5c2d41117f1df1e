"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 510290), shrunk by hand: crash.

The process died with SIGSEGV: `any()` over an empty input flattened to no elements read its
element at offset 0 with an unmasked load (the size-0 dim's strides had simplified the index to a
constant), from a buffer that owns no memory. An empty buffer is now read as 0 (the reduction over
no elements masks the value off), in kiln/codegen/triton/printer.py.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v2 = x0.isnan()
#     v5 = v2.flatten()
#     v10 = v5.any()
#     return (v10,)

PROGRAM = Program(
    seed=510290,
    inputs=[
        Input(name='x0', shape=(2, 2, 1, 0), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=51539291000),
    ],
    steps=[
        Step(lines=('v2 = x0.isnan()',), defines=('v2',), reads=('x0',), family='unary'),
        Step(lines=('v5 = v2.flatten()',), defines=('v5',), reads=('v2',), family='view'),
        Step(lines=('v10 = v5.any()',), defines=('v10',), reads=('v5',), family='reduction'),
    ],
    outputs=['v10'],
    module=False,
)

test_fuzz_510290_triton_interpret = regression_test(PROGRAM, target='triton-interpret')
test_fuzz_510290 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_510290_triton_interpret()
