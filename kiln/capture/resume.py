"""Resume functions: the rest of a function after a graph break, as a new code object.

`resume_code(code, offset, stack_nulls, local_names)` copies `code` and adds a prologue after its
RESUME: the values the interrupted frame had on its stack are passed as arguments `__kiln_s<i>` and
pushed back (NULLs, which Python cannot pass, are re-created with PUSH_NULL), the live locals are
passed under their own names, and a jump continues at `offset`. The `bytecode` package assembles
the code object (it recomputes the stack depth, the exception table and line numbers). Because the
exception table is keyed by position, a resume target inside a `try` block keeps its handler.
"""
from __future__ import annotations

import dis
import re
import types

from bytecode import Bytecode, Instr, Label

_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
_CACHE: dict[tuple, types.CodeType] = {}



def user_function_name(code_name: str) -> str:
    """The user's function a resume function continues (`__kiln_resume_f_at_40` is `f`)."""
    return re.sub(r"^__kiln_resume_(.*)_at_\d+$", r"\1", code_name)

def _instruction_positions(bc: Bytecode) -> list[int]:
    """Indices in `bc` of its real instructions, in the order `dis.get_instructions` lists them."""
    return [i for i, ins in enumerate(bc) if isinstance(ins, Instr)]


def resume_parameters(code: types.CodeType, stack_nulls: tuple[bool, ...], local_names: tuple[str, ...]) -> list[str]:
    """The resume function's parameters, in order: the stack values (`__kiln_s<i>`, NULLs left out),
    then the live locals. A method's first parameter (`self`) stays first, where zero-argument
    `super()` reads it (the first local slot), when the function uses `super`'s `__class__` cell."""
    stack_args = [f"__kiln_s{i}" for i, null in enumerate(stack_nulls) if not null]
    names = [*stack_args, *local_names]
    first = code.co_varnames[0] if code.co_argcount else None
    if first is not None and "__class__" in code.co_freevars and first in local_names:
        names.remove(first)
        names.insert(0, first)
    return names


def resume_code(code: types.CodeType, offset: int, stack_nulls: tuple[bool, ...],
                local_names: tuple[str, ...]) -> types.CodeType:
    key = (code, offset, stack_nulls, local_names)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    dis_insts = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG", "CACHE")]
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)   # the handlers' own depths
    positions = _instruction_positions(bc)
    if len(positions) != len(dis_insts):
        raise RuntimeError(f"kiln could not map the bytecode of {code.co_name} ({len(positions)} vs {len(dis_insts)})")
    k = next(i for i, ins in enumerate(dis_insts) if ins.offset == offset)
    if bc[positions[k]].name != dis_insts[k].opname:
        raise RuntimeError(f"kiln mapped {code.co_name}'s instruction {dis_insts[k].opname} to {bc[positions[k]].name}")
    target = Label()
    resume_at = next(i for i, ins in enumerate(bc) if isinstance(ins, Instr) and ins.name == "RESUME")
    stack_args = [f"__kiln_s{i}" for i, null in enumerate(stack_nulls) if not null]
    lineno = dis_insts[k].positions.lineno if dis_insts[k].positions and dis_insts[k].positions.lineno \
        else code.co_firstlineno
    prologue = []
    for i, null in enumerate(stack_nulls):
        prologue.append(Instr("PUSH_NULL", lineno=lineno) if null else Instr("LOAD_FAST", f"__kiln_s{i}", lineno=lineno))
    prologue.append(Instr("JUMP_FORWARD", target, lineno=lineno))
    items = list(bc)
    items.insert(positions[k], target)
    items[resume_at + 1:resume_at + 1] = prologue
    new = Bytecode(items)
    for attr in ("name", "filename", "first_lineno", "cellvars", "freevars", "docstring"):
        if hasattr(bc, attr):
            setattr(new, attr, getattr(bc, attr))
    new.name = f"__kiln_resume_{user_function_name(code.co_name)}_at_{offset}"
    if hasattr(bc, "qualname"):
        new.qualname = new.name
    new.flags = bc.flags & ~(_CO_VARARGS | _CO_VARKEYWORDS)
    new.argnames = resume_parameters(code, stack_nulls, local_names)
    new.argcount = len(new.argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    # The prologue rebuilds the stack the frame had at `offset`, so every exception-table entry
    # keeps the depth CPython gave it in the original code, and the original stack size bounds
    # the new one. Recomputing them instead fails when the target lies inside nested `try`
    # regions (two `with` blocks): the `bytecode` package then sees the handlers entered from a
    # jump that skipped their setup and computes a negative depth.
    result = new.to_code(stacksize=max(code.co_stacksize, len(stack_nulls)) + 1,
                         compute_exception_stack_depths=False)
    _CACHE[key] = result
    return result


def resume_function(fn_globals: dict, code: types.CodeType, closure: tuple | None) -> types.FunctionType:
    return types.FunctionType(code, fn_globals, code.co_name, None, closure)

