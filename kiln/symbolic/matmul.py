"""`torch.matmul` on fake tensors with symbolic sizes, without pinning them.

[Note: matmul on symbolic sizes] `matmul` is a composite: by the operands' dims it runs `dot`, `mv`,
`mm`, a fold of the batch dims into the rows of one `mm`, or a `bmm` over the broadcast batch.
torch 2.11's C++ composite reads sizes and strides as plain ints in the fold test and the batched
branch (`sizes()`, not `sym_sizes()`), which on kiln's fakes turns every symbolic size it touches
into a guard `Eq(s, hint)`: on the H200's torch, the rotary embedding of a decoder (`inv_freq @
positions`) pinned the prompt length and dolly-shaped generate compiled a graph per prompt length.
This is the same composite in torch ops, whose meta rules keep sizes symbolic; it takes the same
branch ATen would, so the ops traced (and the arithmetic) are eager's. Operands without symbolic
sizes keep ATen's composite.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def matmul(a, b):
    """`torch.matmul(a, b)`; ATen's branches written out when a size is symbolic."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not (_symbolic(a) or _symbolic(b)):
        return torch.matmul(a, b)
    da, db = a.dim(), b.dim()
    if da == 0 or db == 0:
        return torch.matmul(a, b)        # ATen's error for a scalar operand
    if da == 1 and db == 1:
        return torch.dot(a, b)
    if da == 2 and db == 1:
        return torch.mv(a, b)
    if da == 1 and db == 2:
        return torch.mm(a.unsqueeze(0), b).squeeze(0)
    if da == 2 and db == 2:
        return torch.mm(a, b)
    if _should_fold(a, b):
        return _folded(a, b)
    return _batched(a, b)


def linear(x, weight, bias=None):
    """`F.linear(x, weight, bias)`; ATen's composite written out when a size is symbolic. Its branches
    (torch 2.11, Linear.cpp): a matrix and a bias are one addmm; a bias with a contiguous input of 3
    dims (or any contiguous input and a 1-d bias) folds the leading dims into rows of one addmm;
    anything else is `matmul(x, weight.t())`, then `+ bias`. ATen's own `linear` on CUDA fakes reads
    a symbolic size as an int (a bias-free 3-d input: dolly's lm_head at a symbolic prompt length
    raised "Cannot call numel() on tensor with symbolic sizes" while tracing)."""
    if not all(isinstance(t, torch.Tensor) for t in (x, weight)) or not (_symbolic(x) or _symbolic(weight)) \
            or (bias is not None and not isinstance(bias, torch.Tensor)) or x.dim() == 0 or weight.dim() == 0:
        return F.linear(x, weight, bias)
    if bias is not None and x.dim() == 2:
        return torch.addmm(bias, x, weight.t())
    if bias is not None and _known(x.is_contiguous()) and (x.dim() == 3 or bias.dim() == 1):
        rows = torch.addmm(bias, x.view(-1, x.shape[-1]), weight.t())
        return rows.view(*x.shape[:-1], rows.shape[-1])
    out = matmul(x, weight.t())
    return out if bias is None else out + bias


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in (*t.shape, *t.stride()))


def _should_fold(a, b) -> bool:
    """ATen's `should_fold`: the larger operand folds into the rows of one matrix when the other is
    a vector or a matrix and the fold is a view (or the smaller operand needs a gradient)."""
    a_larger = a.dim() >= b.dim()
    t1 = a if a_larger else b.mT
    small = b if a_larger else a
    if not (t1.dim() >= 3 and small.dim() <= 2):
        return False
    if small.requires_grad:      # ATen folds then (a copy in the backward, not a large expanded operand)
        return True
    if a.dim() == 2:
        return False
    if _known(t1.numel() == 0):
        return True
    sizes, strides = t1.shape, t1.stride()
    return all(_known(strides[i] == strides[i + 1] * sizes[i + 1]) for i in range(t1.dim() - 2))


def _known(fact) -> bool:
    """A size fact true at every size the graph accepts, without adding a guard: an int or
    bool compares directly; a symbolic one must simplify to true (else: not known, the fold is
    not taken, as for strides that ATen's test would reject at some size)."""
    if isinstance(fact, torch.SymBool):
        expr = getattr(fact.node, "expr", None)
        return bool(expr is not None and expr == True)    # noqa: E712 (sympy.true == True)
    return bool(fact)


def _folded(a, b):
    transpose = b.dim() > a.dim()
    t1 = b.mT if transpose else a
    t2 = (a.t() if a.dim() == 2 else a) if transpose else b
    rows = t1.shape[:-1]
    folded = t1.reshape(_product(rows), t1.shape[-1])
    if t2.dim() == 2:
        out = torch.mm(folded, t2).view(*rows, t2.shape[1])
        return out.mT.contiguous() if transpose else out
    return torch.mv(folded, t2).view(*rows)


def _batched(a, b):
    n = a.shape[-2] if a.dim() > 1 else 1
    m1 = a.shape[-1]
    m2 = b.shape[-2] if b.dim() > 1 else b.shape[0]
    p = b.shape[-1] if b.dim() > 1 else 1
    batch = torch.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    count = _product(batch)
    a3 = (a if a.dim() > 1 else a.unsqueeze(0)).expand(*batch, n, m1).reshape(count, n, m1)
    b3 = (b if b.dim() > 1 else b.unsqueeze(-1)).expand(*batch, m2, p).reshape(count, m2, p)
    shape = [*batch] + ([n] if a.dim() > 1 else []) + ([p] if b.dim() > 1 else [])
    return torch.bmm(a3, b3).view(shape)


def _product(sizes):
    out = 1
    for s in sizes:
        out = out * s
    return out
