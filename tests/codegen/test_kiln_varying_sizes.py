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


def test_training_on_slices_of_a_padded_batch_matches_eager():
    """Token ids sliced from a longer buffer (`ids[:, :n]`): the row stride is a symbol of its own,
    which the host program reads from the input's strides (it is no input's size)."""
    from kiln.bench import zoo
    kiln.reset()
    model, (ids,) = zoo.ZOO["gpt2"].make()
    padded = ids.repeat(1, 3)
    fast = kiln.compile(model)
    for length in (16, 24, 40, 24):
        x = padded[:, :length]
        model.zero_grad(set_to_none=True)
        zoo.loss_of(fast(x)).backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        zoo.loss_of(model(x)).backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
