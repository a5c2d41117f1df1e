"""Found by `python -m kiln.testing.fuzz` (seed 1339), shrunk: crash.

call 1: CompileStageError: kiln prims stage failed: backend 'kiln': ValueError: Cannot view a tensor with shape torch.Size([4, 4]) and strides (1, 4) as a tensor with shape (16,)!

Cause: `(x * 3).long()` of a transposed `x` is column-major, as in eager (a pointwise op takes its
input's layout), and its `.mT` row-major, so `.mT.view(-1)` is a view. The write through
`.mT.select(1, 0)` was functionalized as a scatter into a contiguous copy, and the view replayed
on that new value had no view. A written base now keeps its traced layout ([Note: a written base
keeps its layout] in kiln/aot/functionalize.py).
"""
import pytest
import torch

import kiln
from kiln.testing.fuzz import regression_test
from kiln.testing.programs import Input, Program, Step

# def f(x1):
#     v2 = (x1 * 3).long()
#     v4 = v2.mT
#     v4.select(1, 0).fill_(7)
#     v14 = v4.view(-1)
#     return (v14,)

PROGRAM = Program(
    seed=1339,
    inputs=[
        Input(name='x1', shape=(4, 4), dtype='float32', layout='transposed', requires_grad=True, role='arg', seed=1339001),
    ],
    steps=[
        Step(lines=('v2 = (x1 * 3).long()',), defines=('v2',), reads=('x1',), family='unary'),
        Step(lines=('v4 = v2.mT',), defines=('v4',), reads=('v2',), family='view'),
        Step(lines=('v4.select(1, 0).fill_(7)', 'v14 = v4.view(-1)'), defines=('v14',), reads=('v4',), family='inplace'),
    ],
    outputs=['v14'],
    module=False,
)

test_fuzz_1339 = regression_test(PROGRAM)


def _transposed_write_then_flat_view(x):
    y = x * 3
    y.mT.select(1, 0).fill_(7)
    return y.mT.reshape(-1), y


def _full_overwrite_then_view(x):
    y = x * 2
    y.copy_(torch.ones(4, 6).t())  # the new value is row-major, y column-major
    return y.mT.view(-1), y.mT.view(2, 12)


def _diagonal_write_of_permuted(x):
    y = (x + 1).unsqueeze(0).permute(2, 0, 1)
    y.diagonal(dim1=1, dim2=2).zero_()
    return y.transpose(0, 2).reshape(-1), y


@pytest.mark.parametrize("fn", [_transposed_write_then_flat_view, _full_overwrite_then_view,
                                _diagonal_write_of_permuted])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_written_tensor_keeps_eager_layout(fn, requires_grad):
    base = torch.randn(4, 6).t()
    x, y = (base.clone().t().t().requires_grad_(requires_grad) for _ in range(2))
    kiln.reset()
    got, ref = kiln.compile(fn)(x), fn(y)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
        assert [st for n, st in zip(g.shape, g.stride()) if n != 1] == \
            [st for n, st in zip(r.shape, r.stride()) if n != 1]
    if requires_grad:
        tangents = [torch.randn(r.shape) for r in ref]
        torch.autograd.backward(got, tangents)
        torch.autograd.backward(ref, tangents)
        torch.testing.assert_close(x.grad, y.grad)
