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


def test_complex_magnitude_angle_and_sgn():
    """abs of a complex tensor is real (the hypot of its parts), angle is the atan2 of its parts, and
    sgn is z / |z| with 0 at 0. Before, the prim abs kept the complex dtype in its meta while its
    reference returned a real tensor, and sgn and angle took real sign's comparisons (gt on
    complex64), so polar's gradient failed on every input."""
    z = torch.randn(7, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    z[2] = 0
    for fn in (torch.abs, lambda z: z.abs() + 1, torch.sgn, lambda z: torch.sgn(z) * z.abs(), lambda z: z / z.abs(),
               torch.linalg.vector_norm, lambda z: torch.linalg.vector_norm(z, 3.0) + 1, torch.angle,
               lambda z: torch.angle(z) * 2):
        kiln.reset()
        want, got = fn(z), kiln.compile(fn, fullgraph=True)(z)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("shapes", [((5,), (5,)), ((0, 1, 3), (0, 10, 3))])
def test_polar_gradient(shapes):
    g = torch.Generator().manual_seed(0)
    m, t = torch.rand(shapes[0], generator=g), torch.randn(shapes[1], generator=g)
    kiln.reset()
    (me, te), (mk, tk) = [(m.clone().requires_grad_(), t.clone().requires_grad_()) for _ in range(2)]
    want, got = torch.polar(me, te), kiln.compile(torch.polar, fullgraph=True)(mk, tk)
    torch.testing.assert_close(got, want)
    cot = torch.randn(want.shape, dtype=want.dtype, generator=g)
    for a, b in zip(torch.autograd.grad(got, (mk, tk), cot), torch.autograd.grad(want, (me, te), cot)):
        torch.testing.assert_close(a, b)


def _c(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.complex64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,fn", [
    ("vdot conjugates its first vector", lambda x, y: torch.vdot(x, y)),
    ("vecdot of one element", lambda x, y: torch.linalg.vecdot(x[:1], y[:1])),
    ("lerp with a complex weight", lambda x, y: torch.lerp(x, y, y * 0.3)),
    ("linspace of complex bounds", lambda x, y: x + torch.linspace(1 + 2j, 3 - 1j, 5)),
    ("logspace of complex bounds", lambda x, y: x + torch.logspace(0.1 + 0.2j, 1 - 0.5j, 5, dtype=torch.complex64)),
    ("var is real", lambda x, y: torch.var(torch.outer(x, y), dim=1)),
    ("std_mean", lambda x, y: torch.std_mean(torch.outer(x, y), 0, correction=0)),
])
def test_complex_values_equal_eagers(name, fn):
    """Found by the complex64 OpInfo sweep: vdot and the one-element vecdot did not conjugate,
    linspace and logspace of complex bounds kept only the real parts, and var and std squared the
    complex deviations and returned a complex dtype (all silently wrong); lerp's |weight| refused a
    complex weight."""
    x, y = _c(5), _c(5, seed=1)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn, fullgraph=True)(x, y), fn(x, y))


@pytest.mark.parametrize("fn", [torch.tanh, torch.sigmoid, torch.nn.functional.tanhshrink])
def test_tanh_and_sigmoid_gradients_of_complex_inputs_are_conjugated(fn):
    """d tanh(z) carries conj(1 - tanh(z)^2) in eager's backward (and sigmoid's conj(s (1 - s)));
    the decompositions had no conj."""
    _compare_with_gradient(fn, _c(6))
