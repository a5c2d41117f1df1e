"""Frames kiln runs as Python, with the functions they call still captured.

[Note: a graph break in a loop] A graph break inside a `for`/`while` loop would end a graph and
continue in a resume function at each iteration: the resume function's trace runs to the same break
in the next iteration and calls a resume function of its own, one deeper frame and one more compile
per iteration (RecursionError on a long loop). So, as torch.compile does ("skipping frame because
there is a graph break in a for/while loop"), such a frame runs as Python instead, and only the
functions it calls are compiled. `in_loop(code, offset)` is Dynamo's test: a jump back to before
the breaking instruction follows it, before any return.

Without a PEP 523 hook, a frame that runs as Python calls its callees as Python too. So the frame
runs a copy of its code in which every call goes through `wrap_callable` (frame.py decides what is
captured: user functions, modules' forwards, methods; torch's and builtins are called as they are):

    CALL n (KW_NAMES k)     ->  BUILD_TUPLE n; LOAD_CONST k; [rotate in `_call`]; CALL 3
    CALL_KW n  (3.13)       ->  BUILD_TUPLE n + 1; [rotate in `_call_packed`]; CALL 2
    CALL_FUNCTION_EX        ->  the callable wrapped where it lies, under its arguments
    GET_ITER; CALL 0        ->  a comprehension called on its iterator: `_call` in the method slots

A method call's load (LOAD_METHOD, LOAD_ATTR / LOAD_SUPER_ATTR in method form) leaves a method and
its `self` in the call's two callable slots; it is turned into an attribute load (a bound method)
and a NULL, so that those slots always hold a NULL and the callable (`[NULL, f]` before 3.13,
`[f, NULL]` from 3.13) and `_call` can take the callable as an ordinary value.
"""
from __future__ import annotations

import dis
import functools
import sys
import types
from typing import Callable

from bytecode import Bytecode, Instr

_PY311 = sys.version_info < (3, 12)
_PY313 = sys.version_info >= (3, 13)
_RETURNS = ("RETURN_VALUE", "RETURN_CONST")
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_CODE_CACHE: dict[tuple, types.CodeType] = {}


def in_loop(code: types.CodeType, offset: int) -> bool:
    """Whether a jump back to before the instruction at `offset` follows it, before any return."""
    after = False
    for inst in dis.get_instructions(code):
        if not after:
            after = inst.offset == offset
        elif inst.opname in _RETURNS:
            return False
        elif inst.opcode in _JUMPS and isinstance(inst.argval, int) and inst.argval < offset:
            return True
    return False


def run_capturing_calls(fn: types.FunctionType, args: tuple, kwargs: dict, wrap: Callable):
    """`fn(*args, **kwargs)` as Python, each function it calls first handed to `wrap`."""
    key = (fn.__code__, wrap)
    code = _CODE_CACHE.get(key)
    if code is None:
        code = _CODE_CACHE[key] = capturing_calls(fn.__code__, wrap)
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy(*args, **kwargs)


def capturing_calls(code: types.CodeType, wrap: Callable) -> types.CodeType:
    """`code` with its calls going through `wrap` ([Note: a graph break in a loop])."""
    call, call_packed = functools.partial(_call, wrap), functools.partial(_call_packed, wrap)
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    out, names, previous = [], (), None
    for ins in bc:
        if not isinstance(ins, Instr):
            out.append(ins)
            continue
        at = functools.partial(Instr, location=ins.location)
        if ins.name == "KW_NAMES":
            names = ins.arg
        elif ins.name == "PRECALL":
            pass
        elif ins.name == "CALL" and ins.arg == 0 and previous == "GET_ITER":
            # a comprehension's (a generator expression's) function called on its iterator: the two
            # callable slots hold [function, iterator], a call of the first on the second
            out += [at("BUILD_TUPLE", 1), at("LOAD_CONST", ()), at("LOAD_CONST", call),
                    at("SWAP", 4), at("SWAP", 3), at("SWAP", 2), *_call_op(at, 2)]
        elif ins.name == "CALL":
            out += [at("BUILD_TUPLE", ins.arg), at("LOAD_CONST", names), at("LOAD_CONST", call),
                    *_rotate_under_slots(at, 3), *_call_op(at, 3)]
            names = ()
        elif ins.name == "CALL_KW":
            out += [at("BUILD_TUPLE", ins.arg + 1), at("LOAD_CONST", call_packed), *_rotate_under_slots(at, 2),
                    *_call_op(at, 2)]
        elif ins.name == "CALL_FUNCTION_EX":
            depth = 2 + (ins.arg & 1) + _PY313     # the callable's depth under its arguments
            out += [at("SWAP", depth), *_wrapped_top(at, wrap), at("SWAP", depth), ins]
        elif ins.name in ("LOAD_METHOD", "LOAD_ATTR", "LOAD_SUPER_ATTR") and _method_form(ins):
            plain = ins.arg if ins.name == "LOAD_METHOD" else (False, *ins.arg[1:])
            out += [at("LOAD_ATTR" if ins.name == "LOAD_METHOD" else ins.name, plain), at("PUSH_NULL")]
            if not _PY313:       # the NULL goes under the bound method
                out.append(at("SWAP", 2))
        else:
            out.append(ins)
        if ins.name != "PRECALL":
            previous = ins.name
    bc.clear()
    bc.extend(out)
    return bc.to_code()


def _method_form(ins: Instr) -> bool:
    return ins.name == "LOAD_METHOD" or isinstance(ins.arg, tuple) and ins.arg[0] is True


def _rotate_under_slots(at, n: int) -> list[Instr]:
    """[slots, f, a1..a(n-1), helper] -> [helper in the callable slot, ..., f, a1..a(n-1)]: the
    helper takes the place the callable had, the callable becomes its first argument."""
    first = n + 1 + _PY313   # the callable's depth, counting the helper on top
    rotation = [at("SWAP", first)]
    rotation += [at("SWAP", d) for d in range(n, 1, -1)]
    return rotation


def _call_op(at, n: int) -> list[Instr]:
    return [at("PRECALL", n), at("CALL", n)] if _PY311 else [at("CALL", n)]


def _wrapped_top(at, wrap) -> list[Instr]:
    """[..., f] -> [..., wrap(f)]."""
    if _PY313:
        return [at("LOAD_CONST", wrap), at("SWAP", 2), at("PUSH_NULL"), at("SWAP", 2), at("CALL", 1)]
    return [at("PUSH_NULL"), at("SWAP", 2), at("LOAD_CONST", wrap), at("SWAP", 2), *_call_op(at, 1)]


def _call(wrap, fn, args: tuple, names: tuple):
    fn = wrap(fn)
    if not names:
        return fn(*args)
    split = len(args) - len(names)
    return fn(*args[:split], **dict(zip(names, args[split:])))


def _call_packed(wrap, fn, packed: tuple):
    return _call(wrap, fn, packed[:-1], packed[-1])
