"""Found by `python -m kiln.testing.fuzz` (seed 70246), shrunk: wrong.

call 1, outputs: result 0: max abs diff 5; RMSE vs float64: compiled 1.02, eager 0 (limit 2x + 1e-05)

Cause: index_select's decomposition (through `index`) laid its result out dim-permuted where
eager's is contiguous, so `v5.view(-1)` traced as a copy and the write through it was lost
([Note: decompositions keep eager's strides] in kiln/aot/trace.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = torch.index_select(x0, 2, ((torch.arange(2) * 3 + 3) % 1).reshape((2,)))
#     v5 = v1.clone()
#     v5.view(-1)[0:1].add_(5)
#     return (v5,)

PROGRAM = Program(
    seed=70246,
    inputs=[
        Input(name='x0', shape=(3, 4, 1), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=70246000),
    ],
    steps=[
        Step(lines=('v1 = torch.index_select(x0, 2, ((torch.arange(2) * 3 + 3) % 1).reshape((2,)))',), defines=('v1',), reads=('x0',), family='indexing'),
        Step(lines=('v5 = v1.clone()', 'v5.view(-1)[0:1].add_(5)'), defines=('v5',), reads=('v1',), family='inplace'),
    ],
    outputs=['v5'],
    module=False,
)

test_fuzz_70246 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_70246()
