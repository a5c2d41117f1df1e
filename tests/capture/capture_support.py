"""Shared helpers for capture tests: a graph-recording backend and comparison with eager."""
from __future__ import annotations

import collections
import copy
import warnings

import pytest
import torch

import kiln
import kiln.capture
from kiln.config import CaptureConfig


class Recorder:
    """A backend that records each graph it is handed and runs it as FX Python."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def eager_torch_kiln(fn, *args, **config):
    """`fn(*args)` eagerly, under torch.compile and under kiln's capture, each with a Recorder:
    (eager's result, torch.compile's, kiln's, torch's recorder, kiln's recorder)."""
    import torch._dynamo  # the reference compiler; tests may use torch's compiler
    torch._dynamo.reset()
    kiln.reset()
    theirs, ours = Recorder(), Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(*args)
        got_t = torch.compile(fn, backend=theirs, **config)(*args)
        got_k = kiln.capture.capture(fn, ours, CaptureConfig(**config))(*args)
    return expected, got_t, got_k, theirs, ours


def assert_same(actual, expected, path="output"):
    """Equal structure and values; tensors by allclose (dtype and shape included)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif type(expected).__module__ == "numpy" and hasattr(expected, "dtype"):  # arrays and NumPy scalars
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} vs {type(expected).__name__}"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
            f"{path}: {actual.dtype}{actual.shape} vs {expected.dtype}{expected.shape}"
        torch.testing.assert_close(torch.as_tensor(actual), torch.as_tensor(expected), equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple, collections.deque)):
        if isinstance(expected, collections.deque):
            assert getattr(actual, "maxlen", "?") == expected.maxlen, f"{path}: maxlen differs"
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} vs {type(expected).__name__}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} vs {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), f"{path}: keys differ"
        assert getattr(actual, "default_factory", None) == getattr(expected, "default_factory", None), \
            f"{path}: default_factory differs"
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (set, frozenset)):
        assert type(actual) is type(expected) and list(actual) == list(expected), \
            f"{path}: {actual!r} != {expected!r} (members or iteration order)"
    elif hasattr(expected, "__dict__") and not isinstance(expected, type) and type(expected).__module__ != "builtins":
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} vs {type(expected).__name__}"
        assert_same(vars(actual), vars(expected), path)
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


@pytest.fixture(scope="module", autouse=True)
def quiet_transformers():
    """transformers' warnings off for a test module (autouse where imported)."""
    try:
        import transformers
    except ImportError:
        yield
        return
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)


def assert_train_step_equal(model, compiled, inputs: dict):
    """One training step through `compiled` and through `model`: the loss and every parameter's
    grad equal (the model's forward takes `inputs` as keywords and returns `.loss`)."""
    def step(fn):
        model.zero_grad(set_to_none=True)
        out = fn(**inputs)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_e, grads_e = step(model)
    loss_c, grads_c = step(compiled)
    assert_same(loss_c, loss_e)
    assert list(grads_c) == list(grads_e)
    for n in grads_e:
        torch.testing.assert_close(grads_c[n], grads_e[n], msg=lambda m: f"grad of {n}: {m}")


def run_compiled(fn, make_inputs, *, config=CaptureConfig(), seeds=(0, 1), calls=2):
    """Compile `fn`, call it `calls` times per input set, compare each call with eager. Returns the
    recorder: its graphs, and `events` (graph breaks, recompiles) in order."""
    from kiln.capture import frame
    kiln.capture.reset()
    recorder = Recorder()
    recorder.events = []
    compiled = kiln.capture.capture(fn, recorder, config)
    frame._EVENT_SINKS.append(recorder.events)
    try:
        _compare(fn, compiled, make_inputs, seeds, calls)
    finally:
        frame._EVENT_SINKS.remove(recorder.events)
    return recorder


def breaks_of(recorder) -> list:
    return [e for e in recorder.events if e.kind == "break"]


def _compare(fn, compiled, make_inputs, seeds, calls):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in seeds:
            inputs = make_inputs(seed)
            expected = fn(*copy.deepcopy(inputs))
            for _ in range(calls):
                actual = compiled(*copy.deepcopy(inputs))
                assert_same(actual, expected)

