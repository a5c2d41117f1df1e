"""Found by `python -m kiln.testing.fuzz` (seed 7569), shrunk: crash. The layout pass copied
the buffer `x2` channels-last twice: as the first convolution's weight (`_channels_last_weights`)
and as the second's image (`_channels_last_inputs`), each pass keeping its own copies, so the graph
held two buffers and two nodes named `arg2_nhwc`. The scheduler fused the two identical copy nodes
into one kernel, and its C++ declared the copied value twice. Now a buffer is copied once per graph,
before the first convolution that reads it ([Note: one channels-last copy per buffer] in
kiln/codegen/layout.py).

call 1: CompileStageError: kiln codegen stage failed: g++ failed: "redeclaration of 'float
v_arg2_nhwc'".
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.register_buffer('x0', state['x0'])
#         self.register_buffer('x2', state['x2'])
#         self.register_buffer('x5', state['x5'])
#     def forward(self, x4):
#         x0 = self.x0
#         x2 = self.x2
#         x5 = self.x5
#         v6 = F.conv2d(x0, x2, padding=1)
#         v7 = F.conv2d(x2, x4, x5, stride=2, padding=1)
#         v16 = v6.mean()
#         v17 = v7.index_add(1, ((torch.arange(2) * 7 + 4) % 1).reshape((2,)), v7.narrow(1, 0, 1).expand((2, 2, 2, 2)))
#         return (v16, v17)

PROGRAM = Program(
    seed=7569,
    inputs=[
        Input(name='x0', shape=(8, 6, 2, 6), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=7569000),
        Input(name='x2', shape=(2, 6, 2, 2), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=7569002),
        Input(name='x4', shape=(1, 6, 1, 1), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=7569004),
        Input(name='x5', shape=(1,), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=7569005),
    ],
    steps=[
        Step(lines=('v6 = F.conv2d(x0, x2, padding=1)',), defines=('v6',), reads=('x0', 'x2'), family='convolution'),
        Step(lines=('v7 = F.conv2d(x2, x4, x5, stride=2, padding=1)',), defines=('v7',), reads=('x2', 'x4', 'x5'), family='convolution'),
        Step(lines=('v16 = v6.mean()',), defines=('v16',), reads=('v6',), family='reduction'),
        Step(lines=('v17 = v7.index_add(1, ((torch.arange(2) * 7 + 4) % 1).reshape((2,)), v7.narrow(1, 0, 1).expand((2, 2, 2, 2)))',), defines=('v17',), reads=('v7',), family='indexing'),
    ],
    outputs=['v16', 'v17'],
    module=True,
)

test_fuzz_7569 = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_7569()
