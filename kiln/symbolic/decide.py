"""Size questions that never guard on an unbacked symbol, for kiln's own shape logic.

The decompositions (kiln/prims/decompositions) and kiln's meta rules branch on sizes: "is this dim
1, so broadcast?", "is the tensor empty?". On backed symbols the plain Python question (`size != 1`)
guards on the hint, as before. On an unbacked size ([Note: unbacked sizes] in shape_env.py) it would
raise DataDependentGuard, so such a branch asks here instead, saying which answer is the general
case: `guard_or_true(size != 1)` is True for an unbacked size (no broadcast), and a guard on a
backed one. These are torch's helpers of the same names, over kiln's SymNode.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.utils._pytree


def guard_or_false(cond) -> bool:
    """cond, guarded when it can be; False when it depends on an unbacked symbol."""
    if isinstance(cond, torch.SymBool):
        return cond.node.guard_or_false("", 0)
    return bool(cond)


def guard_or_true(cond) -> bool:
    """cond, guarded when it can be; True when it depends on an unbacked symbol."""
    if isinstance(cond, torch.SymBool):
        return cond.node.guard_or_true("", 0)
    return bool(cond)


def expect_true(cond) -> bool:
    """A condition the op requires (eager raises when it fails): over unbacked symbols assumed and
    learnt (u0 == s0 makes u0 -> s0), else guarded. False only when it is known false."""
    if isinstance(cond, torch.SymBool):
        return cond.node.expect_true("", 0)
    return bool(cond)


def known_true(cond) -> bool:
    """True when the facts decide cond true; never a guard."""
    if isinstance(cond, torch.SymBool):
        return cond.node.shape_env.static_value(cond.node.expr) is True
    return bool(cond)


@contextlib.contextmanager
def oblivious_sizes(values) -> Iterator[None]:
    """While code is generated for a graph whose values (pytree of tensors and SymInts, e.g. its
    nodes' `meta['val']`) hold unbacked sizes: their ShapeEnvs answer size questions on them as if
    each were >= 2 (ShapeEnv.oblivious says why that is sound for layout and indexing)."""
    with contextlib.ExitStack() as stack:
        for env in shape_envs(values):
            if getattr(env, "unbacked", None):
                stack.enter_context(env.oblivious())
        yield


def shape_envs(values) -> list:
    """The distinct ShapeEnvs whose symbols the sizes and strides of `values` (a pytree of tensors
    and SymInts) hold."""
    envs = {}
    for leaf in torch.utils._pytree.tree_leaves(values):
        sizes = (*leaf.shape, *leaf.stride()) if isinstance(leaf, torch.Tensor) else (leaf,)
        for n in sizes:
            env = getattr(getattr(n, "node", None), "shape_env", None)
            if env is not None:
                envs[id(env)] = env
    return list(envs.values())


def nonnegative_size(n):
    """max(n, 0) for a length computed from sizes or numbers (arange's). A count read from a tensor
    (unbacked) is assumed >= 0, as eager refuses a negative one; other values are clamped."""
    if isinstance(n, torch.SymInt) and n.node.hint is None:
        expect_true(n >= 0)
        return n
    return max(n, 0)


def is_unbacked(x) -> bool:
    """Whether x is a size or number known only at run time (an expression of unbacked symbols)."""
    return isinstance(x, (torch.SymInt, torch.SymBool)) and x.node.hint is None


def same_size(x, y) -> bool:
    """x == y for two sizes that must agree (broadcasting one to the other): guarded on backed
    sizes; over a size known only at run time assumed, as eager refuses a mismatch there
    (`x[m] * w[m]` of two masks' counts, `index_put`'s values against its indices)."""
    if is_unbacked(x) or is_unbacked(y):
        if known_true(x == y):
            return True
        if isinstance(x, int) and x == 1:       # a dim of one broadcasts to any count
            return False
        return expect_true(x == y)
    return bool(x == y)
