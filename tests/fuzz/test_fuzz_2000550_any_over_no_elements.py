"""Found by `python -m kiln.testing.fuzz --device cuda --half` (seed 2000550, an H100), shrunk by hand:
`x[:, :, :0].any()` decomposes to a max of bools over no elements, which lowered as a reduction
kernel whose index divided by the empty dim's size (`r // 0`); Triton's GPU compiler failed on it
("PassManager::run failed"), and the interpreter warned of a division by zero. A max or min over no
elements is now its identity (lowering.EMPTY_REDUCTION), as sums and products were."""
import warnings

import pytest
import torch

import kiln


@pytest.mark.parametrize("reduce", [lambda v: v.any(), lambda v: v.all(), lambda v: v.any(dim=2),
                                    lambda v: v.all(dim=2).float().sum()])
def test_reductions_of_bools_over_no_elements(reduce):
    def f(x):
        return reduce(x.ge(0.5)[:, :, :0])
    x = torch.rand(6, 6, 7, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # the interpreter's division by zero
        got = kiln.compile(f, options={"triton_interpret": True})(x)
    expected = f(x)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
