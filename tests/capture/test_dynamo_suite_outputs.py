"""A compiled function's outputs are as many tensors as eager's, each with eager's autograd state,
as test_repros.py of the Dynamo suite (issue #39) checks: two outputs computed by one expression
are two storages, not one ([Note: outputs stay distinct] in kiln/aot/cse.py)."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from capture_support import assert_same


def compiled(fn, backend):
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kiln.compile(fn, backend=backend)


def twice(val):
    return val * 2, val * 2


def twice_then_index(val):
    x, y = val * 2, val * 2
    return x[0], y[0]


def once_without_grad(val):
    with torch.no_grad():
        out0 = val + 1
    out1 = val + 1
    return out0, out1


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("fn", [twice, twice_then_index])
def test_equal_outputs_are_distinct_storages(fn, backend):
    x = torch.randn(2, requires_grad=True)
    got = compiled(fn, backend)(x)
    assert_same(got, fn(x))
    assert got[0].untyped_storage().data_ptr() != got[1].untyped_storage().data_ptr()
    got[0].detach().add_(1)      # a write into one output leaves the other as it was
    assert_same(got[1], fn(x)[1])


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_equal_outputs_keep_their_own_requires_grad(backend):
    x = torch.randn(2, requires_grad=True)
    expected = once_without_grad(x)
    got = compiled(once_without_grad, backend)(x)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in expected] == [False, True]
    got[1].sum().backward()
    assert_same(x.grad, torch.ones(2))


def used_twice_inside(x):
    return (x * 2).sin() + (x * 2).cos()


def test_values_used_inside_the_graph_are_still_merged():
    from kiln.aot.cse import eliminate_common_subexpressions
    from kiln.aot.trace import trace_joint
    gm = torch.fx.symbolic_trace(used_twice_inside)
    joint = trace_joint(gm, [torch.randn(3)])
    assert eliminate_common_subexpressions(joint.gm.graph) >= 1


# -- out= into a tensor the compiled code made: it is resized, as in eager ([Note: out= resizes]) --
def sigmoid_into_empty():
    out = torch.empty(0)

    def run():
        torch.sigmoid(torch.zeros(3, 5), out=out)    # `out` is a cell of the inner function
        return out.size()
    return run(), out


def sort_into_empties(x):
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
    torch.sort(x, out=(values, indices))
    return values.size(), indices.size(), values + 1, indices


def resize_grows(x):
    y = torch.empty(2)
    y.resize_(3, 4)
    return y.size(), y.fill_(1.0) + x


@pytest.mark.parametrize("fn, args", [(sigmoid_into_empty, ()), (sort_into_empties, (torch.randn(3, 5),)),
                                      (resize_grows, (torch.randn(3, 4),))])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_out_argument_made_in_compiled_code_is_resized(fn, args, backend):
    assert_same(compiled(fn, backend)(*args), fn(*args))


# -- an output that is a view of a later output ------------------------------------------------------
def view_then_base(x):
    intermediate = x.mul(2)
    return intermediate.view(-1), intermediate


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_an_output_viewing_a_later_output_is_its_view(backend, requires_grad):
    # returned from the autograd Function as one of several views, it could not be written in place
    x = torch.randn(4, requires_grad=requires_grad)
    expected, got = view_then_base(x), compiled(view_then_base, backend)(x)
    assert_same(got, expected)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]
    expected[0].mul_(2)
    got[0].mul_(2)
    assert_same(got, expected)    # the write shows through the other output, as in eager
