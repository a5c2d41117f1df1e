"""C++ index arithmetic: sympy's Mod and floor round down, C's % and / truncate; an index whose
numerator may be negative (a flip over a flatten: sympy turns Mod(31 - x0, 2) into Mod(1 - x0, 2))
must print through the floor helpers. Compared with eager."""
import torch

import kiln


def flips(x):
    return x.flatten().flip(0), x.reshape(4, 8).flip(1).reshape(-1) * 2, x.flip(0).flatten().flip(0) + 1


def test_flips_of_flattened_views():
    x = torch.randn(8, 2, 2)
    for ref, res in zip(flips(x), kiln.compile(flips)(x)):
        assert torch.equal(ref, res)
