"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 560045), shrunk: crash.

call 1: InterpreterError: AttributeError("'float' object has no attribute 'to'")

Under autocast the linear of zeros folds to a constant 0.0 that is rounded to float16: the Triton
printer cast the Python literal, `(0.0).to(tl.float16)`. A literal is a typed block of one before
a cast now (`_to_dtype` in kiln/codegen/triton/ops.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x3, x4):
#     v2 = torch.zeros_like(x3)
#     with torch.autocast(DEVICE, dtype=torch.float16):
#         v3 = F.linear(v2, x4)
#         v4 = torch.relu(v3) + 1
#     v5 = v4.float() * 2
#     return (v5,)

PROGRAM = Program(
    seed=560045,
    inputs=[
        Input(name='x3', shape=(8, 7), dtype='float32', layout='transposed', requires_grad=True, role='arg', seed=560045003),
        Input(name='x4', shape=(3, 7), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=560045004),
    ],
    steps=[
        Step(lines=('v2 = torch.zeros_like(x3)',), defines=('v2',), reads=('x3',), family='view'),
        Step(lines=('with torch.autocast(DEVICE, dtype=torch.float16):', '    v3 = F.linear(v2, x4)', '    v4 = torch.relu(v3) + 1', 'v5 = v4.float() * 2'), defines=('v3', 'v4', 'v5'), reads=('v2', 'x4'), family='autocast'),
    ],
    outputs=['v5'],
    module=False,
)

test_fuzz_560045_triton_interpret = regression_test(PROGRAM, target='triton-interpret')
test_fuzz_560045 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_560045_triton_interpret()
