"""`torch.vmap` inside captured code: the loop it means, one call per example, inlined.

[Note: vmap unrolled per example] `vmap(f, in_dims, out_dims)(*args)` is defined as `f` applied to
each slice of its mapped arguments along their `in_dims`, the results stacked along `out_dims`.
torch runs it through functorch's batching rules; kiln's capture has no batched tensors, so
`torch.vmap` returns `partial(vmap_per_example, f, in_dims, out_dims)` and the tracer inlines that
Python function like any other: a `select` per mapped argument and example, `f` traced on the
slices, a `stack` per output. The graph is exact (a batching rule computes the same values) and
fuses like any pointwise code; its size grows with the number of examples, so a vmap over more than
`MAX_EXAMPLES` breaks the graph instead (`unrolled_examples`), naming the count. transformers builds
its attention masks with four nested vmaps over (batch, head, query, key) indices and Mamba's
associative scan vmaps its combine function.

Not modelled: vmap's `randomness="error"` (a random op inside is run per example, where eager
raises) and its refusal of `.item()` on a mapped slice (kiln reads the slice).
"""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from kiln.capture import variables as V
from kiln.capture.callables import handles

MAX_EXAMPLES = 256


def unrolled_examples(n: int) -> int:
    """`n`, the examples a vmap maps over; capture refuses more than MAX_EXAMPLES (a graph break)."""
    return n


def _leaf_dims(dims, tree) -> list:
    """vmap's `in_dims` (an int or None for a whole tree, else a prefix of its structure), one per leaf."""
    if dims is None or isinstance(dims, int):
        return [dims] * len(pytree.tree_leaves(tree))
    if isinstance(tree, dict):
        return [d for key in tree for d in _leaf_dims(dims[key], tree[key])]
    if isinstance(tree, (tuple, list)) and isinstance(dims, (tuple, list)) and len(dims) == len(tree):
        return [d for sub_dims, sub_tree in zip(dims, tree) for d in _leaf_dims(sub_dims, sub_tree)]
    raise ValueError(f"vmap: in_dims {dims!r} is not compatible with the structure of the inputs")


def _zeros_example(leaf, dim):
    shape = list(leaf.shape)
    del shape[dim]
    return leaf.new_zeros(shape)


def vmap_per_example(func, in_dims, out_dims, *args, **kwargs):
    """torch.vmap(func, in_dims, out_dims)(*args, **kwargs), one call of `func` per example."""
    leaves, spec = pytree.tree_flatten(args)
    dims = _leaf_dims(in_dims if isinstance(in_dims, int) or in_dims is None else tuple(in_dims), args)
    sizes = []
    for leaf, dim in zip(leaves, dims):
        if dim is not None:
            if not isinstance(leaf, torch.Tensor):
                raise ValueError(f"vmap: in_dim {dim} given for an input of type {type(leaf).__name__}")
            sizes.append(leaf.size(dim))
    if not sizes:
        raise ValueError("vmap: at least one input must be mapped over (in_dims are all None)")
    for size in sizes[1:]:
        if size != sizes[0]:
            raise ValueError(f"vmap: mapped inputs have sizes {sizes} along their in_dims; they must agree")
    results = []
    for i in range(unrolled_examples(sizes[0])):
        example = [leaf.select(dim, i) if dim is not None else leaf for leaf, dim in zip(leaves, dims)]
        results.append(pytree.tree_flatten(func(*pytree.tree_unflatten(example, spec), **kwargs)))
    if not results:  # no examples: `func` on zeros gives the outputs' shapes, of which none is kept
        example = [_zeros_example(leaf, dim) if dim is not None else leaf for leaf, dim in zip(leaves, dims)]
        results.append(pytree.tree_flatten(func(*pytree.tree_unflatten(example, spec), **kwargs)))
    out_spec = results[0][1]
    out_leaves = [leaves for leaves, _ in results]
    if isinstance(out_dims, int) or out_dims is None:
        out_leaf_dims = [out_dims] * len(out_leaves[0])
    else:
        out_leaf_dims = _leaf_dims(out_dims, pytree.tree_unflatten(out_leaves[0], out_spec))
    stacked = []
    for j, dim in enumerate(out_leaf_dims):
        if dim is None:
            stacked.append(out_leaves[0][j])
        else:
            stacked.append(torch.stack([one[j] for one in out_leaves], dim=dim).narrow(dim, 0, sizes[0]))
    return pytree.tree_unflatten(stacked, out_spec)


@handles(torch.vmap)
def _vmap(tx, args, kwargs):
    """`torch.vmap` / `torch.func.vmap`: `partial(vmap_per_example, func, in_dims, out_dims)`."""
    from kiln.capture.attributes import _function
    names = ("func", "in_dims", "out_dims", "randomness")
    bound = {**dict(zip(names, args)), **kwargs}
    func = bound["func"]
    in_dims, out_dims = bound.get("in_dims", V.Constant(0)), bound.get("out_dims", V.Constant(0))
    return V.PartialVar(_function(vmap_per_example), [func, in_dims, out_dims], {})


@handles(unrolled_examples)
def _unrolled_examples(tx, args, kwargs):
    from kiln.capture.constants import python_value
    n = python_value(args[0])
    if n > MAX_EXAMPLES:
        from kiln.capture.interpreter import GraphBreak
        raise GraphBreak(f"torch.vmap over {n} examples: kiln unrolls a vmap per example, up to {MAX_EXAMPLES}",
                         tx.user_where())
    return V.Constant(n)

