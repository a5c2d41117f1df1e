"""Dynamic shapes, kiln.explain, fullgraph errors, and the built-in zoo under fullgraph=True."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import kiln
import kiln.capture
from capture_support import Recorder, assert_same
from kiln.bench.zoo import ZOO
from kiln.config import CaptureConfig
from kiln.errors import Unsupported


def view_and_branch(x, y):
    n = x.shape[0]
    z = x.view(n, -1) * 2
    if n > 3:
        z = z + 1
    return z + y.sum(), x.size(), len(x)


def _run(cf, fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(cf(*args), fn(*args))


def test_changed_dim_becomes_symbolic():
    kiln.capture.reset()
    rec = Recorder()
    cf = kiln.capture.capture(view_and_branch, rec, CaptureConfig())
    y = torch.randn(3)
    for n in (4, 5, 6, 9):
        _run(cf, view_and_branch, torch.randn(n, 3), y)
    assert len(rec.graphs) == 2  # static for 4, symbolic from 5 on
    _run(cf, view_and_branch, torch.randn(2, 3), y)  # n > 3 was guarded: a new entry
    assert len(rec.graphs) == 3
    placeholders_sizes = [n for n in rec.graphs[1].graph.nodes if n.op == "call_method" and n.target == "size"]
    assert placeholders_sizes, "the symbolic graph reads sizes at run time"


def test_dynamic_true_is_symbolic_from_the_start():
    kiln.capture.reset()
    rec = Recorder()
    cf = kiln.capture.capture(view_and_branch, rec, CaptureConfig(dynamic=True))
    for n in (4, 5, 6):
        _run(cf, view_and_branch, torch.randn(n, 3), torch.randn(3))
    assert len(rec.graphs) == 1


_CAUSAL = torch.tril(torch.ones(32, 32, dtype=torch.bool))


def mask_by_sizes(x, past):
    # what decoders do with a KV cache: slice a mask by run-time lengths, and build sizes from shape slices
    s, t = past.shape[1] + x.shape[1], x.shape[1]
    m = _CAUSAL[s - t:s, :s].float()
    y = torch.cat([past, x], 1)[:, -t:] * m[:, :1].sum()
    return y.view(*x.shape[:-1], -1) + x.new_zeros(x.shape[-1:])


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_a_slice_by_symbolic_sizes_and_a_shape_slice_stay_in_one_graph(backend):
    kiln.capture.reset()
    graphs = []
    compile_graph = kiln.backends.resolve(backend, kiln.config.Options())

    def recording(gm, example_inputs):
        graphs.append(gm)
        return compile_graph(gm, example_inputs)
    compiled = kiln.compile(mask_by_sizes, backend=recording, dynamic=True, fullgraph=True)
    for t, past in ((3, 5), (4, 6), (2, 9)):
        x, p = torch.randn(2, t, 4), torch.randn(2, past, 4)
        assert_same(compiled(x, p), mask_by_sizes(x, p))
    assert len(graphs) == 1


def test_dynamic_false_stays_static():
    kiln.capture.reset()
    rec = Recorder()
    cf = kiln.capture.capture(view_and_branch, rec, CaptureConfig(dynamic=False))
    for n in (4, 5, 6):
        _run(cf, view_and_branch, torch.randn(n, 3), torch.randn(3))
    assert len(rec.graphs) == 3


def _helper(y):
    if y.sum() > 0:
        return y * 3
    return y


def breaks_in_helper(x):
    y = x.cos()
    print("explain test")
    return _helper(y).sin()


def test_explain_reports_graphs_breaks_and_lines():
    kiln.capture.reset()
    x = torch.randn(3, 4)
    report = kiln.explain(breaks_in_helper, x)
    assert_same(report.output, breaks_in_helper(x))
    # print; the call of _helper (it breaks inside); and _helper's own frame at its branch
    assert report.graph_count >= 3 and report.break_count == 3
    reasons = [b.detail for b in report.breaks]
    assert any("print()" in r for r in reasons)
    assert any("control flow on a tensor" in r for r in reasons)
    assert any(b.where and os.path.basename(__file__) in b.where for b in report.breaks)
    assert "x is a tensor of dtype=torch.float32" in str(report)


def test_explain_reports_recompiles():
    kiln.capture.reset()
    events = []
    from kiln.capture import frame
    frame._EVENT_SINKS.append(events)
    try:
        cf = kiln.compile(lambda x: x + 1, backend="eager", dynamic=False)
        cf(torch.randn(2))
        cf(torch.randn(3))
    finally:
        frame._EVENT_SINKS.remove(events)
    recompiles = [e for e in events if e.kind == "recompile"]
    assert len(recompiles) == 1 and recompiles[0].detail.startswith("x.size(0) == 2 (now 3)"), recompiles[0].detail


def test_fullgraph_error_names_line_and_reason():
    cf = kiln.compile(breaks_in_helper, backend="eager", fullgraph=True)
    with pytest.raises(Unsupported) as info:
        cf(torch.randn(3))
    assert "print()" in info.value.reason
    assert info.value.where and os.path.basename(__file__) in info.value.where
    line = breaks_in_helper.__code__.co_firstlineno + 2
    assert f":{line} " in info.value.where


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_zoo_is_one_graph(name, train):
    kiln.capture.reset()
    model, inputs = ZOO[name].make("cpu")
    model.train(train)
    rec = Recorder()
    cf = kiln.capture.capture(model, rec, CaptureConfig(fullgraph=True))
    torch.manual_seed(0)
    out = cf(*inputs)
    torch.manual_seed(0)
    expected = model(*inputs)
    assert_same(out, expected)
    assert len(rec.graphs) == 1
    torch.manual_seed(1)
    out = cf(*inputs)
    torch.manual_seed(1)
    assert_same(out, model(*inputs))
    assert len(rec.graphs) == 1
