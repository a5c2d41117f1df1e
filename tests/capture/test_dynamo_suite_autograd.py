"""Autograd inside captured code, as test_repros.py of the Dynamo suite (issue #39) exercises it:
`backward()` and `torch.autograd.grad` end the graph and run as Python, and `t.grad` of an input
is the real tensor's. Each program runs eagerly and under kiln; the gradients must be eager's, and
kiln makes as many graphs as torch.compile."""
from __future__ import annotations

import warnings

import torch
import torch._dynamo  # the reference compiler; tests may use torch's compiler

import kiln
from capture_support import Recorder, assert_same


def graphs_of(fn, *args) -> tuple[int, int]:
    """(torch.compile's graphs, kiln's graphs) for one call of `fn(*args)`, each on fresh copies."""
    torch._dynamo.reset()
    kiln.reset()
    theirs, ours = Recorder(), Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(fn, backend=theirs)(*[a.detach().clone().requires_grad_(a.requires_grad) for a in args])
        kiln.compile(fn, backend=ours)(*[a.detach().clone().requires_grad_(a.requires_grad) for a in args])
    return len(theirs.graphs), len(ours.graphs)


def two_backwards(a, b):
    c = torch.ones(2, 2)
    e = torch.matmul(a, c)
    torch.abs(e - c).mean().backward()
    torch.matmul(b, e.detach()).mean().backward()


def test_backward_in_captured_code_fills_the_leaves_grads():
    # traced into an aot graph, the backward call would be differentiated with the graph: no grads
    a, b = torch.randn(2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    two_backwards(a, b)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.compile(two_backwards, backend="aot_eager")(a2, b2)
    assert_same(a2.grad, a.grad)
    assert_same(b2.grad, b.grad)
    assert graphs_of(two_backwards, a, b)[1] == graphs_of(two_backwards, a, b)[0]


def grad_of_inner(x):
    y = torch.sin(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    return g * 2


def test_autograd_grad_ends_the_graph():
    x = torch.randn(3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = kiln.compile(grad_of_inner, backend="aot_eager")(x)
    assert_same(got, grad_of_inner(x))
    theirs, ours = graphs_of(grad_of_inner, x)
    assert ours == theirs


def grad_after_backward(x):
    with torch.enable_grad():
        y = torch.sigmoid(torch.sin(x))
        y.sum().backward()
        return x.grad, (x * 2).grad


def test_grad_of_an_input_is_the_real_tensors():
    # the grad the backward wrote, not a fake's (None)
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        expected = grad_after_backward(x)
    x.grad = None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = kiln.compile(grad_after_backward, backend="eager")(x)
    assert_same(got, expected)


def reads_grad(x):
    return x.grad if x.grad is None else x.grad * 2


def test_grad_read_is_guarded():
    compiled = kiln.compile(reads_grad, backend="eager")
    x = torch.randn(3, requires_grad=True)
    assert compiled(x) is None
    x.grad = torch.ones(3)
    assert_same(compiled(x), torch.full((3,), 2.0))


def retains(x, y):
    y.retain_grad()
    h = torch.sin(y) * 2
    h.retain_grad()
    return h + x, h


def test_retain_grad_marks_the_real_tensors():
    # a node marked the graph's own value: the input's .grad stayed None after backward
    x = torch.randn(4, requires_grad=True)
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        y, y_ref = torch.cos(x), torch.cos(x)
        out, h = kiln.compile(retains, backend=backend)(x, y)
        out_ref, h_ref = retains(x, y_ref)
        out.sum().backward()
        out_ref.sum().backward()
        assert_same(y.grad, y_ref.grad)
        assert_same(h.grad, h_ref.grad)


def makes_a_leaf(x):
    leaf = torch.ones(2, requires_grad=True)
    made = x.detach().requires_grad_()
    return leaf, made, leaf * 2 + made.sum()


def test_a_leaf_made_in_captured_code_gets_its_grad():
    # made inside an aot graph, the leaf was a graph value: backward raised, or left .grad None
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            leaf, made, out = kiln.compile(makes_a_leaf, backend=backend)(torch.ones(3))
        out.sum().backward()
        assert leaf.is_leaf and made.is_leaf
        assert_same(leaf.grad, torch.full((2,), 2.0))
        assert_same(made.grad, torch.full((3,), 2.0))


def writes_through_data(x):
    out = x.sin()
    x.data.mul_(2)
    return out


def test_a_write_through_data_after_the_forward_saved_the_input():
    # `.data` writes without bumping the input's version: eager's backward reads the new values,
    # where a write through detach() (or a copy into the leaf) raised
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        x = torch.randn(4, requires_grad=True)
        ours = x.detach().clone().requires_grad_(True)
        out = writes_through_data(x)
        got = kiln.compile(writes_through_data, backend=backend)(ours)
        out.sum().backward()
        got.sum().backward()
        assert_same(got, out)
        assert_same(ours.detach(), x.detach())
        assert_same(ours.grad, x.grad)
