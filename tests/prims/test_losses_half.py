"""Pointwise losses of float16 and bfloat16 give eager's bits: the decompositions round where eager's
kernels do ([Note: a loss rounds as eager's kernel] in kiln/prims/decompositions/losses.py).

Per element (reduction "none") kiln must equal eager exactly; the sum and mean add the rounded
losses in float32 and round once, as eager's do, which for these few elements gives eager's bits
too. Run through the C++ printer and, for a few, through the Triton printer under Triton's
interpreter (CPU tensors both: eager's CPU kernels are the reference)."""
import pytest
import torch
import torch.nn.functional as F

import kiln

LOSSES = {
    "mse_loss": lambda a, b, r: F.mse_loss(a, b, reduction=r),
    "l1_loss": lambda a, b, r: F.l1_loss(a, b, reduction=r),
    "huber_loss": lambda a, b, r: F.huber_loss(a, b, reduction=r),
    "huber_loss_delta_0.3": lambda a, b, r: F.huber_loss(a, b, reduction=r, delta=0.3),
    "smooth_l1_loss": lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r),
    "smooth_l1_loss_beta_2.7": lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=2.7),
    "smooth_l1_loss_beta_0": lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.0),
    "soft_margin_loss": lambda a, b, r: F.soft_margin_loss(a, b, reduction=r),
}
INTERPRETED = ("mse_loss", "huber_loss_delta_0.3", "smooth_l1_loss_beta_2.7")


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(64, generator=g) * 2).to(dtype)
    b = (torch.randn(64, generator=g) * 2).to(dtype)
    return a, b[::2].clone(), a[::2]   # a strided operand takes ATen's scalar (not vectorized) loop


def _check(name, dtype, options):
    loss = LOSSES[name]

    def f(a, b, c):
        return tuple(loss(x, b, r) for x in (a[:32], c) for r in ("none", "sum", "mean"))
    kiln.reset()
    got, want = kiln.compile(f, options=options)(*_inputs(dtype)), f(*_inputs(dtype))
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and torch.equal(g, w), f"{name} {dtype} result {k}: kiln {g}, eager {w}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", LOSSES)
def test_loss_gives_eagers_bits(name, dtype):
    _check(name, dtype, {})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", INTERPRETED)
def test_loss_gives_eagers_bits_interpreted(name, dtype):
    _check(name, dtype, {"triton_interpret": True})


def test_mse_loss_keeps_eagers_exact_mean():
    """Fuzz seed 1005385's values: eager's float16 difference x - (3 + x) rounds to exactly -3 and
    its mean is float64's 6.5; a float32 difference left kiln's mean at 6.4922."""
    x = torch.full((2,), 1.6572, dtype=torch.float16)
    v = torch.tensor([3.0, 2.0], dtype=torch.float16) + x
    kiln.reset()
    assert kiln.compile(lambda x, v: F.mse_loss(x, v))(x, v).item() == 6.5 == F.mse_loss(x, v).item()
