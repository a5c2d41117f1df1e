"""Library values kiln refuses rather than guess: under fullgraph=True each is an error naming the
user's line; without it, a graph break, and the result is eager's."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

import kiln
import kiln.capture
from capture_support import assert_same, breaks_of, run_compiled
from kiln.config import CaptureConfig
from kiln.errors import Unsupported


def _branch_on_array(x):
    a = x.numpy()
    if np.any(a > 0):  # refused: names this line
        return x + 1
    return x - 1


def _array_item(x):
    return x * x.numpy().sum().item()  # refused: names this line


def _array_left_of_tensor(x):
    return x.numpy() * x  # refused: names this line (eager raises TypeError; kiln does not guess)


def _endless(x):
    return [x * i for i, _ in zip(itertools.count(), range(3))]  # refused: names this line


def _is_leaf(x):
    leaf = lambda n: isinstance(n, tuple)  # noqa: E731
    return pytree.tree_map(lambda t: t * 2, [x, (x,)], is_leaf=leaf)  # refused: names this line


def _numpy_random(x):
    return x + torch.from_numpy(np.random.rand(4, 5))  # refused: names this line


_TABLE = np.arange(20.0).reshape(4, 5)


def _numpy_global(x):
    return x + torch.from_numpy(_TABLE)  # an array made outside: a graph input (its tensor view)


def _random_in_frozen_rng(x):
    with torch.random.fork_rng():
        noise = torch.rand_like(x)
    return x + noise  # refused: names this line (where the region ends)


REFUSED = [_branch_on_array, _array_item, _array_left_of_tensor, _endless, _is_leaf, _numpy_random,
           _random_in_frozen_rng]


def _refused_line(fn):
    if fn is _random_in_frozen_rng:  # reported at the `with` block's exit
        import inspect
        lines, start = inspect.getsourcelines(fn)
        return start + next(i for i, line in enumerate(lines) if "with" in line)
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if "refused" in line)


@pytest.mark.parametrize("fn", REFUSED, ids=[f.__name__ for f in REFUSED])
def test_fullgraph_names_the_line(fn):
    kiln.capture.reset()
    compiled = kiln.capture.capture(fn, lambda gm, ex: gm.forward, CaptureConfig(fullgraph=True))
    with pytest.raises(Unsupported, match=re.escape(f"{__file__}:{_refused_line(fn)}")):
        compiled(torch.randn(4, 5))


@pytest.mark.parametrize("fn", [_branch_on_array, _array_item, _endless, _is_leaf],
                         ids=lambda f: f.__name__)
def test_breaks_and_equals_eager(fn):
    recorder = run_compiled(fn, lambda seed: (torch.randn(4, 5, generator=torch.Generator().manual_seed(seed)),))
    assert breaks_of(recorder), "expected a graph break"


def test_an_array_made_outside_is_a_graph_input():
    # as under torch.compile: the array's tensor view is an input, re-read on every call, so a
    # write to the array between calls is seen
    compiled = kiln.compile(_numpy_global, backend="eager", fullgraph=True)
    x = torch.randn(4, 5)
    assert_same(compiled(x), _numpy_global(x))
    _TABLE[0, 0] += 100.0
    try:
        assert_same(compiled(x), _numpy_global(x))
    finally:
        _TABLE[0, 0] -= 100.0


def test_distribution_argument_check_still_raises():
    """torch.distributions' argument checks are assumed while capturing and checked after the graph:
    invalid arguments raise ValueError compiled, as in eager; valid ones give eager's values."""
    def log_prob(x, scale):
        return torch.distributions.Normal(x, scale).log_prob(x + 1)

    # running torch.compile once (another test in this process) turns torch.distributions'
    # validation off for good: the checks this test is about exist only with it on
    validating = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(True)
    try:
        _check_distribution_arguments(log_prob)
    finally:
        torch.distributions.Distribution.set_default_validate_args(validating)


def _check_distribution_arguments(log_prob):
    kiln.capture.reset()
    compiled = kiln.capture.capture(log_prob, lambda gm, ex: gm.forward, CaptureConfig(fullgraph=True))
    x = torch.randn(4, 5)
    torch.testing.assert_close(compiled(x, torch.ones(4, 5)), log_prob(x, torch.ones(4, 5)))
    with pytest.raises(ValueError):
        log_prob(x, -torch.ones(4, 5))
    with pytest.raises(ValueError):
        compiled(x, -torch.ones(4, 5))


def test_numpy_random_is_not_folded_into_a_constant():
    """np.random draws at run time in eager: capturing it as a constant would repeat one draw."""
    def draw(x):
        return x + torch.from_numpy(np.random.rand(4, 5)).float()

    kiln.capture.reset()
    compiled = kiln.capture.capture(draw, lambda gm, ex: gm.forward, CaptureConfig())
    x = torch.zeros(4, 5)
    assert not torch.equal(compiled(x), compiled(x))
