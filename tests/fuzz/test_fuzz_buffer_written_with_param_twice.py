"""Found by `python -m kiln.testing.fuzz` (seed 73), shrunk: crash.

call 2: RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.

Cause: after call 1 the buffer x2 holds a value that requires grad (it was written with the
parameter), so call 2's compiled Function takes it as an input; backward of v1 then reached
call 1's Function through x2's history with no gradient, and it read its freed saved values.
A compiled backward that gets no gradient at all now returns none (kiln/aot/runtime.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# class M(torch.nn.Module):
#     def __init__(self, state):
#         super().__init__()
#         self.register_buffer('x2', state['x2'])
#         self.x3 = torch.nn.Parameter(state['x3'])
#     def forward(self, x0):
#         x2 = self.x2
#         x3 = self.x3
#         x2.sub_(x3)
#         v1 = torch.where(x3 > x0, x3, x0)
#         return (v1,)

PROGRAM = Program(
    seed=73,
    inputs=[
        Input(name='x0', shape=(4,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=73000),
        Input(name='x2', shape=(5, 4), dtype='float32', layout='contiguous', requires_grad=False, role='buffer', seed=73002),
        Input(name='x3', shape=(), dtype='float32', layout='contiguous', requires_grad=True, role='param', seed=73003),
    ],
    steps=[
        Step(lines=('x2.sub_(x3)',), defines=(), reads=('x2', 'x3'), family='inplace'),
        Step(lines=('v1 = torch.where(x3 > x0, x3, x0)',), defines=('v1',), reads=('x3', 'x0'), family='binary'),
    ],
    outputs=['v1'],
    module=True,
)

test_fuzz_buffer_written_with_param_twice = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_buffer_written_with_param_twice()
