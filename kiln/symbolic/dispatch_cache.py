"""A per-mode cache of output metadata for functional ops on fake tensors.

Many of torch's meta kernels are Python reference implementations (hundreds of microseconds per
op, more with symbolic sizes), and a model repeats the same op on the same metadata in every
layer. For an op that neither mutates nor aliases (its schema says so), the outputs' dtypes,
sizes and strides depend only on the op, the inputs' metadata and the other arguments; the
cache maps exactly that key to the outputs' metadata, and a hit makes fresh meta tensors.

Guards stay right: the first run recorded its guards in this mode's ShapeEnv, and a hit has the
same symbolic inputs, so the same guards already hold. Any argument the key cannot describe
(an unknown object, a real tensor) makes the op uncached.
"""
from __future__ import annotations

from typing import Any

import torch

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout)
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
_cacheable_ops: dict[Any, bool] = {}


def cacheable(func) -> bool:
    """Functional ops only: no mutated argument, no output aliasing an input."""
    known = _cacheable_ops.get(func)
    if known is None:
        schema = func._schema
        known = (not schema.is_mutable
                 and all(r.alias_info is None for r in schema.returns)
                 and all(str(r.type) in ("Tensor", "Tensor[]") for r in schema.returns)
                 and bool(schema.returns))
        _cacheable_ops[func] = known
    return known


def _metadata(values) -> tuple:
    return tuple(v.node.expr if isinstance(v, _SYM) else v for v in values)


def cache_key(func, flat: list, spec, fake_type: type) -> tuple | None:
    # Factories with dtype=None read the default dtype inside the kernel.
    parts: list = [func, spec, torch.get_default_dtype()]
    for x in flat:
        if isinstance(x, fake_type):
            meta = x._meta
            parts.append((meta.dtype, x.device, _metadata(meta.shape), _metadata(meta.stride()),
                          _metadata((meta.storage_offset(),))))
        elif isinstance(x, _SYM):
            parts.append((type(x), x.node.expr))
        elif isinstance(x, _PLAIN):
            parts.append((type(x), x))
        else:
            return None
    return tuple(parts)


def record(out) -> tuple | None:
    """What to keep of an op's fresh outputs: (dtype, sizes, strides) per tensor, or None."""
    tensors = out if isinstance(out, (list, tuple)) else [out]
    kept = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.storage_offset() != 0:
            return None
        kept.append((t.dtype, list(t.shape), list(t.stride())))
    return (isinstance(out, (list, tuple)), type(out), tuple(kept))


def replay(entry: tuple):
    """Fresh meta tensors with the recorded metadata."""
    is_sequence, kind, kept = entry
    with torch._C._DisableTorchDispatch():
        tensors = [torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
                   for dtype, sizes, strides in kept]
    if not is_sequence:
        return tensors[0]
    return list(tensors) if kind is list else tuple(tensors)
