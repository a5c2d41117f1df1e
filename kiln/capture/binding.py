"""Binding call arguments to a code object's parameters, as CPython does, over trackers."""
from __future__ import annotations

import types

from kiln.capture import variables as V
from kiln.capture.sources import DefaultSource

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def _default(tx, fn: V.FunctionVar, value, index):
    if isinstance(value, V.Variable):
        return value
    from kiln.capture.builder import wrap
    return wrap(tx.out, value, DefaultSource(fn.source, index) if fn.source is not None else None)


def _return_none():
    return None


def _refuse(tx, fn: V.FunctionVar, args: list, kwargs: dict, fallback: str):
    """Raise the TypeError CPython raises for this call: its own message, from calling a stub with
    the function's signature and an empty body on placeholders (binding fails before any code
    runs); `fallback` if the stub took the arguments."""
    code = fn.code
    stub_code = code.replace(co_code=_return_none.__code__.co_code, co_consts=(None,), co_names=(),
                             co_exceptiontable=b"", co_linetable=b"", co_stacksize=max(code.co_stacksize, 1),
                             co_flags=code.co_flags & ~(0x20 | 0x80 | 0x200))  # not a generator/coroutine
    stub = types.FunctionType(stub_code, {}, fn.name, (None,) * len(fn.defaults or ()) or None,
                              tuple(types.CellType() for _ in code.co_freevars) or None)
    stub.__kwdefaults__ = dict.fromkeys(fn.kwdefaults) if fn.kwdefaults else None
    stub.__qualname__ = getattr(fn.fn, "__qualname__", code.co_qualname)   # the name the message shows
    message = fallback
    try:
        stub(*[None] * len(args), **dict.fromkeys(kwargs))
    except TypeError as e:
        message = str(e)
    tx.raise_(TypeError, message)


def bind_arguments(tx, fn: V.FunctionVar, args: list, kwargs: dict) -> dict:
    """Map positional and keyword trackers to parameter names; TypeError is the user's error."""
    code = fn.code
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kwonly_names = names[nargs:nargs + nkw]
    i = nargs + nkw
    varargs_name = names[i] if code.co_flags & CO_VARARGS else None
    if varargs_name:
        i += 1
    varkw_name = names[i] if code.co_flags & CO_VARKEYWORDS else None
    bound: dict = {}
    for name, value in zip(pos_names, args):
        bound[name] = value
    extra = args[nargs:]
    if extra and not varargs_name:
        _refuse(tx, fn, args, kwargs, f"{fn.name}() takes {nargs} positional arguments but {len(args)} were given")
    if varargs_name:
        bound[varargs_name] = V.TupleVar(list(extra))
    extra_kw = {}
    posonly = set(pos_names[:code.co_posonlyargcount])
    filled = set(pos_names[:len(args)])   # a keyword named like *args or **kwargs is an ordinary key
    for key, value in kwargs.items():
        if key in filled and key not in posonly:
            _refuse(tx, fn, args, kwargs, f"{fn.name}() got multiple values for argument '{key}'")
        if (key in pos_names and key not in posonly) or key in kwonly_names:
            bound[key] = value
        elif varkw_name:
            extra_kw[key] = value
        else:
            _refuse(tx, fn, args, kwargs, f"{fn.name}() got an unexpected keyword argument '{key}'")
    defaults = fn.defaults or ()
    first_default = nargs - len(defaults)
    for j, name in enumerate(pos_names):
        if name not in bound:
            if j >= first_default:
                bound[name] = _default(tx, fn, defaults[j - first_default], j - first_default)
            else:
                _refuse(tx, fn, args, kwargs, f"{fn.name}() missing required argument '{name}'")
    for name in kwonly_names:
        if name not in bound:
            if name in (fn.kwdefaults or {}):
                bound[name] = _default(tx, fn, fn.kwdefaults[name], name)
            else:
                _refuse(tx, fn, args, kwargs, f"{fn.name}() missing required keyword-only argument '{name}'")
    if varkw_name:
        bound[varkw_name] = V.DictVar(extra_kw)
    return bound
