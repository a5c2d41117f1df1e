"""`torch.combinations` on fake tensors: its output size from the input's size, not from data.

[Note: combinations without a mask] ATen's `combinations` builds every r-tuple of indices as a
grid and keeps the ordered ones with `masked_select`, whose output size a tracer can only know from
the data: capture refused it ("kiln has no sizes known only at run time"). The count depends on
the size alone (n choose r; n + r - 1 choose r with replacement), so for an input of a known size
the tuples are enumerated here, in ATen's order (lexicographic), and gathered: `input[index_k]` per
position k, stacked. Gathers keep autograd's gradient, scattered back as eager's `masked_select`
backward does. Anything else (a symbolic size, r < 1, a non-vector) keeps ATen's composite, and
its errors.
"""
from __future__ import annotations

import itertools

import torch


def combinations(input, r: int = 2, with_replacement: bool = False):
    """`torch.combinations(input, r, with_replacement)`; the tuples enumerated for a known size."""
    n = input.shape[0] if isinstance(input, torch.Tensor) and input.dim() == 1 else None
    if not isinstance(n, int) or not isinstance(r, int) or r < 1:
        return torch.combinations(input, r=r, with_replacement=with_replacement)
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    tuples = list(choose(range(n), r))
    if not tuples:       # eager's empty result is stacked from the input, so it requires grad as the input does
        return torch.stack([input[:0]] * r, dim=1)
    columns = torch.tensor(tuples, dtype=torch.int64, device=input.device).t()
    return torch.stack([input[columns[k]] for k in range(r)], dim=1)
