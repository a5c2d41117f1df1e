"""Guards on module state, checked only when some module's state was written.

[Note: settled module state] Most of a model's guard conditions check that its module tree is as
traced: each submodule and parameter is the same object (`self._modules['layers']._modules['3']
is C`), and each flag and number a forward read (`training`, a LayerNorm's `eps`, a dropout's
`p`) has its traced value. A 32-layer decoder has ~2,000 of them, ~200 us of Python on every call:
at decoding's batch 1, where the GPU waits for the host, that is a tenth of a token's time.

That state changes only through nn.Module's own writing methods, which kiln counts ([Note: counted
module writes] in kiln/runtime/module_writes.py), and an entry keeps the count at its last full
check: while the count has not moved, no module state a *settled* guard reads can have changed, so
only the other (*live*) guards are evaluated. The count is read before the settled guards, so a
write made while they are read is seen on the next call. This is [Note: hook tables by
registration count] (guards.py) applied to module state, as Dynamo applied it to modules for years
(its `mutation_guard`); Dynamo today checks the same conditions in C++, which kiln's Python cannot
match one condition at a time.

A guard is settled when its value is reached from a *stable* object by a read that only those
writes change, and what it checks of that value cannot change otherwise:
- stable: an object an ID guard pins (`self is C`: live, checked every call), or one read from a
  stable module's own storage (its `__dict__` with no data descriptor of the name on the class, its
  `_modules`/`_parameters`/`_buffers` tables) where the module's class keeps nn.Module's
  `__setattr__`/`__delattr__`/`__getattr__` and `object.__getattribute__`, or an item of a stable
  tuple;
- settled checks of such a value: identity, and being the object another such read gives; the type
  of a module or of an immutable value; equality
  with an immutable constant (numbers, strings, None, dtypes, devices, tuples of them); the length
  or keys of a tuple or of a module table.
Parameters' and buffers' metadata (dtype, device, sizes, strides) read this way settles on a count
of its own ([Note: module tensors' metadata] in module_writes.py). Everything else stays live: other
tensors' metadata, mutable objects reached from modules (a model's config: its attributes are plain
writes), class attributes, globals. A live guard whose value is reached through stable objects is
rebased onto the deepest of them (*pinned*: the compiled function holds it, and a settled ID guard
checks the read still gives it), so the live part re-reads no module chain, and the 32 layers'
reads of one shared config become one read (`config._attn_implementation == 'sdpa'`, once).

Not seen: the writes that note does not count.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kiln.capture.guards import Guard, GuardKind, empty_hook_table
from kiln.capture.sources import AttrSource, DictEntrySource, ItemSource, PinnedSource, Source, TypeSource
from kiln.runtime.module_writes import count_module_writes, count_tensor_writes, counts_writes

MODULE_TABLES = ("_modules", "_parameters", "_buffers")
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device)
_MISSING = object()


def _class_data_descriptor(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            return hasattr(type(found), "__set__") or hasattr(type(found), "__delete__")
    return False


def _stored(module: torch.nn.Module, name: str) -> Any:
    """`module.<name>` if it is read from the module's own storage (its __dict__, or a table that
    nn.Module.__getattr__ looks in when no class attribute has the name), else _MISSING."""
    if name in module.__dict__:
        return _MISSING if _class_data_descriptor(type(module), name) else module.__dict__[name]
    if any(name in klass.__dict__ for klass in type(module).__mro__):
        return _MISSING
    for table in ("_parameters", "_buffers", "_modules"):     # nn.Module.__getattr__'s order
        found = module.__dict__.get(table, {})
        if name in found:
            return found[name]
    return _MISSING


def _read(source: Source, base: Any) -> Any:
    """The value `source` reads from its base's value `base`, where only counted writes can change
    it; else _MISSING."""
    if isinstance(source, (AttrSource, DictEntrySource, TypeSource)):
        if not isinstance(base, torch.nn.Module) or not counts_writes(type(base)):
            return _MISSING
        if isinstance(source, TypeSource):
            return type(base)
        if isinstance(source, AttrSource):
            return _stored(base, source.attr)
        if source.table in MODULE_TABLES and source.key in base.__dict__.get(source.table, {}):
            return base.__dict__[source.table][source.key]
        return _MISSING
    if isinstance(source, ItemSource) and type(base) is tuple and type(source.key) is int \
            and -len(base) <= source.key < len(base):
        return base[source.key]
    return _MISSING


def _immutable(value: Any) -> bool:
    if type(value) in (tuple, frozenset):
        return all(_immutable(v) for v in value)
    return type(value) in _IMMUTABLE


@dataclasses.dataclass
class Split:
    """An entry's guards as [Note: settled module state] divides them."""
    live: list[Guard]
    settled: list[Guard]
    pins: list[Any]          # PinnedSource(i) reads pins[i]
    tensors: list[Guard] = dataclasses.field(default_factory=list)   # checked when TENSOR_WRITES moved


def split(guards: list[Guard]) -> Split:
    ids = {g.source: g.expected for g in guards if g.kind is GuardKind.ID}
    if any(isinstance(v, torch.nn.Module) for v in ids.values()):
        count_module_writes()
    counted: dict[Source, Any] = {}     # source -> its value, for sources read by a counted read

    def stable(source: Source) -> Any:
        """The object `source` holds while no counted write happens (given the live guards), or _MISSING."""
        value = counted_value(source)
        if value is _MISSING and source in ids:
            value = ids[source]
        return value

    def counted_value(source: Source) -> Any:
        if source not in counted:
            base = getattr(source, "base", None)
            held = stable(base) if base is not None else _MISSING
            counted[source] = _MISSING if held is _MISSING else _read(source, held)
        return counted[source]

    def is_settled(g: Guard) -> bool:
        if g.source is None or (value := counted_value(g.source)) is _MISSING:
            return False
        kind = g.kind
        table = isinstance(g.source, AttrSource) and g.source.attr in MODULE_TABLES
        return (kind is GuardKind.ID
                or (kind is GuardKind.SAME and counted_value(g.expected) is not _MISSING)
                or (kind is GuardKind.TYPE and (isinstance(value, torch.nn.Module) or _immutable(value)))
                or (kind is GuardKind.CONST and _immutable(value))
                or (kind is GuardKind.LEN and (type(value) is tuple or table))
                or (kind in (GuardKind.DICT_KEYS, GuardKind.ABSENT, GuardKind.PRESENT) and table))

    # [Note: module tensors' metadata] (module_writes.py): a stable module's parameters and buffers
    tensors = [g for g in guards if g.kind is GuardKind.STATE_TENSOR
               and isinstance(counted_value(g.source), torch.Tensor)]
    if tensors:
        count_tensor_writes()
        apart = set(tensors)
        guards = [g for g in guards if g not in apart]
    settled = [g for g in guards if is_settled(g)]
    if not settled:
        return Split(list(guards), [], [], tensors)
    pinned: dict[Source, int] = {}
    pins: list[Any] = []
    index: dict[int, int] = {}       # id(object) -> its pin: reads of one object through many chains

    def rebase(source: Source) -> Source:
        """`source` read from the deepest counted read on its chain, pinned."""
        if (value := counted_value(source)) is not _MISSING:
            if source not in pinned:
                pinned[source] = index.setdefault(id(value), len(pins))
                if pinned[source] == len(pins):
                    pins.append(value)
            return PinnedSource(pinned[source])
        base = getattr(source, "base", None)
        return source if base is None else dataclasses.replace(source, base=rebase(base))

    chosen = set(settled)
    # (hook tables keep their sources: [Note: hook tables by registration count] checks them apart)
    live = [g if g.source is None or empty_hook_table(g) else dataclasses.replace(g, source=rebase(g.source))
            for g in guards if g not in chosen]
    # each pinned read must still give its object: a settled identity check (one already there stands)
    checked = {g.source for g in settled if g.kind is GuardKind.ID}
    settled += [Guard(GuardKind.ID, source, pins[i]) for source, i in pinned.items() if source not in checked]
    return Split(live, settled, pins, tensors)
