"""A count of nn.Module state writes, so state read through modules can be trusted until one.

[Note: counted module writes] A module's own state (its attributes, parameters, buffers and
submodules, its class) changes only through nn.Module's writing methods: `__setattr__` (attributes,
parameters, submodules, `training` through `train()`/`eval()`, `m.__class__ = ...`), `__delattr__`,
`register_parameter`, `register_buffer`, `add_module`/`register_module`, and `_apply` (`to()`,
`half()`, `cuda()`, which may put new Parameter objects in the tables). Once `count_module_writes`
has wrapped them, each call of one bumps `MODULE_WRITES[0]`, anywhere in the process. Whatever was
read of module state when the count stood at n is still what a read would give while it stands at
n: capture's settled guards ([Note: settled module state] in kiln/capture/settled.py) and aot's
parameter reads rely on it. Not counted: writes that bypass those methods (`m.__dict__['eps'] = ...`,
`object.__setattr__(m, ...)`, `m._parameters['w'] = p` by hand, as torch.func.functional_call's swap
does), and tensors changed in place (`p.data = t` keeps the Parameter object): their metadata is
counted apart, below.

[Note: module tensors' metadata] A compiled graph reads a module's parameters and buffers as
constants of their traced dtype, device, sizes and strides, so each is guarded on them (a
STATE_TENSOR guard): `m.weight.data = torch.randn(8, 4)` under the same Parameter object must
recompile, as it does under torch.compile. Checked every call, a decoder's ~400 such guards would
cost as much as all its other guards did before [Note: settled module state]. A tensor's metadata
changes in place only through a few writes: `t.data = u`, `t.set_(...)`, `t.resize_(...)`,
`t.resize_as_(...)` (nn.Module's `_apply` itself writes `param.data`). `count_tensor_writes` wraps
them on torch.Tensor so that each bumps `TENSOR_WRITES[0]`, and the guards on module tensors'
metadata run only when it moved. Not counted: the in-place view ops that restride a tensor
(`t_()`, `transpose_()`, `squeeze_()`, `unsqueeze_()`, `as_strided_()`: a parameter that requires
grad refuses them outside no_grad), TensorBase's methods called directly
(`torch._C.TensorBase.set_(t, u)`), and `torch.utils.swap_tensors`.
"""
from __future__ import annotations

import functools
import types

import torch

MODULE_WRITES = [0]
TENSOR_WRITES = [0]
_COUNTED = ("__setattr__", "__delattr__", "register_parameter", "register_buffer", "add_module",
            "register_module", "_apply")


def count_module_writes() -> None:
    """Wrap nn.Module's state-writing methods so that each call bumps MODULE_WRITES (once a process)."""
    module = torch.nn.Module
    for name in _COUNTED:
        method = module.__dict__[name]
        if not getattr(method, "__kiln_counted__", False):
            setattr(module, name, _counted(method, MODULE_WRITES))


def count_tensor_writes() -> None:
    """Wrap torch.Tensor's metadata writes so that each bumps TENSOR_WRITES (once a process)."""
    tensor = torch.Tensor
    if not isinstance(tensor.__dict__.get("data"), property):
        data = torch._C.TensorBase.data

        def set_data(self, value):
            data.__set__(self, value)
            if not torch.compiler.is_compiling():
                TENSOR_WRITES[0] += 1
        tensor.data = property(data.__get__, set_data, doc=data.__doc__)
    for name in ("set_", "resize_", "resize_as_"):
        method = getattr(tensor, name)
        if not getattr(method, "__kiln_counted__", False):
            setattr(tensor, name, _counted(method, TENSOR_WRITES))


def counts_writes(cls: type) -> bool:
    """Writes to instances of `cls` go through nn.Module's counted methods, reads through its own."""
    module = torch.nn.Module
    return (issubclass(cls, module) and getattr(cls.__setattr__, "__kiln_counted__", False)
            and cls.__setattr__ is module.__setattr__ and cls.__delattr__ is module.__delattr__
            and cls.__getattr__ is module.__getattr__ and cls.__getattribute__ is object.__getattribute__)


def _counted(method, count: list):
    def counted(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            # not while a compiler traces the write (it replays the write when the compiled code
            # runs, and a traced read of the count would be guarded on: torch.compile recompiled
            # transformers' LLaMA on every call, whose forward adds a module)
            if not torch.compiler.is_compiling():
                count[0] += 1
    # a code object of its own per method: tools that key nn.Module's methods by their code (Dynamo's
    # table of module methods it will not trace) tell them apart as they did before the wrap
    counted = types.FunctionType(counted.__code__.replace(co_name=method.__name__), counted.__globals__,
                                 method.__name__, None, counted.__closure__)
    functools.update_wrapper(counted, method)
    counted.__kiln_counted__ = True
    return counted
