"""Functions made in captured code that leave it (returned, stored, handed to a resume function),
as test_misc.py and test_repros.py of the Dynamo suite (issue #39) make them: closures, recursive
closures, closures sharing one variable, functools.wraps wrappers. Each program runs under
torch.compile (a recording backend) and under kiln's capture; both must give eager's values, and
kiln as many graphs as torch.compile."""
from __future__ import annotations

import functools

import torch

from capture_support import assert_same
from capture_support import eager_torch_kiln as both


def returns_closure(x):
    y = x + 1

    def inner(z):
        return z * y
    return inner, x.sin()


def returns_two_closures_over_one_variable(x):
    count = 0

    def bump():
        nonlocal count
        count += 1
        return count

    def read():
        return count
    return bump, read, x.cos()


def returns_recursive_closure(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return fact, x * 2


def decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1
    return wrapper


def returns_wrapped_closure(x):
    scale = x.sum()

    def scaled(y, *, k=2):
        return y * k * scale
    return decorate(scaled), x.exp()


def test_returned_closure_is_made_again():
    x = torch.randn(3)
    (e, e_out), (t, t_out), (k, k_out), theirs, ours = both(returns_closure, x, fullgraph=True)
    assert_same(k_out, e_out)
    assert_same(k(x), e(x))
    assert k.__closure__ is not None and len(ours.graphs) == len(theirs.graphs) == 1


def test_closures_share_their_cell():
    x = torch.randn(3)
    expected, _, (bump, read, out), theirs, ours = both(returns_two_closures_over_one_variable, x, fullgraph=True)
    assert_same(out, expected[2])
    bump()
    bump()
    assert read() == 2
    assert len(ours.graphs) == len(theirs.graphs) == 1


def test_recursive_closure():
    x = torch.randn(3)
    expected, _, (fact, out), theirs, ours = both(returns_recursive_closure, x, fullgraph=True)
    assert fact(5) == expected[0](5) == 120
    assert_same(out, expected[1])
    assert len(ours.graphs) == len(theirs.graphs) == 1


def test_functools_wraps_wrapper_keeps_its_attributes():
    x = torch.randn(3)
    (e, e_out), _, (k, k_out), theirs, ours = both(returns_wrapped_closure, x, fullgraph=True)
    assert_same(k_out, e_out)
    assert_same(k(x, k=3), e(x, k=3))
    assert (k.__name__, k.__qualname__) == (e.__name__, e.__qualname__)
    assert k.__wrapped__.__kwdefaults__ == {"k": 2}
    assert len(ours.graphs) == len(theirs.graphs) == 1


def closure_written_after_a_break(x):
    def read():
        x[0] = later
    if x.sum() >= -1e5:     # a graph break (a branch on a tensor)
        pass
    later = 1.0
    read()
    return x


def test_closure_over_a_frame_variable_across_a_graph_break():
    # the resume function gets the frame's variables in cells of its own: a closure over one
    # cannot be made again sharing it, so the frame runs as Python there; values stay eager's
    x = torch.zeros(2)
    expected, got_t, got_k, _, _ = both(closure_written_after_a_break, x.clone())
    assert_same(got_k, expected)
    assert_same(got_t, expected)


class ObjectFromNew:
    def __new__(cls):
        return object()     # not an instance: __init__ is not run

    def __init__(self):
        raise AssertionError("not called")


def returns_what_new_made(x):
    return ObjectFromNew(), x + 1


def test_new_returning_a_plain_object():
    _, _, (obj, out), _, _ = both(returns_what_new_made, torch.ones(2))   # torch breaks at object()
    assert type(obj) is object
    assert_same(out, torch.ones(2) + 1)
