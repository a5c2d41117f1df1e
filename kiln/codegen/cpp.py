"""The C++/OpenMP printer: `ir.Kernel` -> C++ source, one `extern "C"` function per kernel.

Scalar ops print through `SCALAR_OPS_CPP` (op name -> format), reductions through `REDUCTIONS_CPP`
(op -> init, update). The outer loop gets `#pragma omp parallel for` with an `if` on the work
size (parallel regions cost microseconds; small kernels stay serial), inner loops are plain
counted loops over `__restrict__` pointers that g++ -O3 vectorizes; sum reductions get
`#pragma omp simd reduction` (float sums are not reassociated otherwise). A pointwise kernel that
transposes (`_transposes`) walks its two innermost loops by tiles, so its strided side stays in L1.

float16 and bfloat16 are kernel dtypes: buffers hold their bits, values are computed in float and
rounded where eager rounds ([Note: half types in C++] in `cpp_prelude`, which holds the C++
helpers every module starts with).

All kernels of one graph go in one translation unit (`print_module`), compiled once by
`kiln.runtime.cpp_build`; `build` returns ctypes callables with the printer interface of ir.py.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import sympy
import torch
from sympy.printing.c import C99CodePrinter

from kiln.codegen import ir
from kiln.codegen.cpp_prelude import PRELUDE, VECTOR_MATH  # noqa: F401 (VECTOR_MATH: cpp_build's note)
from kiln.codegen.indexing import index_bounds, nonnegative as _nonnegative
from kiln.codegen.ir import Accumulate, Assign, Constant, IndexValue, Load, Op, ScanAccumulate, Store, Var
from kiln.codegen.lowering import KERNEL_DTYPES as _COMMON_DTYPES

HALF_DTYPES = (torch.float16, torch.bfloat16)
# The dtypes kernels compute in (lowering leaves the others to ATen): the common ones and the halves.
KERNEL_DTYPES = _COMMON_DTYPES | frozenset(HALF_DTYPES)

# The C type a value of each dtype is computed in: half types in float, as eager's kernels (opmath).
CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
          torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
          torch.float16: "float", torch.bfloat16: "float"}
# The C type of a buffer's elements: half types are their bits.
STORAGE_CTYPES = {**CTYPES, torch.float16: "uint16_t", torch.bfloat16: "uint16_t"}
WIDEN = {torch.float16: "kiln_f16_to_float", torch.bfloat16: "kiln_bf16_to_float"}
NARROW = {torch.float16: "kiln_float_to_f16", torch.bfloat16: "kiln_float_to_bf16"}
ROUND = {torch.float16: "kiln_round_f16", torch.bfloat16: "kiln_round_bf16"}
# Ops whose result on values of a half type is a value of that type: no rounding after them.
EXACT_ON_HALF = frozenset({"maximum", "minimum", "where", "neg", "abs", "relu", "copysign", "floor", "ceil",
                           "trunc", "round", "sign"})

TAKES_POINTERS = True  # kernels take data pointers (ctypes), not tensors
# A kernel with index checks returns the code of one that failed (0: none), for the host to raise.
RETURNS_INDEX_ERRORS = True

# Work (elements x inner iterations) below which a kernel runs on one thread.
PARALLEL_MIN_WORK = 1 << 16


def _f(fmt):
    return lambda args, dtype: fmt.format(*args, t=CTYPES[dtype])


SCALAR_OPS_CPP = {
    "add": _f("({0} + {1})"), "sub": _f("({0} - {1})"), "mul": _f("({0} * {1})"),
    "truediv": _f("({0} / {1})"), "floordiv": _f("kiln_floordiv<{t}>({0}, {1})"),
    "remainder": _f("kiln_remainder<{t}>({0}, {1})"), "fmod": _f("kiln_fmod<{t}>({0}, {1})"),
    "pow": _f("kiln_pow<{t}>({0}, {1})"), "atan2": _f("std::atan2({0}, {1})"),
    "maximum": _f("kiln_max<{t}>({0}, {1})"), "minimum": _f("kiln_min<{t}>({0}, {1})"),
    "hypot": _f("std::hypot({0}, {1})"), "copysign": _f("std::copysign({0}, {1})"),
    "nextafter": _f("std::nextafter({0}, {1})"),
    "bitwise_and": _f("({0} & {1})"), "bitwise_or": _f("({0} | {1})"), "bitwise_xor": _f("({0} ^ {1})"),
    "left_shift": _f("({t})({0} << {1})"), "right_shift": _f("({0} >> {1})"),
    "eq": _f("({0} == {1})"), "ne": _f("({0} != {1})"), "lt": _f("({0} < {1})"), "le": _f("({0} <= {1})"),
    "gt": _f("({0} > {1})"), "ge": _f("({0} >= {1})"),
    "logical_and": _f("({0} && {1})"), "logical_or": _f("({0} || {1})"), "logical_xor": _f("((bool){0} != (bool){1})"),
    "where": _f("({0} ? {1} : {2})"),
    "neg": _f("(-{0})"), "abs": _f("std::abs({0})"), "exp": _f("kiln_exp<{t}>({0})"), "exp2": _f("std::exp2({0})"),
    "expm1": _f("std::expm1({0})"), "log": _f("std::log({0})"), "log2": _f("std::log2({0})"),
    "log10": _f("std::log10({0})"), "log1p": _f("std::log1p({0})"), "sqrt": _f("std::sqrt({0})"),
    "rsqrt": _f("kiln_rsqrt<{t}>({0})"), "sin": _f("std::sin({0})"), "cos": _f("std::cos({0})"),
    "tan": _f("std::tan({0})"), "asin": _f("std::asin({0})"), "acos": _f("std::acos({0})"),
    "atan": _f("std::atan({0})"), "sinh": _f("std::sinh({0})"), "cosh": _f("std::cosh({0})"),
    "tanh": _f("std::tanh({0})"), "asinh": _f("std::asinh({0})"), "acosh": _f("std::acosh({0})"),
    "atanh": _f("std::atanh({0})"), "erf": _f("std::erf({0})"), "erfc": _f("std::erfc({0})"),
    "erfinv": _f("({t})kiln_erfinv({0})"), "lgamma": _f("std::lgamma({0})"), "digamma": _f("({t})kiln_digamma({0})"),
    "sigmoid": _f("kiln_sigmoid<{t}>({0})"), "reciprocal": _f("(({t})1 / {0})"), "floor": _f("std::floor({0})"),
    "ceil": _f("std::ceil({0})"), "round": _f("kiln_round<{t}>({0})"), "trunc": _f("std::trunc({0})"),
    "sign": _f("kiln_sign<{t}>({0})"), "signbit": _f("kiln_signbit({0})"), "isnan": _f("std::isnan({0})"),
    "isinf": _f("std::isinf({0})"), "isfinite": _f("std::isfinite({0})"), "logical_not": _f("(!{0})"),
    "bitwise_not": _f("(~{0})"), "relu": _f("kiln_max<{t}>({0}, 0)"), "frac": _f("kiln_frac<{t}>({0})"),
}


def _to_dtype(arg: str, src: torch.dtype, out: torch.dtype) -> str:
    """`arg` (computed in `src`'s C type) converted to `out`. To a half type: to float (as c10
    converts doubles and integers) and rounded to the narrow type, kept in float."""
    if out in HALF_DTYPES:
        return f"{ROUND[out]}({arg if CTYPES[src] == 'float' else f'static_cast<float>({arg})'})"
    if CTYPES[src] == CTYPES[out] and src != torch.bool and out != torch.bool:
        return arg
    return f"static_cast<{CTYPES[out]}>({arg})"

# op -> (initial value, update) with {acc} the accumulator and {v} the value.
# Reductions that vectorize under `omp simd` (sum: built-in; max/min: float, NaN-propagating, see PRELUDE).
SIMD_REDUCTIONS = {"max": "kiln_maxr", "min": "kiln_minr"}

REDUCTIONS_CPP = {
    "sum": ("0", "{acc} = {acc} + {v};"),
    "prod": ("1", "{acc} = {acc} * {v};"),
    "max": ("{lowest}", "{acc} = kiln_max<{t}>({acc}, {v});"),
    "min": ("{highest}", "{acc} = kiln_min<{t}>({acc}, {v});"),
    "any": ("false", "{acc} = {acc} || {v};"),
    "all": ("true", "{acc} = {acc} && {v};"),
}
SCANS_CPP = {
    "cumsum": ("0", "{acc} = {acc} + {v};"),
    "cumprod": ("1", "{acc} = {acc} * {v};"),
    "logcumsumexp": ("-INFINITY", "{{ {t} m_ = kiln_max<{t}>({acc}, {v}); {acc} = (m_ == -INFINITY) ? m_ : "
                                  "m_ + std::log(std::exp({acc} - m_) + std::exp({v} - m_)); }}"),
}


class _IndexPrinter(C99CodePrinter):
    """Index expressions: int64 arithmetic. C's `/` and `%` truncate toward zero, sympy's floor
    and Mod round down: they agree on non-negative operands, and the others (sympy writes
    `Mod(31 - x0, 2)` as `Mod(1 - x0, 2)`; a flip's index) print through the floor helpers."""

    def _print_floor(self, expr):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        if _nonnegative(num) and _nonnegative(den):
            return f"(({self._print(num)}) / ({self._print(den)}))"
        return f"kiln_floordiv<int64_t>({self._print(num)}, {self._print(den)})"

    def _print_Mod(self, expr):
        a, b = expr.args
        if _nonnegative(a) and _nonnegative(b):
            return f"(({self._print(a)}) % ({self._print(b)}))"
        return f"kiln_remainder<int64_t>({self._print(a)}, {self._print(b)})"

    def _print_Max(self, expr):
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"std::max<int64_t>({out}, {self._print(a)})"
        return out

    def _print_Min(self, expr):
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"std::min<int64_t>({out}, {self._print(a)})"
        return out

    def _print_Integer(self, expr):
        return f"{int(expr)}L" if abs(int(expr)) > 2**31 - 1 else str(int(expr))

    def _print_Rational(self, expr):  # only inside floor; keep exact
        return f"({expr.p}.0/{expr.q}.0)"

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp.is_Integer and exp > 0:
            return "(" + "*".join([f"({self._print(base)})"] * int(exp)) + ")"
        return super()._print_Pow(expr)


_INDEX = _IndexPrinter()


def index_str(e) -> str:
    return _INDEX.doprint(sympy.sympify(e))


def _literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        if dtype in HALF_DTYPES:   # as eager's fill: the double to float, then to the narrow type
            v = torch.tensor(v, dtype=torch.float32).to(dtype).item()
        text = repr(v)
        return text + ("f" if CTYPES[dtype] == "float" else "")
    return f"(({CTYPES[dtype]}){int(value)}L)" if abs(int(value)) > 2**31 - 1 else f"(({CTYPES[dtype]}){int(value)})"


class CppUnsupported(Exception):
    """An IR feature the C++ printer does not print (the backend runs the graph another way)."""


# Ops that may trap (integer division by zero) when evaluated on values a `where` did not select.
_MAY_TRAP_INT = frozenset({"truediv", "floordiv", "remainder", "fmod"})


@dataclasses.dataclass(frozen=True)
class _Context:
    """What the printer knows about a kernel's loops: variable bounds (exclusive) and buffers, so a
    load can be proved in bounds."""
    upper: Mapping
    buffers: Mapping[str, ir.Buffer]
    checks: Mapping = dataclasses.field(default_factory=dict)   # ir.index_checks entry -> its code
    dry: bool = False     # the check pass of [Note: a scatter into an input checks before it writes]

    def in_range(self, kind: str, bounds, origin) -> str:
        """The C++ condition that every bound holds, recording the first that fails in the kernel's
        error slot ([Note: index bounds checks] in lowering_reduce)."""
        return " && ".join(f"kiln_in_bounds({t}, {index_str(n)}, kiln_error, {self.code(kind, n, origin)})"
                           for t, n in bounds)

    def code(self, kind: str, size, origin) -> int:
        """The error code of a check: its position in `ir.index_checks` + 1."""
        return self.checks[ir.IndexCheck(kind, sympy.sympify(size), origin)]

    def in_bounds(self, ld: Load) -> bool:
        buf = self.buffers.get(ld.buffer)
        if ld.indirect or buf is None or sympy.sympify(buf.offset) != 0:
            return False
        strides = [sympy.sympify(st) for st in buf.strides]
        sizes = [sympy.sympify(sz) for sz in buf.sizes]
        if not all(x.is_number for x in strides + sizes) or any(x < 0 for x in strides):
            return False
        last = sum((int(sz) - 1) * int(st) for sz, st in zip(sizes, strides))
        b = index_bounds(ld.index, self.upper)
        return b is not None and b[0] >= 0 and b[1] <= last

    def safe(self, e: ir.ScalarExpr) -> bool:
        """Whether `e` may be evaluated even where its value is not used."""
        for sub in ir.walk(e):
            if isinstance(sub, Load) and not self.in_bounds(sub):
                return False
            if isinstance(sub, Op) and sub.name in _MAY_TRAP_INT and not sub.dtype.is_floating_point:
                return False
        return True


def expr_str(e: ir.ScalarExpr, ctx: _Context | None = None, unrounded: bool = False) -> str:
    """The C++ text of `e`. `unrounded`: an op of a half type leaves its float result unrounded
    (a store narrows it itself: rounding twice is the same value, at twice the work)."""
    if isinstance(e, Load):
        text = f"{e.buffer}[{index_str(e.index)}]"
        buf = ctx.buffers.get(e.buffer) if ctx is not None else None
        dtype = buf.dtype if buf is not None else e.dtype
        if e.indirect:
            binds = " ".join(f"int64_t {s} = {expr_str(x, ctx)};" for s, x in e.indirect)
            if e.bounds:     # an index out of range fails the kernel, and reads row 0 ([Note: index bounds checks])
                if ctx is None:
                    raise CppUnsupported("a checked gather printed without its kernel")
                binds += "".join(f" {t} = kiln_checked({t}, {index_str(n)}, kiln_error, "
                                 f"{ctx.code('gather', n, e.origin)});" for t, n in e.bounds)
            text = f"({{ {binds} {text}; }})"
        return f"{WIDEN[dtype]}({text})" if dtype in HALF_DTYPES else text
    if isinstance(e, Constant):
        return _literal(e.value, e.dtype)
    if isinstance(e, IndexValue):
        if e.dtype in HALF_DTYPES:
            return f"{ROUND[e.dtype]}(static_cast<float>({index_str(e.index)}))"
        return f"static_cast<{CTYPES[e.dtype]}>({index_str(e.index)})"
    if isinstance(e, Var):
        return f"v_{e.name}"
    if isinstance(e, Op):
        fmt = SCALAR_OPS_CPP.get(e.name)
        if fmt is None and e.name != "to_dtype":
            raise CppUnsupported(f"scalar op {e.name}")
        if e.dtype not in CTYPES or any(a.dtype not in CTYPES for a in e.args):
            raise CppUnsupported(f"dtype {e.dtype}")
        args = [expr_str(a, ctx) for a in e.args]
        if e.name == "to_dtype":   # the one op whose text depends on its argument's dtype
            if unrounded and e.dtype in HALF_DTYPES:
                return _to_dtype(args[0], e.args[0].dtype, torch.float32)
            return _to_dtype(args[0], e.args[0].dtype, e.dtype)
        if e.name == "where" and ctx is not None and any(ir.loads_of(a) for a in e.args[1:]) \
                and all(ctx.safe(a) for a in e.args[1:]):
            return f"kiln_where<{CTYPES[e.dtype]}>({args[0]}, {args[1]}, {args[2]})"
        text = fmt(args, e.dtype)
        if e.dtype in HALF_DTYPES and e.name not in EXACT_ON_HALF and not unrounded:
            return f"{ROUND[e.dtype]}({text})"   # an op eager computes in the narrow type rounds
        return text
    raise CppUnsupported(f"expression {type(e).__name__}")


def _scatter_lines(s: Store, ctx: _Context | None, exact: frozenset) -> list[str]:
    """A store at loaded indices ([Note: scatters write in place] in ir.py): the indices bound, the
    write skipped (and the kernel's error set) where one falls outside its dim, an accumulating one
    added atomically (the outer loop runs in parallel, and two points may name one element)."""
    binds = " ".join(f"int64_t {t} = {expr_str(x, ctx)};" for t, x in s.indirect)
    if s.bounds and ctx is None:
        raise CppUnsupported("a checked scatter printed without its kernel")
    inside = ctx.in_range("scatter", s.bounds, s.origin) if s.bounds else "true"
    if ctx is not None and ctx.dry:
        return [f"{{ {binds} (void)({inside}); }}"]
    target = f"{s.buffer}[{index_str(s.index)}]"
    if not s.accumulate:
        return [f"{{ {binds} if ({inside}) {target} = {_stored_value(s, ctx, exact)}; }}"]
    return [f"{{ {binds} {CTYPES[s.expr.dtype]} v_ = {expr_str(s.expr, ctx)};", f"  if ({inside}) {{",
            "    #pragma omp atomic", f"    {target} += v_;", "  }", "}"]


def _flat_r(ranges) -> str:
    flat = sympy.Integer(0)
    for k, r in enumerate(ranges):
        flat = flat * r + ir.reduction_var(k)
    return index_str(flat)


def _stored_value(s: Store, ctx: _Context | None, exact: frozenset = frozenset()) -> str:
    """The text a store writes: a value for a half buffer narrows to its bits. `exact`: the names of
    this stage's assigned values of a half type (rounded already, as every printed value of a half
    type but a store's own expression): a bfloat16 one is just its high half."""
    buf = ctx.buffers.get(s.buffer) if ctx is not None else None
    if buf is None or buf.dtype not in HALF_DTYPES:
        return expr_str(s.expr, ctx)
    held = isinstance(s.expr, Var) and s.expr.name in exact or isinstance(s.expr, Load) and \
        getattr(ctx.buffers.get(s.expr.buffer), "dtype", None) == torch.bfloat16
    if buf.dtype == torch.bfloat16 and s.expr.dtype == torch.bfloat16 and held:
        return f"kiln_bf16_bits({expr_str(s.expr, ctx)})"
    text = expr_str(s.expr, ctx, unrounded=s.expr.dtype == buf.dtype)
    return f"{NARROW[buf.dtype]}({text if CTYPES[s.expr.dtype] == 'float' else f'static_cast<float>({text})'})"


def _stage_lines(stage: ir.Stage, ind: str, ctx: _Context | None = None, simd: bool = True) -> list[str]:
    """The C++ lines of one stage; `simd`: a reduction loop may be an `omp simd` one."""
    lines: list[str] = []
    decl: list[str] = []
    simd_sum = []
    for s in stage.body:
        if isinstance(s, Accumulate):
            t = CTYPES[s.expr.dtype]
            if s.op in ("argmax", "argmin"):
                init = "-INFINITY" if s.op == "argmax" else "INFINITY"
                if not s.expr.dtype.is_floating_point:
                    init = f"std::numeric_limits<{t}>::{'lowest' if s.op == 'argmax' else 'max'}()"
                decl += [f"{t} v_{s.name}_v = {init};", f"int64_t v_{s.name} = 0;", f"bool v_{s.name}_seen = false;"]
            elif s.op in ("welford_mean", "welford_m2"):
                decl += [f"{t} v_{s.name}_mean = 0;", f"{t} v_{s.name}_m2 = 0;", f"int64_t v_{s.name}_n = 0;"]
            else:
                init, _ = REDUCTIONS_CPP[s.op]
                init = init.format(lowest=f"-std::numeric_limits<{t}>::infinity()" if s.expr.dtype.is_floating_point
                                   else f"std::numeric_limits<{t}>::lowest()",
                                   highest=f"std::numeric_limits<{t}>::infinity()" if s.expr.dtype.is_floating_point
                                   else f"std::numeric_limits<{t}>::max()")
                decl.append(f"{t} v_{s.name} = {init};")
                if s.op == "sum":
                    simd_sum.append(f"+:v_{s.name}")
                elif s.op in SIMD_REDUCTIONS and CTYPES[s.expr.dtype] in ("float", "double"):
                    simd_sum.append(f"{SIMD_REDUCTIONS[s.op]}:v_{s.name}")
        elif isinstance(s, ScanAccumulate):
            init, _ = SCANS_CPP[s.op]
            decl.append(f"{CTYPES[s.expr.dtype]} v_{s.name} = {init};")
    body: list[str] = []
    exact = frozenset(s.name for s in stage.body if isinstance(s, Assign) and s.expr.dtype in HALF_DTYPES)
    for s in stage.body:
        if isinstance(s, Assign):
            body.append(f"{CTYPES[s.expr.dtype]} v_{s.name} = {expr_str(s.expr, ctx)};")
        elif isinstance(s, Store) and s.indirect:
            body += _scatter_lines(s, ctx, exact)
        elif isinstance(s, Store):
            body.append(f"{s.buffer}[{index_str(s.index)}] = {_stored_value(s, ctx, exact)};")
        elif isinstance(s, Accumulate):
            v, t, acc = expr_str(s.expr, ctx), CTYPES[s.expr.dtype], f"v_{s.name}"
            if s.op in ("argmax", "argmin"):
                cmp = ">" if s.op == "argmax" else "<"
                body.append(f"{{ {t} v_ = {v}; if (!{acc}_seen || ({acc}_v == {acc}_v && (v_ != v_ || v_ {cmp} "
                            f"{acc}_v))) {{ {acc}_v = v_; {acc} = {_flat_r(stage.reduction_ranges)}; }} "
                            f"{acc}_seen = true; }}")
            elif s.op in ("welford_mean", "welford_m2"):
                body.append(f"{{ {t} v_ = {v}; {acc}_n += 1; {t} d_ = v_ - {acc}_mean; "
                            f"{acc}_mean += d_ / ({t}){acc}_n; {acc}_m2 += d_ * (v_ - {acc}_mean); }}")
            else:
                body.append(REDUCTIONS_CPP[s.op][1].format(acc=acc, v=v, t=t))
        elif isinstance(s, ScanAccumulate):
            body.append(SCANS_CPP[s.op][1].format(acc=f"v_{s.name}", v=expr_str(s.expr, ctx), t=CTYPES[s.expr.dtype]))
    if not stage.reduction_ranges:
        return [ind + line for line in decl + body]
    lines = [ind + d for d in decl]
    pragma = None
    has_assign_only = all(isinstance(s, (Assign, Store, Accumulate)) for s in stage.body)
    if stage.is_scan or not has_assign_only or not simd:
        pragma = None
    elif sum(isinstance(s, Accumulate) for s in stage.body) == len(simd_sum):
        checked = ["max:kiln_error"] if ctx is not None and ctx.checks else []
        pragma = "#pragma omp simd" + "".join(f" reduction({r})" for r in simd_sum + checked)
    inner = ind
    for k, r in enumerate(stage.reduction_ranges):
        if k == len(stage.reduction_ranges) - 1 and pragma:
            lines.append(inner + pragma)
        lines.append(f"{inner}for (int64_t r{k} = 0; r{k} < {index_str(r)}; ++r{k}) {{")
        inner += "  "
    lines += [inner + b for b in body]
    for k in range(len(stage.reduction_ranges)):
        inner = inner[:-2]
        lines.append(inner + "}")
    # finished reductions: the accumulator's name is the value
    for s in stage.body:
        if isinstance(s, Accumulate) and s.op in ("welford_mean", "welford_m2"):
            part = "mean" if s.op == "welford_mean" else "m2"
            lines.append(f"{ind}{CTYPES[s.expr.dtype]} v_{s.name} = v_{s.name}_{part};")
        elif isinstance(s, Accumulate) and s.op in ("sum", "prod") and s.expr.dtype in HALF_DTYPES:
            # accumulated in float, as eager's; its result is a narrow tensor
            lines.append(f"{ind}v_{s.name} = {ROUND[s.expr.dtype]}(v_{s.name});")
    return lines


# Outer iterations a parallel loop should offer the threads: enough to balance a few cores.
PARALLEL_MIN_CHUNKS = 16


def _collapse_depth(ranges, most: int) -> int:
    """How many leading loops `omp parallel for` collapses: the fewest (up to `most`) whose
    iterations reach PARALLEL_MIN_CHUNKS; all `most` when a range is symbolic."""
    count = sympy.Integer(1)
    for k in range(most):
        count = count * sympy.sympify(ranges[k])
        if not count.is_number:
            return most
        if int(count) >= PARALLEL_MIN_CHUNKS:
            return k + 1
    return most


# Side of the square tiles a transposing pointwise kernel walks: a tile's strided reads stay in L1
# (a 2048 x 512 float -> bfloat16 transposing cast, autocast's weight for mm: 2.3x faster than rows).
TILE = 32


def _transposes(kernel: ir.Kernel) -> bool:
    """Whether a pointwise kernel's two innermost loops transpose: some load or store steps through
    memory along the innermost loop and at unit stride along the loop above it, both ranges static
    and longer than a tile."""
    if len(kernel.ranges) < 2:
        return False
    ranges = [sympy.sympify(r) for r in kernel.ranges[-2:]]
    if not all(r.is_number and int(r) > TILE for r in ranges):
        return False
    outer, inner = ir.loop_var(len(kernel.ranges) - 2), ir.loop_var(len(kernel.ranges) - 1)
    indices = [e.index for st in kernel.stages for s in st.body for e in ir.walk(s.expr)
               if isinstance(e, Load) and not e.indirect]
    indices += [s.index for st in kernel.stages for s in st.body if isinstance(s, Store)]
    for index in map(sympy.expand, indices):
        step_in, step_out = index.coeff(inner, 1), index.coeff(outer, 1)
        if step_in.is_Integer and abs(int(step_in)) > 1 and step_out == 1 \
                and not (index - step_in * inner - outer).has(inner, outer):
            return True
    return False


def _indexes_with_a_compare(kernel: ir.Kernel) -> bool:
    """Whether a load's computed index converts a bool (a compare) to a number, directly or through
    a temporary. A compare that only selects (the negative-index wrap of every gather) is fine.

    [Note: g++ 12 and indices made from compares] g++ 12's loop vectorizer miscompiles a gather
    whose index is a compare made an integer: the vector compare's mask (-1 for true) reaches the
    address unconverted, so `t.gather(0, (x > 0).long())` read `t[-1]` (fuzz seed 21513, a wrong
    gradient through scatter_add's backward; `omp simd` and plain -O3 alike, `& 1` no help). Such
    a kernel is printed without `simd` and with the vectorizer off (its gather is scalar anyway).
    So is a kernel that stores at loaded indices: two lanes of one vector may name one element."""
    assigned = {s.name: s.expr for st in kernel.stages for s in st.body if isinstance(s, Assign)}

    def converts_bool(e: ir.ScalarExpr, seen: set) -> bool:
        for sub in ir.walk(e):
            if isinstance(sub, Op) and sub.name == "to_dtype" and sub.dtype != torch.bool \
                    and getattr(sub.args[0], "dtype", None) == torch.bool:
                return True
            if isinstance(sub, Var) and sub.name in assigned and sub.name not in seen:
                seen.add(sub.name)
                if converts_bool(assigned[sub.name], seen):
                    return True
        return False

    scatters = any(isinstance(s, Store) and s.indirect for st in kernel.stages for s in st.body)
    return scatters or any(isinstance(e, Load) and any(converts_bool(x, set()) for _, x in e.indirect)
                           for st in kernel.stages for s in st.body for x in ir.stmt_exprs(s) for e in ir.walk(x))


def print_kernel(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> str:
    stored = {s.buffer for st in kernel.stages for s in st.body if isinstance(s, Store)}
    params = []
    for name in kernel.buffer_args:
        buf = buffers[name]
        if buf.dtype not in STORAGE_CTYPES:
            raise CppUnsupported(f"buffer dtype {buf.dtype}")
        const = "" if name in stored else "const "
        params.append(f"{const}{STORAGE_CTYPES[buf.dtype]}* __restrict__ {name}")
    params += [f"int64_t {s}" for s in kernel.size_args]
    checks = {c: k + 1 for k, c in enumerate(ir.index_checks(kernel))}
    lines = [f"// fused: {', '.join(kernel.origins)}",
             f'extern "C" {"int64_t" if checks else "void"} {kernel.name}({", ".join(params)}) {{']
    if checks:     # a failed index check's code (the largest), 0 if none ([Note: index bounds checks])
        lines.append("  int64_t kiln_error = 0;")
    work = ir.product(kernel.ranges)
    inner_work = max([ir.product(s.reduction_ranges) for s in kernel.stages if s.reduction_ranges]
                     or [sympy.Integer(1)], key=lambda e: 0)
    total = work * inner_work * max(1, len(kernel.stages))
    ind = "  "
    only_once = all(not s.reduction_ranges for s in kernel.stages)
    scalar = _indexes_with_a_compare(kernel)    # [Note: g++ 12 and indices made from compares]
    n = len(kernel.ranges)
    # (variable, first, bound, step) per loop, outermost first; a transposing kernel walks its
    # two innermost loops by tiles (tile loops outside, the loops within a tile inside)
    loops = [(f"x{k}", "0", index_str(r), "1") for k, r in enumerate(kernel.ranges)]
    parallel_ranges = list(kernel.ranges)
    if only_once and _transposes(kernel):
        (a, _, ra, _), (b, _, rb, _) = loops[-2:]
        loops[-2:] = [(f"{a}_t", "0", ra, str(TILE)), (f"{b}_t", "0", rb, str(TILE)),
                      (a, f"{a}_t", f"std::min<int64_t>({a}_t + {TILE}, {ra})", "1"),
                      (b, f"{b}_t", f"std::min<int64_t>({b}_t + {TILE}, {rb})", "1")]
        parallel_ranges = parallel_ranges[:-2] + [-(-int(kernel.ranges[-2]) // TILE)]
    m = len(loops)
    if _checks_before_writing(kernel):
        lines += _loop_nest(kernel, buffers, checks, loops, parallel_ranges, total, only_once, scalar, dry=True)
        lines.append("  if (kiln_error) return kiln_error;")
    lines += _loop_nest(kernel, buffers, checks, loops, parallel_ranges, total, only_once, scalar)
    if checks:
        lines.append("  return kiln_error;")
    lines.append("}")
    options = ['"no-tree-vectorize"'] if scalar else []
    if only_once and any("kiln_where<" in line for line in lines):
        # g++'s tree-PRE, once float compares may be speculated (-fno-trapping-math), turns a
        # pointwise nest of selects between loads (max pooling's padded window) into loads it no
        # longer sees as affine, and the loop stays scalar (10x slower); reductions keep PRE (it
        # is worth 30% to a masked softmax)
        options.insert(0, '"no-tree-pre"')
    if options:
        lines[1] = lines[1].replace('extern "C" ', f'extern "C" __attribute__((optimize({", ".join(options)}))) ', 1)
    return "\n".join(lines)


# [Note: a scatter into an input checks before it writes] A scatter kernel skips an element whose
# index is out of range and the host raises after it, so the elements in range are written. Eager
# on the CPU writes in order up to the first bad index (none if it is the first); kiln's kernel,
# in parallel, has no order to follow. Where the scatter is the user's in-place op (its ATen name
# ends in `_`: `x[i] = v` is `index_put_`, and `index_copy_`, `index_fill_`, `index_add_`,
# `put_`), which writes their tensor, and the kernel writes nothing else, the C++ kernel first
# runs its loops without the stores (the indices and their checks only) and returns the error
# before any write: the user's tensor is unchanged after the error, where eager's holds the writes
# before the bad index. A scatter of an out-of-place op writes a fresh buffer, which no one sees
# when the program raises, and gets no check pass (embedding's backward scatters every token).
# Not covered: a kernel that writes other buffers too, and the Triton printer, whose
# `tl.device_assert` fails a block before its store but not the blocks before it (on a GPU the
# assert ends the process's CUDA context, as eager's does). Earlier ops' writes into inputs (an
# `x.add_(1)` before the bad `x[i] = v`) stand, as they do in eager.
def _checks_before_writing(kernel: ir.Kernel) -> bool:
    stores = [s for st in kernel.stages for s in st.body if isinstance(s, Store)]
    return bool(stores) and all(s.indirect and s.bounds for s in stores) and any(
        s.origin is not None and s.origin.op.endswith("_") for s in stores)


def _loop_nest(kernel, buffers, checks, loops, parallel_ranges, total, only_once, scalar, dry=False) -> list[str]:
    """The kernel's loops over its stages; `dry`: the stores only check their indices."""
    lines: list[str] = []
    ind = "  "
    n = len(kernel.ranges)
    m = len(loops)
    for k, (var, first, bound, step) in enumerate(loops):
        parallel = k == 0 and not (total.is_number and int(total) < PARALLEL_MIN_WORK)
        simd = k == m - 1 and only_once and not scalar and not checks and not any(isinstance(x, ScanAccumulate) for st in kernel.stages
                                                    for x in st.body)
        if parallel or simd:
            what = " ".join(w for w, on in (("parallel for", parallel), ("simd", simd)) if on)
            # the outer loops share the threads as one: a small leading dim (batch 1..4) still
            # spreads over every core; the innermost loop stays whole when it vectorizes. Only as
            # many loops as that needs: g++ leaves some inner `simd` loops of a collapsed nest
            # unvectorized (max pooling's window loads ran 10x slower under collapse(3)).
            tiled = m > n      # the tile loops are all outside the vector loop
            most = len(parallel_ranges) - (1 if only_once and n > 1 and not tiled else 0)
            nested = _collapse_depth(parallel_ranges, most)
            if parallel and nested > 1:
                what += f" collapse({nested})"
            cond = f" if({index_str(total)} >= {PARALLEL_MIN_WORK})" if parallel else ""
            if checks:      # each thread and lane its own error, the largest code kept
                cond += " reduction(max:kiln_error)"
            lines.append(f"{ind}#pragma omp {what}{cond}")
        advance = f"++{var}" if step == "1" else f"{var} += {step}"
        lines.append(f"{ind}for (int64_t {var} = {first}; {var} < {bound}; {advance}) {{")
        ind += "  "
    outer_upper = {ir.loop_var(k): sympy.sympify(r) for k, r in enumerate(kernel.ranges)}
    for st in kernel.stages:
        upper = {**outer_upper, **{ir.reduction_var(k): sympy.sympify(r) for k, r in enumerate(st.reduction_ranges)}}
        lines += _stage_lines(st, ind, _Context(upper, buffers, checks, dry), simd=not scalar)
    for _ in loops:
        ind = ind[:-2]
        lines.append(ind + "}")
    return lines


def print_module(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer]) -> str:
    return PRELUDE + "\n\n" + "\n\n".join(print_kernel(k, buffers) for k in kernels) + "\n"


def build(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer]) -> dict:
    """Compile all `kernels` into one shared library; return name -> callable(tensors..., ints...)."""
    return restore(saved(kernels, buffers))


def saved(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer], hints=None) -> dict:
    """What the warm-start cache keeps of built kernels (JSON): the library's source (its binary is
    cached by source hash) and each kernel's name and arity. (`hints` are not needed: a C++ kernel
    takes its sizes as arguments, compiled once for all.)"""
    return {"module": print_module(kernels, buffers),
            "kernels": [(k.name, len(k.buffer_args), len(k.size_args), bool(ir.index_checks(k))) for k in kernels]}


def restore(entry: dict) -> dict:
    """`build`'s result again from what `saved` kept."""
    from kiln.runtime.cpp_build import load_library
    lib = load_library(entry["module"], header=PRELUDE)
    return {name: lib.function(name, n_ptr, n_int, *checked) for name, n_ptr, n_int, *checked in entry["kernels"]}
