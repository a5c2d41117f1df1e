"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 510383), shrunk: reported
wrong once the fuzzer's tolerances were made relative to the reference, and unstable since.

call 1, gradients: result 0: not allclose at tol 0.001 x magnitude 3.81e-06 (max abs diff 3.81e-06) and no float64 run

The float16 layer norm over one element has a gradient of zero, computed as rounding noise
(eager's values up to 3.8e-6, kiln's others). The float64 run fails (the einsum's output strides
differ in float64 and the `.view` raises), so there is no arbiter; eager's own gradient moves by
8.6e-6 when its inputs move by one rounding, more than kiln's differs: `unstable` by [Note:
results eager cannot pin down] in kiln/testing/fuzz.py.
"""
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0, x4, x5, x8):
#     v1 = torch.exp(x0.clamp(-4, 4))
#     v7 = F.layer_norm(x0, (1,), x4, x5)
#     v16 = torch.einsum('ij,jk->ki', v1, x8)
#     v23 = v16.clone()
#     v23.clamp_(-1, 1)
#     v24 = v23.view(-1)
#     return (v7,)

PROGRAM = Program(
    seed=510383,
    inputs=[
        Input(name='x0', shape=(8, 1), dtype='float16', layout='offset', requires_grad=True, role='arg', seed=510383000),
        Input(name='x4', shape=(1,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=510383004),
        Input(name='x5', shape=(1,), dtype='float32', layout='contiguous', requires_grad=False, role='arg', seed=510383005),
        Input(name='x8', shape=(1, 4), dtype='float16', layout='expanded', requires_grad=True, role='arg', seed=510383008),
    ],
    steps=[
        Step(lines=('v1 = torch.exp(x0.clamp(-4, 4))',), defines=('v1',), reads=('x0',), family='unary'),
        Step(lines=('v7 = F.layer_norm(x0, (1,), x4, x5)',), defines=('v7',), reads=('x0', 'x4', 'x5'), family='normalization'),
        Step(lines=("v16 = torch.einsum('ij,jk->ki', v1, x8)",), defines=('v16',), reads=('v1', 'x8'), family='matmul'),
        Step(lines=('v23 = v16.clone()', 'v23.clamp_(-1, 1)', 'v24 = v23.view(-1)'), defines=('v23', 'v24'), reads=('v16',), family='inplace'),
    ],
    outputs=['v7'],
    module=False,
)

test_fuzz_510383_triton_interpret = regression_test(PROGRAM, target='triton-interpret')

if __name__ == "__main__":
    test_fuzz_510383_triton_interpret()
