"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1000616), shrunk: crash.

the process died (SIGSEGV): an empty [0, 5] pointwise fused into a reduction of 5 outputs stored to and loaded from element 0 of empty tensors
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1, x3):
#     v1 = torch.lerp(x1, x3, 0.3)
#     v5 = F.silu(v1)
#     return (v5,)

PROGRAM = Program(
    seed=1000616,
    inputs=[
        Input(name='x1', shape=(0, 5), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1000616001),
        Input(name='x3', shape=(5,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=1000616003),
    ],
    steps=[
        Step(lines=('v1 = torch.lerp(x1, x3, 0.3)',), defines=('v1',), reads=('x1', 'x3'), family='binary'),
        Step(lines=('v5 = F.silu(v1)',), defines=('v5',), reads=('v1',), family='unary'),
    ],
    outputs=['v5'],
    module=False,
)

test_fuzz_empty_buffer_not_fused_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_empty_buffer_not_fused_interpreted()
