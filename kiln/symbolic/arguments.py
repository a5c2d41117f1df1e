"""The arguments of one ATen op call, flattened and rebuilt without torch's pytree.

An `OpOverload` takes values, sequences of values (`Tensor[]`, `SymInt[]`, `Tensor?[]`) and
keyword arguments by name: nothing else nests. torch's pytree walks every container Python has
(namedtuples, registered classes, dicts in any position) at several microseconds a node, and each
op traced on fake tensors was flattened, rebuilt and mapped over two or three times: about a tenth
of decomposing a 32-layer decoder. These walk exactly the containers pytree would see in an op's
arguments (list, tuple, torch.Size, at any depth) and nothing more.

`flatten` gives the leaves and a `structure` (nested tuples: hashable, so it can be part of a cache
key); `unflatten` rebuilds the arguments from it; `map_args` does both with a function on leaves.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

_SEQUENCES = (list, tuple, torch.Size)


def _flatten_into(values, flat: list) -> tuple:
    shape = []
    for v in values:
        kind = type(v)
        if kind is list or kind is tuple or kind is torch.Size:
            shape.append((kind, _flatten_into(v, flat)))
        else:
            flat.append(v)
            shape.append(None)
    return tuple(shape)


def flatten(args: tuple, kwargs: dict) -> tuple[list, tuple]:
    """(leaves, structure) of an op's arguments."""
    flat: list = []
    structure = (_flatten_into(args, flat), tuple(kwargs), _flatten_into(kwargs.values(), flat))
    return flat, structure


def _rebuild(shape: tuple, leaves) -> list:
    out = []
    for entry in shape:
        if entry is None:
            out.append(next(leaves))
        else:
            kind, inner = entry
            out.append(kind(_rebuild(inner, leaves)))
    return out


def unflatten(flat: list, structure: tuple) -> tuple[tuple, dict]:
    """The (args, kwargs) that `flatten` took apart, with `flat`'s leaves."""
    arg_shape, names, kwarg_shape = structure
    leaves = iter(flat)
    args = tuple(_rebuild(arg_shape, leaves))
    return args, dict(zip(names, _rebuild(kwarg_shape, leaves)))


def _map(fn: Callable, values) -> list:
    out = []
    for v in values:
        kind = type(v)
        out.append(kind(_map(fn, v)) if kind is list or kind is tuple or kind is torch.Size else fn(v))
    return out


def map_args(fn: Callable[[Any], Any], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) with `fn` applied to every leaf."""
    return tuple(_map(fn, args)), {k: v for k, v in zip(kwargs, _map(fn, kwargs.values()))}
