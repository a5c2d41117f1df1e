"""Dict keys and set members: the Python value a tracker is keyed by in `DictVar.items` and
`SetVar.keys` (`key_of`), and the ones that need more than a constant: tensors and objects hashed by
identity are their own trackers, objects hashed by value that kiln cannot fold are `V.ValueKey`s
([Note: keys hashed by value]). The dict and set operations over these keys are `semantics.py`'s
and `containers.py`'s.
"""
from __future__ import annotations

import types
from typing import Any

from kiln.capture import variables as V
from kiln.capture.attributes import class_lookup
from kiln.capture.constants import is_python_constant, python_value
from kiln.capture.interpreter import GraphBreak, NotConstant, ObservedException


def key_of(tx, v: V.Variable) -> Any:
    """A dict key or set element as a Python value; a tensor is its own tracker (one tracker per
    real tensor, so identity is the tensor's identity, as `Tensor.__hash__` is)."""
    if isinstance(v, V.TensorVar) or _hashed_by_identity(v):
        return v
    try:
        key = python_value(v)
    except NotConstant:
        return _value_key(tx, v)
    try:
        hash(key)
    except TypeError:
        tx.raise_(TypeError, f"unhashable type: '{type(key).__name__}'")
    return key


# [Note: keys hashed by value] A key Python hashes by value but kiln cannot fold (an object of a
# user's class made in traced code with its own `__hash__`/`__eq__`, a frozen dataclass; a
# namedtuple holding a functools.partial) becomes a `V.ValueKey`: a shadow of it (a real object of
# its class whose attributes are the constants the tracker holds; an identity-hashed part stays its
# tracker) on which the class's own `__hash__` and `__eq__` run as Python runs them, while tracing.
# Everything the shadow is made of is a constant of the traced code, so nothing needs a guard
# beyond those its parts already carry. A method that changes the object (a hash that counts its
# calls) would change only the shadow: refused.
def _value_key(tx, v: V.Variable) -> V.ValueKey:
    def refuse():
        return tx.unsupported(f"a {v.python_type().__name__} used as a dict key or set element")
    shadow = _shadow(tx, v, refuse)
    before = _shadow_state(shadow)

    def fail(e):
        if isinstance(e, (GraphBreak, ObservedException)):
            raise e
        tx.raise_(type(e), *e.args)
    try:
        h = hash(shadow)
    except Exception as e:
        fail(e)
    if _shadow_state(shadow) != before:
        raise refuse()
    return V.ValueKey(v, shadow, h, fail)


def _shadow(tx, v: V.Variable, refuse, trackers: bool = True):
    """A real value hashing and comparing as `v`'s object does (see [Note: keys hashed by value]).
    An identity-hashed part stays its tracker only inside a tuple (whose C hash and == use only its
    items' hash and identity); a user's `__hash__`/`__eq__` would see a tracker: refused."""
    if isinstance(v, V.TensorVar) or _hashed_by_identity(v):
        if not trackers:
            raise refuse()
        return v
    if is_python_constant(v):
        return python_value(v)
    if isinstance(v, V.TupleVar) and not v.attrs and (v.cls is tuple or hasattr(v.cls, "_fields")):
        items = [_shadow(tx, i, refuse, trackers) for i in v.items]
        return tuple(items) if v.cls is tuple else v.cls(*items)
    if isinstance(v, V.NewObjectVar) and isinstance(class_lookup(v.cls, "__hash__"), types.FunctionType) \
            and not _has_slots(v.cls):
        obj = object.__new__(v.cls)
        for name, attr in v.attrs.items():
            obj.__dict__[name] = _shadow(tx, attr, refuse, trackers=False)
        return obj
    raise refuse()


def _has_slots(cls: type) -> bool:
    return any("__slots__" in k.__dict__ for k in cls.__mro__[:-1])


def _shadow_state(shadow) -> Any:
    if isinstance(shadow, tuple):
        return [_shadow_state(i) for i in shadow]
    return dict(shadow.__dict__) if hasattr(shadow, "__dict__") and not isinstance(shadow, (type, V.Variable)) \
        else None


def refuse_identity_member(tx, key):
    """A set iterates in the order of its members' hashes; an object hashed by identity has the
    tracker's id in kiln and the object's in Python, so its order would differ: refused."""
    if isinstance(key, V.ValueKey) and _holds_tracker(key.shadow):
        raise tx.unsupported(f"a {key.var.python_type().__name__} holding an object hashed by identity as a set "
                             "member: the set's order would follow kiln's ids, not the program's")
    if isinstance(key, (V.NewObjectVar, V.PartialVar)):
        raise tx.unsupported(f"a {key.python_type().__name__} (hashed by identity) as a set member: the set's "
                             "order would follow kiln's ids, not the program's")


def _holds_tracker(shadow) -> bool:
    if isinstance(shadow, tuple):
        return any(_holds_tracker(i) for i in shadow)
    if isinstance(shadow, V.Variable):
        return True
    return any(_holds_tracker(a) for a in getattr(shadow, "__dict__", {}).values()) \
        if not isinstance(shadow, type) else False


def _hashed_by_identity(v: V.Variable) -> bool:
    """An object made in traced code whose hash and == are object's own (a user's instance with no
    `__hash__`/`__eq__` of its class, a functools.partial): its tracker is its key, as one tracker
    stands for one object."""
    if isinstance(v, V.PartialVar):
        return True
    return isinstance(v, V.NewObjectVar) and class_lookup(v.cls, "__hash__") is object.__hash__ and \
        class_lookup(v.cls, "__eq__") is object.__eq__


def set_member_key(tx, v: V.Variable) -> Any:
    """The key `x in s`, `s.remove(x)` and `s.discard(x)` look up: a set (unhashable) is looked up
    as the frozenset of its members, as CPython's set does."""
    if isinstance(v, V.SetVar) and issubclass(v.cls, set) and class_lookup(v.cls, "__hash__") is None:
        return frozenset(v.keys)
    return key_of(tx, v)
