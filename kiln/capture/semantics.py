"""The Python data model over trackers: operators, truth, iteration, items, containers.

Each operation dispatches on tracker classes through small tables; values that are all constants
are computed by Python itself (constant folding), tensors go to the graph (`torch_calls.py`).
Attribute reads (`attributes.py`) sit below this module and calls (`calls.py`) above it: a call
from here goes through `tx.call` / `interpreter.call_variable`, the table `calls.py` fills.
"""
from __future__ import annotations

import collections
import operator
import types
from typing import Any

import torch

from kiln.capture import variables as V
from kiln.capture.attributes import (_function, call_overridden, call_user_method, class_lookup, dunder_binary,
                                     getattr_var,
                                     has_user_operator,
                                     iterate_object, object_contains, object_getitem, operator_dunders, overridden)
from kiln.capture.constants import constant_of, is_python_constant, is_same, python_value
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.interpreter import ObservedException, call_variable
from kiln.capture.keys import key_of, refuse_identity_member, set_member_key
from kiln.capture.model_outputs import getitem_position, is_model_output
from kiln.capture.output import ContainerMutation, DeferredCall, GlobalWrite
from kiln.capture.sources import GlobalSource
from kiln.capture.torch_calls import call_torch, tensor_method
from kiln.capture.generators import advance, is_user_iterator
from kiln.capture.views import items_of, view_iter

BINARY_OPS = [operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul, operator.mul,
              operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub, operator.truediv,
              operator.xor,
              operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul, operator.imul,
              operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub, operator.itruediv,
              operator.ixor]
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
               ">=": operator.ge}
_INPLACE_TO_PLAIN = {BINARY_OPS[13 + i]: BINARY_OPS[i] for i in range(13)}
_REFLECTED = {operator.add: "__radd__", operator.mul: "__rmul__", operator.sub: "__rsub__"}


# A family that brings its own tracker class (NumPy arrays: `numpy_calls.py`) registers here the
# object that answers the data model for it: `binary(tx, op, a, b)`, `unary(tx, op, v)`,
# `getitem(tx, obj, key)`, `setitem(tx, obj, key, value)`, `iterate(tx, v)`, `truth(tx, v)`.
VALUE_MODELS: dict[type, Any] = {}


# -- globals ------------------------------------------------------------------------------------
def load_global(tx, name: str) -> V.Variable:
    from kiln.capture.builder import wrap
    gname = tx.out.globals_name(tx.f_globals)
    cache = tx.out.__dict__.setdefault("global_vars", {})
    key = (gname, name)
    written = tx.out.__dict__.setdefault("attr_overlay", {}).get((id(tx.f_globals), name))
    if written is not None:
        return written
    if key in cache:
        return cache[key]
    if name in tx.f_globals:
        var = wrap(tx.out, tx.f_globals[name], GlobalSource(name, gname))
    else:
        builtins = tx.f_globals.get("__builtins__", __builtins__)
        builtins = builtins if isinstance(builtins, dict) else builtins.__dict__
        if name not in builtins:
            tx.raise_(NameError, f"name '{name}' is not defined")
        var = V.ObjectVar(builtins[name])
    cache[key] = var
    return var


# [Note: a module's globals are its attributes] A function's globals dict is its module's
# `__dict__`, so `global x; x = v` in one module and `mod.x` read in another are the same store:
# writes go to the frame's attribute overlay under the dict's id (what `attributes.overlay_id` keys
# a module by), where a module attribute read looks first, and a global read looks there before
# its cache, so `mod.x = v` is seen by a function of `mod` reading `x` too.
def store_global(tx, name: str, value: V.Variable):
    gname = tx.out.globals_name(tx.f_globals)
    tx.out.__dict__.setdefault("global_vars", {})[(gname, name)] = value
    tx.out.__dict__.setdefault("attr_overlay", {})[(id(tx.f_globals), name)] = value
    tx.out.side_effects.append(GlobalWrite(gname, name, value))


# -- containers ---------------------------------------------------------------------------------
def _record_mutation(tx, container: V.Variable):
    if container.source is not None:
        tx.out.side_effects.append(ContainerMutation(container))


def mutate_list(tx, lst: V.Variable, fn):
    if not isinstance(lst, V.ListVar):
        raise tx.unsupported(f"mutating a {lst.python_type().__name__} as a list")
    fn(lst.items)
    _record_mutation(tx, lst)


def set_add(tx, s: V.SetVar, item: V.Variable):
    key = key_of(tx, item)
    refuse_identity_member(tx, key)
    if key not in s.keys:
        s.keys.add(key)
        s.members[key] = item
        _record_mutation(tx, s)


def set_update(tx, s: V.SetVar, other: V.Variable):
    """`s |= other` member by member, except from a real set: Python copies a set's table, so its
    order is kept only by updating from the real set too (`{"a", "b", "c"}` compiles to an update
    from a constant frozenset)."""
    if isinstance(other, V.Constant) and isinstance(other.value, (set, frozenset)):
        other = constant_of(tx, other.value)
    if isinstance(other, V.SetVar):
        s.keys.update(other.keys)
        for k, t in other.members.items():
            s.members.setdefault(k, t)
        s.members = {k: s.members[k] for k in s.keys}
        _record_mutation(tx, s)
        return
    for item in iterate(tx, other):
        set_add(tx, s, item)


def dict_set(tx, d: V.Variable, key: V.Variable, value: V.Variable):
    if isinstance(d, V.MappingProxyVar):
        tx.raise_(TypeError, "'mappingproxy' object does not support item assignment")
    if not isinstance(d, V.DictVar):
        raise tx.unsupported(f"item assignment on a {d.python_type().__name__}")
    d.items[key_of(tx, key)] = value
    _record_mutation(tx, d)


def dict_items(tx, d: V.Variable) -> list[tuple[Any, V.Variable]]:
    if isinstance(d, V.DictVar):
        return list(d.items.items())
    if isinstance(d, V.ObjectVar) and isinstance(d.value, dict):
        from kiln.capture.builder import wrap
        return list(wrap(tx.out, d.value, d.source).items.items())
    if isinstance(d, (V.ObjectVar, V.NewObjectVar, V.MappingProxyVar)) and hasattr(d.python_type(), "keys"):
        # any other mapping, as Python unpacks it: its keys(), then `d[key]` for each
        from kiln.capture.attributes import getattr_var
        keys = iterate(tx, tx.call(getattr_var(tx, d, "keys"), []))
        if not all(is_python_constant(k) for k in keys):
            raise tx.unsupported(f"** of a {d.python_type().__name__} with keys known only at run time")
        return [(python_value(k), getitem(tx, d, k)) for k in keys]
    raise tx.unsupported(f"** of a {d.python_type().__name__}")


def make_slice(tx, parts: list) -> V.Variable:
    if all(is_python_constant(p) for p in parts):
        return V.Constant(slice(*[python_value(p) for p in parts]))
    if all(isinstance(p, (V.SymNumber, V.TensorVar)) or is_python_constant(p) for p in parts):
        # symbolic sizes: the slice goes into the graph as it is. Tensor bounds (`mask[start:end]`
        # over a cumsum) too: the op that reads them breaks the graph (their values are data), at
        # an instruction that runs natively, the slice rebuilt
        return V.SliceVar(list(parts))
    raise tx.unsupported("a slice with tensor bounds")


# -- iteration ----------------------------------------------------------------------------------
def iterate(tx, v: V.Variable, *, base: bool = False) -> list[V.Variable]:
    """All items of an iterable tracker, as trackers (kiln unrolls every loop). `base`: past a
    subclass's own `__iter__` ([Note: subclasses of builtin containers])."""
    if not base and (it := call_overridden(tx, v, "__iter__", [])) is not None:
        return iterate(tx, it)
    if type(v) in VALUE_MODELS:
        return VALUE_MODELS[type(v)].iterate(tx, v)
    if isinstance(v, (V.ListVar, V.TupleVar)):
        return list(v.items)
    if isinstance(v, V.ITERATORS):
        items = []
        while (item := advance(tx, v)) is not None:
            items.append(item)
        return items
    if isinstance(v, V.DictViewVar):
        return items_of(v)
    if isinstance(v, V.DictVar):
        return [V.key_var(k) for k in v.items]
    if isinstance(v, V.SetVar):
        return list(v.items)
    if isinstance(v, V.Constant) and isinstance(v.value, (range, str, bytes, tuple, torch.Size, frozenset)):
        return [V.Constant(x) for x in v.value]
    if isinstance(v, V.Constant) and isinstance(v.value, types.MappingProxyType):
        # a read-only view folded at trace time (`inspect.signature(fn).parameters`): its keys
        from kiln.capture.builder import wrap
        return [wrap(tx.out, k, None) for k in v.value]
    if isinstance(v, V.Constant) and not hasattr(type(v.value), "__iter__") and \
            not hasattr(type(v.value), "__getitem__"):
        tx.raise_(TypeError, f"'{type(v.value).__name__}' object is not iterable")
    if isinstance(v, V.TensorVar):
        n = v.example.size(0) if v.example.dim() else None
        if n is None:
            tx.raise_(TypeError, "iteration over a 0-d tensor")
        # one row per node, as Python's iteration over a tensor gives them (`Tensor.__iter__` is
        # `iter(self.unbind(0))`, whose rows are those views): a row taken alone is a node a later
        # graph can keep on its own, and the op count is the one torch.compile's graph has. As
        # `torch.select`, not `x[i]`: Python's indexing takes a device guard of the tensor's device
        # before any dispatch, which the CUDA path's stand-ins on a machine without CUDA refuse
        return [call_torch(tx, "call_function", torch.select, [v, V.Constant(0), V.Constant(i)], {}) for i in range(n)]
    if isinstance(v, V.ObjectVar):
        items = iterate_object(tx, v)
        return items if isinstance(items, list) else iterate(tx, items)
    if isinstance(v, V.NewObjectVar) and hasattr(v.cls, "__iter__"):
        it = tx.call(getattr_var(tx, v, "__iter__"), [])
        if it is v or is_user_iterator(it):   # a user's iterator: step its __next__ to the end
            if not is_user_iterator(it):
                tx.raise_(TypeError, f"iter() returned non-iterator of type '{it.python_type().__name__}'")
            items = []
            while (item := advance(tx, it)) is not None:
                items.append(item)
            return items
        return iterate(tx, it)
    raise tx.unsupported(f"iterating over a {v.python_type().__name__} is not supported")


def get_iter(tx, v: V.Variable, *, base: bool = False) -> V.Variable:
    if not base and (it := call_overridden(tx, v, "__iter__", [])) is not None:
        return it
    if isinstance(v, V.ITERATORS):
        return v
    if isinstance(v, V.DictViewVar):
        return view_iter(v)
    if isinstance(v, V.NewObjectVar) and hasattr(v.cls, "__iter__"):
        it = tx.call(getattr_var(tx, v, "__iter__"), [])
        if is_user_iterator(it):   # stepped lazily, as the loop asks
            return it
        return get_iter(tx, it)
    if isinstance(v, V.DictVar) and not is_model_output(v.cls):
        # CPython's dict iterator: it sees the dict change size (RuntimeError, a length hint of 0)
        return view_iter(V.DictViewVar(v, "keys"))
    hinted = v.python_type() in _HINTED or isinstance(v, V.Constant) and type(v.value) in _HINTED
    return V.IteratorVar(iterate(tx, v, base=True), hinted=hinted)


# containers whose iterators have `__length_hint__` (a generator, zip, map, enumerate have none)
_HINTED = (list, tuple, set, frozenset, dict, collections.OrderedDict, collections.defaultdict, range, str, bytes)


# -- truth, identity, membership ----------------------------------------------------------------
def truth(tx, v: V.Variable) -> bool:
    if type(v) in VALUE_MODELS:
        return VALUE_MODELS[type(v)].truth(tx, v)
    if isinstance(v, V.Constant):
        return bool(v.value)
    if isinstance(v, (V.ListVar, V.TupleVar, V.SetVar, V.DictVar)):
        if isinstance(class_lookup(v.python_type(), "__bool__"), types.FunctionType):
            return truth(tx, tx.call(getattr_var(tx, v, "__bool__"), []))  # a subclass's own rule
        return bool(v.items)
    if isinstance(v, V.DictViewVar):
        return bool(v.dict.items)
    if isinstance(v, V.SymNumber):
        return bool(v.example)  # a branch on a symbolic size: the ShapeEnv records the guard
    if isinstance(v, V.TensorVar) and "checked_truth" in v.node.meta:
        tx.out.side_effects.append(DeferredCall(require_true, (v, V.Constant(v.node.meta["checked_truth"])), ()))
        return True
    if isinstance(v, V.TensorVar):
        raise tx.unsupported("Python control flow on a tensor value (if/while/and/or/not on a tensor) "
                             "needs its data; use torch.where or move the branch out of the compiled code")
    if isinstance(v, (V.FunctionVar, V.MethodVar, V.PartialVar, V.ContextVar, V.ExceptionVar, V.SuperVar)):
        return True
    if isinstance(v, V.ObjectVar):
        return _object_truth(tx, v)
    if isinstance(v, V.NewObjectVar):
        for name in ("__bool__", "__len__"):
            if hasattr(v.cls, name):
                return _dunder_truth(tx, tx.call(getattr_var(tx, v, name), []), name)
        return True
    raise tx.unsupported(f"truth value of a {v.python_type().__name__}")


def _dunder_truth(tx, result: V.Variable, name: str) -> bool:
    """What a class's own `__bool__` (or `__len__`) returned, as Python's truth test reads it: a
    `__bool__` must return a bool (TypeError otherwise, as CPython raises)."""
    if name == "__bool__" and not (isinstance(result, V.Constant) and type(result.value) is bool) and \
            not (isinstance(result, V.SymNumber) and result.python_type() is bool):
        kind = result.python_type().__name__
        tx.raise_(TypeError, f"__bool__ should return bool, returned {kind}")
    return truth(tx, result)


def _object_truth(tx, v: V.ObjectVar) -> bool:
    """A real object's truth, by Python's rule. Modules and classes are guarded by identity and
    answer themselves. Otherwise the class's Python `__bool__` or `__len__` is followed (its reads
    guard themselves); a C one (a set, a dict held whole) reads the contents, so the answer is
    guarded; with neither, the object is true, which its type guard fixes."""
    obj = v.value
    if isinstance(obj, (type, types.ModuleType, torch.nn.Module)):
        return bool(obj)
    for name in ("__bool__", "__len__"):
        if isinstance(class_lookup(type(obj), name), types.FunctionType):
            return _dunder_truth(tx, tx.call(getattr_var(tx, v, name), []), name)
    value = bool(obj)
    if v.source is not None and any(hasattr(type(obj), n) for n in ("__bool__", "__len__")):
        tx.out.guard(Guard(GuardKind.TRUTH, v.source, value))
    return value


def check_after_graph(tx, holds: V.TensorVar, error: BaseException) -> None:
    """Capture assumes `holds` is true; the compiled program checks it after the graph ran and
    raises `error` (its type and message) at the user's line when it is not."""
    tx.out.side_effects.append(DeferredCall(require_true, (holds, V.Constant(tx.user_where()),
                                                           V.Constant(str(error)), V.Constant(type(error))), ()))


def require_true(value: torch.Tensor, where: str, message: str | None = None, error: type = ValueError):
    """Run after a graph: the check that capture assumed would pass (`calls._is_all_true`, or
    `torch_python.values_hold` with eager's own `error` and `message`)."""
    if not value:
        if message is not None:
            raise error(f"{message + ' ' if message else ''}(checked after the compiled graph ran; {where})")
        raise ValueError(f"a check on tensor values failed ({where}); it was assumed to pass while compiling, "
                         "as in eager this raises an error here")


def is_none(tx, v: V.Variable) -> bool:
    return isinstance(v, V.Constant) and v.value is None or isinstance(v, V.ObjectVar) and v.value is None


_REAL_CONTAINERS = (dict, list, tuple, set, frozenset)


def contains(tx, container: V.Variable, item: V.Variable, *, base: bool = False) -> bool:
    if not base and (found := call_overridden(tx, container, "__contains__", [item])) is not None:
        return truth(tx, found)
    if isinstance(container, V.DictVar):
        return key_of(tx, item) in container.items
    if isinstance(container, V.SetVar):
        return set_member_key(tx, item) in container.keys
    if isinstance(container, (V.ListVar, V.TupleVar)):
        return any(items_equal(tx, i, item) for i in container.items)
    if isinstance(container, V.DictViewVar):
        if container.kind == "keys":
            return contains(tx, container.dict, item)
        return any(items_equal(tx, i, item) for i in items_of(container))
    if isinstance(container, V.ObjectVar) and isinstance(container.value, _REAL_CONTAINERS) and \
            is_python_constant(item):
        return object_contains(tx, container, python_value(item))  # the read is guarded
    if (traced := call_user_method(tx, container, "__contains__", [item])) is not None:
        return truth(tx, traced)
    if is_python_constant(container) and is_python_constant(item):
        return python_value(item) in python_value(container)
    if isinstance(container, V.ObjectVar) and is_python_constant(item):
        return object_contains(tx, container, python_value(item))
    if isinstance(container, V.NewObjectVar) and hasattr(container.cls, "__contains__"):
        return truth(tx, tx.call(getattr_var(tx, container, "__contains__"), [item]))
    if isinstance(container, V.ITERATORS):
        # an iterator has no __contains__: Python steps it until an item equals (consuming it)
        while (i := advance(tx, container)) is not None:
            if items_equal(tx, i, item):
                return True
        return False
    raise tx.unsupported(f"`in` on a {container.python_type().__name__}")


# -- operators ----------------------------------------------------------------------------------
def binary_op(tx, op, a: V.Variable, b: V.Variable, *, base: bool = False) -> V.Variable:
    """`a op b`. `base`: past the operands' subclass methods ([Note: subclasses of builtin containers])."""
    if not base and (result := _subclass_operator(tx, op, a, b)) is not None:
        return result
    model = VALUE_MODELS.get(type(a)) or VALUE_MODELS.get(type(b))
    if model is not None:
        return model.binary(tx, op, a, b)
    if isinstance(a, (V.TensorVar, V.SymNumber)) or isinstance(b, (V.TensorVar, V.SymNumber)):
        if isinstance(a, V.TensorVar) and op in _INPLACE_TO_PLAIN:
            return call_torch(tx, "call_function", op, [a, b], {})
        return call_torch(tx, "call_function", _INPLACE_TO_PLAIN.get(op, op), [a, b], {})
    if op in _VIEW_COMPARISONS and isinstance(a, V.DictViewVar) and isinstance(b, V.DictViewVar):
        return V.Constant(_views_compare(tx, op, a, b))
    if has_user_operator(op, a, b):
        return dunder_binary(tx, op, a, b)
    views = isinstance(a, V.DictViewVar) or isinstance(b, V.DictViewVar)   # `d.keys() - {...}`: a fresh set
    if is_python_constant(a) and is_python_constant(b) and (views or not isinstance(a, _MUTABLE)
                                                            and not isinstance(b, _MUTABLE)):
        try:
            return constant_of(tx, op(python_value(a), python_value(b)))
        except Exception as e:
            tx.raise_(type(e), str(e))
    seq = SEQUENCE_OPS.get((a.python_type(), op)) or SEQUENCE_OPS.get((type(a), op))
    if seq is not None:
        return seq(tx, a, b)
    if op in (operator.mul, operator.imul) and is_python_constant(a):
        # `3 * [x]`: int's __mul__ declines, the sequence's __rmul__ repeats it (a new sequence,
        # also for `n *= [x]`)
        repeat = SEQUENCE_OPS.get((b.python_type(), operator.mul)) or SEQUENCE_OPS.get((type(b), operator.mul))
        if repeat is not None:
            return repeat(tx, b, a)
    if op in _ORDERINGS and _is_sequence(a) and _is_sequence(b):
        if _sequence_kind(a) != _sequence_kind(b):
            symbol = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}[op]
            tx.raise_(TypeError, f"'{symbol}' not supported between instances of '{a.python_type().__name__}' "
                                 f"and '{b.python_type().__name__}'")
        return _sequence_order(tx, op, a, b)
    if op in (operator.eq, operator.ne):
        answer = _user_eq(tx, op, a, b)
        if answer is not None:
            return answer
        same = _containers_equal(tx, a, b)
        return V.Constant(same if op is operator.eq else not same)
    if isinstance(a, V.NewObjectVar) or isinstance(b, V.NewObjectVar):
        return dunder_binary(tx, op, a, b)
    raise tx.unsupported(f"operator {op.__name__} on {a.python_type().__name__} and {b.python_type().__name__}")


_MUTABLE = (V.ListVar, V.DictVar, V.SetVar)  # operators on these keep aliasing: not folded

def _subclass_operator(tx, op, a, b) -> V.Variable | None:
    """`a op b` through the Python methods of a user's container subclass, in Python's order (the
    right operand first when its class is a subclass of the left's that overrides the reflected
    method); None when neither operand has one or every one answered NotImplemented."""
    if not _has_subclass_type(a) and not _has_subclass_type(b):
        return None
    name, reflected, plain = operator_dunders(op)
    attempts = []
    if plain is not None:
        attempts.append((a, name, b))
        name = plain
    right_first = type(b) is type(a) and b.python_type() is not a.python_type() and \
        issubclass(b.python_type(), a.python_type()) and overridden(b, reflected) is not None
    pair = [(b, reflected, a), (a, name, b)] if right_first else [(a, name, b), (b, reflected, a)]
    for receiver, method, other in attempts + pair:
        result = call_overridden(tx, receiver, method, [other])
        if result is not None and not V.is_not_implemented(result):
            return result
    return None


def _has_subclass_type(v) -> bool:
    return isinstance(v, (V.ListVar, V.TupleVar, V.SetVar, V.DictVar)) and \
        v.python_type().__module__ not in ("builtins", "collections")


def _is_sequence(v):
    return isinstance(v, (V.ListVar, V.TupleVar))


def items_equal(tx, x: V.Variable, y: V.Variable) -> bool:
    """`x == y` as containers compare items (PyObject_RichCompareBool): an item is equal to itself
    without calling its __eq__, so `t in [t]` needs no tensor data."""
    if x is y or isinstance(x, V.TensorVar) and isinstance(y, V.TensorVar) and x.example is y.example:
        return True
    return truth(tx, binary_op(tx, operator.eq, x, y))


def _user_eq(tx, op, a, b) -> V.Variable | None:
    """`a == b` / `a != b` through a user class's own __eq__ / __ne__ (a dataclass's too), the left
    operand's first, then the right's reflected, as Python tries them; None where neither has one
    (or both answer NotImplemented). A class with __eq__ and no __ne__ gets `not __eq__`."""
    for x, y in ((a, b), (b, a)):
        if not isinstance(x, (V.NewObjectVar, V.ObjectVar)):
            continue
        ne = class_lookup(x.python_type(), "__ne__") if op is operator.ne else None
        name = "__ne__" if isinstance(ne, types.FunctionType) else "__eq__"
        entry = class_lookup(x.python_type(), name)
        if not isinstance(entry, types.FunctionType):
            continue
        result = tx.call(V.MethodVar(_function(entry), x), [y])
        if V.is_not_implemented(result):
            continue
        return result if name == "__ne__" or op is operator.eq else V.Constant(not truth(tx, result))
    return None


def _containers_equal(tx, a, b) -> bool:
    """`a == b` where neither has an __eq__ of its own to call: sequences and dicts item by item,
    sets by their keys, anything else by identity."""
    a, b = (constant_of(tx, python_value(v)) if isinstance(v, V.Constant) and isinstance(v.value, (dict, set, frozenset))
            else v for v in (a, b))
    if _is_sequence(a):
        return _seq_eq(tx, a, b)
    if isinstance(a, V.DictVar) and isinstance(b, V.DictVar):
        return _dict_eq(tx, a, b)
    if isinstance(a, V.SetVar) and isinstance(b, V.SetVar):
        return a.keys == b.keys
    return is_same(tx, a, b)


def _dict_eq(tx, a: V.DictVar, b: V.DictVar) -> bool:
    # equal keys and equal values; two OrderedDicts also compare their keys' order
    if a.items.keys() != b.items.keys():
        return False
    if issubclass(a.cls, collections.OrderedDict) and issubclass(b.cls, collections.OrderedDict) \
            and list(a.items) != list(b.items):
        return False
    return all(items_equal(tx, a.items[k], b.items[k]) for k in a.items)


def _sequence_kind(v) -> type:
    """What a sequence compares as: a list (its subclasses too), a deque, a tuple."""
    if isinstance(v, V.ListVar):
        return collections.deque if issubclass(v.cls, collections.deque) else list
    return tuple


_ORDERINGS = (operator.lt, operator.le, operator.gt, operator.ge)
_VIEW_COMPARISONS = (operator.eq, operator.ne, *_ORDERINGS)


def _views_compare(tx, op, a: V.DictViewVar, b: V.DictViewVar) -> bool:
    """Two dict views compared as CPython's dictview_richcompare does: keys and items views as sets
    (lengths first, then each member of the smaller side looked up in the other; an items lookup
    compares the stored value with `==`, so a value's own __eq__ runs, and may raise); values views
    have no comparison but identity."""
    if a.kind == "values" or b.kind == "values":
        if op in (operator.eq, operator.ne):
            return (a is b) == (op is operator.eq)
        tx.raise_(TypeError, f"'{op.__name__}' not supported between instances of '{a.python_type().__name__}' "
                             f"and '{b.python_type().__name__}'")
    if op in (operator.gt, operator.ge):   # b <= a, b < a
        op, a, b = (operator.lt if op is operator.gt else operator.le), b, a
    la, lb = len(a.dict.items), len(b.dict.items)
    if op is operator.eq or op is operator.ne:
        equal = la == lb and _view_within(tx, a, b)
        return equal == (op is operator.eq)
    if op is operator.lt and not la < lb or op is operator.le and not la <= lb:
        return False
    return _view_within(tx, a, b)


def _view_within(tx, a: V.DictViewVar, b: V.DictViewVar) -> bool:
    """Whether every member of view `a` is in view `b`."""
    if a.kind != b.kind:   # keys against items: each member looked up as `in` does
        return all(contains(tx, b, member) for member in iterate(tx, a))
    for key, value in a.dict.items.items():
        if key not in b.dict.items:
            return False
        if a.kind == "items" and not items_equal(tx, b.dict.items[key], value):
            return False
    return True


def _sequence_order(tx, op, a, b) -> V.Variable:
    """`a < b` of two lists (or tuples, or deques), as CPython compares them: at the first position
    whose items differ, those items decide; with none, the lengths."""
    for x, y in zip(a.items, b.items):
        if not items_equal(tx, x, y):
            return binary_op(tx, op, x, y)
    return V.Constant(op(len(a.items), len(b.items)))


def _seq_eq(tx, a, b):
    # a list equals only a list, a deque only a deque, a tuple any tuple (namedtuples are tuples)
    if not _is_sequence(b) or _sequence_kind(a) != _sequence_kind(b) or len(a.items) != len(b.items):
        return False
    return all(items_equal(tx, x, y) for x, y in zip(a.items, b.items))


def _concat(tx, a, b):
    if type(a) is not type(b) and not (isinstance(b, V.TupleVar) and isinstance(a, V.TupleVar)):
        if isinstance(b, V.Constant) and isinstance(b.value, tuple):
            b = constant_of(tx, b.value)
        else:
            tx.raise_(TypeError, f"can only concatenate {a.python_type().__name__} to the same type")
    if isinstance(a, V.ListVar):
        if not issubclass(b.python_type(), list):
            tx.raise_(TypeError, f'can only concatenate list (not "{b.python_type().__name__}") to list')
        return V.ListVar(a.items + b.items)
    if isinstance(a, V.TupleVar) and a.cls is torch.Size:   # Size.__add__ gives a Size
        return V.TupleVar(a.items + b.items, torch.Size)
    return V.TupleVar(a.items + b.items)


def _repetitions(tx, n: V.Variable) -> int:
    count = python_value(n)
    if not isinstance(count, int):
        tx.raise_(TypeError, f"can't multiply sequence by non-int of type '{type(count).__name__}'")
    return count


def _repeat(tx, a, b):
    n = _repetitions(tx, b)
    return type(a)(a.items * n) if isinstance(a, V.ListVar) else V.TupleVar(a.items * n)


def _list_imul(tx, a, b):
    n = _repetitions(tx, b)
    mutate_list(tx, a, lambda lst: lst.__imul__(n))   # in place: every alias sees the repeated items
    return a


def _list_iadd(tx, a, b):
    extend_list(tx, a, b)
    return a


def extend_list(tx, lst: V.Variable, iterable: V.Variable):
    """`lst.extend(iterable)`, `lst += iterable`: CPython copies a list or tuple whole, but steps any
    other iterator one item at a time, appending each before it asks for the next, so a generator
    that reads the list sees it grow (`y.extend(y[-1] + z for z in range(3))`)."""
    if isinstance(iterable, (V.GeneratorVar, V.LazyIteratorVar)):
        while (item := advance(tx, iterable)) is not None:
            mutate_list(tx, lst, lambda items: items.append(item))
        return
    items = iterate(tx, iterable)
    mutate_list(tx, lst, lambda lst_items: lst_items.extend(items))


def _dict_or(tx, a, b):
    """`a | b` of dicts: the result's class is that of the operand whose `__or__`/`__ror__` runs
    (the right one's first where its class is a subclass of the left's with its own `__ror__`):
    dict's makes a plain dict, OrderedDict's and defaultdict's their own class (with the factory)."""
    if not issubclass(b.python_type(), dict):
        tx.raise_(TypeError, f"unsupported operand type(s) for |: '{a.python_type().__name__}' and "
                             f"'{b.python_type().__name__}'")
    items = {**a.items, **dict(dict_items(tx, b))}
    owner = a
    if isinstance(b, V.DictVar) and b.cls is not a.cls and issubclass(b.cls, a.cls) and \
            _or_home(b.cls) is not _or_home(a.cls):
        owner = b
    home = _or_home(owner.cls)
    return V.DictVar(items, owner.cls if home is not dict else dict,
                     owner.default_factory if home is collections.defaultdict else None)


def _or_home(cls: type) -> type:
    """The class whose `__or__` a dict subclass inherits."""
    return next(home for home in (collections.defaultdict, collections.OrderedDict, dict) if issubclass(cls, home))


def _own_keys(tx, v: V.Variable) -> bool:
    """Whether an object made in captured code has an instance attribute `keys`."""
    if not isinstance(v, V.NewObjectVar):
        return False
    try:
        getattr_var(tx, v, "keys")
        return True
    except ObservedException as e:
        if issubclass(e.exc.cls, AttributeError):
            return False
        raise


def mapping_pairs(tx, v: V.Variable) -> list[tuple]:
    """The (key, value) pairs `dict(v)` and `d.update(v)` read: a mapping's items, else the pairs an
    iterable yields (`[("a", x), ["b", y]]`, `zip(keys, values)`)."""
    if isinstance(v, V.DictVar) or isinstance(v, V.ObjectVar) and isinstance(v.value, dict):
        return dict_items(tx, v)
    if isinstance(v, (V.NewObjectVar, V.ObjectVar)) and hasattr(v.python_type(), "keys") or _own_keys(tx, v):
        # CPython's rule: an object with a `keys` attribute is a mapping, read as keys() then [k]
        # (an attribute of the instance counts: `self.keys = lambda: [...]`)
        keys = iterate(tx, tx.call(getattr_var(tx, v, "keys"), []))
        return [(key_of(tx, k), getitem(tx, v, k)) for k in keys]
    if isinstance(v, V.ObjectVar):
        return dict_items(tx, v)
    pairs = []
    for pair in iterate(tx, v):
        items = iterate(tx, pair)
        if len(items) != 2:
            tx.raise_(ValueError, f"dictionary update sequence element #{len(pairs)} has length {len(items)}; "
                                  "2 is required")
        pairs.append((key_of(tx, items[0]), items[1]))
    return pairs


def _dict_ior(tx, a, b):
    for k, v in mapping_pairs(tx, b):   # `d |= pairs` takes what update() takes
        dict_set(tx, a, V.key_var(k), v)
    return a


SEQUENCE_OPS = {
    (V.ListVar, operator.add): _concat, (V.TupleVar, operator.add): _concat,
    (V.TupleVar, operator.iadd): _concat, (V.ListVar, operator.iadd): _list_iadd,
    (V.ListVar, operator.mul): _repeat, (V.TupleVar, operator.mul): _repeat,
    (V.ListVar, operator.imul): _list_imul, (V.TupleVar, operator.imul): _repeat,
    (V.DictVar, operator.or_): _dict_or, (V.DictVar, operator.ior): _dict_ior,
}


_UNARY_DUNDERS = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__",
                  operator.abs: "__abs__"}


def unary_op(tx, op, v: V.Variable) -> V.Variable:
    if op in _UNARY_DUNDERS and (traced := call_user_method(tx, v, _UNARY_DUNDERS[op])) is not None:
        return traced
    if type(v) in VALUE_MODELS:
        return VALUE_MODELS[type(v)].unary(tx, op, v)
    if isinstance(v, (V.TensorVar, V.SymNumber)):
        return call_torch(tx, "call_function", op, [v], {})
    if is_python_constant(v):
        return V.Constant(op(python_value(v)))
    raise tx.unsupported(f"operator {op.__name__} on a {v.python_type().__name__}")


def exception_text(e: V.Variable, fn) -> str | None:
    """str()/repr() (`fn`) of an exception whose arguments are constants, by BaseException's own
    text (a builtin's: KeyError's repr of the key, AttributeError's message); None otherwise."""
    plain = isinstance(e, V.ExceptionVar) and (e.cls.__module__ == "builtins" or (
        e.cls.__str__ is BaseException.__str__ and e.cls.__repr__ is BaseException.__repr__))
    if not (plain and all(is_python_constant(a) for a in e.args)):
        return None
    return fn(BaseException.__new__(e.cls, *[python_value(a) for a in e.args]))


def format_value(tx, v: V.Variable, conv, spec: str) -> str:
    if isinstance(v, V.NewObjectVar) and not spec and conv in (None, str, repr):
        text = _own_text(tx, v, "__repr__" if conv is repr else "__str__")
        if text is not None:
            return text
    if isinstance(v, V.ExceptionVar) and conv in (None, str, repr):   # f"caught {e}" in an except block
        text = exception_text(v, repr if conv is repr else str)
        if text is not None:
            return format(text, spec)
    if not is_python_constant(v) or isinstance(v, V.ObjectVar) and not isinstance(v.value, (type, types.ModuleType)):
        raise tx.unsupported(f"formatting a {v.python_type().__name__} into a string needs its runtime value")
    value = python_value(v)
    if conv is not None:
        value = conv(value)
    return format(value, spec)


def _own_text(tx, v: V.NewObjectVar, name: str) -> str | None:
    """`str(v)` / `repr(v)` through the class's Python `__str__` or `__repr__` (object's `__str__`
    is its `__repr__`); None where neither is Python code."""
    if name == "__str__" and class_lookup(v.cls, "__str__") is object.__str__:
        name = "__repr__"
    method = class_lookup(v.cls, name)
    if not isinstance(method, types.FunctionType):
        return None
    text = tx.call(V.MethodVar(_function(method), v), [])
    if not (isinstance(text, V.Constant) and isinstance(text.value, str)):
        raise tx.unsupported(f"{v.cls.__name__}.{name} returned a {text.python_type().__name__}, not a known str")
    return text.value


# -- items --------------------------------------------------------------------------------------
def getitem(tx, obj: V.Variable, key: V.Variable, *, base: bool = False) -> V.Variable:
    if not base and (item := call_overridden(tx, obj, "__getitem__", [key])) is not None:
        return item
    if type(obj) in VALUE_MODELS:
        return VALUE_MODELS[type(obj)].getitem(tx, obj, key)
    if isinstance(obj, V.TensorVar):
        key = read_index_values(tx, key, plain=False)
        indices = key.items if isinstance(key, V.TupleVar) else [key]
        if tx.out.getitem_to_index and all(isinstance(i, V.TensorVar) for i in indices):
            return call_torch(tx, "call_function", torch.ops.aten.index.Tensor, [obj, V.ListVar(list(indices))], {})
        return call_torch(tx, "call_function", operator.getitem, [obj, key], {})
    if isinstance(obj, (V.ListVar, V.TupleVar)):
        k = python_value(key) if is_python_constant(key) else None
        if isinstance(key, V.TensorVar):
            k = _tensor_index(tx, key)
        if isinstance(k, slice):
            if obj.python_type() is collections.deque:
                tx.raise_(TypeError, "sequence index must be integer, not 'slice'")
            items = obj.items[k]
            return V.ListVar(items) if isinstance(obj, V.ListVar) else V.TupleVar(
                items, obj.cls if obj.cls is torch.Size else tuple)
        if isinstance(k, int):
            if not -len(obj.items) <= k < len(obj.items):
                tx.raise_(IndexError, f"{obj.python_type().__name__} index out of range")
            return obj.items[k]
        raise tx.unsupported(f"indexing a {obj.python_type().__name__} with a {key.python_type().__name__}")
    if isinstance(obj, V.DictVar):
        if is_model_output(obj.cls) and isinstance(key, V.Constant) and isinstance(key.value, (int, slice)):
            return getitem_position(tx, obj, key.value)
        k = key_of(tx, key)
        if k not in obj.items:
            if obj.default_factory is not None:  # a defaultdict: the factory's value is stored
                dict_set(tx, obj, key, call_variable(tx, obj.default_factory, [], {}))
                return obj.items[k]
            missing = getattr(obj.cls, "__missing__", None)
            if isinstance(missing, types.FunctionType):  # a dict subclass's own (Counter's is 0)
                return call_variable(tx, V.MethodVar(getattr_var(tx, V.ObjectVar(obj.cls), "__missing__"), obj),
                                     [key], {})
            tx.raise_(KeyError, k)
        return obj.items[k]
    if isinstance(obj, V.Constant):
        try:
            return constant_of(tx, obj.value[python_value(key)])
        except (IndexError, KeyError, TypeError) as e:
            tx.raise_(type(e), str(e))
    if isinstance(obj, (V.ObjectVar, V.NewObjectVar)):
        return object_getitem(tx, obj, key)
    raise tx.unsupported(f"indexing a {obj.python_type().__name__}")


def _is_index_tensor(v: V.Variable) -> bool:
    dtype = v.example.dtype if isinstance(v, V.TensorVar) else None
    return dtype is not None and v.example.dim() == 0 and not (dtype.is_floating_point or dtype.is_complex
                                                               or dtype == torch.bool)


def read_index_values(tx, key: V.Variable, plain: bool) -> V.Variable:
    """A 0-d integer tensor where tensor indexing wants an int (a slice bound, `out[start:end]` over
    a cumsum's entries; with `plain`, a whole index, `y[t] = v`) is read as Python reads it,
    `t.item()`: an unbacked SymInt ([Note: indices read from data] in kiln/symbolic/data_dependent.py),
    as torch.compile reads it, so the graph goes on where a fake tensor's `__index__` could only
    guard on its value. A whole index of a read (`x[t]`) stays a tensor: advanced indexing gives
    the same values."""
    from kiln.capture.torch_calls import tensor_item

    def read(v, whole):
        if isinstance(v, V.SliceVar):
            return V.SliceVar([read(i, True) for i in v.items])
        return tensor_item(tx, v) if whole and _is_index_tensor(v) else v
    if isinstance(key, V.TupleVar) and key.python_type() is tuple:
        return V.TupleVar([read(i, plain) for i in key.items])
    return read(key, plain)


def _tensor_index(tx, t: V.TensorVar) -> int:
    """`items[t]`: Python reads the tensor's value (`Tensor.__index__`). Known while tracing for a
    tensor this graph made from a constant (`torch.as_tensor(2)`; torch.compile's fake tensors keep
    such constants too); any other tensor's value is data, and the graph breaks here."""
    if t.example.dtype.is_floating_point or t.example.dtype.is_complex or t.example.numel() != 1:
        tx.raise_(TypeError, "only integer tensors of a single element can be converted to an index")
    node = t.node
    made_from = node.args[0] if node.op == "call_function" and node.target in (torch.tensor, torch.as_tensor) \
        and node.args else None
    if not isinstance(made_from, int):
        raise tx.unsupported("indexing a list or tuple with a tensor reads the tensor's value")
    return made_from


def setitem(tx, obj: V.Variable, key: V.Variable, value: V.Variable, *, base: bool = False):
    if not base and call_overridden(tx, obj, "__setitem__", [key, value]) is not None:
        return
    if type(obj) in VALUE_MODELS:
        return VALUE_MODELS[type(obj)].setitem(tx, obj, key, value)
    if isinstance(obj, V.TensorVar):
        tensor_method(tx, "__setitem__", [obj, read_index_values(tx, key, plain=True), value], {})
    elif isinstance(obj, V.ListVar):
        k = python_value(key)

        if isinstance(k, slice) and issubclass(obj.cls, collections.deque):
            tx.raise_(TypeError, "sequence index must be integer, not 'slice'")
        if isinstance(k, slice) and isinstance(value, V.Constant) and not hasattr(type(value.value), "__iter__"):
            try:   # a non-iterable assigned to a slice: the running CPython's own message (it changed in 3.11.15)
                ([None] * len(obj.items))[k] = value.value
            except TypeError as e:
                tx.raise_(TypeError, str(e))

        def assign(items):
            items[k] = value if not isinstance(k, slice) else iterate(tx, value)
        mutate_list(tx, obj, assign)
    elif isinstance(obj, V.DictVar):
        dict_set(tx, obj, key, value)
    elif not object_item_method(tx, obj, "__setitem__", [key, value]):
        raise tx.unsupported(f"item assignment on a {obj.python_type().__name__}")


def delitem(tx, obj: V.Variable, key: V.Variable, *, base: bool = False):
    if not base and call_overridden(tx, obj, "__delitem__", [key]) is not None:
        return
    k = python_value(key) if not isinstance(obj, (V.ObjectVar, V.NewObjectVar)) else None
    if isinstance(obj, V.ListVar):
        try:   # the index's own errors (out of range, a zero step, a float), raised as Python does
            list(obj.items).__delitem__(k)
        except (IndexError, ValueError, TypeError) as e:
            tx.raise_(type(e), *e.args)
        mutate_list(tx, obj, lambda items: items.__delitem__(k))
    elif isinstance(obj, V.MappingProxyVar):
        tx.raise_(TypeError, "'mappingproxy' object does not support item deletion")
    elif isinstance(obj, V.DictVar):
        obj.items.pop(k)
        _record_mutation(tx, obj)
    elif not object_item_method(tx, obj, "__delitem__", [key]):
        raise tx.unsupported(f"`del` of an item of a {obj.python_type().__name__}")


def object_item_method(tx, obj: V.Variable, name: str, args: list) -> bool:
    """`obj[k] = v` / `del obj[k]` through the class's Python method (UserDict, user containers);
    False when it has none."""
    if not isinstance(obj, (V.ObjectVar, V.NewObjectVar)):
        return False
    method = class_lookup(obj.python_type(), name)
    if not isinstance(method, types.FunctionType):
        return False
    tx.call(V.MethodVar(_function(method), obj), args)
    return True
