"""[Note: numerics]: `options={"numerics": "fast" | "eager"}`. The default is the fastest
decomposition that passes the benchmark's accuracy rule; "eager" swaps in the rows that compute in
eager's order (layer_norm's statistics on CUDA), so a compiled model gives eager's bits."""
import pytest
import torch

import kiln
from kiln.errors import InvalidOption
from kiln.prims import decompositions_for
from kiln.prims.decompositions import normalization

aten = torch.ops.aten


def test_numerics_chooses_the_layer_norm_row():
    assert decompositions_for(set())[aten.native_layer_norm.default] is normalization.native_layer_norm
    eager = decompositions_for(set(), "eager")
    assert eager[aten.native_layer_norm.default] is normalization.native_layer_norm_in_eagers_order
    # every other row is shared but convolution's ([Note: convolution bias on CUDA]: eager keeps ATen's call)
    assert {op for op in eager if eager[op] is not decompositions_for(set())[op]} == {aten.native_layer_norm.default,
                                                                                     aten.convolution.default}


def test_an_unknown_numerics_is_refused_with_its_choices():
    with pytest.raises(InvalidOption, match="'fast' or 'eager'"):
        kiln.compile(lambda x: x, options={"numerics": "bitwise"})


@pytest.mark.parametrize("numerics", ["fast", "eager"])
def test_layer_norm_under_either_numerics_equals_eager_on_cpu(numerics):
    ln = torch.nn.LayerNorm(96)
    x = torch.randn(4, 7, 96) * 3 + 1
    kiln.reset()
    got = kiln.compile(ln, options={"numerics": numerics})(x)
    torch.testing.assert_close(got, ln(x), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_the_gpu_eager_numerics_is_bit_equal_and_fast_numerics_is_close(dtype):
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(2560, device="cuda", dtype=dtype)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = (torch.randn(512, 2560, device="cuda") * 4 + 2).to(dtype)
    r = torch.randn_like(x)

    def fn(x, r):
        return ln(x + r)
    want = fn(x, r)
    kiln.reset()
    eager_order = kiln.compile(fn, options={"numerics": "eager"})(x, r)
    assert torch.equal(eager_order, want), f"{int((eager_order != want).sum())} of {want.numel()} differ"
    kiln.reset()
    fast = kiln.compile(fn)(x, r)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(fast, want, rtol=tol, atol=tol)


def test_a_value_computed_twice_in_a_kernel_rounds_the_same_both_times():
    """[Note: no FMA contraction] in kiln/runtime/cpp_build.py: the fused kernel recomputes
    `a * b` beside the sum that read its rounded value; contracted into an FMA, `a * b - sum`
    came out as the product's rounding error, where eager's is exactly 0 (fuzz seed 2610)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 1, generator=g), torch.randn(64, 1, generator=g)

    def f(a, b):
        ab = a * b
        return ab - ab.sum(-1, keepdim=True)
    kiln.reset()
    got = kiln.compile(f)(a, b)
    assert torch.equal(got, f(a, b)), f"max abs diff {(got - f(a, b)).abs().max().item()}"


def test_layer_norm_over_one_element_gives_exactly_its_bias():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 8, 1, generator=g), torch.randn(1, generator=g), torch.randn(1, generator=g)

    def f(x, w, b):
        return torch.nn.functional.layer_norm(torch.nn.functional.rms_norm(x, (1,)), (1,), w, b)
    kiln.reset()
    got = kiln.compile(f)(x, w, b)
    assert torch.equal(got, f(x, w, b)), f"max abs diff {(got - f(x, w, b)).abs().max().item()}"


def test_group_norm_of_equal_values_is_exactly_zero_as_in_eager():
    """[Note: shifted mean]: eager's Welford gives equal values their own value as mean and a
    variance of exactly 0; a mean of sum / n rounds (15v is not always a float), and the output was
    that noise times rsqrt(eps), 1.5e-4 where eager's is 0."""
    base = torch.randn(4, 1, 1, generator=torch.Generator().manual_seed(0)) * 3

    def f(b):
        return torch.nn.functional.group_norm(b.expand(4, 6, 5), 2)
    kiln.reset()
    got = kiln.compile(f)(base)
    assert torch.equal(got, f(base)), f"max abs diff {(got - f(base)).abs().max().item()}"


@pytest.mark.parametrize("width", [15, 768])
def test_layer_norm_of_a_row_of_equal_values_is_exactly_its_bias_on_the_cpu(width):
    """[Note: shifted mean]: eager's layer norm gives a row of equal values the mean of exactly that
    value and a variance of 0; a mean of sum / n rounds, and the row came out as that noise times
    rsqrt(eps), 1.5e-4 where eager's is exactly the bias."""
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([(torch.randn(4, 1, generator=g) * 3).expand(4, width), torch.randn(2, width, generator=g)])
    w, b = torch.randn(width, generator=g), torch.randn(width, generator=g)

    def f(rows, w, b):
        return torch.nn.functional.layer_norm(rows, (width,), w, b)
    kiln.reset()
    got, expected = kiln.compile(f)(rows, w, b), f(rows, w, b)
    assert torch.equal(got[:4], expected[:4]), f"max abs diff {(got[:4] - expected[:4]).abs().max().item()}"
    torch.testing.assert_close(got, expected)
