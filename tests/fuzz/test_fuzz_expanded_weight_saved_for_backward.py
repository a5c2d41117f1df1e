"""Found by `python -m kiln.testing.fuzz` (seed 100071), shrunk: crash.

call 1: RuntimeError: unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x2, x4, x5):
#     v2 = F.linear(x2, x4, x5)
#     return (v2,)

PROGRAM = Program(
    seed=100071,
    inputs=[
        Input(name='x2', shape=(4,), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=100071002),
        Input(name='x4', shape=(2, 4), dtype='float32', layout='expanded', requires_grad=False, role='arg', seed=100071004),
        Input(name='x5', shape=(2,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=100071005),
    ],
    steps=[
        Step(lines=('v2 = F.linear(x2, x4, x5)',), defines=('v2',), reads=('x2', 'x4', 'x5'), family='matmul'),
    ],
    outputs=['v2'],
    module=False,
)

test_fuzz_expanded_weight_saved_for_backward = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_expanded_weight_saved_for_backward()
