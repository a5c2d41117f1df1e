"""Writes through views of tensors of symbolic sizes ([Note: writes through views of symbolic
sizes] in kiln/aot/views.py), under dynamic=True, on two sizes, vs eager: forward and backward."""
import pytest
import torch

import kiln


def _slice_write(x):
    y = x * 2
    y[0] = 3
    y[1:, 1] = -1
    return y


def _squeeze_write(x):
    y = x.unsqueeze(-1).clone()
    y.squeeze(-1)[0].mul_(5)
    return y


def _permute_write(x):
    y = x.clone()
    y.t()[1].fill_(7)
    return y.sin()


def _broadcast_write(x):
    y = x.clone()
    y[None][0, 1:] += 1        # a write through a view that adds a size-1 dim
    return y


@pytest.mark.parametrize("fn", [_slice_write, _squeeze_write, _permute_write, _broadcast_write])
def test_writes_through_views_of_symbolic_sizes_match_eager(fn):
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for rows in (4, 7):
        x = torch.randn(rows, 5, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        got, want = compiled(x), fn(x_ref)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)


def _view_write(x):
    y = x.clone()
    y.view(-1)[2:4] = 0
    y.reshape(-1, 1)[0] += 1
    return y * 3


def test_writes_through_reshapes_of_symbolic_sizes_match_eager():
    test_writes_through_views_of_symbolic_sizes_match_eager(_view_write)
