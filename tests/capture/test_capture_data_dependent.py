"""Ops whose output size (or Python value) depends on tensor values, [Note: data-dependent ops]:
kiln has no unbacked sizes, so each breaks the graph, runs eagerly, and gives eager's result; the
break names the kind of dependence and the user's line (in the user's function, also after an
earlier break); fullgraph=True raises naming the first."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.errors import Unsupported


def data_dependent(x):
    a = x.nonzero()
    b = x[x > 0]
    c = torch.masked_select(x, x > 0)
    d = torch.unique(x.round())
    r = torch.repeat_interleave(torch.arange(3), (x[:3] > 0).long() + 1)
    return a.sum() + b.sum() + c.sum() + d.sum() + r.sum()


_FIRST = data_dependent.__code__.co_firstlineno
EXPECTED = [(1, "number of nonzero elements"), (2, "boolean mask"), (3, "number of true elements of the mask"),
            (4, "number of distinct values"), (5, "repeats given by a tensor")]


def test_each_break_is_named_at_the_users_line_and_results_equal_eager():
    kiln.reset()
    x = torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = kiln.compile(data_dependent, backend="eager")
        for _ in range(2):
            torch.testing.assert_close(compiled(x), data_dependent(x))
        report = kiln.explain(data_dependent, x)
    reasons = [(b.detail, b.where) for b in report.breaks]
    assert len(reasons) == len(EXPECTED), reasons
    for (reason, where), (offset, words) in zip(reasons, EXPECTED):
        assert words in reason and "unbacked" in reason, reason
        assert where.endswith(f":{_FIRST + offset} in data_dependent"), where


def test_fullgraph_raises_at_the_first():
    kiln.reset()
    with pytest.raises(Unsupported) as info:
        kiln.compile(data_dependent, backend="eager", fullgraph=True)(torch.randn(8))
    assert "number of nonzero elements" in info.value.reason
    assert info.value.where.endswith(f":{_FIRST + 1} in data_dependent")
