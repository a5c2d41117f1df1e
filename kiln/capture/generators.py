"""Generators made inside captured code: suspended frames that run only when their consumer asks.

[Note: lazy generators] Calling a generator function in traced code makes a `GeneratorVar` around
the generator's own `Tracer` (its frame: instructions, stack, locals), which has not run yet. Each
step (`next`, a `for` loop's FOR_ITER, `send`, `yield from`'s SEND) runs that frame until its next
YIELD_VALUE, which stops the frame's loop with the value yielded (`interpreter.FrameYield`) and
leaves its instruction pointer, stack and locals as they were; the next step pushes the value sent
in and runs on from there. So the generator's effects (a list it appends to, grad mode a
`@contextmanager` switches, a tensor it mutates) interleave with its consumer's in eager order: a
`@contextmanager`'s code after `yield` runs when the `with` block exits, not when the manager is
made. `throw` raises an exception at the paused `yield` and routes it through the frame's
exception table (contextlib's `__exit__` throws the `with` body's exception in, so the manager's
`except`/`finally` runs); `close` throws GeneratorExit.

A generator still paused where the graph breaks cannot be carried into generated code (its frame
exists only in kiln), so rebuilding it refuses (`rebuild.py`) and the function runs eagerly, as a
paused generator does under torch.compile. One that has finished rebuilds as an empty iterator.
A generator left paused inside a `try`/`with` block (a loop over it that `break`s) runs that
block's cleanup when Python collects it, at a moment kiln does not model; torch.compile drops the
cleanup, kiln runs the function eagerly instead (`left_paused_in_cleanup`, checked at the end of
each trace). One that a local of the root frame holds when the frame returns is collected then, a
moment kiln does follow: it is closed at the end of the trace ([Note: generators collected at
return], `close_collected_at_return`).

Iterators that kiln builds over a generator (`zip`, `map`, `enumerate`, `filter`, itertools) are
lazy too (`LazyIteratorVar`, `iterators.py`), so `for a, b in zip(g1, g2)` steps each generator
only when the loop asks for the next pair.

Hands on: `advance` (the one way to step any iterator, `variables.ITERATORS`), `step` (the one way
to run a generator frame), `left_paused_in_cleanup`, and the
generator methods registered in `callables.CALLABLES` (`send`, `throw`, `close`, `__next__`,
`__iter__`).
"""
from __future__ import annotations

import dataclasses
import types

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.interpreter import FRAME_RETURN_HOOKS, MAX_INLINE_DEPTH, PY312, GraphBreak, ObservedException
from kiln.capture.views import advance as advance_list_iterator


def advance(tx, it: V.IteratorVar | V.GeneratorVar | V.LazyIteratorVar | V.NewObjectVar) -> V.Variable | None:
    """The iterator's next item, or None when it is exhausted."""
    if isinstance(it, V.GeneratorVar):
        return step(tx, it)
    if isinstance(it, V.LazyIteratorVar):
        return next(it.items, None)
    if isinstance(it, V.NewObjectVar):
        return user_next(tx, it, "__next__", [])[0]
    return advance_list_iterator(tx, it)


def is_user_iterator(v: V.Variable) -> bool:
    """An instance of a user's class with a `__next__`, made in traced code: stepped by calling it."""
    return isinstance(v, V.NewObjectVar) and hasattr(v.cls, "__next__")


def user_next(tx, it: V.NewObjectVar, method: str, args: list) -> tuple[V.Variable | None, V.Variable | None]:
    """(the value `it.method(*args)` returns, None) or, where it raises StopIteration, (None, the
    StopIteration's value)."""
    from kiln.capture.attributes import getattr_var
    try:
        return tx.call(getattr_var(tx, it, method), args), None
    except ObservedException as e:
        if not issubclass(e.exc.cls, StopIteration):
            raise
        return None, e.exc.args[0] if e.exc.args else V.Constant(None)


def _exception_of(tx, typ: V.Variable, value: V.Variable | None) -> V.ExceptionVar:
    """What `gen.throw(typ[, value])` raises: an exception instance, or a class called with no arguments."""
    if isinstance(value, V.ExceptionVar):
        return value
    if isinstance(typ, V.ExceptionVar):
        return typ
    if isinstance(typ, V.ObjectVar) and isinstance(typ.value, type) and issubclass(typ.value, BaseException):
        args = [] if value is None or isinstance(value, V.Constant) and value.value is None else [value]
        return V.ExceptionVar(typ.value, args)
    tx.raise_(TypeError, "exceptions must be classes or instances deriving from BaseException")


def _finish(gen: V.GeneratorVar):
    gen.state = "done"
    gen.frame = None


def step(tx, gen: V.GeneratorVar, sent: V.Variable | None = None,
         thrown: V.ExceptionVar | None = None) -> V.Variable | None:
    """Run the generator's frame to its next `yield` and return the value yielded, or None once the
    frame returned (its return value is then `gen.result`). `sent` is the value `yield` evaluates
    to (None for `next`); `thrown` is raised at the paused `yield` instead. An exception the
    frame does not handle finishes the generator and propagates to the consumer."""
    if gen.state == "running":
        tx.raise_(ValueError, "generator already executing")
    if gen.state == "broken":
        raise tx.unsupported("a generator whose frame broke the graph is stepped again")
    if gen.state == "done":
        if thrown is not None:
            raise ObservedException(thrown)
        return None
    frame, first = gen.frame, gen.state == "created"
    if first:
        if thrown is not None:        # the frame never runs: the exception comes straight back
            _finish(gen)
            raise ObservedException(thrown)
        if sent is not None and not (isinstance(sent, V.Constant) and sent.value is None):
            tx.raise_(TypeError, "can't send non-None value to a just-started generator")
    frame.parent, frame.depth = tx, tx.depth + 1   # the consumer is the frame's caller now, as in CPython
    if first:
        root = tx
        while root.parent is not None:
            root = root.parent
        if root.inst is not None:
            gen.first_step = (root.inst.offset, root.where())
    if frame.depth > MAX_INLINE_DEPTH:
        raise GraphBreak("inlining went deeper than 64 calls (recursion?)")
    gen.state = "running"
    frame.yielding = None
    try:
        if thrown is not None:   # the delegate of a `yield from` may yield again instead
            frame.yielding = _throw_at_yield(frame, thrown)
        elif not first:
            frame.push(sent if sent is not None else V.Constant(None))
        result = frame.run() if frame.yielding is None else None
    except ObservedException as e:
        _finish(gen)
        if issubclass(e.exc.cls, StopIteration):   # PEP 479 (3.12 does this in the frame's bytecode)
            raise ObservedException(V.ExceptionVar(RuntimeError, [V.Constant("generator raised StopIteration")]))
        raise
    except BaseException:
        gen.state = "broken"        # a graph break inside: capture of this function stops here
        raise
    finally:
        tx.out.current = tx
    if frame.yielding is not None:
        gen.state = "suspended"
        return frame.yielding
    gen.result = result
    _finish(gen)
    return None


def _throw_at_yield(frame, exc: V.ExceptionVar) -> V.Variable | None:
    """Raise `exc` where the frame is paused: its exception table decides where it lands. A frame
    paused in `yield from` hands the exception to the iterator it delegates to first, as CPython's
    `gen.throw` does; if that one yields again, so does this frame (the value is returned); if it
    finishes instead, its return value is the value of the `yield from` (`_yield_from_returned`)."""
    receiver = _delegate(frame)
    if is_user_iterator(receiver):
        thrown = _throw_into_user_iterator(frame, receiver, exc)
        if isinstance(thrown, V.ExceptionVar):
            exc = thrown
        elif isinstance(thrown, _Returned):
            return _yield_from_returned(frame, thrown.value)
        else:
            return thrown        # it yielded a value instead: so does this frame
    elif isinstance(receiver, V.GeneratorVar):
        if issubclass(exc.cls, GeneratorExit):
            close(frame, receiver)
        else:
            try:
                value = step(frame, receiver, thrown=exc)
            except ObservedException as e:   # not handled inside: it surfaces at the outer `yield from`
                exc = e.exc
            else:
                if value is not None:
                    return value
                return _yield_from_returned(frame, receiver.result)
    _raise_at_yield(frame, exc)
    return None


def _raise_at_yield(frame, exc: V.ExceptionVar) -> None:
    """Route `exc` to the handler of the frame's paused `yield`, above the value sent in (None), as
    CPython's `gen.throw` pushes it: 3.12's CLEANUP_THROW reads the stack so."""
    frame.push(V.Constant(None))
    frame.handle_exception(ObservedException(exc))


@dataclasses.dataclass
class _Returned:
    """What a delegate's `throw` did when it finished (raised StopIteration) instead of yielding."""
    value: V.Variable


def _yield_from_returned(frame, value: V.Variable | None) -> None:
    """The delegate of the frame's paused `yield from` finished on a thrown exception, returning
    `value`: the frame goes on after the `yield from` with it. 3.12 raises the delegate's
    StopIteration at the `yield`, where CLEANUP_THROW turns it into the value; 3.11 does it in C:
    pops the delegate and resumes at the SEND's target with the value pushed."""
    value = value if value is not None else V.Constant(None)
    if PY312:
        _raise_at_yield(frame, V.ExceptionVar(StopIteration, [value]))
        return None
    send = frame.insts[frame.ip - 2]   # SEND, YIELD_VALUE, RESUME 2 <- ip
    frame.pop()
    frame.jump(send.argval)
    frame.push(value)
    return None


def _throw_into_user_iterator(frame, receiver: V.NewObjectVar, exc: V.ExceptionVar):
    """CPython's `yield from` handing an exception to an iterator that is not a generator: its
    `close()` for GeneratorExit (then GeneratorExit goes on), its `throw(type, value, None)` for
    others (a value it returns is yielded, a StopIteration it raises finishes the `yield from`);
    without the method the exception is raised at the `yield from`. Returns the value to yield,
    `_Returned`, or the exception to raise there."""
    from kiln.capture.attributes import class_lookup
    has = lambda name: class_lookup(receiver.cls, name) is not None and hasattr(receiver.cls, name)
    if issubclass(exc.cls, GeneratorExit):
        if has("close"):
            user_next(frame, receiver, "close", [])
        return exc
    if not has("throw"):
        return exc
    try:
        value, result = user_next(frame, receiver, "throw", [V.ObjectVar(exc.cls), exc, V.Constant(None)])
    except ObservedException as e:
        return e.exc
    return _Returned(result) if value is None else value


def _delegate(frame):
    """The iterator a frame paused in `yield from` delegates to, or None: after YIELD_VALUE such a
    frame resumes with `RESUME 2`, the receiver below the value sent in."""
    nxt = frame.insts[frame.ip] if frame.ip < len(frame.insts) else None
    if nxt is not None and nxt.opname == "RESUME" and (nxt.arg or 0) & 3 == 2 and frame.stack:
        return frame.stack[-1]
    return None


def stop_iteration(gen: V.GeneratorVar) -> ObservedException:
    """The StopIteration a finished generator raises, carrying its return value."""
    result = gen.result
    none = result is None or isinstance(result, V.Constant) and result.value is None
    return ObservedException(V.ExceptionVar(StopIteration, [] if none else [result]))


def throw(tx, gen: V.GeneratorVar, exc: V.ExceptionVar) -> V.Variable:
    """`gen.throw(exc)`: the next value the generator yields after handling `exc`."""
    value = step(tx, gen, thrown=exc)
    if value is None:
        raise stop_iteration(gen)
    return value


def close(tx, gen: V.GeneratorVar):
    """`gen.close()`: GeneratorExit raised at the paused `yield`; its `finally` blocks run."""
    if gen.state != "suspended":
        _finish(gen)
        return
    try:
        value = throw(tx, gen, V.ExceptionVar(GeneratorExit, []))
    except ObservedException as e:
        if issubclass(e.exc.cls, (GeneratorExit, StopIteration)):
            return
        raise
    if value is not None:
        tx.raise_(RuntimeError, "generator ignored GeneratorExit")


def left_paused_in_cleanup(out) -> V.GeneratorVar | None:
    """A generator of this trace paused where closing it would run code of its own (a `finally`,
    an `except`, a `with` block's exit), or None."""
    for gen in out.generators:
        if gen.state == "suspended" and (_cleanup_at(gen.frame) is not None or _closes_delegate(gen.frame)):
            return gen
    return None


def close_collected_at_return(frame, result: V.Variable) -> None:
    """[Note: generators collected at return] A paused generator that a local variable of a frame
    (the root, or one kiln inlined) holds at its return, and that nothing outlives the frame with
    (not the value returned, not written anywhere by a side effect, not held by another generator
    still paused nor by a calling frame), dies with the frame's locals: CPython closes it then, so
    its `finally`/`with` cleanup runs after the return value is made and before the caller goes
    on. Kiln closes such a generator at the same point of the trace, so the cleanup's effects are
    traced in their eager order. One no local holds was dropped earlier (a `for` loop's that
    `break`s: closed right after the loop), at a moment kiln does not follow, and one that may
    outlive the frame stays paused: both, paused in cleanup, still make the function run eagerly."""
    out = frame.out
    held = {id(v) for v in frame.locals.values()}
    paused = [g for g in out.generators if g.state == "suspended" and id(g) in held and g.frame is not frame]
    if not paused:
        return
    others = [g.frame for g in out.generators if g.state == "suspended" and g not in paused]
    callers, caller = [], frame.parent
    while caller is not None:
        callers.append(caller)
        caller = caller.parent
    reached = _reached([result, out.side_effects, others, callers])
    if reached is None:
        return
    for gen in paused:
        if id(gen) not in reached:
            close(frame, gen)


FRAME_RETURN_HOOKS.append(close_collected_at_return)


DRAIN_LIMIT = 1000


def drain_escaping(root, result: V.Variable) -> None:
    """[Note: drained generators] A generator paused mid-way (or a zip/map over one) that leaves the
    frame, returned or stored where the caller sees it, cannot be carried out of kiln: its frame
    exists only here. Dynamo runs such a generator to its end while tracing and hands the caller an
    iterator over the items it had left; so does kiln, when that is safe: at most DRAIN_LIMIT items,
    and no effect of its own (a write to an outside object, an in-place op in the graph), since
    those would happen now, not when the caller asks for the items. The items are then computed by
    the graph, from the values they had at the frame's return, and the caller gets a generator that
    yields them and returns what the frame returned. Otherwise the function runs eagerly, as
    before (rebuilding the paused generator refuses)."""
    out = root.out
    for it in _escaping_iterators([result, out.side_effects]):
        effects, nodes = len(out.side_effects), set(out.graph.nodes)
        items = []
        while len(items) <= DRAIN_LIMIT and (item := advance(root, it)) is not None:
            items.append(item)
        if len(items) > DRAIN_LIMIT:
            return
        if len(out.side_effects) != effects or any(_mutates(n) for n in out.graph.nodes if n not in nodes):
            raise GraphBreak("a generator made in captured code leaves the frame paused, and what it has left to "
                             "yield has effects of its own, which kiln would run before the caller asks for them")
        it.drained = items


def _mutates(node) -> bool:
    """A graph node that writes a tensor in place (`x.add_(1)`, `x[i] = v`, an `out=` argument)."""
    import operator
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or node.target is operator.setitem or "out" in node.kwargs


def _held(v) -> list:
    """What a plain container (list, tuple, set, dict, dataclass instance) holds; [] for anything else."""
    if isinstance(v, (list, tuple, set, frozenset)):
        return list(v)
    if isinstance(v, dict):
        return [*v.keys(), *v.values()]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [getattr(v, f.name) for f in dataclasses.fields(v)]
    return []


def _escaping_iterators(roots) -> list:
    """Paused generators and iterators over generators reachable from `roots`, outermost first
    (a generator's own frame and a lazy iterator's insides are not entered: draining the outer one
    steps what it delegates to)."""
    found, seen, todo = [], set(), list(roots)
    while todo:
        v = todo.pop(0)
        if id(v) in seen or v is None or isinstance(v, (str, int, float, bool, bytes)):
            continue
        seen.add(id(v))
        if isinstance(v, V.GeneratorVar):
            if v.state == "suspended":
                found.append(v)
        elif isinstance(v, V.LazyIteratorVar):
            if v.drained is None:
                found.append(v)
        else:
            todo += _held(v)
    return found


def _reached(roots) -> set | None:
    """The ids of the trackers reachable from `roots`, or None where one hides what it holds."""
    from kiln.capture.interpreter import Tracer
    seen: set = set()
    todo = list(roots)
    while todo:
        v = todo.pop()
        if id(v) in seen or v is None or isinstance(v, (str, int, float, bool, bytes)):
            continue
        seen.add(id(v))
        if isinstance(v, V.LazyIteratorVar):
            return None   # a real iterator over trackers: what it holds cannot be listed
        if isinstance(v, Tracer):
            todo += [*v.locals.values(), *v.stack, *v.cells.values()]
        elif isinstance(v, V.GeneratorVar):
            todo.append(v.frame)
        else:
            todo += _held(v)
    return seen


def left_paused_reason(gen: V.GeneratorVar) -> str:
    if _closes_delegate(gen.frame):
        return ("a generator left paused in `yield from` an iterator with a close(), which Python calls when it "
                "collects the generator")
    return "a generator left paused inside a try/with block, whose cleanup Python runs when it collects the generator"


def _closes_delegate(frame) -> bool:
    """Whether closing the frame would call a `close()` of a user's iterator it delegates to."""
    receiver = _delegate(frame)
    return is_user_iterator(receiver) and hasattr(receiver.cls, "close")


def _cleanup_at(frame):
    """The handler an exception raised at the frame's paused `yield` lands on, unless it is 3.12's
    own StopIteration-to-RuntimeError handler around every generator body (PEP 479). 3.12's
    CLEANUP_THROW, where one raised at a `yield from` lands first, only passes it on (GeneratorExit
    is no StopIteration): the handler is the one around the CLEANUP_THROW."""
    offset = frame.inst.offset
    while (target := _handler_at(frame, offset)) is not None and (target.opname == "CLEANUP_THROW"
                                                                   or _only_reraises(frame, target)):
        offset = target.offset
    pep479 = target is not None and target.opname == "CALL_INTRINSIC_1" and target.arg == 3
    return None if pep479 else target


def _only_reraises(frame, target) -> bool:
    """Whether the handler at `target` is an `except` block's own exit on an exception (`COPY 3,
    POP_EXCEPT, RERAISE 1`): it restores the exception being handled and passes the new one on,
    running no code of the program's (a generator paused inside `except ...:` with no `finally`)."""
    i = frame.index[target.offset]
    ops = [(inst.opname, inst.arg) for inst in frame.insts[i:i + 3]]
    return ops == [("COPY", 3), ("POP_EXCEPT", None), ("RERAISE", 1)]


def _handler_at(frame, offset: int):
    """The first instruction of the handler that covers `offset` in the frame's exception table."""
    for entry in frame.exc_table:   # flat: the first entry that covers an offset is its innermost
        if entry.start <= offset < entry.end:
            return frame.insts[frame.index[entry.target]]
    return None


# -- the generator's methods, as traced code calls them ---------------------------------------------
def _next_or_stop(tx, gen: V.GeneratorVar, sent: V.Variable | None) -> V.Variable:
    value = step(tx, gen, sent)
    if value is None:
        raise stop_iteration(gen)
    return value


@handles(types.GeneratorType.__next__)
def _generator_next(tx, args, kwargs):
    return _next_or_stop(tx, args[0], None)


@handles(types.GeneratorType.send)
def _generator_send(tx, args, kwargs):
    return _next_or_stop(tx, args[0], args[1])


@handles(types.GeneratorType.throw)
def _generator_throw(tx, args, kwargs):
    gen, typ, value = args[0], args[1], args[2] if len(args) > 2 else None
    return throw(tx, gen, _exception_of(tx, typ, value))


@handles(types.GeneratorType.close)
def _generator_close(tx, args, kwargs):
    close(tx, args[0])
    return V.Constant(None)


@handles(types.GeneratorType.__iter__)
def _generator_iter(tx, args, kwargs):
    return args[0]
