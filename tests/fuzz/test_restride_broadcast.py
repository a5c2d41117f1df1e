"""The host program's restride into a layout with stride-0 dims (kiln/codegen/host.py `_restride`):
a dense copy of a broadcast value comes back in the broadcast layout with its values, and an empty
tensor (a zero-size dim, found by the CI fuzz seeds) is no error."""
import torch

from kiln.codegen.host import _restride


def test_dense_copy_of_a_broadcast_value():
    value = torch.randn(1, 4).expand(3, 4)
    out = _restride(value.contiguous(), (0, 1))
    assert out.stride() == (0, 1) and torch.equal(out, value)


def test_empty_tensor_into_a_broadcast_layout():
    for shape in ((0, 4), (3, 0), (2, 0, 3)):
        strides = (0,) + (1,) * (len(shape) - 1)
        out = _restride(torch.randn(shape), strides)
        assert out.shape == shape


def test_dense_layout_is_a_plain_copy():
    x = torch.randn(4, 3).t()
    out = _restride(x, (4, 1))
    assert out.stride() == (4, 1) and torch.equal(out, x)
