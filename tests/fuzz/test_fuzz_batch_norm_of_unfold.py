"""Found by `python -m kiln.testing.fuzz --programs 10000 --seed 0` (seed 4713), shrunk: a wrong
result. Batch norm of an unfold: another index that sympy 1.14 evaluated wrong ([Note: sympy's Mod
of a product] in kiln/symbolic/sympy_mod.py).

call 1, inputs after the call: result 3: max abs diff 0.278; RMSE vs float64: compiled 0.149, eager 0.0141 (limit 2x + 1e-05)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.x5 = torch.nn.Parameter(state['x5'])
#         self.register_buffer('x6', state['x6'])
#         self.register_buffer('x7', state['x7'])
#     def forward(self, x0, x4):
#         x5 = self.x5
#         x6 = self.x6
#         x7 = self.x7
#         v7 = x0.split(2, 0)[0]
#         v11 = v7.unfold(0, 2, 1)
#         v16 = -v11
#         v17 = F.batch_norm(v16, x6, x7.abs() + 0.5, x4, x5, training=True)
#         return (v17,)

PROGRAM = Program(
    seed=4713,
    inputs=[
        Input(name='x0', shape=(8, 4, 6, 8), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=476014000),
        Input(name='x4', shape=(4,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=476014004),
        Input(name='x5', shape=(4,), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=476014005),
        Input(name='x6', shape=(4,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=476014006),
        Input(name='x7', shape=(4,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=476014007),
    ],
    steps=[
        Step(lines=('v7 = x0.split(2, 0)[0]',), defines=('v7',), reads=('x0',), family='view'),
        Step(lines=('v11 = v7.unfold(0, 2, 1)',), defines=('v11',), reads=('v7',), family='view'),
        Step(lines=('v16 = -v11',), defines=('v16',), reads=('v11',), family='unary'),
        Step(lines=('v17 = F.batch_norm(v16, x6, x7.abs() + 0.5, x4, x5, training=True)',), defines=('v17',), reads=('v16', 'x6', 'x7', 'x4', 'x5'), family='normalization'),
    ],
    outputs=['v17'],
    module=True,
)

test_fuzz_4713 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_4713()
