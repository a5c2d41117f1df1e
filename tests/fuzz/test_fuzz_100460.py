"""Found by `python -m kiln.testing.fuzz` (seed 100460), shrunk: wrong. The input-order layout pass
relaid a clone stored in a permuted order (strides 3, 15, 1), and re-indexing its reader assumed the
old layout's first dim was its outermost (`layout._relaid_index`).

call 1, outputs: result 1: max abs diff 7.21e+24; RMSE vs float64: compiled 1.07e+24, eager 2.59 (limit 2x + 1e-05)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.x0 = torch.nn.Parameter(state['x0'])
#         self.register_buffer('x1', state['x1'])
#     def forward(self, ):
#         x0 = self.x0
#         x1 = self.x1
#         v1 = torch.index_select(x0, 1, ((torch.arange(3) * 3 + 3) % 8).reshape((3,)))
#         v3 = torch.matmul(v1, x1.t())
#         v4 = v1.clone()
#         v4.mul_(2)
#         v5 = v4 + 0
#         return (v3, v5)

PROGRAM = Program(
    seed=100460,
    inputs=[
        Input(name='x0', shape=(5, 8, 3), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=100460000),
        Input(name='x1', shape=(2, 3), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=100460001),
    ],
    steps=[
        Step(lines=('v1 = torch.index_select(x0, 1, ((torch.arange(3) * 3 + 3) % 8).reshape((3,)))',), defines=('v1',), reads=('x0',), family='indexing'),
        Step(lines=('v3 = torch.matmul(v1, x1.t())',), defines=('v3',), reads=('v1', 'x1'), family='matmul'),
        Step(lines=('v4 = v1.clone()', 'v4.mul_(2)', 'v5 = v4 + 0'), defines=('v4', 'v5'), reads=('v1',), family='inplace'),
    ],
    outputs=['v3', 'v5'],
    module=True,
)

test_fuzz_100460 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_100460()
