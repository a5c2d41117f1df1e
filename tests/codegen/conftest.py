"""Helpers for the code generator's tests: prim graphs of small functions, via aot and prims."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

# Tests share one kernel cache per session, so a library compiled once serves every test.
os.environ.setdefault("KILN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "kiln_test_cache"))


def prim_graphs(fn, *inputs):
    """(forward, backward) prim-level graphs of `fn` with their example inputs, as kiln's backend
    would receive them from aot (backward is None when nothing requires grad)."""
    from kiln.aot import aot_compile
    from kiln.prims import decompositions_for

    gm = torch.fx.symbolic_trace(fn)
    captured = {"fw": None, "bw": None}

    def keep(name):
        def compiler(g, examples):
            captured[name] = (g, examples)
            return g.forward
        return compiler
    aot_compile(gm, list(inputs), fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                decompositions=decompositions_for(set()))
    return captured["fw"], captured["bw"]


@pytest.fixture
def graphs():
    return prim_graphs


@pytest.fixture
def any_size(monkeypatch):
    """The default GEMV rule ([Note: GEMV by default]) for products of any size (the rows rule
    kept), so that small shapes take the GEMV form."""
    from kiln.codegen.triton import heuristics
    monkeypatch.setattr(heuristics, "GEMV_MIN_WEIGHT_BYTES", 0)
    monkeypatch.setattr(heuristics, "GEMV_MIN_COLUMN_BLOCKS", 1)


def compare_with_eager(fn, got, inputs, dtype):
    """`got` (a tensor or a tuple) against eager's `fn(*inputs)`: float32 closely (sums over K in
    another order than eager's), half types by the benchmark's rule (RMSE against a float64 run at
    most 3x eager's)."""
    from kiln.bench.accuracy import same
    want = fn(*inputs)
    want, got = (want,) if isinstance(want, torch.Tensor) else want, (got,) if isinstance(got, torch.Tensor) else got
    if dtype == torch.float32:
        torch.testing.assert_close(tuple(got), tuple(want), rtol=1e-5, atol=1e-5)
        return
    reference = fn(*(x.double() for x in inputs))
    reference = (reference,) if isinstance(reference, torch.Tensor) else reference
    for w, g, r in zip(want, got, reference):
        assert g.dtype == w.dtype
        verdict = same(w, g, r, tol=1e-2)
        assert verdict.ok, verdict.detail


class Counting:
    """A backend that compiles with kiln and keeps what it returned (one per captured graph)."""

    def __init__(self):
        self.compiled = []

    def __call__(self, gm, example_inputs):
        from kiln import backends
        fn = backends.kiln(gm, example_inputs)
        self.compiled.append(fn)
        return fn

    def programs(self) -> int:
        return sum(len(getattr(fn, "programs", {})) for fn in self.compiled)


class FakeTimer:
    """Runs each trial once (the candidate really builds and launches) and answers its time by
    label: `times` (label -> ms), else `default`. `calls` lists the labels timed, in order."""

    def __init__(self, times: dict, default: float = 10.0, fail: tuple = ()):
        self.times, self.default, self.fail, self.calls = times, default, fail, []

    def __call__(self, trial) -> float:
        self.calls.append(trial.label)
        if trial.label in self.fail:
            raise RuntimeError("out of resources: shared memory")
        trial()
        return self.times.get(trial.label, self.default)


def no_timing(trial):
    """A timer for compiles whose choices are cached: timing anything fails."""
    raise AssertionError(f"{trial.label} timed although its product's choice is cached")


def compile_traced(fn, inputs, folder, **compile_kwargs):
    """`kiln.compile(fn, **compile_kwargs)(*inputs)` from a fresh start (`kiln.reset()`), without
    grad, with its event log written to `folder` (a Path): the result, and max-autotune's decisions
    in the log's schedules ([Note: matmul autotuning])."""
    import json

    import kiln
    from kiln import trace
    kiln.reset()
    trace.configure(folder=str(folder), log="")
    try:
        with torch.no_grad():
            got = kiln.compile(fn, **compile_kwargs)(*inputs)
    finally:
        trace.configure(folder="", log="")
    with open(folder / trace.TRACE_FILE) as f:
        decisions = [d for e in map(json.loads, f) if e["kind"] == "schedule" for d in e.get("matmuls", [])]
    return got, decisions
