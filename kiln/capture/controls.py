"""torch.compiler's controls, honored as torch.compile honors them: the one module of kiln that reads
what those controls leave for a compiler (DESIGN.md, "What we take from torch": the one exception).

Code written for torch.compile marks functions and tensors for the compiler: `torch.compiler.disable`
(the same as `disable` of torch's `_dynamo` package), `torch.compiler.allow_in_graph`, that
package's `mark_dynamic` / `maybe_mark_dynamic` / `mark_static` / `graph_break`,
`torch.compiler.set_stance`, `torch.compiler.substitute_in_graph`. kiln never imports torch's compiler; it reads those marks here
and nowhere else:

- marks on a function or a tensor are plain attributes (`_torchdynamo_disable`,
  `_dynamo_dynamic_indices`, ...), read with `inspect.getattr_static` so no descriptor runs;
- state that only a module of torch's `_dynamo` package holds (the stance, the ids `allow_in_graph`
  registered, the substitutes `substitute_in_graph` registered) is looked up in `sys.modules`: a
  program that called the control has imported that module, and a program that did not has set
  nothing.

What each control does to capture is decided by its caller: `calls.py` breaks the graph at a call
of a disabled function, puts an allowed one in the graph as one node and inlines a registered
substitute in place of its original; `frame.py` follows the stance; `output.py` traces marked dims
symbolic (or static).
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any


def _torch_own(obj: Any) -> bool:
    """torch marks some of its own functions (`torch.manual_seed` is disabled through
    torch._disable_dynamo, `nn.attention`'s probes and `SDPAParams` are allowed in graph, builtins and
    the standard library have polyfills): kiln's own rules for those come first, as torch.compile's
    rules for torch's functions do, so only marks on code outside torch are read."""
    return (getattr(obj, "__module__", None) or "").partition(".")[0] == "torch"


# -- torch.compiler.disable ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Disabled:
    """A function `torch.compiler.disable` wrapped: `original` is the function it runs (None for
    one marked in place by `skip`). With `recursive=False` (torch's nonrecursive wrapper, or a mark
    in place) torch.compile still compiles the functions it calls, and so does kiln ([Note: a graph
    break in a loop] in eager_frames.py)."""
    original: Any
    reason: str | None
    recursive: bool = True


def disabled(fn: Any) -> Disabled | None:
    """The disable mark on `fn` (the wrapper `torch.compiler.disable` returns), or None for a
    function without one and for torch's own functions."""
    try:
        if inspect.getattr_static(fn, "_torchdynamo_disable", False) is not True:
            return None
    except Exception:   # objects whose type refuses introspection carry no mark
        return None
    original = inspect.getattr_static(fn, "_torchdynamo_orig_callable", None)
    if _torch_own(fn if original is None else original):
        return None
    reason = inspect.getattr_static(fn, "_torchdynamo_disable_msg", None)
    recursive = original is not None and inspect.getattr_static(fn, "_torchdynamo_disable_recursive", True) is not False
    return Disabled(original, reason if isinstance(reason, str) else None, recursive)


def is_graph_break(fn: Any) -> bool:
    """Whether `fn` is `graph_break` of torch's `_dynamo` package: code written for torch.compile
    calls it to end the graph at that line (a no-op when run eagerly, which inlining it gave)."""
    package = sys.modules.get("torch._dynamo")
    return package is not None and fn is getattr(package, "graph_break", None)


def is_compiling_query(fn: Any) -> bool:
    """Whether `fn` is one of torch's other `is_compiling()` queries (torch._utils', the one of
    torch's `_dynamo` package): True inside captured code, as torch.compiler.is_compiling is
    (torch_calls.FOLDED)."""
    import torch
    if fn is getattr(torch._utils, "is_compiling", None):
        return True
    external = sys.modules.get("torch._dynamo.external_utils")
    return external is not None and fn is getattr(external, "is_compiling", None)


def disabled_message(fn: Any, mark: Disabled) -> str:
    name = getattr(mark.original, "__qualname__", None) or getattr(fn, "__qualname__", None) or repr(fn)
    why = f" (reason: {mark.reason})" if mark.reason else ""
    return (f"a call of {name}, which torch.compiler.disable marked to run eagerly{why}: the graph breaks "
            f"around the call, as under torch.compile (remove the decorator to capture it)")


# -- torch.compiler.set_stance ---------------------------------------------------------------------
def stance() -> str:
    """The stance `torch.compiler.set_stance` set: "default", "force_eager", "eager_on_recompile",
    "fail_on_recompile", "eager_then_compile" (frame.py's [Note: the stance]; others read as default)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return "default"
    return getattr(getattr(eval_frame, "_stance", None), "stance", "default")


# -- the config of torch's compiler that code written for it sets ---------------------------------
def capture_scalar_outputs() -> bool:
    """Whether the program asked torch's compiler to capture scalars read from tensors
    (`capture_scalar_outputs` of its config): kiln then reads `Tensor.tolist()` of an integer
    tensor into the graph too, as unbacked symbols (`torch_calls.tensor_tolist`); otherwise tolist
    breaks the graph there, as under torch.compile."""
    config = sys.modules.get("torch._dynamo.config")
    return bool(getattr(config, "capture_scalar_outputs", False))


def configured_dynamic(source, ndim: int | None = None) -> tuple[int, ...]:
    """What `torch.compiler.config.dynamic_sources` marks dynamic of an argument, from its first
    compile (even under dynamic=False, as torch.compile reads it): a comma-separated list of
    patterns matched (`re.match`, or equal) against torch's name of the argument, `L['x']`, each
    with an optional `:N` for one dim. For a tensor (`ndim` given) the dims so marked; for an int,
    `(0,)` when it is marked; `()` otherwise. Only the frame's own arguments have such names here."""
    import re
    from kiln.capture.sources import LocalSource
    config = sys.modules.get("torch.compiler.config")
    text = getattr(config, "dynamic_sources", "") or ""
    if not text or not isinstance(source, LocalSource):
        return ()
    name, dims = f"L['{source.name}']", set()
    for entry in text.replace(" ", "").split(","):
        pattern, _, dim = entry.partition(":") if re.fullmatch(r".*:\d+", entry) else (entry, "", "")
        if entry and (pattern == name or re.match(pattern, name)):
            if ndim is None:
                return (0,)
            dims |= {int(dim)} if dim else set(range(ndim))
    return tuple(sorted(d for d in dims if ndim is None or d < ndim))


# -- torch.compiler.allow_in_graph -----------------------------------------------------------------
def allowed_in_graph(fn: Any) -> bool:
    """Whether `torch.compiler.allow_in_graph(fn)` registered `fn` (outside torch): one node of the graph."""
    trace_rules = sys.modules.get("torch._dynamo.trace_rules")
    if trace_rules is None:
        return False
    ids = getattr(getattr(trace_rules, "_allowed_callable_ids", None), "function_ids", None)
    return bool(ids) and id(fn) in ids and not _torch_own(fn)


# -- mark_dynamic / maybe_mark_dynamic / mark_static ----------------------------------------------
@dataclasses.dataclass(frozen=True)
class DimMarks:
    dynamic: frozenset   # mark_dynamic and maybe_mark_dynamic: symbolic from the first compile
    static: frozenset    # mark_static: always its exact size, even under dynamic=True
    strict: frozenset    # mark_dynamic alone: a trace that specializes the dim is an error


NO_MARKS = DimMarks(frozenset(), frozenset(), frozenset())


def dim_marks(t: Any) -> DimMarks:
    """The dims of tensor `t` that `mark_dynamic`, `maybe_mark_dynamic` and `mark_static` marked."""
    d = getattr(t, "__dict__", None)
    if not d:   # the common case: a tensor nobody marked has no instance attributes
        return NO_MARKS
    strict = set(d.get("_dynamo_dynamic_indices", ()))
    dynamic = strict | set(d.get("_dynamo_weak_dynamic_indices", ()))
    static = set(d.get("_dynamo_static_indices", ()))
    if not dynamic and not static:
        return NO_MARKS
    n = t.dim()
    norm = lambda dims: frozenset(i % n for i in dims if isinstance(i, int) and -n <= i < n)  # noqa: E731
    return DimMarks(norm(dynamic), norm(static), norm(strict))


# -- torch.compiler.substitute_in_graph ------------------------------------------------------------
def substitute(fn: Any) -> Any:
    """The traceable function `torch.compiler.substitute_in_graph(fn)` registered for `fn` (the
    original or the wrapper the decorator returned), inlined in its place; None where there is none,
    and for torch's own polyfills: kiln models builtins and the standard library itself (callables.py)."""
    functions = sys.modules.get("torch._dynamo.variables.functions")
    if functions is None:
        return None
    try:
        handler = functions.PolyfilledFunctionVariable._get_polyfill_handlers().get(fn)
    except (AttributeError, TypeError):   # an unhashable callable has no entry
        return None
    polyfill = getattr(handler, "__torch_dynamo_polyfill__", None)
    if polyfill is None or _torch_own(polyfill):
        return None
    return polyfill
