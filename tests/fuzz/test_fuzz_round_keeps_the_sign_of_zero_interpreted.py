"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 560033), shrunk: wrong.

call 1, outputs: result 0: max abs diff 2; RMSE vs float64: compiled 1, eager 0 (limit 2x + 1e-05)

The interpreter's `round` (`_k_round` in kiln/codegen/triton/ops.py; a GPU calls libdevice's
nearbyint) was floor(x + 0.5): round(-0.3) gave +0.0 where eager gives -0.0, and `copysign` read
the sign. It also rounded x + 0.5 first (0.49999997 + 0.5 is 1.0 in float32). It rounds from
floor(x) now, and a zero keeps x's sign.
"""
import pytest
import torch

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = torch.round(x0 * 2)
#     v2 = F.hardswish(v1)
#     v4 = torch.where(x0 > v2, x0, v2)
#     v5 = torch.eq(v1, v2)
#     v6 = v5.float()
#     v9 = torch.copysign(v6, v4)
#     return (v9,)

PROGRAM = Program(
    seed=560033,
    inputs=[
        Input(name='x0', shape=(4,), dtype='float32', layout='contiguous', requires_grad=True, role='arg', seed=560033000),
    ],
    steps=[
        Step(lines=('v1 = torch.round(x0 * 2)',), defines=('v1',), reads=('x0',), family='unary'),
        Step(lines=('v2 = F.hardswish(v1)',), defines=('v2',), reads=('v1',), family='unary'),
        Step(lines=('v4 = torch.where(x0 > v2, x0, v2)',), defines=('v4',), reads=('x0', 'v2'), family='binary'),
        Step(lines=('v5 = torch.eq(v1, v2)',), defines=('v5',), reads=('v1', 'v2'), family='binary'),
        Step(lines=('v6 = v5.float()',), defines=('v6',), reads=('v5',), family='unary'),
        Step(lines=('v9 = torch.copysign(v6, v4)',), defines=('v9',), reads=('v6', 'v4'), family='binary'),
    ],
    outputs=['v9'],
    module=False,
)

test_fuzz_560033_triton_interpret = regression_test(PROGRAM, target='triton-interpret')



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_round_under_the_interpreter_is_eagers_to_the_sign_of_zero(dtype):
    x = torch.tensor([-0.3072, -0.5, 0.5, 1.5, 2.5, -1.5, -2.5, 0.49999997, -0.49999997, 2.0 ** 23 + 1, -(2.0 ** 23 + 1),
                      3e38, -0.0, 0.0, float("nan"), float("inf"), -float("inf"), -0.7, 0.7, 1e-40, -1e-40, 4194304.5,
                      -4194304.5, 4194303.5]).to(dtype)
    got = kiln.compile(torch.round, options={"triton_interpret": True})(x)
    want = torch.round(x)
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.signbit(), want.signbit()), (got, want)


if __name__ == "__main__":
    test_fuzz_560033_triton_interpret()
