"""Outputs come back in eager's layout: a returned view of an extern's result (index_put's, after the
permutes that index_copy_ along a middle dim becomes) is taken as the output only where its strides
are the output's; else the output is stored in eager's strides. A static KV cache made by
`torch.zeros` and filled by `index_copy_` in the prefill came back dim-permuted: not contiguous,
so `cache.view(-1)` failed where eager's works, and attention read the cache strided every step."""
import torch

import kiln


def _filled(x, position):
    cache = torch.zeros(2, 4, 10, 16)
    cache.index_copy_(2, position, x)
    return cache


class _Layer(torch.nn.Module):
    def forward(self, x, position):
        self.cache = torch.zeros(2, 4, 10, 16)
        self.cache.index_copy_(2, position, x)
        return x.sum()


def test_a_tensor_filled_in_place_keeps_eager_strides():
    x, position = torch.randn(2, 4, 3, 16), torch.tensor([4, 0, 7])
    kiln.reset()
    got, expected = kiln.compile(_filled)(x, position), _filled(x, position)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride()
    assert got.view(-1).shape == (2 * 4 * 10 * 16,)


def test_an_attribute_filled_in_place_keeps_eager_strides():
    x, position = torch.randn(2, 4, 3, 16), torch.tensor([4, 0, 7])
    eager, layer = _Layer(), _Layer()
    kiln.reset()
    kiln.compile(layer)(x, position)
    eager(x, position)
    torch.testing.assert_close(layer.cache, eager.cache)
    assert layer.cache.stride() == eager.cache.stride()


def test_a_permuted_output_eager_returns_permuted_stays_a_view():
    # eager's own result is the permuted view here: no copy is owed
    def permuted(a, b):
        return (a @ b).permute(1, 0)
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    kiln.reset()
    got = kiln.compile(permuted)(a, b)
    torch.testing.assert_close(got, permuted(a, b))
    assert got.stride() == permuted(a, b).stride()
