"""Values known at capture time: a tracker's Python value, and Python run on such values.

`python_value` reads the real value a tracker stands for (raising `NotConstant` where it is known only
at run time), `constant_of` makes trackers of a value Python computed, and `fold_call` /
`run_at_trace_time` run a real function on constants while tracing. Every family of values reads
constants through this module, which imports none of them: it sits under the data model
(`semantics.py`), attribute reads (`attributes.py`), calls (`calls.py`) and torch calls.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.capture import variables as V
from kiln.capture.interpreter import NotConstant
from kiln.capture.views import items_of


def constant_of(tx, value: Any) -> V.Variable:
    """A tracker for a value Python computed from constants; containers become fresh trackers, so
    they can be iterated and mutated (`"a.b".split(".")`)."""
    if isinstance(value, tuple):
        kind = type(value) if hasattr(value, "_fields") or type(value) is torch.Size else tuple
        return V.TupleVar([constant_of(tx, v) for v in value], kind)
    if type(value) is list:
        return V.ListVar([constant_of(tx, v) for v in value])
    if type(value) is dict:
        return V.DictVar({k: constant_of(tx, v) for k, v in value.items()})
    if isinstance(value, (set, frozenset)):  # a frozenset is shared as it is: its order is its own
        return V.SetVar(value if type(value) is frozenset else set(value), {v: V.Constant(v) for v in value},
                        type(value))
    return V.Constant(value)


def python_value(v: V.Variable) -> Any:
    """The real Python value of a tracker that stands for a constant (raises if it does not)."""
    if isinstance(v, V.Constant):
        return v.value
    if isinstance(v, V.ObjectVar):
        return v.value
    if isinstance(v, V.TupleVar):
        items = [python_value(i) for i in v.items]
        if v.cls is tuple or v.cls is torch.Size or not hasattr(v.cls, "_fields"):
            return v.cls(items)
        return v.cls(*items)
    if isinstance(v, V.ListVar):
        return [python_value(i) for i in v.items]
    if isinstance(v, V.DictVar):
        if any(isinstance(k, V.ValueKey) for k in v.items):
            raise NotConstant(v)
        return {k: python_value(i) for k, i in v.items.items()}
    if isinstance(v, V.SetVar):
        return v.cls(python_value(i) for i in v.items)
    if isinstance(v, V.DictViewVar):  # a view of a copy: enough to fold `d.keys() - {...}`, `==`
        keys = [python_value(k) for k in items_of(V.DictViewVar(v.dict, "keys"))]
        return getattr(dict.fromkeys(keys) if v.kind == "keys" else python_value(v.dict), v.kind)()
    if isinstance(v, V.FunctionVar) and v.fn is not None:
        return v.fn
    if isinstance(v, V.SymNumber):
        # Python needs the number itself (range(n), a dict key, ...): specialize, which the
        # ShapeEnv records as a guard (n == hint)
        return _SPECIALIZE[type(v.example)](v.example)
    raise NotConstant(v)


_SPECIALIZE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def is_python_constant(v: V.Variable) -> bool:
    if _has_tensor(v):  # before python_value, which would specialize a symbolic size
        return False
    try:
        python_value(v)
        return True
    except NotConstant:
        return False


def _has_tensor(v) -> bool:
    if isinstance(v, (V.TensorVar, V.SymNumber)):
        return True
    if isinstance(v, (V.TupleVar, V.ListVar)):
        return any(_has_tensor(i) for i in v.items)
    if isinstance(v, V.DictVar):
        return any(_has_tensor(i) for i in v.items.values())
    if isinstance(v, V.DictViewVar):
        return any(_has_tensor(i) for i in items_of(v))
    return False


def fold_call(tx, fn, args, kwargs):
    """`fn` run on the constants' values; a Python exception is raised in the traced code."""
    try:
        result = fn(*[python_value(a) for a in args], **{k: python_value(v) for k, v in kwargs.items()})
    except Exception as e:
        tx.raise_(type(e), str(e))
    return constant_of(tx, result)


def is_assumed_constant(fn) -> bool:
    """A function its library marked as constant for compilers (`torch.compiler.assume_constant_result`
    sets this attribute; transformers marks its install and version probes so): called with
    constants, it is run while tracing and its result is a constant of the graph, as torch.compile
    does. Its code often reads what capture does not follow (importlib.metadata, `vars`)."""
    return getattr(fn, "_dynamo_marked_constant", False) is True


def constant_arguments(args, kwargs) -> bool:
    return all(is_python_constant(a) for a in [*args, *kwargs.values()])


# Library functions that read only configuration objects (no tensors) and whose code is too
# dynamic to follow (deepcopy, to_dict, delattr): run for real while tracing. Keyed by
# "module.qualname", so kiln needs no import of the library.
TRACE_TIME_FUNCTIONS = {
    # transformers' cache constructors ask for the decoder half of a flat encoder-decoder config
    "transformers.configuration_utils.PreTrainedConfig.get_text_config",
    "transformers.configuration_utils.PretrainedConfig.get_text_config",
}


def run_at_trace_time(tx, fn, args, kwargs):
    from kiln.capture.builder import wrap
    if not constant_arguments(args, kwargs):
        raise tx.unsupported(f"{fn.__qualname__} on values known only at run time")
    try:
        result = fn(*[python_value(a) for a in args], **{k: python_value(v) for k, v in kwargs.items()})
    except Exception as e:
        tx.raise_(type(e), str(e))
    if args and result is python_value(args[0]):
        return args[0]  # keeps its source, so later reads are guarded
    return wrap(tx.out, result, None)


def is_same(tx, a: V.Variable, b: V.Variable) -> bool:
    if a is b:
        return True
    if isinstance(a, V.TensorVar) and isinstance(b, V.TensorVar):
        return a.example is b.example
    if is_python_constant(a) and is_python_constant(b):
        va, vb = python_value(a), python_value(b)
        if isinstance(va, (int, float, str)) and type(va) is type(vb):
            return va == vb  # small ints and interned strings: what CPython answers in practice
        return va is vb
    if isinstance(a, V.NewObjectVar) or isinstance(b, V.NewObjectVar):
        return False
    distinct = (V.TensorVar, V.ListVar, V.DictVar, V.TupleVar, V.SetVar, V.NdarrayVar,  # trackers are objects
                V.ExceptionVar, V.GeneratorVar, V.LazyIteratorVar)
    if any(isinstance(v, (V.DictViewVar, V.IteratorVar)) for v in (a, b)) and a.source is None and b.source is None:
        return False   # views and iterators made in traced code: each call makes a new object
    if isinstance(a, distinct) or isinstance(b, distinct):
        return False
    raise tx.unsupported(f"`is` between {a.python_type().__name__} and {b.python_type().__name__}")
