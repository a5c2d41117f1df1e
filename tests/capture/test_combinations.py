"""`torch.combinations` captured in one graph ([Note: combinations without a mask] in
kiln/symbolic/combinations.py): its output size follows from the input's size, though ATen computes
it through a data-dependent mask. Values and gradients against eager."""
import pytest
import torch

import kiln


@pytest.mark.parametrize("r, with_replacement", [(1, False), (2, False), (3, False), (2, True), (3, True), (9, False)])
def test_combinations_is_one_graph_and_equals_eager(r, with_replacement):
    def f(x):
        return torch.combinations(x * 2, r=r, with_replacement=with_replacement).sin()

    kiln.reset()
    x = torch.randn(6)
    torch.testing.assert_close(kiln.compile(f, fullgraph=True)(x), f(x))


def test_combinations_gradient_equals_eager():
    def f(x):
        pairs = torch.combinations(x, 2)
        return (pairs[:, 0] * pairs[:, 1].exp()).sum()

    kiln.reset()
    x = torch.randn(7, requires_grad=True)
    (want,) = torch.autograd.grad(f(x), x)
    (got,) = torch.autograd.grad(kiln.compile(f, fullgraph=True)(x), x)
    torch.testing.assert_close(got, want)


def test_an_empty_result_requires_grad_as_eagers_does():
    x = torch.randn(2, requires_grad=True)
    kiln.reset()
    got = kiln.compile(lambda t: torch.combinations(t, r=4), fullgraph=True)(x)
    want = torch.combinations(x, r=4)
    assert got.shape == want.shape == (0, 4) and got.requires_grad and want.requires_grad
    (g,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(g, torch.zeros(2))
