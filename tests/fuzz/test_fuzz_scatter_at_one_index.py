"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 300243), shrunk: crash. A scatter at one
loaded index stored through a broadcast view of its pointer, which the interpreter cannot write through; the
pointer is now widened by an added block of zeros.

call 1: InterpreterError: ValueError('array is not writeable')
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = x0.permute((0, 1))
#     v5 = v1.index_fill(1, ((torch.arange(1, device=DEVICE) * 7 + 0) % 129).reshape((1,)), -2.0)
#     return (v5,)

PROGRAM = Program(
    seed=300243,
    inputs=[
        Input(name='x0', shape=(1, 129), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=300243000),
    ],
    steps=[
        Step(lines=('v1 = x0.permute((0, 1))',), defines=('v1',), reads=('x0',), family='view'),
        Step(lines=('v5 = v1.index_fill(1, ((torch.arange(1, device=DEVICE) * 7 + 0) % 129).reshape((1,)), -2.0)',), defines=('v5',), reads=('v1',), family='indexing'),
    ],
    outputs=['v5'],
    module=False,
)

test_fuzz_scatter_at_one_index = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_scatter_at_one_index()
