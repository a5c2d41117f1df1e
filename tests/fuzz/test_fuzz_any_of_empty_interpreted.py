"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 200041), shrunk: wrong.

call 1, outputs: result 0: integer results differ (a max of bools over no elements started from int8's -128, stored as True)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.register_buffer('x0', state['x0'])
#     def forward(self, ):
#         x0 = self.x0
#         v1 = x0 > 0
#         v2 = v1.any()
#         return (v2,)

PROGRAM = Program(
    seed=200041,
    inputs=[
        Input(name='x0', shape=(0, 4, 2), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=200041000),
    ],
    steps=[
        Step(lines=('v1 = x0 > 0',), defines=('v1',), reads=('x0',), family='unary'),
        Step(lines=('v2 = v1.any()',), defines=('v2',), reads=('v1',), family='reduction'),
    ],
    outputs=['v2'],
    module=True,
)

test_fuzz_any_of_empty_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_any_of_empty_interpreted()
