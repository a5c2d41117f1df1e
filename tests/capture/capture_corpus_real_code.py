"""Patterns from real model code (transformers) that kiln once crashed on, broke the graph at, or
computed differently from eager: environment reads, numpy scalars, dict subclasses that build
what they hold, autograd.Functions under inference. Each is one graph, equal to eager."""
from __future__ import annotations

import collections
import contextlib
import functools
import os

import numpy as np
import torch

from capture_corpus import program


@program()
def environ_reads(x):
    """os.environ.get / os.getenv / `in os.environ`, for a variable that is not set (KeyError inside
    os.environ's Mapping.get is the program's own, caught there)."""
    flag = os.environ.get("KILN_TEST_UNSET_VARIABLE", "0")
    other = os.getenv("KILN_TEST_UNSET_VARIABLE")
    present = "KILN_TEST_UNSET_VARIABLE" in os.environ
    return x * (int(flag) + 1), other, present


_SCALE = np.sqrt(np.float64(32.0))  # CTRL scales its embeddings by np.sqrt(d_model)
_HALF = np.float32(0.5)


@program()
def numpy_scalar_scales_a_tensor(x):
    y = x * _SCALE
    y *= _HALF
    return y


class _Instantier(collections.OrderedDict):
    """transformers' ACT2FN: reading an item builds a module from the (class, kwargs) it holds."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


_ACTIVATIONS = _Instantier({"silu": torch.nn.SiLU, "leaky": (torch.nn.LeakyReLU, {"negative_slope": 0.2})})


@program()
def dict_subclass_getitem_builds_a_module(x):
    return _ACTIVATIONS["silu"](x) + _ACTIVATIONS["leaky"](x)


class _Clamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, low):
        ctx.save_for_backward(x)
        ctx.low = low
        return x.clamp(min=low)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > ctx.low), None


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


@program()
def autograd_function_without_grad(x):
    return _Clamp.apply(x, 0.1) + _Square.apply(x)


@torch.jit.script
def _scripted_bias(x, y: float):
    return x * y + 1.0


@program()
def torch_jit_script_function(x):
    """DeBERTa's helpers are torch.jit.script functions: their Python source is followed."""
    return _scripted_bias(x, 3.0).relu()


@program()
def tensor_type_new_and_python_sizes(x):
    """`Tensor.type()` names, `x.new(shape)`, `[0] * n` and min/max over sizes, as model code
    builds its buffers."""
    name = x.type()
    buf = x.new(x.shape[0], 2).fill_(1.0)
    counts = [0] * x.shape[1]
    counts[min(x.shape) - 1] += 1
    longest = max(x.shape[0], x.shape[1], *x.size())
    return name, buf.shape, counts, x.type(torch.float64) * longest, x.new_zeros(min(x.size()))



_ZERO_D = np.asarray(2.0)  # a 0-d array: `x * _ZERO_D` is numpy's product (float64), not torch's


@program(graphs=1, breaks=1)
def numpy_array_of_a_tensor_across_a_break(x):
    """`np.asarray(x.detach())` is traced into the graph as torch ops (numpy_calls.py; before that it
    broke the graph and the resume function, which computes with the array, named `array`); the
    product with a global 0-d array is numpy's (float64) and breaks."""
    y = np.asarray(x.detach())
    return torch.as_tensor(y) * y.shape[0] + x * _HALF, x * _ZERO_D


class _Cache(collections.UserDict):
    """A container whose item writes are Python methods (Gemma 4 keeps its per-layer state so)."""


@program()
def userdict_item_writes(x):
    cache = _Cache()
    cache["a"] = x * 2
    cache["b"] = x + 1
    del cache["b"]
    cache["c"] = cache["a"] - 1
    return cache["a"] + cache["c"], len(cache), "b" in cache


@program()
def python_types_as_dtypes(x):
    """transformers' chunked masks: `torch.zeros(n, dtype=int)`."""
    return torch.zeros(x.shape[0], dtype=int) + x.shape[1], x.to(float) * 2, torch.ones(2, dtype=bool)


@torch.compiler.assume_constant_result
def _installed_version(package):
    """transformers' install probes: importlib.metadata and `vars` inside, which capture does not
    follow; marked constant, so run while tracing."""
    import importlib.metadata
    return len(vars(importlib.metadata)) > 0 and importlib.metadata.version(package) != ""


@functools.lru_cache
@torch.compiler.assume_constant_result
def _cached_probe(flag=True):
    return _installed_version("torch") and flag


@program()
def assume_constant_result_functions(x):
    """A function marked by torch.compiler.assume_constant_result, and an lru_cache over one
    (transformers' is_torch_greater_or_equal, is_torch_distributed_available): their results are
    constants of the graph."""
    if _installed_version("torch") and _cached_probe(flag=True):
        return x + 1
    return x - 1


@program()
def generic_alias_annotations(x):
    """A nested function whose annotations subscript classes, evaluated at def time (torch's
    pytree helpers: `is_leaf: Callable[[PyTree], bool] | None`)."""
    import collections.abc

    def scale(v, by: list[int], check: collections.abc.Callable[[int], bool] | None = None) -> dict[str, int]:
        return v * sum(by)
    return scale(x, [1, 2]), tuple[int, ...]


@contextlib.contextmanager
def _scaled(factor):
    yield factor * 2


class _Scratch:
    kind = "class"


@program()
def delete_attributes_of_new_objects(x):
    """`del obj.attr` / delattr on objects made inside captured code: contextlib's generator
    context manager deletes its arguments on entry (Mamba's scan); a read after falls back to the
    class attribute, a second delete raises AttributeError."""
    with _scaled(3) as f:
        y = x * f
    s = _Scratch()
    s.kind = "instance"
    s.extra = 1
    del s.kind
    delattr(s, "extra")
    try:
        del s.extra
    except AttributeError:
        y = y + 1
    return y, s.kind, hasattr(s, "extra")


class _MappedConfig:
    """transformers' PreTrainedConfig: `__setattr__` and `__getattribute__` map names through
    `attribute_map` (`width` is `d_model`)."""
    attribute_map = {"width": "d_model"}

    def __init__(self, d_model):
        self.d_model = d_model
        self.depth = 2
        self._spec = "per-layer"

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


_GLOBAL_CONFIG = _MappedConfig(3)


@program()
def class_setattr_getattribute_hooks(x):
    """An object made in captured code whose class maps attribute names in `__setattr__` and
    `__getattribute__`: both run (kiln once stored `width` apart from `d_model`: a wrong result)."""
    c = _MappedConfig(4)
    c.width = 5
    return x * c.width + c.d_model + c.depth


@program()
def copy_of_a_program_object(x):
    """copy.copy of a config the program holds (NeoMME's per-layer config views): a new object
    with the same attributes, its own writes and deletions (through `__dict__`), the original's
    untouched."""
    import copy
    c = copy.copy(_GLOBAL_CONFIG)
    c.__dict__.pop("_spec", None)
    c.width = 7
    return x * c.width + _GLOBAL_CONFIG.width, getattr(c, "_spec", "gone"), _GLOBAL_CONFIG._spec


_VALIDATORS = {list: lambda v: isinstance(v, list), dict: lambda v: isinstance(v, dict), type(None): None}


@program()
def table_keyed_by_classes_and_exception_text(x):
    """A module's table keyed by classes (huggingface_hub's validators by type origin), read by
    `.get` and `in`; `str(e)` / `repr(e)` of a caught exception (a Union validator's messages)."""
    errors = []
    for value in ([1], {"a": 1}, 3):
        check = _VALIDATORS.get(type(value))
        try:
            if check is None or not check(value):
                raise TypeError(f"{type(value).__name__} is not valid")
        except TypeError as e:
            errors.append(str(e) + repr(e))
    return x * len(errors), "; ".join(errors), (int in _VALIDATORS)


@program()
def legacy_typed_tensor_constructors(x):
    """VITS's WaveNet: `torch.IntTensor([self.hidden_size])` in forward. The legacy typed
    constructor on data is torch.tensor with the class's dtype; torch.compile captures it."""
    channels = torch.IntTensor([3])
    weights = torch.FloatTensor((0.5, 2.0))
    return x * weights.sum() + channels, channels.dtype, torch.LongTensor([[1, 2]]).shape
