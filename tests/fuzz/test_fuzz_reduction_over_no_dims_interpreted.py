"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 200020), shrunk: crash.

call 1: CompileStageError: kiln codegen stage failed: KeyError: <class kiln.codegen.ir.Accumulate> (a sum over no dims in the Triton printer)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.x2 = torch.nn.Parameter(state['x2'])
#     def forward(self, x3, x4):
#         x2 = self.x2
#         v1 = F.layer_norm(x2, (2,), x3, x4)
#         return (v1,)

PROGRAM = Program(
    seed=200020,
    inputs=[
        Input(name='x2', shape=(2,), dtype='float16', layout='contiguous', requires_grad=True, role='param', seed=200020002),
        Input(name='x3', shape=(2,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=200020003),
        Input(name='x4', shape=(2,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=200020004),
    ],
    steps=[
        Step(lines=('v1 = F.layer_norm(x2, (2,), x3, x4)',), defines=('v1',), reads=('x2', 'x3', 'x4'), family='normalization'),
    ],
    outputs=['v1'],
    module=True,
)

test_fuzz_reduction_over_no_dims_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_reduction_over_no_dims_interpreted()
