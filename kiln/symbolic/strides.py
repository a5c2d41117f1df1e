"""The strides eager gives a new tensor: contiguous, dense, and a pointwise op's output.

Shared by kiln's own meta rules for fake tensors (`kiln.symbolic.meta_rules`) and the prims' meta
rules (`kiln.prims.elementwise`), so both lay a pointwise result out the one way eager does.
"""
from __future__ import annotations

import torch

from kiln.symbolic.shape_env import DataDependentGuard


def pointwise_strides(tensors) -> list:
    """The strides eager gives the output of a pointwise op on `tensors` (one shape).

    [Note: pointwise outputs follow their inputs' layout] Eager's TensorIterator lays a pointwise
    result out densely in the stride order of its operands: the first operand decides between two
    dims unless it is broadcast along either (stride 0), then the next; equal strides put the smaller
    dim inside. So `(x * 3).long()` of a column-major `x` is column-major, and a later `.mT.view(-1)`
    is a view exactly where eager's is. `empty_like(first)` agreed only for a dense first operand (a
    broadcast one gave row-major). Mirrors TensorIterator's fast setup (all contiguous, or all one
    dense layout) and `reorder_dimensions`; symbolic strides keep the first operand's layout (an
    order found by comparing them would add guards)."""
    first = tensors[0]
    shape, ndim = list(first.shape), first.ndim
    if any(isinstance(x, torch.SymInt) for t in tensors for x in (*t.shape, *t.stride())):
        return list(torch.empty_like(first).stride())
    if all(t.is_contiguous() for t in tensors):
        return list(contiguous_strides(shape))
    if all(dense(t) and t.stride() == first.stride() for t in tensors):
        return list(first.stride())

    def should_swap(d0: int, d1: int) -> int:
        for t in tensors:
            s0, s1 = t.stride(d0), t.stride(d1)
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))     # fastest first
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    strides, step = [0] * ndim, 1
    for d in perm:
        strides[d] = step
        step *= shape[d]
    return strides


def contiguous_strides(shape) -> list:
    strides, running = [], 1
    for s in reversed(list(shape)):
        strides.append(running)
        # an unbacked size (a mask's count) may be 0 or 1: Max(u0, 1) rather than a guard on it
        unbacked = isinstance(s, torch.SymInt) and not s.node.has_hint()
        running *= torch.sym_max(s, 1) if unbacked else max(s, 1)
    return list(reversed(strides))


def dense(a: torch.Tensor) -> bool:
    """Non-overlapping and dense: strides are a permutation of contiguous strides."""
    order = sorted(range(a.ndim), key=lambda i: (a.stride(i), a.shape[i]))
    expected = 1
    for i in order:
        if a.shape[i] != 1 and a.stride(i) != expected:
            return False
        expected *= a.shape[i]
    return True


def definitely_contiguous(a: torch.Tensor) -> bool:
    """`a.is_contiguous()`, except that where the answer depends on an unbacked size it is False
    instead of DataDependentGuard: a decomposition that copies when the answer is False is right
    either way (a copy of a contiguous tensor is a contiguous tensor), so the count of a mask's
    selected elements need not be known to lay out `x[mask] = v`'s values."""
    try:
        return a.is_contiguous()
    except DataDependentGuard:
        return False
