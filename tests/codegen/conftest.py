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
