"""The user contract: `kiln.compile`, `kiln.reset`, `kiln.explain`.

`compile` checks every argument once, resolves the backend, and hands the callable to capture.
An `nn.Module` comes back as an `OptimizedModule` that shares parameters, buffers and state_dict
with the original, so optimizers, checkpoints and `.train()/.eval()` keep working.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
from typing import Any, Callable

import torch

from kiln import backends, capture
from kiln.config import CaptureConfig, Options
from kiln.errors import InvalidOption


class OptimizedModule(torch.nn.Module):
    """A compiled view of a module: calls run the compiled code, all state is the original's.

    [Note: methods that call the model] `fast = kiln.compile(model); fast.generate(ids)`: the
    attribute comes from the original module, so `generate` is bound to it, and its `self(...)` would
    run the original forward eagerly. A method of the module's own class read through the wrapper
    runs with the original's `forward` redirected, for the duration of the call, to the module's
    forward compiled in its own frame (`compiled_forward`, as `model.forward = kiln.compile(
    model.forward)` would): `self(...)` and `self.forward(...)` inside it reach compiled code, hooks
    still run as `nn.Module.__call__` runs them, and the original is untouched outside the call.

    [Note: token dims of a model-calling method] Such a method (`generate`) calls the model again and
    again on sequences whose lengths change, and a user calls it with prompts of many lengths. So the
    forward it reaches traces the sequence dims of its integer and bool tensor inputs (every dim but
    the batch: `input_ids`, `attention_mask`, `cache_position`) symbolic from its first compile
    under `dynamic=None`: the prefill compiles once for every prompt length, and the decoding step
    (one token: sizes 1 stay constants) once for every cache length, two graphs in all, where
    static-first traces gave a third on the second prompt length. Float inputs, and `forward` called
    directly, stay static first."""

    def __init__(self, mod: torch.nn.Module, compiled_call: Callable, compiled_forward: Callable | None = None,
                 cudagraphs: bool = False):
        super().__init__()
        self._orig_mod = mod  # registered as a child: .to(), .train(), .cuda() reach it
        self._compiled_call = compiled_call
        self._compiled_forward = compiled_forward
        self._redirects = 0
        self._cudagraphs = cudagraphs

    def forward(self, *args, **kwargs):
        return self._compiled_call(*args, **kwargs)

    # [Note: training is the original's] `mod.eval(); fast = kiln.compile(mod)` reports
    # fast.training False, and `mod.train()` shows through `fast` (nn.Module.__init__ sets the
    # flag before `_orig_mod` exists: that store is the default, dropped)
    @property
    def training(self) -> bool:
        original = self.__dict__.get("_modules", {}).get("_orig_mod")
        return True if original is None else original.training

    @training.setter
    def training(self, value: bool):
        original = self.__dict__.get("_modules", {}).get("_orig_mod")
        if original is not None:
            original.training = value

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            value = getattr(self._modules["_orig_mod"], name)
        if _calls_the_model(value, self._modules["_orig_mod"], name) and self._compiled_forward is not None:
            return _with_compiled_forward(self, value)
        return value

    @contextlib.contextmanager
    def _forward_redirected(self):
        mod = self._modules["_orig_mod"]
        if "forward" in mod.__dict__ and self._redirects == 0:   # the user set their own forward: theirs wins
            yield
            return
        self.__dict__["_redirects"] = self._redirects + 1
        mod.__dict__["forward"] = self._compiled_forward
        try:
            yield
        finally:
            self.__dict__["_redirects"] = self._redirects - 1
            if self._redirects == 0:
                mod.__dict__.pop("forward", None)

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


_MODULE_ATTRS = frozenset(dir(torch.nn.Module))


def _keep_library_compiles_out(module: torch.nn.Module) -> None:
    """[Note: libraries that compile the model themselves] transformers' `generate()` compiles the
    decoding step itself when the cache is static (`model.get_compiled_call(compile_config)`:
    torch.compile of `model.__call__` with `generation_config.compile_config`). On a model whose
    forward kiln compiled, Dynamo would then trace kiln's wrapper, which it cannot: generate()
    failed inside Dynamo unless the user passed `disable_compile=True`. The forward is compiled
    already, so the module gets a `get_compiled_call` of its own that returns its `__call__` while
    its forward is kiln's (set by the user, or redirected during `fast.generate(...)`), and the
    class's otherwise: the decoding step runs through kiln, with the user's kiln options, and Dynamo
    never sees it. torch.compile with `backend="kiln"` (transformers' `CompileConfig(backend="kiln")`
    on a model kiln did not compile) is the other way in: Dynamo captures and kiln's backend takes
    the mode and options (`kiln.backends.kiln_backend`)."""
    if callable(getattr(type(module), "get_compiled_call", None)) and "get_compiled_call" not in module.__dict__:
        module.__dict__["get_compiled_call"] = types.MethodType(get_compiled_call, module)


def get_compiled_call(module: torch.nn.Module, compile_config: Any = None) -> Callable:
    """The module's `get_compiled_call` ([Note: libraries that compile the model themselves])."""
    if hasattr(module.__dict__.get("forward"), "__kiln_original__"):
        return module.__call__
    return type(module).get_compiled_call(module, compile_config)


def _calls_the_model(value: Any, mod: torch.nn.Module, name: str) -> bool:
    """A method of the module's own class (generate, ...), not forward and not nn.Module's API."""
    return (isinstance(value, types.MethodType) and value.__self__ is mod and name not in _MODULE_ATTRS
            and not name.startswith("_"))


def _with_compiled_forward(wrapper: OptimizedModule, method: types.MethodType) -> Callable:
    @functools.wraps(method)
    def call(*args, **kwargs):
        if wrapper._cudagraphs and method.__name__ == "generate":
            kwargs = _static_cache_for_graphs(method.__self__, kwargs)
            with _stop_checks_deferred(), wrapper._forward_redirected():
                return method(*args, **kwargs)
        with wrapper._forward_redirected():
            return method(*args, **kwargs)
    return call


DEFERRED_STOP_DEVICES = frozenset({"cuda"})


@contextlib.contextmanager
def _stop_checks_deferred():
    """[Note: decoding without a stop sync] transformers' `generate()` asks after every token
    whether all sequences are done (`unfinished_sequences.max() == 0` read on the host): on CUDA a
    wait for the step just queued, so a step costs the host's Python plus the GPU's kernels, end to
    end, and the host never queues the next replay while the GPU works. transformers carries the
    remedy, `DeferredStopCheck`: the flag copied asynchronously and read one step late (the extra
    step's token dropped, a cache the caller gets back cropped), the same sequences; it enables it
    on "mps" only ("we should enable it for cuda if we observe perf gains"). Under
    mode="reduce-overhead", where a step is one CUDA-graph replay and the host's work is the rest,
    kiln's `generate()` takes that path on CUDA too, with every other condition transformers
    checks kept (not for an assistant model; a cache returned to the caller must be croppable)."""
    try:
        from transformers.generation.utils import DeferredStopCheck
    except ImportError:
        yield
        return
    original = DeferredStopCheck.__dict__["is_supported"]

    def is_supported(device, cache, cache_is_returned, is_assistant):
        if device.type in DEFERRED_STOP_DEVICES:   # transformers' conditions, as for the device it defers on
            device = torch.device("mps")
        return original.__func__(device, cache, cache_is_returned, is_assistant)

    DeferredStopCheck.is_supported = staticmethod(is_supported)
    try:
        yield
    finally:
        DeferredStopCheck.is_supported = original


def _static_cache_for_graphs(model: torch.nn.Module, kwargs: dict) -> dict:
    """[Note: reduce-overhead decodes with a static cache] A CUDA graph replays fixed addresses and
    sizes. transformers' default `DynamicCache` grows by a `torch.cat` every token: each decoding
    step has a cache of a new length in new memory, a layout never seen before, so nothing would
    ever replay ([Note: CUDA graphs] in kiln/runtime/cudagraphs.py). Under mode="reduce-overhead",
    `generate()` of a model that supports it (`_can_compile_fullgraph`, transformers' own mark)
    therefore decodes with transformers' `StaticCache`: the cache padded to the call's whole length
    once, positions past the current one masked by the model as eager masks them, and written in
    place each step ([Note: writes into inputs in place] in kiln/codegen/reinplace.py). Padding to
    the call's length rather than to buckets: one recording serves every step of the call, and
    transformers' masks already make padded positions exact. A cache or cache_implementation the
    user chose is kept."""
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    chosen = ("past_key_values" in kwargs or "cache_implementation" in kwargs
              or getattr(config, "cache_implementation", None) is not None)
    if chosen or not getattr(model, "_can_compile_fullgraph", False):
        return kwargs
    return {**kwargs, "cache_implementation": "static"}


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
    config = CaptureConfig(dynamic=dynamic, fullgraph=fullgraph, cache_size_limit=opts.cache_size_limit,
                           ddp_split=opts.ddp_split)
    if isinstance(model, OptimizedModule):
        model = model._orig_mod
    compiled = capture.capture(model, resolved, config)
    owner = model if isinstance(model, torch.nn.Module) else getattr(model, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        _keep_library_compiles_out(owner)
    if isinstance(model, torch.nn.Module):
        forward = getattr(type(model), "forward", None)
        compiled_forward = (capture.capture(types.MethodType(forward, model), resolved,
                                            dataclasses.replace(config, token_dims=True))
                            if isinstance(forward, types.FunctionType) else None)
        return OptimizedModule(model, compiled, compiled_forward, cudagraphs=opts.cudagraphs)
    return compiled


def reset() -> None:
    """Forget every compiled entry, so the next call compiles again."""
    capture.reset()


def explain(fn: Callable, *args, **kwargs):
    """Run `fn(*args, **kwargs)` under capture and report graphs, breaks, guards and recompiles."""
    if isinstance(fn, OptimizedModule):
        fn = fn._orig_mod
    return capture.explain(fn, *args, **kwargs)
