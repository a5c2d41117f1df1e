"""Found by `python -m kiln.testing.fuzz` (seed 1250), shrunk: crash.

call 1: RuntimeError: mm(): functions with out=... arguments don't support automatic differentiation, but one of the arguments requires grad.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.x0 = torch.nn.Parameter(state['x0'])
#         self.register_buffer('x2', state['x2'])
#         self.x3 = torch.nn.Parameter(state['x3'])
#         self.register_buffer('x5', state['x5'])
#         self.register_buffer('x6', state['x6'])
#     def forward(self, x4):
#         x0 = self.x0
#         x2 = self.x2
#         x3 = self.x3
#         x5 = self.x5
#         x6 = self.x6
#         v2 = F.linear(x0, x3, x4)
#         v3 = torch.maximum(v2, x2)
#         v7 = torch.addmm(x6, v3, x5, beta=0.5)
#         v8 = v7 <= 0.5
#         return (v8,)

PROGRAM = Program(
    seed=1250,
    inputs=[
        Input(name='x0', shape=(3, 8), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=1250000),
        Input(name='x2', shape=(), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=1250002),
        Input(name='x3', shape=(2, 8), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=1250003),
        Input(name='x4', shape=(2,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1250004),
        Input(name='x5', shape=(2, 2), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=1250005),
        Input(name='x6', shape=(2,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=1250006),
    ],
    steps=[
        Step(lines=('v2 = F.linear(x0, x3, x4)',), defines=('v2',), reads=('x0', 'x3', 'x4'), family='matmul'),
        Step(lines=('v3 = torch.maximum(v2, x2)',), defines=('v3',), reads=('v2', 'x2'), family='binary'),
        Step(lines=('v7 = torch.addmm(x6, v3, x5, beta=0.5)',), defines=('v7',), reads=('x6', 'v3', 'x5'), family='matmul'),
        Step(lines=('v8 = v7 <= 0.5',), defines=('v8',), reads=('v7',), family='unary'),
    ],
    outputs=['v8'],
    module=True,
)

test_fuzz_forward_only_mm_out_under_grad = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_forward_only_mm_out_under_grad()
