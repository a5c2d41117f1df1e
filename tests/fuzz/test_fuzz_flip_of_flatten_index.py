"""Found by `python -m kiln.testing.fuzz` (seed 5070), shrunk: wrong.

call 1, outputs: result 0: integer results differ
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.x2 = torch.nn.Parameter(state['x2'])
#         self.x4 = torch.nn.Parameter(state['x4'])
#     def forward(self, ):
#         x2 = self.x2
#         x4 = self.x4
#         v6 = x2.flatten()
#         v8 = x4 < v6
#         v12 = v8.flip(0)
#         return (v12,)

PROGRAM = Program(
    seed=5070,
    inputs=[
        Input(name='x2', shape=(8, 2, 2), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=512072002),
        Input(name='x4', shape=(), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=512072004),
    ],
    steps=[
        Step(lines=('v6 = x2.flatten()',), defines=('v6',), reads=('x2',), family='view'),
        Step(lines=('v8 = x4 < v6',), defines=('v8',), reads=('x4', 'v6'), family='binary'),
        Step(lines=('v12 = v8.flip(0)',), defines=('v12',), reads=('v8',), family='view'),
    ],
    outputs=['v12'],
    module=True,
)

test_fuzz_flip_of_flatten_index = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_flip_of_flatten_index()
