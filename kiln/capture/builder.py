"""Wrapping real Python values read from a source into trackers, with the guards they imply.

`wrap(out, value, source)` dispatches on the value's type through `_WRAPPERS` (exact type first,
then the MRO), so a new kind of value is one entry. Tensors become graph inputs (or `get_attr`
nodes for module parameters and buffers); constants are specialized with a guard on their value;
containers are wrapped item by item with a length/keys guard (sets: their members, in order);
functions, classes and modules are guarded by identity.
"""
from __future__ import annotations

import dataclasses

import collections
import enum
import functools
import types
from typing import Any, Callable

import torch

from kiln.capture import controls
from kiln.capture import variables as V
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.output import OutputGraph
from kiln.capture.rebuild import ResumeIterator
from kiln.capture.sources import BuiltinItemSource, ItemSource, Source

CONSTANT_TYPES = (int, float, bool, str, bytes, type(None), complex, torch.dtype, torch.device, range, slice,
                  type(Ellipsis), type(NotImplemented), torch.memory_format, torch.layout, enum.Enum)


def wrap(out: OutputGraph, value: Any, source: Source | None, *, module_state: bool = False) -> V.Variable:
    """A tracker for `value`. `module_state`: a parameter or buffer read from an nn.Module."""
    if isinstance(value, torch.Tensor):
        return _wrap_tensor(out, value, source, module_state)
    original = compiled_original(value)
    if original is not None:
        # a kiln-compiled callable called from captured code: inline what it wraps
        _guard(out, GuardKind.ID, source, value)
        out.keepalive.append(value)
        return wrap(out, original, None)
    if isinstance(value, _MUTABLE_CONTAINERS):
        return _wrap_container(out, value, source)
    if type(value).__module__ == "numpy":
        from kiln.capture.callables import handler_for
        handler_for(None)   # loads the call families: numpy_calls registers NumPy arrays' wrapper
    for cls in type(value).__mro__:
        fn = _WRAPPERS.get(cls)
        if fn is not None:
            return fn(out, value, source)
    return _wrap_object(out, value, source)


def _wrap_container(out, value, source):
    """One tracker per real list/dict/iterator, however many sources reach it (two arguments, a local
    and an attribute, a list held twice in another): a mutation through one alias is seen through
    all, as in Python. A second source is guarded to be the same object."""
    known = out.tensor_by_id.get(id(value))
    if known is not None:
        if source is not None and known.source is not None and source != known.source:
            same = _alias_guard(out, source, known.source)
            if same is not None:
                out.guard(same)
        elif known.source is None:
            known.source = source
        return known
    fn = next(_WRAPPERS[cls] for cls in type(value).__mro__ if cls in _WRAPPERS)
    var = out.tensor_by_id[id(value)] = fn(out, value, source)
    out.keepalive.append(value)
    return var


def _alias_guard(out, source, known):
    """The guard that two sources still reach one container, in its cheapest sufficient form:
    - two objects' instance dicts (`a.__dict__`, `b.__dict__`: a config read through its class's
      `__getattribute__` from every layer) are one dict while the objects are one object: `a is
      b`, which [Note: settled module state] can settle where both are read from modules;
    - a class attribute read the same way from two objects' classes (`type(a).__mro__[0].__dict__
      ['attribute_map']`) is one object wherever both classes are guarded to be one class: no guard;
    - otherwise `source is known`."""
    from kiln.capture.sources import AttrSource
    if isinstance(source, AttrSource) and isinstance(known, AttrSource) and source.attr == known.attr == "__dict__":
        return Guard(GuardKind.SAME, source.base, known.base)
    a, b = _class_path(source), _class_path(known)
    if a is not None and b is not None and a[1] == b[1]:
        classes = {g.source: g.expected for g in out.guards if g.kind is GuardKind.TYPE}
        if a[0] in classes and classes.get(a[0]) is classes.get(b[0], object()):
            return None
    return Guard(GuardKind.SAME, source, known)


def _class_path(source):
    """(the object whose class `source` starts from, the steps after `type(...)`), or None."""
    from kiln.capture.sources import TypeSource
    steps = []
    while source is not None and not isinstance(source, TypeSource):
        fields = [f for f in dataclasses.fields(source) if f.name != "base"] if dataclasses.is_dataclass(source) else None
        if fields is None or not hasattr(source, "base"):
            return None
        steps.append((type(source), tuple(getattr(source, f.name) for f in fields)))
        source = source.base
    return None if source is None else (source.base, tuple(steps))


def compiled_original(value: Any) -> Any:
    """What a kiln-compiled callable wraps, or None. The marker is looked up on the type, never by
    `getattr` on the value: objects with a permissive `__getattr__` (`torch.ops` and its namespaces,
    mocks) would answer any name, and `torch.ops` would even grow a namespace of that name."""
    if isinstance(value, type):
        return None
    for klass in type(value).__mro__:
        if "__kiln_original__" in klass.__dict__:
            return value.__kiln_original__
    return None


def _wrap_tensor(out, value, source, module_state):
    known = out.tensor_by_id.get(id(value))
    if known is not None:
        if source is not None and known.source is not None and source != known.source and not module_state:
            out.guard(Guard(GuardKind.SAME, source, known.source))  # the graph has one input for both
        return known
    if source is None:
        # a tensor the program made outside the graph (e.g. a global created at import): a constant
        # attribute of the graph, shared by identity
        from kiln.capture.sources import ConstSource
        source = ConstSource(f"<tensor {id(value):x}>")
        module_state = True
    var = out.parameter(value, source) if module_state else out.tensor_input(value, source)
    out.tensor_by_id[id(value)] = var
    out.keepalive.append(value)
    return var


def _guard(out, kind, source, expected):
    if source is not None:
        out.guard(Guard(kind, source, expected))


def _wrap_constant(out, value, source):
    if type(value) is int and source is not None and (source in out.dynamic_ints or controls.configured_dynamic(source)):
        return out.int_input(value, source)
    _guard(out, GuardKind.CONST, source, value)
    return V.Constant(value, source=source)


def _wrap_sequence(out, value, source):
    if isinstance(value, list) and _overrides_items(type(value), list):
        return _wrap_object(out, value, source)
    if hasattr(type(value), "n_sequence_fields") and all(type(v) in (int, str, float, bool) for v in value):
        # a struct sequence of constants (sys.version_info, sys.flags): its class cannot always be
        # called to remake it, so it stays the real value, guarded equal
        return _wrap_constant(out, value, source)
    _guard(out, GuardKind.TYPE, source, type(value))
    _guard(out, GuardKind.LEN, source, len(value))
    base = list if isinstance(value, list) else tuple
    own_getitem = any("__getitem__" in klass.__dict__ for klass in type(value).__mro__[:type(value).__mro__.index(base)])
    # a tuple subclass's own `__getitem__` (a namedtuple slicing its fields) is not how guards and
    # graph inputs read its items: the builtin's lookup is
    item = (lambda i: BuiltinItemSource(source, i, base.__name__)) if own_getitem else (lambda i: ItemSource(source, i))
    items = [wrap(out, v, item(i) if source else None) for i, v in enumerate(value)]
    if isinstance(value, list):
        return V.ListVar(items, type(value), source=source)
    return V.TupleVar(items, type(value), source=source)


def _wrap_deque(out, value, source):
    from kiln.capture.sources import AttrSource
    _guard(out, GuardKind.TYPE, source, type(value))
    _guard(out, GuardKind.LEN, source, len(value))
    _guard(out, GuardKind.CONST, AttrSource(source, "maxlen") if source else None, value.maxlen)
    items = [wrap(out, v, ItemSource(source, i) if source else None) for i, v in enumerate(value)]
    return V.ListVar(items, collections.deque, value.maxlen, source=source)


def _overrides_items(cls: type, base: type) -> bool:
    """Does a subclass of list/dict change how its items are read (`ACT2FN[name]` builds a module)?
    Then it is an object whose Python methods are followed, not a plain container."""
    from kiln.capture.model_outputs import is_model_output
    if cls is base or is_model_output(cls):
        return False
    for klass in cls.__mro__[:cls.__mro__.index(base)]:
        if any(isinstance(klass.__dict__.get(name), types.FunctionType) for name in _ITEM_METHODS):
            return True
    return False


def _overrides_getitem_only(cls: type) -> bool:
    """A plain dict's subclass whose one item method of its own is `__getitem__` (counting its reads,
    adjusting what it returns): a dict tracker, so the program can write it too, and each read runs
    the subclass's `__getitem__` (`attributes.overridden`). An OrderedDict's subclass stays an object
    (transformers' ACT2FN builds a module in its `__getitem__`)."""
    if issubclass(cls, collections.OrderedDict) or cls.__module__ in ("builtins", "collections"):
        return False
    own = {name for klass in cls.__mro__[:cls.__mro__.index(dict)] for name in _ITEM_METHODS
           if isinstance(klass.__dict__.get(name), types.FunctionType)}
    return own == {"__getitem__"}


_ITEM_METHODS = ("__getitem__", "__iter__", "__contains__", "__len__", "get", "keys", "values", "items")


def _plain_key(k) -> bool:
    """A key whose repr is an expression evaluating to it in a guard (`torch` in scope there):
    strings, ints, and tuples of them, bools, None and dtypes (`{("cuda", torch.bfloat16): ...}`)."""
    if isinstance(k, tuple):
        return all(isinstance(x, (str, int, type(None), torch.dtype)) for x in k)
    return isinstance(k, (str, int, enum.Enum))


def _wrap_dict(out, value, source):
    if type(value) is dict and not all(_plain_key(k) for k in value) and _is_table(value):
        # a table keyed by classes or typing forms (huggingface_hub's validators by type origin):
        # keys a guard cannot print, so the whole dict is guarded equal to a copy of it
        _guard(out, GuardKind.CONST, source, dict(value))
        return V.DictVar({k: wrap(out, v, None) for k, v in value.items()}, dict, None, source=source)
    if not all(_plain_key(k) for k in value) or _overrides_items(type(value), dict) and \
            not _overrides_getitem_only(type(value)):
        return _wrap_object(out, value, source)
    return dict_tracker(out, value, source)


def dict_tracker(out, value: dict, source):
    """A dict's tracker: its keys guarded, each item read from its source (past the subclass's own
    `__getitem__`, which is not what a guard or a later read of an item should run)."""
    _guard(out, GuardKind.TYPE, source, type(value))
    _guard(out, GuardKind.DICT_KEYS, source, tuple(value))
    item = (lambda k: BuiltinItemSource(source, k, "dict")) if _overrides_items(type(value), dict) else \
        (lambda k: ItemSource(source, k))
    items = {k: wrap(out, v, item(k) if source else None) for k, v in value.items()}
    factory = None
    if isinstance(value, collections.defaultdict):  # its factory, guarded (identity, or None)
        from kiln.capture.sources import AttrSource
        factory = wrap(out, value.default_factory, AttrSource(source, "default_factory") if source else None)
        factory = None if isinstance(factory, V.Constant) and factory.value is None else factory
    attrs = {}
    if type(value) not in (dict, collections.OrderedDict, collections.defaultdict) and \
            isinstance(getattr(value, "__dict__", None), dict):
        # a user's subclass instance: its own attributes are read from the tracker (`sd.attr`), the
        # names guarded whole so an attribute added or removed is seen
        from kiln.capture.sources import AttrSource
        instance = AttrSource(source, "__dict__") if source else None
        _guard(out, GuardKind.DICT_KEYS, instance, tuple(value.__dict__))
        attrs = {k: wrap(out, a, ItemSource(instance, k) if instance else None) for k, a in value.__dict__.items()}
    return V.DictVar(items, type(value), factory, attrs=attrs, source=source)


def _wrap_set(out, value, source):
    """A set or frozenset of plain members: a tracker of its members, guarded on them in iteration
    order (`in`, `len()`, iteration and set algebra all read the contents). A subclass, members a
    guard cannot print, or a copy that would iterate in another order than the set itself stay
    real objects (whose reads guard what they read, `attributes.object_contains`)."""
    copy = type(value)(value) if type(value) in (set, frozenset) else None
    if copy is None or not all(_plain_key(k) for k in value) or list(copy) != list(value):
        return _wrap_object(out, value, source)
    _guard(out, GuardKind.TYPE, source, type(value))
    _guard(out, GuardKind.DICT_KEYS, source, tuple(value))
    return V.SetVar(copy, {k: wrap(out, k, None) for k in copy}, type(value), source=source)


_TABLE_VALUES = (types.FunctionType, types.BuiltinFunctionType, type, str, int, float, bool, type(None))


def _is_table(value: dict) -> bool:
    """A small dict whose keys are constants (classes, typing forms, dtypes, tuples of them) and whose
    values compare by identity or by value (functions, classes, scalars), so `==` against a copy
    tells whether it changed."""
    return len(value) <= 64 and all(_table_value(v) for v in value.values()) and \
        all(_constant_key(k) for k in value)


def _table_value(v) -> bool:
    """A value `==` compares faithfully: functions, classes, scalars, and tuples of them
    (torch.testing's tolerances by dtype)."""
    return isinstance(v, _TABLE_VALUES) or type(v) is tuple and all(_table_value(i) for i in v)


def _constant_key(k) -> bool:
    if isinstance(k, tuple):
        return all(_constant_key(i) for i in k)
    # functions compare by identity: `==` against a copy still tells a changed key (namedtuple, a
    # factory function, as keys of a table of constructors)
    return isinstance(k, (type, str, int, float, type(None), torch.dtype, torch.device, enum.Enum,
                          types.FunctionType, types.BuiltinFunctionType)) or \
        type(k).__module__ in ("typing", "types", "typing_extensions")


def _wrap_function(out, value, source):
    _guard(out, GuardKind.ID, source, value)
    out.keepalive.append(value)
    return V.FunctionVar(value.__code__, value.__globals__, value.__name__, value.__defaults__ or (),
                         dict(value.__kwdefaults__ or {}), value.__closure__ or (), fn=value, source=source)


def _wrap_identity(out, value, source):
    """Classes, builtins, nn.Modules: specialized on identity (a module on its class too: the
    forward traced is its class's, and `m.__class__ = ...` changes the class under one identity)."""
    _guard(out, GuardKind.ID, source, value)
    if isinstance(value, torch.nn.Module):
        _guard(out, GuardKind.TYPE, source, type(value))
    out.keepalive.append(value)
    return V.ObjectVar(value, source=source)


def _wrap_unguarded(out, value, source):
    """Python modules: rebinding `torch` or `math` is not something kiln guards against."""
    return V.ObjectVar(value, source=source)


def _wrap_method(out, value, source):
    from kiln.capture.sources import AttrSource
    self_var = wrap(out, value.__self__, AttrSource(source, "__self__") if source else None)
    fn_var = wrap(out, value.__func__, AttrSource(source, "__func__") if source else None)
    return V.MethodVar(fn_var, self_var, source=source)


def _wrap_partial(out, value, source):
    from kiln.capture.sources import AttrSource
    _guard(out, GuardKind.TYPE, source, type(value))
    fn = wrap(out, value.func, AttrSource(source, "func") if source else None)
    args = [wrap(out, a, ItemSource(AttrSource(source, "args"), i) if source else None)
            for i, a in enumerate(value.args)]
    kwargs = {k: wrap(out, a, ItemSource(AttrSource(source, "keywords"), k) if source else None)
              for k, a in value.keywords.items()}
    return V.PartialVar(fn, args, kwargs, source=source)


def _wrap_view(out, value, source):
    """A real dict view (a local kept across a graph break): a live view of its dict's tracker."""
    import gc
    from kiln.capture.sources import ViewDictSource
    _guard(out, GuardKind.TYPE, source, type(value))
    (viewed,) = gc.get_referents(value)
    kind = next(k for k, t in V.VIEW_TYPES.items() if isinstance(value, t))
    return V.DictViewVar(wrap(out, viewed, ViewDictSource(source) if source else None), kind, source=source)


def _wrap_mapping_proxy(out, value, source):
    """A real mappingproxy: a read-only view of its dict's tracker, reached as the view's one
    referent (as a dict view's dict is), so its reads guard the dict's contents."""
    import gc
    from kiln.capture.sources import ViewDictSource
    (viewed,) = gc.get_referents(value)
    if type(viewed) is not dict:
        return _wrap_object(out, value, source)
    _guard(out, GuardKind.TYPE, source, type(value))
    target = wrap(out, viewed, ViewDictSource(source) if source else None)
    if not isinstance(target, V.DictVar):
        return _wrap_object(out, value, source)
    return V.MappingProxyVar(target.items, types.MappingProxyType, target=target, source=source)


def _wrap_resume_iterator(out, value, source):
    from kiln.capture.sources import AttrSource
    _guard(out, GuardKind.TYPE, source, type(value))
    _guard(out, GuardKind.CONST, AttrSource(source, "index"), value.index)
    items = wrap(out, value.items, AttrSource(source, "items"))
    return V.IteratorVar(list(items.items[value.index:]))


def _wrap_object(out, value, source):
    """Any other object: modelled through its real attributes. Callables without a __dict__
    (C functions, bound builtins) are specialized on identity, the rest on their type."""
    if callable(value) and not hasattr(value, "__dict__"):
        return _wrap_identity(out, value, source)
    _guard(out, GuardKind.TYPE, source, type(value))
    return V.ObjectVar(value, source=source)


_WRAPPERS: dict[type, Callable] = {
    **{t: _wrap_constant for t in CONSTANT_TYPES},
    torch.Size: _wrap_constant,
    list: _wrap_sequence,
    tuple: _wrap_sequence,
    dict: _wrap_dict,
    collections.OrderedDict: _wrap_dict,
    collections.deque: _wrap_deque,
    set: _wrap_set,
    frozenset: _wrap_set,
    types.FunctionType: _wrap_function,
    types.MethodType: _wrap_method,
    functools.partial: _wrap_partial,
    functools._lru_cache_wrapper: _wrap_identity,
    type: _wrap_identity,
    types.BuiltinFunctionType: _wrap_unguarded,
    types.ModuleType: _wrap_unguarded,
    torch.nn.Module: _wrap_identity,
    ResumeIterator: _wrap_resume_iterator,
    types.MappingProxyType: _wrap_mapping_proxy,
    **{t: _wrap_view for t in (type({}.keys()), type({}.values()), type({}.items()))},
}
_MUTABLE_CONTAINERS = (list, dict, set, ResumeIterator)
