"""Calls: what happens when traced code calls something.

Its handlers, one per tracker class, fill `interpreter.CALLS`, through which `interpreter.call_variable`
(and `tx.call`) dispatches every call; this is the one call dispatch. A real callable is first looked up in
the one table of modelled callables (`callables.CALLABLES`: builtins, container methods, standard
library, NumPy, pytree, torch queries folded to constants), then classified: a torch operation (a
graph node), an nn.Module (hooks and `forward` inlined), a class (a new object, a namedtuple, an
exception, a context manager), a Python function (inlined by a child tracer), or C code kiln does
not model (a graph break).
"""
from __future__ import annotations

import inspect
import logging
import operator
import types
import warnings
import weakref

import torch

from kiln.capture import autograd_function, controls, masks, model_outputs
from kiln.capture import variables as V
from kiln.capture.attributes import _function, getattr_var
from kiln.capture.builder import wrap
from kiln.capture.builtins import PURE_CALLABLES
from kiln.capture.callables import CALLABLES, argument_count_error, handler_for, handles
from kiln.capture.classes import call_class
from kiln.capture.constants import (TRACE_TIME_FUNCTIONS, constant_arguments, constant_of, is_assumed_constant,
                                    is_python_constant, python_value, run_at_trace_time)
from kiln.capture.distributed import native_reason
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.interpreter import CALLS, GraphBreak, call_variable
from kiln.capture.output import DeferredCall
from kiln.capture.sources import AttrSource, GlobalSource, WeakRefCallSource
from kiln.capture.torch_calls import (AUTOGRAD_CALL, FOLDED, call_torch, is_tensor_method, is_torch_op, tensor_method,
                                     tensor_of_tensors, to_fx)

def _call_function(tx, fn: V.FunctionVar, args, kwargs):
    if fn.fn is not None:
        real = fn.fn
        controlled = _controlled_call(tx, real, args, kwargs)
        if controlled is not None:
            return controlled
        handler = handler_for(real)
        if handler is not None:
            return handler(tx, args, kwargs)
        if is_tensor_method(real):
            return tensor_method(tx, real.__name__, args, kwargs)
        if is_torch_op(real) and _graph_arguments(tx, args, kwargs):
            if isinstance(real, types.FunctionType):
                return _torch_python_function(tx, fn, real, args, kwargs)
            return call_torch(tx, "call_function", real, args, kwargs)
        if _is_diagnostics_call(real, args):
            return _defer_call(tx, real, args, kwargs)
        if f"{getattr(real, '__module__', '')}.{getattr(real, '__qualname__', '')}" in TRACE_TIME_FUNCTIONS:
            return run_at_trace_time(tx, real, args, kwargs)
        if is_assumed_constant(real) and constant_arguments(args, kwargs):
            return run_at_trace_time(tx, real, args, kwargs)
    return tx.inline(fn, args, kwargs)


def _controlled_call(tx, real, args, kwargs) -> V.Variable | None:
    """A call of a callable torch.compiler's controls marked (controls.py), before any other rule:
    `disable` breaks the graph around the call (so does a call of `graph_break`), `allow_in_graph`
    makes it one node (inlined where its arguments cannot be a node's), `substitute_in_graph` inlines the registered substitute. None for an
    unmarked callable."""
    mark = controls.disabled(real)
    if mark is not None:
        brk = tx.unsupported(controls.disabled_message(real, mark))
        # disable(recursive=False) skips only the function's own frame:
        # it is called through wrap_callable, which runs it with its callees captured (frame.py)
        brk.wrap_callee = not mark.recursive
        raise brk
    if controls.is_graph_break(real):
        raise tx.unsupported("a call of graph_break (of torch's dynamo package) asks for a graph break here")
    if controls.is_compiling_query(real):
        return V.Constant(True)
    if controls.allowed_in_graph(real):
        if isinstance(real, types.FunctionType) and not _graph_arguments(tx, args, kwargs):
            # handed objects an FX node cannot take (a frozen dataclass of tensors, which torch's
            # compiler flattens into the node's inputs): its Python is traced inline instead, which
            # computes the same values in the same graph
            return tx.inline(_function(real), args, kwargs)
        return call_torch(tx, "call_function", real, args, kwargs)
    polyfill = controls.substitute(real)
    if polyfill is not None:
        return tx.inline(_function(polyfill), args, kwargs)
    return None


def _torch_python_function(tx, fn: V.FunctionVar, real, args, kwargs):
    """A torch function written in Python (`F.gaussian_nll_loss`) is one node, run on fake values.
    One whose code decides on tensor data there is inlined instead, so that capture sees the
    decision: a check that raises becomes a check after the graph ([Note: a raise on tensor
    values] in opcodes.py), and anything else breaks the graph at its own line."""
    try:
        return call_torch(tx, "call_function", real, args, kwargs)
    except GraphBreak as e:
        if not getattr(e, "data_dependent", False):
            raise
    return tx.inline(fn, args, kwargs)


def _graph_arguments(tx, args, kwargs) -> bool:
    """Whether every argument can be an FX argument. A torch Python function handed objects that
    cannot (a distribution, a constraint, an options object) is inlined instead of made a node."""
    try:
        for a in [*args, *kwargs.values()]:
            to_fx(tx, a)
    except GraphBreak:
        return False
    return True


def _call_method(tx, m: V.MethodVar, args, kwargs):
    return call_variable(tx, m.fn, [m.self_var, *args], kwargs)


def _call_partial(tx, p: V.PartialVar, args, kwargs):
    return call_variable(tx, p.fn, [*p.args, *args], {**p.kwargs, **kwargs})


def _fold(tx, fn, args, kwargs):
    """Run a metadata query on example values (tensors inside containers included)."""

    def ex(v):
        if isinstance(v, V.TensorVar):
            return v.example
        if isinstance(v, (V.TupleVar, V.ListVar)):
            return type(v.items)(ex(i) for i in v.items) if isinstance(v, V.ListVar) else tuple(ex(i) for i in v.items)
        return python_value(v)
    return V.Constant(fn(*[ex(a) for a in args], **{k: ex(v) for k, v in kwargs.items()}))


def _call_object(tx, fn: V.ObjectVar, args, kwargs):
    value = fn.value
    controlled = _controlled_call(tx, value, args, kwargs)
    if controlled is not None:
        return controlled
    handler = handler_for(value)
    if handler is not None:
        wrong_count = argument_count_error(value, len(args), kwargs)
        if wrong_count is not None:
            tx.raise_(TypeError, wrong_count)
        return handler(tx, args, kwargs)
    if isinstance(value, torch.nn.Module):
        return module_call(tx, fn, args, kwargs)
    if type(value) is weakref.ReferenceType:
        return _dereference(tx, fn, args, kwargs)
    if isinstance(value, torch.jit.ScriptFunction):
        # torch.jit.script / trace keep the Python function they compiled: follow that
        original = getattr(value, "_torchdynamo_inline", None)
        if isinstance(original, types.FunctionType):
            return _call_function(tx, _function(original), args, kwargs)
    if isinstance(value, type):
        return call_class(tx, fn, args, kwargs)
    if is_tensor_method(value):
        if args and isinstance(args[0], V.TensorVar):
            return tensor_method(tx, value.__name__, args, kwargs)
    if value is torch.tensor:
        made = tensor_of_tensors(tx, args, kwargs)
        if made is not None:
            return made
    if is_torch_op(value):
        return call_torch(tx, "call_function", value, args, kwargs)
    if isinstance(value, types.BuiltinMethodType) and PURE_CALLABLES(value):
        return _fold_or_graph(tx, value, args, kwargs)
    if isinstance(value, types.FunctionType):
        return _call_function(tx, _function(value), args, kwargs)
    if _is_diagnostics_call(value, args) or value is getattr(warnings, "_filters_mutated", None):
        # (warnings' filter-cache reset, which `catch_warnings` calls with its filter writes, which
        # are replayed after the graph too, in order)
        return _defer_call(tx, value, args, kwargs)
    call = getattr(type(value), "__call__", None)
    if isinstance(call, types.FunctionType):  # a user object with a Python __call__
        return tx.inline(_fn_of(call), [fn, *args], kwargs)
    if _is_dict_read(value) and isinstance(fn.source, AttrSource):
        # `self.items()` in a method of a user's dict subclass, an object to capture (its own
        # `__getitem__` is followed): dict's read on the items, each read from its source
        from kiln.capture.builder import dict_tracker
        return tx.call(V.ObjectVar(getattr(dict, value.__name__)),
                       [dict_tracker(tx.out, value.__self__, fn.source.base), *args], kwargs)
    if isinstance(value, types.BuiltinMethodType) and isinstance(value.__self__, type) and \
            value.__name__ in ("__subclasses__", "mro") and not args and not kwargs:
        # a class's hierarchy, read at trace time (as torch's compiler reads it): a new list of classes
        return wrap(tx.out, value(), None)
    if isinstance(value, types.MethodWrapperType) and value.__name__ in _SLOT_BUILTINS and not kwargs:
        # `range(3).__iter__()`, `s.__len__()`: a slot of a builtin's value read as a bound
        # method; calling it is the builtin operation on the value, where capture models the value
        owner = wrap(tx.out, value.__self__, None)
        if not isinstance(owner, V.ObjectVar):
            return tx.call(V.ObjectVar(_SLOT_BUILTINS[value.__name__]), [owner, *args])
    descriptor = getattr(value, "__self__", None)
    if getattr(value, "__name__", None) == "__get__" and len(args) in (1, 2) and not kwargs and \
            isinstance(descriptor, (types.GetSetDescriptorType, types.MemberDescriptorType)):
        return _descriptor_get(tx, descriptor, args[0])
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or type(value).__name__
    raise tx.unsupported(f"a call into {name} ({type(value).__name__}), C code kiln does not model")


_SLOT_BUILTINS = {"__iter__": iter, "__len__": len, "__next__": next, "__getitem__": operator.getitem,
                  "__contains__": operator.contains, "__reversed__": reversed, "__hash__": hash,
                  "__repr__": repr, "__str__": str}


def _descriptor_get(tx, descriptor, obj: V.Variable) -> V.Variable:
    """`descriptor.__get__(obj)` of a C attribute descriptor (`torch.Tensor.shape`,
    `type.__dict__['__dict__']`): the attribute it stands for, read from `obj` as `obj.<name>` reads
    it, where `obj` is of the descriptor's class and its class resolves that name to it."""
    if isinstance(obj, V.Constant) and obj.value is None:
        return V.ObjectVar(descriptor)
    owner = type(obj.value) if isinstance(obj, V.ObjectVar) else obj.python_type()
    if not issubclass(owner, descriptor.__objclass__):
        tx.raise_(TypeError, f"descriptor '{descriptor.__name__}' for '{descriptor.__objclass__.__name__}' objects "
                             f"doesn't apply to a '{owner.__name__}' object")
    found = next((c.__dict__[descriptor.__name__] for c in owner.__mro__ if descriptor.__name__ in c.__dict__), None)
    if found is not descriptor:
        raise tx.unsupported(f"{descriptor!r}.__get__ on an object whose class overrides {descriptor.__name__!r}")
    return getattr_var(tx, obj, descriptor.__name__)


def _is_diagnostics_call(value, args) -> bool:
    """warnings.warn, a Logger method (libraries add their own, e.g. transformers' warning_once)."""
    if value is warnings.warn:
        return True
    if isinstance(value, types.MethodType) and isinstance(value.__self__, logging.Logger):
        value = getattr(type(value.__self__), value.__name__, None)
    elif not (args and isinstance(args[0], V.ObjectVar) and isinstance(args[0].value, logging.Logger)):
        return False
    name = getattr(value, "__name__", None)
    return name is not None and not name.startswith("_") and getattr(logging.Logger, name, None) is value


def _defer_call(tx, fn, args, kwargs):
    """logging and warnings do not feed the computation: replay them after the graph, in order."""
    tx.out.side_effects.append(DeferredCall(fn, tuple(args), tuple(kwargs.items())))
    return V.Constant(None)


def _fn_of(f):
    return _function(f)


def _fold_or_graph(tx, value, args, kwargs):
    """math.sqrt(2.0) is folded; operator.add(x, y) with a tensor goes to the graph."""
    if all(is_python_constant(a) for a in args) and all(is_python_constant(v) for v in kwargs.values()):
        try:
            result = value(*[python_value(a) for a in args], **{k: python_value(v) for k, v in kwargs.items()})
        except Exception as e:
            tx.raise_(type(e), str(e))
        return constant_of(tx, result)
    if any(isinstance(a, (V.TensorVar, V.SymNumber)) for a in args):
        return call_torch(tx, "call_function", value, args, kwargs)
    raise tx.unsupported(f"{getattr(value, '__name__', value)} on non-constant arguments")


def _call_new_object(tx, obj: V.NewObjectVar, args, kwargs):
    return call_variable(tx, getattr_var(tx, obj, "__call__"), args, kwargs)


def _call_context(tx, ctx: V.ContextVar, args, kwargs):
    """Calling a modelled context manager: on a function, as a decorator (`@torch.no_grad()` on a
    function defined in traced code); else its __exit__ (pushed by BEFORE_WITH)."""
    if ctx.kind in _DECORATING_CONTEXTS and len(args) == 1 and not kwargs and \
            isinstance(args[0], (V.FunctionVar, V.MethodVar, V.PartialVar)):
        return _decorated(tx, ctx, args[0])
    exit_context(tx, ctx)
    return V.Constant(None)


def run_in_context(make_context, context_args, fn, /, *args, **kwargs):
    """A function decorated by a context manager: `fn` runs inside a new one, as torch's
    `context_decorator` and contextlib's `ContextDecorator` run it. Inlined like user code."""
    with make_context(*context_args):
        return fn(*args, **kwargs)


# a modelled context manager used as a decorator: what makes a fresh one for each call
_DECORATING_CONTEXTS = {"grad": torch.set_grad_enabled, "grad_set": torch.set_grad_enabled,
                        "autocast": torch.autocast}


def _decorated(tx, ctx: V.ContextVar, fn: V.Variable) -> V.Variable:
    if ctx.kind == "grad_set":
        # set_grad_enabled switched the mode when it was made; as a decorator it switches it back
        set_grad_mode(tx, ctx.saved)
    context_args = ctx.args[:1] if ctx.kind in ("grad", "grad_set") else ctx.args
    return V.PartialVar(_function(run_in_context), [V.ObjectVar(_DECORATING_CONTEXTS[ctx.kind]),
                                                    V.TupleVar([V.Constant(a) for a in context_args]), fn], {})


def _call_weakref(tx, ref: V.WeakRefVar, args, kwargs):
    if args or kwargs:
        tx.raise_(TypeError, "weakref() takes no arguments")
    return ref.referent


def _dereference(tx, fn: V.ObjectVar, args, kwargs) -> V.Variable:
    """`ref()` of a weak reference the frame reads: its referent now, read again by every call of
    the compiled code through `ref()` (the guards check what it is, None once it died)."""
    if args or kwargs:
        tx.raise_(TypeError, "weakref() takes no arguments")
    source = WeakRefCallSource(fn.source) if fn.source is not None else None
    return wrap(tx.out, fn.value(), source)


_DICT_READS = frozenset({"items", "keys", "values", "get", "__getitem__", "__contains__", "__len__", "__iter__"})


def _is_dict_read(value) -> bool:
    """A bound read method of dict's own (or OrderedDict's) on an instance of a user's dict subclass."""
    return isinstance(value, types.BuiltinMethodType) and value.__name__ in _DICT_READS and \
        isinstance(value.__self__, dict) and type(value.__self__).__module__ not in ("builtins", "collections")


def _call_container(tx, v: V.Variable, args, kwargs):
    """An instance of a user's list, tuple, dict or set subclass with a `__call__` of its own."""
    call = getattr(v.python_type(), "__call__", None)
    if not isinstance(call, types.FunctionType):
        tx.raise_(TypeError, f"'{v.python_type().__name__}' object is not callable")
    return tx.inline(_fn_of(call), [v, *args], kwargs)


CALLS.update({
    V.ListVar: _call_container,
    V.TupleVar: _call_container,
    V.DictVar: _call_container,
    V.SetVar: _call_container,
    V.WeakRefVar: _call_weakref,
    V.FunctionVar: _call_function,
    V.MethodVar: _call_method,
    V.PartialVar: _call_partial,
    V.ObjectVar: _call_object,
    V.NewObjectVar: _call_new_object,
    V.ContextVar: _call_context,
})


# -- nn.Module calls -------------------------------------------------------------------------------
_GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                       "_global_backward_pre_hooks")
_NATIVE_HOOK_TABLES = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks_with_kwargs",
                       "_forward_pre_hooks_with_kwargs")


def module_call(tx, mod_var: V.ObjectVar, args: list, kwargs: dict) -> V.Variable:
    """`module(*args)`: forward pre-hooks, forward, forward hooks, as `nn.Module._call_impl` runs them."""
    mod = mod_var.value
    reason = native_reason(mod)
    if reason is not None:   # [Note: DDP and FSDP2 run as torch wrote them]
        raise _run_natively(tx, reason)
    if type(mod).__call__ is not torch.nn.Module.__call__:
        return tx.inline(_fn_of(type(mod).__call__), [mod_var, *args], kwargs)
    m = torch.nn.modules.module
    if any(getattr(m, table, None) for table in _GLOBAL_HOOK_TABLES):
        raise tx.unsupported("global nn.Module hooks are registered; kiln does not capture through them")
    if any(getattr(mod, table, None) for table in _NATIVE_HOOK_TABLES):
        raise _run_natively(tx, f"{type(mod).__name__} has backward hooks or hooks with kwargs, which kiln does "
                                "not capture: they run natively around its forward, captured on its own")
    # every table read empty here is guarded empty: a hook registered after the compile is a miss,
    # not a hook the compiled call leaves out ([Note: hook tables by registration count])
    globals_name = tx.out.globals_name(vars(m))
    for table in _GLOBAL_HOOK_TABLES:
        if hasattr(m, table):
            tx.out.guard(Guard(GuardKind.EMPTY, GlobalSource(table, globals_name)))
    if mod_var.source is not None:
        for table in ("_forward_pre_hooks", "_forward_hooks", *_NATIVE_HOOK_TABLES):
            if hasattr(mod, table) and not getattr(mod, table):
                tx.out.guard(Guard(GuardKind.EMPTY, AttrSource(mod_var.source, table)))
    for key, hook in list(mod._forward_pre_hooks.items()):
        hook_var = wrap(tx.out, hook, None)
        out = tx.call(hook_var, [mod_var, V.TupleVar(list(args))])
        if not (isinstance(out, V.Constant) and out.value is None):
            args = list(out.items) if isinstance(out, V.TupleVar) else [out]
    result = tx.call(getattr_var(tx, mod_var, "forward"), args, kwargs)
    for key, hook in list(mod._forward_hooks.items()):
        hook_var = wrap(tx.out, hook, None)
        out = tx.call(hook_var, [mod_var, V.TupleVar(list(args)), result])
        if not (isinstance(out, V.Constant) and out.value is None):
            result = out
    return result


def _run_natively(tx, reason: str):
    """A graph break at this module call, which runs natively with the module's frames captured."""
    brk = tx.unsupported(reason)
    brk.wrap_callee = True
    return brk


# -- context managers ------------------------------------------------------------------------------
def enter_context(tx, ctx: V.Variable):
    """BEFORE_WITH: returns (the __exit__ callable, the value bound by `as`)."""
    if isinstance(ctx, V.ContextVar):
        if ctx.kind == "grad":
            ctx.saved = tx.out.grad_enabled
            set_grad_mode(tx, ctx.args[0])
            return ctx, V.Constant(None)
        if ctx.kind == "grad_set":  # set_grad_enabled already switched on the call
            return ctx, V.Constant(None)
        if ctx.kind == "nothing":
            return ctx, V.Constant(None)
        if ctx.kind == "getitem_to_index":
            tx.out.getitem_to_index += 1
            return ctx, V.Constant(None)
        if ctx.kind == "rng_frozen":
            tx.out.examples.watching_random += 1
            ctx.saved = tx.out.examples.random_ops
            return ctx, V.Constant(None)
        if ctx.kind == "autocast":
            node = tx.out.graph.call_function(torch.amp.autocast_mode._enter_autocast, ctx.args)
            ctx.saved = (node, torch.autocast(*ctx.args))
            ctx.saved[1].__enter__()
            return ctx, V.Constant(None)
    if isinstance(ctx, (V.NewObjectVar, V.ObjectVar)):
        enter = getattr_var(tx, ctx, "__enter__")
        exit_fn = getattr_var(tx, ctx, "__exit__")
        return exit_fn, tx.call(enter, [])
    raise tx.unsupported(f"a `with` block over a {ctx.python_type().__name__}")


def exit_context(tx, ctx: V.ContextVar):
    if ctx.kind in ("grad", "grad_set"):
        set_grad_mode(tx, ctx.saved)
    elif ctx.kind == "getitem_to_index":
        tx.out.getitem_to_index -= 1
    elif ctx.kind == "rng_frozen":
        # the RNG state is put back at the end: the same as doing nothing, unless the region drew
        # random numbers, which kiln's graphs do not rewind
        tx.out.examples.watching_random -= 1
        if tx.out.examples.random_ops != ctx.saved:
            raise tx.unsupported("random ops inside a region that restores the RNG state (freeze_rng_state, "
                                 "fork_rng)")
    elif ctx.kind == "autocast":
        node, real = ctx.saved
        tx.out.graph.call_function(torch.amp.autocast_mode._exit_autocast, (node,))
        real.__exit__(None, None, None)


def set_grad_mode(tx, enabled: bool):
    if enabled != tx.out.grad_enabled:
        tx.out.graph.call_function(torch._C._set_grad_enabled, (enabled,))
        torch._C._set_grad_enabled(enabled)  # example values follow the mode, as eager would
        tx.out.grad_enabled = enabled


def _set_grad_enabled(tx, args, kwargs):
    enabled = python_value(args[0] if args else kwargs["mode"])
    ctx = V.ContextVar("grad_set", (enabled,), saved=tx.out.grad_enabled)
    set_grad_mode(tx, enabled)
    return ctx


def _is_grad_enabled(tx, args, kwargs):
    return V.Constant(tx.out.grad_enabled)


def _torch_assert(tx, args, kwargs):
    if is_python_constant(args[0]):
        if not python_value(args[0]):
            tx.raise_(AssertionError, python_value(args[1]) if len(args) > 1 else "")
        return V.Constant(None)
    return call_torch(tx, "call_function", torch._assert, args, kwargs)


def _set_grad_enabled_now(tx, args, kwargs):
    # torch._C._set_grad_enabled called directly is a node even when the mode already holds (as in
    # Dynamo, which coalesces only its grad-mode context managers): op counts follow it
    enabled = bool(python_value(args[0]))
    tx.out.graph.call_function(torch._C._set_grad_enabled, (enabled,))
    torch._C._set_grad_enabled(enabled)
    tx.out.grad_enabled = enabled
    return V.Constant(None)


def _signature(tx, args, kwargs):
    """inspect.signature of a function known at trace time (folded: it reads only the code object)."""
    target = args[0] if args else None
    bound = isinstance(target, V.MethodVar)
    fn = target.fn if bound else target
    real = fn.fn if isinstance(fn, V.FunctionVar) else fn.value if isinstance(fn, V.ObjectVar) else None
    if not callable(real) or kwargs:
        raise tx.unsupported("inspect.signature of a callable made inside captured code")
    sig = inspect.signature(real)
    if bound:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return V.Constant(sig)


def _is_all_true(tx, args, kwargs):
    """`if not torch._is_all_true(valid): raise ...` (torch.distributions' argument checks): the
    truth of this tensor is assumed while capturing and checked after the graph ran (see
    `semantics.truth`), so a failing check still raises instead of passing silently."""
    result = call_torch(tx, "call_function", torch._is_all_true, args, kwargs)
    result.node.meta["checked_truth"] = tx.where()
    return result


def _kl_divergence(tx, args, kwargs):
    """`torch.distributions.kl_divergence(p, q)`: the formula is chosen by the two types alone
    (`_dispatch_kl`, which the library memoizes), then inlined."""
    from torch.distributions import kl
    p, q = (list(args) + [kwargs.get("p"), kwargs.get("q")])[:2]
    fn = kl._dispatch_kl(p.python_type(), q.python_type())
    if fn is NotImplemented:
        tx.raise_(NotImplementedError, f"No KL(p || q) is implemented for p type {p.python_type().__name__} "
                                       f"and q type {q.python_type().__name__}")
    return tx.call(_fn_of(fn), [p, q])


def _checkpoint(tx, args, kwargs):
    """`torch.utils.checkpoint.checkpoint(fn, *args)`: the forward is `fn(*args)`, inlined (the
    recomputation in backward only saves memory). The reentrant form, torch's default, runs `fn`
    without grad when no tensor argument requires grad, so its outputs do not require grad then."""
    kwargs = dict(kwargs)
    reentrant = python_value(kwargs.pop("use_reentrant", V.Constant(None)))
    context_fn = kwargs.pop("context_fn", None)
    if context_fn is not None and python_value(context_fn) is not torch.utils.checkpoint.noop_context_fn:
        raise tx.unsupported("checkpoint with a context_fn inside captured code")
    for option in ("determinism_check", "debug", "early_stop", "preserve_rng_state"):
        kwargs.pop(option, None)
    fn, rest = args[0], list(args[1:])
    if reentrant is None or reentrant:
        if kwargs:
            tx.raise_(ValueError, "Unexpected keyword arguments: " + ",".join(kwargs))
        if not any(isinstance(a, V.TensorVar) and a.example.requires_grad for a in rest):
            before = tx.out.grad_enabled
            set_grad_mode(tx, False)
            try:
                return tx.call(fn, rest)
            finally:
                set_grad_mode(tx, before)
    return tx.call(fn, rest, kwargs)


def _autograd_call(tx, args, kwargs):
    raise tx.unsupported(AUTOGRAD_CALL)   # [Note: autograd ends the graph] in torch_calls.py


def _rng_frozen(tx, args, kwargs):
    """`torch.testing`'s freeze_rng_state(), `torch.random.fork_rng(...)`: see `exit_context`."""
    enabled = python_value(kwargs.get("enabled", args[1] if len(args) > 1 else V.Constant(True)))
    return V.ContextVar("rng_frozen" if enabled else "nothing", ())


CALLABLES.update({
    torch._C._set_grad_enabled: _set_grad_enabled_now,
    torch.set_grad_enabled: _set_grad_enabled,
    torch.is_grad_enabled: _is_grad_enabled,
    torch._assert: _torch_assert,
    inspect.signature: _signature,
    torch.random.fork_rng: _rng_frozen,
    torch._is_all_true: _is_all_true,
    torch.autograd.backward: _autograd_call,
    torch.autograd.grad: _autograd_call,
})
for _fn, _query in FOLDED.items():
    CALLABLES[_fn] = (lambda query: lambda tx, args, kwargs: _fold(tx, query, args, kwargs))(_query)


def _register_special_calls():
    import torch.distributions.kl
    import torch.testing._utils
    import torch.utils.checkpoint
    CALLABLES[torch.utils.checkpoint.checkpoint] = _checkpoint
    CALLABLES[torch.testing._utils.freeze_rng_state] = _rng_frozen
    CALLABLES[torch.distributions.kl.kl_divergence] = _kl_divergence
    CALLABLES[torch.autograd.Function.apply.__func__] = autograd_function.apply
    CALLABLES[model_outputs._to_tuple] = model_outputs.to_tuple
    CALLABLES[torch.nn.functional.scaled_dot_product_attention] = masks.sdpa


_register_special_calls()


@handles(object.__eq__)
def _object_eq(tx, args, kwargs):
    """`object.__eq__(a, b)` (`super().__eq__(other)` in a class's own): True for the same object,
    else NotImplemented."""
    from kiln.capture.semantics import is_same
    return V.Constant(True if is_same(tx, args[0], args[1]) else NotImplemented)


@handles(object.__new__)
def _object_new(tx, args, kwargs):
    """`object.__new__(cls)` (`super().__new__(cls)` in a class's own `__new__`): a new object of a
    plain Python class, its `__init__` not run. Extra arguments are accepted only where Python
    accepts them: when the class overrides `__init__` or `__new__` (which called this)."""
    cls = python_value(args[0]) if args and isinstance(args[0], V.ObjectVar) else None
    if not isinstance(cls, type):
        raise tx.unsupported("object.__new__ of something that is not a known class")
    heap_type = 1 << 9   # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
    solid_base = next(c for c in cls.__mro__ if not c.__flags__ & heap_type)
    if solid_base is not object or not cls.__dictoffset__:
        raise tx.unsupported(f"object.__new__({cls.__name__}): a class over a builtin type, or without a __dict__")
    if len(args) > 1 or kwargs:
        if cls.__init__ is object.__init__ and cls.__new__ is object.__new__:
            tx.raise_(TypeError, f"{cls.__name__}() takes no arguments")
    return V.NewObjectVar(cls, {})


@handles(object.__ne__)
def _object_ne(tx, args, kwargs):
    """`object.__ne__(a, b)`: the inverse of the class's own `__eq__`, NotImplemented if that is."""
    from kiln.capture.semantics import truth
    equal = tx.call(getattr_var(tx, args[0], "__eq__"), [args[1]])
    if V.is_not_implemented(equal):
        return equal
    return V.Constant(not truth(tx, equal))


@handles(BaseException.with_traceback)
def _with_traceback(tx, args, kwargs):
    """`exc.with_traceback(tb)`: sets `__traceback__` and returns the exception itself (unittest's
    `assertRaises` calls it with None when it stores the exception)."""
    exc, tb = args
    from kiln.capture.attributes import set_exception_attribute
    if not isinstance(tb, V.Constant) or tb.value is not None:
        raise tx.unsupported("with_traceback() of a traceback object (kiln keeps no tracebacks)")
    set_exception_attribute(tx, exc, "__traceback__", tb)
    return exc


@handles(BaseException.add_note)
def _add_note(tx, args, kwargs):
    exc, note = args
    if not (isinstance(note, V.Constant) and isinstance(note.value, str)):
        tx.raise_(TypeError, f"note must be a str, not '{note.python_type().__name__}'")
    notes = exc.attrs.setdefault("__notes__", V.ListVar([]))
    notes.items.append(note)
    return V.Constant(None)


def as_exception(tx, v: V.Variable) -> V.ExceptionVar:
    if isinstance(v, V.ExceptionVar):
        return v
    if isinstance(v, V.ObjectVar) and isinstance(v.value, type) and issubclass(v.value, BaseException):
        return V.ExceptionVar(v.value, [])
    raise tx.unsupported(f"raising a {v.python_type().__name__}")
