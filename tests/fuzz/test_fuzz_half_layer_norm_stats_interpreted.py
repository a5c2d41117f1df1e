"""Found by `python -m kiln.testing.fuzz --triton-interpret` (seed 1001487), shrunk: wrong.

call 1, gradients: result 0: max abs diff 0.00274; RMSE vs float64: compiled 0.000982, eager 7.59e-07 (limit 3x + 0.0001)
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1, x3, x4, x5, x6):
#     v1 = x1.unflatten(1, (2, 1))
#     v2 = v1.transpose(0, 2)
#     v6 = F.linear(v2, x3, x4)
#     v7 = F.layer_norm(v6, (2,), x5, x6)
#     return (v7,)

PROGRAM = Program(
    seed=1001487,
    inputs=[
        Input(name='x1', shape=(6, 2), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=1001487001),
        Input(name='x3', shape=(2, 6), dtype='float16', layout='offset', requires_grad=True, role='arg', seed=1001487003),
        Input(name='x4', shape=(2,), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=1001487004),
        Input(name='x5', shape=(2,), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=1001487005),
        Input(name='x6', shape=(2,), dtype='float32', layout='expanded', requires_grad=True, role='arg', seed=1001487006),
    ],
    steps=[
        Step(lines=('v1 = x1.unflatten(1, (2, 1))',), defines=('v1',), reads=('x1',), family='view'),
        Step(lines=('v2 = v1.transpose(0, 2)',), defines=('v2',), reads=('v1',), family='view'),
        Step(lines=('v6 = F.linear(v2, x3, x4)',), defines=('v6',), reads=('v2', 'x3', 'x4'), family='matmul'),
        Step(lines=('v7 = F.layer_norm(v6, (2,), x5, x6)',), defines=('v7',), reads=('v6', 'x5', 'x6'), family='normalization'),
    ],
    outputs=['v7'],
    module=False,
)

test_fuzz_half_layer_norm_stats_interpreted = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_half_layer_norm_stats_interpreted()
