"""A per-mode cache of output metadata for functional and view ops on fake tensors.

Many of torch's meta kernels are Python reference implementations (hundreds of microseconds per
op, more with symbolic sizes), and a model repeats the same op on the same metadata in every
layer. For an op that neither mutates nor aliases (its schema says so), the outputs' dtypes,
sizes and strides depend only on the op, the inputs' metadata and the other arguments; the
cache maps exactly that key to the outputs' metadata, and a hit makes fresh meta tensors.

Guards stay right: the first run recorded its guards in this mode's ShapeEnv, and a hit has the
same symbolic inputs, so the same guards already hold. Any argument the key cannot describe
(an unknown object, a real tensor) makes the op uncached.

A view of its first argument (view, expand, slice, split, kiln's prims' views: a return aliasing
`self`, not written) is kept too: its outputs' sizes, strides and storage offsets also depend only
on that key, and a hit is `as_strided` of the argument's meta tensor, so it aliases as the view
does. On a symbolic prefill these ran torch's Python reference for view (`_reshape_view_helper`),
about a millisecond each, in every layer. A view that changes the dtype or sets the conjugate or
negative bit is not kept (`as_strided` would not reproduce it).
"""
from __future__ import annotations

from typing import Any

import torch

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout)
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
_cacheable_ops: dict[Any, str | None] = {}

FUNCTIONAL, VIEW = "functional", "view"


def cacheable(func) -> str | None:
    """FUNCTIONAL: no mutated argument, no output aliasing an input. VIEW: one return (a tensor or
    a list of them) that aliases the first argument and writes nothing. Else None."""
    if func not in _cacheable_ops:
        _cacheable_ops[func] = _kind(func._schema)
    return _cacheable_ops[func]


def _kind(schema) -> str | None:
    returns = schema.returns
    if not returns or not all(str(r.type) in ("Tensor", "Tensor[]", "List[Tensor]") for r in returns):
        return None
    if not schema.is_mutable and all(r.alias_info is None for r in returns):
        return FUNCTIONAL
    first = schema.arguments[0] if schema.arguments else None
    if (len(returns) == 1 and not schema.is_mutable and returns[0].alias_info is not None
            and not returns[0].alias_info.is_write and first is not None and str(first.type) == "Tensor"
            and first.alias_info is not None and not first.alias_info.is_write):
        return VIEW
    return None


def _metadata(values) -> tuple:
    return tuple(v.node.expr if isinstance(v, _SYM) else v for v in values)


def tensor_key(fake) -> tuple:
    """A fake's part of a key: what its meta kernel reads of it. Kept on the fake (`_key`), as a fake
    is an argument of several ops; `_follow_metadata` drops it when an op changes the metadata."""
    if fake._key is None:
        meta = fake._meta
        fake._key = (meta.dtype, fake.device, _metadata(meta.shape), _metadata(meta.stride()),
                     _metadata((meta.storage_offset(),)))
    return fake._key


def cache_key(func, flat: list, spec, fake_type: type) -> tuple | None:
    # Factories with dtype=None read the default dtype inside the kernel.
    parts: list = [func, spec, torch.get_default_dtype()]
    for x in flat:
        if isinstance(x, fake_type):
            parts.append(tensor_key(x))
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


def record_view(out, base: torch.Tensor) -> tuple | None:
    """What to keep of a view's outputs: (sizes, strides, storage offset) per tensor, or None."""
    tensors = out if isinstance(out, (list, tuple)) else [out]
    kept = []
    for t in tensors:
        if (not isinstance(t, torch.Tensor) or t is base or t.layout != torch.strided or t.dtype != base.dtype
                or t.is_conj() or t.is_neg()):
            return None
        kept.append((list(t.shape), list(t.stride()), t.storage_offset()))
    return (isinstance(out, (list, tuple)), type(out), tuple(kept))


def replay_view(entry: tuple, base: torch.Tensor):
    """Views of `base` (a meta tensor) with the recorded metadata."""
    is_sequence, kind, kept = entry
    with torch._C._DisableTorchDispatch():
        tensors = [base.as_strided(sizes, strides, offset) for sizes, strides, offset in kept]
    if not is_sequence:
        return tensors[0]
    return list(tensors) if kind is list else tuple(tensors)


def replay(entry: tuple):
    """Fresh meta tensors with the recorded metadata."""
    is_sequence, kind, kept = entry
    with torch._C._DisableTorchDispatch():
        tensors = [torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
                   for dtype, sizes, strides in kept]
    if not is_sequence:
        return tensors[0]
    return list(tensors) if kind is list else tuple(tensors)
