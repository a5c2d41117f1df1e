"""A small program with two graph breaks and a recompile, for the report tests (run as a script)."""
import torch

import kiln


def step(x, scale):
    y = x.sin() * scale
    print("first break")
    z = y.cos() + y
    print("second break")
    return (z * 2).exp()


if __name__ == "__main__":
    fast = kiln.compile(step)
    x = torch.randn(64)
    torch.testing.assert_close(fast(x, 2.0), step(x, 2.0))
    torch.testing.assert_close(fast(x, 3.0), step(x, 3.0))    # a new scale: recompile
