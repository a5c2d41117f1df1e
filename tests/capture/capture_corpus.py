"""The capture corpus: small programs, each with its inputs and the graphs it should compile to.

A `Program` is run by `test_capture_corpus.py`: compiled with a recording backend, called twice on each
of two input sets (same shapes, different values), compared with eager on each, and its compiled
graph count checked (`graphs`; `breaks` counts graph breaks where one is intended). Programs are
registered by `@program(...)` or generated from tables of ops, so adding one is one entry.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import itertools
import math
import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    inputs: Callable[[int], tuple]
    graphs: int = 1
    breaks: int = 0


PROGRAMS: list[Program] = []


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + seed)


def t(*shape, dtype=torch.float32):
    """An input maker: one tensor of `shape`."""
    def make(seed):
        g = _gen(seed)
        if dtype.is_floating_point:
            return (torch.randn(*shape, generator=g, dtype=dtype),)
        return (torch.randint(-5, 6, shape, generator=g, dtype=dtype),)
    return make


def tt(*shape):
    def make(seed):
        g = _gen(seed)
        return (torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))
    return make


def with_args(make, *extra):
    return lambda seed: (*make(seed), *extra)


T = t(4, 5)
TT = tt(4, 5)


def program(inputs=T, graphs=1, breaks=0, name=None):
    def register(fn):
        PROGRAMS.append(Program(name or fn.__name__, fn, inputs, graphs, breaks))
        return fn
    return register


# -- tables of ops: one program per op ---------------------------------------------------------------
_BINARY = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.floordiv,
           operator.mod, operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne]
for _op in _BINARY:
    PROGRAMS.append(Program(f"binary_tt_{_op.__name__}", (lambda op: lambda x, y: op(x, y.abs() + 1))(_op), TT))
    PROGRAMS.append(Program(f"binary_ts_{_op.__name__}", (lambda op: lambda x: op(x, 3))(_op), T))
    PROGRAMS.append(Program(f"binary_st_{_op.__name__}", (lambda op: lambda x: op(2.5, x.abs() + 1))(_op), T))
for _op in [operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift]:
    PROGRAMS.append(Program(f"binary_int_{_op.__name__}", (lambda op: lambda x: op(x.abs(), 2))(_op),
                            t(3, 4, dtype=torch.int64)))
PROGRAMS.append(Program("binary_matmul", lambda x, y: x @ y.T, TT))
for _op in [operator.iadd, operator.isub, operator.imul, operator.itruediv]:
    def _inplace(x, op=_op):
        y = x.clone()
        y = op(y, 2)
        return y
    PROGRAMS.append(Program(f"inplace_{_op.__name__}", _inplace, T))

_UNARY_TORCH = ["abs", "neg", "exp", "log1p", "sin", "cos", "tanh", "sigmoid", "relu", "sqrt", "rsqrt", "floor",
                "ceil", "round", "sign", "erf", "exp2", "expm1", "reciprocal", "square", "trunc", "frac",
                "atan", "asinh", "sinh", "cosh", "deg2rad", "logical_not", "isnan", "isfinite"]
for _name in _UNARY_TORCH:
    _f = getattr(torch, _name)
    _pos = _name in ("sqrt", "rsqrt", "log1p", "reciprocal")
    PROGRAMS.append(Program(f"torch_{_name}", (lambda f, pos: lambda x: f(x.abs() + 0.5 if pos else x))(_f, _pos), T))
    PROGRAMS.append(Program(f"method_{_name}", (lambda n, pos: lambda x: getattr(x.abs() + 0.5 if pos else x, n)())(
        _name, _pos), T))

_FUNCTIONAL = [F.relu, F.gelu, F.silu, F.elu, F.leaky_relu, F.softplus, F.hardtanh, F.mish, F.hardswish,
               F.logsigmoid, F.tanhshrink, F.softsign, F.relu6, F.selu, F.celu]
for _f in _FUNCTIONAL:
    PROGRAMS.append(Program(f"F_{_f.__name__}", (lambda f: lambda x: f(x) * 2)(_f), T))
for _dim in (0, 1, -1):
    PROGRAMS.append(Program(f"F_softmax_{_dim}", (lambda d: lambda x: F.softmax(x, dim=d))(_dim), T))
    PROGRAMS.append(Program(f"F_log_softmax_{_dim}", (lambda d: lambda x: F.log_softmax(x, d))(_dim), T))

_REDUCTIONS = ["sum", "mean", "amax", "amin", "prod", "std", "var", "logsumexp", "norm", "argmax", "argmin",
               "any", "all", "max", "min"]
for _name in _REDUCTIONS:
    if _name in ("logsumexp",):
        PROGRAMS.append(Program(f"reduce_{_name}", (lambda n: lambda x: getattr(x, n)(1))(_name), T))
    elif _name in ("any", "all"):
        PROGRAMS.append(Program(f"reduce_{_name}", (lambda n: lambda x: getattr(x > 0, n)())(_name), T))
    elif _name in ("max", "min"):
        PROGRAMS.append(Program(f"reduce_{_name}_dim", (lambda n: lambda x: getattr(x, n)(dim=1))(_name), T))
        PROGRAMS.append(Program(f"reduce_{_name}_dim_values", (lambda n: lambda x: getattr(x, n)(1).values * 2)(_name), T))
        PROGRAMS.append(Program(f"reduce_{_name}_all", (lambda n: lambda x: getattr(x, n)())(_name), T))
    else:
        PROGRAMS.append(Program(f"reduce_{_name}", (lambda n: lambda x: getattr(x, n)())(_name), T))
        if _name not in ("argmax", "argmin", "norm", "prod"):
            PROGRAMS.append(Program(f"reduce_{_name}_dim_keepdim",
                                    (lambda n: lambda x: getattr(x, n)(dim=0, keepdim=True))(_name), T))

_SHAPE_OPS = {
    "view": lambda x: x.view(5, 4), "view_neg": lambda x: x.view(-1), "reshape": lambda x: x.reshape(2, 10),
    "transpose": lambda x: x.transpose(0, 1), "t": lambda x: x.t(), "T": lambda x: x.T, "permute": lambda x: x.permute(1, 0),
    "unsqueeze": lambda x: x.unsqueeze(1), "squeeze": lambda x: x.unsqueeze(0).squeeze(0), "flatten": lambda x: x.flatten(),
    "expand": lambda x: x[:, :1].expand(4, 5), "repeat": lambda x: x.repeat(2, 1), "contiguous": lambda x: x.t().contiguous(),
    "narrow": lambda x: x.narrow(1, 1, 2), "split": lambda x: x.split(2, dim=1)[1], "chunk": lambda x: x.chunk(2)[0],
    "unbind": lambda x: x.unbind(0)[2], "flip": lambda x: x.flip(0), "roll": lambda x: x.roll(1, 1),
    "cat": lambda x: torch.cat([x, x * 2], dim=0), "stack": lambda x: torch.stack([x, x + 1], dim=-1),
    "index_int": lambda x: x[1], "index_slice": lambda x: x[1:3, ::2], "index_none": lambda x: x[None, :, None],
    "index_ellipsis": lambda x: x[..., 1], "index_neg": lambda x: x[-1, -2:], "index_bool": lambda x: torch.where(x > 0, x, 0.0),
    "index_tensor": lambda x: x[torch.tensor([0, 2])], "masked_fill": lambda x: x.masked_fill(x < 0, 0.0),
    "tril": lambda x: torch.tril(x), "triu_k": lambda x: x.triu(1), "clamp": lambda x: x.clamp(-0.5, 0.5),
    "clamp_min": lambda x: x.clamp(min=0), "type_as": lambda x: x.type_as(torch.ones(1, dtype=torch.float64)),
    "to_dtype": lambda x: x.to(torch.float64), "float": lambda x: (x > 0).float(), "long": lambda x: (x * 3).long(),
    "new_zeros": lambda x: x.new_zeros(3) + 1, "zeros_like": lambda x: torch.zeros_like(x) + x,
    "ones": lambda x: torch.ones(4, 5) + x, "arange": lambda x: torch.arange(5) * x, "full": lambda x: torch.full((4, 5), 2.0) * x,
    "eye": lambda x: torch.eye(5) @ x.T, "einsum": lambda x: torch.einsum("ij,kj->ik", x, x),
    "bmm": lambda x: torch.bmm(x.unsqueeze(0), x.T.unsqueeze(0)), "outer": lambda x: torch.outer(x[0], x[1]),
    "cumsum": lambda x: x.cumsum(1), "sort": lambda x: x.sort(1).values, "topk": lambda x: x.topk(2).indices,
    "gather": lambda x: x.gather(1, torch.tensor([[0], [1], [2], [3]])), "where3": lambda x: torch.where(x > 0, x, -x),
    "baddbmm": lambda x: torch.addmm(x[:, :4], x, x.T[:, :4] if False else x[:4].T), "diag": lambda x: torch.diag(x[:, :4]),
    "setitem": lambda x: _setitem(x), "index_put": lambda x: _index_put(x),
    "linear": lambda x: F.linear(x, torch.ones(3, 5)), "layer_norm": lambda x: F.layer_norm(x, (5,)),
    "dropout_eval": lambda x: F.dropout(x, 0.5, training=False), "pad": lambda x: F.pad(x, (1, 1)),
    "normalize": lambda x: F.normalize(x, dim=-1), "cosine": lambda x: F.cosine_similarity(x, x + 1),
    "interpolate": lambda x: F.interpolate(x[None], scale_factor=2.0, mode="nearest"),
    "one_hot": lambda x: F.one_hot(x.argmax(1), 5), "embedding": lambda x: F.embedding(x.argmax(1), torch.eye(5)),
    "mse": lambda x: F.mse_loss(x, x * 0.5), "cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([0, 1, 2, 3])),
    "sdpa": lambda x: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None]),
    "conv1d": lambda x: F.conv1d(x[None], torch.ones(2, 4, 3)), "avg_pool": lambda x: F.avg_pool1d(x[None], 2),
}


def _setitem(x):
    y = x.clone()
    y[0] = 1.0
    y[:, 1] = y[:, 2] * 2
    return y


def _index_put(x):
    y = torch.zeros(4, 5)
    y[x > 0] = 1.0
    return y


for _name, _f in _SHAPE_OPS.items():
    PROGRAMS.append(Program(f"op_{_name}", _f, T))

_METADATA = {
    "shape_index": lambda x: x.reshape(x.shape[1], x.shape[0]), "size_call": lambda x: x.view(x.size(0) * x.size(1)),
    "dim": lambda x: x.sum() if x.dim() == 2 else x, "ndim": lambda x: x * x.ndim, "numel": lambda x: x / x.numel(),
    "dtype_branch": lambda x: x * 2 if x.dtype == torch.float32 else x, "device_ctor": lambda x: torch.ones(3, device=x.device),
    "is_floating": lambda x: x + 1 if x.is_floating_point() else x, "len": lambda x: x * len(x),
    "shape_unpack": lambda x: _shape_unpack(x), "stride": lambda x: x * x.stride(0), "requires_grad": lambda x: x + x.requires_grad,
    "size_tuple": lambda x: torch.zeros(x.size()) + x, "new_shape": lambda x: x.new_ones(x.shape[:-1]),
    "is_contiguous": lambda x: x * 2 if x.is_contiguous() else x, "element_size": lambda x: x * x.element_size(),
    "shape_eq": lambda x: x * 2 if x.shape == (4, 5) else -x, "isinstance_tensor": lambda x: x * 3 if isinstance(x, torch.Tensor) else x,
    "torch_is_tensor": lambda x: x + 1 if torch.is_tensor(x) else x, "dtype_attr": lambda x: x.to(x.dtype) + 1,
}


def _shape_unpack(x):
    a, b = x.shape
    return x.reshape(b, a) * a


for _name, _f in _METADATA.items():
    PROGRAMS.append(Program(f"meta_{_name}", _f, T))
