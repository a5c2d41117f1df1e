"""[Note: matmul on symbolic sizes] in kiln/symbolic/matmul.py: ATen's matmul branches written out
in torch ops compute what torch.matmul computes, and on symbolic fakes pin no size (torch 2.11's C++
composite pinned the prompt length of a decoder's rotary embedding: one graph per prompt length)."""
from __future__ import annotations

import pytest
import sympy
import torch

import kiln
from capture_support import Recorder
from kiln.symbolic import FakeTensorMode, matmul

SHAPES = [((5,), (5,)), ((3, 5), (5,)), ((5,), (5, 4)), ((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 3, 5), (5,)),
          ((5,), (2, 5, 4)), ((3, 5), (2, 5, 4)), ((2, 1, 3, 5), (4, 5, 6)), ((2, 3, 5), (2, 5, 4))]


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shapes", SHAPES, ids=[f"{a}@{b}" for a, b in SHAPES])
def test_the_written_out_branches_equal_torch_matmul(shapes, grad):
    torch.manual_seed(0)
    a, b = (torch.randn(*s, requires_grad=grad) for s in shapes)
    branch = matmul._folded if matmul._should_fold(a, b) else matmul._batched
    if a.dim() <= 2 and b.dim() <= 2:
        branch = matmul.matmul
    got, want = branch(a, b), torch.matmul(a, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if grad:
        got.square().sum().backward()
        mine = [a.grad, b.grad]
        a.grad = b.grad = None
        want.square().sum().backward()
        for g, w in zip(mine, [a.grad, b.grad]):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shapes", SHAPES[4:], ids=[f"{a}@{b}" for a, b in SHAPES[4:]])
def test_symbolic_operands_pin_no_size(shapes):
    mode = FakeTensorMode()
    a = mode.from_real(torch.randn(*shapes[0]), "a", dynamic_dims=tuple(range(len(shapes[0]) - 1)))
    b = mode.from_real(torch.randn(*shapes[1]), "b", dynamic_dims=(0,) if len(shapes[1]) >= 3 else ())
    with mode:
        out = matmul.matmul(a, b)
    assert out.dim() == torch.matmul(torch.randn(*shapes[0]), torch.randn(*shapes[1])).dim()
    pins = [g for g in mode.shape_env.guards if isinstance(g.expr, sympy.Eq) and any(x.is_Integer for x in g.expr.args)]
    assert not pins, mode.shape_env.format_guards()


def test_a_rotary_embedding_over_prompt_lengths_is_one_graph():
    """A decoder's rotary angles, `inv_freq @ positions`, as LLaMA and GPT-NeoX compute them."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))

    def angles(ids):
        positions = torch.arange(ids.shape[1])[None, None, :].float().expand(ids.shape[0], 1, -1)
        freqs = (inv_freq[None, :, None].expand(ids.shape[0], -1, 1) @ positions).transpose(1, 2)
        x = torch.cat((freqs, freqs), -1)
        return x.cos() + x.sin().matmul(torch.eye(8))
    kiln.reset()
    rec = Recorder()
    fast = kiln.compile(angles, backend=rec, dynamic=True)
    for n in (7, 11, 5):
        ids = torch.zeros(2, n, dtype=torch.long)
        torch.testing.assert_close(fast(ids), angles(ids), rtol=0, atol=0)
    assert len(rec.graphs) == 1


LINEAR = [((3, 5), True), ((3, 5), False), ((2, 3, 5), True), ((2, 3, 5), False), ((2, 2, 3, 5), True),
          ((2, 2, 3, 5), False)]


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape, bias", LINEAR, ids=[f"{s}{'+b' if b else ''}" for s, b in LINEAR])
def test_the_written_out_linear_equals_F_linear_and_pins_no_size(shape, bias, grad):
    """ATen's linear composite in torch ops: bit for bit on real tensors (the same addmm or matmul
    branch), and on symbolic fakes no size pinned (torch 2.11's composite on CUDA fakes read one
    as an int: dolly's bias-free lm_head at a symbolic prompt length)."""
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=grad)
    w, b = torch.randn(4, 5, requires_grad=grad), torch.randn(4, requires_grad=grad) if bias else None
    got, want = matmul.linear(x, w, b), torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if grad:
        leaves = [t for t in (x, w, b) if t is not None]
        mine = torch.autograd.grad(got.square().sum(), leaves)
        theirs = torch.autograd.grad(want.square().sum(), leaves)
        for g, t in zip(mine, theirs):
            torch.testing.assert_close(g, t, rtol=1e-6, atol=1e-6)
    mode = FakeTensorMode()
    fx = mode.from_real(x.detach(), "x", dynamic_dims=tuple(range(len(shape) - 1)))
    fw, fb = mode.from_real(w.detach(), "w"), mode.from_real(b.detach(), "b") if bias else None
    with mode:
        out = matmul.linear(fx, fw, fb)
    assert out.dim() == len(shape)
    pins = [g for g in mode.shape_env.guards if isinstance(g.expr, sympy.Eq) and any(x.is_Integer for x in g.expr.args)]
    assert not pins, mode.shape_env.format_guards()
