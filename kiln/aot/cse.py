"""Common subexpressions: one node for every op the graph computes twice on the same arguments.

[Note: common subexpressions] A model often computes a value twice (`x.pow(2)` in two places, a
mask built per layer from the same positions), and the joint graph holds the forward's ops and the
backward's: without a pass that merges them, the partitioner may save one copy and recompute the
other, and two kernels then compute what eager computes once. Two evaluations of one expression
agree only up to rounding (a fused kernel and a lone one round differently, g++'s vector and
scalar libm differ by an ulp), and a comparison of the two can turn ([Note: equality is decided
once] in partition.py). So each graph is cut down to one node per (op, arguments) before it is
partitioned and again on each half after: a value is computed once, and the forward and the
backward read that one value, saved or recomputed from the same node by the same code.

Merged are call_function nodes of pure ops: no write into an argument, no in-place metadata change,
no random op that is not functional (kiln's philox ops are: their offset argument tells them apart,
`kiln/aot/rng.py`), no read of tensor data into a number or size (an unbacked symbol names that
one read: a second read is another symbol). Arguments are keyed by identity for nodes and by type
and value for constants: `full(0.0)` and `full(-0.0)` are different ops, so are `full(1)`,
`full(1.0)` and `full(True)`.

[Note: outputs stay distinct] Two nodes that each reach the graph's outputs (themselves, or through
views) are not merged: `return x * 2, x * 2` hands eager's caller two tensors, and merged they would
be one storage (a write into one shows in the other) and one autograd history (the first computed
under no_grad, the second not: both would say the first's requires_grad). A value that escapes is
computed once per escape; values used only inside the graph are still merged.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

from kiln.aot import schema
from kiln.symbolic.decide import is_unbacked

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def eliminate_common_subexpressions(graph: fx.Graph) -> int:
    """Merge `graph`'s repeated pure nodes into their first occurrence; returns how many went."""
    first: dict[tuple, fx.Node] = {}
    escaping = _escaping(graph)
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not _pure(node):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
            hash(key)
        except TypeError:          # an argument with no value identity (an opaque object)
            continue
        earlier = first.setdefault(key, node)
        if earlier is not node and not (node in escaping and earlier in escaping):   # [Note: outputs stay distinct]
            node.replace_all_uses_with(earlier)
            graph.erase_node(node)
            merged += 1
    return merged


def _escaping(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose storage the graph's outputs hold: outputs, and what an output is a view of."""
    escaping: set[fx.Node] = set()
    for node in reversed(graph.nodes):
        if any(user.op == "output" or user in escaping and _is_view(user) for user in node.users):
            escaping.add(node)
    return escaping


def _is_view(node: fx.Node) -> bool:
    return node.target is operator.getitem or schema.effects(node.target).view


def _pure(node: fx.Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, OpOverload):
        return False
    effects = schema.effects(target)
    if effects.mutated or effects.inplace_view or (effects.random and target.namespace != "kiln"):
        return False
    return not _reads_a_number(node.meta.get("val"))


def _reads_a_number(value: Any) -> bool:
    """A symbolic number, or a tensor sized by one read from data (an unbacked symbol)."""
    if isinstance(value, _SYMBOLIC):
        return True
    if isinstance(value, torch.Tensor):
        return any(is_unbacked(d) for d in value.shape)
    if isinstance(value, (tuple, list)):
        return any(_reads_a_number(v) for v in value)
    return False


def _key(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return value                              # by identity
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _key(v)) for k, v in value.items())))
    if isinstance(value, float):
        return (float, math.copysign(1.0, value) if value == 0 else value, repr(value))
    if isinstance(value, slice):
        return (slice, _key(value.start), _key(value.stop), _key(value.step))
    if isinstance(value, _SYMBOLIC):
        raise TypeError("a symbolic argument is keyed by no node")
    return (type(value), value)
