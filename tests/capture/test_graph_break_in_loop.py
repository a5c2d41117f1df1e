"""A graph break inside a loop runs the frame as Python and captures the functions it calls, as
torch.compile does ([Note: a graph break in a loop] in kiln/capture/eager_frames.py): the same
values as eager, and as many graphs (and ops) as torch.compile, whatever the loop's length."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo  # the reference compiler; tests may use torch's compiler
from torch._dynamo.testing import CompileCounter

import kiln
from capture_support import assert_same
from kiln.capture.eager_frames import in_loop


def inner(x):
    return torch.sin(x)


def break_in_for(x):
    for _ in range(100):
        inner(x)
        torch._dynamo.graph_break()
    return x


def break_in_while(x):
    i = 20
    while i > 10:
        x = inner(x)
        i -= 1
        torch._dynamo.graph_break()
    return x


def loop_with_break(x):
    for _ in range(3):
        x += 1
        torch._dynamo.graph_break()
    return x


def calls_a_looping_function(x):
    x += 2
    loop_with_break(x)
    x += 3
    return x


def scale(x, *, by=1.0, shift=0.0):
    return x * by + shift


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, factor):
        for layer in self.layers:          # calls of every form, the loop broken each time
            x = layer(x)
            x = scale(x, by=factor, shift=0.5)
            x = self.mix(*[x, x], **{"weight": 0.25})
            print(end="")
        return x

    def mix(self, a, b, weight):
        return torch.tanh(a * weight + b * (1 - weight))


CASES = [(break_in_for, lambda: (torch.randn(4),)), (break_in_while, lambda: (torch.randn(4),)),
         (calls_a_looping_function, lambda: (torch.randn(4),)),
         (Stack(), lambda: (torch.randn(2, 4), 2.0))]


@pytest.mark.parametrize("fn, make", CASES, ids=["for", "while", "callee_loops", "module"])
def test_counts_and_values_match_torch_compile(fn, make):
    torch._dynamo.reset()
    kiln.reset()
    theirs, ours = CompileCounter(), CompileCounter()
    torch.manual_seed(0)
    args = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        torch.compile(fn, backend=theirs)(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        compiled = kiln.compile(fn, backend=ours)
        got = compiled(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        assert_same(compiled(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), expected)
    assert_same(got, expected)
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count)


def test_a_long_loop_does_not_recurse():
    def long_loop(x):
        for _ in range(3000):
            x = x + 1
            torch._dynamo.graph_break()
        return x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(kiln.compile(long_loop, backend="eager")(torch.zeros(2)), torch.full((2,), 3000.0))


def test_in_loop_is_dynamos_test():
    import dis
    code = break_in_for.__code__
    calls = [i.offset for i in dis.get_instructions(code) if i.opname.startswith("CALL")]
    assert all(in_loop(code, offset) for offset in calls[1:])       # inner(x), graph_break()
    after = calls_a_looping_function.__code__
    assert not any(in_loop(after, i.offset) for i in dis.get_instructions(after))


def comprehensions_in_a_broken_loop(x):
    out = []
    for k in range(2):
        squares = [i * torch.cos(x) for i in range(3)]        # a function of its own on 3.11
        out.append(sum(v.sum() for v in squares) + len({i for i in range(k + 1)}))
        print(end="")
    return out


class SkippedForward(torch.nn.Module):
    @torch._dynamo.disable(recursive=False)
    def forward(self, x):
        return scale(x, by=2.0) + self.helper(x)

    def helper(self, x):
        return torch.sin(x) * 3


@pytest.mark.parametrize("fn", [comprehensions_in_a_broken_loop, SkippedForward()], ids=["comprehensions", "skip"])
def test_frames_run_as_python_keep_their_calls(fn):
    """Comprehensions and generator expressions in a frame run as Python (their function called on
    the iterator), and disable(recursive=False), whose frame alone runs as Python."""
    torch._dynamo.reset()
    kiln.reset()
    theirs, ours = CompileCounter(), CompileCounter()
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(x)
        torch.compile(fn, backend=theirs)(x)
        got = kiln.compile(fn, backend=ours)(x)
    assert_same(got, expected)
    if fn is not comprehensions_in_a_broken_loop:   # a comprehension over a real iterator runs eagerly here
        assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count)
