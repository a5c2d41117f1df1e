"""Why a cached entry missed, said in the user's terms: the guard, the value it expected, the value
now, and the line of the user's program that the specialization came from.

`frame.py` asks `why_missed(entry, ...)` once per recompile (and once when a function reaches its
cache-size limit), never on a hit: finding the failing guard runs one generated function per entry
(`guards.failure_finder`, compiled on first need and kept on the entry). The answer goes to
`kiln.explain`'s report, to the limit warning and, under `KILN_LOG=recompiles`, to stderr:

    recompile of BertModel.forward: kwargs['input_ids'].size(1) == 128 (now 200); the tensor was read
    first at modeling_bert.py:123 in forward
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any

import torch

from kiln.capture.guards import Guard, GuardKind, failure_finder, sort_guards


def why_missed(entry, params: str, args: tuple, kwargs: dict) -> str:
    """The first guard of `entry` that fails for this call, described for the user."""
    finder = getattr(entry, "failure_finder", None)
    if finder is None:
        ordered = sort_guards(entry.guards)
        finder = entry.failure_finder = (ordered, failure_finder(ordered, params, entry.check.__kiln_bindings__))
    ordered, find = finder
    index = find(*args, **kwargs)
    if index < 0:
        return "a guard failed"
    guard = ordered[index]
    try:
        return describe(guard, _reader(guard, params, entry)(*args, **kwargs) if guard.source is not None else None,
                        params, entry, args, kwargs)
    except Exception:   # reading the value raised (a missing attribute, a changed container)
        return f"{guard.describe()} (now it cannot be read)"


def _reader(guard: Guard, params: str, entry):
    from kiln.capture.convert import compile_source
    return compile_source("__kiln_read", params, [f"return {guard.source.expr()}"],
                          dict(entry.check.__kiln_bindings__), "<kiln read>")


def describe(guard: Guard, value: Any, params: str, entry, args, kwargs) -> str:
    kind = guard.kind
    if kind in (GuardKind.TENSOR, GuardKind.STATE_TENSOR):
        return _tensor_mismatch(guard, value)
    if kind is GuardKind.SHAPES:
        return _shape_mismatch(guard, params, entry, args, kwargs)
    if kind is GuardKind.VALUE:
        return f"{guard.describe()} (now it is not)"
    if kind is GuardKind.GRAD_MODE:
        return f"{guard.describe()} (now {torch.is_grad_enabled()})"
    if kind is GuardKind.AUTOCAST:
        from kiln.capture.guards import autocast_state
        return f"{guard.describe()} (now {autocast_state()})"
    if kind is GuardKind.GLOBAL_STATE:
        from kiln.capture.guards import global_state
        return f"{guard.describe()} (now {global_state()})"
    if kind is GuardKind.PROCESS_GROUP:
        q = guard.expected
        return f"{q.call_text()} == {q.value!r} (now {_short(q.fn(*q.args))})"
    if kind is GuardKind.DISTINCT:
        return f"{guard.describe()} (now two are)"
    if kind in (GuardKind.ID, GuardKind.SAME):
        return f"{guard.describe()} (now another {type(value).__name__})"
    if kind is GuardKind.TYPE:
        return f"{guard.describe()} (now {type(value).__qualname__})"
    if kind is GuardKind.LEN:
        return f"{guard.describe()} (now {_len(value)})"
    if kind is GuardKind.ABSENT:
        return f"{guard.describe()} (now it has)"
    if kind is GuardKind.PRESENT:
        return f"{guard.describe()} (now it does not)"
    if kind is GuardKind.TRUTH:
        return f"{guard.describe()} (now {not guard.expected})"
    if kind is GuardKind.DICT_KEYS:
        return f"{guard.describe()} (now {list(value) if isinstance(value, dict) else _short(value)})"
    return f"{guard.describe()} (now {_short(value)})"


def _tensor_mismatch(guard: Guard, value: Any) -> str:
    """`x.size(1) == 128 (now 200)`: the first property of the tensor that differs."""
    spec, name = guard.expected, guard.source.describe()
    where = f"; the tensor was read first at {_short_path(guard.where)}" if guard.where else ""
    if not isinstance(value, torch.Tensor):
        return f"{name} is a tensor (now {type(value).__name__}){where}"
    checks = [("dtype", spec.dtype, value.dtype), ("device", spec.device, value.device),
              ("requires_grad", spec.requires_grad, value.requires_grad), ("dim()", len(spec.sizes), value.dim())]
    for what, want, got in checks:
        if want is not None and want != got:
            return f"{name}.{what} == {want} (now {got}){where}"
    for d, (want, got) in enumerate(zip(spec.sizes, value.shape)):
        if want is None and got < 2:
            return f"{name}.size({d}) >= 2, a symbolic size (now {got}: sizes 0 and 1 are specialized){where}"
        if want is not None and want != got:
            return f"{name}.size({d}) == {want} (now {got}){where}"
    for d, (want, got) in enumerate(zip(spec.strides, value.stride())):
        if want is not None and want != got:
            return f"{name}.stride({d}) == {want} (now {got}){where}"
    return f"{guard.describe()}{where}"


def _shape_mismatch(guard: Guard, params: str, entry, args, kwargs) -> str:
    """A relation between symbolic sizes (`s0 % 8 == 0`, `s1 <= 512`) that no longer holds, with
    the symbols named by their inputs and the line that raised it."""
    fn, sources = guard.expected[0], guard.expected[1]
    names = dict(guard.expected[3]) if len(guard.expected) > 3 else {}
    from kiln.capture.convert import compile_source
    read = compile_source("__kiln_read", params, [f"return ({''.join(s.expr() + ', ' for s in sources)})"],
                          dict(entry.check.__kiln_bindings__), "<kiln read>")
    failure = fn.explain(*read(*args, **kwargs)) if hasattr(fn, "explain") else None
    if failure is None:
        return f"symbolic sizes satisfy: {guard.expected[2]}"
    what = failure.what
    symbols = []
    for symbol, source in sorted(failure.sources.items(), key=lambda kv: -len(kv[0])):
        user = names.get(source.name)
        text = f"{user.describe()}.{source.kind}({source.dim})" if user is not None and source.dim is not None \
            else str(source)
        if re.search(rf"\b{re.escape(symbol)}\b", what):
            symbols.append((symbol, text))
    for symbol, text in symbols:
        what = _replace_symbol(what, symbol, text)
    for n, s in names.items():
        what = what.replace(f"{n}.", f"{s.describe()}.")
    now = ", ".join(f"{text} = {failure.values[s]}" for s, text in symbols if s in failure.values)
    where = f" at {_short_path(failure.where)}" if failure.where else ""
    return f"{what} (now {now or 'not'}){where}"


def _replace_symbol(text: str, symbol: str, replacement: str) -> str:
    return re.sub(rf"\b{re.escape(symbol)}\b", replacement, text)


def _short_path(where: str) -> str:
    """`.../site-packages/transformers/models/bert/modeling_bert.py:123` -> `transformers/models/...`"""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in where:
            return where.split(marker, 1)[1]
    return where


def _len(value) -> str:
    try:
        return str(len(value))
    except TypeError:
        return f"a {type(value).__name__}"


def _short(value: Any) -> str:
    """A constant as the user wrote it; anything else by its type (a tensor's repr is its data)."""
    if not isinstance(value, (int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)):
        return f"a {type(value).__qualname__}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_WARNED_RANKS: set = set()


def log(function: str, reason: str, event: str = "recompile") -> None:
    """`KILN_LOG=recompiles`: one line per recompile (and per function reaching the limit), with
    the rank under torch.distributed. There a recompile is also a warning, once per function: a
    rank that recompiles alone runs another graph than its peers (and stalls them meanwhile)."""
    from kiln.capture.distributed import rank, world_size
    who = rank()
    prefix = f"rank {who}: " if who is not None else ""
    if "recompiles" in os.environ.get("KILN_LOG", "").split(","):
        print(f"[kiln recompiles] {prefix}{event} of {function}: {reason}", file=sys.stderr)
    elif event == "recompile" and world_size() > 1 and function not in _WARNED_RANKS:
        _WARNED_RANKS.add(function)
        import warnings
        warnings.warn(f"kiln: rank {who} recompiles {function}: {reason}", stacklevel=3)
