"""Partition a functional joint graph into a forward and a backward graph by minimum cut.

[Note: min-cut partition] Every value the backward needs either crosses from the forward (saved:
it costs its bytes of memory between forward and backward) or is recomputed in the backward from
values that cross. Choosing what crosses is a minimum s-t cut: each node `n` is split into
`n_in -> n_out` with capacity = its size in bytes, data edges have infinite capacity, the source
feeds the program inputs and every op that must run in the forward (matmul, convolution, reductions,
anything not cheap to redo: `RECOMPUTABLE` says which ops are cheap), and every backward node
(one that depends on a tangent) drains to the sink. The cut edges `n_in -> n_out` are the saved
values. Saving every forward value the backward reads is one valid cut, so the minimum never saves
more than it (`SavedInfo.bytes_save_all` is that bound, reported next to `bytes_saved`).

[Note: recomputation where it is used] The joint graph holds the recomputed forward values before
every backward node, so a backward in that order computed them all at its start and held each
until its last reader: ResNet-50's backward (bf16, batch 128) began by rebuilding its relu outputs
and max pooling's int64 indices, and its planned peak was 5.4 GB (3.1 GB placed as below). The backward graph places each
recomputed node just before its first user instead (as the autograd engine runs a node's backward
when its gradient arrives), so a recomputed value lives about as long as the saved value it
replaces would have in eager.

Hands on `(fw_gm, bw_gm, SavedInfo)`: fw_gm(*primals) -> (*forward outputs, *saved) and
bw_gm(*saved, *tangents) -> (*gradients).
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from kiln.aot import schema
from kiln.aot.trace import JointGraph, graph_module

aten = torch.ops.aten

# Cheap to recompute besides pointwise ops and views: casts, copies, fills, functional rng.
_RECOMPUTABLE = {
    aten._to_copy.default, aten.clone.default, aten.full.default, aten.zeros.default, aten.ones.default,
    aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty.memory_format,
    aten.scalar_tensor.default, aten.where.self, aten.copy.default, aten.expand.default,
    aten.select_scatter.default, aten.slice_scatter.default, aten.cat.default, aten.arange.default,
    aten.arange.start, aten.arange.start_step, aten.empty_like.default, aten.empty_strided.default,
    aten.new_empty.default, aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
    aten.new_empty_strided.default,
}


# [Note: equality is decided once] amax's and max's gradients go to the elements equal to the
# result (`self == result`): a mask that reads no tangent, so the min-cut may recompute it in the
# backward from a saved input. A value computed by a vector math function is not bit-identical
# there: g++ calls libmvec's vector variant in a loop's body and scalar libm in its tail, and which
# elements land in the tail differs from kernel to kernel. Recomputed, `x.sin().amax()` compared the
# saved maximum with a sin an ulp off it and gave every element a zero gradient. An equality of
# two computed floats is computed in the forward, beside the reduction, and its bool mask saved.
# (Within one graph a value computed twice must agree too: a complex magnitude is therefore IEEE
# arithmetic, not hypot, `magnitude` in kiln/prims/decompositions/refs.py.)
_EQUALITY = frozenset({"aten.eq.Tensor", "aten.ne.Tensor", "kiln_prims.eq.default", "kiln_prims.ne.default"})


_CONSTANT = frozenset({"kiln_prims.full.default", "aten.full.default", "aten.scalar_tensor.default"})
_SAME_VALUES = frozenset({"kiln_prims.broadcast_in_dim.default", "kiln_prims.view.default", "aten.expand.default",
                          "aten.view.default", "kiln_prims.convert_element_type.default", "aten._to_copy.default"})


def _constant(a) -> bool:
    """A constant, or a broadcast, view or cast of one: the same bits whichever kernel makes it."""
    while isinstance(a, fx.Node) and str(a.target) in _SAME_VALUES:
        a = a.args[0]
    return not isinstance(a, fx.Node) or str(a.target) in _CONSTANT


def _compares_floats(node: fx.Node) -> bool:
    """An equality of two computed floats. One against a constant (`x == 0`, `x == -inf` in a
    decomposition's special cases) stays recomputable: an ulp turns it only for a value within an
    ulp of the constant, and saving every such mask would cost attention's masks a byte an element."""
    operands = node.args[:2]
    vals = [a.meta.get("val") for a in operands if isinstance(a, fx.Node)]
    floats = any(isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()) for v in vals)
    return floats and not any(_constant(a) for a in operands)


def recomputable(node: fx.Node, also: frozenset = frozenset()) -> bool:
    """Whether the backward may run `node` again instead of having it saved (`also`: more ops the
    caller knows to be cheap, such as a prim set's copying movement ops)."""
    if node.op != "call_function":
        return node.op == "get_attr"
    target = node.target
    if target is operator.getitem or target in _RECOMPUTABLE or target in also:
        return True
    if getattr(target, "namespace", None) == "kiln" and "philox" in str(target):
        return True   # functional rng: same (seed, offset), same bits
    if str(target) in _EQUALITY and _compares_floats(node):
        return False      # [Note: equality is decided once]
    eff = schema.effects(target)
    if eff.random:
        return False
    if not isinstance(target, torch._ops.OpOverload):
        return False
    # A factory (no tensor read: full, iota, arange) costs only its write. Saved, the constants of a
    # decomposed gelu doubled GPT-2's saved bytes under bf16 autocast.
    reads_tensor = any("Tensor" in str(a.type) for a in target._schema.arguments)
    return eff.view or not reads_tensor or torch.Tag.pointwise in target.tags


def nbytes(node: fx.Node) -> int:
    """Bytes of a node's value, at the traced sizes when they are symbolic (a cost estimate must
    not specialize the program to them, as int() of a SymInt would)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return _hint(val.numel()) * val.element_size()
    if isinstance(val, (tuple, list)):
        return sum(_hint(v.numel()) * v.element_size() for v in val if isinstance(v, torch.Tensor))
    return 8


def _hint(n) -> int:
    """n at the traced sizes; a size known only at run time (unbacked: no hint) at the torch
    estimate of 8192 elements, never a guard."""
    if isinstance(n, torch.SymInt):
        return int(n.node.hint) if n.node.hint is not None else int(n.node.shape_env.optimization_hint(n.node.expr))
    return int(n)


@dataclasses.dataclass(frozen=True)
class SavedInfo:
    """What the forward hands the backward. `saved`: names of joint-graph nodes, in the order
    fw_gm returns them after its `num_fw_outputs` outputs and bw_gm takes them before the tangents."""

    saved: tuple[str, ...]
    num_fw_outputs: int
    bytes_saved: int
    bytes_save_all: int
    recomputed: tuple[str, ...]

    def __str__(self) -> str:
        return (f"saved {len(self.saved)} values, {self.bytes_saved} bytes (saving every forward value the "
                f"backward reads: {self.bytes_save_all} bytes); {len(self.recomputed)} ops recomputed")


_CHECKS = frozenset({torch.ops.aten._assert_scalar.default})


def _ancestors(roots, stop=frozenset()) -> set[fx.Node]:
    seen, todo = set(), [r for r in roots if isinstance(r, fx.Node)]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            todo.extend(n.all_input_nodes)
    return seen


@dataclasses.dataclass(frozen=True)
class _JointParts:
    """The pieces of a joint graph both partitions look at."""

    primals: list
    tangents: list
    fw_outputs: list
    bw_outputs: list
    backward: set        # nodes that depend on a tangent
    needed_by_bw: set    # ancestors of the gradients

    @staticmethod
    def of(joint: JointGraph) -> "_JointParts":
        graph = joint.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        tangents = [p for p, s in zip(placeholders, joint.inputs) if s.kind == "tangent"]
        outputs = list(next(n for n in graph.nodes if n.op == "output").args[0])
        backward: set = set()
        for n in graph.nodes:
            if n in tangents or any(a in backward for a in n.all_input_nodes):
                backward.add(n)
        bw_outputs = [outputs[i] for i in joint.output_indices("grad")]
        return _JointParts(primals=[p for p in placeholders if p not in tangents], tangents=tangents,
                           fw_outputs=[outputs[i] for i in joint.output_indices("user", "mutation")],
                           bw_outputs=bw_outputs, backward=backward, needed_by_bw=_ancestors(bw_outputs))

    def save_all(self) -> set:
        """Every forward value the backward reads directly (the bound the min-cut must meet)."""
        values = {a for n in self.backward for a in n.all_input_nodes if a not in self.backward}
        return values | {o for o in self.bw_outputs if isinstance(o, fx.Node) and o not in self.backward}


def _materialized_on_both_sides(node: fx.Node, parts: "_JointParts", materializing_ops: frozenset) -> bool:
    """[Note: values materialized on both sides] A cheap value (a ReLU's output, a layer norm's, a
    weight's bf16 cast) that an extern reads in the forward (the next convolution or matrix
    product) is written to memory there anyway; if an extern reads it in the backward too (that
    product's weight gradient), recomputing it there costs a pass that reads its inputs and writes
    it again, before the extern reads it back, where saving it costs one read and no extra write in
    the forward. So such a value is saved, not recomputed, as Inductor's partitioner decides
    (`is_materialized_backwards`): DenseNet's concatenated features, recomputed before every
    convolution's weight gradient, held its training step at eager's speed. A view is recomputed
    still (it moves nothing). The price is memory: what eager keeps for those values."""
    if node.op != "call_function" or schema.effects(node.target).view or node.target is operator.getitem:
        return False
    forward = backward = False
    users = list(node.users)
    while users:                  # through views: `x.view(...)` read by the extern reads x's memory
        user = users.pop()
        if user.op != "call_function":
            continue
        if user.target in materializing_ops:
            if user in parts.backward:
                backward = True
            else:
                forward = True
        elif schema.effects(user.target).view:
            users.extend(user.users)
    return forward and backward


def min_cut_partition(joint: JointGraph, recomputable_ops: frozenset = frozenset(),
                      materializing_ops: frozenset = frozenset()):
    """Split `joint` (functional) into (fw_gm, bw_gm, SavedInfo); see [Note: min-cut partition].
    `recomputable_ops` are ops to treat as cheap besides the built-in rule; `materializing_ops`
    read their operands from memory ([Note: values materialized on both sides])."""
    import networkx as nx    # a second to import: only a cold compile partitions (a warm start reads SavedInfo)
    parts = _JointParts.of(joint)
    drains = {n for n in parts.needed_by_bw if n in parts.backward}
    drains |= {o for o in parts.bw_outputs if isinstance(o, fx.Node)}
    flow = nx.DiGraph()
    for n in parts.needed_by_bw:
        if n in parts.backward:
            flow.add_edge(f"{n.name}_in", "sink")
            continue
        flow.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=nbytes(n))
        if n in drains:
            flow.add_edge(f"{n.name}_out", "sink")
        if n.op == "placeholder" or not recomputable(n, recomputable_ops) \
                or _materialized_on_both_sides(n, parts, materializing_ops):
            flow.add_edge("source", f"{n.name}_in")
        for user in n.users:
            if user in parts.needed_by_bw:
                flow.add_edge(f"{n.name}_out", f"{user.name}_in")
    saved: list[fx.Node] = []
    if "sink" in flow and "source" in flow:
        # Boykov-Kolmogorov: about 3x faster than networkx's default preflow-push on joint graphs
        _, (reachable, _) = nx.minimum_cut(flow, "source", "sink",
                                           flow_func=nx.algorithms.flow.boykov_kolmogorov)
        saved = [n for n in joint.gm.graph.nodes if n in parts.needed_by_bw and n not in parts.backward
                 and f"{n.name}_in" in reachable and f"{n.name}_out" not in reachable]
    return _split(joint, parts, saved)


def save_all_partition(joint: JointGraph):
    """Split `joint` saving every forward value the backward reads (no recomputation): the
    baseline the min-cut is measured against."""
    parts = _JointParts.of(joint)
    save_all = parts.save_all()
    return _split(joint, parts, [n for n in joint.gm.graph.nodes if n in save_all])


def _bare_sizes(saved: list) -> list:
    """[Note: saved sizes are symbols] A saved size computed from others (`1 + s1`, the end of a
    padded dim's slice in pad's backward; var's `2.0 / (s1 - 1.0)`) is saved as the sizes it is
    computed from (`sym_size` of an input), and the backward computes it again. The backward's
    program binds a size symbol from a dim of an input or from an int input named by it: one that
    reaches it only inside an expression (`1 + s1`) could not be bound, and the compile was refused
    ("the size symbol s1 is no dim of any tensor input")."""
    from kiln.aot.symbols import SIZE_OPS
    arithmetic = SIZE_OPS - {aten.sym_size.int, aten.sym_stride.int}
    out: list = []
    todo = list(saved)
    while todo:
        n = todo.pop(0)
        if (n.op == "call_function" and n.target in arithmetic
                and isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat))):
            todo[:0] = n.all_input_nodes
        elif n not in out:
            out.append(n)
    return out


def _symbols(value) -> set:
    """The size symbols `value` (a tensor's sizes and strides, or a SymInt) is computed from."""
    if isinstance(value, torch.Tensor):
        return set().union(*[_symbols(v) for v in (*value.shape, *value.stride())])
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return set(value.node.expr.free_symbols)
    return set()


def _bound(value) -> set:
    """The symbols the backward's program can read from input `value`: a dim or stride that is one."""
    if isinstance(value, torch.Tensor):
        return set().union(*[_bound(v) for v in (*value.shape, *value.stride())])
    if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
        return {value.node.expr}
    return set()


def _with_symbols(joint: JointGraph, parts: _JointParts, saved: list) -> list:
    """[Note: saved sizes are symbols] Also the symbols the backward computes with that no saved
    value or tangent holds as a dim (a saved `x.view(2, s0 // 2)` holds s0 only inside a
    floordiv): each is saved as `sym_size` of the forward input that has it as a dim."""
    bw_nodes = _ancestors(parts.bw_outputs, stop=frozenset(saved) | frozenset(parts.tangents))
    inputs = [n.meta.get("val") for n in (*saved, *parts.tangents)]
    needed = set().union(*[_symbols(n.meta.get("val")) for n in bw_nodes | set(saved)])
    missing = needed - set().union(*[_bound(v) for v in inputs])
    if not missing:
        return saved
    graph = joint.gm.graph
    found = {n.meta["val"].node.expr: n for n in graph.nodes
             if n.op == "call_function" and n.target in (aten.sym_size.int, aten.sym_stride.int)
             and n not in parts.backward
             and isinstance(n.meta.get("val"), torch.SymInt) and n.meta["val"].node.expr.is_Symbol}
    extra = []
    for symbol in sorted(missing, key=str):
        node = found.get(symbol)
        if node is None:
            at = next(((op, p, d) for op, read in ((aten.sym_size.int, lambda t: t.shape),
                                                     (aten.sym_stride.int, lambda t: t.stride()))
                       for p in parts.primals if isinstance(p.meta.get("val"), torch.Tensor)
                       for d, n in enumerate(read(p.meta["val"]))
                       if isinstance(n, torch.SymInt) and n.node.expr == symbol), None)
            if at is None:
                continue          # an unbacked size, or none of the inputs' dims: codegen says so
            op, primal, dim = at
            with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
                node = graph.call_function(op, (primal, dim))
            node.meta["val"] = (primal.meta["val"].shape if op is aten.sym_size.int else primal.meta["val"].stride())[dim]
        extra.append(node)
    return saved + extra


def _split(joint: JointGraph, parts: _JointParts, saved: list):
    saved = _with_symbols(joint, parts, _bare_sizes(saved))
    # a run-time check has no user but must run ([Note: run-time checks] in kiln/capture/run_time_checks.py)
    checks = [n for n in joint.gm.graph.nodes if n.op == "call_function" and n.target in _CHECKS
              and n not in parts.backward]
    fw_nodes = _ancestors(parts.fw_outputs + saved + checks)
    bw_nodes = _ancestors(parts.bw_outputs, stop=frozenset(saved) | frozenset(parts.tangents))
    info = SavedInfo(saved=tuple(n.name for n in saved), num_fw_outputs=len(parts.fw_outputs),
                     bytes_saved=sum(nbytes(n) for n in saved),
                     bytes_save_all=sum(nbytes(n) for n in parts.save_all()),
                     recomputed=tuple(n.name for n in joint.gm.graph.nodes
                                      if n in bw_nodes and n in fw_nodes and n not in saved
                                      and n.op == "call_function"))
    fw_gm = _extract(joint.gm, parts.primals, fw_nodes, parts.fw_outputs + saved)
    bw_gm = _extract(joint.gm, saved + parts.tangents, bw_nodes - set(saved), parts.bw_outputs,
                     lazy=bw_nodes - parts.backward)
    return fw_gm, bw_gm, info


def _extract(gm: fx.GraphModule, inputs: list[fx.Node], keep: set[fx.Node], outputs: list,
             lazy: set[fx.Node] = frozenset()) -> fx.GraphModule:
    """A new graph module with placeholders `inputs`, the nodes of `keep` in their original order,
    returning `outputs` (nodes of the joint graph, or constants). A node of `lazy` is placed just
    before its first user instead; see [Note: recomputation where it is used]."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        env[n] = graph.placeholder(n.name)
        env[n].meta.update(n.meta)

    def place(node: fx.Node) -> None:
        todo = [node]
        while todo:          # depth first: a node's lazy inputs, then the node
            n = todo[-1]
            if n in env:
                todo.pop()
                continue
            waiting = [a for a in n.all_input_nodes if a not in env]
            if waiting:
                todo.extend(reversed(waiting))
                continue
            env[n] = graph.node_copy(todo.pop(), lambda a: env[a])

    for n in gm.graph.nodes:
        if n in keep and n not in env and n.op != "placeholder" and n not in lazy:
            place(n)
    for o in outputs:        # a gradient that is a recomputed value
        if isinstance(o, fx.Node):
            place(o)
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    return graph_module(gm, graph)
