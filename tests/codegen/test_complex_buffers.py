"""A dtype no kernel computes in (complex64) runs through externs, copies included.

Lowering sends every op on such a dtype to an extern (`_kernel_dtypes_ok`), but a copy of a value
(`LoweringContext.realize`: a buffer of its own for `as_strided_scatter`, an output that must not
alias an input) was a pointwise kernel, which the C++ printer refuses (`CppUnsupported: buffer dtype
torch.complex64`: fft.hfft's gradient and fft.ihfft2 of the every-sample OpInfo sweep). Each test
compiles through the whole kiln backend and compares with eager."""
import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh_compile(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")


def _compare_with_gradient(fn, x):
    kiln.reset()
    xe, xk = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = fn(xe), kiln.compile(fn, fullgraph=True)(xk)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    tangent = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(1))
    want.backward(tangent)
    got.backward(tangent)
    torch.testing.assert_close(xk.grad, xe.grad, rtol=1e-4, atol=1e-5)


def test_ihfft2_with_a_cropped_size():
    # the backward scatters the complex gradient into a zero tensor: as_strided_scatter's own copy
    x = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(0))
    _compare_with_gradient(lambda x: torch.fft.ihfft2(x, s=(3, 10), dim=(1, 2), norm="ortho"), x)


def test_hfft_gradient():
    x = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(0))
    _compare_with_gradient(lambda x: torch.fft.hfft(x, n=10, dim=1, norm="ortho"), x)



def test_polar_broadcasts_its_operands():
    """OpInfo's polar samples broadcast a 0-d angle against a vector magnitude: the decomposition
    multiplied them as they were, which prims refuse (shapes must match)."""
    for a, b in [(torch.rand(5), torch.tensor(0.3)), (torch.tensor(2.0), torch.rand(3, 4)),
                 (torch.rand(2, 1), torch.rand(1, 3))]:
        kiln.reset()
        torch.testing.assert_close(kiln.compile(lambda m, t: torch.polar(m, t), fullgraph=True)(a, b), torch.polar(a, b))
