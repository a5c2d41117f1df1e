"""The builtin containers over trackers: list, tuple, dict, set and frozenset, and their methods.

Each method is one entry in `callables.CALLABLES`, keyed by its descriptor (`list.append`,
`set.union`, `dict.fromkeys`). Lists and dicts mutate their tracker in place, so every alias of a
container sees the change; a container read from the frame's inputs records a side effect that
writes its final contents back after the graph.

Sets keep a real Python set of their members' keys (`SetVar.keys`), and set algebra runs the real
method on those keys: the result, its iteration order and its type (set or frozenset) are Python's
own, and only the mapping from keys back to trackers is kiln's.
"""
from __future__ import annotations

import collections
import operator
import types

from kiln.capture import variables as V
from kiln.capture.attributes import class_lookup
from kiln.capture.callables import ATTRIBUTES, CLASS_METHODS, handles
from kiln.capture.constants import constant_of, is_python_constant, python_value
from kiln.capture.generators import advance
from kiln.capture.keys import key_of, refuse_identity_member, set_member_key
from kiln.capture.semantics import (SEQUENCE_OPS, _record_mutation, contains, dict_items, dict_set, extend_list,
                                    items_equal, iterate, mapping_pairs, mutate_list, set_add)


def _none(tx, args, kwargs):
    return V.Constant(None)


# -- constructors -------------------------------------------------------------------------------------
@handles(list)
def _list(tx, args, kwargs):
    return V.ListVar(iterate(tx, args[0]) if args else [])


@handles(tuple)
def _tuple(tx, args, kwargs):
    return V.TupleVar(iterate(tx, args[0]) if args else [])


def _set_of(cls):
    """`set(iterable)`, `frozenset(iterable)`: from another set, the real copy (which keeps or
    changes the order as Python's does); from other iterables, member by member."""
    def handle(tx, args, kwargs):
        if args and isinstance(args[0], V.SetVar):
            return V.SetVar(cls(args[0].keys), dict(args[0].members), cls)
        s = V.SetVar()
        for item in (iterate(tx, args[0]) if args else []):
            set_add(tx, s, item)
        if cls is frozenset:
            s.keys, s.cls = frozenset(s.members), frozenset  # inserted in the same order
        return s
    return handle


handles(set)(_set_of(set))
handles(frozenset)(_set_of(frozenset))


def dict_of(tx, cls, args, kwargs, default_factory=None) -> V.DictVar:
    """`cls(mapping_or_pairs, **kwargs)` for dict and its subclasses that keep dict's __init__."""
    d = V.DictVar({}, cls, default_factory)
    if args:
        d.items.update(mapping_pairs(tx, args[0]))
    d.items.update(kwargs)
    return d


handles(dict)(lambda tx, args, kwargs: dict_of(tx, dict, args, kwargs))
handles(collections.OrderedDict)(lambda tx, args, kwargs: dict_of(tx, collections.OrderedDict, args, kwargs))


def _fromkeys(cls):
    def handle(tx, args, kwargs):
        if kwargs or not 1 <= len(args) <= 2:   # the arity error, worded by the class's own C code
            try:
                cls.fromkeys(*[()] * len(args), **dict.fromkeys(kwargs, ()))
            except TypeError as e:
                tx.raise_(TypeError, str(e))
            args = [*args, kwargs["iterable"]] if "iterable" in kwargs else list(args)   # OrderedDict's names
            if "value" in kwargs:
                args.append(kwargs["value"])
        value = args[1] if len(args) > 1 else V.Constant(None)
        d = V.DictVar({}, cls)
        for k in iterate(tx, args[0]):
            d.items[key_of(tx, k)] = value  # one value shared by every key, as in Python
        return d
    return handle


def _subclass_fromkeys(base):
    def make(cls):
        """`Sub.fromkeys(...)` of a subclass of `base`: `cls()` filled by `__setitem__`, which are
        `base`'s own unless the subclass overrides how it is made or filled (its Python would run:
        refused, no handler)."""
        if any(class_lookup(cls, name) is not class_lookup(base, name) for name in ("__new__", "__init__", "__setitem__")):
            return None
        return _fromkeys(cls)
    return make


for _cls in (dict, collections.OrderedDict, collections.defaultdict):
    handles(_cls.fromkeys)(_fromkeys(_cls))
for _cls in (dict, collections.OrderedDict):
    CLASS_METHODS[(_cls, "fromkeys")] = _subclass_fromkeys(_cls)


@handles(dict.__init__, collections.OrderedDict.__init__)
def _dict_init(tx, args, kwargs):
    """`super().__init__(...)` in a dict (or OrderedDict) subclass's __init__."""
    args[0].items.update(dict_of(tx, dict, args[1:], kwargs).items)
    return V.Constant(None)


@handles(dict.__new__)
def _dict_new(tx, args, kwargs):
    """`super().__new__(cls)` in a dict subclass's __new__: an empty instance of the class."""
    return V.DictVar({}, python_value(args[0]))


# -- list and tuple -----------------------------------------------------------------------------------
@handles(list.append)
def _append(tx, args, kwargs):
    mutate_list(tx, args[0], lambda items: items.append(args[1]))
    return V.Constant(None)


@handles(list.extend)
def _extend(tx, args, kwargs):
    extend_list(tx, args[0], args[1])
    return V.Constant(None)


@handles(list.insert)
def _insert(tx, args, kwargs):
    mutate_list(tx, args[0], lambda items: items.insert(python_value(args[1]), args[2]))
    return V.Constant(None)


@handles(list.pop)
def _list_pop(tx, args, kwargs):
    index = python_value(args[1]) if len(args) > 1 else -1
    if not args[0].items:
        tx.raise_(IndexError, "pop from empty list")
    if not isinstance(index, int):
        tx.raise_(TypeError, f"'{type(index).__name__}' object cannot be interpreted as an integer")
    if not -len(args[0].items) <= index < len(args[0].items):
        tx.raise_(IndexError, "pop index out of range")
    out = args[0].items[index]
    mutate_list(tx, args[0], lambda items: items.pop(index))
    return out


@handles(list.clear, dict.clear, collections.OrderedDict.clear)
def _clear(tx, args, kwargs):
    c = args[0]
    c.items.clear()
    _record_mutation(tx, c)
    return V.Constant(None)


@handles(list.reverse)
def _list_reverse(tx, args, kwargs):
    mutate_list(tx, args[0], lambda items: items.reverse())
    return V.Constant(None)


@handles(list.copy)
def _list_copy(tx, args, kwargs):
    return V.ListVar(list(args[0].items))


@handles(list.index, tuple.index, collections.deque.index)
def index_of(tx, args, kwargs, method="index"):
    """`seq.index(x[, start[, stop]])` (bounds clamped as slice bounds are), with CPython 3.11's
    message per type when `x` is missing."""
    seq, x = args[0], args[1]
    bounds = [python_value(a) for a in args[2:4]] + [None, None]
    indices = range(len(seq.items))[slice(bounds[0], bounds[1])]
    for i in indices:
        if items_equal(tx, seq.items[i], x):
            return V.Constant(i)
    kind = _sequence_base(seq.python_type())
    if kind is tuple or kind is list and method == "remove":
        tx.raise_(ValueError, f"{kind.__name__}.{method}(x): x not in {kind.__name__}")
    shown = repr(python_value(x)) if is_python_constant(x) else "x"
    tx.raise_(ValueError, f"{shown} is not in {kind.__name__}")


def _sequence_base(cls: type) -> type:
    return next(base for base in (collections.deque, list, tuple) if issubclass(cls, base))


@handles(list.count, tuple.count, collections.deque.count)
def _count(tx, args, kwargs):
    return V.Constant(sum(items_equal(tx, i, args[1]) for i in args[0].items))


@handles(list.remove, collections.deque.remove)
def _remove(tx, args, kwargs):
    i = index_of(tx, args[:2], kwargs, method="remove").value
    mutate_list(tx, args[0], lambda items: items.pop(i))
    return V.Constant(None)


@handles(list.sort)
def _sort(tx, args, kwargs):
    from kiln.capture.iterators import sorted_items
    lst = args[0]
    if not isinstance(lst, V.ListVar):
        raise tx.unsupported(f"list.sort of a {lst.python_type().__name__}")
    # CPython empties the list while it sorts: a key function sees it empty, and a write to it
    # during the sort is dropped for the sorted items and raises ValueError afterwards
    saved, lst.items[:] = list(lst.items), []
    try:
        ordered = sorted_items(tx, [V.ListVar(saved)], kwargs).items
    except BaseException:
        lst.items[:] = saved
        raise
    modified = bool(lst.items)
    mutate_list(tx, lst, lambda items: items.__setitem__(slice(None), ordered))
    if modified:
        tx.raise_(ValueError, "list modified during sort")
    return V.Constant(None)


# -- dict ---------------------------------------------------------------------------------------------
@handles(dict.get)
def _dict_get(tx, args, kwargs):
    d, key = args[0], key_of(tx, args[1])
    return d.items.get(key, args[2] if len(args) > 2 else V.Constant(None))


@handles(dict.items, collections.OrderedDict.items)
def _dict_items(tx, args, kwargs):
    return V.DictViewVar(args[0], "items")       # live, as Python's (views.py)


@handles(dict.keys, collections.OrderedDict.keys)
def _dict_keys(tx, args, kwargs):
    return V.DictViewVar(args[0], "keys")


@handles(dict.values, collections.OrderedDict.values)
def _dict_values(tx, args, kwargs):
    return V.DictViewVar(args[0], "values")


@handles(dict.update, collections.OrderedDict.update)
def _dict_update(tx, args, kwargs):
    d = args[0]
    if not isinstance(d, V.DictVar):
        raise tx.unsupported(f"update() of a {d.python_type().__name__}")
    pairs = mapping_pairs(tx, args[1]) if len(args) > 1 else []
    d.items.update([*pairs, *kwargs.items()])
    _record_mutation(tx, d)
    return V.Constant(None)


@handles(dict.pop, collections.OrderedDict.pop)
def _dict_pop(tx, args, kwargs):
    d, key = args[0], key_of(tx, args[1])
    if key not in d.items:
        if len(args) > 2:
            return args[2]
        tx.raise_(KeyError, key)
    _record_mutation(tx, d)
    return d.items.pop(key)


@handles(dict.popitem, collections.OrderedDict.popitem)
def _dict_popitem(tx, args, kwargs):
    d = args[0]
    if not d.items:
        tx.raise_(KeyError, "popitem(): dictionary is empty")
    last = python_value(kwargs.get("last", args[1] if len(args) > 1 else V.Constant(True)))
    key = next(reversed(d.items)) if last else next(iter(d.items))
    _record_mutation(tx, d)
    return V.TupleVar([V.key_var(key), d.items.pop(key)])


@handles(dict.setdefault, collections.OrderedDict.setdefault)
def _dict_setdefault(tx, args, kwargs):
    d, key = args[0], key_of(tx, args[1])
    if key not in d.items:
        dict_set(tx, d, args[1], args[2] if len(args) > 2 else V.Constant(None))
    return d.items[key]


@handles(collections.OrderedDict.copy, collections.defaultdict.copy, collections.defaultdict.__copy__)
def _dict_copy(tx, args, kwargs):
    """OrderedDict's and defaultdict's copies are of the receiver's class (defaultdict's with its
    `default_factory`: `type(self)(self.default_factory, self)`)."""
    d = args[0]
    return V.DictVar(dict(d.items), d.cls, d.default_factory)


@handles(dict.copy)
def _plain_dict_copy(tx, args, kwargs):
    """dict.copy gives a plain dict, whatever subclass of dict it copies."""
    d = args[0]
    if not isinstance(d, V.DictVar):
        raise tx.unsupported(f"dict.copy of a {d.python_type().__name__}")
    return V.DictVar(dict(d.items), dict)


# -- types.MappingProxyType: a read-only view of a dict tracker (`V.MappingProxyVar`) -------------------
@handles(types.MappingProxyType)
def _mapping_proxy(tx, args, kwargs):
    target = args[0] if len(args) == 1 and not kwargs else None
    if isinstance(target, V.MappingProxyVar):
        target = target.target   # a proxy of a proxy reads the same dict
    if not isinstance(target, V.DictVar):
        if target is not None and target.python_type() in (list, tuple, V.ListVar):
            tx.raise_(TypeError, f"mappingproxy() argument must be a mapping, not {target.python_type().__name__}")
        raise tx.unsupported("a mappingproxy over something other than a dict made or read in captured code")
    return V.MappingProxyVar(target.items, types.MappingProxyType, target=target)


def _mapping_copy(tx, args, kwargs):
    """`proxy.copy()` is the shown mapping's own `copy()`."""
    d = args[0]
    own = class_lookup(d.cls, "copy") if isinstance(d, V.DictVar) else None
    return (_plain_dict_copy if own is dict.copy else _dict_copy)(tx, args, kwargs)


def _through_proxy(handler):
    """A mappingproxy method: the dict method `handler` on the dict it shows (`copy` gives a copy
    of that dict, `items()` a view of it, as Python's proxy does)."""
    return lambda tx, args, kwargs: handler(tx, [args[0].target, *args[1:]], kwargs)


for _name, _handler in (("get", _dict_get), ("items", _dict_items), ("keys", _dict_keys),
                        ("values", _dict_values), ("copy", _mapping_copy)):
    handles(getattr(types.MappingProxyType, _name))(_through_proxy(_handler))
for _view in V.VIEW_TYPES.values():   # `d.keys().mapping`: the view's dict, read-only
    ATTRIBUTES[(_view, "mapping")] = lambda tx, view: V.MappingProxyVar(view.dict.items, types.MappingProxyType,
                                                                         target=view.dict)


@handles(dict.__contains__, list.__contains__, tuple.__contains__, set.__contains__, frozenset.__contains__)
def _contains(tx, args, kwargs):
    return V.Constant(contains(tx, args[0], args[1], base=True))


@handles(dict.__getitem__, list.__getitem__, tuple.__getitem__)
def _getitem(tx, args, kwargs):
    from kiln.capture.semantics import getitem
    if isinstance(args[0], V.ObjectVar):  # `super().__getitem__(k)` in a subclass's own __getitem__
        from kiln.capture.attributes import builtin_getitem
        return builtin_getitem(tx, args[0], args[1])
    return getitem(tx, args[0], args[1], base=True)


@handles(dict.__setitem__, collections.OrderedDict.__setitem__, list.__setitem__)
def _setitem(tx, args, kwargs):
    from kiln.capture.semantics import setitem
    setitem(tx, args[0], args[1], args[2], base=True)
    return V.Constant(None)


# -- set and frozenset --------------------------------------------------------------------------------
def _keys(tx, v: V.Variable, pool: dict):
    """The keys of a set operand (a set, or any iterable), remembering each key's tracker in `pool`."""
    if isinstance(v, V.Constant) and isinstance(v.value, (set, frozenset)):
        v = constant_of(tx, v.value)
    if isinstance(v, V.SetVar):
        pool.update({id(k): t for k, t in v.members.items()})
        return v.keys  # the real set itself: a copy could iterate in another order than Python's
    keys = []
    for item in iterate(tx, v):
        k = key_of(tx, item)
        refuse_identity_member(tx, k)
        pool.setdefault(id(k), item)
        keys.append(k)
    return keys


def _tracker(pool, key):
    return pool.get(id(key)) or V.key_var(key)


def _set_result(tx, pool, result):
    if isinstance(result, (set, frozenset)):
        return V.SetVar(result, {k: _tracker(pool, k) for k in result}, type(result))
    return V.Constant(result)


def _algebra(fn):
    """`fn` (a set method or operator) run on the operands' keys; the receiver is not changed."""
    def handle(tx, args, kwargs):
        pool = {}
        operands = [_keys(tx, a, pool) for a in args]
        if not isinstance(operands[0], (set, frozenset)):
            tx.raise_(TypeError, f"descriptor needs a set, not {args[0].python_type().__name__}")
        try:
            result = fn(*operands)
        except TypeError as e:
            tx.raise_(TypeError, str(e))
        return _set_result(tx, pool, result)
    return handle


def _update(fn, members=False):
    """`fn` (an in-place set method) run on the receiver's own keys, so every alias sees it."""
    def handle(tx, args, kwargs):
        s, pool = args[0], {}
        others = [set_member_key(tx, a) if members else _keys(tx, a, pool) for a in args[1:]]
        pool.update({id(k): t for k, t in s.members.items()})
        try:
            result = fn(s.keys, *others)
        except (KeyError, TypeError) as e:
            tx.raise_(type(e), *e.args)
        s.members = {k: _tracker(pool, k) for k in s.keys}
        _record_mutation(tx, s)
        if isinstance(result, set) and result is s.keys:
            return s  # `s |= t` is `s` itself
        return _tracker(pool, result) if fn is set.pop else V.Constant(result)
    return handle


_ALGEBRA = ("union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
            "isdisjoint", "copy")
for _name in _ALGEBRA:
    for _cls in (set, frozenset):
        handles(getattr(_cls, _name))(_algebra(getattr(_cls, _name)))


def _stops_early(fn, answer_on_hit: bool):
    """`s.isdisjoint(it)` / `s.issuperset(it)` over an iterator that is not a set: CPython steps it
    and returns at the first member that decides (a common one, a missing one), leaving the rest of
    a generator unrun."""
    algebra = _algebra(fn)

    def handle(tx, args, kwargs):
        if len(args) != 2 or not isinstance(args[0], V.SetVar) or \
                not isinstance(args[1], (V.GeneratorVar, V.LazyIteratorVar)):
            return algebra(tx, args, kwargs)
        while (item := advance(tx, args[1])) is not None:
            if (key_of(tx, item) in args[0].keys) is answer_on_hit:
                return V.Constant(False)
        return V.Constant(True)
    return handle


def _frozenset_copy(tx, args, kwargs):
    """`fs.copy()` of an exact frozenset is `fs` itself (immutable: CPython hands the same object
    back); a subclass's copy is a new plain frozenset."""
    if len(args) == 1 and not kwargs and isinstance(args[0], V.SetVar) and args[0].python_type() is frozenset:
        return args[0]
    return _algebra(frozenset.copy)(tx, args, kwargs)


handles(frozenset.copy)(_frozenset_copy)
for _cls in (set, frozenset):
    handles(_cls.isdisjoint)(_stops_early(_cls.isdisjoint, True))
    handles(_cls.issuperset)(_stops_early(_cls.issuperset, False))
for _name in ("update", "intersection_update", "difference_update", "symmetric_difference_update", "pop", "clear"):
    handles(getattr(set, _name))(_update(getattr(set, _name)))
for _name in ("discard", "remove"):  # these take one member, not an iterable
    handles(getattr(set, _name))(_update(getattr(set, _name), members=True))


@handles(set.add)
def _set_add(tx, args, kwargs):
    set_add(tx, args[0], args[1])
    return V.Constant(None)


def _set_operator(op, in_place=None):
    def handle(tx, a, b):
        if not isinstance(b, V.SetVar) and op in (operator.eq, operator.ne):
            return V.Constant(op is operator.ne)
        if not isinstance(b, V.SetVar):
            tx.raise_(TypeError, f"unsupported operand type(s) for {op.__name__}: "
                                 f"'{a.python_type().__name__}' and '{b.python_type().__name__}'")
        if in_place is not None and issubclass(a.cls, set):
            return _update(in_place)(tx, [a, b], {})
        return _algebra(op)(tx, [a, b], {})
    return handle


for _op, _iop, _method in [(operator.or_, operator.ior, set.__ior__), (operator.and_, operator.iand, set.__iand__),
                           (operator.sub, operator.isub, set.__isub__), (operator.xor, operator.ixor, set.__ixor__)]:
    SEQUENCE_OPS[(V.SetVar, _op)] = _set_operator(_op)
    SEQUENCE_OPS[(V.SetVar, _iop)] = _set_operator(_op, _method)
for _op in (operator.le, operator.lt, operator.ge, operator.gt, operator.eq, operator.ne):
    SEQUENCE_OPS[(V.SetVar, _op)] = _set_operator(_op)


# -- the builtin containers' slots, called by name ----------------------------------------------------
# `set.__or__(p, q)`, `list.__getitem__(l, i)`, `x.__contains__(y)`, and `super().__setitem__(k, v)`
# inside a subclass's own method: the builtin's model, past any subclass method
# ([Note: subclasses of builtin containers]). A binary slot answers NotImplemented for an operand of
# another family where CPython's does (comparisons; set algebra; dict's `|`), so the operator it
# stands for can try the other side.
_FAMILIES = ((set, frozenset), (list,), (tuple,), (collections.deque,), (dict,))
_SLOT_OPERATORS = {f"__{op.__name__.strip('_')}__": op for op in (
    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.or_, operator.and_,
    operator.sub, operator.xor, operator.add, operator.mul, operator.ior, operator.iand, operator.isub,
    operator.ixor, operator.iadd, operator.imul)}
_REFLECTED_SLOTS = {"__ror__": operator.or_, "__rand__": operator.and_, "__rsub__": operator.sub,
                    "__rxor__": operator.xor, "__rmul__": operator.mul}
_COMPARISONS = {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"}


def _family(cls: type):
    return next((f for f in _FAMILIES if issubclass(cls, f)), None)


def _answers_not_implemented(owner: type, name: str, other: V.Variable) -> bool:
    if _family(owner) == _family(other.python_type()):
        return False
    return name in _COMPARISONS or _family(owner) == (set, frozenset) or \
        owner is dict and name in ("__or__", "__ror__")


def _binary_slot(owner, name):
    op = _SLOT_OPERATORS.get(name) or _REFLECTED_SLOTS[name]
    reflected = name in _REFLECTED_SLOTS

    def handle(tx, args, kwargs):
        from kiln.capture.semantics import binary_op
        this, other = args
        if _answers_not_implemented(owner, name, other):
            return V.Constant(NotImplemented)
        return binary_op(tx, op, *((other, this) if reflected else (this, other)), base=True)
    return handle


def _slot(name):
    from kiln.capture import semantics as S
    return {
        "__getitem__": lambda tx, args, kwargs: S.getitem(tx, args[0], args[1], base=True),
        "__setitem__": lambda tx, args, kwargs: S.setitem(tx, *args, base=True) or V.Constant(None),
        "__delitem__": lambda tx, args, kwargs: S.delitem(tx, *args, base=True) or V.Constant(None),
        "__contains__": lambda tx, args, kwargs: V.Constant(S.contains(tx, args[0], args[1], base=True)),
        "__len__": lambda tx, args, kwargs: V.Constant(len(args[0].items)),
        "__iter__": lambda tx, args, kwargs: S.get_iter(tx, args[0], base=True),
    }.get(name)


def _register_slots():
    from kiln.capture.callables import CALLABLES
    for owner in (list, tuple, dict, set, frozenset, collections.deque, collections.OrderedDict):
        for name, slot in vars(owner).items():
            if slot in CALLABLES:
                continue
            handler = _binary_slot(owner, name) if name in _SLOT_OPERATORS or name in _REFLECTED_SLOTS \
                else _slot(name)
            if handler is not None:
                handles(slot)(handler)


_register_slots()


@handles(list.__new__, set.__new__)
def _empty_new(tx, args, kwargs):
    """`list.__new__(cls, ...)`, `set.__new__(cls, ...)`: an empty instance (their __init__ fills it)."""
    cls = python_value(args[0])
    return V.ListVar([], cls) if issubclass(cls, list) else V.SetVar(set(), {}, cls)


@handles(frozenset.__new__)
def _frozenset_new(tx, args, kwargs):
    """`frozenset.__new__(cls, iterable)`: a frozenset's members are fixed when it is made."""
    made = _set_of(frozenset)(tx, args[1:], kwargs)
    made.cls = python_value(args[0])
    return made


@handles(list.__init__)
def _list_init(tx, args, kwargs):
    items = iterate(tx, args[1]) if len(args) > 1 else []
    mutate_list(tx, args[0], lambda own: own.__setitem__(slice(None), items))
    return V.Constant(None)


@handles(set.__init__)
def _set_init(tx, args, kwargs):
    s = args[0]
    s.keys.clear()
    s.members.clear()
    if len(args) > 1:
        _update(set.update)(tx, [s, args[1]], {})
    _record_mutation(tx, s)
    return V.Constant(None)
