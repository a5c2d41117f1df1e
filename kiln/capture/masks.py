"""Attention masks that are all true or causal: SDPA's own path instead of an explicit mask.

[Note: mask elision] Compiled, a Hugging Face model builds the causal (or all-true) mask that eager
skips. Eager looks at the padding mask's values (`padding_mask.all()`) and, with no padding, calls
`scaled_dot_product_attention(q, k, v, is_causal=True)` without a mask; a traced program is not
allowed to look (`is_tracing()`), so it passes the mask. The two calls run different SDPA kernels:
on the H200 dolly-v2-3b's logits differ in 63% of elements between them, and generate() picks other
tokens. The masked kernel is also the slower one.

kiln looks for the model. When a boolean `attn_mask` is computed in the graph from the frame's
inputs by a few pure ops, capture runs those ops on the call's real inputs. A mask that is all true
is dropped; a mask that is the lower triangle of a square score matrix becomes `is_causal=True`,
which is SDPA's upper-left causal mask. A VALUE guard re-runs the ops on every call and holds only
while the mask is still that; a miss recompiles, and that capture passes the mask as it is. A mask
built from constants and static sizes alone needs no guard. The guard costs what eager's own check
costs: a few small kernels and one device sync.

[Note: masks of symbolic sizes] Under dynamic=True a Hugging Face mask is built from a symbolic
length read off an intermediate (`inputs_embeds.shape[1]`, the embedding's output), whose producers
are not pure (the embedding reads a parameter): the mask was kept, so BERT's SDPA ran with an
explicit all-true mask (a masked kernel, and a [batch, 1, length, length] buffer) where the static
program, whose sizes are constants, dropped it. A size whose value is a symbol that an input's dim
carries is a leaf of the mask's ops, read from that input's shape: on the capture's call and in
the guard. A mask of sizes alone gets its verdict per sizes once (the guard caches it), so the
guard costs a dict lookup on later calls of sizes it has seen.
"""
from __future__ import annotations

import functools
import operator
from typing import Callable

import torch
import torch.fx

from kiln.capture import variables as V
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.torch_calls import call_torch

MAX_NODES = 64   # a mask's ops; more and it is not worth re-running in a guard
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial",
           "normal", "poisson", "randperm", "dropout"}
_IN_PLACE_OPERATORS = {operator.setitem, operator.iand, operator.ior, operator.ixor, operator.iadd,
                       operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
                       operator.ilshift, operator.irshift, operator.ipow}


def sdpa(tx, args: list, kwargs: dict) -> V.Variable:
    """`F.scaled_dot_product_attention` in traced code: a graph node, its mask elided if trivial."""
    if len(args) > len(_SDPA_PARAMS) or set(kwargs) - set(_SDPA_PARAMS):
        return call_torch(tx, "call_function", torch.nn.functional.scaled_dot_product_attention, args, kwargs)
    bound = {**dict(zip(_SDPA_PARAMS, args)), **kwargs}
    mask, causal = bound.get("attn_mask"), bound.get("is_causal")
    if isinstance(mask, V.TensorVar) and mask.example.dtype is torch.bool and \
            (causal is None or isinstance(causal, V.Constant) and causal.value is False):
        verdict = _verdict(tx, mask)
        if verdict is not None:
            bound["attn_mask"], bound["is_causal"] = V.Constant(None), V.Constant(verdict == "causal")
    qkv = [bound.pop(name) for name in _SDPA_PARAMS[:3] if name in bound]
    return call_torch(tx, "call_function", torch.nn.functional.scaled_dot_product_attention, qkv, bound)


def _verdict(tx, mask: V.TensorVar) -> str | None:
    """"all" or "causal" for a mask proven so on this call (guarded), else None."""
    out = tx.out
    sizes = _size_leaves(out.graph)
    nodes = _producers(mask.node, sizes)
    if nodes is None or _mutated(out.graph, nodes):   # checked at every use: a write may come between
        return None
    if mask.node in out.mask_verdicts:
        return out.mask_verdicts[mask.node]
    out.mask_verdicts[mask.node] = None
    inputs = [n for n in nodes if n.op == "placeholder" or n in sizes]
    tensors = list(dict.fromkeys(sizes[n][0] if n in sizes else n for n in inputs))
    reads = [(tensors.index(sizes[n][0]), sizes[n][1]) if n in sizes else (tensors.index(n), None) for n in inputs]
    compute = _subgraph(nodes, inputs, mask.node)

    def arguments(values):
        return [values[i] if dim is None else values[i].shape[dim] for i, dim in reads]
    try:
        verdict = classify(compute(*arguments([out.input_values[n] for n in tensors])))
    except Exception:       # the ops do not run eagerly on these values: keep the mask
        return None
    if verdict is None:
        return None
    if inputs:
        check = _guard_function(compute, verdict)
        if all(dim is not None for _, dim in reads):        # [Note: masks of symbolic sizes]
            check = functools.lru_cache(maxsize=256)(check)
        what = "all true" if verdict == "all" else "causal"
        out.guard(Guard(GuardKind.VALUE, None, (lambda *values: check(*arguments(values)),
                                                tuple(n.meta["source"] for n in tensors),
                                                f"the attention mask at {tx.where()} is {what}")))
    out.mask_verdicts[mask.node] = verdict
    return verdict


def _size_leaves(graph: torch.fx.Graph) -> dict[torch.fx.Node, tuple[torch.fx.Node, int]]:
    """Nodes whose value is a symbolic size that a tensor input's dim carries: node -> (that
    input's placeholder, the dim) ([Note: masks of symbolic sizes])."""
    dims = {}
    for p in graph.nodes:
        if p.op == "placeholder" and _pure(p):
            for d, size in enumerate(p.meta["example_value"].shape):
                if isinstance(size, torch.SymInt):
                    dims.setdefault(size.node.expr, (p, d))
    leaves = {}
    if dims:
        for n in graph.nodes:
            value = n.meta.get("example_value")
            if n.op != "placeholder" and isinstance(value, torch.SymInt) and value.node.expr in dims:
                leaves[n] = dims[value.node.expr]
    return leaves


def classify(mask: torch.Tensor) -> str | None:
    """"all" if every element is true; "causal" if the last two dims are a square lower triangle."""
    if bool(mask.all()):
        return "all"
    return "causal" if _is_causal(mask) else None


def _is_causal(mask: torch.Tensor) -> bool:
    n = mask.shape[-1] if mask.dim() >= 2 else 0
    if n < 2 or mask.shape[-2] != n:
        return False
    tril = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
    return bool((mask == tril).all())


def _guard_function(compute: Callable, verdict: str) -> Callable[..., bool]:
    if verdict == "all":
        return lambda *tensors: bool(compute(*tensors).all())
    return lambda *tensors: _is_causal(compute(*tensors))


def _producers(node: torch.fx.Node, leaves=()) -> list[torch.fx.Node] | None:
    """The pure nodes `node` is computed from, in graph order, down to placeholders and `leaves`;
    None if impure or too many."""
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n not in leaves and not _pure(n):
            return None
        seen.add(n)
        if len(seen) > MAX_NODES:
            return None
        if n not in leaves:
            stack.extend(n.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def _pure(n: torch.fx.Node) -> bool:
    """Reads its inputs and nothing else: no writes, no random numbers, no modules or attributes."""
    if n.op == "placeholder":
        return isinstance(n.meta.get("example_value"), torch.Tensor) and "source" in n.meta
    if n.op == "call_method":
        return not n.target.endswith("_") or n.target.startswith("__")
    if n.op != "call_function" or n.target in _IN_PLACE_OPERATORS or "out" in n.kwargs:
        return False
    name = getattr(n.target, "__name__", "")
    if n.target in (operator.and_, operator.or_, operator.not_):
        return True
    return name not in _RANDOM and not name.endswith("_")


def _mutated(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> bool:
    """Does an op so far write into one of `nodes`, or into a view of one (`m[0][...] = x`)?"""
    inside = set(nodes)
    for n in graph.nodes:
        if n.op in ("call_method", "call_function") and not _pure(n) and n.args \
                and isinstance(n.args[0], torch.fx.Node) and _views_one_of(n.args[0], inside):
            return True
    return False


_VIEWS = {"view", "reshape", "expand", "expand_as", "transpose", "permute", "unsqueeze", "squeeze", "select",
          "narrow", "flatten", "unflatten", "t", "as_strided", "view_as", "unbind", "split", "chunk",
          "getitem", "__getitem__"}


def _views_one_of(node: torch.fx.Node, targets: set) -> bool:
    """Is `node` one of `targets`, or a view of one through view ops (what a write into it changes)?"""
    while True:
        if node in targets:
            return True
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if name not in _VIEWS or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return False
        node = node.args[0]


def _subgraph(nodes: list[torch.fx.Node], inputs: list[torch.fx.Node], result: torch.fx.Node) -> Callable:
    """A callable that computes `result` from `inputs`' values (in that order) with `nodes`' ops, eagerly."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in inputs:
        env[n] = g.placeholder(n.name)
        env[n].meta = {}
    for n in nodes:
        if n in env:
            continue
        env[n] = g.node_copy(n, env.__getitem__)
        env[n].meta = {}     # no fake example values: the guard outlives the capture's ShapeEnv
    g.output(env[result])
    return torch.fx.GraphModule(torch.nn.Module(), g)
