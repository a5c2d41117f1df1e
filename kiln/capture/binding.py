"""Binding call arguments to a code object's parameters, as CPython does, over trackers."""
from __future__ import annotations

from kiln.capture import variables as V
from kiln.capture.sources import DefaultSource

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def _default(tx, fn: V.FunctionVar, value, index):
    if isinstance(value, V.Variable):
        return value
    from kiln.capture.builder import wrap
    return wrap(tx.out, value, DefaultSource(fn.source, index) if fn.source is not None else None)


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
        tx.raise_(TypeError, f"{fn.name}() takes {nargs} positional arguments but {len(args)} were given")
    if varargs_name:
        bound[varargs_name] = V.TupleVar(list(extra))
    extra_kw = {}
    posonly = set(pos_names[:code.co_posonlyargcount])
    for key, value in kwargs.items():
        if key in bound and key not in posonly:
            tx.raise_(TypeError, f"{fn.name}() got multiple values for argument '{key}'")
        if (key in pos_names and key not in posonly) or key in kwonly_names:
            bound[key] = value
        elif varkw_name:
            extra_kw[key] = value
        else:
            tx.raise_(TypeError, f"{fn.name}() got an unexpected keyword argument '{key}'")
    defaults = fn.defaults or ()
    first_default = nargs - len(defaults)
    for j, name in enumerate(pos_names):
        if name not in bound:
            if j >= first_default:
                bound[name] = _default(tx, fn, defaults[j - first_default], j - first_default)
            else:
                tx.raise_(TypeError, f"{fn.name}() missing required argument '{name}'")
    for name in kwonly_names:
        if name not in bound:
            if name in (fn.kwdefaults or {}):
                bound[name] = _default(tx, fn, fn.kwdefaults[name], name)
            else:
                tx.raise_(TypeError, f"{fn.name}() missing required keyword-only argument '{name}'")
    if varkw_name:
        bound[varkw_name] = V.DictVar(extra_kw)
    return bound
