"""Scalar ops of the loop IR as Triton text: one table entry per op in `kiln.codegen.ir.SCALAR_OPS`.

An entry is a template over the printed arguments (`{0}`, `{1}`, ...) or a function
`(args, arg_dtypes, out_dtype) -> text` where dtypes decide the text (integer vs float division).
Some ops need a small `@triton.jit` helper; `HELPERS` holds their source, and a helper whose
GPU version calls libdevice has a second version for Triton's interpreter (which runs kernels on
CPU tensors in CI and has no libdevice): the interpreter version is a formula in `tl` ops.

Printed text calls only Triton builtins (`tl.reduce`, `tl.full`, `tl.exp`, ...) and kiln's own
helpers, never Triton's `@jit` library functions (`tl.sum`, `tl.zeros`, `tl.sigmoid`): those were
decorated when triton was imported, and so run interpreted only if `TRITON_INTERPRET=1` was set
before that import, which kiln cannot promise for kernels on CPU tensors.

Values of dtype float16/bfloat16 are computed in float32 (`compute_dtype`): loads widen, stores
narrow, and an explicit `to_dtype` to a half type rounds, so results match eager's roundings.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class Value:
    """A printed scalar expression: its text (a name or literal), the block dims it varies along
    (a subset of {"x", "r"}) and its IR dtype (half types are held in float32)."""

    text: str
    deps: frozenset
    dtype: torch.dtype

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
HALF_DTYPES = (torch.float16, torch.bfloat16)


def tl_dtype(dtype: torch.dtype) -> str:
    try:
        return TL_DTYPE[dtype]
    except KeyError:
        raise NotImplementedError(f"the Triton printer has no type for {dtype}; kiln's Triton kernels "
                                  f"handle {sorted(str(d) for d in TL_DTYPE)}") from None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF_DTYPES else dtype


def float32_block(v: Value, shape: str) -> str:
    """A printed value as float32 over the block `shape` (a value that does not vary broadcasts):
    the template printers' operands, which they multiply and sum in float32."""
    text = v.text if compute_dtype(v.dtype) == torch.float32 else f"({v.text}).to(tl.float32)"
    return text if v.deps else f"(tl.full({shape}, 0, tl.float32) + {text})"


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


# ---------------------------------------------------------------------------- helpers

# name -> (GPU source, interpreter source or None when the GPU source also runs interpreted)
HELPERS: dict[str, tuple[str, str | None]] = {}


def _helper(name: str, gpu: str, interp: str | None = None) -> None:
    HELPERS[name] = (gpu.strip("\n"), interp.strip("\n") if interp else None)


def _libdevice_1(name: str, op: str, fallback: str) -> None:
    _helper(name, f"""
@triton.jit
def {name}(x):
    return libdevice.{op}(x)
""", f"""
@triton.jit
def {name}(x):
    return {fallback}
""")


# float32 -> bfloat16 rounded to nearest even, as eager's casts. On a GPU one `cvt.rn.bf16.f32` in
# inline PTX: written as `.to()`, LLVM turned `round(a * b) + c` into bfloat16 `fma.rn.bf16x2`,
# dropping the rounding of the product that eager does (GPT-NeoX's rotary kernel differed from eager
# in 3.3% of elements on the H200). Triton's interpreter truncates (its numpy cast drops the low bits),
# so its flavour rounds the bits itself (adding 0x7FFF plus the kept lowest bit) and then truncates
# exactly. NaN stays NaN.
_helper("_k_to_bf16", """
@triton.jit
def _k_to_bf16(x):
    return tl.inline_asm_elementwise("cvt.rn.bf16.f32 $0, $1;", "=h,r", [x], dtype=tl.bfloat16,
                                     is_pure=True, pack=1)
""", """
@triton.jit
def _k_to_bf16(x):
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    rounded = bits.to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded).to(tl.bfloat16)
""")


def to_half(text: str, src: torch.dtype, out: torch.dtype) -> str:
    """Printed `text` (a value of compute dtype `src`) rounded to the half type `out`."""
    if out == torch.bfloat16:
        return f"_k_to_bf16({text if src == torch.float32 else f'({text}).to(tl.float32)'})"
    return f"({text}).to({tl_dtype(out)})"


# NaN-propagating max/min, as torch's: `tl.maximum` leaves NaN handling to the hardware.
_helper("_k_maximum", """
@triton.jit
def _k_maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)
""")
_helper("_k_minimum", """
@triton.jit
def _k_minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)
""")
_helper("_k_prod", """
@triton.jit
def _k_prod(a, b):
    return a * b
""")
_helper("_k_sum", """
@triton.jit
def _k_sum(a, b):
    return a + b
""")
_helper("_k_logaddexp", """
@triton.jit
def _k_logaddexp(a, b):
    hi = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    safe = tl.where(hi == float("-inf"), 0.0, hi)
    return tl.where(hi == float("-inf"), hi, safe + tl.log(1.0 + tl.exp(lo - safe)))
""")
# Reductions along axis 1 of a [XBLOCK, RBLOCK] block, to [XBLOCK]. On a GPU, one `tl.reduce`
# with a NaN-propagating combine. Triton's interpreter runs a custom combine once per element in
# Python, but recognizes Triton's own combines (`tl.standard._sum_combine`, `_elementwise_max`)
# and reduces with one numpy call (30x faster CI); those do not propagate NaN (numpy's nanmax),
# so the interpreter flavour adds NaN back from a count of NaNs. Same results either way.
_helper("_k_rmax", """
@triton.jit
def _k_rmax(x):
    return tl.reduce(x, 1, _k_maximum)
""", """
@triton.jit
def _k_rmax(x):
    nans = tl.reduce((x != x).to(tl.int32), 1, tl.standard._sum_combine)
    return tl.where(nans > 0, float("nan"), tl.reduce(x, 1, tl.standard._elementwise_max))
""")
_helper("_k_rmin", """
@triton.jit
def _k_rmin(x):
    return tl.reduce(x, 1, _k_minimum)
""", """
@triton.jit
def _k_rmin(x):
    nans = tl.reduce((x != x).to(tl.int32), 1, tl.standard._sum_combine)
    return tl.where(nans > 0, float("nan"), tl.reduce(x, 1, tl.standard._elementwise_min))
""")
# argmax/argmin of (value, index) blocks: the extreme value (NaN beats everything, as in eager)
# at the smallest index holding it, so the first occurrence wins ties. GPU: one tuple reduction;
# interpreter: the extreme, then the smallest index where it occurs (two vectorized reductions).
_helper("_k_rargmax", """
@triton.jit
def _k_rargmax(v, i):
    _, idx = tl.reduce((v, i), 1, _k_argmax)
    return idx
""", """
@triton.jit
def _k_rargmax(v, i):
    best = _k_rmax(v)[:, None]
    hit = (v == best) | ((v != v) & (best != best))
    return tl.reduce(tl.where(hit, i, 2147483647), 1, tl.standard._elementwise_min)
""")
_helper("_k_rargmin", """
@triton.jit
def _k_rargmin(v, i):
    _, idx = tl.reduce((v, i), 1, _k_argmin)
    return idx
""", """
@triton.jit
def _k_rargmin(v, i):
    best = _k_rmin(v)[:, None]
    hit = (v == best) | ((v != v) & (best != best))
    return tl.reduce(tl.where(hit, i, 2147483647), 1, tl.standard._elementwise_min)
""")
# argmax/argmin: NaN counts as the largest/smallest value; ties keep the first index, as eager.
_helper("_k_argmax", """
@triton.jit
def _k_argmax(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    take_a = (a > b) | (a_nan & ~b_nan) | (((a == b) | (a_nan & b_nan)) & (ai < bi))
    return tl.where(take_a, a, b), tl.where(take_a, ai, bi)
""")
_helper("_k_argmin", """
@triton.jit
def _k_argmin(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    take_a = (a < b) | (a_nan & ~b_nan) | (((a == b) | (a_nan & b_nan)) & (ai < bi))
    return tl.where(take_a, a, b), tl.where(take_a, ai, bi)
""")
# Combines per-lane Welford partials (mean, m2, count) of a looped reduction across lanes with
# the parallel-variance formula, through sums only (see `_k_rmax` on why sums).
_helper("_k_rwelford", """
@triton.jit
def _k_rwelford(mean, m2, n):
    total = tl.reduce(n, 1, tl.standard._sum_combine)[:, None]
    safe = tl.where(total == 0.0, 1.0, total)
    avg = tl.reduce(mean * n, 1, tl.standard._sum_combine)[:, None] / safe
    dev = mean - avg
    spread = tl.reduce(m2 + n * dev * dev, 1, tl.standard._sum_combine)[:, None]
    return avg, spread
""")
# [Note: eager's layer_norm statistics] (kiln/codegen/triton/reductions.py): the combine of two
# per-thread Welford states as eager's CUDA layer_norm writes it, multiply-adds included.
_helper("_k_ln_combine", """
@triton.jit
def _k_ln_combine(own_m, own_s, own_n, oth_m, oth_s, oth_n):
    delta = own_m - oth_m
    count = oth_n + own_n
    coef = tl.where(count > 0, tl.div_rn(1.0, tl.where(count > 0, count, 1.0)), 0.0)
    n_oth = oth_n * coef
    mean = tl.fma(n_oth, oth_m, (own_n * coef) * own_m)
    m2 = tl.fma((delta * delta) * oth_n, own_n * coef, oth_s + own_s)
    return tl.where(count > 0, mean, 0.0), tl.where(count > 0, m2, 0.0), count
""")
_helper("_k_floordiv_int", """
@triton.jit
def _k_floordiv_int(a, b):
    q = a // b
    return q - (((a % b) != 0) & ((a < 0) != (b < 0))).to(q.dtype)
""")
_helper("_k_remainder_int", """
@triton.jit
def _k_remainder_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
""")
_helper("_k_remainder_float", """
@triton.jit
def _k_remainder_float(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
""")
_helper("_k_pow", """
@triton.jit
def _k_pow(a, b):
    return libdevice.pow(a, b)
""", """
@triton.jit
def _k_pow(a, b):
    mag = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    half = b * 0.5
    odd = tl.where(b_int, tl.floor(half) != half, False)
    # a < 0: odd integer powers are negative, integer powers positive, the rest NaN (as pow)
    out = tl.where(a < 0, tl.where(odd, -mag, tl.where(b_int, mag, float("nan"))), mag)
    return tl.where(b == 0.0, 1.0, out)
""")
_helper("_k_atan2", """
@triton.jit
def _k_atan2(a, b):
    return libdevice.atan2(a, b)
""", """
@triton.jit
def _k_atan2(a, b):
    # C's atan2 at the edges too: signed zeros (1 / -0.0 < 0) pick the half-plane, atan2(0, 0)
    # is 0 or +-pi rather than atan(0 / 0) = NaN (fuzz seed 200043 of --triton-interpret), and
    # two infinities give +-pi/4 or +-3pi/4
    a_neg = (a < 0) | ((a == 0) & (1.0 / tl.where(a == 0, a, 1.0) < 0))   # as _k_copysign's
    b_neg = (b < 0) | ((b == 0) & (1.0 / tl.where(b == 0, b, 1.0) < 0))
    both_inf = (tl.abs(a) == float("inf")) & (tl.abs(b) == float("inf"))
    over_zero = tl.where((a == 0) | (a != a), a, tl.where(a_neg, float("-inf"), float("inf")))   # a / +-0
    ratio = tl.where(both_inf, tl.where(a_neg == b_neg, 1.0, -1.0),
                     tl.where(b == 0, over_zero, a / tl.where(b == 0, 1.0, b)))
    left = b_neg & ((b != 0) | (a == 0))      # x / -0.0 is +-pi/2 already
    return _k_atan(ratio) + tl.where(left, tl.where(a_neg, -3.141592653589793, 3.141592653589793), 0.0)
""")
_helper("_k_round", """
@triton.jit
def _k_round(x):
    return libdevice.nearbyint(x)
""", """
@triton.jit
def _k_round(x):
    # half to even, as nearbyint. From floor(x), whose distance to x is exact: floor(x + 0.5)
    # rounded x + 0.5 first (0.49999997 went to 1, 2**23 + 1 to 2**23 + 2). A zero keeps x's sign:
    # round(-0.3) is -0.0, and copysign(1, it) -1 (fuzz seed 560033 of --triton-interpret)
    r = tl.floor(x)
    d = x - r
    up = (d > 0.5) | ((d == 0.5) & ((r % 2.0) != 0.0))
    r = tl.where(up, r + 1.0, r)
    return tl.where(r == 0.0, x * 0.0, r)
""")
_libdevice_1("_k_exp", "exp", "tl.exp(x)")   # libdevice's expf, as eager's kernels: [Note: eager's CUDA math]
_libdevice_1("_k_rcp", "rcp_rn", "1.0 / x")    # 1 / x rounded once, as div_rn(1, x), in fewer instructions
_libdevice_1("_k_trunc", "trunc", "tl.where(x < 0, tl.ceil(x), tl.floor(x))")
_libdevice_1("_k_tanh", "tanh", "1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)")
_libdevice_1("_k_expm1", "expm1",
             "tl.where(tl.abs(x) < 1e-5, x + 0.5 * x * x, tl.exp(x) - 1.0)")
_libdevice_1("_k_log1p", "log1p",
             "tl.where(tl.abs(x) < 1e-4, x - 0.5 * x * x + x * x * x / 3.0, tl.log(1.0 + x))")
_libdevice_1("_k_tan", "tan", "tl.sin(x) / tl.cos(x)")
_libdevice_1("_k_sinh", "sinh", "0.5 * (tl.exp(x) - tl.exp(-x))")
_libdevice_1("_k_cosh", "cosh", "0.5 * (tl.exp(x) + tl.exp(-x))")
_libdevice_1("_k_asinh", "asinh", "tl.where(x < 0, -1.0, 1.0) * tl.log(tl.abs(x) + tl.sqrt(x * x + 1.0))")
_libdevice_1("_k_acosh", "acosh", "tl.log(x + tl.sqrt(x * x - 1.0))")
_libdevice_1("_k_atanh", "atanh", "0.5 * tl.log((1.0 + x) / (1.0 - x))")
_libdevice_1("_k_erfc", "erfc", "1.0 - tl.math.erf(x)")
_libdevice_1("_k_signbit", "signbit", "(x < 0) | ((x == 0) & ((1.0 / x) < 0))")
_libdevice_1("_k_atan", "atan",
             # Reduced to [0, 1] by atan(x) = pi/2 - atan(1/x), then an odd minimax polynomial.
             "_k_atan_poly(x)")
_helper("_k_atan_poly", """
@triton.jit
def _k_atan_poly(x):
    ax = tl.abs(x)
    inv = ax > 1.0
    t = tl.where(inv, 1.0 / ax, ax)
    t2 = t * t
    p = t * (0.99997726 + t2 * (-0.33262347 + t2 * (0.19354346 + t2 * (-0.11643287
        + t2 * (0.05265332 + t2 * -0.01172120)))))
    p = tl.where(inv, 1.5707963267948966 - p, p)
    return tl.where(x < 0, -p, p)
""")
_libdevice_1("_k_asin", "asin", "_k_atan(x / tl.sqrt(1.0 - x * x))")
_libdevice_1("_k_acos", "acos", "1.5707963267948966 - _k_asin(x)")
_helper("_k_hypot", """
@triton.jit
def _k_hypot(a, b):
    return libdevice.hypot(a, b)
""", """
@triton.jit
def _k_hypot(a, b):
    return tl.sqrt(a * a + b * b)
""")
_helper("_k_copysign", """
@triton.jit
def _k_copysign(a, b):
    return libdevice.copysign(a, b)
""", """
@triton.jit
def _k_copysign(a, b):
    # 1 / -0.0 < 0 finds the sign of a zero; `tl.where` makes a tensor of a constant argument,
    # whose Python `1.0 / 0.0` would raise (fuzz seed 1000340: copysign of a zero fill)
    neg = (b < 0) | ((b == 0) & ((1.0 / tl.where(b == 0, b, 1.0)) < 0))
    return tl.where(neg, -tl.abs(a), tl.abs(a))
""")

# Random numbers from (seed, offset). GPU: Triton's Philox (`tl.rand`/`tl.randn`). Those are
# Triton `@jit` library functions, which run interpreted only if TRITON_INTERPRET was set before
# triton was imported, so the interpreter flavour is a counter-based hash of its own (a different
# stream: random values are never compared with eager's, only for range, shape and determinism).
_helper("_k_rand", """
@triton.jit
def _k_rand(seed, offset):
    return tl.rand(seed.to(tl.int32), offset.to(tl.int32))
""", """
@triton.jit
def _k_rand(seed, offset):
    h = (offset.to(tl.uint32) * 2654435769) ^ (seed.to(tl.uint32) * 2246822519 + 374761393)
    h = h ^ (h >> 16)
    h = h * 2146121005
    h = h ^ (h >> 15)
    h = h * 2221713035
    h = h ^ (h >> 16)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)
""")
_helper("_k_randn", """
@triton.jit
def _k_randn(seed, offset):
    return tl.randn(seed.to(tl.int32), offset.to(tl.int32))
""", """
@triton.jit
def _k_randn(seed, offset):
    u1 = tl.maximum(_k_rand(seed, offset), 1e-7)
    u2 = _k_rand(seed ^ 1540483477, offset)
    return tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * u2)
""")

# Helpers that call other helpers, per flavour (interpreter / GPU); callees are printed too.
HELPER_DEPS = {"_k_rargmax": ("_k_rmax",), "_k_rargmin": ("_k_rmin",), "_k_atan": ("_k_atan_poly",),
               "_k_asin": ("_k_atan", "_k_atan_poly"), "_k_acos": ("_k_asin", "_k_atan", "_k_atan_poly"),
               "_k_atan2": ("_k_atan", "_k_atan_poly"), "_k_randn": ("_k_rand",)}
GPU_HELPER_DEPS: dict[str, tuple[str, ...]] = {"_k_rmax": ("_k_maximum",), "_k_rmin": ("_k_minimum",),
                                                "_k_rargmax": ("_k_argmax",), "_k_rargmin": ("_k_argmin",)}
# Ops only libdevice provides; under the interpreter they raise a clear error at print time.
LIBDEVICE_ONLY = {"erfinv": "erfinv", "lgamma": "lgamma", "nextafter": "nextafter"}


# ---------------------------------------------------------------------------- the op table

Printer = Callable[[Sequence[str], Sequence[torch.dtype], torch.dtype], str]


def _template(text: str) -> Printer:
    return lambda args, dtypes, out: text.format(*args)


def _call(helper: str) -> Printer:
    return lambda args, dtypes, out: f"{helper}({', '.join(args)})"


def _by_kind(float_text: Printer, int_text: Printer) -> Printer:
    return lambda args, dtypes, out: (float_text if _is_float(dtypes[0]) else int_text)(args, dtypes, out)


def _by_float32(fp32_text: str, other_text: str) -> Printer:
    """[Note: eager's CUDA math] For float32 (and half types, computed in it) Triton's `/` and
    `tl.sqrt` are approximations (PTX div.full, sqrt.approx) and `tl.exp` a bare ex2.approx; eager's
    CUDA kernels divide and take roots correctly rounded and call libdevice's expf. Printing the
    same operations gives eager's values bit for bit, so a bf16 result rounds as eager's does (in
    GPT-NeoX's generate() the tokens depend on it). float64 `/` and `sqrt` are IEEE already."""
    def printer(args, dtypes, out):
        return (fp32_text if compute_dtype(dtypes[0]) == torch.float32 else other_text).format(*args)
    return printer


def _float_only(text: str) -> Printer:
    # floor/ceil/round/trunc of an integer is the integer itself.
    return _by_kind(_template(text), _template("{0}"))


def _is_literal(text: str) -> bool:
    """Whether printed `text` is a Python literal (a 32-bit constant: `Printer.constant`)."""
    if text in ("True", "False") or text.startswith('float("'):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _to_dtype(args, dtypes, out):
    src = dtypes[0]
    if _is_literal(args[0]):
        # a literal has no `.to`: a typed block of one does (a float16 zero under autocast,
        # `(0.0).to(tl.float16)`, failed: fuzz seed 560045 of --triton-interpret)
        args = [f"tl.full([1], {args[0]}, {tl_dtype(compute_dtype(src))})"] + list(args[1:])
    if out == torch.bool:
        return f"({args[0]} != 0)"
    if out in HALF_DTYPES:
        # Round as eager would, then keep computing in float32.
        return f"{to_half(args[0], compute_dtype(src), out)}.to(tl.float32)"
    if src == out or (src in HALF_DTYPES and out == torch.float32):
        return args[0]
    return f"{args[0]}.to({tl_dtype(out)})"


def _bitcast(args, dtypes, out):
    value = args[0]
    if dtypes[0] in HALF_DTYPES:
        value = f"{value}.to({tl_dtype(dtypes[0])})"
    text = f"{value}.to({tl_dtype(out)}, bitcast=True)"
    return f"{text}.to(tl.float32)" if out in HALF_DTYPES else text


# Constant exponents torch's own pow kernels special-case (same results as theirs, and cheaper).
POW_BY_CONSTANT = {2.0: "({0} * {0})", 3.0: "({0} * {0} * {0})", 0.5: "tl.sqrt({0})", 1.0: "{0}",
                   -1.0: "(1.0 / {0})", -0.5: "tl.rsqrt({0})", -2.0: "(1.0 / ({0} * {0}))"}


def _literal(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _pow(args, dtypes, out):
    if not _is_float(out):
        raise NotImplementedError("integer pow is not printed for Triton; lowering should compute it in float")
    exponent = _literal(args[1])
    if exponent is None:
        return f"_k_pow({args[0]}, {args[1]})"
    if exponent in POW_BY_CONSTANT:
        return POW_BY_CONSTANT[exponent].format(args[0])
    # Any other constant goes in as a typed block of one, so the helper sees a tensor.
    return f"_k_pow({args[0]}, tl.full([1], {args[1]}, {tl_dtype(compute_dtype(out))}))"


def _sign(args, dtypes, out):
    x = args[0]
    if dtypes[0] == torch.bool:
        return x
    t = tl_dtype(compute_dtype(out))
    return f"(({x} > 0).to({t}) - ({x} < 0).to({t}))"      # sign(NaN) is 0 in torch, as here


def _logical(op: str) -> Printer:
    # Through int8: Triton's interpreter fails `&` between a scalar and a block of int1 (GPU
    # code is the same either way: the casts fold away).
    return lambda args, dtypes, out: f"(({_int8_truth(args[0])} {op} {_int8_truth(args[1])}) != 0)"


def _int8_truth(text: str) -> str:
    if text in ("True", "False"):   # a constant prints as a Python bool, which has no `.to`
        return f"tl.full([1], {int(text == 'True')}, tl.int8)"
    return f"({text} != 0).to(tl.int8)"


def _bitwise(op: str) -> Printer:
    def printer(args, dtypes, out):
        if dtypes[0] == torch.bool:
            return _logical(op)(args, dtypes, out)
        return f"({args[0]} {op} {args[1]})"
    return printer


OPS: dict[str, Printer] = {
    "neg": _template("(-{0})"),
    "abs": _template("tl.abs({0})"),
    "exp": _call("_k_exp"),
    "exp2": _template("tl.exp2({0})"),
    "expm1": _call("_k_expm1"),
    "log": _template("tl.log({0})"),
    "log2": _template("tl.log2({0})"),
    "log10": _template("(tl.log({0}) * 0.4342944819032518)"),
    "log1p": _call("_k_log1p"),
    "sqrt": _by_float32("tl.sqrt_rn({0})", "tl.sqrt({0})"),
    "rsqrt": _template("tl.rsqrt({0})"),
    "sin": _template("tl.sin({0})"),
    "cos": _template("tl.cos({0})"),
    "tan": _call("_k_tan"),
    "asin": _call("_k_asin"),
    "acos": _call("_k_acos"),
    "atan": _call("_k_atan"),
    "sinh": _call("_k_sinh"),
    "cosh": _call("_k_cosh"),
    "tanh": _call("_k_tanh"),
    "asinh": _call("_k_asinh"),
    "acosh": _call("_k_acosh"),
    "atanh": _call("_k_atanh"),
    "erf": _template("tl.math.erf({0})"),
    "erfc": _call("_k_erfc"),
    "erfinv": _template("libdevice.erfinv({0})"),
    "lgamma": _template("libdevice.lgamma({0})"),
    # not eager's expf and IEEE division: those made a gelu * sigmoid chain compute-bound on the
    # H200 (86% of copy bandwidth against 94%)
    "sigmoid": _template("(1.0 / (1.0 + tl.exp(-{0})))"),
    "reciprocal": _by_float32("_k_rcp({0})", "(1.0 / {0})"),
    "floor": _float_only("tl.floor({0})"),
    "ceil": _float_only("tl.ceil({0})"),
    "round": _float_only("_k_round({0})"),
    "trunc": _float_only("_k_trunc({0})"),
    "sign": _sign,
    "signbit": _by_kind(_call("_k_signbit"), _template("({0} < 0)")),
    "isnan": _template("({0} != {0})"),
    "isinf": _by_kind(_template("(tl.abs({0}) == float('inf'))"), _template("({0} != {0})")),
    "isfinite": _by_kind(_template("(tl.abs({0}) < float('inf'))"), _template("({0} == {0})")),
    "logical_not": _template("({0} == 0)"),
    "bitwise_not": _by_kind(_template("(~{0})"), _template("(~{0})")),
    "relu": _template("tl.where({0} < 0, 0, {0})"),
    "frac": _template("({0} - _k_trunc({0}))"),
    "to_dtype": _to_dtype,
    "bitcast": _bitcast,
    "add": _template("({0} + {1})"),
    "sub": _template("({0} - {1})"),
    "mul": _template("({0} * {1})"),
    # On integers (a prim `div` without rounding mode) truediv truncates, as C division and
    # Triton's integer `//` do.
    "truediv": _by_kind(_by_float32("tl.div_rn({0}, {1})", "({0} / {1})"), _template("({0} // {1})")),
    "floordiv": _by_kind(_template("tl.floor({0} / {1})"), _call("_k_floordiv_int")),
    "remainder": _by_kind(_call("_k_remainder_float"), _call("_k_remainder_int")),
    "fmod": _template("({0} % {1})"),
    "pow": _pow,
    "atan2": _call("_k_atan2"),
    "maximum": _call("_k_maximum"),
    "minimum": _call("_k_minimum"),
    "hypot": _call("_k_hypot"),
    "copysign": _call("_k_copysign"),
    "nextafter": _template("libdevice.nextafter({0}, {1})"),
    "bitwise_and": _bitwise("&"),
    "bitwise_or": _bitwise("|"),
    "bitwise_xor": _bitwise("^"),
    "left_shift": _template("({0} << {1})"),
    "right_shift": _template("({0} >> {1})"),
    "eq": _template("({0} == {1})"),
    "ne": _template("({0} != {1})"),
    "lt": _template("({0} < {1})"),
    "le": _template("({0} <= {1})"),
    "gt": _template("({0} > {1})"),
    "ge": _template("({0} >= {1})"),
    "logical_and": _logical("&"),
    "logical_or": _logical("|"),
    "logical_xor": _logical("^"),
    "where": _template("tl.where({0}, {1}, {2})"),
    "rand": _call("_k_rand"),
    "randn": _call("_k_randn"),
}


def helpers_in(text: str) -> list[str]:
    """The helper names a piece of printed text calls."""
    used = set(re.findall(r"\b_k_\w+", text))
    return [name for name in HELPERS if name in used]


def helper_source(names: Sequence[str], interpret: bool) -> str:
    """Source of the named helpers and what they call, each once, callees first."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        deps = HELPER_DEPS.get(name, ()) if interpret else GPU_HELPER_DEPS.get(name, ())
        for dep in deps:
            visit(dep)
        order.append(name)

    for name in names:
        visit(name)
    parts = []
    for name in order:
        gpu, interp = HELPERS[name]
        parts.append(interp if (interpret and interp is not None) else gpu)
    return "\n\n\n".join(parts)
