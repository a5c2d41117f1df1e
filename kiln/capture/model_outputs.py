"""Dict-dataclass outputs (Hugging Face `ModelOutput`): built, read and returned inside captured code.

A `ModelOutput` is an `OrderedDict` subclass decorated with `@dataclass`: its fields are keyword
arguments, fields left `None` are not keys, and it is read by attribute (`out.logits`, `None` for an
unset field), by key (`out["logits"]`), by position over the set fields (`out[0]`, `out[:2]`) and
with `to_tuple()`. Its `__post_init__`/`__setattr__` machinery is C-level dict plumbing that kiln
does not follow, so such a class is modelled here instead: it is a `DictVar` whose `cls` is the
output class, holding only the set fields in field order. `rebuild.py` builds the real object from
that (`cls(**items)`) after the graph runs. Hands on: `is_model_output`, `construct`,
`getattr_field`, `getitem_position`, `setattr_field`.
"""
from __future__ import annotations

import dataclasses

from kiln.capture import variables as V


def is_model_output(cls) -> bool:
    """A dict subclass that is also a dataclass: the keys are the fields that are not None."""
    return isinstance(cls, type) and issubclass(cls, dict) and dataclasses.is_dataclass(cls)


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _is_none(v: V.Variable) -> bool:
    return isinstance(v, V.Constant) and v.value is None


def construct(tx, cls, args, kwargs) -> V.DictVar:
    names = _field_names(cls)
    if len(args) > len(names):
        tx.raise_(TypeError, f"{cls.__name__}() takes {len(names)} positional arguments but {len(args)} were given")
    values = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            tx.raise_(TypeError, f"{cls.__name__}() got an unexpected keyword argument {k!r}")
        if k in values:
            tx.raise_(TypeError, f"{cls.__name__}() got multiple values for argument {k!r}")
        values[k] = v
    first = values.get(names[0]) if names else None
    others_none = all(_is_none(values.get(n, V.Constant(None))) for n in names[1:])
    if others_none and isinstance(first, (V.DictVar, V.ListVar, V.TupleVar)):
        return _from_container(tx, cls, names[0], first)
    return V.DictVar({n: values[n] for n in names if n in values and not _is_none(values[n])}, cls)


def _is_pair(v: V.Variable) -> bool:
    return isinstance(v, (V.ListVar, V.TupleVar)) and len(v.items) == 2 and \
        isinstance(v.items[0], V.Constant) and isinstance(v.items[0].value, str)


def _from_container(tx, cls, first_name: str, first: V.Variable) -> V.DictVar:
    """A lone container first field, as `ModelOutput.__post_init__` reads it: a dict or a sequence
    of (name, value) pairs sets those keys (an empty one sets none); any other sequence (DETR's
    tuple of feature maps) is the first field's value."""
    if isinstance(first, V.DictVar):
        elements = [V.TupleVar([V.Constant(k), v]) for k, v in first.items.items()]
    else:
        elements = list(first.items)
    if elements and not _is_pair(elements[0]):
        return V.DictVar({first_name: first}, cls)
    items = {}
    for element in elements:
        if not _is_pair(element):
            tx.raise_(ValueError, f"Cannot set key/value for {element}. It needs to be a tuple (key, value).")
        name, value = element.items[0].value, element.items[1]
        if not _is_none(value):
            items[name] = value
    return V.DictVar(items, cls)


def getattr_field(tx, d: V.DictVar, name: str):
    """`out.name` for a field: its value, or None when it was not set. Returns None for non-fields."""
    if name in _field_names(d.cls):
        return d.items.get(name, V.Constant(None))
    if name == "to_tuple":
        return V.MethodVar(V.ObjectVar(_to_tuple), d)
    return None


def _to_tuple(self):  # a marker: calls to it are answered by `to_tuple` below, never run
    raise AssertionError("kiln models ModelOutput.to_tuple; this is never called")


def to_tuple(tx, args, kwargs) -> V.TupleVar:
    return V.TupleVar(list(args[0].items.values()))


def getitem_position(tx, d: V.DictVar, key):
    """`out[0]` / `out[1:]`: positions count only the fields that are set (as ModelOutput does)."""
    values = list(d.items.values())
    if isinstance(key, slice):
        return V.TupleVar(values[key])
    if not -len(values) <= key < len(values):
        tx.raise_(IndexError, "tuple index out of range")
    return values[key]


def setattr_field(tx, d: V.DictVar, name: str, value: V.Variable) -> None:
    if name not in _field_names(d.cls):
        raise tx.unsupported(f"setting attribute {name!r} (not a field) on a {d.cls.__name__}")
    if _is_none(value):
        # ModelOutput.__setattr__ leaves the key (and its old value) and sets the attribute to None:
        # the two disagree, which this model cannot hold
        raise tx.unsupported(f"setting {d.cls.__name__}.{name} to None")
    d.items[name] = value  # as ModelOutput.__setattr__: a new key goes last, a set one keeps its place
    if d.source is not None:  # an output object from outside (a submodule's, before a break): replayed key by key
        from kiln.capture.output import ContainerMutation
        tx.out.side_effects.append(ContainerMutation(d))


def in_field_order(d: V.DictVar) -> bool:
    """Are the keys in field order (so `cls(**items)` rebuilds them), or were they set otherwise
    (from (name, value) pairs, by a later write), so that only `cls([(name, value), ...])` does?"""
    names = [n for n in _field_names(d.cls) if n in d.items]
    return names == list(d.items)
