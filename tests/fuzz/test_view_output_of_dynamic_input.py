"""An output that is a view of an input is rebuilt as a view of the real input under dynamic=True
too (fuzz seed 1001145, `tests/fuzz/test_fuzz_unfold_of_dynamic_input.py`): its traced view steps
name symbolic sizes (unfold's `s0 - 1` windows), computed again from the real input's sizes at each
call. It was returned as the program's copy, in other strides than eager's, and the gradient of an
overlapping one (unfold) was wrong."""
import warnings

import pytest
import torch

import kiln

VIEWS = {
    "unfold": lambda x: x.unfold(0, 2, 1),
    "unfold of dim 1": lambda x: x.unfold(1, 2, 1),
    "diagonal": lambda x: x.diagonal(),
    "diagonal of t": lambda x: x.t().diagonal(1),
    "slice": lambda x: x[1:, ::2],
}
INPUTS = {
    "contiguous": lambda n: torch.randn(n, n + 1),
    "transposed": lambda n: torch.randn(n + 1, n).t(),
    "offset": lambda n: torch.randn(n + 1, n + 1)[1:],
}


def compare_calls(fn, make, requires_grad: bool, sizes=(5, 7), same_strides: bool = True):
    """fn compiled under dynamic=True against eager at each size: values, strides (unless not
    `same_strides`), gradient; returns whether each compiled output was a view of its input."""
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    views = []
    for n in sizes:
        x = make(n).detach().requires_grad_(requires_grad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # autograd's note on as_strided's backward
            got, ref = compiled(x), fn(x)
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
            assert got.stride() == ref.stride() or not same_strides
            views.append(got._base is x and got.storage_offset() == ref.storage_offset())
            if requires_grad:
                tangent = torch.randn(ref.shape)
                mine = torch.autograd.grad(got, x, tangent)[0]
                torch.testing.assert_close(mine, torch.autograd.grad(ref, x, tangent)[0])
    return views


@pytest.mark.parametrize("layout", INPUTS)
@pytest.mark.parametrize("view", VIEWS)
def test_view_of_a_dynamic_input_is_a_view(view, layout):
    assert all(compare_calls(VIEWS[view], INPUTS[layout], requires_grad=False))


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("view", VIEWS)
def test_view_of_a_dynamic_input_that_requires_grad(view, layout):
    assert all(compare_calls(VIEWS[view], INPUTS[layout], requires_grad=True))


@pytest.mark.parametrize("case", ["unfold of x * 2", "unfold of an offset input", "unfold of dim 1 of an offset input"])
def test_gradient_of_an_overlapping_output_of_symbolic_sizes(case):
    """An overlapping output the program computes (an unfold of `x * 2`; of an input the program
    sees as a copy in other strides) is traced with a contiguous tangent under symbolic sizes too:
    its (1, 1) strides over (s0 - 1, 2) were taken as a layout to copy the incoming gradient into,
    which kept one value per location (a static unfold's gradient was right, its recompile for a
    second size wrong). The unfold of an offset input is a copy (`InputSpec.relaid`), in other
    strides than eager's view."""
    fn, make = {"unfold of x * 2": (lambda x: (x * 2).unfold(0, 2, 1), lambda n: torch.randn(n)),
                "unfold of an offset input": (VIEWS["unfold"], INPUTS["offset"]),
                "unfold of dim 1 of an offset input": (VIEWS["unfold of dim 1"], INPUTS["offset"])}[case]
    compare_calls(fn, make, requires_grad=True, same_strides=case == "unfold of x * 2")
