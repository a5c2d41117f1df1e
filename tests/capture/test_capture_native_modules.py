"""Modules whose call runs natively (hooks kiln does not capture: FSDP2's kind) with their forward
captured in its own frame (frame.NativeModuleCall), without processes."""
from __future__ import annotations

import torch

import kiln


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        return torch.tanh(self.lin(x)) * scale


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        return self.b(self.a(x) + 1).sum()


def _counting():
    graphs = []
    return graphs, lambda gm, ex: graphs.append(gm) or gm.forward


def test_hooks_with_kwargs_run_natively_and_forward_is_captured():
    model = Outer()
    calls = []

    def pre(mod, args, kwargs):
        calls.append(type(mod).__name__)
        return (args[0] * 2,), {"scale": 0.5}
    model.a.register_forward_pre_hook(pre, with_kwargs=True)
    x = torch.randn(3, 8, requires_grad=True)
    expected = model(x)
    expected.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    graphs, backend = _counting()
    compiled = kiln.compile(model, backend=backend)
    calls.clear()
    got = compiled(x)
    got.backward()
    torch.testing.assert_close(got, expected)
    for g, w in zip([p.grad for p in model.parameters()], want):
        torch.testing.assert_close(g, w)
    assert calls == ["Block"]                 # the hook ran once, natively
    # the graph before the block, the block's own forward, the rest
    assert any("lin" in str(gm.code) and "tanh" in str(gm.code) for gm in graphs), [gm.code for gm in graphs]
    assert len(graphs) >= 2


def test_backward_hook_fires_once_with_forward_captured():
    model = Block()
    fired = []
    model.register_full_backward_hook(lambda mod, gin, gout: fired.append(gout[0].shape))
    graphs, backend = _counting()
    compiled = kiln.compile(model, backend=backend)
    x = torch.randn(2, 8, requires_grad=True)
    compiled(x).sum().backward()
    assert fired == [torch.Size([2, 8])]
    assert len(graphs) == 1 and "tanh" in graphs[0].code
    assert "forward" not in model.__dict__      # the redirect ends with the call
