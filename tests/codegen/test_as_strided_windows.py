"""as_strided over an input that is itself an overlapping view: unfold of unfold over a padded
activation, the windows of timm's halo attention (eca_halonext26ts). A storage position there has
several input elements; the lowering finds one by matching strides (`_element_by_strides`), with
no limit on the output's size. Compared with eager, forward and backward."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def halo_windows(x: torch.Tensor) -> torch.Tensor:
    kv = F.pad(x, [2, 2, 2, 2]).unfold(2, 12, 8).unfold(3, 12, 8)      # blocks of 8, windows of 12
    return kv.reshape(x.shape[0], x.shape[1], -1, 144).softmax(-1) * kv.reshape(x.shape[0], x.shape[1], -1, 144)


@pytest.mark.parametrize("channels", [4, 256])     # 256: 4.7M output elements, past _element_at's enumeration
def test_unfold_of_unfold_over_padding_matches_eager(channels):
    x = torch.randn(2, channels, 32, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    expected = halo_windows(x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    kiln.reset()
    got = kiln.compile(halo_windows, fullgraph=True)(x)
    (grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-4)


def test_an_overlapping_window_past_the_input_is_still_refused():
    base = torch.randn(40)

    def f(x):    # 5 windows of 12 at stride 8 need 44 elements: past the 40 the input has
        return torch.as_strided(x * 2, (5, 12), (8, 1)) + 1
    with pytest.raises(Exception, match="outside its input"):
        kiln.compile(f, fullgraph=True)(base)
