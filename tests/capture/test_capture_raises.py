"""Code that raises under capture: the frame runs eagerly, or (fullgraph=True) an error.

"No compiled program raises an exception that eager does not", and fullgraph=True never returns
without its graph: a frame from which an exception escapes as traced runs eagerly (Python raises
eager's own exception, or none), and under fullgraph it is an `Unsupported` error naming the
user's line and the exception.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import kiln
import kiln.capture
from capture_support import Recorder, assert_same
from kiln.errors import Unsupported


def _lookup(d, key):
    return d[key]


def raises_in_helper(x, key):
    y = x * 2
    return y + _lookup({"a": y}, key)


def test_fullgraph_names_the_line_that_raises():
    kiln.reset()
    cf = kiln.compile(raises_in_helper, backend=Recorder(), fullgraph=True)
    with pytest.raises(Unsupported) as info:
        cf(torch.randn(3), "b")
    assert "KeyError: b" in info.value.reason
    assert info.value.where and f":{_lookup.__code__.co_firstlineno + 1} in _lookup" in info.value.where


def test_an_exception_eager_raises_runs_the_frame_eagerly():
    kiln.reset()
    rec = Recorder()
    cf = kiln.compile(raises_in_helper, backend=rec)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(KeyError):
            cf(x, "b")
        assert_same(cf(x, "a"), raises_in_helper(x, "a"))


def _blocks(mask):
    return mask.reshape(mask.shape[0], -1, 2)


def mask_only_eager_makes(x, mask=None):
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones_like(x)  # LongT5: skipped when compiling, so the traced code raises
    y = x * 2
    return _blocks(mask) * y.reshape(2, -1, 2)


def test_a_frame_that_raises_only_as_traced_runs_eagerly():
    """[Note: an exception escapes the frame]: not a break after a prefix traced with
    is_compiling() True, which would hand the rest of the frame a None mask."""
    kiln.reset()
    cf = kiln.compile(mask_only_eager_makes, backend=Recorder())
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            assert_same(cf(x), mask_only_eager_makes(x))


class _Namespace:
    """Answers every attribute, as `torch.ops` and its namespaces do (creating what it is asked for)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            value = _Namespace()
            setattr(self, name, value)
            return value
        raise AttributeError(name)

    def double(self, x):
        return x * 2


_NS = _Namespace()


def calls_through_permissive_namespace(x):
    return _NS.double(x) + torch.ops.aten.mul(x, 3)


def test_objects_answering_every_attribute_are_not_taken_for_compiled_functions():
    """kiln marks its wrappers with `__kiln_original__`; asking an object with a permissive
    `__getattr__` for it must not create (and then inline) a namespace of that name."""
    kiln.reset()
    rec = Recorder()
    cf = kiln.compile(calls_through_permissive_namespace, backend=rec, fullgraph=True)
    x = torch.randn(3)
    assert_same(cf(x), calls_through_permissive_namespace(x))
    assert len(rec.graphs) == 1
    assert "__kiln_original__" not in vars(_NS) and "__kiln_original__" not in vars(torch.ops)


def test_autograd_function_with_grad_keeps_its_own_backward():
    """With autograd, `apply` runs eagerly (a graph break) so the Function's backward, which is not
    its forward's derivative here, computes the grads; without it, forward is inlined (one graph)."""
    import capture_corpus_real_code as real

    def fn(x):
        return real._Clamp.apply(x * 2, 0.1).sum()

    kiln.reset()
    rec = Recorder()
    cf = kiln.compile(fn, backend=rec)
    x = torch.randn(5, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf(x).backward()
    compiled_grad, x.grad = x.grad, None
    fn(x).backward()
    assert_same(compiled_grad, x.grad)
    with torch.no_grad():
        assert_same(cf(x), fn(x))


def test_fullgraph_past_the_cache_size_limit_raises_instead_of_running_eagerly():
    def scaled(x, n):
        return x * n

    kiln.reset()
    rec = Recorder()
    from kiln.config import CaptureConfig
    # dynamic=False: an int that changes stays a constant ([Note: ints that change])
    cf = kiln.capture.capture(scaled, rec, CaptureConfig(fullgraph=True, cache_size_limit=2, dynamic=False))
    x = torch.randn(3)
    assert_same(cf(x, 1), scaled(x, 1))
    assert_same(cf(x, 2), scaled(x, 2))
    with pytest.raises(Unsupported, match=r"cache_size_limit.*n == 2"):
        cf(x, 3)
    assert len(rec.graphs) == 2


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, mask):
        return torch.relu(self.linear(x)) * mask


class _MaskedStack(torch.nn.Module):
    """LongT5's and SwitchTransformers' stacks: the mask is made only when not compiling, then read."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, x, mask=None):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones_like(x)
        mask = mask[:, None]
        for block in self.blocks:
            x = block(x, mask[:, 0])
        return self.norm(x)


def test_a_module_frame_run_eagerly_still_captures_the_modules_it_calls():
    """[Note: a frame run eagerly captures its callees]: as torch.compile skips the frame that
    raises and compiles the frames it calls, the blocks of the stack are captured (one graph each
    module instance, reused on the second call), and nothing is left in their `__dict__`."""
    kiln.reset()
    rec = Recorder()
    model = _MaskedStack()
    cf = kiln.compile(model, backend=rec)
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            assert_same(cf(x), model(x))
    assert len(rec.graphs) == 2
    assert all("forward" not in vars(m) for m in model.modules())


class _AsksForwardSignature(_MaskedStack):
    def forward(self, x, mask=None):
        out = super().forward(x, mask)
        import inspect
        return out, list(inspect.signature(self.blocks[0].forward).parameters)


def test_a_redirected_forward_keeps_its_signature():
    """Code run in such a frame may ask for a callee's `forward` parameters (transformers does):
    the redirected forward answers with the module's own."""
    kiln.reset()
    model = _AsksForwardSignature()
    cf = kiln.compile(model, backend=Recorder())
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(cf(x), model(x))
