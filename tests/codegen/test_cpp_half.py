"""float16 and bfloat16 through the C++ printer: loads widen to float, stores narrow, and values
round to the narrow type where eager's ops produce a narrow tensor ([Note: half types in C++]).

The conversions are compared with torch's own `.to()` bit for bit on every exponent, at and around
the rounding ties, on subnormals, infinities and overflow, and NaN stays NaN with its sign (eager's
own NaN bits differ between its scalar and vector paths). Chains of ops compare with eager bit for
bit, and the loops over half buffers vectorize. The zoo under bf16 autocast is in
test_cpp_half_zoo.py.
"""
import contextlib
import re
import subprocess

import pytest
import torch

import kiln

HALVES = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _fresh_compile(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")


@contextlib.contextmanager
def cpp_sources():
    """The C++ source of every module kiln prints while the block runs."""
    from kiln.codegen import cpp
    seen: list[str] = []
    original = cpp.print_module

    def recording(kernels, buffers):
        seen.append(original(kernels, buffers))
        return seen[-1]
    cpp.print_module = recording
    try:
        yield seen
    finally:
        cpp.print_module = original


def _compiled(fn, *args):
    """fn(*args) through kiln's C++ kernels, and the kernels' source (the prelude left out)."""
    kiln.reset()
    with cpp_sources() as sources:
        got = kiln.compile(fn, backend="kiln")(*args)
    kernels = "\n".join(src.split("\n// fused:", 1)[-1] for src in sources)
    assert "void kernel" in kernels, "no C++ kernel ran"
    return got, kernels


def _float_patterns() -> torch.Tensor:
    """float32 bit patterns: every sign and exponent with mantissas at and around the ties of both
    narrow types (bit 16 for bfloat16, bit 13 for float16), dense samples where float16 is
    subnormal and where it overflows, NaNs of several payloads, and random bits."""
    g = torch.Generator().manual_seed(0)
    tie_mantissas = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x17FFF, 0x18001, 0xFFFF, 0x10000,
                                  0x0FFF, 0x1000, 0x1001, 0x3000, 0x2FFF, 0x3001, 0x2000, 0x7FE000, 0x7FF000,
                                  0x7FEFFF, 0x7FF001, 0x7FFFFF, 0x400000, 0x400001])
    random_mantissas = torch.randint(0, 1 << 23, (48,), generator=g)
    mantissas = torch.cat([tie_mantissas, random_mantissas])
    exponents = torch.arange(256)
    grid = (exponents[:, None] << 23) | mantissas[None, :]
    grid = torch.cat([grid.flatten(), grid.flatten() | (1 << 31)])
    # float16's subnormal range [2^-25, 2^-14) and its overflow edge (65504 .. 65536]
    sub = torch.arange(0x33000000, 0x38800000, 997)
    edge = torch.arange(0x477FE000, 0x47800001)
    random = torch.randint(0, 1 << 32, (1 << 18,), generator=g)
    bits = torch.cat([grid, sub, edge, sub | (1 << 31), edge | (1 << 31), random])
    return bits.to(torch.int64).to(torch.int32).view(torch.float32)   # wraps to the sign bit


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, src: torch.Tensor):
    assert got.dtype == want.dtype
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), "NaN differs"
    gb, wb = got.view(torch.int16), want.view(torch.int16)
    bad = (gb != wb) & ~nan
    if bad.any():
        i = bad.nonzero()[0].item()
        raise AssertionError(f"{int(bad.sum())} of {len(src)} values differ from torch's; first: "
                             f"{src.view(torch.int32)[i].item() & 0xFFFFFFFF:#010x} -> {gb[i].item() & 0xFFFF:#06x}, "
                             f"torch's {wb[i].item() & 0xFFFF:#06x}")
    src_sign = src[nan].view(torch.int32) < 0
    assert torch.equal(gb[nan] < 0, src_sign), "a NaN lost its sign"


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_float_to_half_rounds_to_nearest_even_like_torch(dtype):
    x = _float_patterns()
    got, source = _compiled(lambda t: t.to(dtype), x)
    assert "uint16_t* __restrict__ buf" in source, source   # a kernel stored the narrow type
    _assert_same_bits(got, x.to(dtype), x)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_every_half_value_widens_to_torchs_float(dtype):
    h = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
    got, source = _compiled(lambda t: t.float(), h)
    assert "_to_float(" in source, source
    want = h.float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))


def test_float64_and_integers_to_bf16_go_through_float_as_c10s():
    # c10 converts a double to float first, then rounds to the narrow type (two roundings)
    g = torch.Generator().manual_seed(1)
    d = (torch.randn(4096, generator=g, dtype=torch.float64) * 1e3).contiguous()
    d[:3] = torch.tensor([1 + 2**-8 + 2**-30, 1 + 2**-8, 3 * 2**-9 + 2**-40], dtype=torch.float64)
    i = torch.randint(-2**40, 2**40, (4096,), generator=g)
    got, _ = _compiled(lambda a, b: (a.to(torch.bfloat16), b.to(torch.bfloat16)), d, i)
    assert torch.equal(got[0], d.to(torch.bfloat16)) and torch.equal(got[1], i.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_op_chains_round_each_result_as_eager_does(dtype):
    """Each op of a narrow type rounds its result in eager (computed in float): a product before the
    sum, a sum before the square root. Ops whose float results are correctly rounded give eager's
    values bit for bit; float16's overflow to inf is eager's too. (A scalar multiplies in float, as
    in eager; eager's CPU add and sub of a scalar round the scalar to the narrow type first, which
    kiln's decompositions do not.)"""
    g = torch.Generator().manual_seed(2)
    a, b, c = (torch.randn(5000, generator=g) * 300).to(dtype), torch.randn(5000, generator=g).to(dtype), \
        torch.randn(5000, generator=g).to(dtype)

    def fn(a, b, c):
        y = ((a * b + c) / (b.abs() + 1)).sqrt() - a
        return y, (a * a).relu() * 0.1, torch.maximum(a, c) * 3, (b * c).sum(-1), (a * c).amax(-1), \
            torch.signbit(b)     # g++ 12 crashed vectorizing std::signbit of a widened bfloat16
    got, source = _compiled(fn, a, b, c)
    want = fn(a, b, c)
    assert "kiln_round_" in source and "uint16_t*" in source, source
    for k, (x, w) in enumerate(zip(got, want)):
        assert x.dtype == w.dtype == (torch.bool if k == 5 else dtype)
        if k == 3:      # a sum's order of additions is its own
            torch.testing.assert_close(x.float(), w.float(), rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(x.isnan(), w.isnan()) and torch.equal(x[~x.isnan()], w[~w.isnan()]), k
    if dtype == torch.float16:
        assert (want[1] == float("inf")).any()   # the case is exercised


def test_a_narrow_constant_holds_its_rounded_value():
    # full(0.1, bf16) is 0.1 rounded; added to x in float, it stays the rounded 0.1
    def fn(x):
        return torch.full_like(x, 0.1) + x, x * torch.tensor(0.1, dtype=torch.float16)
    x = torch.randn(1000).bfloat16()
    got, _ = _compiled(fn, x)
    for g, w in zip(got, fn(x)):
        assert torch.equal(g, w)


def _vectorized_loops(source: str) -> list[tuple[str, str]]:
    """(kernel, g++'s vectorizer note) for each kernel of a module, compiled with the backend's
    flags and -fopt-info-vec."""
    import tempfile

    from kiln.runtime.cpp_build import CXX, CXXFLAGS
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/m.cpp"
        with open(path, "w") as f:
            f.write(source)
        proc = subprocess.run([CXX, *CXXFLAGS, "-fopt-info-vec-optimized", path, "-o", f"{d}/m.so"],
                              capture_output=True, text=True, check=True)
    lines = source.split("\n")
    starts = [(i + 1, m.group(1)) for i, line in enumerate(lines) for m in [re.search(r"void (kernel\d+)\(", line)] if m]
    notes = []
    for m in re.finditer(r"m\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr):
        line = int(m.group(1))
        owner = [name for start, name in starts if start <= line]
        if owner:
            notes.append((owner[-1], m.group(0)))
    return notes


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_loops_over_half_buffers_vectorize(dtype):
    def fn(x, y):
        return (x * y + 1).to(dtype), (x.to(dtype) * 2).sum(-1)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    kiln.reset()
    with cpp_sources() as sources:
        kiln.compile(fn, backend="kiln")(x, y)
    (source,) = sources
    kernels = set(re.findall(r"void (kernel\d+)\(", source))
    vectorized = {name for name, _ in _vectorized_loops(source)}
    assert kernels and kernels <= vectorized, (kernels - vectorized, source.split("// fused:", 1)[-1])
