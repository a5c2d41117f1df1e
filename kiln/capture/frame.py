"""The compiled-function wrapper: a cache of entries per function, recompiles, graph breaks.

There is no PEP 523 hook: `capture(fn)` returns a wrapper. A call checks the cached entries'
guards in order and runs the first that passes; a miss traces the function on this call's
arguments and adds an entry (up to `cache_size_limit`, then the function runs eagerly with a
warning naming the guard that failed). A graph break retraces the frame up to the breaking
instruction; the generated entry runs it natively and continues in a resume function, itself a
wrapper compiled on its first call. Calls that broke inside an inlined function run through
`wrap_callable`, so that function's own frame is captured too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import threading
import types
import warnings
import weakref
from typing import Any, Callable

import torch

from kiln import log
from kiln.capture import buckets, controls, distributed, recompiles, trace_events
from kiln.capture.builder import compiled_original
from kiln.capture.eager_frames import in_loop, run_capturing_calls
from kiln.capture.convert import Entry, SharedInputsWritten, bind_frame, build_entry, params_text, trace_frame
from kiln.capture.guards import GuardKind
from kiln.capture.recompiles import why_missed
from kiln.capture.interpreter import GraphBreak, ObservedException
from kiln.capture.rebuild import CannotRebuild
from kiln.capture.resume import resume_code
from kiln.capture.sources import ItemSource, LocalSource
from kiln.config import CaptureConfig
from kiln.errors import DynamicDimSpecialized, Unsupported


MAX_BREAK_RETRIES = 32


@dataclasses.dataclass
class Event:
    """What `kiln.explain` reports: one thing that happened while compiling."""
    kind: str  # "graph" | "break" | "recompile" | "eager" | "split"
    function: str
    detail: Any
    where: str | None = None


_EVENT_SINKS: list[list[Event]] = []
_ALL_WRAPPERS: "weakref.WeakSet[CompiledFunction]" = weakref.WeakSet()


def _emit(event: Event):
    for sink in _EVENT_SINKS:
        sink.append(event)
    trace_events.capture_event(event)     # the event log (KILN_TRACE), when on


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class CompiledFunction:
    """Wraps one Python function; `__call__` has its signature's behaviour."""

    def __init__(self, fn: types.FunctionType, backend: Callable, config: CaptureConfig):
        self.fn = fn
        self.backend = backend
        self.config = config
        self.entries: list[Entry] = []
        self.last_hit: Entry | None = None   # [Note: the entry that matched last is checked first]
        self.at_limit = False           # cache_size_limit reached: misses run eagerly
        self.compiles = 0               # traces started (a graph break retraces: one per retry)
        self.eager_calls = 0            # calls run eagerly past the limit
        self.dynamic_dims: frozenset = frozenset()  # (source, dim) seen to change: symbolic from now on
        self.changing_sizes = (frozenset(), frozenset())  # [Note: sizes that change together]
        self.dynamic_ints: frozenset = frozenset()   # int arguments seen to change: symbolic from now on
        self.eager_sizes: dict | None = None  # set_stance("eager_then_compile"): the eager call's tensor sizes
        self.params, _ = params_text(fn.__code__)
        self.bindings = {"__G": fn.__globals__, "__fn": fn}
        functools.update_wrapper(self, fn)
        _ALL_WRAPPERS.add(self)

    def user_name(self) -> str:
        """The function's name as messages and the event log show it."""
        return _name(self.fn)

    def user_code(self, args: tuple) -> types.CodeType:
        """The code the user reads for this frame: a module's call frame is kiln's two-line
        `_call_module`, so its source is the module's `forward`."""
        if self.fn.__code__ is _call_module.__code__ and args and isinstance(args[0], torch.nn.Module):
            forward = getattr(type(args[0]), "forward", None)
            if isinstance(forward, types.FunctionType):
                return forward.__code__
        return self.fn.__code__

    @property
    def __kiln_original__(self):
        return self.fn

    def __call__(self, *args, **kwargs):
        # [Note: the stance] torch.compiler.set_stance: "force_eager" runs every call as Python,
        # cached entries unused; "eager_on_recompile" runs what no entry matches as Python;
        # "fail_on_recompile" raises where a compile would start (the first one included);
        # "eager_then_compile" runs the first call as Python and compiles on the second, with the
        # dims that differ between the two symbolic
        stance = controls.stance()
        if stance == "force_eager":
            return self.fn(*args, **kwargs)
        # [Note: the entry that matched last is checked first] A decoder alternates rarely and
        # repeats often: after the prompt's entry comes the decode step's, matched once a token.
        # Checked in compile order, every step would first run the prompt entry's guards to their
        # failure (dolly's: ~130 us on a CPU core, a twentieth of the step's budget on an H100),
        # so the entry that matched last is checked first, as Dynamo's cache moves its hit to the
        # front. Entries whose guards both pass are both correct for the call.
        last = self.last_hit
        if last is not None and last.check(*args, **kwargs):
            return last.run(*args, **kwargs)
        for entry in self.entries:
            if entry is not last and entry.check(*args, **kwargs):
                self.last_hit = entry
                return entry.run(*args, **kwargs)
        if stance == "eager_on_recompile":
            return self.fn(*args, **kwargs)
        if stance == "fail_on_recompile":
            self._fail_on_recompile(args, kwargs)
        if stance == "eager_then_compile" and not self.entries and self._eager_first(args, kwargs):
            return self.fn(*args, **kwargs)
        if self.at_limit:
            # [Note: past the cache-size limit] a miss runs the function as Python at once: no
            # diagnosis of the failed guard (that was said once, in the warning), no trace, no
            # compile. What is left over eager is the entries' guard checks, a call each.
            self.eager_calls += 1
            return self.fn(*args, **kwargs)
        return self._miss(args, kwargs)

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def _fail_on_recompile(self, args, kwargs):
        code = self.user_code(args)
        message = (f"kiln: {_name(self.fn)} ({code.co_filename}:{code.co_firstlineno}) would compile, and "
                   "torch.compiler.set_stance('fail_on_recompile') is in effect")
        if self.entries:
            message += "; the guard that failed: " + why_missed(self.entries[-1], self.params,
                                                               *_bind_defaults(self.fn, args, kwargs))
        raise RuntimeError(message)

    def _eager_first(self, args, kwargs) -> bool:
        """Under "eager_then_compile": True on the first call (it runs eagerly; its argument sizes
        are kept); on the next, the dims whose sizes differ from it are traced symbolic."""
        sizes = {name: tuple(v.shape) for name, v in bind_frame(self.fn, args, kwargs).items()
                 if isinstance(v, torch.Tensor)}
        if self.eager_sizes is None:
            self.eager_sizes = sizes
            return True
        if self.config.dynamic is None:
            self.dynamic_dims |= {(LocalSource(name), d) for name, shape in sizes.items()
                                  if len(self.eager_sizes.get(name, ())) == len(shape)
                                  for d, n in enumerate(shape) if n != self.eager_sizes[name][d]}
        return False

    # -- compiling ----------------------------------------------------------------------------
    def _miss(self, args, kwargs):
        if torch._C._get_tracing_state() is not None:   # sizes are tensors there: nothing to capture
            raise RuntimeError(f"kiln: {_name(self.fn)} is compiled; torch.jit.trace cannot trace it: trace the "
                               "function kiln.compile was given instead")
        if self.entries:
            reason = why_missed(self.entries[-1], self.params, *_bind_defaults(self.fn, args, kwargs))
            if len(self.entries) >= self.config.cache_size_limit:
                limit = self.config.cache_size_limit
                if self.config.fullgraph:  # one graph or an error: never eagerly
                    raise Unsupported(f"{_name(self.fn)} was recompiled {limit} times (cache_size_limit); "
                                      f"the last failed guard: {reason}")
                warnings.warn(f"kiln: {_name(self.fn)} has {limit} compiled entries, its cache_size_limit "
                              f"(options={{'cache_size_limit': n}}); calls that match none run eagerly from now on. "
                              f"The guard that failed: {reason}", stacklevel=3)
                self.at_limit = True
                _emit(Event("eager", _name(self.fn), f"cache_size_limit ({limit}) reached; failed guard: {reason}"))
                recompiles.log(_name(self.fn), f"cache_size_limit ({limit}) reached, running eagerly; "
                                               f"failed guard: {reason}", "no recompile")
                self.eager_calls += 1
                return self.fn(*args, **kwargs)
            who = distributed.rank()
            _emit(Event("recompile", _name(self.fn), reason if who is None else f"rank {who}: {reason}"))
            recompiles.log(_name(self.fn), reason)
            if self.config.dynamic is None:
                changed = self._changed_dims(self.entries[-1], args, kwargs)
                self.dynamic_dims |= frozenset(changed)
                # [Note: sizes that change together] a decoder's first cached step misses the prompt's
                # entry on input_ids.size(1) (the prompt length, now 1) and brings new inputs, the
                # key/value cache, whose length is that same prompt length: the quantity that just
                # changed. A new input's dim of a size that just changed elsewhere is traced symbolic
                # too, or the next step (cache length + 1) would compile a third graph.
                self.changing_sizes = (frozenset(n for n in changed.values() if n >= 2),
                                       frozenset(g.source for g in self.entries[-1].guards if g.kind is GuardKind.TENSOR))
                self.dynamic_ints |= self._changed_ints(self.entries[-1], args, kwargs)
        started = trace_events.frame_start(self, args)
        try:
            with log.frame(_name(self.fn)), _heap_frozen():      # [Note: compile stages]
                entry = self._compile(args, kwargs)
        finally:
            self.changing_sizes = (frozenset(), frozenset())   # for this compilation only
        if self.config.dynamic is None:   # a dim traced symbolic stays so in later compilations
            self.dynamic_dims |= {(g.source, d) for g in entry.guards if g.kind is GuardKind.TENSOR
                                  for d, n in enumerate(g.expected.sizes) if n is None}
        self.entries.append(entry)
        trace_events.frame_done(self, entry, args, started)
        return entry.run(*args, **kwargs)

    def _guarded_values(self, entry: Entry, args, kwargs, wanted):
        """(guard, the value its source reads on this call) for `entry`'s guards that `wanted` picks."""
        from kiln.capture.convert import compile_source
        for guard in entry.guards:
            if not wanted(guard):
                continue
            read = compile_source("__kiln_read", self.params, [f"return {guard.source.expr()}"],
                                  dict(entry.check.__kiln_bindings__), "<kiln read>", self.fn)
            try:
                yield guard, read(*args, **kwargs)
            except Exception:
                continue

    def _changed_dims(self, entry: Entry, args, kwargs) -> dict:
        """Dims of tensor inputs whose size differs from `entry`'s while all else matches:
        (source, dim) -> the size `entry` was compiled for; a symbolic dim now 0 or 1 (a decoding
        step's one token after a symbolic prompt) -> the size it was traced at."""
        changed = {}
        for guard, value in self._guarded_values(entry, args, kwargs, lambda g: g.kind is GuardKind.TENSOR):
            spec = guard.expected
            if isinstance(value, torch.Tensor) and value.dtype == spec.dtype and value.dim() == len(spec.sizes) \
                    and value.device == spec.device:
                changed.update({(guard.source, d): n for d, n in enumerate(spec.sizes)
                                if n is not None and value.size(d) != n})
                changed.update({(guard.source, d): spec.traced[d] for d, n in enumerate(spec.sizes)
                                if n is None and spec.traced and value.size(d) < 2})
        return changed

    def _changed_ints(self, entry: Entry, args, kwargs) -> frozenset:
        """Sources of ints `entry` specialized on that hold another int now ([Note: ints that change])."""
        code = self.fn.__code__
        n = code.co_argcount + code.co_kwonlyargcount
        packed = set(code.co_varnames[n:n + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)])

        def argument(source) -> bool:   # a parameter, or an item of *args / **kwargs (a module's call)
            return isinstance(source, LocalSource) or isinstance(source, ItemSource) and \
                isinstance(source.base, LocalSource) and source.base.name in packed

        def int_constant(g):
            return g.kind is GuardKind.CONST and type(g.expected) is int and argument(g.source)
        return frozenset(g.source for g, value in self._guarded_values(entry, args, kwargs, int_constant)
                         if type(value) is int and value != g.expected)

    def _compile(self, args, kwargs) -> Entry:
        mark = controls.disabled(self.fn)
        if mark is not None and not mark.recursive:   # [Note: a graph break in a loop]
            return self._eager_entry(args, kwargs, "torch.compiler.disable(recursive=False) skips this frame only",
                                     None, run=functools.partial(self._run_capturing_calls, mark.original or self.fn))
        stop_at, nested, reason = None, False, None
        for _ in range(MAX_BREAK_RETRIES):
            self.compiles += 1
            try:
                with log.stage("capture"):
                    trace = trace_frame(self.fn, args, kwargs, stop_at=stop_at, dynamic=self.config.dynamic,
                                        dynamic_dims=self.dynamic_dims, changing_sizes=self.changing_sizes,
                                        dynamic_ints=self.dynamic_ints, token_dims=self.config.token_dims)
            except GraphBreak as e:
                # `kiln.compile(DDP(model))`: the module runs natively from kiln's own one-line
                # frame, which holds no graph, so fullgraph applies to the frames it captures
                at_module = e.wrap_callee and self.fn.__code__ is _call_module.__code__
                if self.config.fullgraph and not at_module:
                    raise Unsupported(e.reason, e.where) from None
                if e.root_offset is not None and in_loop(self.fn.__code__, e.root_offset):
                    return self._eager_entry(args, kwargs, f"a graph break in a loop ({e.reason})", e.where,
                                             run=functools.partial(self._run_capturing_calls, self.fn))
                if e.root_offset is None or e.root_offset == stop_at:
                    return self._eager_entry(args, kwargs, e.reason, e.where)
                stop_at, reason = e.root_offset, e
                nested = not e.native_start and (e.wrap_callee or _is_nested_break(self.fn.__code__, e.root_offset,
                                                                                    e.where))
                continue
            except ObservedException as e:
                # [Note: an exception escapes the frame] The function raises on these inputs as
                # traced, and the trace may differ from eager on purpose: code reads
                # `is_compiling()` (True here) and skips what eager does (LongT5 leaves its
                # attention mask None, then reads its shape). So the whole frame runs eagerly, as
                # torch.compile runs a frame that raises; under fullgraph that is an error.
                return self._eager_entry(args, kwargs, f"the code raises {e.describe()}", e.where)
            specialized = trace.out.specialized_marked_dims()
            if specialized:   # what torch.compile's ConstraintViolationError says
                raise DynamicDimSpecialized(f"{_name(self.fn)}: a dim marked dynamic (by mark_dynamic) was "
                                  f"specialized to a constant: {'; '.join(specialized)}. Remove the mark, or use "
                                  "maybe_mark_dynamic, which allows it")
            trace.break_reason = reason
            try:
                entry = build_entry(self.fn, trace, self._graph_compiler(), args, kwargs, self._make_resume,
                                    functools.partial(wrap_callable, backend=self.backend, config=self.config),
                                    wrap_callee=nested)
            except CannotRebuild as e:
                return self._eager_entry(args, kwargs, str(e), reason.where if reason else None)
            except SharedInputsWritten as e:   # [Note: inputs written in place that share memory]
                e.check.__kiln_bindings__ = self._guard_bindings(trace.out)
                return self._eager_entry(args, kwargs, str(e), None, e.check, e.guards)
            if entry.graph is not None:
                _emit(Event("graph", _name(self.fn), entry.graph))
            if reason is not None:
                _emit(Event("break", _name(self.fn), reason.reason, reason.where))
                if not (reason.wrap_callee and self.fn.__code__ is _call_module.__code__):
                    _warn_break(self.fn, reason.reason, reason.where)   # the user's code broke
            entry.check.__kiln_bindings__ = self._guard_bindings(trace.out)
            trace.out.release()
            return entry
        return self._eager_entry(args, kwargs, "too many graph breaks", None)

    def _graph_compiler(self) -> Callable:
        """The backend, cutting graphs at DDP's gradient buckets when one runs (buckets.py)."""
        if not self.config.ddp_split:
            return self.backend

        def compile_graph(gm, example_inputs):
            compiled, split = buckets.compile_at_buckets(gm, example_inputs, self.backend)
            if split is not None:
                _emit(Event("split", _name(self.fn), split))
            return compiled
        return compile_graph

    def _guard_bindings(self, out) -> dict:
        """The names an entry's guard code reads besides the frame's arguments (recompiles.py
        prints guards again with them)."""
        return {"__G": self.fn.__globals__, "__fn": self.fn, **out.globals_dicts}

    def _eager_entry(self, args, kwargs, reason: str, where: str | None, check=None, guards=(), run=None) -> Entry:
        """Run the whole function eagerly (by `run`, if given); guarded on nothing unless `check`
        (and its `guards`) is given, so it is always reused. Never under fullgraph=True: that
        contract is one graph or an error."""
        if self.config.fullgraph:
            raise Unsupported(f"the whole function would run eagerly: {reason}", where)
        _emit(Event("break", _name(self.fn), f"running the whole function eagerly: {reason}", where))
        _warn_break(self.fn, f"running the whole function eagerly: {reason}", where)
        if check is None:
            check = lambda *a, **k: True  # noqa: E731
            check.__kiln_bindings__ = {}
        return Entry(check, run or self._run_eagerly, list(guards), None, None, "<eager>")

    def _run_eagerly(self, *args, **kwargs):
        return run_with_callees_captured(self.fn, args, kwargs, self.backend, self.config)

    def _run_capturing_calls(self, fn, *args, **kwargs):
        """`fn` (the function, or the one torch's disable(recursive=False) wraps) as Python, its
        callees captured ([Note: a graph break in a loop])."""
        wrap = self.__dict__.get("_wrap_callee")
        if wrap is None:   # one per wrapper: the rewritten code is cached by it
            wrap = self._wrap_callee = functools.partial(_wrap_user_callee, backend=self.backend, config=self.config)
        return run_capturing_calls(fn, args, kwargs, wrap)

    def _make_resume(self, offset: int, stack_nulls: tuple, local_names: tuple):
        code = resume_code(self.fn.__code__, offset, stack_nulls, local_names)
        return compiled_resume(code, self.fn, self.backend, self.config)


_WARNED_BREAKS: set = set()


_FROZEN = [0, False]           # frames compiling now (any thread); whether they froze the heap
_FROZEN_LOCK = threading.Lock()


@contextlib.contextmanager
def _heap_frozen():
    """[Note: a compile does not rescan the heap] A compile allocates a great many objects that live
    (graph nodes, sympy expressions, fake tensors), so Python's full collections fire as the heap
    grows, and each walks every object the process holds: torch's, the model library's, the
    model's. On a 32-layer decoder's generate that was ~10 full collections, 1.5-2.5 s of ~15 s,
    landing in whichever stage ran. While a frame compiles, the objects that existed before it are
    moved out of the collector's view (`gc.freeze`) and handed back after (`gc.unfreeze`, as is the
    freeze, a constant-time splice of lists); what the compile itself makes is still collected.
    A process that froze objects itself (a server's `gc.freeze()` before it forks workers) is left
    alone: `gc.unfreeze` would hand its frozen objects back to the collector too."""
    with _FROZEN_LOCK:
        _FROZEN[0] += 1
        if _FROZEN[0] == 1:
            _FROZEN[1] = gc.get_freeze_count() == 0
            if _FROZEN[1]:
                gc.freeze()
    try:
        yield
    finally:
        with _FROZEN_LOCK:
            _FROZEN[0] -= 1
            if _FROZEN[0] == 0 and _FROZEN[1]:
                gc.unfreeze()


def _warn_break(fn, reason: str, where: str | None):
    """Once per break site: a user should know which line costs them a graph."""
    key = (where, reason)
    if key not in _WARNED_BREAKS:
        _WARNED_BREAKS.add(key)
        warnings.warn(f"kiln: graph break in {_name(fn)}" + (f" at {where}" if where else "") + f": {reason}",
                      stacklevel=3)


def _is_nested_break(code, offset, where) -> bool:
    """Did the break happen inside a function called at `offset` (not at that instruction itself)?"""
    import dis
    inst = next(i for i in dis.get_instructions(code) if i.offset == offset)
    if inst.opname not in ("CALL", "CALL_KW", "CALL_FUNCTION_EX", "BEFORE_WITH"):  # CALL_KW: 3.13
        return False
    line = inst.positions.lineno if inst.positions else None
    return not (where or "").startswith(f"{code.co_filename}:{line} in {code.co_name}")


def _bind_defaults(fn, args, kwargs):
    import inspect
    bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)  # the code's own parameters
    bound.apply_defaults()
    return bound.args, bound.kwargs


_RESUMES: dict[tuple, CompiledFunction] = {}


def compiled_resume(code: types.CodeType, fn: types.FunctionType, backend, config) -> CompiledFunction:
    # cells compare by contents and do not hash: key on their identity (the cached wrapper's
    # function holds them, so an id is not reused while the entry lives)
    key = (code, id(fn.__globals__), tuple(map(id, fn.__closure__ or ())), id(backend), config)
    wrapper = _RESUMES.get(key)
    if wrapper is None:
        resume_fn = types.FunctionType(code, fn.__globals__, code.co_name, None, fn.__closure__)
        wrapper = _RESUMES[key] = CompiledFunction(resume_fn, backend, config)
    return wrapper


_WRAPPED: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def wrap_callable(target: Any, *, backend, config) -> Any:
    """A callable that behaves as `target` with its Python frames captured by kiln."""
    mark = controls.disabled(target)
    if compiled_original(target) is not None or mark is not None and mark.recursive:
        return target      # a recursive disable: Python all the way down
    if isinstance(target, types.MethodType):
        if isinstance(target.__self__, contextlib._GeneratorContextManager):
            return target   # __enter__/__exit__ step a real generator, which runs as Python anyway
        inner = wrap_callable(target.__func__, backend=backend, config=config)
        return types.MethodType(inner, target.__self__) if inner is not target.__func__ else target
    if isinstance(target, torch.nn.Module):
        inner = distributed.module_run_natively(target)
        if inner is not None:   # DDP: its forward as torch wrote it, the module it wraps captured
            return _native_call(target, inner, backend, config)
        # the module's forward broke: capture forward's own frame, per instance
        if type(target).__call__ is not torch.nn.Module.__call__:
            return target
        if _has_hooks(target):   # hooks as nn.Module.__call__ runs them, forward captured
            return _native_call(target, target, backend, config)
        forward = type(target).forward
        if not isinstance(forward, types.FunctionType):
            return target
        return _cached(target, backend, config, lambda: ForwardCall(target, forward, backend, config))
    if isinstance(target, types.FunctionType) and not (target.__module__ or "").startswith(("torch", "kiln")):
        if target.__code__.co_flags & 0x20:  # generators run as Python
            return target
        return _cached(target, backend, config, lambda: CompiledFunction(target, backend, config))
    return target


def _wrap_user_callee(target: Any, *, backend, config) -> Any:
    """A callee of a frame that runs as Python ([Note: a graph break in a loop]): captured as
    torch.compile's frame hook would capture it, which passes over torch's own modules (an
    nn.Linear called there runs as it is)."""
    if isinstance(target, torch.nn.Module) and not _own_forward(target):
        return target
    return wrap_callable(target, backend=backend, config=config)


def _has_hooks(module: torch.nn.Module) -> bool:
    m = torch.nn.modules.module
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None)
                or m._global_forward_hooks or m._global_forward_pre_hooks)


def _native_call(module: torch.nn.Module, inner: torch.nn.Module, backend, config):
    forward = getattr(type(inner), "forward", None)
    if compiled_original(inner) is not None or not isinstance(forward, types.FunctionType):
        return module    # already compiled (DDP(kiln.compile(m))), or no Python forward to capture
    return _cached(module, backend, config, lambda: NativeModuleCall(module, inner, forward, backend, config),
                   "native")


def _cached(target, backend, config, make, kind: str = "frame"):
    per = _WRAPPED.setdefault(target, {})
    key = (id(backend), config, kind)   # kind: a module's forward alone, or its call run natively
    if key not in per:
        per[key] = make()
    return per[key]


class ForwardCall:
    """`module.forward` captured in its own frame; holds the module weakly, so the cache keyed by
    the module can let it go."""

    def __init__(self, module: torch.nn.Module, forward, backend, config):
        self.module_ref = weakref.ref(module)
        self.compiled = CompiledFunction(forward, backend, config)

    @property
    def __kiln_original__(self):
        return types.MethodType(self.compiled.fn, self.module_ref())

    @property
    def __signature__(self):
        # set as the module's `forward` (NativeModuleCall, a frame run eagerly): code that asks
        # for the parameters of `module.forward` (transformers does) sees the forward's own
        import inspect
        return inspect.signature(self.__kiln_original__)

    def __call__(self, *args, **kwargs):
        return self.compiled(self.module_ref(), *args, **kwargs)


class NativeModuleCall:
    """`module(*args)` run natively (hooks, DDP's reducer and FSDP2's all-gathers as torch wrote
    them) with `inner.forward` (the module's own, or the one of the module DDP wraps) redirected,
    for the call's duration, to that forward captured in its own frame. The instance attribute is
    what `nn.Module.__call__` reads; a forward the user set on the instance wins and runs as it is."""

    def __init__(self, module: torch.nn.Module, inner: torch.nn.Module, forward, backend, config):
        self.module_ref, self.inner_ref = weakref.ref(module), weakref.ref(inner)
        self.forward = ForwardCall(inner, forward, backend, config)
        self.depth = 0

    @property
    def __kiln_original__(self):
        return self.module_ref()

    def __call__(self, *args, **kwargs):
        module, inner = self.module_ref(), self.inner_ref()
        if self.depth == 0 and "forward" in inner.__dict__:
            return module(*args, **kwargs)
        self.depth += 1
        inner.__dict__["forward"] = self.forward
        try:
            return module(*args, **kwargs)
        finally:
            self.depth -= 1
            if self.depth == 0:
                inner.__dict__.pop("forward", None)


def _call_module(self, *args, **kwargs):
    return self(*args, **kwargs)


class ModuleCall:
    """`module(*args)` with capture: the module is an argument of a tiny function that calls it,
    so hooks and forward are inlined and the module is guarded like any argument."""

    def __init__(self, module: torch.nn.Module, backend, config):
        self.module_ref = weakref.ref(module)
        fn = _call_module_copy()
        fn.__qualname__ = f"{type(module).__qualname__}.__call__"   # what messages call this frame
        self.compiled = CompiledFunction(fn, backend, config)

    @property
    def __kiln_original__(self):
        return self.module_ref()

    def __call__(self, *args, **kwargs):
        return self.compiled(self.module_ref(), *args, **kwargs)


def _call_module_copy():
    # a fresh function object per module, so each module has its own cache of entries
    return types.FunctionType(_call_module.__code__, _call_module.__globals__, "__call__")


# [Note: a frame run eagerly captures its callees] A frame kiln runs eagerly as a whole (the code
# raises as traced, too many breaks, an entry kiln cannot rebuild) still calls modules whose own
# frames capture: torch.compile skips such a frame and its PEP 523 hook compiles the frames it
# calls. kiln has no such hook, so when the frame is a module's (its first argument is the
# module), the modules it can call (its children, and the items of containers such as
# ModuleList) run, for the call's duration, with `forward` redirected to their forward captured
# in its own frame, as `NativeModuleCall` does for DDP. Transformers' LongT5 and
# SwitchTransformers stacks are such frames: traced with is_compiling() True they leave the
# attention mask None and read it; eagerly they make the mask, and their blocks are captured.
def run_with_callees_captured(fn, args: tuple, kwargs: dict, backend, config):
    """`fn(*args, **kwargs)` as Python, the modules it calls captured (a module's frame only)."""
    module = args[0] if args and isinstance(args[0], torch.nn.Module) else None
    if module is None:
        return fn(*args, **kwargs)
    callees = [module] if fn.__code__ is _call_module.__code__ else list(_module_callees(module))
    redirected = []
    for callee in callees:
        if "forward" in callee.__dict__:   # the user's own forward, or redirected by an outer frame
            continue
        forward = type(callee).forward
        callee.__dict__["forward"] = _cached(callee, backend, config,
                                             lambda: ForwardCall(callee, forward, backend, config))
        redirected.append(callee)
    try:
        return fn(*args, **kwargs)
    finally:
        for callee in redirected:
            callee.__dict__.pop("forward", None)


def _module_callees(module: torch.nn.Module):
    """The submodules whose forward `module`'s forward may call: children with a Python forward of
    their own; torch's modules (ModuleList, Sequential, Linear) are looked through to their items."""
    for child in module._modules.values():
        if child is None:
            continue
        if _own_forward(child):
            yield child
        else:
            yield from _module_callees(child)


def _library_code(fn: types.FunctionType) -> bool:
    """torch's or kiln's own code, which a frame hook passes over (kiln.bench's models are user code)."""
    module = fn.__module__ or ""
    return module.startswith("torch.") or (module.startswith("kiln.") and not module.startswith("kiln.bench."))


def _own_forward(module: torch.nn.Module) -> bool:
    forward = getattr(type(module), "forward", None)
    return (isinstance(forward, types.FunctionType) and type(module).__call__ is torch.nn.Module.__call__
            and not _library_code(forward))


def capture(fn: Callable, backend: Callable, config: CaptureConfig) -> Callable:
    mark = controls.disabled(fn)
    if mark is not None and mark.original is not None:
        fn = mark.original   # compiling disable(f) compiles f, as torch's innermost_fn unwraps it
    if isinstance(fn, torch.nn.Module):
        wrapper = ModuleCall(fn, backend, config)
        # strong reference for modules compiled by the user (kiln.compile keeps the module too)
        wrapper.module = fn
        return wrapper
    if isinstance(fn, types.MethodType):
        inner = CompiledFunction(fn.__func__, backend, config)
        return types.MethodType(inner, fn.__self__)
    if isinstance(fn, types.FunctionType):
        return CompiledFunction(fn, backend, config)
    return CompiledFunction(_calling(fn), backend, config)     # kiln.compile refuses what is not callable


def _calling(fn: Callable) -> types.FunctionType:
    """A Python function calling `fn` (a builtin such as `torch.polar`, a `functools.partial`, an
    object with `__call__`): capture starts from Python code, and follows the call from there, as
    torch.compile accepts any callable."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    call.__name__ = call.__qualname__ = getattr(fn, "__name__", type(fn).__name__)
    return call


def reset() -> None:
    for wrapper in list(_ALL_WRAPPERS):
        wrapper.entries.clear()
        wrapper.last_hit = None
        wrapper.at_limit = False
    _RESUMES.clear()
    _WRAPPED.clear()
