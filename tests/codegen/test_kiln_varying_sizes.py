"""Calls of one captured graph with other sizes (dynamic=True, or a dim that changed between
compilations) must never run kernels built for the first sizes: every result equals eager."""
import pytest
import torch

import kiln


def reduce_rows(x):
    return (x.sin() * 2).sum(0)


@pytest.mark.parametrize("dynamic", [True, None])
def test_varying_sizes_match_eager(dynamic):
    kiln.reset()
    f = kiln.compile(reduce_rows, dynamic=dynamic)
    for rows in (5, 7, 9, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(f(x), reduce_rows(x))


def test_training_with_varying_batch_matches_eager():
    kiln.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    fast = kiln.compile(model, dynamic=True)
    for batch in (3, 5, 4):
        x = torch.randn(batch, 6)
        model.zero_grad()
        fast(x).square().mean().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().mean().backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad)
