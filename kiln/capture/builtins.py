"""Python builtins and container methods over trackers: one handler per callable.

`BUILTINS` maps builtin functions and types (`len`, `isinstance`, `zip`, `list`, ...) and
`CONTAINER_METHODS` maps the methods of list/dict/set/tuple (`list.append`, `dict.items`, ...) to
handlers `(tx, args, kwargs) -> tracker`. `PURE_CALLABLES` says which other C callables (math,
operator, methods of immutable values) may be folded when their arguments are constants.
"""
from __future__ import annotations

import builtins
import collections
import functools
import itertools
import math
import operator
import types

import torch

from kiln.capture import variables as V
from kiln.capture.interpreter import ObservedException
from kiln.capture.views import advance
from kiln.capture.semantics import (binary_op, constant_of, contains, is_python_constant, iterate, key_of,
                                    mutate_list, python_value, set_add, truth, dict_set, _record_mutation)

BUILTINS: dict = {}
CONTAINER_METHODS: dict = {}


def builtin(*fns, table=BUILTINS):
    def register(handler):
        for fn in fns:
            table[fn] = handler
        return handler
    return register


def _all_constant(args, kwargs):
    return all(is_python_constant(a) for a in args) and all(is_python_constant(v) for v in kwargs.values())


def _fold(tx, fn, args, kwargs):
    try:
        result = fn(*[python_value(a) for a in args], **{k: python_value(v) for k, v in kwargs.items()})
    except Exception as e:
        tx.raise_(type(e), str(e))
    return constant_of(tx, result)


def _foldable(fn, otherwise=None):
    """A builtin folded over constants; `otherwise(tx, args, kwargs)` handles the rest."""
    def handle(tx, args, kwargs):
        if _all_constant(args, kwargs):
            return _fold(tx, fn, args, kwargs)
        if otherwise is None:
            raise tx.unsupported(f"{fn.__name__}() on values known only at run time")
        return otherwise(tx, args, kwargs)
    return handle


# -- sizes, types, attributes -----------------------------------------------------------------------
@builtin(len)
def _len(tx, args, kwargs):
    v = args[0]
    if isinstance(v, (V.ListVar, V.TupleVar, V.SetVar, V.DictVar)):
        return V.Constant(len(v.items))
    if isinstance(v, V.DictViewVar):
        return V.Constant(len(v.dict.items))
    if isinstance(v, V.TensorVar):
        if v.example.dim() == 0:
            tx.raise_(TypeError, "len() of a 0-d tensor")
        from kiln.capture.torch_calls import tensor_method
        return tensor_method(tx, "size", [v, V.Constant(0)], {})
    if isinstance(v, V.Constant):
        return _fold(tx, len, args, kwargs)
    if isinstance(v, V.ObjectVar) and isinstance(v.value, torch.nn.Module):
        return V.Constant(len(v.value))
    if isinstance(v, V.IteratorVar):
        tx.raise_(TypeError, "object of type 'iterator' has no len()")
    from kiln.capture.attributes import getattr_var
    return tx.call(getattr_var(tx, v, "__len__"), [])


def _type_of(v: V.Variable) -> type:
    if isinstance(v, V.ObjectVar):
        return type(v.value)
    return v.python_type()


@builtin(isinstance)
def _isinstance(tx, args, kwargs):
    obj, classes = args
    cls = python_value(classes)
    t = _type_of(obj)
    if isinstance(obj, V.IteratorVar):
        return V.Constant(isinstance(iter(()), cls) or cls in (types.GeneratorType,))
    return V.Constant(issubclass(t, cls))


@builtin(issubclass)
def _issubclass(tx, args, kwargs):
    return _fold(tx, issubclass, args, kwargs)


@builtin(type)
def _type(tx, args, kwargs):
    if len(args) != 1:
        raise tx.unsupported("creating a class with type(name, bases, dict) inside captured code")
    return V.ObjectVar(_type_of(args[0]))


@builtin(getattr)
def _getattr(tx, args, kwargs):
    from kiln.capture.attributes import getattr_var
    name = python_value(args[1])
    try:
        return getattr_var(tx, args[0], name)
    except ObservedException as e:
        if len(args) > 2 and issubclass(e.exc.cls, AttributeError):
            return args[2]
        raise


@builtin(hasattr)
def _hasattr(tx, args, kwargs):
    from kiln.capture.attributes import getattr_var
    try:
        getattr_var(tx, args[0], python_value(args[1]))
        return V.Constant(True)
    except ObservedException as e:
        if issubclass(e.exc.cls, AttributeError):
            return V.Constant(False)
        raise


@builtin(setattr)
def _setattr(tx, args, kwargs):
    from kiln.capture.attributes import setattr_var
    setattr_var(tx, args[0], python_value(args[1]), args[2])
    return V.Constant(None)


@builtin(callable)
def _callable(tx, args, kwargs):
    v = args[0]
    if isinstance(v, (V.FunctionVar, V.MethodVar, V.PartialVar)):
        return V.Constant(True)
    if isinstance(v, (V.ObjectVar, V.Constant)):
        return V.Constant(callable(python_value(v)))
    return V.Constant(any("__call__" in k.__dict__ for k in _type_of(v).__mro__))


@builtin(id)
def _id(tx, args, kwargs):
    if isinstance(args[0], V.ObjectVar):
        return V.Constant(id(args[0].value))
    raise tx.unsupported("id() of a value made inside captured code")


# -- iteration --------------------------------------------------------------------------------------
@builtin(iter)
def _iter(tx, args, kwargs):
    from kiln.capture.semantics import get_iter
    return get_iter(tx, args[0])


@builtin(next)
def _next(tx, args, kwargs):
    it = args[0]
    if not isinstance(it, V.IteratorVar):
        raise tx.unsupported(f"next() on a {it.python_type().__name__}")
    item = advance(tx, it)
    if item is None:
        if len(args) > 1:
            return args[1]
        tx.raise_(StopIteration)
    return item


@builtin(range)
def _range(tx, args, kwargs):
    return _fold(tx, range, args, kwargs)


@builtin(enumerate)
def _enumerate(tx, args, kwargs):
    start = python_value(args[1] if len(args) > 1 else kwargs.get("start", V.Constant(0)))
    return V.IteratorVar([V.TupleVar([V.Constant(i), x]) for i, x in enumerate(iterate(tx, args[0]), start)])


@builtin(zip)
def _zip(tx, args, kwargs):
    columns = [iterate(tx, a) for a in args]
    if kwargs.get("strict") is not None and python_value(kwargs["strict"]) and len({len(c) for c in columns}) > 1:
        tx.raise_(ValueError, "zip() arguments have different lengths")
    return V.IteratorVar([V.TupleVar(list(row)) for row in zip(*columns)])


@builtin(map)
def _map(tx, args, kwargs):
    fn, columns = args[0], [iterate(tx, a) for a in args[1:]]
    return V.IteratorVar([tx.call(fn, list(row)) for row in zip(*columns)])


@builtin(filter)
def _filter(tx, args, kwargs):
    fn, items = args[0], iterate(tx, args[1])
    keep = (lambda x: truth(tx, x)) if isinstance(fn, V.Constant) and fn.value is None \
        else (lambda x: truth(tx, tx.call(fn, [x])))
    return V.IteratorVar([x for x in items if keep(x)])


@builtin(reversed)
def _reversed(tx, args, kwargs):
    return V.IteratorVar(list(reversed(iterate(tx, args[0]))))


@builtin(sorted)
def _sorted(tx, args, kwargs):
    items = iterate(tx, args[0])
    key = kwargs.get("key")
    reverse = python_value(kwargs.get("reverse", V.Constant(False)))
    keys = [python_value(tx.call(key, [x]) if key is not None and not is_none_var(key) else x) for x in items]
    order = sorted(range(len(items)), key=lambda i: keys[i], reverse=reverse)
    return V.ListVar([items[i] for i in order])


def is_none_var(v):
    return isinstance(v, V.Constant) and v.value is None


@builtin(list)
def _list(tx, args, kwargs):
    return V.ListVar(iterate(tx, args[0]) if args else [])


@builtin(tuple)
def _tuple(tx, args, kwargs):
    return V.TupleVar(iterate(tx, args[0]) if args else [])


@builtin(set, frozenset)
def _set(tx, args, kwargs):
    s = V.SetVar([])
    for item in (iterate(tx, args[0]) if args else []):
        set_add(tx, s, item)
    return s


@builtin(dict)
def _dict(tx, args, kwargs, cls=dict):
    from kiln.capture.semantics import dict_items
    d = V.DictVar({}, cls)
    if args:
        if isinstance(args[0], (V.DictVar, V.ObjectVar)):
            d.items.update(dict(dict_items(tx, args[0])))
        else:
            for pair in iterate(tx, args[0]):
                k, v = iterate(tx, pair)
                d.items[key_of(tx, k)] = v
    d.items.update(kwargs)
    return d


BUILTINS[collections.OrderedDict] = functools.partial(_dict, cls=collections.OrderedDict)


@builtin(sum)
def _sum(tx, args, kwargs):
    total = args[1] if len(args) > 1 else kwargs.get("start", V.Constant(0))
    for item in iterate(tx, args[0]):
        total = binary_op(tx, operator.add, total, item)
    return total


def _reduce_compare(op):
    def handle(tx, args, kwargs):
        items = iterate(tx, args[0]) if len(args) == 1 else list(args)
        if not items:
            tx.raise_(ValueError, "arg is an empty sequence")
        if all(is_python_constant(i) for i in items) and "key" not in kwargs:
            return _fold(tx, op, [V.TupleVar(items)], {})
        raise tx.unsupported(f"{op.__name__}() over values known only at run time "
                             "(for tensors use torch.maximum/torch.minimum)")
    return handle


BUILTINS[max] = _reduce_compare(max)
BUILTINS[min] = _reduce_compare(min)


@builtin(any)
def _any(tx, args, kwargs):
    return V.Constant(any(truth(tx, x) for x in iterate(tx, args[0])))


@builtin(all)
def _all(tx, args, kwargs):
    return V.Constant(all(truth(tx, x) for x in iterate(tx, args[0])))


# -- numbers and strings ----------------------------------------------------------------------------
def _tensor_op(op):
    def handle(tx, args, kwargs):
        from kiln.capture.torch_calls import call_torch
        if any(isinstance(a, V.TensorVar) for a in args):
            return call_torch(tx, "call_function", op, args, kwargs)
        raise tx.unsupported(f"{op.__name__}() on values known only at run time")
    return handle


BUILTINS[abs] = _foldable(abs, _tensor_op(operator.abs))
BUILTINS[pow] = _foldable(pow, _tensor_op(operator.pow))
BUILTINS[round] = _foldable(round, _tensor_op(round))
BUILTINS[divmod] = _foldable(divmod)
for _fn in (str, repr, format, chr, ord, hash, ascii, bin, hex, oct, complex, slice):
    BUILTINS[_fn] = _foldable(_fn)


def _needs_data(name):
    def handle(tx, args, kwargs):
        if _all_constant(args, kwargs):
            return _fold(tx, getattr(builtins, name), args, kwargs)
        raise tx.unsupported(f"{name}() of a tensor reads its data, which a graph cannot hand back to Python")
    return handle


for _name in ("int", "float"):
    BUILTINS[getattr(builtins, _name)] = _needs_data(_name)


@builtin(bool)
def _bool(tx, args, kwargs):
    """Python's truth rule (`truth`): a container of tensors is true when not empty."""
    from kiln.capture.semantics import truth
    if args and isinstance(args[0], V.TensorVar):
        raise tx.unsupported("bool() of a tensor reads its data, which a graph cannot hand back to Python")
    return V.Constant(bool(args) and truth(tx, args[0]))


@builtin(print)
def _print(tx, args, kwargs):
    raise tx.unsupported("print() has a side effect outside the graph")


@builtin(super)
def _super(tx, args, kwargs):
    if args:
        return V.SuperVar(python_value(args[0]), args[1])
    cell = tx.cells.get("__class__")
    if cell is None or tx.code.co_argcount == 0:
        raise tx.unsupported("super() without arguments outside a method")
    first = tx.code.co_varnames[0]
    self_var = tx.locals.get(first) or (tx.cells[first].contents if first in tx.cells else None)
    return V.SuperVar(python_value(cell.contents), self_var)


@builtin(object)
def _object(tx, args, kwargs):
    return V.NewObjectVar(object, {})


@builtin(functools.partial)
def _partial(tx, args, kwargs):
    return V.PartialVar(args[0], list(args[1:]), dict(kwargs))


@builtin(functools.reduce)
def _reduce(tx, args, kwargs):
    fn, items = args[0], iterate(tx, args[1])
    acc = args[2] if len(args) > 2 else items.pop(0)
    for item in items:
        acc = tx.call(fn, [acc, item])
    return acc


@builtin(itertools.chain)
def _chain(tx, args, kwargs):
    return V.IteratorVar([x for a in args for x in iterate(tx, a)])


@builtin(itertools.product)
def _product(tx, args, kwargs):
    columns = [iterate(tx, a) for a in args]
    return V.IteratorVar([V.TupleVar(list(row)) for row in itertools.product(*columns)])


@builtin(itertools.islice)
def _islice(tx, args, kwargs):
    items = iterate(tx, args[0])
    return V.IteratorVar(items[slice(*[python_value(a) for a in args[1:]])])


@builtin(itertools.accumulate)
def _accumulate(tx, args, kwargs):
    items, out = iterate(tx, args[0]), []
    fn = args[1] if len(args) > 1 else None
    for item in items:
        out.append(item if not out else (tx.call(fn, [out[-1], item]) if fn else
                                         binary_op(tx, operator.add, out[-1], item)))
    return V.IteratorVar(out)


@builtin(itertools.repeat)
def _repeat(tx, args, kwargs):
    if len(args) < 2:
        raise tx.unsupported("itertools.repeat without a count")
    return V.IteratorVar([args[0]] * python_value(args[1]))


@builtin(itertools.pairwise) if hasattr(itertools, "pairwise") else (lambda f: f)
def _pairwise(tx, args, kwargs):
    items = iterate(tx, args[0])
    return V.IteratorVar([V.TupleVar([a, b]) for a, b in zip(items, items[1:])])


# -- the operator module: the same semantics as the bytecode operators ----------------------------------
def _operator_binary(op):
    return lambda tx, args, kwargs: binary_op(tx, op, args[0], args[1])


def _operator_unary(op):
    from kiln.capture.semantics import unary_op
    return lambda tx, args, kwargs: unary_op(tx, op, args[0])


def _install_operator_module():
    from kiln.capture.semantics import BINARY_OPS, COMPARE_OPS, getitem, setitem
    for op in [*BINARY_OPS, *COMPARE_OPS.values()]:
        BUILTINS[op] = _operator_binary(op)
    for op in (operator.neg, operator.pos, operator.invert, operator.abs):
        BUILTINS[op] = _operator_unary(op)
    BUILTINS[operator.getitem] = lambda tx, args, kwargs: getitem(tx, args[0], args[1])
    BUILTINS[operator.setitem] = lambda tx, args, kwargs: setitem(tx, *args) or V.Constant(None)
    BUILTINS[operator.not_] = lambda tx, args, kwargs: V.Constant(not truth(tx, args[0]))
    BUILTINS[operator.truth] = lambda tx, args, kwargs: V.Constant(truth(tx, args[0]))
    BUILTINS[operator.contains] = lambda tx, args, kwargs: V.Constant(contains(tx, args[0], args[1]))


_install_operator_module()


# -- container methods ------------------------------------------------------------------------------
def method(*fns):
    return builtin(*fns, table=CONTAINER_METHODS)


@method(list.append)
def _append(tx, args, kwargs):
    mutate_list(tx, args[0], lambda items: items.append(args[1]))
    return V.Constant(None)


@method(list.extend)
def _extend(tx, args, kwargs):
    new = iterate(tx, args[1])
    mutate_list(tx, args[0], lambda items: items.extend(new))
    return V.Constant(None)


@method(list.insert)
def _insert(tx, args, kwargs):
    mutate_list(tx, args[0], lambda items: items.insert(python_value(args[1]), args[2]))
    return V.Constant(None)


@method(list.pop)
def _list_pop(tx, args, kwargs):
    index = python_value(args[1]) if len(args) > 1 else -1
    if not args[0].items:
        tx.raise_(IndexError, "pop from empty list")
    out = args[0].items[index]
    mutate_list(tx, args[0], lambda items: items.pop(index))
    return out


@method(list.clear, dict.clear, collections.OrderedDict.clear)
def _clear(tx, args, kwargs):
    c = args[0]
    c.items.clear()
    _record_mutation(tx, c)
    return V.Constant(None)


@method(list.reverse)
def _list_reverse(tx, args, kwargs):
    mutate_list(tx, args[0], lambda items: items.reverse())
    return V.Constant(None)


@method(list.copy)
def _list_copy(tx, args, kwargs):
    return V.ListVar(list(args[0].items))


@method(list.index, tuple.index)
def _index(tx, args, kwargs):
    for i, item in enumerate(args[0].items):
        if truth(tx, binary_op(tx, operator.eq, item, args[1])):
            return V.Constant(i)
    tx.raise_(ValueError, "value is not in list")


@method(list.count, tuple.count)
def _count(tx, args, kwargs):
    return V.Constant(sum(truth(tx, binary_op(tx, operator.eq, i, args[1])) for i in args[0].items))


@method(list.remove)
def _remove(tx, args, kwargs):
    i = _index(tx, args, kwargs).value
    mutate_list(tx, args[0], lambda items: items.pop(i))
    return V.Constant(None)


@method(list.sort)
def _sort(tx, args, kwargs):
    ordered = _sorted(tx, [args[0]], kwargs).items
    mutate_list(tx, args[0], lambda items: items.__setitem__(slice(None), ordered))
    return V.Constant(None)


@method(dict.get)
def _dict_get(tx, args, kwargs):
    d, key = args[0], key_of(tx, args[1])
    return d.items.get(key, args[2] if len(args) > 2 else V.Constant(None))


@method(dict.items, collections.OrderedDict.items)
def _dict_items(tx, args, kwargs):
    return V.DictViewVar(args[0], "items")


@method(dict.keys, collections.OrderedDict.keys)
def _dict_keys(tx, args, kwargs):
    return V.DictViewVar(args[0], "keys")


@method(dict.values, collections.OrderedDict.values)
def _dict_values(tx, args, kwargs):
    return V.DictViewVar(args[0], "values")


@method(dict.update, collections.OrderedDict.update)
def _dict_update(tx, args, kwargs):
    from kiln.capture.semantics import dict_items
    d = args[0]
    pairs = dict_items(tx, args[1]) if len(args) > 1 else []
    for k, v in [*pairs, *kwargs.items()]:
        dict_set(tx, d, V.Constant(k), v)
    return V.Constant(None)


@method(dict.pop, collections.OrderedDict.pop)
def _dict_pop(tx, args, kwargs):
    d, key = args[0], key_of(tx, args[1])
    if key not in d.items:
        if len(args) > 2:
            return args[2]
        tx.raise_(KeyError, key)
    _record_mutation(tx, d)
    return d.items.pop(key)


@method(dict.setdefault, collections.OrderedDict.setdefault)
def _dict_setdefault(tx, args, kwargs):
    d, key = args[0], key_of(tx, args[1])
    if key not in d.items:
        dict_set(tx, d, args[1], args[2] if len(args) > 2 else V.Constant(None))
    return d.items[key]


@method(dict.copy, collections.OrderedDict.copy)
def _dict_copy(tx, args, kwargs):
    return V.DictVar(dict(args[0].items), args[0].cls)


@method(dict.__contains__, list.__contains__, tuple.__contains__, set.__contains__)
def _contains(tx, args, kwargs):
    return V.Constant(contains(tx, args[0], args[1]))


@method(dict.__getitem__, list.__getitem__, tuple.__getitem__)
def _getitem(tx, args, kwargs):
    from kiln.capture.semantics import getitem
    if isinstance(args[0], V.ObjectVar):  # `super().__getitem__(k)` in a subclass's own __getitem__
        from kiln.capture.attributes import builtin_getitem
        return builtin_getitem(tx, args[0], args[1])
    return getitem(tx, args[0], args[1])


@method(dict.__setitem__, collections.OrderedDict.__setitem__, list.__setitem__)
def _setitem(tx, args, kwargs):
    from kiln.capture.semantics import setitem
    setitem(tx, args[0], args[1], args[2])
    return V.Constant(None)


@method(set.add)
def _set_add(tx, args, kwargs):
    set_add(tx, args[0], args[1])
    return V.Constant(None)


@method(set.update)
def _set_update(tx, args, kwargs):
    for other in args[1:]:
        for item in iterate(tx, other):
            set_add(tx, args[0], item)
    return V.Constant(None)


@method(object.__init__)
def _object_init(tx, args, kwargs):
    return V.Constant(None)


@method(object.__setattr__)
def _object_setattr(tx, args, kwargs):
    from kiln.capture.attributes import setattr_var
    setattr_var(tx, args[0], python_value(args[1]), args[2])
    return V.Constant(None)


_PURE_MODULES = {"math", "cmath", "operator", "_operator"}
_IMMUTABLE = (str, int, float, bytes, tuple, bool, complex, torch.Size, torch.dtype, torch.device, frozenset,
              type(None))


def PURE_CALLABLES(fn) -> bool:
    """C callables safe to run at capture time on constant arguments."""
    owner = getattr(fn, "__self__", None)
    return getattr(owner, "__name__", None) in _PURE_MODULES or isinstance(owner, _IMMUTABLE)
