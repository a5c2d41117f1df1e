"""grid_sampler_2d's grid gradient with border padding: a coordinate on the border (or past it)
passes no gradient, as eager's clip_coordinates_set_grad treats the borders as out of bounds.
Found by the bfloat16 OpInfo sweep, where a grid value rounded to exactly -1.0."""
import pytest
import torch

import kiln


@pytest.mark.parametrize("align_corners", [True, False])
def test_a_grid_point_on_the_border_passes_eagers_gradient(align_corners):
    w, h = 5, 4
    # coordinates that unnormalize to exactly 0 and to exactly size - 1, and some inside
    lo_x, hi_x = (-1.0, 1.0) if align_corners else (-1 + 1 / w, 1 - 1 / w)
    lo_y, hi_y = (-1.0, 1.0) if align_corners else (-1 + 1 / h, 1 - 1 / h)
    xs = torch.tensor([lo_x, hi_x, 0.3, -0.45, lo_x, 0.1])
    ys = torch.tensor([0.2, -0.6, lo_y, hi_y, hi_y, 0.7])
    grid = torch.stack([xs, ys], -1).reshape(1, 2, 3, 2).repeat(2, 1, 1, 1)
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(0))
    cot = torch.randn(2, 3, 2, 3, generator=torch.Generator().manual_seed(1))

    def f(x, grid):
        return torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="border",
                                               align_corners=align_corners)

    def grads(fn):
        a, g = x.clone().requires_grad_(), grid.clone().requires_grad_()
        out = fn(a, g)
        return (out, *torch.autograd.grad(out, (a, g), cot))
    kiln.reset()
    for want, got in zip(grads(f), grads(kiln.compile(f, backend="kiln", fullgraph=True))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
