"""Shared helpers of the aot tests: a backend that records what aot_compile built."""
import pytest

from kiln.aot import aot_compile, min_cut_partition


class RecordingAotEager:
    """The aot_eager backend, keeping each runtime so tests can check a graph really compiled."""

    def __init__(self, partition=min_cut_partition):
        self.partition = partition
        self.runtimes = []

    def __call__(self, gm, example_inputs):
        runtime = aot_compile(gm, example_inputs, fw_compiler=lambda g, _: g.forward,
                              bw_compiler=lambda g, _: g.forward, partition=self.partition)
        self.runtimes.append(runtime)
        return runtime


@pytest.fixture
def aot_backend_class():
    """The class itself, for tests that build several (a `from conftest import` would find
    whichever test folder's conftest was imported first)."""
    return RecordingAotEager


@pytest.fixture
def aot_backend():
    return RecordingAotEager()
