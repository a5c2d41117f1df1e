"""logspace computed as `_logspace` in kiln/prims/decompositions/creation.py says: bounds rounded to
the dtype, exponents and powers in double, one rounding at the end. Found by the bfloat16 OpInfo
sweep: with the exponents in bfloat16, logspace(-38, 38) was off by up to 30%."""
import pytest
import torch

import kiln


def _both(fn, *args):
    kiln.reset()
    return fn(*args), kiln.compile(fn, backend="kiln", fullgraph=True)(*args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("start,end,steps,base", [(-38.0, 38.0, 60, 10.0), (0.3, 9.7, 7, 2.0),
                                                   (5.0, -5.0, 11, 3.0), (1.7, 1.7, 1, 10.0), (0, 4, 0, 2.0)])
def test_logspace_equals_eagers_values(dtype, start, end, steps, base):
    if dtype.is_floating_point is False and start < 0:
        pytest.skip("negative exponents of an integer logspace truncate to 0 in both; covered by the others")
    if dtype == torch.float16 and abs(start) > 15:
        pytest.skip("10**38 is past float16's range")

    def fn(x):
        return x + torch.logspace(start, end, steps, base=base, dtype=dtype)
    want, got = _both(fn, torch.zeros((), dtype=dtype))
    assert got.dtype == want.dtype and got.shape == want.shape
    # eager's float32 exponents are sometimes an ulp from double's: within two of eager's, ints exact
    two_ulps = 2 * torch.finfo(dtype).eps if dtype.is_floating_point else 0
    torch.testing.assert_close(got, want, rtol=two_ulps, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_logspace_of_tensor_bounds_equals_eagers(dtype):
    def fn(lo, hi):
        return torch.logspace(lo, hi, 33, base=10.0, dtype=dtype) * 1
    want, got = _both(fn, torch.tensor(-30.0), torch.tensor(30.0))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_bfloat16_logspace_is_as_close_to_float64_as_eagers():
    def fn(x):
        return x + torch.logspace(-38.0, 38.0, 60, dtype=torch.bfloat16)
    want, got = _both(fn, torch.zeros((), dtype=torch.bfloat16))
    truth = torch.logspace(-38.0, 38.0, 60, dtype=torch.float64)
    rel = lambda t: ((t.double() - truth).abs() / truth).max().item()
    assert rel(got) <= rel(want) <= 2 ** -8
