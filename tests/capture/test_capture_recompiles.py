"""Recompiles said in the user's terms, and the cache-size limit.

Every recompile names the guard that failed with the value it expected, the value now and the line
of the user's program the specialization came from (kiln.explain's events, KILN_LOG=recompiles).
Past the limit a miss runs the function as Python: one warning, then no trace, no compile and no
diagnosis per call (that made BERT's calls 33x slower than eager on the H200), only the entries'
own guard checks.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import kiln
import kiln.capture
from capture_support import Recorder
from kiln.capture import frame, guards

HERE = os.path.basename(__file__)


def branchy(x, y):
    z = x * 2
    if x.shape[0] > 5:          # a guard on a symbolic size, raised at this line
        z = z + 1
    return z + y


_BRANCH_LINE = branchy.__code__.co_firstlineno + 2


def _events(fn, calls):
    events = []
    frame._EVENT_SINKS.append(events)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for args in calls:
                torch.testing.assert_close(fn(*args), branchy(*args))
    finally:
        frame._EVENT_SINKS.remove(events)
    return [e for e in events if e.kind == "recompile"]


def test_a_static_size_recompile_names_the_dim_the_values_and_the_line():
    kiln.reset()
    cf = kiln.compile(branchy, backend=Recorder(), dynamic=False)
    y = torch.randn(3)
    (event,) = _events(cf, [(torch.randn(4, 3), y), (torch.randn(7, 3), y)])
    assert event.detail.startswith("x.size(0) == 4 (now 7)"), event.detail
    assert f"{HERE}:{branchy.__code__.co_firstlineno + 1} in branchy" in event.detail   # `z = x * 2` reads x


def test_a_symbolic_size_recompile_names_the_relation_and_its_line():
    kiln.reset()
    cf = kiln.compile(branchy, backend=Recorder(), dynamic=True)
    y = torch.randn(3)
    (event,) = _events(cf, [(torch.randn(8, 3), y), (torch.randn(9, 3), y), (torch.randn(3, 3), y)])
    assert event.detail.startswith("x.size(0) > 5 (now x.size(0) = 3)"), event.detail
    assert f"{HERE}:{_BRANCH_LINE} in branchy" in event.detail


def test_kiln_log_recompiles_prints_every_recompile(monkeypatch, capsys):
    kiln.reset()
    monkeypatch.setenv("KILN_LOG", "recompiles")
    cf = kiln.compile(branchy, backend=Recorder(), dynamic=False)
    y = torch.randn(3)
    _events(cf, [(torch.randn(n, 3), y) for n in (4, 7, 9)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[kiln recompiles]")]
    assert lines == ["[kiln recompiles] recompile of branchy: " + d for d in (
        f"x.size(0) == 4 (now 7); the tensor was read first at {lines[0].split('read first at ')[1]}",
        f"x.size(0) == 7 (now 9); the tensor was read first at {lines[0].split('read first at ')[1]}")], lines


def test_a_dtype_change_is_named():
    kiln.reset()
    cf = kiln.compile(branchy, backend=Recorder())
    y = torch.randn(3, dtype=torch.float64)
    (event,) = _events(cf, [(torch.randn(4, 3), y), (torch.randn(4, 3, dtype=torch.float64), y)])
    assert event.detail.startswith("x.dtype == torch.float32 (now torch.float64)"), event.detail


def _counting(monkeypatch, module, name, counts):
    original = getattr(module, name)

    def counted(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)


def test_past_the_cache_limit_a_miss_runs_eagerly_and_compiles_nothing(monkeypatch):
    kiln.reset()
    rec = Recorder()
    cf = kiln.compile(branchy, backend=rec, dynamic=False, options={"cache_size_limit": 2})
    y = torch.randn(3)
    for n in (2, 3):
        x = torch.randn(n, 3)
        torch.testing.assert_close(cf(x, y), branchy(x, y))
    with pytest.warns(UserWarning) as caught:
        x = torch.randn(4, 3)
        torch.testing.assert_close(cf(x, y), branchy(x, y))
    (warning,) = [w for w in caught if "cache_size_limit" in str(w.message)]
    assert "x.size(0) == 3 (now 4)" in str(warning.message) and "2 compiled entries" in str(warning.message)

    counts: dict[str, int] = {}
    for module, name in ((frame, "trace_frame"), (frame, "why_missed"), (guards, "compile_guards"),
                         (guards, "failure_finder")):
        _counting(monkeypatch, module, name, counts)
    checks = {"n": 0}
    for entry in cf.entries:     # count the guard checks a call makes: one per entry
        def counted(*a, __check=entry.check, **k):
            checks["n"] += 1
            return __check(*a, **k)
        counted.__kiln_bindings__ = entry.check.__kiln_bindings__
        entry.check = counted
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no second warning
        for n in range(5, 25):
            x = torch.randn(n, 3)
            torch.testing.assert_close(cf(x, y), branchy(x, y))
    assert counts == {}, f"past the limit, calls still traced, compiled or diagnosed guards: {counts}"
    assert checks["n"] == 20 * 2 and cf.eager_calls == 21 and len(rec.graphs) == 2
    x = torch.randn(3, 3)       # an entry still serves its own sizes
    torch.testing.assert_close(cf(x, y), branchy(x, y))
    assert cf.eager_calls == 21


def _printing_helper(x):
    print("helper")             # a graph break: the helper is captured in its own frame
    return x.cos()


def _calls_helper_on_two_sizes(x):
    return _printing_helper(x[:4]).sum() + _printing_helper(x[:6]).sum()


def test_explain_reports_each_recompile_with_its_guard(capsys):
    kiln.reset()
    x = torch.randn(8, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = kiln.explain(_calls_helper_on_two_sizes, x)
    torch.testing.assert_close(report.output, _calls_helper_on_two_sizes(x))
    details = [r.detail for r in report.recompiles]
    assert any(d.startswith("x.size(0) == 4 (now 6)") for d in details), details
    assert "guard failed: x.size(0) == 4 (now 6)" in str(report)


def test_a_recompile_under_another_autocast_state_names_autocast():
    """The autocast guard (fuzz's find) is diagnosed like the others: a float that changed is named
    as itself, and a change of autocast as autocast with its state now."""
    from kiln.capture import frame
    events: list = []
    frame._EVENT_SINKS.append(events)
    try:
        kiln.reset()
        g = kiln.compile(lambda x, s: x * s)
        x = torch.randn(3)
        g(x, 2.0)
        g(x, 3.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            g(x, 3.0)
    finally:
        frame._EVENT_SINKS.remove(events)
    reasons = [e.detail for e in events if e.kind == "recompile"]
    assert reasons[0].startswith("s == 2.0 (now 3.0)"), reasons
    assert reasons[1].startswith("autocast") and "(now (True, torch.bfloat16" in reasons[1], reasons


def _shifted_positions(pos, stride, shift=1):
    # Funnel's relative_pos: called with another stride and shift per block
    num_remove = shift * pos.shape[0]
    return pos * stride + num_remove


def test_an_int_argument_that_changes_becomes_symbolic_instead_of_recompiling_per_value():
    """[Note: ints that change]: as torch.compile's automatic dynamic, the second value of `stride`
    (and of `shift`) compiles a graph with the int as a symbolic input, which serves every later
    value: no cache-size limit reached, no eager calls, even under fullgraph=True."""
    kiln.reset()
    rec = Recorder()
    cf = kiln.compile(_shifted_positions, backend=rec, fullgraph=True)
    pos = torch.arange(6.0)
    for stride in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11):
        for shift in (2, 3, 5):
            torch.testing.assert_close(cf(pos, stride, shift), _shifted_positions(pos, stride, shift))
    assert len(rec.graphs) == 3 and cf.eager_calls == 0
    assert [n.name for n in rec.graphs[-1].graph.nodes if n.op == "placeholder"] == ["pos", "stride", "shift"]


def test_a_symbolic_int_argument_runs_through_kilns_own_backend():
    kiln.reset()
    cf = kiln.compile(_shifted_positions, fullgraph=True)
    pos = torch.arange(6.0)
    for stride in (2, 3, 7):
        torch.testing.assert_close(cf(pos, stride, 3), _shifted_positions(pos, stride, 3))
    assert len(cf.entries) == 2


class _Scaled(torch.nn.Module):
    def forward(self, x, n, *, k=1):
        return x * n + k


def test_ints_passed_to_a_compiled_module_become_symbolic_too():
    """A compiled module's frame takes its arguments as *args / **kwargs: their int items that
    change are symbolic inputs as a function's int parameters are."""
    kiln.reset()
    rec = Recorder()
    model = _Scaled()
    cf = kiln.compile(model, backend=rec, fullgraph=True)
    x = torch.randn(3)
    for n in range(2, 14):
        torch.testing.assert_close(cf(x, n, k=n + 1), model(x, n, k=n + 1))
    assert len(rec.graphs) == 2
