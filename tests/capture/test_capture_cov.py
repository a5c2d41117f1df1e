"""torch.cov and torch.corrcoef, whose ATen kernels read Python bools off tensor data, captured
whole ([Note: checks after the graph] in kiln/capture/torch_python.py): eager's values, and eager's
errors for bad weights."""
import pytest
import torch

import kiln


def compiled(fn):
    kiln.reset()
    return kiln.compile(fn, fullgraph=True)


@pytest.mark.parametrize("shape", [(3, 7), (7,), (1, 5), (4, 1)])
@pytest.mark.parametrize("correction", [0, 1, 2, 9])
def test_cov_and_corrcoef_match_eager(shape, correction):
    x = torch.randn(shape)
    torch.testing.assert_close(compiled(lambda t: torch.cov(t, correction=correction))(x),
                               torch.cov(x, correction=correction), equal_nan=True)
    torch.testing.assert_close(compiled(torch.corrcoef)(x), torch.corrcoef(x), equal_nan=True)


def test_weighted_cov_matches_eager_with_gradients():
    x = torch.randn(3, 6, requires_grad=True)
    fw, aw = torch.tensor([1, 2, 0, 3, 1, 1]), torch.rand(6)
    fn = lambda t, f, a: t.cov(correction=1, fweights=f, aweights=a)  # noqa: E731
    want = fn(x, fw, aw)
    got = compiled(fn)(x, fw, aw)
    torch.testing.assert_close(got, want)
    (gx,) = torch.autograd.grad(got.sum(), x)
    (ex,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(gx, ex)


@pytest.mark.parametrize("fw,aw,message", [
    (torch.tensor([1, -1, 2, 1]), None, "fweights cannot be negative"),
    (None, torch.tensor([0.5, -0.1, 1.0, 1.0]), "aweights cannot be negative"),
    (torch.tensor([0, 0, 0, 0]), None, "weights sum to zero"),
])
def test_bad_weights_raise_eagers_error_after_the_graph_runs(fw, aw, message):
    x = torch.randn(2, 4)
    fn = lambda t, f, a: torch.cov(t, fweights=f, aweights=a)  # noqa: E731
    with pytest.raises(RuntimeError, match=message):
        fn(x, fw, aw)
    with pytest.raises(RuntimeError, match=message):
        compiled(fn)(x, fw, aw)


def test_a_weights_shape_mismatch_raises_eagers_error():
    kiln.reset()
    fn = kiln.compile(lambda t, f: torch.cov(t, fweights=f))     # code that raises runs as eager does
    with pytest.raises(RuntimeError, match="same numel as there are observations"):
        fn(torch.randn(2, 4), torch.tensor([1, 2]))
