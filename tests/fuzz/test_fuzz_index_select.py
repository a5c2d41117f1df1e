"""Found by `python -m kiln.testing.fuzz` (seed 22), shrunk: crash.

call 1: CompileStageError: kiln prims stage failed: backend 'kiln': TypeError: 'Tensor' object is not callable
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v7 = x1.index_add(1, ((torch.arange(1) * 1 + 1) % 6).reshape((1,)), x1.narrow(1, 0, 1).expand((2, 1)))
#     return (v7,)

PROGRAM = Program(
    seed=22,
    inputs=[
        Input(name='x1', shape=(2, 6), dtype='float32', layout='transposed', requires_grad=True, role='arg', seed=22001),
    ],
    steps=[
        Step(lines=('v7 = x1.index_add(1, ((torch.arange(1) * 1 + 1) % 6).reshape((1,)), x1.narrow(1, 0, 1).expand((2, 1)))',), defines=('v7',), reads=('x1',), family='indexing'),
    ],
    outputs=['v7'],
    module=False,
)

test_fuzz_index_select = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_index_select()
