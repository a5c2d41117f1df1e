"""The C++ source every kernel module starts with (`PRELUDE`): headers, libmvec's vector math
declarations, and the small inline helpers the printer's op table (`kiln.codegen.cpp`) calls:
NaN-propagating max/min, Python's floor division and remainder, an inlinable float exp, erfinv,
digamma, and the float16/bfloat16 conversions ([Note: half types in C++]).

Everything here is plain C++17 that g++ inlines and vectorizes; nothing comes from c10's headers,
so a module compiles without torch's include tree.
"""
from __future__ import annotations

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
// [Note: index bounds checks] (kiln/codegen/lowering_reduce.py): whether index `i` lies in [0, n);
// where not, the kernel's error (a max-reduction of OpenMP's, private per thread and per vector
// lane, so the loop still vectorizes) becomes at least `code`.
static inline bool kiln_in_bounds(int64_t i, int64_t n, int64_t& error, int64_t code) {
  bool ok = (i >= 0) & (i < n);
  error = std::max<int64_t>(error, ok ? 0 : code);
  return ok;
}
// The index a gather reads at: `i` where in range, else row 0 (the kernel fails: its value is
// never used; lowering leaves gathers over an empty dim to ATen). A select, not a branch around
// the load, so the loop over the other dims still vectorizes (3x on a 512-token embedding).
static inline int64_t kiln_checked(int64_t i, int64_t n, int64_t& error, int64_t code) {
  return kiln_in_bounds(i, n, error, code) ? i : 0;
}
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


# [Note: half types in C++] float16 and bfloat16 buffers hold their bits (`uint16_t`); a load widens
# to float, all arithmetic is in float (eager's opmath), and a value rounds to the narrow type where
# eager's ops produce a narrow tensor: at a store, at a `to_dtype`, and after an op whose result
# dtype is narrow. Rounding is to nearest, ties to even, as c10's conversions; subnormals are kept
# (no flush to zero), overflow gives inf, and NaN stays NaN with its sign (quieted, its payload
# truncated, as the x86 conversion instructions do; eager's own NaN bits differ between its scalar
# and vector paths). The functions are written as selects over integer bit operations, so loops
# over half buffers vectorize; g++ 12's `__bf16` is a storage-only type and its `_Float16` converts
# through libgcc calls without AVX512-FP16, so neither serves.
HALF_CONVERSIONS = r"""
static inline uint32_t kiln_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float kiln_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float kiln_bf16_to_float(uint16_t h) { return kiln_float((uint32_t)h << 16); }
static inline uint16_t kiln_float_to_bf16(float f) {
  uint32_t u = kiln_bits(f);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(f != f ? ((u >> 16) | 0x40u) : rounded); }
static inline float kiln_f16_to_float(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16, em = (uint32_t)h & 0x7FFFu;
  uint32_t normal = (em << 13) + ((127 - 15) << 23), special = normal + ((128 - 16) << 23);
  // a subnormal half is its mantissa times 2^-24: exact in float, by subtracting the magic 2^-14
  float sub = kiln_float((em << 13) + (113u << 23)) - kiln_float(113u << 23);
  return kiln_float((em >= 0x7C00u ? special : (em < 0x0400u ? kiln_bits(sub) : normal)) | sign); }
static inline uint16_t kiln_float_to_f16(float f) {
  uint32_t u = kiln_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  // normal range: rebias the exponent, round the 13 dropped bits to nearest even (a carry into the
  // exponent is right, up to inf); below 2^-14 the float adder rounds against 0.5's fixed exponent
  uint32_t normal = (a + ((uint32_t)(15 - 127) << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  uint32_t sub = kiln_bits(kiln_float(a) + 0.5f) - 0x3F000000u;
  uint32_t big = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x3FFu)) : 0x7C00u;
  return (uint16_t)((a >= 0x47800000u ? big : (a < 0x38800000u ? sub : normal)) | sign); }
// a float that holds a bfloat16 value exactly (a load's, a rounded result's): its high half
static inline uint16_t kiln_bf16_bits(float f) { return (uint16_t)(kiln_bits(f) >> 16); }
// std::signbit on a widened bfloat16 in a vectorized loop crashes g++ 12 ("unrecognizable insn")
template <typename T> static inline bool kiln_signbit(T a) {
  if constexpr (std::is_same<T, float>::value) { return (kiln_bits(a) >> 31) != 0; } else { return std::signbit(a); } }
// float -> the nearest value of the narrow type, kept in float
static inline float kiln_round_bf16(float f) { return kiln_bf16_to_float(kiln_float_to_bf16(f)); }
static inline float kiln_round_f16(float f) { return kiln_f16_to_float(kiln_float_to_f16(f)); }
"""

PRELUDE = PRELUDE + HALF_CONVERSIONS
