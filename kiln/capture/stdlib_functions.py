"""Standard-library functions over containers: `copy`, `heapq`, `bisect`, and `operator`'s
getters (`itemgetter`, `attrgetter`, `methodcaller`).

[Note: ordering runs for real on keyed items] `heapq` and `bisect` decide by comparing items, so
they need the items' values: kiln runs the real function on a real list of `Keyed` items, each a
constant's value carrying its tracker, and reads the order back. Items that are not constants
(tensors) would need data to compare: refused, as eager's comparison of tensors is itself
ambiguous. `operator`'s getters are made here as partial applications of small Python functions,
which the tracer inlines like the user's code.
"""
from __future__ import annotations

import bisect
import collections
import copy
import functools
import heapq
import operator
import re

import torch

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.semantics import iterate, mutate_list


# -- heapq and bisect -----------------------------------------------------------------------------------
from kiln.capture.constants import is_python_constant, python_value
@functools.total_ordering
class Keyed:
    __slots__ = ("value", "var")

    def __init__(self, value, var):
        self.value, self.var = value, var

    def __eq__(self, other):
        return self.value == other.value

    def __lt__(self, other):
        return self.value < other.value


def _keyed(tx, v: V.Variable) -> Keyed:
    if not is_python_constant(v):
        raise tx.unsupported(f"ordering a {v.python_type().__name__} inside heapq/bisect needs its value")
    return Keyed(python_value(v), v)


def _on_keyed(fn, mutates: bool, item_args: int = 0, returns: str = "value"):
    """`fn(list, *rest)`: the list's items and the first `item_args` of `rest` are keyed; the list is
    written back when `mutates`; `returns`: `item` (a Keyed), `items` (a list of them) or `value`."""
    def handle(tx, args, kwargs):
        if kwargs:
            raise tx.unsupported(f"{fn.__module__}.{fn.__name__} with keyword arguments inside captured code")
        target = args[0]
        real = [_keyed(tx, v) for v in (target.items if mutates else iterate(tx, target))]
        rest = [_keyed(tx, a) if i < item_args else python_value(a) for i, a in enumerate(args[1:])]
        try:
            result = fn(real, *rest)
        except (IndexError, TypeError, ValueError) as e:
            tx.raise_(type(e), *e.args)
        if mutates:
            mutate_list(tx, target, lambda items: items.__setitem__(slice(None), [k.var for k in real]))
        if returns == "item":
            return result.var
        if returns == "items":
            return V.ListVar([k.var for k in result])
        return V.Constant(result)
    return handle


for _fn, _mutates, _items, _returns in [
        (heapq.heappush, True, 1, "value"), (heapq.heappop, True, 0, "item"), (heapq.heapify, True, 0, "value"),
        (heapq.heapreplace, True, 1, "item"), (heapq.heappushpop, True, 1, "item"),
        (bisect.bisect_left, False, 1, "value"), (bisect.bisect_right, False, 1, "value"),
        (bisect.insort_left, True, 1, "value"), (bisect.insort_right, True, 1, "value")]:
    handles(_fn)(_on_keyed(_fn, _mutates, _items, _returns))


def _n_extremes(fn):
    """`heapq.nsmallest/nlargest(n, iterable, key=None)`: compared by value (or by the key's value)."""
    def handle(tx, args, kwargs):
        n, items = python_value(args[0]), iterate(tx, args[1])
        key = kwargs.get("key", args[2] if len(args) > 2 else None)
        keys = items if key is None or isinstance(key, V.Constant) and key.value is None else \
            [tx.call(key, [i]) for i in items]
        real = [Keyed(_keyed(tx, k).value, v) for k, v in zip(keys, items)]
        return V.ListVar([k.var for k in fn(n, real)])
    return handle


handles(heapq.nsmallest)(_n_extremes(heapq.nsmallest))
handles(heapq.nlargest)(_n_extremes(heapq.nlargest))
# bisect.bisect and bisect.insort are the same objects as bisect_right and insort_right


# -- copy -----------------------------------------------------------------------------------------------
def shallow_copy(tx, v: V.Variable) -> V.Variable:
    if isinstance(v, V.ListVar):
        return V.ListVar(list(v.items), v.cls, v.maxlen)
    if isinstance(v, V.DictVar):
        return V.DictVar(dict(v.items), v.cls, v.default_factory)
    if isinstance(v, V.SetVar):
        return v if v.cls is frozenset else V.SetVar(set(v.keys), dict(v.members), v.cls)
    if isinstance(v, V.TupleVar) or is_python_constant(v) and not isinstance(v, V.ObjectVar):
        return v  # immutable: copy.copy returns the object itself
    if isinstance(v, V.NewObjectVar) and _copies_its_dict(v.cls):
        return V.NewObjectVar(v.cls, dict(v.attrs))
    if isinstance(v, V.ObjectVar) and isinstance(getattr(v.value, "__dict__", None), dict) and \
            _copies_its_dict(type(v.value)):
        return _copy_of_object(tx, v)
    raise tx.unsupported(f"copy.copy of a {v.python_type().__name__} inside captured code")


def _copies_its_dict(cls: type) -> bool:
    """Whether copy.copy of a `cls` instance is `object.__reduce_ex__`'s: a new instance made by
    `object.__new__` with the same `__dict__` (no `__copy__`, reduce, getstate/setstate or slots)."""
    from kiln.capture.attributes import _MISSING, class_lookup
    if cls.__module__ == "builtins" or issubclass(cls, (torch.nn.Module, torch.Tensor, type, BaseException)):
        return False
    return class_lookup(cls, "__copy__") is _MISSING and cls.__reduce_ex__ is object.__reduce_ex__ and \
        cls.__reduce__ is object.__reduce__ and cls.__getstate__ is object.__getstate__ and \
        not hasattr(cls, "__setstate__") and cls.__new__ is object.__new__ and \
        not any("__slots__" in klass.__dict__ for klass in cls.__mro__)


def _copy_of_object(tx, v: V.ObjectVar) -> V.NewObjectVar:
    """copy.copy of a program's object (transformers copies a config per layer): an object made in
    captured code holding its attributes, each read from the original's `__dict__` (guarded there,
    with the set of its keys), an attribute written earlier in the trace as written."""
    from kiln.capture.builder import wrap
    from kiln.capture.guards import Guard, GuardKind
    from kiln.capture.sources import AttrSource, DictEntrySource
    from kiln.capture.attributes import _viewed_dict, overlay_id
    obj, source = v.value, v.source
    viewed = _viewed_dict(tx, obj)
    if viewed is not None:  # the frame read obj.__dict__: that tracker holds the attributes now
        return V.NewObjectVar(type(obj), dict(viewed.items))
    if source is not None:
        tx.out.guard(Guard(GuardKind.DICT_KEYS, AttrSource(source, "__dict__"), tuple(vars(obj))))
    attrs = {k: wrap(tx.out, value, DictEntrySource(source, "__dict__", k) if source is not None else None)
             for k, value in vars(obj).items()}
    for (oid, name), value in tx.out.__dict__.get("attr_overlay", {}).items():
        if oid == overlay_id(obj):
            attrs[name] = value
    return V.NewObjectVar(type(obj), attrs)


def _deep_copy(tx, v: V.Variable, memo: dict) -> V.Variable:
    if id(v) in memo:  # shared parts stay shared, as copy.deepcopy's memo keeps them
        return memo[id(v)]
    if isinstance(v, V.Constant) and type(v.value) in (int, float, bool, str, bytes, type(None), complex, range):
        return v
    if isinstance(v, V.ListVar):
        out = memo[id(v)] = V.ListVar([], v.cls, v.maxlen)
        out.items.extend(_deep_copy(tx, i, memo) for i in v.items)
    elif isinstance(v, V.TupleVar):
        out = V.TupleVar([_deep_copy(tx, i, memo) for i in v.items], v.cls)
    elif isinstance(v, V.DictVar) and v.cls in (dict, collections.OrderedDict):
        out = memo[id(v)] = V.DictVar({}, v.cls)
        out.items.update({k: _deep_copy(tx, i, memo) for k, i in v.items.items()})
    elif isinstance(v, V.SetVar) and all(isinstance(m, V.Constant) for m in v.members.values()):
        out = shallow_copy(tx, v)
    else:
        raise tx.unsupported(f"copy.deepcopy of a {v.python_type().__name__} inside captured code")
    memo[id(v)] = out
    return out


handles(copy.copy)(lambda tx, args, kwargs: shallow_copy(tx, args[0]))
handles(copy.deepcopy)(lambda tx, args, kwargs: _deep_copy(tx, args[0], {}))


# -- operator's getters -----------------------------------------------------------------------------------
def _get_items(keys, obj):
    if len(keys) == 1:
        return obj[keys[0]]
    return tuple(obj[k] for k in keys)


def _get_attrs(names, obj):
    def one(o, dotted):
        for part in dotted.split("."):
            o = getattr(o, part)
        return o
    if len(names) == 1:
        return one(obj, names[0])
    return tuple(one(obj, n) for n in names)


def _call_method(name, args, kwargs, obj):
    return getattr(obj, name)(*args, **kwargs)


def _getter(python_fn):
    def handle(tx, args, kwargs):
        from kiln.capture.attributes import _function
        return V.PartialVar(_function(python_fn), [V.TupleVar(list(args))], {})
    return handle


handles(operator.itemgetter)(_getter(_get_items))
handles(operator.attrgetter)(_getter(_get_attrs))


@handles(operator.methodcaller)
def _methodcaller(tx, args, kwargs):
    from kiln.capture.attributes import _function
    return V.PartialVar(_function(_call_method), [args[0], V.TupleVar(list(args[1:])), V.DictVar(dict(kwargs))], {})


@handles(operator.length_hint)
def _length_hint(tx, args, kwargs):
    """`it.__length_hint__()` of an iterator over a builtin container (`operator.length_hint(it)`)."""
    from kiln.capture.views import length_hint
    it = args[0] if args else None
    if not (isinstance(it, V.IteratorVar) and it.hinted) or kwargs:
        raise tx.unsupported("operator.length_hint of something other than an iterator over a builtin container")
    return V.Constant(length_hint(it))


# -- re ---------------------------------------------------------------------------------------------------
@handles(re._compile)
def _re_compile(tx, args, kwargs):
    """`re.compile(pattern, flags)` and every `re.search`/`re.match`/... on a constant pattern: the
    real compile, run at capture time (re's own cache, a dict of the program keyed by type and
    pattern, is not read through); the pattern is immutable and its methods fold on constants."""
    if not all(is_python_constant(a) for a in [*args, *kwargs.values()]):
        raise tx.unsupported("re.compile of a pattern known only at run time")
    try:
        return V.Constant(re._compile(*[python_value(a) for a in args],
                                      **{k: python_value(v) for k, v in kwargs.items()}))
    except (re.error, TypeError, ValueError) as e:
        tx.raise_(type(e), *e.args)
