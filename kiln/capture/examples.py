"""Example values: the tensor metadata capture propagates while it interprets, without real compute.

Each graph node carries an example value (`node.meta['example_value']`) so that capture can answer
`x.shape`, `x.dtype`, `x.device` and pick the next op's behaviour. Examples are meta tensors that
remember the device the real value would live on (meta kernels compute sizes, strides and dtypes;
nothing runs, nothing real is allocated or mutated). When `kiln.symbolic` offers its FakeTensorMode
(meta tensors that report the real device, with symbolic sizes), this module is the one place to
switch to it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

_DEVICE_ATTR = "_kiln_device"


def from_real(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s sizes, strides, dtype and requires_grad, remembering `t.device`."""
    meta = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")
    if t.requires_grad:
        meta.requires_grad_(True)
    setattr(meta, _DEVICE_ATTR, t.device)
    return meta


def device_of(example: torch.Tensor) -> torch.device:
    return getattr(example, _DEVICE_ATTR, torch.device("cpu"))


def _is_device(x) -> bool:
    return isinstance(x, torch.device) or (isinstance(x, str) and x.split(":")[0] in ("cpu", "cuda", "mps", "xpu"))


def run(fn: Callable, args: tuple, kwargs: dict, method_name: str | None = None) -> Any:
    """Run `fn` on example values; device arguments are redirected to meta and remembered."""
    target_device = None
    if "device" in kwargs and kwargs["device"] is not None:
        target_device = torch.device(kwargs["device"])
        kwargs = {**kwargs, "device": "meta"}
    if method_name in ("to", "cuda", "cpu", "type") or method_name is None:
        new_args = []
        for a in args:
            if _is_device(a):
                target_device = torch.device(a)
                a = "meta"
            new_args.append(a)
        args = tuple(new_args)
    if method_name == "cuda":
        target_device = torch.device("cuda")
        return _tag(fn(*args, **kwargs), target_device)
    if method_name == "cpu":
        target_device = torch.device("cpu")
        return _tag(fn(*args, **kwargs), target_device)
    if target_device is None:
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor):
                target_device = device_of(leaf)
                break
        else:
            target_device = torch.device("cpu")
            if "device" not in kwargs and method_name is None and _makes_tensor(fn):
                kwargs = {**kwargs, "device": "meta"}
    return _tag(fn(*args, **kwargs), target_device)


def _makes_tensor(fn) -> bool:
    # factory functions (torch.zeros, torch.arange, ...) would allocate real memory without this
    return getattr(fn, "__name__", "") in _FACTORIES


_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace", "eye",
              "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
              "randn_like", "tril_indices", "triu_indices", "logspace", "scalar_tensor"}


def _tag(result, device):
    for leaf in pytree.tree_leaves(result):
        if isinstance(leaf, torch.Tensor):
            if leaf.device.type != "meta":
                raise RuntimeError("an op produced a real tensor while capture interpreted it on examples")
            if not hasattr(leaf, _DEVICE_ATTR):
                setattr(leaf, _DEVICE_ATTR, device)
    return result
