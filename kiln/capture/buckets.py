"""Graphs split at DistributedDataParallel's gradient buckets (torch.compile's DDPOptimizer role).

[Note: why a captured graph is split for DDP] DDP all-reduces gradients bucket by bucket: its
reducer hooks each parameter's gradient accumulator and starts a bucket's all-reduce as soon as
every gradient in it is ready, so communication overlaps the rest of the backward. A compiled
graph is one autograd node: its backward hands out every parameter's gradient at once, at its
very end, and all buckets start together after the backward: no overlap. So, when a graph is
compiled while a DDP module runs its forward (`DistributedDataParallel._get_active_ddp_module()`,
set by DDP around its call of the wrapped module, in both `kiln.compile(DDP(m))` and
`DDP(kiln.compile(m))`), the graph is cut into pieces whose parameters fill about one bucket
each, and each piece is compiled by the backend on its own. Backward then runs piece by piece,
last piece first, and each piece's parameters' hooks fire when its backward ends.

How the cut is chosen (`plan`): the graph's compute nodes are grouped into units that must stay
together (an autocast or grad-mode region is one unit: a piece must not end inside a global
state change); walking units from the output back (the order backward runs), a parameter's bytes
count where it is used first in forward order (its gradient is complete only once that use's
backward ran), and a piece closes once it holds `bucket_bytes` (the first piece, the graph's
tail: DDP's first bucket cap, 1 MiB by default), as DDP's reducer closes a bucket. A leading
piece with no parameters joins the next. `options={"ddp_split": False}` keeps one graph, and so
does a group of one process (nothing to overlap).

Each piece is a `torch.fx.GraphModule` over the original's nodes (parameters are `get_attr`
nodes on each piece that uses them, the same tensor objects); values made in one piece and used
later become the later piece's inputs, except non-tensor values (symbolic sizes), which the
later piece recomputes from their tensor inputs. `BucketedGraph` runs the compiled pieces in
order, handing values on and dropping each after its last use.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.fx

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Piece:
    """One piece of a split graph: its compute nodes (by name) and the parameters it counts."""
    nodes: tuple[str, ...]
    params: tuple[str, ...]   # get_attr targets whose gradient completes in this piece
    nbytes: int


@dataclasses.dataclass(frozen=True)
class BucketSplit:
    """What `kiln.explain` reports of a graph cut for DDP."""
    bucket_bytes: int
    first_bucket_bytes: int
    pieces: tuple[Piece, ...]

    def describe(self) -> str:
        lines = [f"split for DDP into {len(self.pieces)} graphs at its gradient buckets "
                 f"(bucket_cap {self.bucket_bytes / MiB:.3g} MiB, first bucket {self.first_bucket_bytes / MiB:.3g} MiB):"]
        for i, p in enumerate(self.pieces):
            names = ", ".join(p.params[:4]) + (", ..." if len(p.params) > 4 else "")
            lines.append(f"  piece {i}: {len(p.nodes)} nodes, {len(p.params)} parameters, "
                         f"{p.nbytes / MiB:.3f} MiB ({names})")
        return "\n".join(lines)


def active_ddp() -> Any:
    """The DDP module whose forward is running, or None (torch without distributed: None)."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel._get_active_ddp_module()


def _alone(ddp) -> bool:
    """A group of one process: its all-reduce has nothing to wait for, so there is nothing for the
    backward to overlap, and a split would only cost the fusion across the cuts and a program call
    per piece (GPT-2 small on the H200: 1.48x the unsplit step at world size 1)."""
    group = getattr(ddp, "process_group", None)
    return torch.distributed.get_world_size(group) == 1


def bucket_caps(ddp) -> tuple[int, int]:
    """(first bucket's bytes, other buckets' bytes), as DDP's reducer sizes them."""
    cap = int(ddp.bucket_bytes_cap)
    first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if getattr(ddp, "bucket_bytes_cap_default", False) else cap
    return min(first, cap), cap


def synced_params(ddp) -> set[int]:
    """ids of the parameters whose gradients DDP all-reduces."""
    ignored = getattr(ddp, "parameters_to_ignore", set())
    return {id(p) for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored}


def compile_at_buckets(gm: torch.fx.GraphModule, example_inputs: list, backend: Callable
                       ) -> tuple[Callable, BucketSplit | None]:
    """`backend(gm, example_inputs)`, or under a running DDP forward the pieces of `gm` compiled
    one by one and run in order ([Note: why a captured graph is split for DDP])."""
    ddp = active_ddp()
    if ddp is None or not torch.is_grad_enabled() or _alone(ddp):
        return backend(gm, example_inputs), None
    first, cap = bucket_caps(ddp)
    pieces = plan(gm, synced_params(ddp), first, cap)
    if len(pieces) < 2:
        return backend(gm, example_inputs), None
    return build(gm, example_inputs, pieces, backend), BucketSplit(cap, first, tuple(
        Piece(tuple(n.name for n in nodes), tuple(params), nbytes) for nodes, params, nbytes in pieces))


# -- the plan ---------------------------------------------------------------------------------------
_STATE_CHANGES = {torch.amp.autocast_mode._enter_autocast: 1, torch.amp.autocast_mode._exit_autocast: -1}


def _units(gm: torch.fx.GraphModule) -> list[list[torch.fx.Node]]:
    """Compute nodes in order, grouped so that no unit boundary falls inside an autocast region or
    a region where grad mode differs from the graph's (both change global state between nodes)."""
    units, current, depth, grad_changed = [], [], 0, False
    grad_at_entry = torch.is_grad_enabled()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        current.append(node)
        if node.op == "call_function":
            depth += _STATE_CHANGES.get(node.target, 0)
            if node.target is torch._C._set_grad_enabled:
                grad_changed = node.args[0] != grad_at_entry
        if depth == 0 and not grad_changed:
            units.append(current)
            current = []
    if current:
        units.append(current)
    return units


def _attr(gm: torch.nn.Module, target: str) -> Any:
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def plan(gm: torch.fx.GraphModule, synced: set[int], first_bucket: int, bucket: int
         ) -> list[tuple[list[torch.fx.Node], list[str], int]]:
    """The pieces of `gm`, in forward order: (compute nodes, parameters counted, bytes)."""
    units = _units(gm)
    first_use: dict[int, list[str]] = {}   # unit index -> parameters used there first
    seen: set[str] = set()
    for i, unit in enumerate(units):
        for node in unit:
            for a in node.all_input_nodes:
                if a.op == "get_attr" and a.target not in seen and id(_attr(gm, a.target)) in synced:
                    seen.add(a.target)
                    first_use.setdefault(i, []).append(a.target)
    pieces: list[tuple[list, list, int]] = [([], [], 0)]
    for i in reversed(range(len(units))):
        nodes, params, nbytes = pieces[-1]
        if nbytes >= (first_bucket if len(pieces) == 1 else bucket):
            pieces.append(([], [], 0))
            nodes, params, nbytes = pieces[-1]
        nodes[:0] = units[i]
        for target in first_use.get(i, ()):
            params.append(target)
            t = _attr(gm, target)
            nbytes += t.numel() * t.element_size()
        pieces[-1] = (nodes, params, nbytes)
    pieces.reverse()
    if len(pieces) > 1 and not pieces[0][1]:   # no parameter before the first use of one
        (n0, _, _), (n1, p1, b1) = pieces[0], pieces[1]
        pieces[:2] = [(n0 + n1, p1, b1)]
    return [p for p in pieces if p[0]]


# -- the pieces -------------------------------------------------------------------------------------
def _is_tensor_value(node: torch.fx.Node) -> bool:
    return node.op == "placeholder" or isinstance(node.meta.get("example_value"), torch.Tensor)


def _piece_module(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node], later_uses: set[torch.fx.Node]
                  ) -> tuple[torch.fx.GraphModule, list[torch.fx.Node], list[torch.fx.Node]]:
    """A GraphModule computing `nodes`: (module, original nodes read as inputs, nodes returned)."""
    inside = set(nodes)
    inputs: list[torch.fx.Node] = []
    recomputed: list[torch.fx.Node] = []   # non-tensor values of earlier pieces, recomputed here

    def need(a: torch.fx.Node):
        if a in inside or a.op == "get_attr" or a in inputs or a in recomputed:
            return
        if _is_tensor_value(a):
            inputs.append(a)
        else:   # a size or a number: recompute it from its own inputs
            for b in a.all_input_nodes:
                need(b)
            recomputed.append(a)

    for node in nodes:
        for a in node.all_input_nodes:
            need(a)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for a in inputs:
        env[a] = graph.placeholder(a.name)
        env[a].meta = dict(a.meta)
    attrs: dict[str, Any] = {}
    for node in [*sorted(recomputed, key=_position(gm)), *nodes]:
        for a in node.all_input_nodes:
            if a.op == "get_attr" and a not in env:
                env[a] = graph.node_copy(a)
                attrs[a.target] = _attr(gm, a.target)
        env[node] = graph.node_copy(node, lambda x: env[x])
    outputs = [n for n in nodes if n in later_uses]
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(attrs, graph), inputs, outputs


def _position(gm: torch.fx.GraphModule):
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return order.__getitem__


def _example(node: torch.fx.Node, given: dict) -> Any:
    """A real value standing for `node` when compiling a piece: the call's own input, or zeros of
    the intermediate's dtype, sizes (their hints when symbolic) and strides."""
    if node in given:
        return given[node]
    fake = node.meta["example_value"]
    hint = lambda d: d.node.hint if isinstance(d, torch.SymInt) else d   # noqa: E731
    x = torch.empty_strided(tuple(map(hint, fake.shape)), tuple(map(hint, fake.stride())),
                            dtype=fake.dtype, device=fake.device).zero_()
    return x.requires_grad_(fake.requires_grad and (x.is_floating_point() or x.is_complex()))


def build(gm: torch.fx.GraphModule, example_inputs: list, pieces: list, backend: Callable) -> "BucketedGraph":
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    given = dict(zip(placeholders, example_inputs))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    slots: dict[torch.fx.Node, int] = {n: i for i, n in enumerate(placeholders)}
    later: list[set] = []
    for k in range(len(pieces)):   # piece k's tensors read by later pieces, and what the graph returns
        rest = {n for nodes, _, _ in pieces[k + 1:] for n in nodes}
        later.append({n for n in pieces[k][0] if output in n.users
                      or _is_tensor_value(n) and any(u in rest for u in n.users)})
    steps, last_use = [], {}
    for k, (nodes, _, _) in enumerate(pieces):
        module, inputs, outputs = _piece_module(gm, nodes, later[k])
        compiled = backend(module, [_example(a, given) for a in inputs])
        for a in inputs:
            last_use[a] = k
        for n in outputs:
            slots[n] = len(slots)
        steps.append(_Step(compiled, tuple(slots[a] for a in inputs), tuple(slots[n] for n in outputs)))
    returned = {n for n in output.all_input_nodes}
    for k, step in enumerate(steps):
        step.frees = tuple(slots[a] for a, last in last_use.items() if last == k and a not in returned)
    results = []
    for value in output.args[0]:
        if isinstance(value, torch.fx.Node) and value.op == "get_attr":
            results.append((False, _attr(gm, value.target)))
        elif isinstance(value, torch.fx.Node):
            results.append((True, slots[value]))
        else:
            results.append((False, value))
    return BucketedGraph(steps, len(slots), tuple(results))


@dataclasses.dataclass
class _Step:
    compiled: Callable
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    frees: tuple[int, ...] = ()


class BucketedGraph:
    """The compiled pieces of one graph, run in order: a callable with the graph's signature."""

    def __init__(self, steps: list[_Step], slots: int, results: tuple):
        self.steps, self.slots, self.results = steps, slots, results

    def __call__(self, *args):
        values = list(args) + [None] * (self.slots - len(args))
        for step in self.steps:
            out = step.compiled(*[values[i] for i in step.inputs])
            for i, v in zip(step.outputs, out):
                values[i] = v
            for i in step.frees:
                values[i] = None
        return tuple(values[x] if is_slot else x for is_slot, x in self.results)
