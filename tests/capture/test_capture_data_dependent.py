"""Ops whose output size (or Python value) depends on tensor values, [Note: data-dependent ops]:
nonzero, x[mask], masked_select, unique, repeat_interleave(tensor) and an int read with .item()
are captured in one graph, their sizes unbacked symbols ([Note: unbacked sizes]); what still
breaks the graph (a float read from a tensor, a Python branch on a count) names the kind of
dependence and the user's line, and fullgraph=True raises naming it."""
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
    n = torch.arange((x > 0).sum().item())
    return a.sum() + b.sum() + c.sum() + d.sum() + r.sum() + n.sum()


def test_one_graph_no_break_and_results_equal_eager():
    kiln.reset()
    compiled = kiln.compile(data_dependent, backend="eager", fullgraph=True)
    for x in (torch.randn(8), torch.randn(8), -torch.ones(8)):
        torch.testing.assert_close(compiled(x), data_dependent(x))
    report = kiln.explain(data_dependent, torch.randn(8))
    assert len(report.graphs) == 1 and not report.breaks and not report.recompiles, report


def float_item(x):
    y = x * 2
    s = x.sum().item()
    return y + s


def branch_on_count(x):
    y = x[x > 0]
    if y.numel() > 2:
        return y.sum()
    return y.mean()


_FLOAT = float_item.__code__.co_firstlineno
_BRANCH = branch_on_count.__code__.co_firstlineno


@pytest.mark.parametrize("fn, offset, words", [(float_item, 2, "float32 tensor"),
                                               (branch_on_count, 2, "depends on the values in a tensor")])
def test_what_still_breaks_is_named_at_the_users_line(fn, offset, words):
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = kiln.compile(fn, backend="eager")
        for x in (torch.randn(8), torch.ones(8), -torch.ones(8)):
            torch.testing.assert_close(compiled(x), fn(x), equal_nan=True)
        report = kiln.explain(fn, torch.randn(8))
    assert report.breaks, report
    reason, where = report.breaks[0].detail, report.breaks[0].where
    assert words in reason, reason
    assert where.endswith(f":{fn.__code__.co_firstlineno + offset} in {fn.__name__}"), where
    kiln.reset()
    with pytest.raises(Unsupported) as info:
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(8))
    assert words in info.value.reason
