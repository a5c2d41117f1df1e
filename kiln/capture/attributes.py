"""Attribute reads and writes over trackers, following Python's lookup rules.

`getattr_var` dispatches on the tracker class through `_GETATTR`. For real objects it looks in the
instance (for nn.Modules: `_parameters`, `_buffers`, `_modules`, then `__dict__`) before the class,
and binds what it finds in the class the way descriptors do: functions become methods, properties
are inlined, classmethods bind the class. Values read get the source `obj.attr`, so specializing on
them guards them. Writes to objects that outlive the frame are recorded as side effects and seen by
later reads through an overlay.
"""
from __future__ import annotations

import operator
import os
import sys
import types
from typing import Any

import torch

from kiln.capture import variables as V
from kiln.capture.model_outputs import getattr_field, is_model_output, setattr_field
from kiln.capture.output import AttrDelete, AttrWrite
from kiln.capture.sources import (AttrSource, BuiltinItemSource, DictEntrySource, ItemSource, KeyedItemSource,
                                  TypeSource)

_MISSING = object()


def _wrap(tx, value, source, **kw):
    from kiln.capture.builder import wrap
    return wrap(tx.out, value, source, **kw)


def class_lookup(cls: type, name: str, start_after: type | None = None) -> Any:
    """The raw entry for `name` in `cls`'s MRO (no descriptor binding), or _MISSING."""
    mro = cls.__mro__
    if start_after is not None:
        mro = mro[mro.index(start_after) + 1:]
    for klass in mro:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


def _bound_classmethod(tx, entry: classmethod, cls_var: V.Variable) -> V.Variable:
    """A classmethod bound to its class; one wrapping a property (`@classmethod @property`, which
    Python 3.9 to 3.12 chain) is the property's value for the class."""
    inner = entry.__func__
    if isinstance(inner, property) and sys.version_info < (3, 13):
        return tx.call(_plain(tx, inner.fget), [cls_var])
    return V.MethodVar(_plain(tx, inner), cls_var)


def bind_class_entry(tx, entry: Any, obj: V.Variable, cls: type, name: str) -> V.Variable:
    """What `obj.name` is when `name` was found in the class dict as `entry`."""
    if isinstance(entry, types.FunctionType):
        return V.MethodVar(_function(entry), obj)
    if isinstance(entry, staticmethod):
        return _plain(tx, entry.__func__)
    if isinstance(entry, classmethod):
        return _bound_classmethod(tx, entry, V.ObjectVar(cls))
    if isinstance(entry, property):
        if entry.fget is None:
            tx.raise_(AttributeError, f"property {name!r} has no getter")
        return tx.call(_plain(tx, entry.fget), [obj])
    if not hasattr(entry, "__get__") or isinstance(entry, (type, types.BuiltinFunctionType)):
        # a plain class attribute (a constant, a class, a builtin), read through the instance's
        # class where the instance has a source, so the guards see a later `A.a = 5`
        return _wrap(tx, entry, _class_entry_source(obj, cls, name))
    get = class_lookup(type(entry), "__get__")
    if isinstance(obj, V.ObjectVar) and not isinstance(get, types.FunctionType):
        # C descriptors (slots, getset, method descriptors) of a real object: ask the object
        return _wrap(tx, getattr(obj.value, name), AttrSource(obj.source, name) if obj.source else None)
    if isinstance(entry, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return V.MethodVar(V.ObjectVar(entry), obj)
    if name == "__class__" and entry is object.__dict__["__class__"]:
        return V.ObjectVar(obj.python_type())
    if name == "__weakref__" and isinstance(entry, types.GetSetDescriptorType) and obj.source is None:
        return V.Constant(None)   # an object made in traced code: nothing holds a weak reference to it yet
    if isinstance(get, types.FunctionType):  # a descriptor written in Python (lazy_property, ...)
        return tx.call(V.MethodVar(_function(get), _wrap(tx, entry, None)), [obj, V.ObjectVar(cls)])
    raise tx.unsupported(f"the descriptor {type(entry).__name__} for attribute {name!r} is not supported")


def _class_entry_source(obj: V.Variable, cls: type, name: str):
    """`type(obj).__mro__[i].__dict__[name]`: where `obj.name` found a class attribute, or None."""
    if obj.source is None or not isinstance(cls, type):
        return None
    owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
    if owner is None or (isinstance(obj, V.ObjectVar) and type(obj.value) is not cls) or \
            not isinstance(obj, V.ObjectVar) and obj.python_type() is not cls:
        return None
    mro = ItemSource(AttrSource(TypeSource(obj.source), "__mro__"), cls.__mro__.index(owner))
    return DictEntrySource(mro, "__dict__", name)


def overlay_id(obj) -> int:
    """What the frame's attribute writes to a program's object are keyed by: its `__dict__`, which
    several objects may share (torch's module proxies take their module's), else the object."""
    inst_dict = getattr(obj, "__dict__", None)
    return id(inst_dict) if isinstance(inst_dict, dict) else id(obj)


def _function(fn) -> V.FunctionVar:
    return V.FunctionVar(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__ or (),
                         dict(fn.__kwdefaults__ or {}), fn.__closure__ or (), fn=fn)


def _plain(tx, fn):
    if isinstance(fn, types.FunctionType):
        return _function(fn)
    return V.ObjectVar(fn)


# -- per tracker class ------------------------------------------------------------------------------
def _getattr_object(tx, v: V.ObjectVar, name: str) -> V.Variable:
    obj, source = v.value, v.source
    overlay = tx.out.__dict__.setdefault("attr_overlay", {})
    deleted = overlay.get((overlay_id(obj), name)) is DELETED
    if (overlay_id(obj), name) in overlay and not deleted:
        return overlay[(overlay_id(obj), name)]
    if deleted:   # `del obj.name` in this frame: the class's attribute, if any, shows through
        entry = class_lookup(type(obj), name)
        if entry is _MISSING:
            tx.raise_(AttributeError, f"{type(obj).__name__!r} object has no attribute {name!r}")
        return bind_class_entry(tx, entry, v, type(obj), name)
    if isinstance(obj, types.ModuleType):
        if not hasattr(obj, name):
            tx.raise_(AttributeError, f"module {obj.__name__!r} has no attribute {name!r}")
        if obj is os and name == "environ" and source is not None:
            # [Note: rank-dependent values] the environment is read through a source, so what the
            # program read of it (RANK, LOCAL_RANK, a flag) is guarded
            return _wrap(tx, os.environ, AttrSource(source, name))
        return _wrap(tx, getattr(obj, name), None)  # module attributes are not guarded
    if isinstance(obj, type):
        return _getattr_class(tx, v, name)
    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            d = obj.__dict__.get(table)
            if d is not None and name in d:
                value = d[name]
                src = DictEntrySource(source, table, name) if source else None
                if value is None:
                    return V.Constant(None)
                if src is not None and table != "_modules":
                    # get_attr nodes hold this tensor: a replaced parameter needs a new graph
                    from kiln.capture.guards import Guard, GuardKind
                    tx.out.guard(Guard(GuardKind.ID, src, value))
                return _wrap(tx, value, src, module_state=table != "_modules")
    inst_dict = getattr(obj, "__dict__", None)
    entry = class_lookup(type(obj), name)
    # (a data descriptor has a __get__ too: one with only __set__ leaves reads to the instance dict)
    is_data_descriptor = entry is not _MISSING and hasattr(entry, "__set__") and hasattr(entry, "__get__") and \
        not isinstance(entry, V.Variable)
    if name == "__dict__" and isinstance(inst_dict, dict) and not isinstance(obj, torch.nn.Module):
        return instance_dict(tx, v)
    viewed = _viewed_dict(tx, obj)
    if viewed is not None and not is_data_descriptor:
        if name in viewed.items:
            return viewed.items[name]
    elif isinstance(inst_dict, dict) and name in inst_dict and not is_data_descriptor:
        return _wrap(tx, inst_dict[name], AttrSource(source, name) if source else None)
    elif viewed is None and isinstance(inst_dict, dict) and source is not None and not is_data_descriptor \
            and not isinstance(obj, torch.nn.Module):
        # what follows (the class's attribute, __getattr__, an AttributeError: `hasattr(obj, "z")`
        # False) holds while the instance has no attribute of that name: one set later is a miss
        # (a module's methods are many and read often: its instance attributes are not guarded so)
        from kiln.capture.guards import Guard, GuardKind
        tx.out.guard(Guard(GuardKind.ABSENT, AttrSource(source, "__dict__"), name))
    if entry is not _MISSING:
        return bind_class_entry(tx, entry, v, type(obj), name)
    getattr_hook = class_lookup(type(obj), "__getattr__")
    if isinstance(getattr_hook, types.FunctionType) and not isinstance(obj, torch.nn.Module):
        return tx.call(V.MethodVar(_function(getattr_hook), v), [V.Constant(name)])
    if viewed is not None or not hasattr(obj, name):
        tx.raise_(AttributeError, f"{type(obj).__name__!r} object has no attribute {name!r}")
    return _wrap(tx, getattr(obj, name), AttrSource(source, name) if source else None)


# [Note: an object's __dict__ in captured code] Attribute writes to a program's object are kept in
# the frame's overlay and replayed as setattr. Once the frame reads `obj.__dict__`, the tracker of
# that real dict (one per dict, builder's `_wrap_container`) becomes the store instead: the overlay's
# writes so far are moved into it, later reads and writes of `obj.attr` go through it, so the view
# shows `obj.c = 3` and `obj.attr` shows `d.pop("c")`. Both replays stay right: setattr in order, the
# dict's final contents once (`convert._effect_order`).
def instance_dict(tx, v: V.ObjectVar) -> V.Variable:
    """`obj.__dict__` of a program's object (a live view)."""
    obj = v.value
    d = _wrap(tx, obj.__dict__, AttrSource(v.source, "__dict__") if v.source else None)
    if not isinstance(d, V.DictVar):
        raise tx.unsupported(f"reading __dict__ of a {type(obj).__name__} whose attribute names are not all strings")
    overlay = tx.out.__dict__.setdefault("attr_overlay", {})
    for key in [key for key in overlay if key[0] == overlay_id(obj)]:
        d.items[key[1]] = overlay.pop(key)
    return d


def _viewed_dict(tx, obj) -> V.DictVar | None:
    """The tracker of `obj.__dict__` once the frame has read it, else None."""
    inst_dict = getattr(obj, "__dict__", None)
    if not isinstance(inst_dict, dict):
        return None
    d = tx.out.tensor_by_id.get(id(inst_dict))
    return d if isinstance(d, V.DictVar) else None


def _getattr_class(tx, v: V.ObjectVar, name: str) -> V.Variable:
    cls = v.value
    if name in ("__name__", "__qualname__", "__module__"):
        return V.Constant(getattr(cls, name))
    for klass in cls.__mro__:
        if name in klass.__dict__:
            entry = klass.__dict__[name]
            if isinstance(entry, types.FunctionType):
                return _function(entry)
            if isinstance(entry, staticmethod):
                return _plain(tx, entry.__func__)
            if isinstance(entry, classmethod):
                return _bound_classmethod(tx, entry, v)
            break
    if not hasattr(cls, name):
        tx.raise_(AttributeError, f"type object {cls.__name__!r} has no attribute {name!r}")
    return _wrap(tx, getattr(cls, name), AttrSource(v.source, name) if v.source else None)


def _getattr_new_object(tx, v: V.NewObjectVar, name: str) -> V.Variable:
    hooked = _through_getattribute(tx, v, v.cls, name)
    return hooked if hooked is not None else new_object_attribute(tx, v, name)


def _getattr_user_object(tx, v: V.ObjectVar, name: str) -> V.Variable:
    """An existing object's attribute: through its class's own `__getattribute__` when it has one
    in Python (an nn.Module's are left to the module path), else object's lookup."""
    obj = v.value
    if not isinstance(obj, (type, types.ModuleType, torch.nn.Module)):
        hooked = _through_getattribute(tx, v, type(obj), name)
        if hooked is not None:
            return hooked
    return _getattr_object(tx, v, name)


def _through_getattribute(tx, v: V.Variable, cls: type, name: str) -> V.Variable | None:
    """`v.name` by the class's own `__getattribute__` written in Python (transformers' configs map
    names; an object remaps one to another), with Python's fallback to `__getattr__` when it raises
    AttributeError; None when the class has no such method (object's lookup applies). Reading the
    instance dict past the method gave the unmapped attribute's value."""
    hook = class_lookup(cls, "__getattribute__")
    if not isinstance(hook, types.FunctionType):
        return None
    from kiln.capture.interpreter import ObservedException
    try:
        return tx.call(V.MethodVar(_function(hook), v), [V.Constant(name)])
    except ObservedException as e:
        fallback = class_lookup(cls, "__getattr__")
        if issubclass(e.exc.cls, AttributeError) and isinstance(fallback, types.FunctionType):
            return tx.call(V.MethodVar(_function(fallback), v), [V.Constant(name)])
        raise


def new_object_attribute(tx, v: V.NewObjectVar, name: str) -> V.Variable:
    """`object.__getattribute__(v, name)`: the instance's own attributes, then the class's."""
    if name in v.attrs:
        return v.attrs[name]
    if name == "__class__":
        return V.ObjectVar(v.cls)
    if name == "__dict__":  # a live view: the same dict as the object's attributes
        return V.DictVar(v.attrs)
    entry = class_lookup(v.cls, name)
    if entry is _MISSING:
        hook = class_lookup(v.cls, "__getattr__")
        if isinstance(hook, types.FunctionType):
            return tx.call(V.MethodVar(_function(hook), v), [V.Constant(name)])
        tx.raise_(AttributeError, f"{v.cls.__name__!r} object has no attribute {name!r}")
    return bind_class_entry(tx, entry, v, v.cls, name)


def _getattr_constant(tx, v: V.Constant, name: str) -> V.Variable:
    try:
        value = getattr(v.value, name)
    except AttributeError as e:
        tx.raise_(AttributeError, str(e))
    if callable(value) and not isinstance(value, type):
        return V.ObjectVar(value)  # a bound method of an immutable value: pure, folded when called
    return V.Constant(value)


def _getattr_tuple(tx, v: V.TupleVar, name: str) -> V.Variable:
    if name in v.attrs:   # an instance attribute of a user's tuple subclass
        return v.attrs[name]
    fields = getattr(v.cls, "_fields", None) or getattr(v.cls, "__match_args__", None)  # namedtuple, structseq
    if fields and name in fields:
        return v.items[fields.index(name)]
    from kiln.capture.constants import is_python_constant, python_value
    if v.cls is torch.Size or name in ("count", "index") and is_python_constant(v):
        return _getattr_constant(tx, V.Constant(python_value(v)), name)
    entry = class_lookup(v.cls, name)
    if entry is not _MISSING:
        return bind_class_entry(tx, entry, v, v.cls, name)
    tx.raise_(AttributeError, f"{v.cls.__name__!r} object has no attribute {name!r}")


def _getattr_container(tx, v: V.Variable, name: str) -> V.Variable:
    from kiln.capture.callables import attribute_for
    reader = attribute_for(v.python_type(), name)
    if reader is not None:
        return reader(tx, v)
    if isinstance(v, V.DictVar) and is_model_output(v.cls):
        field = getattr_field(tx, v, name)
        if field is not None:
            return field
    cls = v.python_type()
    user_subclass = cls.__module__ not in ("builtins", "collections")
    if user_subclass:  # its properties, its instance's attributes, its own methods, its __getattr__
        entry = class_lookup(cls, name)
        if hasattr(v, "attrs") and not isinstance(entry, property):
            if name in v.attrs:
                return v.attrs[name]
            if name == "__dict__":  # a live view: the same dict as the instance's attributes; the
                # program's own instance gets its writes through it back after the graph
                source = AttrSource(v.source, "__dict__") if v.source is not None else None
                return V.DictVar(v.attrs, dict, None, source=source)
        if isinstance(entry, (types.FunctionType, property, staticmethod, classmethod)):
            return bind_class_entry(tx, entry, v, cls, name)
    if name == "__class__":   # the container's class itself (`x.__class__(items)`), not type's method
        return V.ObjectVar(cls)
    method = getattr(cls, name, None)
    if method is None:
        hook = class_lookup(cls, "__getattr__") if user_subclass else _MISSING
        if isinstance(hook, types.FunctionType):
            return tx.call(V.MethodVar(_function(hook), v), [V.Constant(name)])
        tx.raise_(AttributeError, f"{v.python_type().__name__!r} object has no attribute {name!r}")
    return V.MethodVar(V.ObjectVar(method), v)


def _getattr_super(tx, v: V.SuperVar, name: str) -> V.Variable:
    obj_type = v.obj.python_type() if not isinstance(v.obj, V.ObjectVar) or not isinstance(v.obj.value, type) \
        else v.obj.value
    entry = class_lookup(obj_type, name, start_after=v.cls)
    if entry is _MISSING:
        tx.raise_(AttributeError, f"'super' object has no attribute {name!r}")
    if isinstance(entry, (types.WrapperDescriptorType, types.MethodDescriptorType)):
        return V.MethodVar(V.ObjectVar(entry), v.obj)
    return bind_class_entry(tx, entry, v.obj, obj_type, name)


def _getattr_function(tx, v: V.FunctionVar, name: str) -> V.Variable:
    if name in v.attrs:
        return v.attrs[name]
    if name == "__name__":
        return V.Constant(v.name)
    if name == "__qualname__":  # a function MAKE_FUNCTION made has its code's (Python 3.11+)
        return V.Constant(v.fn.__qualname__ if v.fn is not None else v.code.co_qualname)
    if name == "__module__" and v.fn is None:
        return V.Constant(v.globals.get("__name__"))
    if name == "__dict__" and v.fn is None:  # a live view, as `functools.update_wrapper` updates it
        return V.DictVar(v.attrs)
    if name == "__code__":
        return V.Constant(v.code)
    if v.fn is not None and hasattr(v.fn, name):
        return _wrap(tx, getattr(v.fn, name), AttrSource(v.source, name) if v.source else None)
    tx.raise_(AttributeError, f"function has no attribute {name!r}")


def _getattr_method(tx, v: V.MethodVar, name: str) -> V.Variable:
    if name == "__self__":
        return v.self_var
    if name == "__func__":
        return v.fn
    return getattr_var(tx, v.fn, name)


# what BaseException's own attributes are before the program sets them
_EXCEPTION_DEFAULTS = {"__context__": None, "__cause__": None, "__traceback__": None, "__suppress_context__": False}


def _getattr_exception(tx, v: V.ExceptionVar, name: str) -> V.Variable:
    if name in v.attrs:
        return v.attrs[name]
    if name == "args":
        return V.TupleVar(list(v.args))
    if name == "value" and issubclass(v.cls, StopIteration):
        return v.args[0] if v.args else V.Constant(None)
    if name == "__traceback__" and v.raised:
        raise tx.unsupported("reading __traceback__ of a raised exception (kiln keeps no tracebacks)")
    if name in _EXCEPTION_DEFAULTS:
        return V.Constant(_EXCEPTION_DEFAULTS[name])
    if name == "__class__":
        return V.ObjectVar(v.cls)
    entry = class_lookup(v.cls, name)
    if isinstance(entry, (types.FunctionType, property, staticmethod, classmethod)):
        return bind_class_entry(tx, entry, v, v.cls, name)
    if isinstance(entry, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return V.MethodVar(V.ObjectVar(entry), v)   # with_traceback, add_note, ...: `calls.py` models them
    if entry is not _MISSING and not hasattr(entry, "__get__"):
        return _wrap(tx, entry, None)   # a plain class attribute
    tx.raise_(AttributeError, f"{v.cls.__name__!r} object has no attribute {name!r}")


def _getattr_iterator(tx, v: V.Variable, name: str) -> V.Variable:
    """An iterator's own protocol read by name (`it.__iter__()`, `it.__next__()`): iter() and next()."""
    import builtins
    if name in ("__iter__", "__next__"):
        return V.MethodVar(V.ObjectVar(builtins.iter if name == "__iter__" else builtins.next), v)
    if name == "__length_hint__" and isinstance(v, V.IteratorVar) and v.hinted:
        return V.MethodVar(V.ObjectVar(operator.length_hint), v)
    raise tx.unsupported(f"reading attribute {name!r} of a {v.python_type().__name__}")


def _getattr_tensor(tx, v, name):
    from kiln.capture.torch_calls import tensor_getattr
    written = tx.out.__dict__.get("tensor_attrs", {}).get(id(v), {})
    if name in written:
        return written[name]
    return tensor_getattr(tx, v, name)


def _setattr_tensor(tx, t: V.TensorVar, name: str, value: V.Variable) -> bool:
    """`t.name = value` of an attribute of the program's own (`t.offloading_activation = flag`,
    not one of Tensor's), or of `t.grad`: read back from the frame's overlay while tracing, and set
    on the real tensor (an input, or the graph's output) after the graph. False where kiln does
    not model the store (`t.data = ...`, `t.requires_grad = ...`)."""
    if name == "data" and isinstance(value, V.TensorVar) and t.source is not None:
        _set_data(tx, t, value)
        return True
    if name != "grad" and hasattr(torch.Tensor, name):
        return False
    if name == "grad" and not (isinstance(value, V.TensorVar) or isinstance(value, V.Constant) and value.value is None):
        return False
    tx.out.__dict__.setdefault("tensor_attrs", {}).setdefault(id(t), {})[name] = value
    tx.out.__dict__.setdefault("tensor_attr_owners", []).append(t)   # keeps the id valid
    tx.out.side_effects.append(AttrWrite(t, name, value))
    return True


def _set_data(tx, t: V.TensorVar, value: V.TensorVar) -> None:
    """[Note: .data = ...] `x.data = y` of an input x: x stays the same object, with its own
    requires_grad, and from now on holds y's storage and metadata (y's values detached). In the
    graph, x's tracker is y detached; after the graph, the store is replayed on the real x with the
    value the graph computed, in order with the other stores (`y.data = ...` after it leaves x on
    y's old storage), and x itself is what the frame hands on. Where x requires grad, ops on its
    new data would differentiate to x in eager: the graph has no such input, so a later graph use
    of x breaks the graph instead ([Note: a replaced .data that requires grad] in torch_calls.py)."""
    from kiln.capture.torch_calls import call_torch
    detached = call_torch(tx, "call_method", "detach", [value], {})
    before = V.TensorVar(t.node, t.example, t.data_replaced, source=t.source)
    tx.out.side_effects.append(AttrWrite(before, "data", detached))
    t.node, t.data_replaced = detached.node, True
    t.example = detached.example.detach().requires_grad_(t.example.requires_grad)


_GETATTR = {
    V.TensorVar: _getattr_tensor,
    V.ObjectVar: _getattr_user_object,
    V.NewObjectVar: _getattr_new_object,
    V.Constant: _getattr_constant,
    V.TupleVar: _getattr_tuple,
    V.ListVar: _getattr_container,
    V.DictVar: _getattr_container,
    V.MappingProxyVar: _getattr_container,
    V.SetVar: _getattr_container,
    V.DictViewVar: _getattr_container,
    V.SuperVar: _getattr_super,
    V.FunctionVar: _getattr_function,
    V.MethodVar: _getattr_method,
    V.ExceptionVar: _getattr_exception,
    V.GeneratorVar: _getattr_container,
    V.IteratorVar: _getattr_iterator,
    V.LazyIteratorVar: _getattr_iterator,
    V.PartialVar: lambda tx, v, name: _getattr_partial(tx, v, name),
}


def _getattr_partial(tx, v: V.PartialVar, name: str) -> V.Variable:
    """`functools.partial`'s own attributes: `func`, `args`, `keywords`; it has no `__name__`."""
    if name == "func":
        return v.fn
    if name == "args":
        return V.TupleVar(list(v.args))
    if name == "keywords":
        return V.DictVar(dict(v.kwargs))
    if name == "__class__":
        return V.ObjectVar(v.python_type())
    if name in ("__name__", "__qualname__", "__code__", "__defaults__", "__wrapped__"):
        tx.raise_(AttributeError, f"'functools.partial' object has no attribute {name!r}")
    raise tx.unsupported(f"reading attribute {name!r} of a partial")


def getattr_var(tx, v: V.Variable, name: str) -> V.Variable:
    fn = _GETATTR.get(type(v))
    if fn is None:
        raise tx.unsupported(f"reading attribute {name!r} of a {v.python_type().__name__}")
    return fn(tx, v, name)


def _set_class(tx, obj: V.Variable, value: V.Variable):
    """`obj.__class__ = cls` of an object made in traced code: its tracker's class is `cls` from now
    on (isinstance, attribute lookups), as the object's is in Python. Another object's class would
    change under the trackers already made of it: the graph breaks."""
    cls = value.value if isinstance(value, V.ObjectVar) else None
    if not (isinstance(obj, V.NewObjectVar) and isinstance(cls, type) and cls.__new__ is obj.cls.__new__):
        raise tx.unsupported("assigning __class__ of an object captured code did not make")
    obj.cls = cls


def setattr_var(tx, obj: V.Variable, name: str, value: V.Variable, *, base: bool = False):
    """`obj.name = value`, as Python stores it: through the class's own `__setattr__` (unless `base`:
    object's store, which that method ends in), then a property's setter, then the instance."""
    if isinstance(obj, V.DictVar) and is_model_output(obj.cls):
        return setattr_field(tx, obj, name, value)
    if name == "__class__":
        return _set_class(tx, obj, value)
    plain_object = isinstance(obj, V.ObjectVar) and obj.source is not None and \
        not isinstance(obj.value, (type, torch.nn.Module))   # nn.Module's own stores: the overlay below
    program_subclass = _program_dict_subclass(obj)
    if keeps_attributes(obj) or plain_object or program_subclass:
        cls = obj.python_type()
        hook = class_lookup(cls, "__setattr__")
        if not base and isinstance(hook, types.FunctionType):  # the class's own, which ends in object.__setattr__
            tx.call(V.MethodVar(_function(hook), obj), [V.Constant(name), value])
            return
        entry = class_lookup(cls, name)
        if isinstance(entry, property):
            if entry.fset is None:
                tx.raise_(AttributeError, f"property {name!r} of {cls.__name__!r} object has no setter")
            tx.call(_plain(tx, entry.fset), [obj, value])
            return
        setter = class_lookup(type(entry), "__set__") if entry is not _MISSING else _MISSING
        if isinstance(setter, types.FunctionType):   # a descriptor written in Python: its __set__ stores
            descriptor = _wrap(tx, entry, _class_entry_source(obj, cls, name))
            tx.call(V.MethodVar(_function(setter), descriptor), [obj, value])
            return
    if keeps_attributes(obj):
        obj.attrs[name] = value
        return
    if program_subclass:   # read back from the tracker's attrs, written to the real object after the graph
        obj.attrs[name] = value
        tx.out.side_effects.append(AttrWrite(obj, name, value))
        return
    if isinstance(obj, V.FunctionVar) and obj.fn is None:  # made in traced code (a wrapper functools.wraps names)
        if name == "__name__":
            from kiln.capture.constants import python_value
            obj.name = python_value(value)
        else:
            obj.attrs[name] = value
        return
    if isinstance(obj, V.ObjectVar) and (obj.source is not None or isinstance(obj.value, types.ModuleType)) and \
            not isinstance(obj.value, type):   # a module kiln reads unguarded is written through a constant
        viewed = _viewed_dict(tx, obj.value)
        if viewed is not None:
            viewed.items[name] = value
        else:
            tx.out.__dict__.setdefault("attr_overlay", {})[(overlay_id(obj.value), name)] = value
        hooked = plain_object and isinstance(class_lookup(type(obj.value), "__setattr__"), types.FunctionType)
        tx.out.side_effects.append(AttrWrite(obj, name, value, past_hook=hooked))
        return
    if isinstance(obj, V.ExceptionVar):
        set_exception_attribute(tx, obj, name, value)
        return
    if isinstance(obj, V.TensorVar) and _setattr_tensor(tx, obj, name, value):
        return
    if isinstance(obj, V.TupleVar) and obj.source is not None and obj.cls.__dictoffset__ != 0:
        # an input instance of a user's tuple subclass (a namedtuple's): read back from the tracker,
        # set on the real object after the graph (a list, dict or set subclass has its own path above)
        obj.attrs[name] = value
        tx.out.side_effects.append(AttrWrite(obj, name, value))
        return
    if isinstance(obj, (V.ListVar, V.TupleVar, V.SetVar, V.DictVar)) and obj.python_type().__dictoffset__ == 0 and \
            class_lookup(obj.python_type(), name) is _MISSING:   # no instance dict: a builtin, a namedtuple
        tx.raise_(AttributeError, f"{obj.python_type().__name__!r} object has no attribute {name!r}"
                                  + (" and no __dict__ for setting new attributes" if sys.version_info >= (3, 13) else ""))
    raise tx.unsupported(f"setting attribute {name!r} on a {obj.python_type().__name__}")


def set_exception_attribute(tx, exc: V.ExceptionVar, name: str, value: V.Variable):
    """`exc.name = value`, with BaseException's checks on its chaining attributes."""
    from kiln.capture.constants import python_value
    if name in ("__context__", "__cause__"):
        if not (isinstance(value, V.ExceptionVar) or isinstance(value, V.Constant) and value.value is None):
            tx.raise_(TypeError, f"exception {'context' if name == '__context__' else 'cause'} must be None "
                                 "or derive from BaseException")
        if name == "__cause__":
            exc.attrs["__suppress_context__"] = V.Constant(True)
    elif name == "__suppress_context__":
        value = V.Constant(bool(python_value(value)))
    elif name == "args":
        exc.args = list(tx.call(V.ObjectVar(tuple), [value]).items)   # what tuple(value) holds
        return
    exc.attrs[name] = value


def _program_dict_subclass(v: V.Variable) -> bool:
    """A program's instance of a user's dict subclass, held as a dict tracker whose `attrs` were read
    from its `__dict__` (`builder._wrap_dict`)."""
    return isinstance(v, V.DictVar) and v.source is not None and v.cls.__module__ not in _BUILTIN_HOMES and \
        not v.cls.__module__.startswith("torch") and v.cls.__dictoffset__ != 0 and not is_model_output(v.cls)


def keeps_attributes(v: V.Variable) -> bool:
    """A tracker that holds its instance attributes (`attrs`): an instance of a user's class, or of a
    user's dict, list or set subclass, made in traced code."""
    return isinstance(v, V.NewObjectVar) or isinstance(v, (V.DictVar, V.ListVar, V.SetVar, V.TupleVar)) and \
        v.source is None and v.cls.__module__ not in ("builtins", "collections") and \
        not v.cls.__module__.startswith("torch") and v.cls.__dictoffset__ != 0   # not a namedtuple or __slots__ class


# [Note: subclasses of builtin containers] An instance of a user's subclass of dict, list, set or
# frozenset made in traced code is the builtin's tracker with `cls` set to the subclass. Python's
# protocols (`x[k]`, `x[k] = v`, `del`, `in`, `len`, iteration, operators, truth) first look for the
# subclass's own Python method (`overridden`) and inline it; what it does not override runs on the
# builtin's model, as the C slot would. Explicit calls of the builtin's slot (`super().__setitem__`,
# `set.__or__(p, q)`) reach that model directly (`containers.py`'s dunder table).
_BUILTIN_HOMES = ("builtins", "collections")


def overridden(v: V.Variable, name: str):
    """The subclass's own Python method `name`, for a container tracker of a user's subclass of a
    builtin container; None otherwise."""
    if not isinstance(v, (V.ListVar, V.TupleVar, V.SetVar, V.DictVar)):
        return None
    cls = v.python_type()
    if cls.__module__ in _BUILTIN_HOMES or cls.__module__.startswith("torch") or is_model_output(cls):
        return None
    entry = class_lookup(cls, name)
    return entry if isinstance(entry, types.FunctionType) else None


def call_overridden(tx, v: V.Variable, name: str, args: list):
    """`v.name(*args)` through the subclass's own method, or None where it has none."""
    method = overridden(v, name)
    return None if method is None else tx.call(V.MethodVar(_function(method), v), args)


def delattr_var(tx, obj: V.Variable, name: str):
    """`del obj.attr` on an object made inside captured code (contextlib's generator context manager
    drops its arguments on entry); a later read falls back to the class, as in Python."""
    if isinstance(obj, V.NewObjectVar) and not isinstance(class_lookup(obj.cls, "__delattr__"), types.FunctionType):
        if name not in obj.attrs:
            tx.raise_(AttributeError, name)
        del obj.attrs[name]
        return
    if isinstance(obj, V.ObjectVar) and obj.source is not None and _plain_instance(obj.value):
        # the program's own object: gone from the frame's view now, deleted from the object after the graph
        key = (overlay_id(obj.value), name)
        overlay = tx.out.__dict__.setdefault("attr_overlay", {})
        present = overlay[key] is not DELETED if key in overlay else name in obj.value.__dict__
        if key not in overlay:
            from kiln.capture.guards import Guard, GuardKind
            tx.out.guard(Guard(GuardKind.PRESENT if present else GuardKind.ABSENT, AttrSource(obj.source, "__dict__"),
                               name))
        if not present:
            tx.raise_(AttributeError, name)
        overlay[key] = DELETED
        tx.out.side_effects.append(AttrDelete(obj, name))
        return
    raise tx.unsupported(f"deleting attribute {name!r} of a {obj.python_type().__name__}")


DELETED = object()   # in the frame's attribute overlay: an attribute `del obj.name` removed


def _plain_instance(obj) -> bool:
    """An instance of a Python class keeping its attributes in a plain `__dict__`, with no
    `__delattr__` or descriptors of its own in the way (not a module, class, or nn.Module)."""
    cls = type(obj)
    return isinstance(getattr(obj, "__dict__", None), dict) and not isinstance(obj, (type, types.ModuleType,
                                                                                     torch.nn.Module)) \
        and class_lookup(cls, "__delattr__") is object.__delattr__


# -- containers that are real objects (nn.ModuleList and friends) ------------------------------------
def _module_children(tx, v: V.ObjectVar) -> list[tuple[str, V.Variable]]:
    mod = v.value
    return [(k, _wrap(tx, m, DictEntrySource(v.source, "_modules", k) if v.source else None))
            for k, m in mod._modules.items() if m is not None]


def iterate_object(tx, v: V.ObjectVar) -> list[V.Variable] | V.Variable:
    """The items of a real object (modules' containers, real containers), or, for a class with a
    Python `__iter__`, the iterator it returned, which `semantics.iterate` walks."""
    obj = v.value
    if isinstance(obj, torch.nn.ModuleDict):
        return [V.Constant(k) for k in obj._modules]
    if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential)):
        return [m for _, m in _module_children(tx, v)]
    if isinstance(obj, (torch.nn.ParameterList,)):
        return [_wrap(tx, p, DictEntrySource(v.source, "_parameters", k) if v.source else None, module_state=True)
                for k, p in obj._parameters.items()]
    if isinstance(obj, torch.nn.ParameterDict):
        return [V.Constant(k) for k in obj.keys()]
    it = class_lookup(type(obj), "__iter__")
    if isinstance(it, types.FunctionType):
        return tx.call(V.MethodVar(_function(it), v), [])  # the iterator: `semantics.iterate` walks it
    if isinstance(obj, (dict, list, tuple, set, frozenset, range)):
        if v.source is not None and not isinstance(obj, range):
            _guard_members(tx, v)
        return [_wrap(tx, x, None) for x in obj]
    raise tx.unsupported(f"iterating over a {type(obj).__name__}")


def _guard_members(tx, v: V.ObjectVar) -> None:
    """Iterating a real container held whole (a set of classes, a dict keyed by functions) reads
    its members: guard them, in order, by `==` where it tells them apart (constants, classes,
    functions), else by identity (tensors, user objects: the members are then kept alive)."""
    from kiln.capture.builder import _constant_key
    from kiln.capture.guards import Guard, GuardKind
    members = tuple(v.value)
    if all(_constant_key(m) or isinstance(m, types.FunctionType) for m in members):
        tx.out.guard(Guard(GuardKind.DICT_KEYS, v.source, members))
        return
    tx.out.keepalive.append(members)
    tx.out.guard(Guard(GuardKind.MEMBER_IDS, v.source, tuple(map(id, members))))


def _input_tensor(tx, key: V.TensorVar) -> Any:
    """The real tensor an input's tracker stands for (a dict of the program's keyed by it); the
    tracker itself where it is none (a tensor the graph computes: no real key finds it)."""
    return next((t for t in tx.out.keepalive if isinstance(t, torch.Tensor) and tx.out.tensor_by_id.get(id(t)) is key),
                key)


_TYPING_MODULES = ("typing", "typing_extensions", "types")


def _literal(key) -> bool:
    """Whether a key prints as a Python literal in guards and generated code (`ItemSource.expr`)."""
    if isinstance(key, tuple):
        return all(_literal(k) for k in key)
    return type(key) in (int, str, bool, bytes, type(None)) or type(key) is float and key == key and \
        abs(key) != float("inf")


def object_getitem(tx, v: V.Variable, key: V.Variable) -> V.Variable:
    from kiln.capture.constants import is_python_constant, python_value
    obj = getattr(v, "value", None)
    if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential)):
        k = python_value(key)
        children = _module_children(tx, v)
        if isinstance(k, slice) and isinstance(obj, torch.nn.ModuleList):
            # `self.layers[:n]` is iterated over; a tuple of the children serves for that
            return V.TupleVar([m for _, m in children[k]])
        if isinstance(k, slice):
            raise tx.unsupported("slicing an nn.Sequential inside captured code")
        return children[k][1]
    if isinstance(obj, torch.nn.ModuleDict):
        k = python_value(key)
        return _wrap(tx, obj._modules[k], DictEntrySource(v.source, "_modules", k) if v.source else None)
    if isinstance(obj, torch.nn.ParameterList):
        k = python_value(key)
        name = list(obj._parameters)[k]
        return _wrap(tx, obj._parameters[name], DictEntrySource(v.source, "_parameters", name) if v.source else None,
                     module_state=True)
    cls = v.python_type() if isinstance(v, V.NewObjectVar) else type(obj)
    generic_class = isinstance(obj, type) and hasattr(obj, "__class_getitem__")
    if (cls.__module__ in _TYPING_MODULES or generic_class) and is_python_constant(key):
        # `Optional[int]`, `Dict[str, Tensor]`: typing's subscriptions are pure and cached, so run them;
        # so is a class subscripted (`list[int]`, `collections.abc.Callable[[T], bool]` in an
        # annotation evaluated at def time): a generic alias made by its `__class_getitem__`
        try:
            return _wrap(tx, obj[python_value(key)], None)
        except TypeError as e:
            tx.raise_(TypeError, str(e))
    entry = class_lookup(cls, "__getitem__")
    if isinstance(entry, types.FunctionType):
        return tx.call(V.MethodVar(_function(entry), v), [key])
    if isinstance(obj, (dict, list, tuple)):
        k = _input_tensor(tx, key) if isinstance(key, V.TensorVar) else python_value(key)
        if v.source is not None and not _literal(k):
            if type(obj) is dict and key.source is not None and k in obj:
                # the key is an object another source reads (an argument): the item is read through
                # it, so a later call's key object finds its own item; a missing one fails the guards.
                # The keys are guarded in order, as Dynamo specializes a dict's key order (a dict
                # keyed by tensors is keyed by their identity)
                _guard_members(tx, v)
                return _wrap(tx, obj[k], KeyedItemSource(v.source, key.source))
            raise tx.unsupported(f"reading a {type(obj).__name__} of the program's by a {type(k).__name__} key")
        return builtin_getitem(tx, v, key)
    raise tx.unsupported(f"indexing a {cls.__name__}")


def builtin_getitem(tx, v: V.ObjectVar, key: V.Variable) -> V.Variable:
    """The item of a real dict/list/tuple by the builtin's own lookup, past any subclass override
    (what `super().__getitem__(k)` inside that override reads)."""
    from kiln.capture.constants import python_value
    obj, k = v.value, python_value(key)
    base = next(b for b in (dict, list, tuple) if isinstance(obj, b))
    try:
        item = base.__getitem__(obj, k)
    except (KeyError, IndexError, TypeError) as e:  # the program's own exception (os.environ.get catches it)
        if isinstance(e, KeyError) and base is dict and v.source is not None:
            from kiln.capture.guards import Guard, GuardKind   # ...until the key appears
            tx.out.guard(Guard(GuardKind.ABSENT, v.source, k))
        tx.raise_(type(e), *e.args)
    plain = type(obj) is base  # a subclass may override what `[k]` means: guards read past it
    source = (ItemSource(v.source, k) if plain else BuiltinItemSource(v.source, k, base.__name__)) if v.source else None
    return _wrap(tx, item, source)


def object_contains(tx, v: V.ObjectVar, item: Any) -> bool:
    obj = v.value
    if isinstance(obj, torch.nn.ModuleDict):
        return item in obj._modules
    if isinstance(obj, (dict, list, tuple, set, frozenset, str)):
        found = item in obj
        if v.source is not None:  # the answer is the container's contents, read: guard it
            from kiln.capture.guards import Guard, GuardKind
            tx.out.guard(Guard(GuardKind.PRESENT if found else GuardKind.ABSENT, v.source, item))
        return found
    raise tx.unsupported(f"`in` on a {type(obj).__name__}")


_REFLECTED_COMPARISONS = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_IN_PLACE = {"iadd", "isub", "imul", "imatmul", "itruediv", "ifloordiv", "imod", "ipow", "ilshift", "irshift",
             "iand", "ixor", "ior", "iconcat"}
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "matmul": "@", "truediv": "/", "floordiv": "//", "mod": "%",
            "pow": "** or pow()", "lshift": "<<", "rshift": ">>", "and": "&", "xor": "^", "or": "|",
            "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def operator_dunders(op) -> tuple[str, str, str | None]:
    """(`__op__`, its reflected name, the plain one an in-place op falls back to) for an operator
    function: operator.or_ -> ("__or__", "__ror__", None), operator.ior -> ("__ior__", "__ror__",
    "__or__"), operator.lt -> ("__lt__", "__gt__", None)."""
    name = op.__name__.strip("_")
    if name in _IN_PLACE:
        plain = name[1:]
        return f"__{name}__", f"__r{plain}__", f"__{plain}__"
    if name in _REFLECTED_COMPARISONS:
        return f"__{name}__", f"__{_REFLECTED_COMPARISONS[name]}__", None
    return f"__{name}__", f"__r{name}__", None


def _operand_class(v: V.Variable) -> type | None:
    """The user class whose operator methods `v` answers with: an object made in traced code, or an
    existing instance of a class written in Python (not a class, module or function itself)."""
    if isinstance(v, V.NewObjectVar):
        return v.cls
    if isinstance(v, V.ObjectVar) and not isinstance(v.value, (type, types.ModuleType, types.FunctionType,
                                                                 types.BuiltinFunctionType, types.MethodType)):
        # the standard library's classes (weakref's dicts, fractions) are folded as before
        top = (type(v.value).__module__ or "builtins").split(".")[0]
        return type(v.value) if top != "builtins" and top not in sys.stdlib_module_names else None
    return None


def call_user_method(tx, v: V.Variable, name: str, args=()) -> V.Variable | None:
    """`v.name(*args)` where `v` is a user object whose class defines `name` in Python (`__neg__`,
    `__abs__`, `__index__`, `__contains__`, `__str__`...): the method is traced, so what it reads
    is read (and guarded) as in any call; None where the class has no such method. A builtin folded
    on such an object at capture time instead ran the method on the first call's object, and later
    calls with other objects of the class got its answer back."""
    cls = _operand_class(v)
    if cls is None or issubclass(cls, torch.nn.Module):
        return None
    entry = class_lookup(cls, name)
    if not isinstance(entry, types.FunctionType):
        return None
    return tx.call(V.MethodVar(_function(entry), v), list(args))


def has_user_operator(op, a: V.Variable, b: V.Variable) -> bool:
    """Whether `a op b` reaches a method written in Python on an existing user object (`a.__add__`,
    `b.__radd__`): then the operator is traced through that method, as a call is, instead of folded
    on the objects the first call passed in (which a later call with other objects of the same class
    would get back, stale)."""
    name, reflected, plain = operator_dunders(op)
    for v, names in ((a, (name, plain)), (b, (reflected,))):
        if isinstance(v, V.ObjectVar) and (cls := _operand_class(v)) is not None and \
                any(n and isinstance(class_lookup(cls, n), types.FunctionType) for n in names):
            return True
    return False


def dunder_binary(tx, op, a: V.Variable, b: V.Variable) -> V.Variable:
    """An operator where an operand is an object of a user's class made in traced code, by Python's
    protocol: the left operand's method (its in-place one first), then the right one's reflected
    method (first, when the right's class is a subclass of the left's that overrides it); a method
    answering NotImplemented passes to the next. With none left: identity for == and !=, else the
    TypeError Python raises. An operand that is not a user object answers NotImplemented, as the C
    slots of builtins do for a foreign object."""
    name, reflected, plain = operator_dunders(op)
    tries = [(a, name, b)] if plain is not None else []
    name = plain or name
    right_first = _operand_class(b) is not None and b.python_type() is not a.python_type() and \
        issubclass(b.python_type(), a.python_type()) and \
        class_lookup(b.python_type(), reflected) is not class_lookup(a.python_type(), reflected)
    tries += [(b, reflected, a), (a, name, b)] if right_first else [(a, name, b), (b, reflected, a)]
    for receiver, method, other in tries:
        cls = _operand_class(receiver)
        if cls is None:
            continue
        entry = class_lookup(cls, method)
        if entry is _MISSING or entry is None:
            continue
        if not isinstance(entry, types.FunctionType):
            if getattr(entry, "__objclass__", None) is object:
                continue   # object's own slots answer NotImplemented (== and != are below)
            raise tx.unsupported(f"operator {op.__name__} through {cls.__name__}.{method}, "
                                 "which is not Python code")
        result = tx.call(V.MethodVar(_function(entry), receiver), [other])
        if not V.is_not_implemented(result):
            return result
    short = op.__name__.strip("_").removeprefix("i") if plain is not None else op.__name__.strip("_")
    if short in ("eq", "ne"):
        from kiln.capture.constants import is_same
        return V.Constant(is_same(tx, a, b) == (short == "eq"))
    left, right = a.python_type().__name__, b.python_type().__name__
    if short in ("lt", "le", "gt", "ge"):
        tx.raise_(TypeError, f"'{_SYMBOLS[short]}' not supported between instances of '{left}' and '{right}'")
    symbol = _SYMBOLS.get(short, short) + ("=" if plain is not None else "")
    tx.raise_(TypeError, f"unsupported operand type(s) for {symbol}: '{left}' and '{right}'")
