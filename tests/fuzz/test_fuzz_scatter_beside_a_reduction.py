"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 300102), shrunk: crash. An accumulating
index_put (a scatter kernel) was fused beside an rms_norm reduction, whose 2-d blocks its flat indirect store
did not match; a scatter now joins no kernel with an inner loop.

call 1: InterpreterError: ValueError("Cannot broadcast, rank mismatch: ['1'], [1, 1]")
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = x0.clone()
#     v1[0] = 0
#     v2 = v1 + 0
#     v3 = F.elu(v2)
#     v4 = x0.index_put((((torch.arange(1, device=DEVICE) * 3 + 0) % 65).reshape((1,)),), x0[0] * 0 + 1.0, accumulate=True)
#     v5 = F.rms_norm(v3, (65,))
#     return (v4, v5)

PROGRAM = Program(
    seed=300102,
    inputs=[
        Input(name='x0', shape=(65,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=30310303000),
    ],
    steps=[
        Step(lines=('v1 = x0.clone()', 'v1[0] = 0', 'v2 = v1 + 0'), defines=('v1', 'v2'), reads=('x0',), family='inplace'),
        Step(lines=('v3 = F.elu(v2)',), defines=('v3',), reads=('v2',), family='unary'),
        Step(lines=('v4 = x0.index_put((((torch.arange(1, device=DEVICE) * 3 + 0) % 65).reshape((1,)),), x0[0] * 0 + 1.0, accumulate=True)',), defines=('v4',), reads=('x0',), family='indexing'),
        Step(lines=('v5 = F.rms_norm(v3, (65,))',), defines=('v5',), reads=('v3',), family='normalization'),
    ],
    outputs=['v4', 'v5'],
    module=False,
)

test_fuzz_scatter_beside_a_reduction = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_scatter_beside_a_reduction()
