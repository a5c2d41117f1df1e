"""Calling a class inside traced code: what kind of object comes out.

Dispatch is by the class's role, looked up in `_CLASS_CALLS` (exact class), then by predicates in
`_CLASS_KINDS` (namedtuples, dict-dataclasses such as HF `ModelOutput`,
exceptions, nn.Modules, user classes). Instances of user classes made
in traced code are `NewObjectVar`s whose `__init__` is inlined; they are rebuilt as real objects
only if they leave the graph.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import types
import typing
import weakref

import torch

from kiln.capture import variables as V
from kiln.capture.model_outputs import construct as construct_model_output, is_model_output
from kiln.capture.torch_calls import is_legacy_tensor_type


def _pv(v):
    from kiln.capture.constants import python_value
    return python_value(v)


def _context(kind, make_args):
    def call(tx, cls, args, kwargs):
        return V.ContextVar(kind, make_args(tx, args, kwargs))
    return call


def _grad_context(mode: bool):
    def call(tx, cls, args, kwargs):
        ctx = V.ContextVar("grad", (mode,))
        if len(args) == 1 and not kwargs:   # `torch.no_grad(fn)`: torch's `cls()(fn)`, fn decorated
            return tx.call(ctx, [args[0]])
        return ctx
    return call


def _autocast_args(tx, args, kwargs):
    import inspect
    sig = inspect.signature(torch.autocast.__init__)
    bound = sig.bind(None, *[_pv(a) for a in args], **{k: _pv(v) for k, v in kwargs.items()})
    bound.apply_defaults()
    a = bound.arguments
    dtype = a["dtype"] if a["dtype"] is not None else torch.get_autocast_dtype(a["device_type"]) \
        if hasattr(torch, "get_autocast_dtype") else None
    return (a["device_type"], dtype, a["enabled"], a["cache_enabled"])


def _cuda_autocast_args(tx, args, kwargs):
    names = ("enabled", "dtype", "cache_enabled")
    values = dict(zip(names, [_pv(a) for a in args]), **{k: _pv(v) for k, v in kwargs.items()})
    return ("cuda", values.get("dtype", torch.float16), values.get("enabled", True), values.get("cache_enabled", None))


def _fold_class(tx, cls, args, kwargs):
    from kiln.capture.constants import is_python_constant
    if all(is_python_constant(a) for a in args) and all(is_python_constant(v) for v in kwargs.values()):
        return V.Constant(cls(*[_pv(a) for a in args], **{k: _pv(v) for k, v in kwargs.items()}))
    raise tx.unsupported(f"{cls.__name__}(...) on values known only at run time")


def _size(tx, cls, args, kwargs):
    from kiln.capture.semantics import iterate
    items = iterate(tx, args[0]) if args else []
    return V.TupleVar(items, torch.Size)


def _weakref(tx, cls, args, kwargs):
    """`weakref.ref(obj)` in traced code, without a callback: a tracker that gives `obj` back."""
    if len(args) != 1 or kwargs:
        raise tx.unsupported("weakref.ref with a callback inside captured code")
    obj = args[0]
    if not obj.python_type().__weakrefoffset__:
        tx.raise_(TypeError, f"cannot create weak reference to '{obj.python_type().__name__}' object")
    return V.WeakRefVar(obj)


_CLASS_CALLS = {
    torch.no_grad: _grad_context(False),
    torch.enable_grad: _grad_context(True),
    torch.autocast: _context("autocast", _autocast_args),
    torch.amp.autocast: _context("autocast", _autocast_args),
    # the profilers record nothing of a compiled region: their `with` is an empty context, as in
    # Dynamo (so a break inside one splits the graph where Dynamo's does)
    torch.profiler.profile: _context("nothing", lambda tx, args, kwargs: ()),
    torch.profiler.record_function: _context("nothing", lambda tx, args, kwargs: ()),
    torch.autograd.profiler.profile: _context("nothing", lambda tx, args, kwargs: ()),
    torch.autograd.profiler.record_function: _context("nothing", lambda tx, args, kwargs: ()),
    torch.device: _fold_class,
    torch.finfo: _fold_class,
    torch.iinfo: _fold_class,
    torch.Size: _size,
    weakref.ref: _weakref,
}
if hasattr(torch.cuda, "amp") and hasattr(torch.cuda.amp, "autocast"):
    _CLASS_CALLS[torch.cuda.amp.autocast] = _context("autocast", _cuda_autocast_args)
if hasattr(torch, "cpu") and hasattr(torch.cpu, "amp") and hasattr(torch.cpu.amp, "autocast"):
    _CLASS_CALLS[torch.cpu.amp.autocast] = _context(
        "autocast", lambda tx, a, k: ("cpu", _pv(k.get("dtype", V.Constant(torch.bfloat16))),
                                      _pv(k.get("enabled", V.Constant(True))), None))


def _namedtuple(tx, cls, args, kwargs):
    fields = cls._fields
    values = dict(zip(fields, args))
    values.update(kwargs)
    defaults = getattr(cls, "_field_defaults", {})
    items = []
    for f in fields:
        if f in values:
            items.append(values[f])
        elif f in defaults:
            items.append(V.Constant(defaults[f]))
        else:
            tx.raise_(TypeError, f"{cls.__name__}() missing argument {f!r}")
    return V.TupleVar(items, cls)


def _structseq(tx, cls, args, kwargs):
    """`torch.return_types.max((values, indices))`: a structseq is built from one sequence of its
    fields (at least `n_sequence_fields`, at most `n_fields` items; only the first are the tuple)."""
    from kiln.capture import semantics as S
    if len(args) != 1 or kwargs:
        tx.raise_(TypeError, f"{cls.__name__}() takes a single sequence argument")
    items = S.iterate(tx, args[0])
    if not cls.n_sequence_fields <= len(items) <= cls.n_fields:
        tx.raise_(TypeError, f"{cls.__module__}.{cls.__name__}() takes a {cls.n_sequence_fields}-sequence "
                  f"({len(items)}-sequence given)")
    return V.TupleVar(items[:cls.n_sequence_fields], cls)


def _exception(tx, cls, args, kwargs):
    return V.ExceptionVar(cls, list(args))


def _module_class(tx, cls, args, kwargs):
    """A stateless module built from constants (`CrossEntropyLoss()` in a forward) is made for real at
    trace time: its forward depends only on those constants, so the graph holds the same ops."""
    from kiln.capture.constants import is_python_constant
    if all(is_python_constant(a) for a in args) and all(is_python_constant(v) for v in kwargs.values()):
        module = cls(*[_pv(a) for a in args], **{k: _pv(v) for k, v in kwargs.items()})
        if not any(True for _ in module.parameters()) and not any(True for _ in module.buffers()):
            return V.ObjectVar(module)
    raise tx.unsupported(f"creating an nn.Module ({cls.__name__}) with parameters, buffers or run-time "
                         "arguments inside captured code; create it in __init__ instead")


def _user_class(tx, cls, args, kwargs):
    """`cls(*args, **kwargs)` as `type.__call__` does it: `cls.__new__(cls, ...)` (object's makes a
    new object; a Python `__new__` is inlined, and its `super().__new__(cls)` reaches object's),
    then `__init__` on the result when `__new__` returned an instance of `cls`."""
    from kiln.capture.attributes import _MISSING, class_lookup, _function
    new = class_lookup(cls, "__new__")
    new = new.__func__ if isinstance(new, staticmethod) else new
    if isinstance(new, types.FunctionType):
        obj = tx.inline(_function(new), [V.ObjectVar(cls), *args], kwargs)
        if not (isinstance(obj, V.NewObjectVar) and issubclass(obj.cls, cls)):
            return obj
    elif new is _MISSING or new is object.__new__:
        obj = V.NewObjectVar(cls, {})
    else:
        raise tx.unsupported(f"{cls.__name__} defines __new__, which kiln does not model")
    init = class_lookup(cls, "__init__")
    if isinstance(init, types.FunctionType):
        tx.inline(_function(init), [obj, *args], kwargs)
    elif init is not object.__init__ and init is not _MISSING:
        raise tx.unsupported(f"{cls.__name__}.__init__ is not Python code kiln can follow")
    elif args or kwargs:
        tx.raise_(TypeError, f"{cls.__name__}() takes no arguments")
    return obj


_CONTAINER_BASES = (dict, list, set, frozenset, tuple)


def _container_subclass(tx, cls, args, kwargs):
    """A user's subclass of dict, list, set or frozenset: the builtin's tracker of that class
    ([Note: subclasses of builtin containers]), built as `type.__call__` does: its `__new__` (Python,
    or the builtin's), then its `__init__` (Python, or the builtin's) when `__new__` returned an
    instance of the class."""
    from kiln.capture.attributes import class_lookup, _function
    from kiln.capture.callables import handler_for
    base = next(b for b in _CONTAINER_BASES if issubclass(cls, b))
    new = class_lookup(cls, "__new__")
    new = new.__func__ if isinstance(new, staticmethod) else new
    if isinstance(new, types.FunctionType):
        obj = tx.inline(_function(new), [V.ObjectVar(cls), *args], kwargs)
    elif new is base.__new__ or base is dict and new is collections.OrderedDict.__new__:
        obj = handler_for(base.__new__)(tx, [V.ObjectVar(cls), *args], kwargs)
    else:
        raise tx.unsupported(f"{cls.__name__}.__new__ is not Python code kiln can follow")
    if not (isinstance(obj, (V.DictVar, V.ListVar, V.SetVar, V.TupleVar)) and issubclass(obj.python_type(), cls)):
        return obj
    init = class_lookup(cls, "__init__")
    if isinstance(init, types.FunctionType):
        tx.inline(_function(init), [obj, *args], kwargs)
    elif init is dict.__init__ or init is collections.OrderedDict.__init__:
        from kiln.capture.containers import dict_of
        obj.items.update(dict_of(tx, dict, args, kwargs).items)
    elif init in (list.__init__, set.__init__):
        if kwargs:
            tx.raise_(TypeError, f"{cls.__name__}() takes no keyword arguments")
        if len(args) > 1:
            tx.raise_(TypeError, f"{base.__name__} expected at most 1 argument, got {len(args)}")
        handler_for(init)(tx, [obj, *args], {})
    elif init is not object.__init__:
        raise tx.unsupported(f"{cls.__name__}.__init__ is not Python code kiln can follow")
    return obj


def _legacy_tensor(tx, cls, args, kwargs):
    """`torch.IntTensor([n])` (VITS's flow layers): the legacy typed constructor on data is
    `torch.tensor(data, dtype=cls.dtype)`, on the class's device. Sizes (`torch.FloatTensor(2, 3)`)
    give uninitialized memory, which a graph does not reproduce: not modelled."""
    if len(args) != 1 or kwargs or not isinstance(args[0], (V.ListVar, V.TupleVar)):
        raise tx.unsupported(f"{cls.__name__}(...) other than on a list of numbers inside captured code")
    from kiln.capture.torch_calls import call_torch
    device = V.Constant(torch.device("cuda" if cls.is_cuda else "cpu"))
    return call_torch(tx, "call_function", torch.tensor, [args[0]], {"dtype": V.Constant(cls.dtype), "device": device})


def _enum_call(tx, cls, args, kwargs):
    """`Color(1)` (a member by value) or `Enum("E", names)` (the functional API, a new class):
    pure on constant arguments, so run now, as Dynamo folds them; the class made is one object for
    every call of the compiled code, not a new one per call as in eager."""
    from kiln.capture.builder import wrap
    from kiln.capture.constants import is_python_constant
    if not all(is_python_constant(a) for a in (*args, *kwargs.values())):
        raise tx.unsupported(f"calling the enum {cls.__name__} on values known only at run time")
    try:
        value = cls(*[_pv(a) for a in args], **{k: _pv(v) for k, v in kwargs.items()})
    except (ValueError, TypeError, KeyError) as e:
        tx.raise_(type(e), *e.args)
    return wrap(tx.out, value, None)


_CLASS_KINDS = [
    (lambda c: isinstance(c, enum.EnumMeta), _enum_call),
    (is_model_output, construct_model_output),
    (is_legacy_tensor_type, _legacy_tensor),
    (lambda c: issubclass(c, tuple) and hasattr(c, "_fields"), _namedtuple),
    (lambda c: issubclass(c, tuple) and hasattr(c, "n_sequence_fields"), _structseq),
    (lambda c: issubclass(c, BaseException), _exception),
    (lambda c: issubclass(c, torch.nn.Module), _module_class),
    (lambda c: issubclass(c, torch.Tensor), None),
    (lambda c: issubclass(c, dict) and c is collections.Counter or issubclass(c, _CONTAINER_BASES) and
     c.__module__ not in ("builtins", "collections") and not c.__module__.startswith("torch"), _container_subclass),
    # torch.distributions are Python classes over tensor ops: built like a user's class; so are
    # torch's pure-Python helpers that programs and tests build (OrderedSet, torch.testing's pairs)
    (lambda c: c.__module__.startswith("torch.distributions.") or
     c.__module__ in ("torch.utils._ordered_set", "torch.testing._comparison",
                      "torch.testing._internal.common_utils"), _user_class),
    # torch's own dataclasses (linear_cross_entropy's options, built by `dataclasses.replace`):
    # plain Python records, built like a user's dataclass
    (lambda c: c.__module__.startswith("torch.") and dataclasses.is_dataclass(c), _user_class),
    (lambda c: c.__module__ == "builtins" or c.__module__.startswith("torch"), None),
    (lambda c: True, _user_class),
]


# torch's own compiler's TorchFunctionMode around vmapped mask functions: indexing a tensor by
# tensors alone is aten.index (a copy; a 0-d index tensor is not read as an int). A context of kind
# "getitem_to_index" (`semantics.getitem`). By (module, name): kiln imports nothing of torch's
# dynamo package, where it lives.
_GETITEM_TO_INDEX_CONTEXTS = {("_trace_wrapped_higher_order_op", "TransformGetItemToIndex")}


def call_class(tx, cls_var: V.ObjectVar, args, kwargs) -> V.Variable:
    cls = cls_var.value
    fn = _CLASS_CALLS.get(cls)
    if fn is not None:
        return fn(tx, cls, args, kwargs)
    if (cls.__module__.rpartition(".")[2], cls.__qualname__) in _GETITEM_TO_INDEX_CONTEXTS and not args and not kwargs:
        return V.ContextVar("getitem_to_index", ())
    if typing.is_typeddict(cls):   # a TypedDict class makes a plain dict (and refuses issubclass)
        return tx.call(V.ObjectVar(dict), args, kwargs)
    for matches, fn in _CLASS_KINDS:
        if matches(cls):
            if fn is None:
                break
            return fn(tx, cls, args, kwargs)
    if cls is torch.Tensor or cls is torch.tensor:
        from kiln.capture.torch_calls import call_torch
        return call_torch(tx, "call_function", torch.tensor, args, kwargs)
    raise tx.unsupported(f"constructing a {cls.__qualname__} inside captured code is not supported")
