"""Found by `python -m kiln.testing.fuzz` (seed 2610), shrunk: wrong.

call 1, outputs: result 0: max abs diff 0.000151; RMSE vs float64: compiled 0.000102, eager 0 (limit 2x + 1e-05)

Cause: g++ contracted `a * b - c` into a fused multiply-add, so layer norm's `x - mean(x)` over one
element (x recomputed beside the mean that summed its rounded value) was the product's rounding
error, not 0; the group norm after it multiplied that by rsqrt(eps) ([Note: no FMA contraction] in
kiln/runtime/cpp_build.py).
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x5, x6):
#     v1 = F.rms_norm(x0, (1,))
#     v14 = F.layer_norm(v1, (1,), x5, x6)
#     v19 = F.group_norm(v14, 1)
#     return (v19,)

PROGRAM = Program(
    seed=2610,
    inputs=[
        Input(name='x0', shape=(4, 8, 1), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610000),
        Input(name='x5', shape=(1,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610005),
        Input(name='x6', shape=(1,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=2610006),
    ],
    steps=[
        Step(lines=('v1 = F.rms_norm(x0, (1,))',), defines=('v1',), reads=('x0',), family='normalization'),
        Step(lines=('v14 = F.layer_norm(v1, (1,), x5, x6)',), defines=('v14',), reads=('v1', 'x5', 'x6'), family='normalization'),
        Step(lines=('v19 = F.group_norm(v14, 1)',), defines=('v19',), reads=('v14',), family='normalization'),
    ],
    outputs=['v19'],
    module=False,
)

test_fuzz_layer_norm_over_one_element = regression_test(PROGRAM)

if __name__ == "__main__":
    test_fuzz_layer_norm_over_one_element()
