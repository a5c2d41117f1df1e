"""The C++/OpenMP printer: `ir.Kernel` -> C++ source, one `extern "C"` function per kernel.

Scalar ops print through `SCALAR_OPS_CPP` (op name -> format), reductions through `REDUCTIONS_CPP`
(op -> init, update). The outer loop gets `#pragma omp parallel for` with an `if` on the work
size (parallel regions cost microseconds; small kernels stay serial), inner loops are plain
counted loops over `__restrict__` pointers that g++ -O3 vectorizes; sum reductions get
`#pragma omp simd reduction` (float sums are not reassociated otherwise).

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
from kiln.codegen.indexing import index_bounds
from kiln.codegen.ir import Accumulate, Assign, Constant, IndexValue, Load, Op, ScanAccumulate, Store, Var

CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
          torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool"}

# Work (elements x inner iterations) below which a kernel runs on one thread.
TAKES_POINTERS = True  # kernels take data pointers (ctypes), not tensors

PARALLEL_MIN_WORK = 1 << 16

def _vector_math_declarations() -> str:
    """`declare simd` for the libm functions glibc's libmvec vectorizes, so loops calling them
    vectorize without -ffast-math (which would also drop NaN/inf semantics). Only the functions
    this machine's libmvec has are declared; the library is linked with -lmvec."""
    import ctypes
    try:
        mvec = ctypes.CDLL("libmvec.so.1")
    except OSError:
        return ""
    unary = "acos acosh asin asinh atan atanh cbrt cos cosh erf erfc exp exp10 exp2 expm1 log log10 log1p log2 " \
            "sin sinh tan tanh".split()
    binary = "atan2 hypot pow".split()
    lines = []
    for names, arity in ((unary, 1), (binary, 2)):
        for name in names:
            for suffix, ctype, mangled in (("f", "float", f"_ZGVdN8{'v' * arity}_{name}f"),
                                           ("", "double", f"_ZGVdN4{'v' * arity}_{name}")):
                if hasattr(mvec, mangled):
                    args = ", ".join([ctype] * arity)
                    lines.append(f'#pragma omp declare simd notinbranch\nextern "C" {ctype} {name}{suffix}({args}) noexcept;')
    return "\n".join(lines)


VECTOR_MATH = _vector_math_declarations()

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <limits>
#include <cstring>
#include <type_traits>
""" + VECTOR_MATH + r"""
// exp in float that g++ inlines and vectorizes: glibc's vector expf takes its scalar path for a
// whole vector when one lane is special (masked attention's -inf), and cannot be inlined. Cephes'
// polynomial after a Cody-Waite reduction, within 1 ulp; 2^n is applied in two halves so results
// reach FLT_MAX and the subnormals; inf, -inf and NaN come out as std::exp's.
static inline float kiln_expf(float x) {
  const float lo = -104.0f, hi = 88.72283935546875f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  n = (n == n) ? n : 0.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500E-4f;
  y = y * r + 1.3981999507E-3f; y = y * r + 8.3334519073E-3f; y = y * r + 4.1665795894E-2f;
  y = y * r + 1.6666665459E-1f; y = y * r + 5.0000001201E-1f;
  y = y * (r * r) + r + 1.0f;
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float p1, p2; std::memcpy(&p1, &b1, 4); std::memcpy(&p2, &b2, 4);
  y = y * p1 * p2;
  y = x < lo ? 0.0f : y;
  return x > hi ? INFINITY : y;
}
template <typename T> static inline T kiln_exp(T a) {
  if constexpr (std::is_same<T, float>::value) { return kiln_expf(a); } else { return std::exp(a); } }
template <typename T> static inline T kiln_max(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <typename T> static inline T kiln_min(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::floor(a / b); }
  else { T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; } }
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { T r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
  else { T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; } }
template <typename T> static inline T kiln_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::fmod(a, b); } else { return a % b; } }
template <typename T> static inline T kiln_sign(T a) { return (T)((a > 0) - (a < 0)); }
template <typename T> static inline T kiln_pow(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::pow(a, b); }
  else { if (b < 0) return (a == 1) ? 1 : ((a == -1) ? ((b % 2) ? -1 : 1) : 0);
         T r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; } }
// NaN-propagating max/min as OpenMP reductions, so `omp simd` vectorizes max/min reduction loops
// (OpenMP's built-in max/min drop NaNs); each lane folds its share, lanes combine with the same op.
#pragma omp declare reduction(kiln_maxr : float, double : omp_out = kiln_max(omp_out, omp_in)) initializer(omp_priv = -INFINITY)
#pragma omp declare reduction(kiln_minr : float, double : omp_out = kiln_min(omp_out, omp_in)) initializer(omp_priv = INFINITY)
// `where` with both branches evaluated: a select g++ vectorizes (a `?:` whose branch loads memory
// it cannot prove readable is never if-converted); printed only when both branches are safe to run.
template <typename T> static inline T kiln_where(bool c, T a, T b) { return c ? a : b; }
template <typename T> static inline T kiln_sigmoid(T a) { return T(1) / (T(1) + kiln_exp<T>(-a)); }
template <typename T> static inline T kiln_rsqrt(T a) { return T(1) / std::sqrt(a); }
template <typename T> static inline T kiln_frac(T a) { return a - std::trunc(a); }
template <typename T> static inline T kiln_round(T a) { return std::nearbyint(a); }
static inline double kiln_digamma(double x) {
  if (x == 0) return std::copysign(INFINITY, -x);
  if (x < 0) { if (x == std::floor(x)) return NAN; return kiln_digamma(1 - x) - M_PI / std::tan(M_PI * x); }
  double r = 0; while (x < 6) { r -= 1 / x; x += 1; }
  double f = 1 / (x * x);
  return r + std::log(x) - 0.5 / x - f * (1.0/12 - f * (1.0/120 - f * (1.0/252 - f * (1.0/240 - f / 132)))); }
static inline double kiln_erfinv(double y) {
  if (y <= -1) return y == -1 ? -INFINITY : NAN;
  if (y >= 1) return y == 1 ? INFINITY : NAN;
  double w = -std::log((1.0 - y) * (1.0 + y)), x;
  if (w < 6.25) { w -= 3.125; x = -3.6444120640178196996e-21; x = -1.685059138182016589e-19 + x*w; x = 1.2858480715256400167e-18 + x*w;
    x = 1.115787767802518096e-17 + x*w; x = -1.333171662854620906e-16 + x*w; x = 2.0972767875968561637e-17 + x*w;
    x = 6.6376381343583238325e-15 + x*w; x = -4.0545662729752068639e-14 + x*w; x = -8.1519341976054721522e-14 + x*w;
    x = 2.6335093153082322977e-12 + x*w; x = -1.2975133253453532498e-11 + x*w; x = -5.4154120542946279317e-11 + x*w;
    x = 1.051212273321532285e-09 + x*w; x = -4.1126339803469836976e-09 + x*w; x = -2.9070369957882005086e-08 + x*w;
    x = 4.2347877827932403518e-07 + x*w; x = -1.3654692000834678645e-06 + x*w; x = -1.3882523362786468719e-05 + x*w;
    x = 0.0001867342080340571352 + x*w; x = -0.00074070253416626697512 + x*w; x = -0.0060336708714301490533 + x*w;
    x = 0.24015818242558961693 + x*w; x = 1.6536545626831027356 + x*w; }
  else if (w < 16.0) { w = std::sqrt(w) - 3.25; x = 2.2137376921775787049e-09; x = 9.0756561938885390979e-08 + x*w;
    x = -2.7517406297064545428e-07 + x*w; x = 1.8239629214389227755e-08 + x*w; x = 1.5027403968909827627e-06 + x*w;
    x = -4.013867526981545969e-06 + x*w; x = 2.9234449089955446044e-06 + x*w; x = 1.2475304481671778723e-05 + x*w;
    x = -4.7318229009055733981e-05 + x*w; x = 6.8284851459573175448e-05 + x*w; x = 2.4031110387097893999e-05 + x*w;
    x = -0.0003550375203628474796 + x*w; x = 0.00095328937973738049703 + x*w; x = -0.0016882755560235047313 + x*w;
    x = 0.0024914420961078508066 + x*w; x = -0.0037512085075692412107 + x*w; x = 0.005370914553590063617 + x*w;
    x = 1.0052589676941592334 + x*w; x = 3.0838856104922207635 + x*w; }
  else { w = std::sqrt(w) - 5.0; x = -2.7109920616438573243e-11; x = -2.5556418169965252055e-10 + x*w;
    x = 1.5076572693500548083e-09 + x*w; x = -3.7894654401267369937e-09 + x*w; x = 7.6157012080783393804e-09 + x*w;
    x = -1.4960026627149240478e-08 + x*w; x = 2.9147953450901080826e-08 + x*w; x = -6.7711997758452339498e-08 + x*w;
    x = 2.2900482228026654717e-07 + x*w; x = -9.9298272942317002539e-07 + x*w; x = 4.5260625972231537039e-06 + x*w;
    x = -1.9681778105531670567e-05 + x*w; x = 7.5995277030017761139e-05 + x*w; x = -0.00021503011930044477347 + x*w;
    x = -0.00013871931833623122026 + x*w; x = 1.0103004648645343977 + x*w; x = 4.8499064014085844221 + x*w; }
  x = x * y;
  for (int i = 0; i < 2; ++i) { double err = std::erf(x) - y; x -= err / (2.0 / std::sqrt(M_PI) * std::exp(-x * x)); }
  return x; }
"""


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
    "sign": _f("kiln_sign<{t}>({0})"), "signbit": _f("std::signbit({0})"), "isnan": _f("std::isnan({0})"),
    "isinf": _f("std::isinf({0})"), "isfinite": _f("std::isfinite({0})"), "logical_not": _f("(!{0})"),
    "bitwise_not": _f("(~{0})"), "relu": _f("kiln_max<{t}>({0}, 0)"), "frac": _f("kiln_frac<{t}>({0})"),
    "to_dtype": _f("static_cast<{t}>({0})"),
}

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
        text = repr(v)
        return text + ("f" if dtype == torch.float32 else "")
    return f"(({CTYPES[dtype]}){int(value)}L)" if abs(int(value)) > 2**31 - 1 else f"(({CTYPES[dtype]}){int(value)})"


class CppUnsupported(Exception):
    """An IR feature the C++ printer does not print (the backend runs the graph another way)."""


# Ops that may trap (integer division by zero) when evaluated on values a `where` did not select.
def _nonnegative(e) -> bool:
    """Whether index expression `e` is >= 0 by its form: loop variables and sizes are, and so are
    sums and products of them with non-negative coefficients, Mods and floors of such."""
    e = sympy.sympify(e)
    if e.is_number:
        return bool(e >= 0)
    if e.is_Symbol or isinstance(e, sympy.Mod):
        return True
    if isinstance(e, sympy.floor):
        return _nonnegative(e.args[0])
    if e.is_Add or e.is_Mul or isinstance(e, sympy.Min):
        return all(_nonnegative(t) for t in e.args)
    if isinstance(e, sympy.Max):
        return any(_nonnegative(t) for t in e.args)
    if e.is_Pow:
        return e.exp.is_Integer and e.exp > 0 and _nonnegative(e.base)
    return False


_MAY_TRAP_INT = frozenset({"truediv", "floordiv", "remainder", "fmod"})


@dataclasses.dataclass(frozen=True)
class _Context:
    """What the printer knows about a kernel's loops: variable bounds (exclusive) and buffers, so a
    load can be proved in bounds."""
    upper: Mapping
    buffers: Mapping[str, ir.Buffer]

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


def expr_str(e: ir.ScalarExpr, ctx: _Context | None = None) -> str:
    if isinstance(e, Load):
        if e.indirect:
            binds = " ".join(f"int64_t {s} = {expr_str(x, ctx)};" for s, x in e.indirect)
            return f"({{ {binds} {e.buffer}[{index_str(e.index)}]; }})"
        return f"{e.buffer}[{index_str(e.index)}]"
    if isinstance(e, Constant):
        return _literal(e.value, e.dtype)
    if isinstance(e, IndexValue):
        return f"static_cast<{CTYPES[e.dtype]}>({index_str(e.index)})"
    if isinstance(e, Var):
        return f"v_{e.name}"
    if isinstance(e, Op):
        fmt = SCALAR_OPS_CPP.get(e.name)
        if fmt is None:
            raise CppUnsupported(f"scalar op {e.name}")
        if e.dtype not in CTYPES or any(a.dtype not in CTYPES for a in e.args):
            raise CppUnsupported(f"dtype {e.dtype}")
        args = [expr_str(a, ctx) for a in e.args]
        if e.name == "where" and ctx is not None and any(ir.loads_of(a) for a in e.args[1:]) \
                and all(ctx.safe(a) for a in e.args[1:]):
            return f"kiln_where<{CTYPES[e.dtype]}>({args[0]}, {args[1]}, {args[2]})"
        return fmt(args, e.dtype)
    raise CppUnsupported(f"expression {type(e).__name__}")


def _flat_r(ranges) -> str:
    flat = sympy.Integer(0)
    for k, r in enumerate(ranges):
        flat = flat * r + ir.reduction_var(k)
    return index_str(flat)


def _stage_lines(stage: ir.Stage, ind: str, ctx: _Context | None = None) -> list[str]:
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
                elif s.op in SIMD_REDUCTIONS and s.expr.dtype in (torch.float32, torch.float64):
                    simd_sum.append(f"{SIMD_REDUCTIONS[s.op]}:v_{s.name}")
        elif isinstance(s, ScanAccumulate):
            init, _ = SCANS_CPP[s.op]
            decl.append(f"{CTYPES[s.expr.dtype]} v_{s.name} = {init};")
    body: list[str] = []
    for s in stage.body:
        if isinstance(s, Assign):
            body.append(f"{CTYPES[s.expr.dtype]} v_{s.name} = {expr_str(s.expr, ctx)};")
        elif isinstance(s, Store):
            body.append(f"{s.buffer}[{index_str(s.index)}] = {expr_str(s.expr, ctx)};")
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
    if stage.is_scan or not has_assign_only:
        pragma = None
    elif sum(isinstance(s, Accumulate) for s in stage.body) == len(simd_sum):
        pragma = "#pragma omp simd" + "".join(f" reduction({r})" for r in simd_sum)
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


def print_kernel(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> str:
    stored = {s.buffer for st in kernel.stages for s in st.body if isinstance(s, Store)}
    params = []
    for name in kernel.buffer_args:
        buf = buffers[name]
        if buf.dtype not in CTYPES:
            raise CppUnsupported(f"buffer dtype {buf.dtype}")
        const = "" if name in stored else "const "
        params.append(f"{const}{CTYPES[buf.dtype]}* __restrict__ {name}")
    params += [f"int64_t {s}" for s in kernel.size_args]
    lines = [f"// fused: {', '.join(kernel.origins)}",
             f'extern "C" void {kernel.name}({", ".join(params)}) {{']
    work = ir.product(kernel.ranges)
    inner_work = max([ir.product(s.reduction_ranges) for s in kernel.stages if s.reduction_ranges]
                     or [sympy.Integer(1)], key=lambda e: 0)
    total = work * inner_work * max(1, len(kernel.stages))
    ind = "  "
    only_once = all(not s.reduction_ranges for s in kernel.stages)
    n = len(kernel.ranges)
    for k, r in enumerate(kernel.ranges):
        parallel = k == 0 and not (total.is_number and int(total) < PARALLEL_MIN_WORK)
        simd = k == n - 1 and only_once and not any(isinstance(x, ScanAccumulate) for st in kernel.stages
                                                    for x in st.body)
        if parallel or simd:
            what = " ".join(w for w, on in (("parallel for", parallel), ("simd", simd)) if on)
            # the outer loops share the threads as one: a small leading dim (batch 1..4) still
            # spreads over every core; the innermost loop stays whole when it vectorizes. Only as
            # many loops as that needs: g++ leaves some inner `simd` loops of a collapsed nest
            # unvectorized (max pooling's window loads ran 10x slower under collapse(3)).
            nested = _collapse_depth(kernel.ranges, n - 1 if (only_once and n > 1) else n)
            if parallel and nested > 1:
                what += f" collapse({nested})"
            cond = f" if({index_str(total)} >= {PARALLEL_MIN_WORK})" if parallel else ""
            lines.append(f"{ind}#pragma omp {what}{cond}")
        lines.append(f"{ind}for (int64_t x{k} = 0; x{k} < {index_str(r)}; ++x{k}) {{")
        ind += "  "
    outer_upper = {ir.loop_var(k): sympy.sympify(r) for k, r in enumerate(kernel.ranges)}
    for st in kernel.stages:
        upper = {**outer_upper, **{ir.reduction_var(k): sympy.sympify(r) for k, r in enumerate(st.reduction_ranges)}}
        lines += _stage_lines(st, ind, _Context(upper, buffers))
    for k in range(n):
        ind = ind[:-2]
        lines.append(ind + "}")
    lines.append("}")
    if only_once and any("kiln_where<" in line for line in lines):
        # g++'s tree-PRE, once float compares may be speculated (-fno-trapping-math), turns a
        # pointwise nest of selects between loads (max pooling's padded window) into loads it no
        # longer sees as affine, and the loop stays scalar (10x slower); reductions keep PRE (it
        # is worth 30% to a masked softmax)
        lines[1] = lines[1].replace('extern "C" void', 'extern "C" __attribute__((optimize("no-tree-pre"))) void', 1)
    return "\n".join(lines)


def print_module(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer]) -> str:
    return PRELUDE + "\n\n" + "\n\n".join(print_kernel(k, buffers) for k in kernels) + "\n"


def build(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer]) -> dict:
    """Compile all `kernels` into one shared library; return name -> callable(tensors..., ints...)."""
    return restore(saved(kernels, buffers))


def saved(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer]) -> dict:
    """What the warm-start cache keeps of built kernels (JSON): the library's source (its binary is
    cached by source hash) and each kernel's name and arity."""
    return {"module": print_module(kernels, buffers),
            "kernels": [(k.name, len(k.buffer_args), len(k.size_args)) for k in kernels]}


def restore(entry: dict) -> dict:
    """`build`'s result again from what `saved` kept."""
    from kiln.runtime.cpp_build import load_library
    lib = load_library(entry["module"])
    return {name: lib.function(name, n_ptr, n_int) for name, n_ptr, n_int in entry["kernels"]}
