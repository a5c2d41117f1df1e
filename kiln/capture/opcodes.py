"""One handler per CPython opcode: `HANDLERS[opname](tx, inst)`.

Handlers are written against CPython 3.11's bytecode; where 3.12 or 3.13 changed an opcode's
meaning (LOAD_ATTR's method bit, LOAD_SUPER_ATTR, CALL_INTRINSIC_1, RETURN_CONST, END_FOR,
LOAD_FAST_*, BINARY_SLICE, POP_JUMP_IF_*, TO_BOOL, MAKE_FUNCTION's flags), the difference lives
inside the handler or in an entry that only the newer version emits. The one difference that cuts
across handlers, where CALL's NULL slot sits, is `push_callable` and `call_slots` below.
Semantics of the operations themselves are in `semantics.py` (operators, items, iteration),
`attributes.py` (attribute reads) and `calls.py` (calls, `with` blocks); these handlers only move
trackers between the stack, locals and cells. Importing this module registers its handlers in
`interpreter.HANDLERS`.
"""
from __future__ import annotations

import builtins
import dis
import operator

from kiln.capture import semantics as S
from kiln.capture import variables as V
from kiln.capture.attributes import delattr_var, getattr_var, setattr_var
from kiln.capture.calls import as_exception, enter_context
from kiln.capture.generators import advance, is_user_iterator, step, user_next
from kiln.capture.interpreter import (CO_GENERATOR, HANDLERS, PY312, PY313, FrameReturn, FrameYield, GraphBreak,
                                       ObservedException, Tracer)
from kiln.capture.output import CellWrite
from kiln.capture.sources import ClosureSource, GlobalSource


# [Note: CALL's NULL slot]
# CALL finds two slots below its arguments. Up to 3.12 they hold [NULL, callable] or
# [method, self]; from 3.13 [callable, NULL] or [callable, self]. LOAD_GLOBAL, LOAD_ATTR and
# LOAD_SUPER_ATTR push the NULL on the side the version expects (`push_callable`); CALL,
# CALL_KW, CALL_FUNCTION_EX and the native form of a call at a graph break (`convert.py`) read
# the two slots through `call_slots`.
def push_callable(tx, fn):
    """Push `fn` with the NULL that says "no self": below it up to 3.12, above it from 3.13."""
    if PY313:
        tx.push(fn)
        tx.push(V.Null())
    else:
        tx.push(V.Null())
        tx.push(fn)


def call_slots(first, second) -> tuple[int, int | None]:
    """Which of the two slots below a call's arguments (0: the lower) hold the callable and the
    `self` passed as its first argument (None: the other slot is a NULL)."""
    if PY313:
        return 0, None if isinstance(second, V.Null) else 1
    if isinstance(first, V.Null):
        return 1, None
    return 0, 1


def _pop_callable(tx, args: list) -> tuple:
    """Pop the two slots below a call's arguments: (the callable, its arguments with any self)."""
    second, first = tx.pop(), tx.pop()
    slots = (first, second)
    fn_at, self_at = call_slots(first, second)
    return slots[fn_at], args if self_at is None else [slots[self_at], *args]


def handler(*names):
    def register(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn
    return register


# -- no-ops and stack shuffles ---------------------------------------------------------------------
@handler("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "MAKE_CELL_NOP")
def nop(tx, inst):
    pass


@handler("POP_TOP")
def pop_top(tx, inst):
    tx.pop()


@handler("PUSH_NULL")
def push_null(tx, inst):
    tx.push(V.Null())


@handler("COPY")
def copy(tx, inst):
    tx.push(tx.stack[-inst.arg])


@handler("SWAP")
def swap(tx, inst):
    tx.stack[-1], tx.stack[-inst.arg] = tx.stack[-inst.arg], tx.stack[-1]


@handler("END_FOR")  # 3.12 pops the iterator and the value; 3.13 the value (a POP_TOP follows)
def end_for(tx, inst):
    tx.popn(1 if PY313 else 2)


# -- locals, cells, globals, constants ---------------------------------------------------------------
@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(tx, inst):
    name = inst.argval
    if name in tx.cells:
        # a cell's slot holds the cell: 3.13 emits LOAD_CLOSURE (building a closure) as
        # LOAD_FAST of it; 3.11 and 3.12 read cell variables through LOAD_DEREF, but be lenient
        tx.push(tx.cells[name] if PY313 else tx.cells[name].contents)
        return
    if name not in tx.locals:
        tx.raise_(UnboundLocalError, f"local variable '{name}' referenced before assignment")
    tx.push(tx.locals[name])


@handler("LOAD_FAST_AND_CLEAR")  # 3.12 inlined comprehensions save the outer variable
def load_fast_and_clear(tx, inst):
    tx.push(tx.locals.pop(inst.argval, V.Null()))


@handler("STORE_FAST")
def store_fast(tx, inst):
    value = tx.pop()
    if isinstance(value, V.Null):  # 3.12: restoring a variable that was unbound
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = value


@handler("DELETE_FAST")
def delete_fast(tx, inst):
    tx.locals.pop(inst.argval, None)


@handler("LOAD_CONST")
def load_const(tx, inst):
    tx.push(S.constant_of(tx, inst.argval))


@handler("RETURN_CONST")  # 3.12
def return_const(tx, inst):
    tx.return_value = S.constant_of(tx, inst.argval)
    raise FrameReturn


@handler("RETURN_VALUE")
def return_value(tx, inst):
    tx.return_value = tx.pop()
    raise FrameReturn


@handler("LOAD_GLOBAL")
def load_global(tx, inst):
    value = S.load_global(tx, inst.argval)
    if inst.arg & 1:
        push_callable(tx, value)
    else:
        tx.push(value)


@handler("STORE_GLOBAL")
def store_global(tx, inst):
    S.store_global(tx, inst.argval, tx.pop())


@handler("MAKE_CELL")
def make_cell(tx, inst):
    name = inst.argval
    tx.cells[name] = V.Cell(tx.locals.pop(name, None))


@handler("COPY_FREE_VARS")
def copy_free_vars(tx, inst):
    from kiln.capture.builder import wrap
    for i, name in enumerate(tx.code.co_freevars):
        cell = tx.closure[i]
        if not isinstance(cell, V.Cell):  # a real cell of an existing function
            known = tx.out.tensor_by_id.get(id(cell))
            if known is None:
                fn_source = getattr(tx, "fn_source", None)
                try:
                    contents = wrap(tx.out, cell.cell_contents, ClosureSource(fn_source, i) if fn_source else None)
                except ValueError:   # an empty cell: the variable is not assigned yet
                    contents = None
                known = tx.out.tensor_by_id[id(cell)] = V.Cell(contents, real=cell)
                tx.out.keepalive.append(cell)
            cell = known
        tx.cells[name] = cell


@handler("LOAD_CLOSURE")
def load_closure(tx, inst):
    tx.push(tx.cells[inst.argval])


@handler("LOAD_DEREF")
def load_deref(tx, inst):
    cell = tx.cells.get(inst.argval)
    if cell is None or cell.contents is None:
        tx.raise_(NameError, f"free variable '{inst.argval}' referenced before assignment")
    tx.push(cell.contents)


@handler("STORE_DEREF")
def store_deref(tx, inst):
    cell = tx.cells.setdefault(inst.argval, V.Cell())
    cell.contents = tx.pop()
    if cell.real is not None:   # a `nonlocal` write into an existing function's cell
        tx.out.side_effects.append(CellWrite(cell, cell.contents))


@handler("IMPORT_NAME")
def import_name(tx, inst):
    fromlist, level = tx.pop(), tx.pop()
    module = __import__(inst.argval, tx.f_globals, None, S.python_value(fromlist), S.python_value(level))
    tx.push(V.ObjectVar(module))


@handler("IMPORT_FROM")
def import_from(tx, inst):
    tx.push(getattr_var(tx, tx.stack[-1], inst.argval))


# -- attributes ------------------------------------------------------------------------------------
@handler("LOAD_ATTR")
def load_attr(tx, inst):
    value = getattr_var(tx, tx.pop(), inst.argval)
    if PY312 and inst.arg & 1:  # 3.12 folds LOAD_METHOD into LOAD_ATTR's low bit
        push_callable(tx, value)  # kiln pushes the bound method: a NULL, never [method, self]
    else:
        tx.push(value)


@handler("LOAD_METHOD")  # 3.11
def load_method(tx, inst):
    push_callable(tx, getattr_var(tx, tx.pop(), inst.argval))


@handler("LOAD_SUPER_ATTR")  # 3.12: super().name with the two-argument form in bit 1
def load_super_attr(tx, inst):
    self_var, cls, _super = tx.pop(), tx.pop(), tx.pop()
    value = getattr_var(tx, V.SuperVar(S.python_value(cls), self_var), inst.argval)
    if inst.arg & 1:
        push_callable(tx, value)
    else:
        tx.push(value)


@handler("STORE_ATTR")
def store_attr(tx, inst):
    obj, value = tx.pop(), tx.pop()
    setattr_var(tx, obj, inst.argval, value)


@handler("DELETE_ATTR")
def delete_attr(tx, inst):
    delattr_var(tx, tx.pop(), inst.argval)


# -- building containers ---------------------------------------------------------------------------
@handler("BUILD_TUPLE")
def build_tuple(tx, inst):
    tx.push(V.TupleVar(tx.popn(inst.arg)))


@handler("BUILD_LIST")
def build_list(tx, inst):
    tx.push(V.ListVar(tx.popn(inst.arg)))


@handler("BUILD_SET")
def build_set(tx, inst):
    s = V.SetVar()
    for item in tx.popn(inst.arg):
        S.set_add(tx, s, item)
    tx.push(s)


@handler("BUILD_MAP")
def build_map(tx, inst):
    flat = tx.popn(2 * inst.arg)
    tx.push(V.DictVar({S.key_of(tx, k): v for k, v in zip(flat[::2], flat[1::2])}))


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(tx, inst):
    keys = tx.pop()
    values = tx.popn(inst.arg)
    tx.push(V.DictVar(dict(zip(S.python_value(keys), values))))


@handler("BUILD_STRING")
def build_string(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(V.Constant("".join(S.python_value(p) for p in parts)))


@handler("BUILD_SLICE")
def build_slice(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(S.make_slice(tx, parts))


@handler("LIST_APPEND")
def list_append(tx, inst):
    value = tx.pop()
    S.mutate_list(tx, tx.stack[-inst.arg], lambda items: items.append(value))


@handler("SET_ADD")
def set_add(tx, inst):
    value = tx.pop()
    S.set_add(tx, tx.stack[-inst.arg], value)


@handler("MAP_ADD")
def map_add(tx, inst):
    value, key = tx.pop(), tx.pop()
    S.dict_set(tx, tx.stack[-inst.arg], key, value)


@handler("LIST_EXTEND")
def list_extend(tx, inst):
    items = S.iterate(tx, tx.pop())
    S.mutate_list(tx, tx.stack[-inst.arg], lambda lst: lst.extend(items))


@handler("SET_UPDATE")
def set_update(tx, inst):
    other = tx.pop()
    S.set_update(tx, tx.stack[-inst.arg], other)


@handler("DICT_UPDATE", "DICT_MERGE")
def dict_update(tx, inst):
    other = tx.pop()
    target = tx.stack[-inst.arg]
    for k, v in S.dict_items(tx, other):
        S.dict_set(tx, target, V.key_var(k), v)


@handler("LIST_TO_TUPLE")  # 3.11
def list_to_tuple(tx, inst):
    tx.push(V.TupleVar(list(tx.pop().items)))


@handler("CALL_INTRINSIC_1")  # 3.12
def call_intrinsic_1(tx, inst):
    kind = dis._intrinsic_1_descs[inst.arg]  # the 3.12+ name (3.12.3 has no _intrinsic1_descs)
    value = tx.pop()
    if kind == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(V.TupleVar(list(value.items)))
    elif kind == "INTRINSIC_UNARY_POSITIVE":
        tx.push(S.unary_op(tx, operator.pos, value))
    elif kind == "INTRINSIC_STOPITERATION_ERROR":
        tx.push(value)
    else:
        raise tx.unsupported(f"the intrinsic {kind} is not supported by kiln")


@handler("UNPACK_SEQUENCE")
def unpack_sequence(tx, inst):
    items = S.iterate(tx, tx.pop())
    if len(items) != inst.arg:
        tx.raise_(ValueError, f"expected {inst.arg} values to unpack, got {len(items)}")
    for item in reversed(items):
        tx.push(item)


@handler("UNPACK_EX")
def unpack_ex(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = S.iterate(tx, tx.pop())
    if len(items) < before + after:
        tx.raise_(ValueError, "not enough values to unpack")
    rest = V.ListVar(items[before:len(items) - after])
    for item in reversed(items[len(items) - after:]):
        tx.push(item)
    tx.push(rest)
    for item in reversed(items[:before]):
        tx.push(item)


# -- operators -------------------------------------------------------------------------------------
@handler("BINARY_OP")
def binary_op(tx, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(S.binary_op(tx, S.BINARY_OPS[inst.arg], a, b))


@handler("BINARY_SUBSCR")
def binary_subscr(tx, inst):
    key, obj = tx.pop(), tx.pop()
    tx.push(S.getitem(tx, obj, key))


@handler("BINARY_SLICE")  # 3.12
def binary_slice(tx, inst):
    end, start, obj = tx.pop(), tx.pop(), tx.pop()
    tx.push(S.getitem(tx, obj, S.make_slice(tx, [start, end])))


@handler("STORE_SUBSCR")
def store_subscr(tx, inst):
    key, obj, value = tx.pop(), tx.pop(), tx.pop()
    S.setitem(tx, obj, key, value)


@handler("STORE_SLICE")  # 3.12
def store_slice(tx, inst):
    end, start, obj, value = tx.pop(), tx.pop(), tx.pop(), tx.pop()
    S.setitem(tx, obj, S.make_slice(tx, [start, end]), value)


@handler("DELETE_SUBSCR")
def delete_subscr(tx, inst):
    key, obj = tx.pop(), tx.pop()
    S.delitem(tx, obj, key)


@handler("COMPARE_OP")
def compare_op(tx, inst):
    b, a = tx.pop(), tx.pop()
    # a tensor result stays a tensor under 3.13's bool bit: the jump that consumes it breaks
    tx.push(S.binary_op(tx, S.COMPARE_OPS[inst.argval], a, b))


@handler("IS_OP")
def is_op(tx, inst):
    b, a = tx.pop(), tx.pop()
    result = S.is_same(tx, a, b)
    tx.push(V.Constant(result != bool(inst.arg)))


@handler("CONTAINS_OP")
def contains_op(tx, inst):
    container, item = tx.pop(), tx.pop()
    result = S.contains(tx, container, item)
    tx.push(V.Constant(result != bool(inst.arg)))


@handler("UNARY_NEGATIVE")
def unary_negative(tx, inst):
    tx.push(S.unary_op(tx, operator.neg, tx.pop()))


@handler("UNARY_POSITIVE")
def unary_positive(tx, inst):
    tx.push(S.unary_op(tx, operator.pos, tx.pop()))


@handler("UNARY_INVERT")
def unary_invert(tx, inst):
    tx.push(S.unary_op(tx, operator.invert, tx.pop()))


@handler("UNARY_NOT")
def unary_not(tx, inst):
    tx.push(V.Constant(not S.truth(tx, tx.pop())))


@handler("FORMAT_VALUE")
def format_value(tx, inst):
    flags = inst.arg
    spec = S.python_value(tx.pop()) if flags & 0x04 else ""
    value = tx.pop()
    conv = {0: None, 1: str, 2: repr, 3: ascii}[flags & 0x03]
    tx.push(V.Constant(S.format_value(tx, value, conv, spec)))


# -- jumps -----------------------------------------------------------------------------------------
def _pop_jump(when, jump_on: bool | None = None):
    def jump_if(tx, inst):
        value = tx.pop()
        if jump_on is not None and isinstance(value, V.TensorVar) and "checked_truth" not in value.node.meta:
            checked = _check_that_raises(tx, inst, value, jump_on)
            if checked is not None:
                if checked:
                    tx.jump(inst.argval)
                return
        if when(tx, value):
            tx.jump(inst.argval)
    return jump_if


# [Note: a raise on tensor values] Library code validates its inputs' values with a branch whose one
# side only raises: `if torch.any(var < 0): raise ValueError("var has negative entry/entries")`
# (gaussian_nll_loss). The branch needs data, so it broke the graph, and fullgraph=True refused the
# function. When one side of a jump on a tensor's truth builds a builtin exception from constants
# and raises it, capture takes the other side and the compiled program checks the truth after the
# graph ran (`semantics.require_true`), raising that exception, with eager's type and message, when
# the values would have raised in eager. `assert cond, "message"` on a tensor is such a branch too
# (torch.compile checks it in the graph, `torch._assert_async`).
_RAISE_PREAMBLE = {"NOP", "PUSH_NULL", "PRECALL", "KW_NAMES", "CACHE", "RESUME"}


def _raised_at(tx, i: int) -> BaseException | None:
    """The exception the instructions from index `i` build from constants and raise at once, if so."""
    import builtins
    cls, args = None, []
    for inst in tx.insts[i:i + 12]:
        if inst.opname in _RAISE_PREAMBLE:
            continue
        if inst.opname == "LOAD_ASSERTION_ERROR" and cls is None:   # `assert cond, "message"`
            cls = AssertionError
        elif inst.opname == "LOAD_GLOBAL" and cls is None and not args:
            name = inst.argval
            cls = tx.f_globals.get(name, getattr(builtins, name, None))
            if not (isinstance(cls, type) and issubclass(cls, Exception) and getattr(builtins, cls.__name__, None) is cls):
                return None
        elif inst.opname == "LOAD_CONST" and cls is not None and isinstance(inst.argval, (str, int, float)):
            args.append(inst.argval)
        elif inst.opname == "CALL" and cls is not None and inst.arg == len(args) - (cls is AssertionError):
            continue   # (an assert's message is the call's second slot: CALL 0)
        elif inst.opname == "RAISE_VARARGS" and inst.arg == 1 and cls is not None:
            return cls(*args)
        else:
            return None
    return None


def _check_that_raises(tx, inst, value: V.TensorVar, jump_on: bool) -> bool | None:
    """[Note: a raise on tensor values]: whether to jump, when one side of the jump raises at once
    (that side's truth is then checked after the graph); None when neither side does."""
    import torch

    from kiln.capture.semantics import check_after_graph
    from kiln.capture.torch_calls import call_torch
    for truth in (True, False):
        raising_index = tx.index[inst.argval] if truth == jump_on else tx.ip
        error = _raised_at(tx, raising_index)
        if error is None:
            continue
        holds = call_torch(tx, "call_function", torch.logical_not if truth else torch.ne,
                           [value] if truth else [value, V.Constant(0)], {})
        check_after_graph(tx, holds, error)
        return (not truth) == jump_on
    return None


_is_true = lambda tx, v: S.truth(tx, v)
_is_false = lambda tx, v: not S.truth(tx, v)
_is_none = lambda tx, v: S.is_none(tx, v)
_not_none = lambda tx, v: not S.is_none(tx, v)
for _prefix in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_", "POP_JUMP_BACKWARD_IF_"):
    HANDLERS[_prefix + "TRUE"] = _pop_jump(_is_true, jump_on=True)
    HANDLERS[_prefix + "FALSE"] = _pop_jump(_is_false, jump_on=False)
    HANDLERS[_prefix + "NONE"] = _pop_jump(_is_none)
    HANDLERS[_prefix + "NOT_NONE"] = _pop_jump(_not_none)


@handler("JUMP_IF_TRUE_OR_POP")  # 3.11
def jump_if_true_or_pop(tx, inst):
    if S.truth(tx, tx.stack[-1]):
        tx.jump(inst.argval)
    else:
        tx.pop()


@handler("JUMP_IF_FALSE_OR_POP")  # 3.11
def jump_if_false_or_pop(tx, inst):
    if not S.truth(tx, tx.stack[-1]):
        tx.jump(inst.argval)
    else:
        tx.pop()


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def jump(tx, inst):
    tx.jump(inst.argval)


@handler("GET_ITER", "GET_YIELD_FROM_ITER")
def get_iter(tx, inst):
    tx.push(S.get_iter(tx, tx.pop()))


@handler("FOR_ITER")
def for_iter(tx, inst):
    it = tx.stack[-1]
    if not isinstance(it, V.ITERATORS) and not is_user_iterator(it):
        raise tx.unsupported(f"iterating over {it.python_type().__name__} is not supported")
    item = advance(tx, it)
    if item is not None:
        tx.push(item)
        return
    tx.jump(inst.argval)
    if PY313:  # the iterator stays; END_FOR pops a value and POP_TOP the iterator
        tx.push(V.Constant(None))
        return
    tx.pop()
    # 3.12: the exhausted loop continues after END_FOR (which the target names)
    if PY312 and tx.insts[tx.ip].opname == "END_FOR":
        tx.ip += 1


# -- calls and functions ---------------------------------------------------------------------------
@handler("KW_NAMES")  # 3.11 and 3.12: names of the keyword arguments of the next CALL
def kw_names(tx, inst):
    tx.kw_names = inst.argval if isinstance(inst.argval, tuple) else tx.code.co_consts[inst.arg]


@handler("CALL")
def call(tx, inst):
    callable_, args = _pop_callable(tx, tx.popn(inst.arg))
    names = tx.kw_names
    tx.kw_names = ()
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[len(args) - len(names):]))
        args = args[:len(args) - len(names)]
    tx.push(tx.call(callable_, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(tx, inst):
    kwargs = S.dict_items(tx, tx.pop()) if inst.arg & 1 else []
    fn, args = _pop_callable(tx, S.iterate(tx, tx.pop()))
    tx.push(tx.call(fn, args, dict(kwargs)))


@handler("MAKE_FUNCTION")
def make_function(tx, inst):
    code = tx.pop().value
    flags = inst.arg or 0  # 3.13 sets the parts with SET_FUNCTION_ATTRIBUTE instead
    closure = tuple(tx.pop().items) if flags & 0x08 else ()
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = dict(S.dict_items(tx, tx.pop())) if flags & 0x02 else {}
    defaults = tuple(tx.pop().items) if flags & 0x01 else ()
    tx.push(V.FunctionVar(code, tx.f_globals, code.co_name, defaults, kwdefaults, closure))


@handler("RETURN_GENERATOR")
def return_generator(tx, inst):
    tx.push(V.Constant(None))  # popped by the POP_TOP that follows


@handler("YIELD_VALUE")
def yield_value(tx, inst):
    """Pause the generator's frame here ([Note: lazy generators]); `generators.step` resumes it
    with the value sent in pushed."""
    if not tx.code.co_flags & CO_GENERATOR or tx.parent is None:
        raise tx.unsupported("yield outside a generator kiln inlines")
    tx.yielding = tx.pop()
    raise FrameYield()


@handler("SEND")
def send(tx, inst):
    """`yield from it`: step `it` with the value sent in; its next value is yielded in turn (the
    YIELD_VALUE that follows), its end jumps past the loop with its return value."""
    sent, receiver = tx.pop(), tx.stack[-1]
    if isinstance(receiver, V.GeneratorVar):
        value = step(tx, receiver, sent)
        result = receiver.result
    elif isinstance(receiver, (V.IteratorVar, V.LazyIteratorVar)):
        value, result = advance(tx, receiver), V.Constant(None)
    elif is_user_iterator(receiver):   # `__next__` for None sent in, else its `send`
        none = isinstance(sent, V.Constant) and sent.value is None
        value, result = user_next(tx, receiver, "__next__" if none else "send", [] if none else [sent])
    else:
        raise tx.unsupported("`yield from` / `await` on something other than an iterable")
    if value is not None:
        tx.push(value)
        return
    if not PY312:
        tx.pop()  # 3.11 pops the iterator too; 3.12 leaves it for END_SEND
    tx.push(result if result is not None else V.Constant(None))
    tx.jump(inst.argval)


@handler("END_SEND")  # 3.12
def end_send(tx, inst):
    value = tx.pop()
    tx.pop()
    tx.push(value)


@handler("CLEANUP_THROW")  # 3.12
def cleanup_throw(tx, inst):
    """An exception thrown in at a `yield from`'s paused YIELD_VALUE lands here, below it the
    receiver and the value sent in (None: `generators._raise_at_yield`). The
    StopIteration of a delegate that finished on a `throw` ends the `yield from` with its value
    (the jump that follows goes to END_SEND); any other exception goes on to the frame's handlers."""
    exc, _sent, _receiver = tx.pop(), tx.pop(), tx.pop()
    if not issubclass(exc.cls, StopIteration):
        raise _reraised(exc)
    tx.push(V.Constant(None))
    tx.push(exc.args[0] if exc.args else V.Constant(None))


# -- exceptions and with-blocks --------------------------------------------------------------------
@handler("RAISE_VARARGS")
def raise_varargs(tx, inst):
    if inst.arg == 0:
        from kiln.capture.distributed import handled_exception
        handled = handled_exception(tx)   # the nearest frame's, callers included
        if handled is None:
            tx.raise_(RuntimeError, "No active exception to reraise")
        raise _reraised(handled)
    cause = tx.pop() if inst.arg == 2 else None
    exc = as_exception(tx, tx.pop())
    if cause is not None:   # `raise exc from cause`: a class is called, None clears the cause
        if not S.is_none(tx, cause):
            cause = as_exception(tx, cause)
        setattr_var(tx, exc, "__cause__", cause)
    raise ObservedException(exc)


@handler("LOAD_ASSERTION_ERROR")
def load_assertion_error(tx, inst):
    tx.push(V.ObjectVar(AssertionError))


@handler("PUSH_EXC_INFO")
def push_exc_info(tx, inst):
    exc = tx.pop()
    tx.push(tx.exc_info[-1] if tx.exc_info else V.Constant(None))
    tx.exc_info.append(exc)
    tx.push(exc)


@handler("POP_EXCEPT")
def pop_except(tx, inst):
    tx.pop()
    if tx.exc_info:
        tx.exc_info.pop()


@handler("CHECK_EXC_MATCH")
def check_exc_match(tx, inst):
    cls = S.python_value(tx.pop())
    exc = tx.stack[-1]
    tx.push(V.Constant(issubclass(exc.cls, cls)))


@handler("RERAISE")
def reraise(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # lasti
    raise _reraised(exc)


def _reraised(exc: V.ExceptionVar) -> ObservedException:
    e = ObservedException(exc)
    e.reraise = True
    return e


@handler("BEFORE_WITH")
def before_with(tx, inst):
    ctx = tx.pop()
    exit_fn, entered = enter_context(tx, ctx)
    tx.push(exit_fn)
    tx.push(entered)


@handler("WITH_EXCEPT_START")
def with_except_start(tx, inst):
    """An exception left the `with` body: `__exit__(type, exc, traceback)`, whose truth says whether
    it is swallowed. A context manager kiln models itself (grad mode, autocast) never swallows one."""
    exit_fn, exc = tx.stack[-4], tx.stack[-1]
    if isinstance(exit_fn, V.ContextVar):
        tx.call(exit_fn, [V.Constant(None)] * 3)
        tx.push(V.Constant(False))
        return
    swallowed = tx.call(exit_fn, [V.ObjectVar(exc.cls), exc, V.Constant(None)])
    tx.push(V.Constant(S.truth(tx, swallowed)))


# -- 3.13 ----------------------------------------------------------------------------------------------
def _names(inst):
    return inst.argval if isinstance(inst.argval, tuple) else (inst.argval,)


@handler("LOAD_FAST_LOAD_FAST")
def load_fast_load_fast(tx, inst):
    for name in _names(inst):
        load_fast(tx, type(inst)(**{**inst._asdict(), "argval": name}))


@handler("STORE_FAST_STORE_FAST")
def store_fast_store_fast(tx, inst):
    for name in _names(inst):
        store_fast(tx, type(inst)(**{**inst._asdict(), "argval": name}))


@handler("STORE_FAST_LOAD_FAST")
def store_fast_load_fast(tx, inst):
    store_name, load_name = _names(inst)
    store_fast(tx, type(inst)(**{**inst._asdict(), "argval": store_name}))
    load_fast(tx, type(inst)(**{**inst._asdict(), "argval": load_name}))


@handler("TO_BOOL")
def to_bool(tx, inst):
    value = tx.pop()
    # a tensor's truth needs its data: leave it for the jump that follows, which breaks the
    # graph there as 3.11 and 3.12 do
    tx.push(value if isinstance(value, V.TensorVar) else V.Constant(S.truth(tx, value)))


@handler("CALL_KW")
def call_kw(tx, inst):
    tx.kw_names = S.python_value(tx.pop())
    call(tx, inst)


@handler("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(tx, inst):
    fn, value = tx.pop(), tx.pop()
    field = {0x01: "defaults", 0x02: "kwdefaults", 0x08: "closure"}.get(inst.arg)
    if field == "defaults":
        fn.defaults = tuple(value.items)
    elif field == "kwdefaults":
        fn.kwdefaults = dict(S.dict_items(tx, value))
    elif field == "closure":
        fn.closure = tuple(value.items)
    tx.push(fn)


@handler("FORMAT_SIMPLE")
def format_simple(tx, inst):
    tx.push(V.Constant(S.format_value(tx, tx.pop(), None, "")))


@handler("FORMAT_WITH_SPEC")
def format_with_spec(tx, inst):
    spec = S.python_value(tx.pop())
    tx.push(V.Constant(S.format_value(tx, tx.pop(), None, spec)))


@handler("CONVERT_VALUE")
def convert_value(tx, inst):
    conv = {1: str, 2: repr, 3: ascii}[inst.arg]
    tx.push(V.Constant(S.format_value(tx, tx.pop(), conv, "")))


@handler("LOAD_BUILD_CLASS")
def load_build_class(tx, inst):
    """A `class` statement: its call of `builtins.__build_class__` (body function, name, bases)
    is C code kiln does not model, so the graph breaks there and the class is built natively, the
    code before and after it captured, as torch.compile splits it (rather than the whole function
    running eagerly)."""
    tx.push(V.ObjectVar(builtins.__build_class__))


@handler("SETUP_ANNOTATIONS", "LOAD_NAME", "STORE_NAME",
         "DELETE_GLOBAL", "DELETE_DEREF", "GET_AWAITABLE", "BEFORE_ASYNC_WITH", "GET_AITER", "GET_ANEXT")
def refuse(tx, inst):
    raise tx.unsupported(f"the bytecode instruction {inst.opname} is not supported by kiln")


__all__ = ["HANDLERS", "GraphBreak", "Tracer", "GlobalSource"]
