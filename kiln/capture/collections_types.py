"""`collections` over trackers: deque, defaultdict, OrderedDict's own methods, namedtuples.

A deque is a `ListVar` whose `cls` is `collections.deque` (with its `maxlen`); a defaultdict is a
`DictVar` whose `cls` is `collections.defaultdict` (with its `default_factory`, called by a missing
key in `semantics.getitem`). Both are mutated in place, so aliases see every change.

[Note: deques run for real on tokens] A deque method's effect on the order of the items never
depends on the items' values: `rotate`, `appendleft` on a full deque, `extendleft`'s reversal,
`insert` past `maxlen`. So kiln runs the real method on a real deque of tokens (one token per item
tracker, same `maxlen`), reads back the order of the tokens, and maps them to trackers. The table
`_DEQUE_METHODS` says, per method, which arguments are items, iterables of items or constants, so
Python itself decides every result, error and edge case. Methods that compare items (`index`,
`count`, `remove`, `in`) compare trackers and are in `containers.py` with list's.

namedtuple classes are Python code kiln inlines (`_make`, `_replace`, `_asdict`); what they reach
in C is `tuple.__new__`, modelled here. A class that `collections.namedtuple` makes inside captured
code is made for real while tracing.
"""
from __future__ import annotations

import collections
import operator

from kiln.capture import variables as V
from kiln.capture.callables import ATTRIBUTES, handles
from kiln.capture.containers import dict_of
from kiln.capture.generators import advance
from kiln.capture.iterators import Token
from kiln.capture.keys import key_of
from kiln.capture.semantics import SEQUENCE_OPS, _record_mutation, iterate
from kiln.capture.constants import python_value

deque = collections.deque


# -- deque ----------------------------------------------------------------------------------------------
def new_deque(items: list, maxlen: int | None) -> V.ListVar:
    real = deque(range(len(items)), maxlen)
    return V.ListVar([items[i] for i in real], deque, maxlen)


@handles(deque)
def _deque(tx, args, kwargs):
    names = ("iterable", "maxlen")
    given = {**dict(zip(names, args)), **kwargs}
    maxlen = python_value(given["maxlen"]) if "maxlen" in given else None
    if maxlen is not None and (not isinstance(maxlen, int) or maxlen < 0):
        tx.raise_(ValueError, "maxlen must be non-negative")
    return new_deque(iterate(tx, given["iterable"]) if "iterable" in given else [], maxlen)


def run_on_tokens(tx, d: V.ListVar, method, spec: str, args: list, returns: str):
    """[Note: deques run for real on tokens]. `spec` has one letter per argument after the deque:
    `i` an item, `I` an iterable of items, `D` another deque, `c` a constant. `returns`: `item`, `deque`
    or `value` (a constant)."""
    real = deque((Token(v) for v in d.items), d.maxlen)
    real_args = []
    for kind, a in zip(spec, args):
        if kind == "i":
            real_args.append(Token(a))
        elif kind == "I":
            real_args.append([Token(v) for v in iterate(tx, a)])
        elif kind == "D":
            if a.python_type() is not deque:
                tx.raise_(TypeError, f'can only concatenate deque (not "{a.python_type().__name__}") to deque')
            real_args.append(deque(Token(v) for v in a.items))
        else:
            real_args.append(python_value(a))
    before = list(d.items)
    try:
        result = method(real, *real_args)
    except (IndexError, ValueError, TypeError, RuntimeError) as e:
        tx.raise_(type(e), *e.args)
    d.items[:] = [t.var for t in real]
    if d.items != before or len(d.items) != len(before):
        _record_mutation(tx, d)
    if returns == "item":
        return result.var
    if returns == "deque":
        return V.ListVar([t.var for t in result], deque, result.maxlen)
    if returns == "self":
        return d
    return V.Constant(result)


# method: (argument kinds, what it returns)
_DEQUE_METHODS = {
    deque.append: ("i", "value"), deque.appendleft: ("i", "value"),
    deque.extend: ("I", "value"), deque.extendleft: ("I", "value"),
    deque.pop: ("", "item"), deque.popleft: ("", "item"),
    deque.rotate: ("c", "value"), deque.reverse: ("", "value"), deque.clear: ("", "value"),
    deque.insert: ("ci", "value"), deque.copy: ("", "deque"), deque.__copy__: ("", "deque"),
    deque.__getitem__: ("c", "item"), deque.__setitem__: ("ci", "value"), deque.__delitem__: ("c", "value"),
}


# deque's extend steps an iterator one item at a time, adding each before it asks for the next (a
# generator that reads the deque sees it grow), as list.extend does (`semantics.extend_list`)
_ONE_AT_A_TIME = {deque.extend: deque.append, deque.extendleft: deque.appendleft, operator.iadd: deque.append}


def _deque_method(method, spec, returns):
    def handle(tx, args, kwargs):
        if method in _ONE_AT_A_TIME and len(args) == 2 and isinstance(args[1], (V.GeneratorVar, V.LazyIteratorVar)):
            while (item := advance(tx, args[1])) is not None:
                run_on_tokens(tx, args[0], _ONE_AT_A_TIME[method], "i", [item], "value")
            return args[0] if returns == "self" else V.Constant(None)
        return run_on_tokens(tx, args[0], method, spec, args[1:], returns)
    return handle


for _method, (_spec, _returns) in _DEQUE_METHODS.items():
    handles(_method)(_deque_method(_method, _spec, _returns))

# operators: `d + e`, `d * n`, `d += items`, `d *= n` (the in-place ones keep the same deque)
for _op, _spec, _returns in [(operator.add, "D", "deque"), (operator.mul, "c", "deque"),
                             (operator.iadd, "I", "self"), (operator.imul, "c", "self")]:
    SEQUENCE_OPS[(deque, _op)] = (lambda op, spec, returns: lambda tx, a, b: _deque_method(op, spec, returns)(
        tx, [a, b], {}))(_op, _spec, _returns)
ATTRIBUTES[(deque, "maxlen")] = lambda tx, d: V.Constant(d.maxlen)


# -- defaultdict and OrderedDict ------------------------------------------------------------------------
@handles(collections.defaultdict)
def _defaultdict(tx, args, kwargs):
    factory = args[0] if args else V.Constant(None)
    if isinstance(factory, V.Constant) and factory.value is None:
        factory = None
    elif isinstance(factory, V.Constant):
        tx.raise_(TypeError, "first argument must be callable or None")
    return dict_of(tx, collections.defaultdict, args[1:], kwargs, default_factory=factory)


ATTRIBUTES[(collections.defaultdict, "default_factory")] = \
    lambda tx, d: d.default_factory if d.default_factory is not None else V.Constant(None)
@handles(collections.OrderedDict.move_to_end)
def _move_to_end(tx, args, kwargs):
    d = args[0]
    key = key_of(tx, args[1])
    last = python_value(kwargs.get("last", args[2] if len(args) > 2 else V.Constant(True)))
    if key not in d.items:
        tx.raise_(KeyError, key)
    # the entry keeps its own key object, as Python's does (an equal key looked it up)
    key = next(k for k in d.items if k is key or hash(k) == hash(key) and k == key)
    value = d.items.pop(key)
    d.items = {key: value, **d.items} if not last else {**d.items, key: value}
    _record_mutation(tx, d)
    return V.Constant(None)


@handles(collections._count_elements)
def _count_elements(tx, args, kwargs):
    """Counter.update's C helper: `mapping[item] = mapping.get(item, 0) + 1` for each item."""
    from kiln.capture.semantics import binary_op, dict_set
    counts, items = args[0], iterate(tx, args[1])
    for item in items:
        old = counts.items.get(key_of(tx, item), V.Constant(0))
        dict_set(tx, counts, item, binary_op(tx, operator.add, old, V.Constant(1)))
    return V.Constant(None)


# -- namedtuple -----------------------------------------------------------------------------------------
@handles(collections.namedtuple)
def _namedtuple_class(tx, args, kwargs):
    """`collections.namedtuple("point", ["x", "y"])` inside captured code: the class is made for real
    while tracing (its name, fields and defaults are constants; its code is an `exec`, which capture
    does not follow), in the module of the code that calls it, as Python names it. The compiled
    code hands out instances of this one class, where each eager call makes a class of its own."""
    from kiln.capture.constants import constant_arguments
    if not constant_arguments(args, kwargs):
        raise tx.unsupported("collections.namedtuple with a name, fields or defaults known only at run time")
    values = {k: python_value(v) for k, v in kwargs.items()}
    values.setdefault("module", tx.f_globals.get("__name__", "__main__"))
    try:
        cls = collections.namedtuple(*[python_value(a) for a in args], **values)
    except (TypeError, ValueError) as e:
        tx.raise_(type(e), str(e))
    return V.ObjectVar(cls)


@handles(tuple.__new__)
def _tuple_new(tx, args, kwargs):
    """`tuple.__new__(cls, iterable)`, which a namedtuple's `_make` and `__new__` call."""
    cls = python_value(args[0])
    if kwargs or len(args) > 2:   # the arity or keyword error, worded by tuple's own C code
        try:
            tuple.__new__(cls, *[()] * (len(args) - 1), **dict.fromkeys(kwargs))
        except TypeError as e:
            tx.raise_(TypeError, str(e))
    # (a subclass with its own __init__ takes keywords, which tuple.__new__ then ignores)
    return V.TupleVar(iterate(tx, args[1]) if len(args) > 1 else [], cls)
