"""A stopgap capture with `torch.fx.symbolic_trace`, used until kiln's bytecode interpreter lands.

It has the interface of the real capture (`capture`, `explain`, `reset`): a wrapper that guards on
the metadata of its inputs, compiles one graph per distinct metadata through the backend, and runs
code that symbolic tracing cannot follow (data-dependent control flow, unsupported calls)
eagerly, or raises under `fullgraph=True`.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable

import torch

from kiln.config import CaptureConfig
from kiln.errors import Unsupported

_ALL_CACHES: list[dict] = []


def _metadata(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, value.device, tuple(value.shape), value.stride(), value.requires_grad)
    if isinstance(value, (int, float, bool, str, type(None))):
        return ("C", type(value), value)
    return ("O", type(value), id(value))


def _global_state(fn: Callable) -> tuple:
    modules = fn.modules() if isinstance(fn, torch.nn.Module) else ()
    return (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"),
            tuple(m.training for m in modules))


def capture(fn: Callable, backend: Callable, config: CaptureConfig) -> Callable:
    cache: dict[tuple, Callable] = {}
    _ALL_CACHES.append(cache)
    signature = inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = (_global_state(fn), tuple((k, _metadata(v)) for k, v in bound.arguments.items()))
        compiled = cache.get(key)
        if compiled is None:
            if len(cache) >= config.cache_size_limit:
                warnings.warn(f"kiln: {getattr(fn, '__name__', type(fn).__name__)} hit the cache size limit "
                              f"({config.cache_size_limit}); running eagerly")
                compiled = fn
            else:
                compiled = _compile(fn, bound.arguments, backend, config)
            cache[key] = compiled
        if compiled is fn:
            return fn(*args, **kwargs)
        tensors = [v for v in bound.arguments.values() if isinstance(v, torch.Tensor)]
        return compiled(*tensors)

    return run


def _compile(fn: Callable, arguments: dict[str, Any], backend: Callable, config: CaptureConfig) -> Callable:
    concrete = {k: v for k, v in arguments.items() if not isinstance(v, torch.Tensor)}
    tensors = [v for v in arguments.values() if isinstance(v, torch.Tensor)]
    try:
        gm = torch.fx.symbolic_trace(fn, concrete_args=concrete or None)
    except Exception as e:
        reason = f"torch.fx.symbolic_trace could not trace this code: {type(e).__name__}: {e}"
        if config.fullgraph:
            raise Unsupported(reason) from e
        warnings.warn(f"kiln: graph break, running eagerly: {reason}")
        return fn
    # symbolic_trace keeps placeholders for concrete args; drop them so the graph takes tensors only.
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and node.target.lstrip("*") in concrete and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    compiled = backend(gm, tensors)
    return lambda *xs: compiled(*xs)


def explain(fn: Callable, *args, **kwargs) -> dict:
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out = capture(fn, record, CaptureConfig())(*args, **kwargs)
    return {"graphs": graphs, "graph_count": len(graphs), "graph_breaks": 0 if graphs else 1, "output": out}


def reset() -> None:
    for cache in _ALL_CACHES:
        cache.clear()
