"""Corpus programs for library values inside captured code: torch.utils._pytree (inlined, specs
as constants), NumPy on tensors (traced as torch ops), and objects passed around (options
dataclasses, modules, typing objects, torch.distributions). Each runs under fullgraph=True and
equals eager."""
from __future__ import annotations

import collections

import torch
from torch.utils import _pytree as pytree

from capture_corpus import program

_Pair = collections.namedtuple("_Pair", "left right")


# -- pytree ---------------------------------------------------------------------------------------------
@program()
def pytree_flatten_unflatten(x):
    tree = {"a": x, "b": [x * 2, (x * 3, None)], "c": 4}
    leaves, spec = pytree.tree_flatten(tree)
    again = pytree.tree_unflatten([leaf + 1 if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)
    return again, spec, len(leaves), spec.num_leaves


@program()
def pytree_map_and_friends(x):
    tree = (x, {"k": [x * 2, 3]}, _Pair(x, x - 1), collections.deque([x]))
    doubled = pytree.tree_map(lambda t: t * 2, tree)
    summed = pytree.tree_map(lambda a, b: a + b, tree, doubled)
    only = pytree.tree_map_only(torch.Tensor, lambda t: t.sum(), tree)
    return doubled, summed, only, pytree.tree_leaves(tree)[1], pytree.tree_structure(tree) == pytree.tree_structure(doubled)


@program()
def pytree_predicates(x):
    tree = [x, {"z": x + 1}, 2]
    return x * pytree.tree_all(lambda v: v is not None, tree), pytree.tree_any_only(int, lambda v: v > 1, tree)


@program()
def pytree_map_inplace(x):
    box = {"a": [x.clone()]}
    pytree.tree_map_(lambda t: t.mul_(3), box)
    return box["a"][0]
