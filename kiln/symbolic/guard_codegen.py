"""Print a ShapeEnv's guards as one Python function over the real inputs.

The function checks static metadata first (one tuple comparison per static size or stride
tuple), binds each symbol from the first input it was created for, then checks the sizes,
strides and offsets that are expressions of symbols, each symbol's known range (>= 2, plus bounds
from guards), and every recorded guard. It is plain
generated source (kept on the function as `.source`) so a reader can see exactly what is checked.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import sympy

from kiln.symbolic import sympy_ops as S
from kiln.symbolic.shape_env import GuardSourceError, ShapeEnv, TensorInput


def build_guard_function(env: ShapeEnv, names: Sequence[str]) -> Callable[..., bool]:
    params = [f"a{i}" for i in range(len(names))]
    lines: list[str] = []
    checks: list[tuple[str, str]] = []            # (condition, why)
    bound: dict[sympy.Symbol, str] = {}
    pending: list[tuple[str, sympy.Basic]] = []      # (python value, expression it must equal)

    for name, param in zip(names, params):
        record = env.inputs.get(name)
        if record is None:
            raise GuardSourceError(
                f"guard_function: no input named {name!r} was made by this ShapeEnv "
                f"(known: {sorted(env.inputs)}); pass the source given to from_real/create_symint")
        if isinstance(record, TensorInput):
            values = []
            for kind, exprs in (("size", record.sizes), ("stride", record.strides)):
                if all(e.is_Integer for e in exprs):
                    # A static tuple is one comparison (rank included): the cheap common case.
                    lines.append(f"    if {param}.{kind}() != {tuple(int(e) for e in exprs)}: "
                                 f"return False")
                    continue
                lines.append(f"    {param}_{kind} = {param}.{kind}()")
                lines.append(f"    if len({param}_{kind}) != {len(exprs)}: return False")
                values += [(f"{param}_{kind}[{d}]", e) for d, e in enumerate(exprs)]
            if record.storage_offset.is_Integer:
                lines.append(f"    if {param}.storage_offset() != {int(record.storage_offset)}: "
                             f"return False")
            else:
                values.append((f"{param}.storage_offset()", record.storage_offset))
        else:
            values = [(param, record)]
        for text, expr in values:
            if isinstance(expr, sympy.Symbol) and expr not in bound:
                bound[expr] = f"v_{expr.name}"
                lines.append(f"    {bound[expr]} = {text}")
            elif expr.is_Integer:
                lines.append(f"    if {text} != {int(expr)}: return False")
            else:
                pending.append((text, expr))

    missing = {s for g in env.guards for s in g.expr.free_symbols} - set(bound)
    missing |= {s for _, e in pending for s in e.free_symbols} - set(bound)
    if missing:
        sources = ", ".join(sorted(str(env.sources[s]) for s in missing))
        raise GuardSourceError(
            f"guard_function{tuple(names)}: the guards use sizes of inputs not passed: {sources}")

    for text, expr in pending:
        checks.append((f"{text} == {S.to_python(expr, bound)}", "input metadata"))
    for symbol, name in bound.items():
        checks.append((f"{name} >= {env.lower[symbol]}", f"range of {env.sources[symbol]}"))
        if env.upper[symbol] != math.inf:
            checks.append((f"{name} <= {env.upper[symbol]}", f"range of {env.sources[symbol]}"))
    for guard in env.guards:
        where = " ".join(x for x in (guard.user_location, guard.kernel_location) if x)
        checks.append((S.to_python(guard.expr, bound), where))

    seen: set[str] = set()
    unique = []
    for cond, why in checks:          # a guard that is also a range check is printed once
        key = cond.strip("()")
        if key not in seen:
            seen.add(key)
            unique.append((cond, why))
    checks = unique
    body = "\n".join(lines)
    tests = "".join(f"\n    if not ({cond}): return False" + (f"  # {why}" if why else "")
                    for cond, why in checks)
    source = f"def guard({', '.join(params)}):\n{body}{tests}\n    return True\n"
    namespace: dict = {"math": math}
    exec(compile(source, f"<kiln guard {', '.join(names)}>", "exec"), namespace)
    fn = namespace["guard"]
    fn.source = source
    return fn
