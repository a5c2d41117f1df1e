"""Regression tests: an extern's output buffer takes its layout from the node's value, so a node an
earlier stage left with `meta['val'] = None` (aten.copy in quantile's decomposition) must not lower
to an extern with no output. Each compiles through the whole kiln backend and compares with float64
eager."""
import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh_compile(monkeypatch):
    # a program cached by an older codegen would hide a lowering fix: these compile fresh
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")


def _compare(fn, *inputs, rtol=1e-4, atol=1e-5):
    kiln.reset()
    got = kiln.compile(fn, backend="kiln")(*inputs)
    ref = fn(*[x.double() for x in inputs])
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol)


def test_quantile_of_a_scalar_tensor():
    # the sweep's first sample: a 0-d input; the decomposition ends in aten.copy then squeeze
    _compare(lambda x: torch.quantile(x, 0.5), torch.tensor(1.5))


def test_quantile_and_nanquantile_along_a_dim():
    x = torch.randn(4, 7)
    x[1, 2] = float("nan")
    _compare(lambda x: torch.nanquantile(x, 0.25, dim=1), x)
    _compare(lambda x: torch.quantile(x, 0.75, dim=0, keepdim=True), x.nan_to_num())


def test_stft_magnitude():
    signal = torch.randn(64)
    # a window silences stft's rectangular-window warning
    _compare(lambda s: torch.stft(s, n_fft=16, window=torch.ones(16, dtype=s.dtype), return_complex=True).abs(), signal)


def test_vector_times_matrix():
    # at::matmul squeezes the mm's result in place; aot's recorded value for the mm node then reads
    # as the squeezed shape, so codegen must not size the mm's buffer from it
    _compare(lambda x, w: torch.matmul(x, w.t()).exp(), torch.randn(3), torch.randn(4, 3))
    _compare(lambda x, w: torch.nn.functional.linear(x, w).softmax(0), torch.randn(3), torch.randn(4, 3))
