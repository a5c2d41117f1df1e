"""The user contract: `kiln.compile`, `kiln.reset`, `kiln.explain`.

`compile` checks every argument once, resolves the backend, and hands the callable to capture.
An `nn.Module` comes back as an `OptimizedModule` that shares parameters, buffers and state_dict
with the original, so optimizers, checkpoints and `.train()/.eval()` keep working.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from kiln import backends, capture
from kiln.config import CaptureConfig, Options
from kiln.errors import InvalidOption


class OptimizedModule(torch.nn.Module):
    """A compiled view of a module: calls run the compiled code, all state is the original's."""

    def __init__(self, mod: torch.nn.Module, compiled_call: Callable):
        super().__init__()
        self._orig_mod = mod  # registered as a child: .to(), .train(), .cuda() reach it
        self._compiled_call = compiled_call

    def forward(self, *args, **kwargs):
        return self._compiled_call(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    # State goes through the original so keys and objects are the original's, not `_orig_mod.*`.
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


def compile(model: Callable | None = None, *, mode: str | None = None, dynamic: bool | None = None,
            fullgraph: bool = False, backend: str | Callable = "kiln",
            options: dict[str, Any] | None = None):
    """Compile a function or an nn.Module; also usable as `@kiln.compile` or `@kiln.compile(...)`.

    mode: None | "default" | "reduce-overhead" | "max-autotune" | "max-autotune-no-cudagraphs"
    dynamic: None (static first, a dim that changes becomes symbolic) | True | False
    fullgraph: raise on any graph break instead of running that part eagerly
    backend: a registered name ("kiln", "eager", "aot_eager") or a callable (gm, example_inputs)
    options: see `kiln.config.Options`
    """
    if model is None:
        return functools.partial(compile, mode=mode, dynamic=dynamic, fullgraph=fullgraph,
                                 backend=backend, options=options)
    if not callable(model):
        raise InvalidOption(f"kiln.compile takes a function or an nn.Module, got {type(model).__name__}")
    if dynamic not in (None, True, False):
        raise InvalidOption(f"dynamic must be None, True or False, got {dynamic!r}")
    if not isinstance(fullgraph, bool):
        raise InvalidOption(f"fullgraph must be True or False, got {fullgraph!r}")
    opts = Options.from_user(mode, options)
    if mode is not None and backend != "kiln":
        raise InvalidOption(f"mode={mode!r} applies to the kiln backend only, not backend={backend!r}")
    resolved = backends.resolve(backend, opts)
    config = CaptureConfig(dynamic=dynamic, fullgraph=fullgraph, cache_size_limit=opts.cache_size_limit)
    if isinstance(model, OptimizedModule):
        model = model._orig_mod
    compiled = capture.capture(model, resolved, config)
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, compiled)
    return compiled


def reset() -> None:
    """Forget every compiled entry, so the next call compiles again."""
    capture.reset()


def explain(fn: Callable, *args, **kwargs):
    """Run `fn(*args, **kwargs)` under capture and report graphs, breaks, guards and recompiles."""
    if isinstance(fn, OptimizedModule):
        fn = fn._orig_mod
    return capture.explain(fn, *args, **kwargs)
