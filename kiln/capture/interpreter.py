"""The symbolic interpreter of one Python frame: a stack machine over variable trackers.

A `Tracer` walks a code object's instructions, dispatching each through `HANDLERS` (one handler
per opcode name, registered by `opcodes.py`; version differences live inside handlers), and every
call through `CALLS` (one handler per tracker class, registered by `calls.py`, the one call
dispatch). The tables live here, under the modules that fill them, so that no module of capture
imports one above it: handlers reach each other through `tx.call` and these tables. Calls to Python functions are
inlined by a child `Tracer` sharing the parent's `OutputGraph`. Exceptions raised by traced code
are `ObservedException`s routed through the code's exception table. Code kiln cannot capture
raises `GraphBreak`, which the root frame turns into a graph break at its own instruction (see
`convert.py`); `Unsupported` is the user-facing form under `fullgraph=True`.
"""
from __future__ import annotations

import dis
import os
import sys
import types
from typing import Any, Callable

import torch

from kiln.capture import variables as V
from kiln.capture.output import OutputGraph
from kiln.errors import Unsupported

PY312 = sys.version_info >= (3, 12)
PY313 = sys.version_info >= (3, 13)
MAX_INLINE_DEPTH = 64
CO_GENERATOR = 0x20
MAX_INSTRUCTIONS = 2_000_000  # per capture: every loop is unrolled, so bound the work

HANDLERS: dict[str, Callable] = {}  # opcode name -> handler(tx, inst); filled by opcodes.py
CALLS: dict[type, Callable] = {}  # tracker class -> handler(tx, fn, args, kwargs); filled by calls.py
# run when an inlined frame returns: hook(frame, value returned); generators.py closes the paused
# generators the frame's locals held ([Note: generators collected at return])
FRAME_RETURN_HOOKS: list[Callable] = []


class GraphBreak(Exception):
    """Capture cannot continue here. `frames` lists (code, instruction offset) from the root down."""

    def __init__(self, reason: str, where: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.where = where
        self.root_offset: int | None = None  # the root frame's instruction that was running
        # the call that broke runs natively through `frame.wrap_callable`, which captures the frames
        # it calls (a module whose hooks run as torch wrote them, DDP's forward)
        self.wrap_callee = False
        # a paused generator's first step, run natively ([Note: a paused generator started natively])
        self.native_start = False


class ObservedException(Exception):
    """A Python exception raised by the traced program itself (not by kiln). `where` is the user's
    line that raised it."""

    def __init__(self, exc: V.ExceptionVar):
        super().__init__(exc.cls.__name__)
        self.exc = exc
        self.where: str | None = None
        self.reraise = False   # a bare `raise` / RERAISE: CPython leaves its __context__ as it is

    def describe(self) -> str:
        """`AttributeError: message`, with the message when it is known at capture time."""
        args = [a.value for a in self.exc.args if isinstance(a, V.Constant)]
        message = str(args[0]) if len(args) == 1 else ", ".join(map(repr, args))
        return f"{self.exc.cls.__name__}: {message}" if message else self.exc.cls.__name__


class FrameReturn(Exception):
    pass


class FrameYield(Exception):
    """YIELD_VALUE paused a generator's frame; the value is its `yielding`."""


class NotConstant(Exception):
    """A tracker that stands for a value known only at run time was used where Python needs
    the value itself (a dict key, an argument of a folded builtin, ...)."""


def _code_info(code: types.CodeType):
    """Instructions, offset->index and the exception table of a code object (cached per code)."""
    info = _CODE_INFO.get(code)
    if info is None:
        insts = list(dis.get_instructions(code))
        index = {inst.offset: i for i, inst in enumerate(insts)}
        table = dis._parse_exception_table(code)  # stable in 3.11-3.13
        info = _CODE_INFO[code] = (insts, index, table)
    return info


_CODE_INFO: dict[types.CodeType, tuple] = {}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_CAPTURE_DIR = os.path.dirname(__file__) + os.sep


class Tracer:
    """Interprets one frame. `locals` and `cells` map names to trackers."""

    def __init__(self, code: types.CodeType, f_globals: dict, out: OutputGraph, *, parent: "Tracer | None" = None,
                 locals_: dict | None = None, closure: tuple = (), fn_name: str = ""):
        self.code = code
        self.f_globals = f_globals
        self.out = out
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        if self.depth > MAX_INLINE_DEPTH:
            raise GraphBreak("inlining went deeper than 64 calls (recursion?)")
        self.insts, self.index, self.exc_table = _code_info(code)
        self.locals: dict[str, V.Variable] = dict(locals_ or {})
        self.cells: dict[str, V.Cell] = {}
        self.closure = closure
        self.stack: list[V.Variable] = []
        self.ip = 0
        self.inst: dis.Instruction | None = None
        self.kw_names: tuple = ()
        self.exc_info: list[V.Variable] = []  # the exceptions being handled (PUSH_EXC_INFO)
        self.return_value: V.Variable | None = None
        self.yielding: V.Variable | None = None  # the value a generator's frame paused on
        self.fn_name = fn_name or code.co_name
        # the root frame stops at `stop_at` (an instruction offset) to break the graph there
        self.stop_at: int | None = None
        self.stopped_at: dis.Instruction | None = None
        self.active_contexts: list[V.ContextVar] = []

    # -- the stack ---------------------------------------------------------------------------
    def push(self, v: V.Variable):
        self.stack.append(v)

    def pop(self) -> V.Variable:
        return self.stack.pop()

    def popn(self, n: int) -> list[V.Variable]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, offset: int):
        self.ip = self.index[offset]

    # -- where we are, for users ---------------------------------------------------------------
    def where(self) -> str:
        line = None
        if self.inst is not None and self.inst.positions is not None:
            line = self.inst.positions.lineno
        from kiln.capture.resume import user_function_name
        return f"{self.code.co_filename}:{line or self.code.co_firstlineno} in {user_function_name(self.code.co_name)}"

    def user_where(self) -> str:
        """`where()` of the innermost frame outside torch (and kiln's own Python that capture
        inlines, `vmap.vmap_per_example`): the user's line a torch module was called on."""
        tx = self
        while tx.parent is not None and tx.code.co_filename.startswith((_TORCH_DIR, _CAPTURE_DIR)):
            tx = tx.parent
        return tx.where()

    def stack_trace(self) -> str:
        """The frames being interpreted, innermost last, as a Python traceback prints them."""
        frames, tx = [], self
        while tx is not None:
            line = tx.inst.positions.lineno if tx.inst is not None and tx.inst.positions else None
            frames.append(f'  File "{tx.code.co_filename}", line {line or tx.code.co_firstlineno}, in {tx.code.co_name}\n')
            tx = tx.parent
        return "".join(frames[::-1])

    def user_stack(self) -> list[str]:
        frames, tx = [], self
        while tx is not None:
            frames.append(tx.where())
            tx = tx.parent
        return frames[::-1]

    def unsupported(self, reason: str) -> GraphBreak:
        return GraphBreak(reason, self.where())

    # -- the main loop -------------------------------------------------------------------------
    def run(self) -> V.Variable:
        while True:
            if self.ip >= len(self.insts):
                raise self.unsupported("ran past the end of the code object")
            inst = self.inst = self.insts[self.ip]
            self.out.current = self
            self.out.instructions += 1
            if self.out.instructions > MAX_INSTRUCTIONS:
                raise self.unsupported(f"capture ran more than {MAX_INSTRUCTIONS} instructions "
                                       "(a loop whose condition never changes at capture time?)")
            if self.stop_at is not None and inst.offset == self.stop_at:
                self.stopped_at = inst
                return None
            self.ip += 1
            handler = HANDLERS.get(inst.opname)
            if handler is None:
                raise self.unsupported(f"the bytecode instruction {inst.opname} is not supported by kiln")
            try:
                handler(self, inst)
            except FrameReturn:
                return self.return_value
            except FrameYield:
                return None
            except ObservedException as e:
                if e.where is None:
                    e.where = self.where()
                    if not e.reraise:
                        self._chain(e.exc)
                self.handle_exception(e)
            except NotConstant as e:
                kind = e.args[0].python_type().__name__ if e.args else "value"
                raise self.unsupported(f"{inst.opname} needs a value known at capture time, got a {kind}") from None
            except GraphBreak as e:
                if e.where is None:
                    e.where = self.where()
                if self.parent is None and e.root_offset is None:
                    e.root_offset = inst.offset
                raise
            except Exception as e:  # kiln's own modelling failed: break here rather than crash the user
                brk = self.unsupported(f"kiln could not model {inst.opname} "
                                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
                if self.parent is None:
                    brk.root_offset = inst.offset
                raise brk from e

    def _chain(self, exc: V.ExceptionVar):
        """An exception raised while another is handled gets that one as its `__context__`, as
        CPython sets it at each raise; where `exc` is already in the handled one's context chain,
        the chain is cut there, so it never becomes a cycle."""
        exc.raised = True
        tx = self
        while tx is not None and not tx.exc_info:
            tx = tx.parent
        handled = tx.exc_info[-1] if tx is not None else None
        if not isinstance(handled, V.ExceptionVar) or handled is exc:
            return
        link, seen = handled, set()
        while isinstance(context := link.attrs.get("__context__"), V.ExceptionVar) and id(link) not in seen:
            seen.add(id(link))
            if context is exc:
                link.attrs["__context__"] = V.Constant(None)
                break
            link = context
        exc.attrs["__context__"] = handled

    def handle_exception(self, e: ObservedException):
        """Route an exception raised by traced code to its handler in this frame, or re-raise."""
        offset = self.inst.offset
        for entry in self.exc_table:
            if entry.start <= offset < entry.end:
                del self.stack[entry.depth:]
                if entry.lasti:
                    self.push(V.Constant(offset))
                self.push(e.exc)
                self.jump(entry.target)
                return
        raise e

    def raise_(self, cls: type, *args):
        raise ObservedException(V.ExceptionVar(cls, [V.Constant(a) for a in args]))

    # -- calls ---------------------------------------------------------------------------------
    def call(self, fn: V.Variable, args: list, kwargs: dict | None = None) -> V.Variable:
        return call_variable(self, fn, list(args), dict(kwargs or {}))

    def inline(self, fn: V.FunctionVar, args: list, kwargs: dict, self_var: V.Variable | None = None) -> V.Variable:
        from kiln.capture.binding import bind_arguments
        code = fn.code
        locals_ = bind_arguments(self, fn, args, kwargs)
        child = Tracer(code, fn.globals, self.out, parent=self, locals_=locals_, closure=fn.closure,
                       fn_name=fn.name)
        child.fn_source = fn.source
        if code.co_flags & CO_GENERATOR:   # runs only when stepped ([Note: lazy generators])
            generator = V.GeneratorVar(child)
            self.out.generators.append(generator)
            return generator
        try:
            result = child.run()
        finally:
            self.out.current = self
        for hook in FRAME_RETURN_HOOKS:
            hook(child, result)
        return result

    def root(self) -> "Tracer":
        tx = self
        while tx.parent is not None:
            tx = tx.parent
        return tx


def call_variable(tx, fn: V.Variable, args: list, kwargs: dict) -> V.Variable:
    """Call the tracker `fn`: the handler `calls.py` registered for its class."""
    handler = CALLS.get(type(fn))
    if handler is None:
        raise tx.unsupported(f"calling a {fn.python_type().__name__} is not supported")
    return handler(tx, fn, args, kwargs)


def constant(value: Any) -> V.Constant:
    return V.Constant(value)


def raise_unsupported_for_user(e: GraphBreak) -> Unsupported:
    return Unsupported(e.reason, e.where)
