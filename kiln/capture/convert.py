"""From a traced frame to a cache entry: the generated Python that runs graphs and resumes.

`trace_frame` interprets a function on the current call's arguments; `build_entry` prints the
result as one Python function with the frame's own signature:

    def __kiln_entry(<the function's parameters>):
        __out = __graph(<graph inputs, read through their sources>)
        <side effects, in program order>
        return <the return value, rebuilt>                       # the frame captured whole
        # or, at a graph break:
        __r = <the unsupported instruction, run natively>        # e.g. a call, a branch
        return __resume(<stack>, <live locals>)                  # the rest, compiled on first call

and its guards as another (`guards.compile_guards`). `frame.py` owns the cache around them.
"""
from __future__ import annotations

import dataclasses
import dis
import inspect
import types
from typing import Any, Callable

import torch

from kiln import log
from kiln.capture import settled, variables as V
from kiln.capture.builder import wrap
from kiln.capture.generators import (close_collected_at_return, drain_escaping, left_paused_in_cleanup,
                                     left_paused_reason)
from kiln.capture.guards import Guard, GuardKind, compile_guards
from kiln.capture.interpreter import PY312, PY313, GraphBreak, Tracer
from kiln.capture.opcodes import call_slots
from kiln.capture.output import ContainerMutation, OutputGraph
from kiln.capture.rebuild import CannotRebuild, Rebuilder
from kiln.capture.resume import resume_parameters
from kiln.capture.constants import python_value
from kiln.capture.distributed import PROCESS_STATE, ProcessQuery
from kiln.capture.sources import KEYS, ConstSource, LocalSource
from kiln.symbolic.fake import UnsupportedFakeOp


@dataclasses.dataclass
class TraceResult:
    out: OutputGraph
    tracer: Tracer
    result: V.Variable | None        # the return value, when the frame ran to its end
    stopped_at: dis.Instruction | None  # the instruction to run natively, at a graph break
    break_reason: GraphBreak | None


@dataclasses.dataclass
class Entry:
    """One compiled version of a frame: reuse it when `check(*args, **kwargs)`."""
    check: Callable[..., bool]
    run: Callable
    guards: list[Guard]
    graph: torch.fx.GraphModule | None
    break_reason: GraphBreak | None
    source: str
    failure_finder: Any = None  # (sorted guards, finder): built by recompiles.why_missed on first need


def params_text(code: types.CodeType) -> tuple[str, list[str]]:
    """The parameter list of `code` as source text (defaults are applied by the caller's
    function, so every parameter is written plainly) and the parameter names."""
    names = list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    i = code.co_argcount + code.co_kwonlyargcount
    parts = names[:code.co_argcount]
    if code.co_posonlyargcount:
        parts.insert(code.co_posonlyargcount, "/")
    varargs = varkw = None
    if code.co_flags & 0x04:
        varargs = code.co_varnames[i]
        i += 1
    if code.co_flags & 0x08:
        varkw = code.co_varnames[i]
    if varargs:
        parts.append("*" + varargs)
    elif code.co_kwonlyargcount:
        parts.append("*")
    parts += names[code.co_argcount:]
    if varkw:
        parts.append("**" + varkw)
    all_names = names + [n for n in (varargs, varkw) if n]
    return ", ".join(parts), all_names


def bind_frame(fn: types.FunctionType, args: tuple, kwargs: dict) -> dict[str, Any]:
    # the code's own parameters: a functools.wraps wrapper's signature would report the wrapped
    # function's names, and the frame would start with locals its bytecode never reads
    sig = inspect.signature(fn, follow_wrapped=False)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    # inspect names a comprehension's parameter `.0` (its iterator) `implicit0`
    names = fn.__code__.co_varnames
    return {f".{name[8:]}" if name.startswith("implicit") and f".{name[8:]}" in names else name: value
            for name, value in bound.arguments.items()}


def trace_frame(fn: types.FunctionType, args: tuple, kwargs: dict, *, stop_at: int | None,
                dynamic: bool | None, dynamic_dims: frozenset = frozenset(),
                changing_sizes: tuple = (frozenset(), frozenset()), dynamic_ints: frozenset = frozenset(),
                token_dims: bool = False) -> TraceResult:
    """Interpret `fn` on this call's arguments; stop before the instruction at `stop_at`.
    `dynamic_dims`: (source, dim) pairs to trace with symbolic sizes; `changing_sizes`: (sizes,
    known sources): dims of those sizes in inputs read from other sources are symbolic too;
    `dynamic_ints`: sources of ints to trace as symbols ([Note: ints that change]); `token_dims`:
    see [Note: token dims of a model-calling method] in api.py."""
    out = OutputGraph(fn.__globals__, dynamic=dynamic, dynamic_dims=dynamic_dims, changing_sizes=changing_sizes,
                      dynamic_ints=dynamic_ints, token_dims=token_dims)
    locals_ = {}
    for name, value in bind_frame(fn, args, kwargs).items():
        try:
            locals_[name] = wrap(out, value, LocalSource(name))
        except UnsupportedFakeOp as e:
            # a sparse (quantized, nested) tensor argument: kiln's fakes are strided and dense, so
            # it can be no input of a graph and the frame runs as Python (`x.to_sparse()` broke the
            # graph before: its resume function gets the sparse tensor)
            raise GraphBreak(f"argument {name!r}: {e}") from None
    tracer = Tracer(fn.__code__, fn.__globals__, out, locals_=locals_, closure=fn.__closure__ or ())
    tracer.fn_source = ConstSource("__fn")
    tracer.stop_at = stop_at
    grad_mode = torch.is_grad_enabled()
    autocast_state = (torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu"))
    # [Note: process state a trace's example run sets] (distributed.py)
    process_state = [(getter, setter, getter()) for getter, setter in PROCESS_STATE]
    out.process_state_before = {getter: before for getter, _, before in process_state}
    # the default dtype is folded where code reads it, and creation ops without a dtype (torch.ones,
    # torch.tensor of floats) follow it in the graph: every entry holds for the one it was traced
    # with, as grad mode (Dynamo's global-state guard checks it alike)
    out.guard(Guard(GuardKind.PROCESS_GROUP, None,
                    ProcessQuery(torch.get_default_dtype, (), torch.get_default_dtype(), False)))
    try:
        result = tracer.run()
        if tracer.stopped_at is None:
            close_collected_at_return(tracer, result)
            drain_escaping(tracer, result)
        paused = left_paused_in_cleanup(out)
        started = _start_natively(tracer, out, paused)
        if started is not None:
            raise started
        if paused is not None:
            raise GraphBreak(left_paused_reason(paused), paused.frame.where())
    finally:
        out.current = None   # guards raised from here on (the backend's) are not at a traced line
        torch._C._set_grad_enabled(grad_mode)
        if (torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu")) != autocast_state:
            # a trace that stopped inside `with torch.autocast(...)` leaves it on: undo that
            torch.clear_autocast_cache()
            torch.set_autocast_enabled("cuda", autocast_state[0])
            torch.set_autocast_enabled("cpu", autocast_state[1])
        out.process_state_left = [(setter, now) for getter, setter, before in process_state
                                  if (now := getter()) != before]
        for _, setter, before in process_state:
            setter(before)
    return TraceResult(out, tracer, result, tracer.stopped_at, None)


# [Note: a paused generator started natively] A generator made in captured code and paused where
# the graph breaks cannot be carried into generated code: its frame exists only inside kiln. One
# paused inside a try/with block cannot be left behind either (Python runs its cleanup when it
# collects the generator). The typical one is a `@contextmanager`'s, paused at its `yield` while
# the `with` body breaks the graph (`with sdpa_kernel(...)`, a user's manager around a print). Not
# yet stepped, such a generator can be rebuilt (the same call again, `rebuild._generator`). So when
# a `with` statement of the root frame first stepped it, the capture is redone stopping at that
# BEFORE_WITH: it runs natively on the rebuilt manager, the real generator runs there, and the
# resume function continues inside the block, whose exception-table handler calls the manager's
# `__exit__` as Python does (normally or with the body's exception), which finishes the generator.
# A generator first stepped elsewhere (`next(g)`, a `for` loop) still makes the function run
# eagerly: its cleanup would depend on when the real generator is collected, and on the compiling
# call the trace's own objects hold it for a while.
STARTS_NATIVELY = ("BEFORE_WITH",)


def _start_natively(tracer: Tracer, out: OutputGraph, paused) -> GraphBreak | None:
    """The graph break that makes a paused generator start natively, or None (see the Note)."""
    candidates = [paused] if paused is not None else []
    if tracer.stopped_at is not None:
        candidates += [g for g in out.generators if g.state == "suspended"]
    by_offset = {i.offset: i for i in tracer.insts}
    starts = [(g.first_step[0], i, g) for i, g in enumerate(candidates) if g.first_step is not None
              and by_offset.get(g.first_step[0]) is not None
              and by_offset[g.first_step[0]].opname in STARTS_NATIVELY
              and (tracer.stopped_at is None or g.first_step[0] < tracer.stopped_at.offset)]
    if not starts:
        return None
    offset, _, gen = min(starts)
    reason = left_paused_reason(gen) if gen is paused else \
        "a generator made in captured code, paused at a `yield` where the graph breaks"
    brk = GraphBreak(f"{reason}: it starts natively, at the instruction that first steps it", gen.frame.where())
    brk.root_offset = offset
    brk.native_start = True   # that instruction runs as Python: its callee's frames are not captured
    return brk


def _before_with(mgr, wrap=None):
    """BEFORE_WITH as Python: the manager's `__exit__` bound, and what its `__enter__` returns
    (`wrap` captures the frames `__enter__` runs, where the graph broke inside it)."""
    cls = type(mgr)
    try:
        enter, exit_ = cls.__enter__, cls.__exit__
    except AttributeError:
        raise TypeError(f"'{cls.__name__}' object does not support the context manager protocol") from None
    exit_bound = exit_.__get__(mgr, cls) if hasattr(exit_, "__get__") else exit_
    enter_bound = enter.__get__(mgr, cls) if hasattr(enter, "__get__") else enter
    return exit_bound, (wrap(enter_bound) if wrap is not None else enter_bound)()


# -- the native step at a graph break ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Step:
    """How one instruction runs natively in generated code: it pops `pops` stack values
    (named s[0..]) and pushes the values of `pushes` (Python expressions over them)."""
    pops: int
    pushes: tuple[str, ...]


def native_step(tx: Tracer, inst: dis.Instruction, wrap_callee: bool) -> tuple[Step, list[str]] | None:
    """The instruction `inst` as Python source over stack values `s[i]`; None if kiln has no
    native form for it. Branches are handled by the caller."""
    op = inst.opname
    callee = "__wrap(s[{}])" if wrap_callee else "s[{}]"
    if op in ("CALL", "CALL_KW"):
        argc = inst.arg
        # 3.13's CALL_KW finds the keyword names on the stack, above the arguments
        names, top = (tuple(python_value(tx.stack[-1])), 1) if op == "CALL_KW" else (tuple(tx.kw_names), 0)
        fn_at, self_at = call_slots(tx.stack[-argc - 2 - top], tx.stack[-argc - 1 - top])
        pos = argc - len(names)
        args = [f"s[{self_at}]"] * (self_at is not None) + [f"s[{2 + i}]" for i in range(pos)]
        kw = [f"{n}=s[{2 + pos + j}]" for j, n in enumerate(names)]
        return Step(argc + 2 + top, (f"{callee.format(fn_at)}({', '.join(args + kw)})",)), []
    if op == "CALL_FUNCTION_EX":
        has_kw = inst.arg & 1
        fn_at, self_at = call_slots(tx.stack[-3 - has_kw], tx.stack[-2 - has_kw])
        self_arg = f"s[{self_at}], " if self_at is not None else ""
        kw = ", **s[3]" if has_kw else ""
        return Step(3 + has_kw, (f"{callee.format(fn_at)}({self_arg}*s[2]{kw})",)), []
    if op == "BEFORE_WITH":   # pushes the manager's __exit__, then what __enter__ returned
        return Step(1, ("__bw[0]", "__bw[1]")), [f"__bw = __before_with(s[0]{', __wrap' if wrap_callee else ''})"]
    if op == "BINARY_OP":
        return Step(2, (f"__ops[{inst.arg}](s[0], s[1])",)), []
    if op == "COMPARE_OP":
        # 3.13's bit 16 asks for a bool: its jumps take True or False only
        as_bool = PY313 and inst.arg & 16
        return Step(2, (f"{'bool' if as_bool else ''}(s[0] {inst.argval} s[1])",)), []
    if op == "TO_BOOL":
        return Step(1, ("bool(s[0])",)), []
    if op == "CONTAINS_OP":
        return Step(2, (f"(s[0] {'not in' if inst.arg else 'in'} s[1])",)), []
    if op == "BINARY_SUBSCR":
        return Step(2, ("s[0][s[1]]",)), []
    if op == "STORE_SUBSCR":
        return Step(3, ()), ["s[1][s[2]] = s[0]"]
    if op == "BINARY_SLICE":  # 3.12: container, start, stop
        return Step(3, ("s[0][s[1]:s[2]]",)), []
    if op == "STORE_SLICE":  # 3.12: value, container, start, stop
        return Step(4, ()), ["s[1][s[2]:s[3]] = s[0]"]
    if op in ("LOAD_METHOD",) or op == "LOAD_ATTR" and PY312 and inst.arg & 1:
        attr = f"s[0].{inst.argval}"  # the bound method, with a NULL (see push_callable)
        return Step(1, (attr, "__NULL__") if PY313 else ("__NULL__", attr)), []
    if op == "LOAD_ATTR":
        return Step(1, (f"s[0].{inst.argval}",)), []
    if op == "STORE_ATTR":
        return Step(2, ()), [f"s[1].{inst.argval} = s[0]"]
    if op == "UNARY_NOT":
        return Step(1, ("(not s[0])",)), []
    if op == "UNARY_NEGATIVE":
        return Step(1, ("(-s[0])",)), []
    if op == "GET_ITER":
        return Step(1, ("iter(s[0])",)), []
    if op == "FORMAT_VALUE":
        flags = inst.arg
        conv = {0: "", 1: "!s", 2: "!r", 3: "!a"}[flags & 3]
        if flags & 4:
            return Step(2, (f"format(f'{{s[0]{conv}}}' if {bool(conv)} else s[0], s[1])",)), []
        return Step(1, (f"f'{{s[0]{conv}}}'",)), []
    if op == "CONVERT_VALUE":  # 3.13 splits FORMAT_VALUE in three
        return Step(1, (f"{('str', 'repr', 'ascii')[inst.arg - 1]}(s[0])",)), []
    if op == "FORMAT_SIMPLE":
        return Step(1, ("format(s[0])",)), []
    if op == "FORMAT_WITH_SPEC":
        return Step(2, ("format(s[0], s[1])",)), []
    return None


BRANCHES = {
    "POP_JUMP_IF_TRUE": "bool(s[0])", "POP_JUMP_FORWARD_IF_TRUE": "bool(s[0])",
    "POP_JUMP_BACKWARD_IF_TRUE": "bool(s[0])",
    "POP_JUMP_IF_FALSE": "not s[0]", "POP_JUMP_FORWARD_IF_FALSE": "not s[0]",
    "POP_JUMP_BACKWARD_IF_FALSE": "not s[0]",
}
KEEP_ON_JUMP = {"JUMP_IF_TRUE_OR_POP": "bool(s[0])", "JUMP_IF_FALSE_OR_POP": "not s[0]"}


# -- printing an entry -----------------------------------------------------------------------------
def _effect_order(effects: list) -> list:
    """Container writes once (their final contents), attribute and global writes in order."""
    seen, ordered = set(), []
    for e in effects:
        if isinstance(e, ContainerMutation):
            if id(e.target) in seen:
                continue
            seen.add(id(e.target))
        ordered.append(e)
    return ordered


def compile_source(name: str, params: str, body: list[str], bindings: dict[str, Any], filename: str,
                   like: types.FunctionType | None = None):
    """exec one generated function; `bindings` are the names it closes over; `like` gives it
    the defaults of the function it stands for."""
    text = "\n".join("        " + line for line in body)
    src = (f"def __make({', '.join(bindings)}):\n"
           f"    def {name}({params}):\n{text}\n"
           f"    return {name}\n")
    # [Note: keys printed by reference] and NumpyTensorSource (sources.py)
    namespace: dict = {"__kiln_keys": KEYS, "__kiln_from_numpy": torch.from_numpy,
                              "__kiln_object_getattribute": object.__getattribute__}
    exec(compile(src, filename, "exec"), namespace)
    fn = namespace["__make"](*bindings.values())
    fn.__kiln_source__ = src
    if like is not None:
        fn.__defaults__, fn.__kwdefaults__ = like.__defaults__, like.__kwdefaults__
    return fn


def _has_ops(out: OutputGraph) -> bool:
    """Whether the graph computes anything. Grad-mode switches alone do not count: with no op between
    them only the mode they leave matters, and the entry sets that itself (as Dynamo, whose graph
    before a break inside `with torch.no_grad()` holds no grad-mode node and is not compiled)."""
    return any(n.op in ("call_function", "call_method", "call_module")
               and n.target is not torch._C._set_grad_enabled for n in out.graph.nodes)


def _live_locals(tx: Tracer) -> list[tuple[str, V.Variable]]:
    code = tx.code
    # __kiln_s<i> are a resume prologue's stack values: dead once pushed
    live = [(n, tx.locals[n]) for n in code.co_varnames if n in tx.locals and not n.startswith("__kiln_s")]
    live += [(n, c.contents) for n, c in tx.cells.items()
             if n in code.co_cellvars and c.contents is not None]
    return live


def _tuple_text(exprs: list[str]) -> str:
    return f"({''.join(e + ', ' for e in exprs)})"


def _break_tail(trace: TraceResult, r: Rebuilder, bindings: dict, make_resume,
                wrap_callee: bool) -> tuple[list[str], list[str]]:
    """Lines that run the instruction a graph broke at and hand over to resume functions, as
    (reads, actions): the reads take the frame's values before side effects are replayed (a
    `kwargs.pop("s")` written back must not lose the `s` a local still holds), the actions after."""
    tx, inst = trace.tracer, trace.stopped_at
    stack = list(tx.stack)
    local_items = _live_locals(tx)
    local_names = tuple(n for n, _ in local_items)
    reads = [f"__locals = {_tuple_text([r.expr(v) for _, v in local_items])}"]
    local_exprs = [f"__locals[{i}]" for i in range(len(local_items))]
    next_offset = tx.insts[tx.index[inst.offset] + 1].offset

    def resume_call(offset, layout: list, pushed_exprs: list[str]) -> str:
        nulls = tuple(isinstance(v, V.Null) or v == "__NULL__" for v in layout)
        fn = make_resume(offset, nulls, local_names)
        name = f"__resume{len([k for k in bindings if k.startswith('__resume')])}"
        bindings[name] = fn
        stack_exprs = [e for e, null in zip(pushed_exprs, nulls) if not null]
        by_name = dict(zip(resume_parameters(tx.code, nulls, ()), stack_exprs)) | dict(zip(local_names, local_exprs))
        args = [by_name[p] for p in resume_parameters(tx.code, nulls, local_names)]
        return f"return {name}({', '.join(args)})"

    def exprs(values):
        return [("None" if isinstance(v, V.Null) else r.expr(v)) for v in values]

    def read_rest(values) -> list[str]:
        reads.append(f"__rest = {_tuple_text(exprs(values))}")
        return [f"__rest[{i}]" for i in range(len(values))]

    op = inst.opname
    if op in BRANCHES or op in KEEP_ON_JUMP:
        cond = BRANCHES.get(op) or KEEP_ON_JUMP[op]
        rest = stack[:-1]
        rest_exprs = read_rest(rest)
        reads.append(f"s = ({r.expr(stack[-1])},)")
        lines = []
        jump_layout = rest + ([stack[-1]] if op in KEEP_ON_JUMP else [])
        jump_exprs = rest_exprs + (["s[0]"] if op in KEEP_ON_JUMP else [])
        lines.append(f"if {cond}:")
        lines.append("    " + resume_call(inst.argval, jump_layout, jump_exprs))
        lines.append(resume_call(next_offset, rest, rest_exprs))
        return reads, lines
    step = native_step(tx, inst, wrap_callee)
    if step is None:
        raise CannotRebuild(f"kiln cannot run the instruction {op} natively at a graph break")
    step, statements = step
    operands, rest = stack[len(stack) - step.pops:], stack[:len(stack) - step.pops]
    reads.append(f"s = {_tuple_text(exprs(operands))}")
    rest_exprs = read_rest(rest)
    lines = list(statements)
    pushed = []
    for i, p in enumerate(step.pushes):
        if p == "__NULL__":
            pushed.append("__NULL__")
        else:
            lines.append(f"__r{i} = {p}")
            pushed.append(f"__r{i}")
    layout = rest + list(pushed)
    handler = next((e for e in tx.exc_table if e.start <= inst.offset < e.end), None)
    if handler is not None:
        # [Note: a native step inside a try block] What the instruction raises is the frame's
        # to handle: it goes to the handler the exception table names, as the interpreter would
        # send it, with the stack cut to the handler's depth (and the offset, for a `lasti` one)
        handler_layout = rest[:handler.depth] + ([V.Constant(inst.offset)] if handler.lasti else []) + ["__e"]
        handler_exprs = rest_exprs[:handler.depth] + ([repr(inst.offset)] if handler.lasti else []) + ["__e"]
        lines = ["try:", *("    " + line for line in lines), "except BaseException as __e:",
                 "    " + resume_call(handler.target, handler_layout, handler_exprs)]
    lines.append(resume_call(next_offset, layout, rest_exprs + pushed))
    return reads, lines


# [Note: inputs written in place that share memory] A graph that writes into one of its tensor
# inputs is compiled (by kiln's aot, by any functionalizing backend) as if each input owned its
# memory: `x.add_(1); y.add_(1)` on two views of one tensor adds 2 in eager, 1 compiled. So where
# a traced graph writes into an input (its fake tensor's version counter moved), the entry is
# guarded on which of its tensor inputs share storage, as they did when it was traced: another
# pattern recompiles. Traced with such inputs sharing memory, the entry runs the function eagerly
# (under those same guards), as kiln's aot cannot compile the write; separate inputs compile.
class SharedInputsWritten(Exception):
    """The traced graph writes into a tensor input that shares memory with another: the frame runs
    eagerly under `check` (the trace's guards, the storage pattern among them)."""

    def __init__(self, check, guards):
        super().__init__("tensor inputs written in place share memory (views of one tensor), which kiln's "
                         "compiled graphs do not model: the function runs eagerly for inputs sharing memory so")
        self.check, self.guards = check, guards


def _storage_pattern(*tensors) -> tuple:
    """For each tensor, the index of the first one sharing its storage (itself where none does)."""
    first: dict = {}
    return tuple(first.setdefault(t.untyped_storage().data_ptr(), i) if t.numel() else i
                 for i, t in enumerate(tensors))


class _SameStoragePattern:
    """`(*tensors) -> bool`: they share storage as the pattern says. A decode step passes the same
    cache tensors at the same addresses each call (dolly: 99 inputs, 25 us of storage lookups on a
    CPU core), so addresses that passed last time pass again: the tensor guards, checked first,
    hold each tensor's sizes and strides, so each spans the memory it spanned then, and inputs of
    separate storages then (memory apart) are apart now. (An entry traced with inputs sharing
    storage runs eagerly, right whatever they share.)"""

    def __init__(self, pattern: tuple):
        self.pattern, self.passed = pattern, None

    def __call__(self, *tensors) -> bool:
        addresses = list(map(torch.Tensor.data_ptr, tensors))
        if addresses == self.passed:
            return True
        if _storage_pattern(*tensors) != self.pattern:
            return False
        self.passed = addresses
        return True


def _guard_input_aliasing(out: OutputGraph) -> bool:
    """Add the Note's guard where the graph writes into a tensor input; True when inputs written
    in place share memory with another input (the entry must then run eagerly)."""
    tensors = [(src, var) for src, var in out.inputs if isinstance(var, V.TensorVar)
               and isinstance(out.input_values.get(var.node), torch.Tensor)]
    # (an inference tensor keeps no version counter: its writes are not seen here)
    written = [i for i, (_, var) in enumerate(tensors) if not var.example.is_inference() and var.example._version != 0]
    if not written or len(tensors) < 2:
        return False
    pattern = _storage_pattern(*[out.input_values[var.node] for _, var in tensors])
    sources = tuple(src for src, _ in tensors)
    out.guard(Guard(GuardKind.VALUE, None, (_SameStoragePattern(pattern), sources,
                                            f"the tensor inputs share storage as traced ({pattern})")))
    return any(pattern[i] != i or pattern.count(i) > 1 for i in written)


def build_entry(fn: types.FunctionType, trace: TraceResult, backend: Callable, args: tuple, kwargs: dict,
                make_resume: Callable, wrap_fn: Callable, wrap_callee: bool) -> Entry:
    """Print the trace as an entry: the graph compiled by `backend`, guards, generated code."""
    from kiln.capture.semantics import BINARY_OPS
    out = trace.out
    params, _ = params_text(fn.__code__)
    r = Rebuilder()
    bindings: dict[str, Any] = {**out.globals_dicts, "__fn": fn, "__ops": BINARY_OPS, "__wrap": wrap_fn,
                                "__before_with": _before_with}
    if trace.stopped_at is not None:
        tx = trace.tracer
        r.frame_cells = {id(c) for n, c in tx.cells.items() if n in tx.code.co_cellvars}
    effects = [line for e in _effect_order(out.side_effects) for line in r.side_effect(e)]
    if trace.stopped_at is None:
        reads, tail = [f"__result = {r.expr(trace.result)}"], ["return __result"]
    else:
        reads, tail = _break_tail(trace, r, bindings, make_resume, wrap_callee)
    if _guard_input_aliasing(out):   # [Note: inputs written in place that share memory]
        with log.stage("guards"):
            raise SharedInputsWritten(*_guards(fn, out, params))
    body, gm = [], None
    entry_mode = next(g.expected for g in out.guards if g.kind is GuardKind.GRAD_MODE)
    out.drop_cancelling_grad_switches(entry_mode)
    if r.outputs or _has_ops(out):
        out.graph.output(tuple(r.outputs))
        gm = out.graph_module()
        input_exprs = [src.expr() for src, _ in out.inputs]
        read_inputs = compile_source("__kiln_inputs", params, [f"return [{', '.join(input_exprs)}]"],
                                     {**bindings}, "<kiln inputs>", fn)
        example_inputs = read_inputs(*args, **kwargs)
        bindings["__graph"] = backend(gm, example_inputs)
        body.append(f"__out = __graph({', '.join(input_exprs)})")
    if out.grad_enabled != entry_mode:
        # the code after the graph runs in the mode the graph left (`torch.set_grad_enabled(False)`
        # before a break): set here, as a backend that compiles the graph whole keeps its mode inside
        bindings["__set_grad_enabled"] = torch._C._set_grad_enabled
        body.append(f"__set_grad_enabled({out.grad_enabled!r})")
    for i, (setter, value) in enumerate(getattr(out, "process_state_left", ())):
        bindings[f"__state{i}"] = (setter, value)   # as grad mode: the state the graph leaves
        body.append(f"__state{i}[0](__state{i}[1])")
    body += r.prelude + reads + effects + tail
    bindings.update({n: v for n, v in r.consts.values()})
    run = compile_source("__kiln_entry", params, body, bindings,
                         f"<kiln entry of {fn.__code__.co_name}>", fn)
    with log.stage("guards"):
        check, guards = _guards(fn, out, params)
    return Entry(check, run, guards, gm, trace.break_reason, run.__kiln_source__)


def _distinct_inputs(live: list[Guard]) -> Guard | None:
    """[Note: distinct inputs] Two tensors passed in as one object are one graph input, with a
    SAME guard between their sources (builder.py); tensors traced as distinct objects are guarded
    to stay distinct. Code that asks about identity (`a is b`, `len({a, b})`, a set or dict of
    tensors) was answered for the objects of the first call, and a graph whose inputs alias where
    it traced them apart would see one input's in-place write through the other: a call that
    passes one tensor twice, or an argument that is a global the code also reads, recompiles."""
    sources = [g.source for g in live if g.kind is GuardKind.TENSOR and g.source is not None]
    return Guard(GuardKind.DISTINCT, sources[0], tuple(sources)) if len(sources) > 1 else None


def _guards(fn: types.FunctionType, out, params: str):
    """The entry's guard function and guards: capture's, and the shape environment's relations."""
    guard_bindings = {**out.globals_dicts, "__fn": fn}
    first_use = {src: var.node.meta.get("first_use") for src, var in out.inputs}
    guards = [dataclasses.replace(g, where=first_use.get(g.source)) if g.kind is GuardKind.TENSOR and g.where is None
              else g for g in out.guards]
    env = out.examples.shape_env
    if any(e is None for g in guards if g.kind is GuardKind.TENSOR for e in g.expected.sizes) or \
            any(isinstance(var, V.SymNumber) for _, var in out.inputs):
        # symbolic sizes: the ShapeEnv's guards (relations between symbols) over the same inputs
        names = [var.node.name for _, var in out.inputs]
        # inputs whose static sizes and strides their tensor guards compare already
        specs = {g.source: g.expected for g in guards if g.kind is GuardKind.TENSOR}
        checked = {var.node.name: (spec.sizes, spec.strides) for src, var in out.inputs
                   if (spec := specs.get(src)) is not None and None not in spec.sizes and None not in spec.strides}
        guards.append(Guard(GuardKind.SHAPES, None, (env.guard_function(*names, checked=checked),
                                                     tuple(s for s, _ in out.inputs),
                                                     env.format_guards(),
                                                     tuple((n, s) for n, (s, _) in zip(names, out.inputs)))))
    parts = settled.split(guards)     # [Note: settled module state]
    distinct = _distinct_inputs(parts.live)
    if distinct is not None:
        parts.live.append(distinct)
        guards.append(distinct)
    check = compile_guards(parts.live, params, guard_bindings, settled=parts.settled, pins=parts.pins,
                           settled_tensors=parts.tensors)
    check.__defaults__, check.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    return check, guards
