"""Found by `python -m kiln.testing.fuzz --triton-interpret --half` (seed 1008808): a crash at the
second call ("value cannot be converted to type c10::Half without overflow"), and behind it a wrong
gradient on every path. A mean loss's backward divided by the element count as a float16 constant:
258 x 258 = 66,564 elements is inf in float16, so kiln's gradient was 0 where eager's is 2 (x - y) / N
(eager scales by a double); under 65,504 elements the count was rounded (16,641 became 16,640).
The fuzzer's absolute tolerance let the zeros pass as ok; the count is now divided in float32
(`_grad_scale` in kiln/prims/decompositions/losses.py)."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x0):
#     v1 = x0.sum(dim=(-4, -1))
#     v3 = v1.movedim(1, 0)
#     v4 = F.mse_loss(v3, v1)
#     return (v4,)
MSE_OF_TRANSPOSE = Program(
    seed=1008808,
    inputs=[
        Input(name='x0', shape=(1, 129, 1, 2), dtype='float16', layout='contiguous', requires_grad=True, role='arg', seed=1008808000),
    ],
    steps=[
        Step(lines=('v1 = x0.sum(dim=(-4, -1))',), defines=('v1',), reads=('x0',), family='reduction'),
        Step(lines=('v3 = v1.movedim(1, 0)',), defines=('v3',), reads=('v1',), family='view'),
        Step(lines=('v4 = F.mse_loss(v3, v1)',), defines=('v4',), reads=('v3', 'v1'), family='binary'),
    ],
    outputs=['v4'],
    module=False,
    resized={'x0': (1, 258, 1, 4)},
)

test_fuzz_1008808_triton_interpret = regression_test(MSE_OF_TRANSPOSE, target='triton-interpret')


@pytest.mark.parametrize("loss", [F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_mean_loss_gradient_over_more_elements_than_float16_holds(loss, dtype):
    torch.manual_seed(0)
    x = torch.randn(258, 258, dtype=dtype)
    y = torch.randn(258, 258, dtype=dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss(a, y).backward()
    kiln.compile(lambda u, v: loss(u, v))(b, y).backward()
    assert b.grad.abs().max() > 0
    torch.testing.assert_close(b.grad, a.grad)


if __name__ == "__main__":
    test_fuzz_1008808_triton_interpret()
    for loss in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss):
        for dtype in (torch.float16, torch.bfloat16):
            test_half_mean_loss_gradient_over_more_elements_than_float16_holds(loss, dtype)
