"""Python builtins over trackers: one handler per builtin function, in `callables.CALLABLES`.

Sizes, types and attributes (`len`, `isinstance`, `getattr`, ...), numbers and strings (folded over
constants), `super`, `object`, `functools` and the `operator` module (the bytecode operators'
semantics). Containers' constructors and methods are in `containers.py`, iteration in
`iterators.py`. `PURE_CALLABLES` says which other C callables (math, operator, methods of immutable
values) may be folded when their arguments are constants.
"""
from __future__ import annotations

import builtins
import dataclasses
import functools
import operator
import os
import re
import types
import typing

import torch

from kiln.capture import controls
from kiln.capture import variables as V
from kiln.capture.callables import CALLABLE_TYPES, CALLABLES as BUILTINS, PACKAGES, handles as builtin
from kiln.capture.interpreter import ObservedException
from kiln.capture.semantics import binary_op, contains, exception_text, iterate, truth
from kiln.capture.constants import fold_call, is_python_constant, python_value

def _all_constant(args, kwargs):
    return all(is_python_constant(a) for a in args) and all(is_python_constant(v) for v in kwargs.values())


# builtins that call a method of their first argument's class: on a user object, that method is
# traced (attributes.call_user_method), not run by folding the builtin at capture time
# (str/repr/hash of a user object still fold: a dataclass's generated __repr__ goes through
# reprlib's recursion guard, which capture does not follow)
_PROTOCOLS = {abs: ("__abs__",), round: ("__round__",), complex: ("__complex__",),
              int: ("__int__", "__index__"), float: ("__float__", "__index__"), operator.index: ("__index__",)}


def user_protocol(tx, fn, args, kwargs) -> V.Variable | None:
    """`fn(obj, ...)` through the user class's own method where `fn` is one of `_PROTOCOLS`."""
    from kiln.capture.attributes import call_user_method
    if not args or kwargs or fn not in _PROTOCOLS:
        return None
    for name in _PROTOCOLS[fn]:
        extra = args[1:] if name == "__round__" else ()
        result = call_user_method(tx, args[0], name, extra)
        if result is not None:
            return result
    return None


def _foldable(fn, otherwise=None):
    """A builtin folded over constants; `otherwise(tx, args, kwargs)` handles the rest."""
    def handle(tx, args, kwargs):
        if (traced := user_protocol(tx, fn, args, kwargs)) is not None:
            return traced
        if _all_constant(args, kwargs):
            return fold_call(tx, fn, args, kwargs)
        if otherwise is None:
            raise tx.unsupported(f"{fn.__name__}() on values known only at run time")
        return otherwise(tx, args, kwargs)
    return handle


# -- sizes, types, attributes -----------------------------------------------------------------------
@builtin(len)
def _len(tx, args, kwargs):
    from kiln.capture.attributes import call_overridden
    v = args[0]
    if (n := call_overridden(tx, v, "__len__", [])) is not None:   # a container subclass's own
        if not (is_python_constant(n) and isinstance(python_value(n), int)):
            raise tx.unsupported(f"len() of a {v.python_type().__name__} whose __len__ returns a "
                                 f"{n.python_type().__name__}")
        if python_value(n) < 0:
            tx.raise_(ValueError, "__len__() should return >= 0")
        return V.Constant(int(python_value(n)))
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
        return fold_call(tx, len, args, kwargs)
    if isinstance(v, V.ObjectVar) and isinstance(v.value, torch.nn.Module):
        return V.Constant(len(v.value))
    if isinstance(v, V.ObjectVar) and type(v.value) in (dict, list, tuple, set, frozenset):
        # a builtin container held whole (a table keyed by functions): its length, guarded where read
        from kiln.capture.guards import Guard, GuardKind
        if v.source is not None:
            tx.out.guard(Guard(GuardKind.LEN, v.source, len(v.value)))
        return V.Constant(len(v.value))
    if isinstance(v, V.ITERATORS):
        name = "iterator" if isinstance(v, V.IteratorVar) else v.python_type().__name__
        tx.raise_(TypeError, f"object of type {name!r} has no len()")
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
    if isinstance(obj, V.TensorVar):
        return V.Constant(_tensor_is_instance(obj, t, cls))
    checks = [c for c in (cls if isinstance(cls, tuple) else (cls,)) if _python_instancecheck(c) is not None]
    if checks:   # a metaclass written in Python decides (after the exact-type shortcut Python takes)
        from kiln.capture.attributes import _function
        from kiln.capture.semantics import truth
        for c in (cls if isinstance(cls, tuple) else (cls,)):
            check = _python_instancecheck(c)
            if t is c or (check is None and issubclass(t, c)) or \
                    check is not None and truth(tx, tx.call(_function(check), [V.ObjectVar(c), obj])):
                return V.Constant(True)
        return V.Constant(False)
    return V.Constant(issubclass(t, cls))


def _python_instancecheck(cls):
    """The `__instancecheck__` a class's metaclass defines in Python, or None (type's, ABCMeta's)."""
    if not isinstance(cls, type):
        return None
    for klass in type(cls).__mro__:
        if "__instancecheck__" in klass.__dict__:
            check = klass.__dict__["__instancecheck__"]
            return check if isinstance(check, types.FunctionType) and klass.__module__ not in ("abc", "typing") \
                and not klass.__module__.startswith("torch") else None
    return None


def _tensor_is_instance(obj: V.TensorVar, t: type, cls) -> bool:
    """`isinstance(t, cls)` of a tensor: by its type, except a legacy tensor type (`torch.FloatTensor`),
    which asks for its dtype, device and layout ([Note: legacy tensor types] in torch_calls.py)."""
    from kiln.capture.torch_calls import is_instance_of_legacy_type, is_legacy_tensor_type
    if isinstance(cls, tuple):
        return any(_tensor_is_instance(obj, t, c) for c in cls)
    if is_legacy_tensor_type(cls):
        return is_instance_of_legacy_type(obj.example, cls)
    return issubclass(t, cls)


@builtin(issubclass)
def _issubclass(tx, args, kwargs):
    return fold_call(tx, issubclass, args, kwargs)


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


@builtin(delattr)
def _delattr(tx, args, kwargs):
    from kiln.capture.attributes import delattr_var
    delattr_var(tx, args[0], python_value(args[1]))
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
    """`id(obj)` of an object the frame reads is its id, guarded on that identity (a call with
    another object compiles again, as under torch.compile's ID_MATCH)."""
    from kiln.capture.guards import Guard, GuardKind
    v = args[0]
    real = v.value if isinstance(v, V.ObjectVar) else \
        tx.out.input_values.get(v.node) if isinstance(v, V.TensorVar) and v.source is not None else None
    if real is not None or isinstance(v, V.ObjectVar):
        if v.source is not None:
            tx.out.guard(Guard(GuardKind.ID, v.source, real))
        return V.Constant(id(real))
    if isinstance(args[0], _ONE_TRACKER_PER_OBJECT) and args[0].source is None:
        # [Note: id of an object made in captured code] the object does not exist yet; its tracker
        # stands for it alone (one tracker per object made), so the tracker's id answers what
        # comparisons of ids ask (`id(s) == id(s.copy())`), as Dynamo's fake ids do. Only the
        # number differs from eager's, which no program can rely on.
        return V.Constant(id(args[0]))
    raise tx.unsupported("id() of a value made inside captured code")


_ONE_TRACKER_PER_OBJECT = (V.ListVar, V.DictVar, V.SetVar, V.NewObjectVar)


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
for _fn in (chr, ord, hash, ascii, bin, hex, oct, complex, slice, format):
    BUILTINS[_fn] = _foldable(_fn)


def _exception_text(fn):
    """str()/repr() of a caught exception whose arguments are constants, by BaseException's own
    text (`errors.append(str(e))` in a validator's `except TypeError as e`)."""
    def otherwise(tx, args, kwargs):
        text = exception_text(args[0], fn) if len(args) == 1 and not kwargs else None
        if text is not None:
            return V.Constant(text)
        raise tx.unsupported(f"{fn.__name__}() on values known only at run time")
    return otherwise


BUILTINS[str] = _foldable(str, _exception_text(str))
BUILTINS[repr] = _foldable(repr, _exception_text(repr))


def _needs_data(name):
    def handle(tx, args, kwargs):
        if (traced := user_protocol(tx, getattr(builtins, name), args, kwargs)) is not None:
            return traced
        if _all_constant(args, kwargs):
            return fold_call(tx, getattr(builtins, name), args, kwargs)
        if name == "int" and len(args) == 1 and not kwargs and isinstance(args[0], V.TensorVar) \
                and not (args[0].example.dtype.is_floating_point or args[0].example.dtype.is_complex):
            # int(t) of an integer tensor is t.item(): an unbacked SymInt in the graph
            from kiln.capture.torch_calls import tensor_item
            return tensor_item(tx, args[0])
        raise tx.unsupported(f"{name}() of a tensor reads its data, which a graph cannot hand back to Python")
    return handle


for _name in ("int", "float"):
    BUILTINS[getattr(builtins, _name)] = _needs_data(_name)


@builtin(bool)
def _bool(tx, args, kwargs):
    """Python's truth rule (`truth`): a container of tensors is true when not empty. Of a number
    read from a tensor (`bool(t.item())`, or `bool(t)` under torch's capture_scalar_outputs), the
    truth is a symbolic bool the graph computes, as torch.compile's is."""
    from kiln.capture.semantics import truth
    from kiln.capture.torch_calls import call_torch, tensor_item
    from kiln.symbolic.decide import is_unbacked
    value = args[0] if args else None
    if isinstance(value, V.TensorVar) and isinstance(value.example.numel(), int) and value.example.numel() != 1:
        tx.raise_(RuntimeError, f"Boolean value of Tensor with {'no values' if value.example.numel() == 0 else 'more than one value'} is ambiguous")
    if isinstance(value, V.TensorVar) and controls.capture_scalar_outputs():
        # its truth read from the tensor (a float's too: `t != 0` is a bool tensor), a symbolic bool
        value = tensor_item(tx, call_torch(tx, "call_function", operator.ne, [value, V.Constant(0)], {}))
    if isinstance(value, V.SymNumber) and is_unbacked(value.example):
        # read from a tensor: the graph computes its truth (a guard on it could not be checked)
        if isinstance(value.example, torch.SymBool):
            return value
        return call_torch(tx, "call_function", operator.ne, [value, V.Constant(0)], {})
    if isinstance(value, V.TensorVar):
        raise tx.unsupported("bool() of a tensor reads its data, which a graph cannot hand back to Python")
    return V.Constant(bool(args) and truth(tx, value))


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


def _lru_cached(tx, wrapper, args, kwargs):
    """A `functools.lru_cache`/`cache` function: its wrapped function is inlined. The cache is for
    pure functions (its documented contract), so calling through gives the value a hit would. One
    whose function is marked constant (`constants.is_assumed_constant`; the wrapper copies the mark) is
    called for real on constants, through its cache, as eager calls it."""
    from kiln.capture.attributes import _function
    from kiln.capture.constants import constant_arguments, is_assumed_constant, run_at_trace_time
    if is_assumed_constant(wrapper) and constant_arguments(args, kwargs):
        return run_at_trace_time(tx, wrapper, args, kwargs)
    return tx.inline(_function(wrapper.__wrapped__), args, kwargs)


CALLABLE_TYPES[functools._lru_cache_wrapper] = _lru_cached


def _typing_function(tx, fn, args, kwargs):
    """The `typing` module's functions read annotations only: run them on constants.
    `typing.cast(T, value)` is `value`, whatever it is."""
    if fn is typing.cast:
        return args[1] if len(args) > 1 else kwargs["val"]
    if _all_constant(args, kwargs):
        return fold_call(tx, fn, args, kwargs)
    raise tx.unsupported(f"typing.{getattr(fn, '__name__', fn)} on values known only at run time")


PACKAGES["typing"] = PACKAGES["typing_extensions"] = _typing_function


def _read_fields(tx, v):
    """Read a dataclass's fields through capture, so that each is guarded as an attribute read is."""
    from kiln.capture.attributes import getattr_var
    value = python_value(v)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _read_fields(tx, getattr_var(tx, v, field.name))


def _dataclass_to_containers(fn):
    """`dataclasses.asdict`/`astuple` of a dataclass whose fields are all constants: run for real
    (they deep-copy, which capture does not follow), the result a fresh, mutable container."""
    def handle(tx, args, kwargs):
        from kiln.capture.builder import wrap
        if not _all_constant(args, kwargs):
            raise tx.unsupported(f"dataclasses.{fn.__name__} of a dataclass holding run-time values")
        _read_fields(tx, args[0])
        try:
            result = fn(*[python_value(a) for a in args], **{k: python_value(v) for k, v in kwargs.items()})
        except TypeError as e:
            tx.raise_(TypeError, str(e))
        return wrap(tx.out, result, None)
    return handle


for _fn in (dataclasses.asdict, dataclasses.astuple):
    BUILTINS[_fn] = _dataclass_to_containers(_fn)


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


@builtin(object.__init__)
def _object_init(tx, args, kwargs):
    return V.Constant(None)


@builtin(object.__setattr__)
def _object_setattr(tx, args, kwargs):
    """object's own attribute store, past a class's `__setattr__` (which calls it)."""
    from kiln.capture.attributes import setattr_var
    setattr_var(tx, args[0], python_value(args[1]), args[2], base=True)
    return V.Constant(None)


@builtin(object.__getattribute__)
def _object_getattribute(tx, args, kwargs):
    """object's own attribute lookup, past a class's `__getattribute__` (which calls it)."""
    from kiln.capture.attributes import _getattr_object, getattr_var, new_object_attribute
    if isinstance(args[0], V.NewObjectVar):
        return new_object_attribute(tx, args[0], python_value(args[1]))
    if isinstance(args[0], V.ObjectVar):
        return _getattr_object(tx, args[0], python_value(args[1]))
    return getattr_var(tx, args[0], python_value(args[1]))


_PURE_MODULES = {"math", "cmath", "operator", "_operator"}
_IMMUTABLE = (str, int, float, bytes, tuple, bool, complex, torch.Size, torch.dtype, torch.device, frozenset,
              type(None), re.Pattern, re.Match)


_PURE_FUNCTIONS = {os.fspath}   # pure on the constants (str, bytes) folding hands them


def PURE_CALLABLES(fn) -> bool:
    """C callables safe to run at capture time on constant arguments."""
    owner = getattr(fn, "__self__", None)
    return getattr(owner, "__name__", None) in _PURE_MODULES or isinstance(owner, _IMMUTABLE) or \
        fn in _PURE_FUNCTIONS
