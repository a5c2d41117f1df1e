"""Context managers across graph breaks, as test_ctx_manager.py of the Dynamo suite (issue #39)
exercises them: each program runs under torch.compile (a recording backend, so graphs are
counted) and under kiln's capture; both must give eager's values, and kiln as many graphs as
torch.compile where the count is the point of the case."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch._dynamo  # graph_break and the reference compiler; tests may use torch's compiler

import kiln
import kiln.errors
import kiln.capture
from capture_support import Recorder, assert_same
from kiln.config import CaptureConfig


def both(fn, *calls, **config):
    """Run `fn` on each argument tuple of `calls` under torch.compile and under kiln, checking every
    output against eager; returns the two recorders (torch's, kiln's)."""
    torch._dynamo.reset()
    kiln.reset()
    theirs, ours = Recorder(), Recorder()
    compiled_t = torch.compile(fn, backend=theirs, **config)
    compiled_k = kiln.capture.capture(fn, ours, CaptureConfig(**config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in calls:
            expected = fn(*args)
            assert_same(compiled_t(*args), expected)
            assert_same(compiled_k(*args), expected)
    return theirs, ours


def nested_grad_modes_broken_in_both(x):
    before = torch.is_grad_enabled()
    with torch.set_grad_enabled(False):
        torch._dynamo.graph_break()
        with torch.set_grad_enabled(True):
            x = torch.mul(x, 5)
            torch._dynamo.graph_break()
            x = torch.sqrt(x)
            assert torch.is_grad_enabled()
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled() == before
    return x


def test_resume_inside_two_with_blocks():
    # the resume function jumps into two nested `with` blocks: its code object must assemble
    # (the handlers keep their depths) and the grad modes must be eager's after each break
    x = torch.rand(3, 4)
    theirs, ours = both(nested_grad_modes_broken_in_both, (x,), (x,), (x,))
    assert torch.is_grad_enabled()
    assert len(ours.graphs) == len(theirs.graphs) == 2


def grad_mode_only_before_break(x):
    with torch.no_grad():
        torch._dynamo.graph_break()
        y = x * 2
    return y + 1


def test_graph_of_grad_mode_switches_alone_is_not_compiled():
    x = torch.rand(3, requires_grad=True)
    theirs, ours = both(grad_mode_only_before_break, (x,))
    assert len(ours.graphs) == len(theirs.graphs)


def sdpa_kernel_math(x):
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(x, x, x)
        backends = torch.nn.attention._cur_sdpa_kernel_backends()
    return out * 2, backends


def test_pybind_enum_argument_is_a_graph_attribute():
    # _sdpa_kernel([SDPBackend.MATH], ...) becomes a node; FX prints a pybind enum as
    # `<SDPBackend.MATH: 0>`, so the constant must reach the graph's code as an attribute
    x = torch.rand(2, 2, 3, 4)
    expected = sdpa_kernel_math(x)
    before = torch.nn.attention._cur_sdpa_kernel_backends()
    for backend in ("eager", "kiln"):
        kiln.reset()
        got = kiln.compile(sdpa_kernel_math, backend=backend, fullgraph=True)(x)
        assert_same(got, expected)
        assert torch.nn.attention._cur_sdpa_kernel_backends() == before


def profiled_with_break(x):
    y = x ** 2
    with torch.profiler.profile():
        y = y + 2
        with torch.profiler.record_function("my_function"):
            z = y ** 3
            z.tolist()  # graph break
            z = z + 1
    return z


def autograd_profiled_with_break(x):
    y = x ** 2
    with torch.autograd.profiler.profile():
        y = y + 2
        with torch.autograd.profiler.record_function("my_function"):
            z = y ** 3
            z.tolist()
            z = z + 1
    return z


def test_profiler_regions_are_empty_contexts():
    # the profilers are empty contexts in a compiled region (as in Dynamo): the graph breaks at
    # tolist(), not at the profiler's construction
    x = torch.rand(2, 2, requires_grad=True)
    for fn in (profiled_with_break, autograd_profiled_with_break):
        theirs, ours = both(fn, (x,))
        assert len(ours.graphs) == len(theirs.graphs) == 2


class SetsGradOnEnter:
    def __init__(self, mode):
        self.prev = torch.is_grad_enabled()
        self.mode = mode

    def __enter__(self):
        torch._C._set_grad_enabled(self.mode)

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)


def user_grad_context(x):
    with SetsGradOnEnter(True):
        x = x + 1
        if torch.is_grad_enabled():
            x = x * 2
        x = torch.relu(x)
    return x - 1


def empty_no_grad_block(x):
    with torch.no_grad():
        pass
    return x + 1


def op_count(recorder):
    return sum(n.op.startswith("call") for g in recorder.graphs for n in g.graph.nodes)


def test_grad_switch_ops_counted_as_dynamo():
    # torch._C._set_grad_enabled called directly is a node even when the mode already holds;
    # a switch and its undo with nothing between are erased (both as Dynamo does)
    x = torch.rand(2, 3)
    for mode in (torch.no_grad, torch.enable_grad):
        for fn in (user_grad_context, empty_no_grad_block):
            with mode():
                theirs, ours = both(fn, (x,))
            assert op_count(ours) == op_count(theirs)
            assert len(ours.graphs) == len(theirs.graphs) == 1


def reads_default_dtype(x):
    if torch.get_default_dtype() == torch.float64:
        return x + 1, torch.ones(2)
    return x - 1, torch.tensor([1.5, 2.0])


def test_default_dtype_is_guarded():
    # the default dtype is folded where read and followed by creation ops: an entry traced under
    # float32 must not serve a call under float64
    x = torch.ones(2)
    for backend in ("eager", "kiln"):
        kiln.reset()
        compiled = kiln.compile(reads_default_dtype, backend=backend)
        assert_same(compiled(x), reads_default_dtype(x))
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            assert_same(compiled(x), reads_default_dtype(x))
        finally:
            torch.set_default_dtype(before)
        assert_same(compiled(x), reads_default_dtype(x))


def test_refusal_is_a_runtime_error_as_torch_compiles_is():
    # torch.compile's Unsupported derives from RuntimeError; kiln's refusal under fullgraph too
    def raises_uncaught_in_generator(t):
        def gen():
            try:
                yield t.sin()
            finally:
                pass
        g = gen()
        a = next(g)
        return a + g.throw(RuntimeError)

    t = torch.rand(2)
    kiln.reset()
    with pytest.raises(RuntimeError):
        kiln.compile(raises_uncaught_in_generator, backend="eager", fullgraph=True)(t)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError):
        torch.compile(raises_uncaught_in_generator, backend="eager", fullgraph=True)(t)
    assert issubclass(kiln.errors.Unsupported, RuntimeError)


def _throw_then_collect(log):
    def whoo(t):
        log.append(1)
        try:
            yield t.sin()
        except ValueError:
            log.append(10)
            yield t.cos()
        except RuntimeError:
            log.append(100)
            yield t.tan()
        finally:
            log.append(1000)   # runs when the frame's return drops the generator

    def fn(t):
        gen = whoo(t)
        a = next(gen)
        b = gen.throw(RuntimeError)
        log.append("returning")
        return a + b
    return fn


def test_generator_paused_in_finally_is_closed_at_return():
    # [Note: generators collected at return] the generator dies with fn's locals: its `finally`
    # runs after the return value is made, before the caller goes on, in one graph
    t = torch.rand(2)
    expected_log = []
    expected = _throw_then_collect(expected_log)(t)
    for backend in ("eager", "kiln"):
        kiln.reset()
        log = []
        got = kiln.compile(_throw_then_collect(log), backend=backend, fullgraph=True)(t)
        assert_same(got, expected)
        assert log == expected_log == [1, 100, "returning", 1000]


def test_generator_that_escapes_is_not_closed():
    def whoo(log):
        try:
            yield 1
        finally:
            log.append("closed")

    def fn(t, log):
        gen = whoo(log)
        next(gen)
        return t + 1, gen

    t = torch.rand(2)
    kiln.reset()
    log = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, gen = kiln.compile(fn, backend="eager")(t, log)
    assert_same(out, t + 1)
    assert log == []          # still paused: the caller holds it
    gen.close()
    assert log == ["closed"]


def test_returned_unstarted_generator_is_made_again_after_the_graph():
    # a generator made in captured code and never stepped leaves the graph as the same call again:
    # its body runs only when the caller iterates it (an in-place op included)
    def whoo(t, *rest, scale=1, **extra):
        yield t.add_(1) * scale
        yield t + rest[0] + extra["k"]

    def fn(t):
        return (whoo(t, 10, scale=2, k=100), whoo(t + 1, 5, k=0)), t.sin()

    for backend in ("eager", "kiln"):
        kiln.reset()
        t_eager, t_kiln = torch.zeros(2), torch.zeros(2)
        (g1, g2), s = fn(t_eager)
        (h1, h2), u = kiln.compile(fn, backend=backend, fullgraph=True)(t_kiln)
        assert_same(u, s)
        assert_same(t_kiln, t_eager)        # nothing ran yet: t untouched in both
        assert_same(list(h1), list(g1))
        assert_same(list(h2), list(g2))
        assert_same(t_kiln, t_eager)


def test_paused_generator_returned_is_drained_when_pure():
    # [Note: drained generators] a generator returned part-way (and a zip over one) gives the caller
    # its remaining items and its return value; one whose remaining items have effects of their
    # own makes the function run eagerly instead (the effects happen when the caller asks)
    def sub(t):
        yield t + 1
        yield t + 2
        return "sub done"

    def main(t):
        got = yield from sub(t)
        yield t + 3
        return got

    def fn(t):
        gen = main(t)
        first = next(gen)
        return gen, zip(range(2), main(t * 2)), first

    def consume(out):
        gen, z, first = out
        items = []
        while True:
            try:
                items.append(next(gen))
            except StopIteration as stop:
                return first, items, stop.value, list(z)

    t = torch.rand(2)
    expected = consume(fn(t))
    for backend in ("eager", "kiln"):
        kiln.reset()
        assert_same(consume(kiln.compile(fn, backend=backend, fullgraph=True)(t)), expected)

    log = []

    def noisy(t):
        yield t + 1
        log.append("second")
        yield t + 2

    def returns_noisy(t):
        gen = noisy(t)
        next(gen)
        return gen

    kiln.reset()
    with pytest.raises(kiln.errors.Unsupported, match="effects of its own"):
        kiln.compile(returns_noisy, backend="eager", fullgraph=True)(t)
    assert log == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = kiln.compile(returns_noisy, backend="eager")(t)
    assert log == []
    assert_same(list(gen), [t + 2])
    assert log == ["second"]


def test_generator_held_by_an_inlined_callee_is_closed_when_it_returns():
    # [Note: generators collected at return] in a callee kiln inlines too: the cleanup runs when
    # the callee returns, before the caller goes on
    def run(log):
        def gen():
            try:
                yield 1
            finally:
                log.append("closed")
        g = gen()
        next(g)
        log.append("returning")
        return len(log)

    def fn(x, log):
        n = run(log)
        log.append("after")
        return x + n

    expected_log = []
    expected = fn(torch.ones(2), expected_log)
    for backend in ("eager", "kiln"):
        kiln.reset()
        log = []
        assert_same(kiln.compile(fn, backend=backend, fullgraph=True)(torch.ones(2), log), expected)
        assert log == expected_log == ["returning", "closed", "after"]


# -- a `with` block resumed after a graph break, its body raising ------------------------------------
class _Logging:
    def __init__(self, log, suppress):
        self.log, self.suppress = log, suppress

    def __enter__(self):
        self.log.append("enter")
        return 2

    def __exit__(self, typ, value, tb):
        self.log.append(("exit", typ))
        return self.suppress


def _raises_in_resumed_with(x, log, fail, suppress):
    y = x.sin()
    with _Logging(log, suppress) as z:
        y = y + z
        torch._dynamo.graph_break()
        if fail:
            raise ValueError("boom")
        y = y * 2
    return y.cos()


@contextlib.contextmanager
def _logging_cm(x, log):
    log.append("enter")
    try:
        yield x + 1
    except ValueError as e:
        log.append(f"caught {e}")
    finally:
        log.append("exit")


def _break_inside_contextmanager(x, log, fail):
    y = x.sin()
    with _logging_cm(x, log) as z:
        y = y + z
        torch._dynamo.graph_break()
        if fail:
            raise ValueError("boom")
        y = y * 2
    return y.cos(), torch.is_grad_enabled()


def _run_twice(fn, *args):
    """Eager and kiln on fresh logs: (eager's result and log, kiln's result and log, kiln's recorder)."""
    kiln.reset()
    rec = Recorder()
    expected_log, got_log = [], []
    try:
        expected = fn(torch.ones(3), expected_log, *args)
    except Exception as e:
        expected = type(e)
    compiled = kiln.capture.capture(fn, rec, CaptureConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = compiled(torch.ones(3), got_log, *args)
        except Exception as e:
            got = type(e)
    return (expected, expected_log), (got, got_log), rec


@pytest.mark.parametrize("fail,suppress", [(False, False), (True, True), (True, False)])
def test_exception_in_a_with_block_resumed_after_a_break(fail, suppress):
    # the resume function's exception table keeps the with block's handler depth: the body's
    # exception reaches __exit__ (this crashed the interpreter when the depths were recomputed)
    (expected, expected_log), (got, got_log), _ = _run_twice(_raises_in_resumed_with, fail, suppress)
    if isinstance(expected, type):
        assert got is expected
    else:
        assert_same(got, expected)
    assert got_log == expected_log


@pytest.mark.parametrize("fail", [False, True])
def test_graph_break_inside_a_contextmanager_block_compiles_around_it(fail):
    # [Note: a paused generator started natively] the manager's generator starts natively at the
    # `with`; graphs before and inside the block, not the whole function eagerly
    (expected, expected_log), (got, got_log), rec = _run_twice(_break_inside_contextmanager, fail)
    assert_same(got, expected)
    assert got_log == expected_log
    assert len(rec.graphs) >= 2


def _sdpa_math_with_break(x):
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        a = torch.nn.functional.scaled_dot_product_attention(x, x, x)
        torch._dynamo.graph_break()
        b = torch.nn.functional.scaled_dot_product_attention(x, x, x) * 2
    return a + b


def test_sdpa_kernel_block_with_a_break_is_compiled():
    x = torch.randn(2, 2, 3, 4)
    before = torch.nn.attention._cur_sdpa_kernel_backends()
    theirs, ours = both(_sdpa_math_with_break, (x,))
    assert torch.nn.attention._cur_sdpa_kernel_backends() == before
    assert len(ours.graphs) >= 2


def _steps(x, log):
    try:
        yield x.sin()
        yield x.cos()
    finally:
        log.append("closed")


def _next_started_natively(x, log):
    it = _steps(x, log)
    a = next(it)
    torch._dynamo.graph_break()
    return a + next(it), list(log)


def test_generator_stepped_by_next_across_a_break_still_runs_eagerly():
    # its `finally` runs when Python collects it: only a `with` statement starts one natively
    (expected, expected_log), (got, got_log), rec = _run_twice(_next_started_natively)
    assert_same(got, expected)
    assert got_log == expected_log == ["closed"]
    assert rec.graphs == []


# -- zero-argument super() in a method resumed after a graph break ------------------------------------
class _Base:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("base enter")
        return 3

    def __exit__(self, *exc):
        self.log.append("base exit")

    def scale(self, x):
        return x * 2


class _BreaksThenSuper(_Base):
    def __enter__(self):
        torch._dynamo.graph_break()
        return super().__enter__()

    def scale(self, x):
        y = x + 1
        torch._dynamo.graph_break()
        return super().scale(y) + 1   # super() reads `self` from the resume function's first slot


def _super_after_break(x, log):
    with _BreaksThenSuper(log) as k:
        y = x * k
    return _BreaksThenSuper(log).scale(y)


def test_zero_argument_super_in_a_method_resumed_after_a_break():
    (expected, expected_log), (got, got_log), rec = _run_twice(_super_after_break)
    assert_same(got, expected)
    assert got_log == expected_log
