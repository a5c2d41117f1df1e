"""Found by `python -m kiln.testing.fuzz` (seed 1080), shrunk: crash.

call 1: CompileStageError: kiln aot stage failed: backend 'kiln': RuntimeError: unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x1, x3, x4, x6, x7):
#     v4 = x4 | x0
#     v11 = x1.masked_fill(v4, -1.0)
#     v21 = F.layer_norm(x3, (2,), x6, x7)
#     return (v21,)

PROGRAM = Program(
    seed=1080,
    inputs=[
        Input(name='x0', shape=(1, 2), dtype='bool', layout='strided', requires_grad=False, role='arg', seed=1080000),
        Input(name='x1', shape=(2,), dtype='float32', layout='offset', requires_grad=True, role='arg', seed=1080001),
        Input(name='x3', shape=(2,), dtype='float32', layout='strided', requires_grad=True, role='arg', seed=1080003),
        Input(name='x4', shape=(2,), dtype='bool', layout='offset', requires_grad=False, role='arg', seed=1080004),
        Input(name='x6', shape=(2,), dtype='float32', layout='expanded', requires_grad=False, role='arg', seed=1080006),
        Input(name='x7', shape=(2,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=1080007),
    ],
    steps=[
        Step(lines=('v4 = x4 | x0',), defines=('v4',), reads=('x4', 'x0'), family='binary'),
        Step(lines=('v11 = x1.masked_fill(v4, -1.0)',), defines=('v11',), reads=('x1', 'v4'), family='mixed'),
        Step(lines=('v21 = F.layer_norm(x3, (2,), x6, x7)',), defines=('v21',), reads=('x3', 'x6', 'x7'), family='normalization'),
    ],
    outputs=['v21'],
    module=False,
)

test_fuzz_expanded_input_real_trace = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_expanded_input_real_trace()
