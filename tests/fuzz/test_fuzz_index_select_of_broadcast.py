"""Found by `python -m kiln.testing.fuzz` (seed 2), shrunk: crash.

call 1: CompileStageError: kiln aot stage failed: backend 'kiln': RuntimeError: unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = torch.ones((8, 2)) * x0.sum()
#     v6 = torch.index_select(v1, 0, ((torch.arange(1) * 3 + 5) % 8).reshape((1,)))
#     return (v6,)

PROGRAM = Program(
    seed=2,
    inputs=[
        Input(name='x0', shape=(8, 2), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=2000),
    ],
    steps=[
        Step(lines=('v1 = torch.ones((8, 2)) * x0.sum()',), defines=('v1',), reads=('x0',), family='view'),
        Step(lines=('v6 = torch.index_select(v1, 0, ((torch.arange(1) * 3 + 5) % 8).reshape((1,)))',), defines=('v6',), reads=('v1',), family='indexing'),
    ],
    outputs=['v6'],
    module=False,
)

test_fuzz_index_select_of_broadcast = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_index_select_of_broadcast()
