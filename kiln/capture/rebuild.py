"""Printing trackers back into Python: how generated code rebuilds real values after a graph runs.

When a captured region ends (a return or a graph break), every value that leaves it (the return
value, the stack and locals handed to a resume function, values written by side effects) is printed
as a Python expression over: the frame's arguments (through sources), the graph's outputs
(`__out[i]`), and objects kiln holds (`__cN`). `Rebuilder` collects which graph nodes must become
outputs and which objects the generated code closes over; the dispatch is a table by tracker class.
"""
from __future__ import annotations

import collections
import functools
import types
import weakref
from typing import Any

import torch

from kiln.capture import variables as V
from kiln.capture.model_outputs import in_field_order, is_model_output
from kiln.capture.views import items_of
from kiln.capture.output import AttrDelete, AttrWrite, CellWrite, ContainerMutation, DeferredCall, GlobalWrite


class CannotRebuild(Exception):
    """A value that generated code cannot recreate (a closure made in traced code, ...)."""


class GradModeExit:
    """A grad-mode context manager a graph break hands over. Inside its `with` block it is what the
    block left on the stack, its __exit__ (called). Held in a variable it is the object itself: a
    `torch.set_grad_enabled(mode)` (which switched on the call: entering it does nothing more, its
    __exit__ restores `prev`), or a `torch.no_grad()` not entered yet (`mode`: entering switches)."""

    def __init__(self, prev: bool | None, mode: bool | None = None):
        self.prev = prev
        self.mode = mode

    def __call__(self, *exc):
        torch._C._set_grad_enabled(self.prev)
        return False

    def __enter__(self):
        if self.mode is not None:
            self.prev = torch.is_grad_enabled()
            torch._C._set_grad_enabled(self.mode)

    __exit__ = __call__


class NullContextExit:
    """A context manager whose effect capture drops (the profilers, as Dynamo drops them) handed
    over at a graph break: its __exit__ inside its block, the object itself in a variable."""

    def __call__(self, *exc):
        return False

    def __enter__(self):
        return None

    __exit__ = __call__


def restart_generator(code: types.CodeType, f_globals: dict, closure: tuple | None, args: dict):
    """A generator made in captured code and never stepped, made again after the graph: its
    function called with the arguments it was bound to (its body has not run, so nothing repeats)."""
    fn = types.FunctionType(code, f_globals, code.co_name, None, closure)
    names, n, k = code.co_varnames, code.co_argcount, code.co_kwonlyargcount
    positional = [args[a] for a in names[:n]]
    keywords = {a: args[a] for a in names[n:n + k]}
    i = n + k
    if code.co_flags & 0x04:   # *args
        positional += list(args[names[i]])
        i += 1
    if code.co_flags & 0x08:   # **kwargs
        keywords.update(args[names[i]])
    return fn(*positional, **keywords)


def replay_generator(items: tuple, result):
    """A generator drained while tracing ([Note: drained generators]): its items left, then its return value."""
    yield from items
    return result


class ResumeIterator:
    """The iterator of a loop a graph broke in, handed to the resume function. Unlike a builtin
    iterator, capture can read its remaining items without consuming it (`builder.py`)."""

    def __init__(self, items: tuple):
        self.items = items
        self.index = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.index >= len(self.items):
            raise StopIteration
        self.index += 1
        return self.items[self.index - 1]


def _same(x):
    return x


def _kept(x):
    return True


def iterator_like(cls: type, items: tuple):
    """An iterator over `items` (what the graph computed) of the type Python's own would have:
    `return map(f, xs)` hands back a map, which code may test for. A map or filter is remade over
    the items as they are; another kind is a ResumeIterator."""
    if cls is map:
        return map(_same, items)
    if cls is filter:
        return filter(_kept, items)
    return ResumeIterator(items)


def function_with(fn, kwdefaults, attrs):
    """A function made again after the graph, given the keyword defaults and attributes (its
    `__dict__`: `__wrapped__`, ...; `__qualname__`, `__doc__`, ... are set as functools.wraps sets
    them) it had in traced code."""
    fn.__kwdefaults__ = kwdefaults
    for name, value in attrs.items():
        setattr(fn, name, value)
    return fn


def new_object_from(cls, attrs):
    obj = object.__new__(cls)
    if attrs or cls.__dictoffset__:   # a bare `object()` has no __dict__
        obj.__dict__.update(attrs)
    return obj


def new_dict_from(cls, items, attrs):
    """An instance of a user's dict subclass, made without running its `__init__` again: its items
    stored by its builtin base (an OrderedDict keeps its own order apart from dict's table), then
    its instance attributes."""
    obj = dict.__new__(cls)
    store = collections.OrderedDict.__setitem__ if issubclass(cls, collections.OrderedDict) else dict.__setitem__
    for k, v in items.items():
        store(obj, k, v)
    obj.__dict__.update(attrs)
    return obj


_SIMPLE = (int, float, str, bool, type(None), bytes)


class Rebuilder:
    """[Note: one object per tracker] A mutable value made in traced code (a list, dict, set, dict
    view, new object) may leave the region several times: in two locals (`b = a`), twice inside
    another container, in a local and a side effect. Python code after the region sees ONE object,
    so its expression is printed once, into `prelude` (`__v<i> = [...]`, run before anything
    reads it), and every use names it. Printing it at each use would hand the resume function
    distinct copies, and a mutation through one alias would not be seen through the others."""

    def __init__(self):
        self.outputs: list[torch.fx.Node] = []
        self._output_index: dict[torch.fx.Node, int] = {}
        self.consts: dict[int, tuple[str, Any]] = {}
        self.prelude: list[str] = []
        self._shared: dict[int, tuple[V.Variable, str]] = {}
        # at a graph break, the cells of the breaking frame's own variables (ids of Cell trackers):
        # the resume function gets their contents in fresh cells, so a closure over one cannot be
        # made again sharing it with the frame
        self.frame_cells: set[int] = set()

    def const(self, value: Any) -> str:
        if type(value) in _SIMPLE and (not isinstance(value, float) or value == value and abs(value) != float("inf")):
            return repr(value)
        if id(value) not in self.consts:
            self.consts[id(value)] = (f"__c{len(self.consts)}", value)
        return self.consts[id(value)][0]

    def key(self, k: Any) -> str:
        """A dict key: a Python value, or a tracker (tensors and objects are keyed by identity)."""
        if isinstance(k, V.ValueKey):
            return self.expr(k.var)
        return self.expr(k) if isinstance(k, V.Variable) else self.const(k)

    def output(self, node: torch.fx.Node) -> str:
        if node not in self._output_index:
            self._output_index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"__out[{self._output_index[node]}]"

    def expr(self, v: V.Variable) -> str:
        fn = _PRINTERS.get(type(v))
        if fn is None:
            raise CannotRebuild(f"a {type(v).__name__} cannot be rebuilt outside the graph")
        if not _is_shared(v):
            return fn(self, v)
        shared = self._shared.get(id(v))
        if shared is None and isinstance(v, V.Cell):
            # a cell is named before its contents are printed: a function it holds may close over
            # it (a nested function calling itself), and the contents print that name
            shared = self._shared[id(v)] = (v, f"__v{len(self._shared)}")
            self.prelude.append(f"{shared[1]} = {self.const(types.CellType)}()")
            if v.contents is not None:
                contents = self.expr(v.contents)
                self.prelude.append(f"{shared[1]}.cell_contents = {contents}")
        if shared is None:
            text = fn(self, v)
            shared = self._shared[id(v)] = (v, f"__v{len(self._shared)}")
            self.prelude.append(f"{shared[1]} = {text}")
        return shared[1]

    def side_effect(self, effect) -> list[str]:
        if isinstance(effect, AttrWrite):
            store = self.const(object.__setattr__) if effect.past_hook else "setattr"
            return [f"{store}({self.expr(effect.target)}, {effect.name!r}, {self.expr(effect.value)})"]
        if isinstance(effect, AttrDelete):
            return [f"delattr({self.expr(effect.target)}, {effect.name!r})"]
        if isinstance(effect, CellWrite):
            return [f"{self.const(effect.cell.real)}.cell_contents = {self.expr(effect.value)}"]
        if isinstance(effect, GlobalWrite):
            return [f"{effect.globals_name}[{effect.name!r}] = {self.expr(effect.value)}"]
        if isinstance(effect, ContainerMutation):
            t = effect.target
            target = t.source.expr()
            if isinstance(t, V.ListVar):
                items = f"[{', '.join(self.expr(i) for i in t.items)}]"
                if t.cls is collections.deque:  # no slice assignment
                    return [f"__kiln_new = {items}", f"{target}.clear()", f"{target}.extend(__kiln_new)"]
                if t.cls is not list:   # a subclass: its base's own slot, past any method of its own
                    return [f"{self.const(list.__setitem__)}({target}, slice(None), {items})"]
                return [f"{target}[:] = {items}"]
            if isinstance(t, V.DictVar):
                items = ", ".join(f"{self.key(k)}: {self.expr(v)}" for k, v in t.items.items())
                # the new contents may read the old ones (`kwargs.pop("x")` keeps kwargs['y']):
                # build them before clearing
                if is_model_output(t.cls):  # a ModelOutput forbids clear() and update(): key by key
                    return [f"__kiln_new = {{{items}}}", f"for __k, __v in __kiln_new.items(): {target}[__k] = __v"]
                return [f"__kiln_new = {{{items}}}", f"{target}.clear()", f"{target}.update(__kiln_new)"]
            if isinstance(t, V.SetVar):
                return [f"__kiln_new = [{', '.join(self.expr(i) for i in t.items)}]", f"{self.const(set.clear)}({target})",
                        f"{self.const(set.update)}({target}, __kiln_new)"]
        if isinstance(effect, DeferredCall):
            args = [self.expr(a) for a in effect.args] + [f"{k}={self.expr(a)}" for k, a in effect.kwargs]
            return [f"{self.const(effect.fn)}({', '.join(args)})"]
        raise CannotRebuild(f"side effect {type(effect).__name__}")


def _tensor(r: Rebuilder, v: V.TensorVar) -> str:
    if (v.node.op == "placeholder" or v.data_replaced) and v.source is not None:   # [Note: .data = ...]
        return v.source.expr()
    if v.node.op == "get_attr" and v.source is not None:
        return v.source.expr()
    return r.output(v.node)


def _constant(r, v):
    return r.const(v.value)


def _object(r, v):
    return v.source.expr() if v.source is not None else r.const(v.value)


def _tuple(r, v):
    if v.source is not None and not _has_graph_values(v):
        return v.source.expr()
    inner = ", ".join(r.expr(i) for i in v.items)
    if v.cls is tuple:
        return f"({inner},)" if v.items else "()"
    if v.cls is torch.Size:
        return f"{r.const(torch.Size)}(({inner},))" if v.items else f"{r.const(torch.Size)}()"
    if hasattr(v.cls, "n_sequence_fields"):  # a structseq (torch.return_types.max): built from one sequence
        return f"{r.const(v.cls)}(({inner},))"
    if not hasattr(v.cls, "_fields") or v.attrs:  # a user's subclass (a namedtuple's, given attributes)
        return _subclass_instance(r, v, f"[{inner}]")     # made without running its __new__ again
    return f"{r.const(v.cls)}({inner})"


def _has_graph_values(v) -> bool:
    items = v.items.values() if isinstance(v, V.DictVar) else v.items
    return any(isinstance(i, (V.TensorVar, V.SymNumber)) and i.node.op not in ("placeholder", "get_attr")
               or isinstance(i, (V.TupleVar, V.ListVar, V.DictVar)) and _has_graph_values(i) for i in items)


def _list(r, v):
    if v.source is not None:
        return v.source.expr()  # identity matters; its contents were written back as a side effect
    items = f"[{', '.join(r.expr(i) for i in v.items)}]"
    if v.cls is list:
        return items
    if v.cls is collections.deque:
        return f"{r.const(v.cls)}({items}, {v.maxlen!r})"
    return _subclass_instance(r, v, items)


def _subclass_instance(r, v, items: str) -> str:
    attrs = ", ".join(f"{k!r}: {r.expr(a)}" for k, a in v.attrs.items())
    return f"{r.const(new_container_from)}({r.const(v.cls)}, {items}, {{{attrs}}})"


def new_container_from(cls, items, attrs):
    """An instance of a user's list, set, frozenset or tuple subclass, made without running its
    `__new__`/`__init__` again: its items stored by its builtin base, then its instance attributes."""
    if issubclass(cls, (frozenset, tuple)):
        obj = (frozenset if issubclass(cls, frozenset) else tuple).__new__(cls, items)
    else:
        obj = (list if issubclass(cls, list) else set).__new__(cls)
        (list.extend if issubclass(cls, list) else set.update)(obj, items)
    if attrs:
        obj.__dict__.update(attrs)
    return obj


def _dict(r, v):
    if v.source is not None:
        return v.source.expr()
    inner = ", ".join(f"{r.key(k)}: {r.expr(i)}" for k, i in v.items.items())
    if is_model_output(v.cls) and in_field_order(v):  # a ModelOutput: its keys are its fields' names
        return f"{r.const(v.cls)}(**{{{inner}}})"
    if is_model_output(v.cls):  # keys in another order: (name, value) pairs keep it
        return f"{r.const(v.cls)}([{', '.join(f'({r.key(k)}, {r.expr(i)})' for k, i in v.items.items())}])"
    if v.cls is dict:
        return f"{{{inner}}}"
    if v.cls is collections.defaultdict:
        factory = r.expr(v.default_factory) if v.default_factory is not None else "None"
        return f"{r.const(v.cls)}({factory}, {{{inner}}})"
    if v.cls is collections.OrderedDict:
        return f"{r.const(v.cls)}({{{inner}}})"
    # a user's dict subclass: an instance made without running its __new__/__init__ again
    attrs = ", ".join(f"{k!r}: {r.expr(a)}" for k, a in v.attrs.items())
    return f"{r.const(new_dict_from)}({r.const(v.cls)}, {{{inner}}}, {{{attrs}}})"


def _mapping_proxy(r, v):
    if v.source is not None:
        return v.source.expr()
    return f"{r.const(types.MappingProxyType)}({r.expr(v.target)})"


def _set(r, v):
    if v.source is not None:
        return v.source.expr()
    items = f"[{', '.join(r.expr(i) for i in v.items)}]"
    if v.cls in (set, frozenset):
        return f"{r.const(v.cls)}({items})"
    return _subclass_instance(r, v, items)


def _function(r, v):
    """A function made in traced code is made again: its code, globals, defaults and closure
    (each cell made once, [Note: one object per tracker], so two closures over one variable
    still share it), then its keyword defaults and the attributes set on it."""
    if v.fn is not None:
        return v.source.expr() if v.source is not None else r.const(v.fn)
    if any(id(c) in r.frame_cells for c in v.closure):
        raise CannotRebuild("a closure over a variable of the frame, live where the graph breaks")
    defaults = f"({', '.join(r.expr(d) for d in v.defaults)},)" if v.defaults else "None"
    closure = f"({''.join(r.expr(c) + ', ' for c in v.closure)})" if v.closure else "None"
    text = f"{r.const(types.FunctionType)}({r.const(v.code)}, {r.const(v.globals)}, {v.name!r}, {defaults}, {closure})"
    if v.kwdefaults or v.attrs:
        kwdefaults = "{" + ", ".join(f"{k!r}: {r.expr(d)}" for k, d in v.kwdefaults.items()) + "}"
        attrs = "{" + ", ".join(f"{k!r}: {r.expr(a)}" for k, a in v.attrs.items()) + "}"
        text = f"{r.const(function_with)}({text}, {kwdefaults if v.kwdefaults else 'None'}, {attrs})"
    return text


def _cell(r, v):
    if v.real is not None:
        return r.const(v.real)
    raise AssertionError("a cell made in traced code is printed by Rebuilder.expr")


def _method(r, v):
    return f"{r.const(types.MethodType)}({r.expr(v.fn)}, {r.expr(v.self_var)})"


def _weakref(r, v):
    return f"{r.const(weakref.ref)}({r.expr(v.referent)})"


def _slice(r, v):
    return f"slice({', '.join(r.expr(i) for i in v.items)})"


def _partial(r, v):
    args = "".join(f", {r.expr(a)}" for a in v.args)
    kwargs = "".join(f", {k}={r.expr(a)}" for k, a in v.kwargs.items())
    return f"{r.const(functools.partial)}({r.expr(v.fn)}{args}{kwargs})"


def _new_object(r, v):
    attrs = ", ".join(f"{k!r}: {r.expr(a)}" for k, a in v.attrs.items())
    return f"{r.const(new_object_from)}({r.const(v.cls)}, {{{attrs}}})"


def _iterator(r, v):
    items = v.items[v.index:] if v.view is None else items_of(V.DictViewVar(v.view.dict, v.view.kind))[v.index:]
    return f"{r.const(ResumeIterator)}(({''.join(r.expr(i) + ', ' for i in items)}))"


def _generator(r, v):
    if v.drained is not None:   # [Note: drained generators]
        result = r.expr(v.result) if v.result is not None else "None"
        return f"{r.const(replay_generator)}(({''.join(r.expr(i) + ', ' for i in v.drained)}), {result})"
    if v.state == "created":   # never stepped: the same call again makes the same generator
        closure = tuple(c if isinstance(c, types.CellType) else getattr(c, "real", None) for c in v.frame.closure)
        if any(c is None for c in closure):
            raise CannotRebuild("a generator made in captured code over a closure defined there")
        args = ", ".join(f"{name!r}: {r.expr(value)}" for name, value in v.frame.locals.items())
        return (f"{r.const(restart_generator)}({r.const(v.frame.code)}, {r.const(v.frame.f_globals)}, "
                f"{r.const(closure) if closure else 'None'}, {{{args}}})")
    if v.state != "done":
        raise CannotRebuild("a generator made in captured code, paused at a `yield` where the graph breaks "
                            "(its frame exists only inside kiln)")
    return f"{r.const(ResumeIterator)}(())"


def _lazy_iterator(r, v):
    if v.drained is not None:   # [Note: drained generators]
        items = f"({''.join(r.expr(i) + ', ' for i in v.drained)})"
        return f"{r.const(iterator_like)}({r.const(v.cls)}, {items})"
    raise CannotRebuild(f"a {v.cls.__name__} iterator over a generator made in captured code, open where "
                        "the graph breaks")


def _view(r, v):
    return v.source.expr() if v.source is not None else f"{r.expr(v.dict)}.{v.kind}()"


def _exception(r, v):
    made = f"{r.const(v.cls)}({', '.join(r.expr(a) for a in v.args)})"
    if not v.attrs:
        return made
    attrs = ", ".join(f"{name!r}: {r.expr(a)}" for name, a in v.attrs.items())
    return f"{r.const(exception_with)}({made}, {{{attrs}}})"


def exception_with(exc: BaseException, attrs: dict) -> BaseException:
    """An exception rebuilt after the graph with the attributes traced code set on it."""
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc


def _context(r, v):
    if v.kind == "grad" and v.saved is None:   # not entered yet
        return f"{r.const(GradModeExit)}(None, {v.args[0]!r})"
    if v.kind in ("grad", "grad_set"):
        return f"{r.const(GradModeExit)}({v.saved!r})"
    if v.kind == "nothing":
        return f"{r.const(NullContextExit)}()"
    raise CannotRebuild("an autocast region open across a graph break")


def _sym(r, v):
    if v.node.op == "placeholder" and v.source is not None:   # an int input ([Note: ints that change])
        return v.source.expr()
    return r.output(v.node)


_PRINTERS = {
    V.TensorVar: _tensor,
    V.Constant: _constant,
    V.ObjectVar: _object,
    V.TupleVar: _tuple,
    V.ListVar: _list,
    V.DictVar: _dict,
    V.MappingProxyVar: _mapping_proxy,
    V.SetVar: _set,
    V.FunctionVar: _function,
    V.Cell: _cell,
    V.WeakRefVar: _weakref,
    V.MethodVar: _method,
    V.PartialVar: _partial,
    V.SliceVar: _slice,
    V.NewObjectVar: _new_object,
    V.IteratorVar: _iterator,
    V.GeneratorVar: _generator,
    V.LazyIteratorVar: _lazy_iterator,
    V.ExceptionVar: _exception,
    V.ContextVar: _context,
    V.SymNumber: _sym,
    V.DictViewVar: _view,
}
_MUTABLE = (V.ListVar, V.DictVar, V.SetVar, V.NewObjectVar, V.DictViewVar, V.IteratorVar, V.GeneratorVar,
            V.PartialVar)   # printed once, so a dict keyed by it finds the same object


def _is_shared(v) -> bool:
    """Printed once ([Note: one object per tracker]): a mutable value made in traced code, and a
    function or closure cell made there (a function's identity and attributes, a cell's contents
    are seen by every holder)."""
    if v.source is not None:
        return False
    if isinstance(v, V.FunctionVar):
        return v.fn is None
    if isinstance(v, V.Cell):
        return v.real is None
    return type(v) in _MUTABLE
