"""torch.compiler's controls honored as torch.compile honors them (kiln/capture/controls.py).

Each test runs the same program under torch.compile (backend: a recorder, so graphs are counted)
and under kiln's capture, and compares both with eager: the number of graphs, what is (and is not)
in them, and the errors under fullgraph=True.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo  # the controls live here; tests may use torch's compiler as the reference

import kiln
import kiln.capture
from capture_support import Recorder
from kiln.config import CaptureConfig
from kiln.errors import Unsupported


def both(fn, *calls, **config):
    """Run `fn` on each argument tuple of `calls` under torch.compile and under kiln: the recorders
    (torch's, kiln's) after checking every output against eager."""
    torch._dynamo.reset()
    theirs, ours = Recorder(), Recorder()
    compiled_t = torch.compile(fn, backend=theirs, **config)
    compiled_k = kiln.capture.capture(fn, ours, CaptureConfig(**config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in calls:
            expected = fn(*args)
            torch.testing.assert_close(compiled_t(*args), expected)
            torch.testing.assert_close(compiled_k(*args), expected)
    return theirs, ours


def ops(recorder) -> list[list[str]]:
    """Per graph, the names of the functions and methods it calls."""
    def name(n):
        return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    return [[name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method")] for gm in recorder.graphs]


# -- torch.compiler.disable ------------------------------------------------------------------------
def cosine(x):
    return x.cos()


@torch.compiler.disable
def disabled_helper(x):
    return cosine(x) + 1


def _tanh_then_cosine(x):
    return cosine(x.tanh())


shallow_helper = torch.compiler.disable(_tanh_then_cosine, recursive=False)


@torch._dynamo.disable
def dynamo_disabled(x):
    return x.exp()


def calls_disabled(x):
    y = x.sin()
    y = disabled_helper(y)
    return y * 2


def calls_shallow(x):
    return shallow_helper(x.sin()) * 2


def calls_dynamo_disabled(x):
    return dynamo_disabled(x.sin()) - 1


def calls_through_inlined(x):
    return _inlined(x.sin()).abs()


def _inlined(y):
    return disabled_helper(y * 3) + y


def test_disable_breaks_the_graph_around_the_call():
    theirs, ours = both(calls_disabled, (torch.randn(4),))
    assert ops(theirs) == [["sin"], ["mul"]]
    assert ops(ours) == ops(theirs)   # cos and + 1 ran eagerly: in no graph


def test_disable_of_torch_dynamo():
    theirs, ours = both(calls_dynamo_disabled, (torch.randn(4),))
    assert ops(ours) == ops(theirs) == [["sin"], ["sub"]]


def breaks_between(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y * 2


def test_graph_break_ends_the_graph_at_its_line():
    # a no-op when inlined: kiln made one graph where torch.compile makes two
    theirs, ours = both(breaks_between, (torch.randn(4),))
    assert ops(theirs) == [["sin"], ["mul"]]
    assert ops(ours) == ops(theirs)


def test_graph_break_under_fullgraph_names_the_line():
    with pytest.raises(Exception, match="graph_break"):
        kiln.compile(breaks_between, fullgraph=True)(torch.randn(4))


def test_disable_inside_an_inlined_function():
    theirs, ours = both(calls_through_inlined, (torch.randn(4),))
    flat = lambda r: sorted(op for g in ops(r) for op in g)  # noqa: E731
    assert "cos" not in flat(ours)
    assert flat(ours) == flat(theirs)


def test_disable_non_recursive_runs_the_function_eagerly():
    theirs, ours = both(calls_shallow, (torch.randn(4),))
    # shallow_helper's own frame runs eagerly and `cosine`, which it calls, is compiled, by both
    # ([Note: a graph break in a loop] in kiln/capture/eager_frames.py)
    assert ops(theirs) == [["sin"], ["cos"], ["mul"]]
    assert ops(ours) == ops(theirs)
    assert "tanh" not in sum(ops(theirs), []) and "tanh" not in sum(ops(ours), [])


def test_disable_under_fullgraph_names_the_line():
    x = torch.randn(4)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="disable"):
        torch.compile(calls_disabled, backend=Recorder(), fullgraph=True)(x)
    line = calls_disabled.__code__.co_firstlineno + 2
    with pytest.raises(Unsupported, match="torch.compiler.disable") as e:
        kiln.capture.capture(calls_disabled, Recorder(), CaptureConfig(fullgraph=True))(x)
    assert f"{__file__}:{line}" in str(e.value)


class WithDisabledMethod(torch.nn.Module):
    def forward(self, x):
        return self.log_stats(x.relu()) + 1

    @torch.compiler.disable
    def log_stats(self, x):
        return x * x.mean()


def test_disabled_method_of_a_module():
    m = WithDisabledMethod()
    theirs, ours = both(m, (torch.randn(3, 4),))
    assert ops(ours) == ops(theirs) == [["relu"], ["add"]]


class DisabledForward(torch.nn.Module):
    @torch.compiler.disable
    def forward(self, x):
        return x.cos() * 3


class CallsDisabledChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.child, self.linear = DisabledForward(), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.child(self.linear(x).relu()) + 1


def test_disabled_forward_of_a_child_module():
    theirs, ours = both(CallsDisabledChild(), (torch.randn(2, 4),))
    assert ops(ours) == ops(theirs) == [["linear", "relu"], ["add"]]


def test_compiling_a_disabled_function_compiles_what_it_wraps():
    theirs, ours = both(disabled_helper, (torch.randn(4),))
    assert ops(ours) == ops(theirs) == [["cos", "add"]]   # torch.compile unwraps the disable


# -- torch.compiler.set_stance ---------------------------------------------------------------------
def scaled(x):
    return x.sin() * 2


@pytest.fixture
def stance():
    yield torch.compiler.set_stance
    torch.compiler.set_stance("default")


def test_force_eager(stance):
    x = torch.randn(4)
    stance("force_eager")
    theirs, ours = both(scaled, (x,))
    assert theirs.graphs == [] and ours.graphs == []
    stance("default")
    compiled_k = kiln.capture.capture(scaled, ours, CaptureConfig())
    torch.testing.assert_close(compiled_k(x), scaled(x))
    assert len(ours.graphs) == 1          # the default stance compiles again


def test_force_eager_skips_cached_entries(stance):
    ours = Recorder()
    compiled = kiln.capture.capture(scaled, ours, CaptureConfig())
    compiled(torch.randn(4))
    with torch.compiler.set_stance("force_eager"):
        assert compiled.entries and compiled(torch.randn(5)).shape == (5,)
    assert len(ours.graphs) == 1 and len(compiled.entries) == 1


def test_eager_on_recompile(stance):
    torch._dynamo.reset()
    theirs, ours = Recorder(), Recorder()
    compiled_t = torch.compile(scaled, backend=theirs)
    compiled_k = kiln.capture.capture(scaled, ours, CaptureConfig())
    for compiled in (compiled_t, compiled_k):
        compiled(torch.randn(8))
    stance("eager_on_recompile")
    for compiled in (compiled_t, compiled_k):
        for n in (8, 11, 3):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), scaled(x))
    assert len(theirs.graphs) == len(ours.graphs) == 1


def test_fail_on_recompile(stance):
    torch._dynamo.reset()
    compiled_t = torch.compile(scaled, backend=Recorder())
    compiled_k = kiln.capture.capture(scaled, Recorder(), CaptureConfig())
    x = torch.randn(8)
    for compiled in (compiled_t, compiled_k):
        compiled(x)
    stance("fail_on_recompile")
    for compiled in (compiled_t, compiled_k):
        torch.testing.assert_close(compiled(x), scaled(x))   # a cached entry still runs
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            compiled(torch.randn(2, 3))


# -- mark_dynamic / maybe_mark_dynamic / mark_static -----------------------------------------------
def rows(x):
    return x.sum(0) * x.size(0)


@pytest.mark.parametrize("mark", [torch._dynamo.mark_dynamic, torch._dynamo.maybe_mark_dynamic])
def test_mark_dynamic_symbolic_from_the_first_compile(mark):
    a, b = torch.randn(8, 3), torch.randn(11, 3)
    mark(a, 0)
    theirs, ours = both(rows, (a,), (b,))
    assert len(theirs.graphs) == len(ours.graphs) == 1      # no recompile for size 11


def test_unmarked_recompiles():
    theirs, ours = both(rows, (torch.randn(8, 3),), (torch.randn(11, 3),))
    assert len(theirs.graphs) == len(ours.graphs) == 2      # the first compile specialized on 8


def test_mark_static_under_dynamic_true():
    a, b = torch.randn(8, 3), torch.randn(11, 3)
    torch._dynamo.mark_static(a, 0)
    torch._dynamo.mark_static(b, 0)
    theirs, ours = both(rows, (a,), (b,), dynamic=True)
    assert len(theirs.graphs) == len(ours.graphs) == 2      # dim 0 guarded on its exact size


# -- allow_in_graph, is_compiling ------------------------------------------------------------------
def opaque_scale(x):
    return x * 3 + x.cos()


torch.compiler.allow_in_graph(opaque_scale)


def calls_allowed(x):
    return opaque_scale(x.sin()) + 1


def test_allow_in_graph_is_one_node():
    theirs, ours = both(calls_allowed, (torch.randn(4),))
    assert ops(theirs) == ops(ours) == [["sin", "opaque_scale", "add"]]


def reports_compiling(x):
    return x + 1 if torch.compiler.is_compiling() and torch.compiler.is_dynamo_compiling() else x - 1


def test_is_compiling():
    torch._dynamo.reset()
    x = torch.zeros(2)
    expected = x + 1
    torch.testing.assert_close(torch.compile(reports_compiling, backend=Recorder())(x), expected)
    torch.testing.assert_close(kiln.capture.capture(reports_compiling, Recorder(), CaptureConfig())(x), expected)


# -- substitute_in_graph ---------------------------------------------------------------------------
def double_if_positive(x):
    if x.sum() > 0:         # a branch on tensor data: a graph break where traced
        return x * 2
    return x


@torch.compiler.substitute_in_graph(double_if_positive)
def _double_if_positive_traceable(x):
    return torch.where(x.sum() > 0, x * 2, x)


def calls_substituted(x):
    return double_if_positive(x.sin()) + 1


def test_substitute_in_graph_inlines_the_substitute():
    theirs, ours = both(calls_substituted, (torch.randn(4),), (-torch.ones(4),))
    assert ops(ours) == ops(theirs) == [["sin", "sum", "gt", "mul", "where", "add"]]


def test_mark_dynamic_under_dynamic_false():
    a, b = torch.randn(8, 3), torch.randn(11, 3)
    torch._dynamo.mark_dynamic(a, 0)
    theirs, ours = both(rows, (a,), (b,), dynamic=False)
    assert len(theirs.graphs) == len(ours.graphs) == 1      # the mark wins over dynamic=False


def eight_rows_doubled(x):
    return x * 2 if x.size(0) == 8 else x     # specializes dim 0 to 8


def test_mark_dynamic_then_specialized_is_an_error():
    torch._dynamo.reset()
    a = torch.randn(8, 3)
    torch._dynamo.mark_dynamic(a, 0)
    with pytest.raises(Exception, match="marked L\\['x'\\].size\\(\\)\\[0\\] as dynamic"):
        torch.compile(eight_rows_doubled, backend=Recorder())(a)
    line = eight_rows_doubled.__code__.co_firstlineno + 1
    with pytest.raises(Unsupported, match=f"x.size\\(\\)\\[0\\] == 8 at {__file__}:{line}"):
        kiln.capture.capture(eight_rows_doubled, Recorder(), CaptureConfig())(a)


def test_maybe_mark_dynamic_may_be_specialized():
    a = torch.randn(8, 3)
    torch._dynamo.maybe_mark_dynamic(a, 0)
    theirs, ours = both(eight_rows_doubled, (a,))
    assert len(theirs.graphs) == len(ours.graphs) == 1


def rows_then(x):
    return x.sum(0) * x.size(0)


def test_eager_then_compile(stance):
    torch._dynamo.reset()
    theirs, ours = Recorder(), Recorder()
    compiled_t = torch.compile(rows_then, backend=theirs)
    compiled_k = kiln.capture.capture(rows_then, ours, CaptureConfig())
    stance("eager_then_compile")
    counts = []
    for compiled, recorder in ((compiled_t, theirs), (compiled_k, ours)):
        counts.append([])
        for n in (8, 11, 5):   # eagerly, then one graph with dim 0 symbolic (it changed), reused
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), rows_then(x))
            counts[-1].append(len(recorder.graphs))
    assert counts[0] == counts[1] == [0, 1, 1]


def test_a_compile_leaves_the_users_own_frozen_objects_frozen():
    """kiln freezes the heap while it compiles ([Note: a compile does not rescan the heap]) but must
    not hand back to the collector what the program froze itself (a server before it forks)."""
    import gc
    kept = [object() for _ in range(10)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        kiln.reset()
        fn = kiln.compile(lambda x: x * 2 + 1)
        x = torch.randn(3)
        torch.testing.assert_close(fn(x), x * 2 + 1)
        # (a few frozen temporaries die meanwhile; an unfreeze would leave none)
        assert gc.get_freeze_count() > frozen // 2, "the program's frozen objects were unfrozen by a compile"
    finally:
        gc.unfreeze()
    assert kept
    kiln.reset()
    before = gc.get_freeze_count()
    kiln.compile(lambda x: x - 1)(torch.randn(2))
    assert gc.get_freeze_count() == before, "a compile left the heap frozen"
