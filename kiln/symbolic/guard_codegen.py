"""Print a ShapeEnv's guards as one Python function over the real inputs.

The function checks static metadata first (one tuple comparison per static size or stride
tuple), binds each symbol from the first input it was created for, then checks the sizes,
strides and offsets that are expressions of symbols, each symbol's known range (>= 2, plus bounds
from guards), and every recorded guard. It is plain
generated source (kept on the function as `.source`) so a reader can see exactly what is checked.

Its companion `fn.explain(*inputs)` runs the same reads and says which check failed first, as a
`ShapeFailure` (the check's expression over symbols, where the guard was raised, and the symbols'
values for these inputs), or None: recompile messages name the guard, not "a guard failed".
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import sympy

from kiln.symbolic import sympy_ops as S
from kiln.symbolic.shape_env import GuardSourceError, ShapeEnv, TensorInput


@dataclasses.dataclass(frozen=True)
class ShapeFailure:
    """The first check of a shape guard function that failed for some inputs."""

    what: str                      # the check: a sympy expression over symbols, or a metadata text
    where: str                     # where the guard was raised ("file:line", kernel), or "" if unknown
    values: dict                   # symbol name -> its value for the failing inputs
    sources: dict                  # symbol name -> its Source


def build_guard_function(env: ShapeEnv, names: Sequence[str],
                         checked: Mapping[str, tuple] | None = None) -> Callable[..., bool]:
    """`checked`: name -> (sizes, strides) of inputs whose static sizes and strides the caller
    checks already (capture's tensor guards): a static tuple equal to those is not compared again
    (a decode step's hundred cache tensors: one comparison each instead of three)."""
    checked = checked or {}
    params = [f"a{i}" for i in range(len(names))]
    lines: list[str] = []
    checks: list[tuple[str, str]] = []            # (condition, why)
    whats: dict[str, str] = {}                    # condition -> what it checks, for explain
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
            for at, (kind, exprs) in enumerate((("size", record.sizes), ("stride", record.strides))):
                if all(e.is_Integer for e in exprs) and name in checked and \
                        tuple(checked[name][at]) == tuple(int(e) for e in exprs):
                    continue        # the caller compares this very tuple
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
        whats[checks[-1][0]] = f"{text} == {expr}"
    for symbol, name in bound.items():
        checks.append((f"{name} >= {env.lower[symbol]}", f"range of {env.sources[symbol]}"))
        whats.setdefault(checks[-1][0], f"{symbol} >= {env.lower[symbol]}")
        if env.upper[symbol] != math.inf:
            checks.append((f"{name} <= {env.upper[symbol]}", f"range of {env.sources[symbol]}"))
            whats.setdefault(checks[-1][0], f"{symbol} <= {env.upper[symbol]}")
    for guard in env.guards:
        where = " ".join(x for x in (guard.user_location,
                                     f"(kernel {guard.kernel_location})" if guard.kernel_location else "") if x)
        checks.append((S.to_python(guard.expr, bound), where))
        whats.setdefault(checks[-1][0], str(guard.expr))

    every_check = list(checks)        # explain reports a guard rather than the range it implied
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
    fn.explain = _explainer(env, params, lines, every_check, whats, bound, names)
    return fn


def _explainer(env, params, lines, checks, whats, bound, names) -> Callable:
    """`explain(*inputs) -> ShapeFailure | None`: the guard function's reads and checks, in its
    order, reporting the first check that fails instead of returning False (slow path: messages)."""
    values = "{" + ", ".join(f"{str(s)!r}: {v}" for s, v in bound.items()) + "}"
    body = []
    for line in lines:
        if line.endswith("return False"):
            shown = line.strip()[3:-len(": return False")].replace(" != ", " == ", 1)  # what was expected
            body.append(line.replace("return False", f"return ({shown!r}, '', {{}})"))
        else:
            body.append(line)
    # recorded guards before the ranges: a bound learnt from a guard reports the guard, and its line
    ordered = sorted(checks, key=lambda c: c[1].startswith("range of"))
    tests = "".join(f"\n    if not ({cond}): return ({whats.get(cond, cond)!r}, {why!r}, {values})"
                    for cond, why in ordered)
    source = f"def explain({', '.join(params)}):\n" + "\n".join(body) + tests + "\n    return None\n"
    namespace: dict = {"math": math}
    exec(compile(source, f"<kiln guard explain {', '.join(names)}>", "exec"), namespace)
    run, sources = namespace["explain"], {str(s): env.sources[s] for s in bound}

    def explain(*inputs) -> ShapeFailure | None:
        try:
            failed = run(*inputs)
        except Exception as e:   # a read failed: the inputs do not have the traced rank
            return ShapeFailure(f"reading the inputs' sizes ({type(e).__name__}: {e})", "", {}, sources)
        if failed is None:
            return None
        what, where, vals = failed
        for i, name in enumerate(names):     # static checks read the inputs by position
            what = (what.replace(f"a{i}_size", f"{name}.size()").replace(f"a{i}_stride", f"{name}.stride()")
                    .replace(f"a{i}.", f"{name}."))
        return ShapeFailure(what, where, vals, sources)
    return explain
