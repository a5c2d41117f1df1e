"""as_strided addresses its input's storage, not the buffer kiln realizes it in ([Note: as_strided
positions] in kiln/codegen/lowering_rules.py): diagonal and unfold of slices, of transposes, and of
inputs that are views with a storage offset, compiled vs eager."""
import torch

import kiln


def computed(x):
    v = x.clamp(min=0.1)
    return (v[1::2].diagonal(), v[:, 1:].diagonal(), v.t()[1:].diagonal(1), v.unfold(1, 2, 1)[:, 1:],
            v.diagonal(), v[:, ::2].diagonal())


def of_input(x):
    return x[1:].diagonal() * 2, x[:, 1::2].unfold(0, 2, 1) + 1, x.as_strided((2,), (3,), 1) - 1


def test_views_of_a_computed_slice():
    x = torch.randn(2, 8)
    for ref, res in zip(computed(x), kiln.compile(computed)(x)):
        assert torch.equal(ref, res)


def test_views_of_an_offset_input():
    x = torch.randn(4, 6)[:, 1:]
    for ref, res in zip(of_input(x), kiln.compile(of_input)(x)):
        assert torch.equal(ref, res)
