"""The scheduler: fuse the lowered graph's nodes into kernels (`ir.Kernel`), in execution order.

Walks `ir.Graph.nodes` in order and grows one fusion group at a time. A group is one loop nest:
outer ranges `O` and, once a reduction joins, inner ranges `I`. A node joins the current group when
its iteration space fits (a pointwise node covers `O` or `O x I` element for element; a reduction
covers `O` over `I`) and every read of a buffer made inside the group is at exactly the index
where that buffer was written (checked on the index expressions in the kernel's variables), and a
read of a reduction comes in a later stage. That gives vertical fusion (producer into consumer),
horizontal fusion (siblings over one space), and reductions fused with their producers and
consumers: softmax is one kernel of three stages (max, sum of exp, normalize).

Every refusal is recorded as a `WhyNoFuse(group, node, reason)`. Inside a group, buffers no one
reads outside it stay kernel-local values (`Assign` / accumulators), never touching memory.
Externs and scans end the current group (scans run as kernels of their own).

[Note: matmul template epilogues] An `ir.MatmulTemplate` (max-autotune's product or convolution, or
decoding's GEMV by default: [Note: matmul templates] in matmul_templates.py) opens a group of its own and is placed as the pointwise node its
body is; its kernel is a template kernel (`ir.Kernel.template`). A later node joins it as an
epilogue only if it is pointwise, reads something the group computes, gathers nothing (every load
is at an index of the tile's own (m, n), a bias broadcast along m for one), and passes the rules
above: its space is the product's element for element and it reads the product where the product
is written (a consumer reading it transposed is refused, and runs as a kernel of its own). Nodes
are never moved into a template's group from across an extern.

An `ir.SiblingGemvTemplate` (products of one A, [Note: sibling GEMVs] in matmul_templates.py) opens
one such group whose members are its products' bodies, each reading its own sum over K: where all
have one N they are placed as pointwise nodes of one space, and an epilogue joins as above (LLaMA's
`silu(gate) * up` reads both, and gate and up stay kernel-local); members of several Ns are the
segments of one kernel (a stage each, over its own `[M, N_i]`), and an epilogue joins the one
segment whose results it reads (a float32 bias add); one reading two segments is refused.

A GEMV template may compute its A from A's producer (a row normalization) instead of loading it:
`prologues.find_prologues` decides which templates take in which nodes before anything is fused
([Note: norm prologues] in prologues.py), and records the templates that cannot, with why. The
nodes taken in are skipped where they stand; the template's kernel computes them in leading
stages over K (`ir.Kernel.prologue`), and their buffers never reach memory.

[Note: the stage model] A kernel runs, per outer index, its stages in order. A node in the last
stage of the same kind joins it unless it reads a reduction finished in that stage; else a new
stage begins. Reduction results live at the outer scope, so any later stage reads them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.ir import Accumulate, Assign, Constant, Load, ScanAccumulate, Stage, Store, Var, loop_var, reduction_var
from kiln.codegen.indexing import index_bounds, simplify_index
from kiln.codegen.lowering import EXPENSIVE_OPS, reshape_index
from kiln.codegen import prologues as prologue_rules
from kiln.codegen.prologues import find_prologues, prologue_stages


@dataclasses.dataclass(frozen=True)
class WhyNoFuse:
    group: tuple[str, ...]     # buffers of the group that refused
    node: str                  # the buffer of the node that did not join
    reason: str

    def __str__(self):
        return f"cannot fuse {self.node} into [{', '.join(self.group)}]: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The scheduler's output: kernels and externs in order, and every refused fusion."""

    steps: tuple            # ir.Kernel | ir.ExternKernel
    refused: tuple[WhyNoFuse, ...]
    local_buffers: frozenset[str]   # buffers that never reach memory

    def __str__(self):
        lines = [str(s) for s in self.steps]
        lines += [f"# {w}" for w in self.refused]
        return "\n".join(lines)


def _bounds(outer: Sequence, inner: Sequence | None) -> dict:
    out = {loop_var(k): sympy.sympify(r) for k, r in enumerate(outer)}
    out.update({reduction_var(k): sympy.sympify(r) for k, r in enumerate(inner or ())})
    return out


_COMPARE = {"lt": lambda lo, hi, c: (hi < c, lo >= c), "le": lambda lo, hi, c: (hi <= c, lo > c),
            "gt": lambda lo, hi, c: (lo > c, hi <= c), "ge": lambda lo, hi, c: (lo >= c, hi < c)}


def _fold_compare(e: ir.Op, upper: dict):
    """A comparison of two indices (or constants) that the loop bounds decide (a padded window's
    `2*x1 + 1 < 32` for x1 < 16) becomes that constant; masks then keep only the tests that bite."""
    def index_of(x):
        if isinstance(x, ir.IndexValue):
            return sympy.sympify(x.index)
        if isinstance(x, Constant) and isinstance(x.value, int) and not isinstance(x.value, bool):
            return sympy.Integer(x.value)
        return None
    a, b = (index_of(x) for x in e.args)
    if a is None or b is None:
        return e
    bounds = index_bounds(sympy.expand(a - b), upper)
    if bounds is None:
        return e
    true, false = _COMPARE[e.name](bounds[0], bounds[1], 0)
    return Constant(True, torch.bool) if true else Constant(False, torch.bool) if false else e


def _fold_logic(e: ir.Op):
    """and/or/not/where with a constant operand (left by _fold_compare)."""
    consts = [a.value if isinstance(a, Constant) and a.dtype == torch.bool else None for a in e.args]
    if e.name in ("logical_and", "logical_or") and e.dtype == torch.bool:
        absorbing = e.name == "logical_or"     # x or True is True; x and False is False
        if absorbing in consts:
            return Constant(absorbing, torch.bool)
        if consts[0] is (not absorbing):         # the neutral constant drops out
            return e.args[1]
        if consts[1] is (not absorbing):
            return e.args[0]
    elif e.name == "logical_not" and consts[0] is not None:
        return Constant(not consts[0], torch.bool)
    elif e.name == "where" and consts[0] is not None and e.args[1].dtype == e.args[2].dtype == e.dtype:
        return e.args[1] if consts[0] else e.args[2]
    return e


def _simplify_expr(expr, upper: dict):
    def fn(e):
        if isinstance(e, (Load, ir.IndexValue)):
            return dataclasses.replace(e, index=simplify_index(e.index, upper))
        if isinstance(e, ir.Op) and e.name in _COMPARE:
            return _fold_compare(e, upper)
        if isinstance(e, ir.Op):
            return _fold_logic(e)
        return e
    return ir.map_expr(expr, fn)


def _kernel_vars(outer: Sequence, inner: Sequence | None) -> list[sympy.Symbol]:
    return [loop_var(k) for k in range(len(outer))] + [reduction_var(k) for k in range(len(inner or ()))]


def _space_map(ranges: Sequence, target: Sequence, target_vars: Sequence[sympy.Symbol]) -> dict | None:
    """Node loop vars -> expressions in `target_vars`, when the node's space is `target`'s, element
    for element (same numel, row-major order)."""
    mapping = _space_map_of(tuple(ranges), tuple(target), tuple(target_vars))
    return None if mapping is None else dict(mapping)


@functools.lru_cache(maxsize=4096)
def _space_map_of(ranges: tuple, target: tuple, target_vars: tuple) -> dict | None:
    # a graph's layers repeat the same few spaces: the fusion of every layer asks the same
    # questions, and each answer costs sympy arithmetic (about a millisecond)
    difference = sympy.sympify(ir.product(ranges) - ir.product(target))
    # sympy.simplify costs ~0.4 ms even on a number: most spaces differ by a number, or not at all
    if difference != 0 and (difference.is_number or sympy.simplify(difference) != 0):
        return None
    if list(ranges) == list(target):
        return {loop_var(k): target_vars[k] for k in range(len(ranges))}
    old = reshape_index(list(ranges), list(target))   # node dims in terms of target's x0..
    rename = {loop_var(k): v for k, v in enumerate(target_vars)}
    return {loop_var(k): sympy.sympify(e).xreplace(rename) for k, e in enumerate(old)}


@dataclasses.dataclass
class _Placed:
    node: ir.ComputedBuffer
    kind: str                 # "once" | "inner"
    mapping: dict             # node's loop vars -> kernel vars
    store_index: sympy.Expr   # where the node writes, in kernel vars
    stage: int = 0


class _Planner:
    def __init__(self, graph: ir.Graph):
        self.buffers = graph.buffer_map()
        self.outputs = {o if isinstance(o, str) else o.name for o in graph.outputs
                        if isinstance(o, (str, ir.ViewArg))}
        self.readers: dict[str, set[int]] = {}
        for i, node in enumerate(graph.nodes):
            for name in _reads(node):
                self.readers.setdefault(name, set()).add(i)
        self.position = {id(n): i for i, n in enumerate(graph.nodes)}
        for i, node in enumerate(graph.nodes):     # sibling products sit where their node does
            if isinstance(node, ir.SiblingGemvTemplate):
                self.position.update((id(m), i) for m in node.members)

    def place(self, nodes: list[ir.ComputedBuffer], outer, inner) -> list[_Placed] | str:
        """Stage the group, or say why it cannot be one kernel."""
        kvars = _kernel_vars(outer, inner)
        upper = _bounds(outer, inner)
        outer_vars, inner_vars = kvars[:len(outer)], kvars[len(outer):]
        placed: dict[str, _Placed] = {}
        stages: list[tuple[str, set[str]]] = []   # (kind, reductions finished in that stage)
        out = []
        empty_group = sympy.sympify(ir.product(outer)) == 0
        for node in nodes:
            body, buf = node.body, self.buffers[node.buffer]
            if sympy.sympify(ir.product(body.ranges)) == 0 and not empty_group:
                # Mapped onto a non-empty space (its 0 x 5 points as a reduction's 5 outputs of
                # rows of 0), an empty buffer's index folds to 0 and its statements, having no
                # loop variable, ran unmasked: a store and loads out of bounds of empty tensors
                # (fuzz seed 1000616 of --triton-interpret: SIGSEGV; on a GPU a fault or a write
                # into a neighbour). An empty buffer is its own kernel, which never launches.
                return f"{node.buffer} has no elements"
            if isinstance(body, ir.Reduction):
                if inner is None:
                    return "a reduction needs an inner loop"
                m1 = _space_map(body.ranges, outer, outer_vars)
                m2 = _space_map(body.reduction_ranges, inner, inner_vars)
                if m1 is None or m2 is None:
                    return f"reduction space {list(body.ranges)} over {list(body.reduction_ranges)} differs"
                m2 = {reduction_var(k): m2[loop_var(k)] for k in range(len(body.reduction_ranges))}
                mapping, kind = {**m1, **m2}, "inner"
                store = buf.index([m1[loop_var(k)] for k in range(len(body.ranges))])
            elif isinstance(body, ir.Pointwise):
                mapping = _space_map(body.ranges, outer, outer_vars)
                kind = "once"
                if mapping is None and inner is not None:
                    mapping, kind = _space_map(body.ranges, list(outer) + list(inner), kvars), "inner"
                if mapping is None:
                    return f"iteration space {list(body.ranges)} differs from {list(outer) + list(inner or [])}"
                store = buf.index([mapping[loop_var(k)] for k in range(len(body.ranges))])
            elif isinstance(body, ir.Scatter):
                # [Note: scatters write in place]: the buffer it writes into exists before the kernel
                if body.into in placed:
                    return f"scatters into {body.into}, which the group computes"
                if inner is not None:   # the printers store indirectly from flat (pointwise) blocks only
                    return "a scatter joins no kernel with an inner loop (a reduction's)"
                mapping = _space_map(body.ranges, outer, outer_vars)
                kind = "once"
                if mapping is None:
                    return f"iteration space {list(body.ranges)} differs from {list(outer) + list(inner or [])}"
                store = sympy.sympify(body.index).xreplace(mapping)
            else:
                return "scans run as kernels of their own"
            mapping = {k: simplify_index(v, upper) for k, v in mapping.items()}
            store = simplify_index(store, upper)
            if any(sympy.sympify(e).has(sympy.floor, sympy.Mod) for e in mapping.values()):
                return f"space {list(body.ranges)} maps onto the kernel's loops only through div/mod (strided access)"
            need_new_stage = not stages or stages[-1][0] != kind
            for ld in ir.body_loads(body):
                producer = placed.get(ld.buffer)
                if producer is None:
                    continue
                if isinstance(producer.node.body, ir.Scatter):
                    return f"reads {ld.buffer}, which the group writes at loaded indices"
                index = simplify_index(sympy.sympify(ld.index).xreplace(mapping), upper)
                if ld.indirect or sympy.expand(index - producer.store_index) != 0:
                    return f"reads {ld.buffer} at {index}, which the group writes at {producer.store_index}"
                if isinstance(producer.node.body, ir.Reduction) and stages and ld.buffer in stages[-1][1]:
                    need_new_stage = True
            if need_new_stage:
                stages.append((kind, set()))
            if isinstance(body, ir.Reduction):
                stages[-1][1].add(node.buffer)
            p = _Placed(node, kind, mapping, store, len(stages) - 1)
            placed[node.buffer] = p
            out.append(p)
        return out

    def is_local(self, p: _Placed, group: list[_Placed], recomputable: bool = True) -> bool:
        """Does `p`'s buffer stay inside the kernel? (`recomputable`: a later inner stage may
        recompute it, see [Note: recomputed inner values])"""
        name = p.node.buffer
        if name in self.outputs:
            return False
        members = {self.position[id(q.node)]: q for q in group}
        for reader in self.readers.get(name, ()):
            q = members.get(reader)
            if q is None:
                return False
            # an inner value a later inner stage reads is recomputed there (see _emit_kernel)
            if isinstance(p.node.body, ir.Pointwise) and p.kind == "inner" and q.stage != p.stage \
                    and (q.kind != "inner" or not recomputable):
                return False
        return True


def _reads(node: ir.Node) -> set[str]:
    if isinstance(node, ir.AttentionTemplate):
        return _attention_reads(node)
    if isinstance(node, ir.MatmulTemplate):
        return {ld.buffer for ld in ir.loads_of(node.body.expr)} | {node.product.a.name, node.product.b.name}
    if isinstance(node, ir.SiblingGemvTemplate):
        return {ld.buffer for m in node.members for ld in ir.loads_of(m.body.expr)} | \
            {v.name for v in node.product.operands}
    if isinstance(node, ir.ComputedBuffer):
        into = {node.body.into} if isinstance(node.body, ir.Scatter) else set()
        return {ld.buffer for ld in ir.body_loads(node.body)} | into
    names = set()
    for a in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs])):
        if isinstance(a, (ir.BufferArg, ir.ViewArg)):
            names.add(a.name)
    return names


def _sizes_read(node: ir.Node) -> set[str]:
    """The names of the size symbols a node reads: its ranges and indices, or an extern's size and
    view arguments."""
    if isinstance(node, ir.SiblingGemvTemplate):
        return set().union(*(_sizes_read(m) for m in node.members))
    if isinstance(node, ir.AttentionTemplate):      # its operands are static
        return {s.name for e in _attention_exprs(node) for x in ir.walk(e) if isinstance(x, (ir.Load, ir.IndexValue))
                for s in sympy.sympify(x.index).free_symbols if not ir.is_loop_var(s)}
    if isinstance(node, (ir.ComputedBuffer, ir.MatmulTemplate)):    # a template's operands are static
        body = node.body
        exprs = [*body.ranges, *getattr(body, "reduction_ranges", ()), getattr(body, "scan_range", 0)]
        exprs += [e.index for x in ir.body_exprs(body) for e in ir.walk(x) if isinstance(e, (ir.Load, ir.IndexValue))]
        exprs += [n for x in ir.body_exprs(body) for e in ir.loads_of(x) for _, n in e.bounds]
        if isinstance(body, ir.Scatter):
            exprs += [body.index, *(n for _, n in body.bounds)]
    else:
        exprs = []
        for a in torch.utils._pytree.tree_leaves((node.args, [v for _, v in node.kwargs]),
                                                 is_leaf=lambda x: isinstance(x, (ir.SizeArg, ir.ViewArg))):
            if isinstance(a, ir.SizeArg):
                exprs.append(a.expr)
            elif isinstance(a, ir.ViewArg):
                exprs += [*a.sizes, *a.strides, a.offset]
    return {s.name for e in exprs for s in sympy.sympify(e).free_symbols}


def _space(node: ir.ComputedBuffer):
    body = node.body
    if isinstance(body, ir.Reduction):
        return tuple(body.ranges), tuple(body.reduction_ranges)
    if isinstance(body, ir.Scan):
        return tuple(body.ranges), (body.scan_range,)
    return tuple(body.ranges), None


# Nodes after an extern that [Note: siblings across an extern] looks at, and the largest value it
# moves into a group that shares no input with it (a weight's cast: fewer launches, later layers'
# bias casts in one kernel; a bigger one would hold memory the whole way).
HOIST_LOOKAHEAD = 32
HOIST_MAX_BYTES = 1 << 20


def _writes(node: ir.Node) -> tuple:
    return node.outputs if isinstance(node, ir.ExternKernel) else (node.buffer,)


# Groups kept open at once: a node that fits none of them opens another, so an unrelated node
# (a permute for the next matmul) does not cut a softmax in two.
MAX_OPEN_GROUPS = 4


@dataclasses.dataclass
class _Group:
    nodes: list
    space: tuple
    plan: list
    template: ir.MatmulProduct | ir.SiblingGemvs | None = None    # the group's first node is a matmul template
    # sibling products of several Ns: each segment's plan and space, one stage each (`plan` unused)
    segments: list[tuple[list, tuple]] | None = None
    prologue: tuple[ir.ComputedBuffer, ...] = ()   # the nodes its template computes A from

    @property
    def names(self) -> set[str]:
        return {n.buffer for n in self.nodes}


def _sibling_group(node: ir.SiblingGemvTemplate, planner: "_Planner") -> _Group:
    """The group of products of one A ([Note: matmul template epilogues]): one space when the
    members have one N, else a plan per segment."""
    product = node.product
    spaces = [(tuple(node.members[seg[0]].body.ranges), None) for seg in product.segments]
    plans = [planner.place([node.members[j] for j in seg], *space) for seg, space in zip(product.segments, spaces)]
    for plan in plans:
        assert not isinstance(plan, str), plan
    if len(plans) == 1:
        return _Group(list(node.members), spaces[0], plans[0], product)
    return _Group(list(node.members), spaces[0], [], product, list(zip(plans, spaces)))


def _join_segment(group: _Group, node: ir.ComputedBuffer, planner: "_Planner") -> str | None:
    """`node` joins the segment of sibling products whose results it reads as that segment's epilogue,
    or says why not: a program computes one segment's columns, so a node reading two segments'
    results runs as a kernel of its own."""
    reads = _reads(node)
    hit = [i for i, (plan, _) in enumerate(group.segments) if reads & {p.node.buffer for p in plan}]
    if len(hit) != 1:
        return ("reads the results of several segments of sibling GEMVs (one program computes one "
                "segment's columns: [Note: sibling GEMVs])")
    plan, space = group.segments[hit[0]]
    result = planner.place([p.node for p in plan] + [node], *space)
    if isinstance(result, str):
        return result
    group.segments[hit[0]] = (result, space)
    group.nodes.append(node)
    return None


def _epilogue_refusal(group: _Group, node: ir.Node) -> str | None:
    """Why `node` cannot join a matmul template's group ([Note: matmul template epilogues]), before
    the placement rules every group applies; None if nothing here forbids it."""
    if not isinstance(node, ir.ComputedBuffer) or not isinstance(node.body, ir.Pointwise):
        return "a matmul template's epilogue is pointwise; a reduction runs as a kernel of its own"
    if not _reads(node) & group.names:
        return "reads nothing the matmul template's kernel computes"
    if any(ld.indirect for ld in ir.loads_of(node.body.expr)):
        return "gathers (indirect loads) do not join a matmul template's epilogue"
    return None


def schedule(graph: ir.Graph) -> Schedule:
    """Fuse `graph` into kernels; see the module docstring for the rules."""
    planner = _Planner(graph)
    steps: list = []
    refused: list[WhyNoFuse] = []
    local: set[str] = set()
    open_groups: list[_Group] = []     # in creation order; emitted in that order

    def kernel_name():
        return f"kernel{sum(isinstance(s, ir.Kernel) for s in steps)}"

    def flush_through(index: int):
        """Emit open groups 0..index (a later group may read an earlier one, never the reverse)."""
        for g in open_groups[:index + 1]:
            if g.segments is not None:
                kernel, locals_ = _emit_segments(kernel_name(), g.segments, planner, g.template)
            else:
                kernel, locals_ = _emit_kernel(kernel_name(), g.plan, g.space, planner, g.template)
            if g.prologue:
                kernel = _with_prologue(kernel, g.prologue, planner)
                locals_ = locals_ | {n.buffer for n in g.prologue}
            steps.append(kernel)
            local.update(locals_)
            emitted.update(g.names)
        del open_groups[:index + 1]

    read_sets: dict[int, set[str]] = {}
    # [Note: host values are read too] An extern may return a number the host program holds
    # (`val2 = mul(5, 2)` of sizes specialized at the trace, a count read with `.item()`), which a
    # later step takes as a size. Such a name is read like a buffer: a step that reads it is never
    # moved before the extern that makes it (fuzz seed 1003674: a copy_strided extern hoisted
    # ahead of the `val2` its strides named, an UnboundLocalError in the host program).
    host_values = {o for n in graph.nodes if isinstance(n, ir.ExternKernel)
                   for o in n.outputs if o is not None and o not in planner.buffers}

    def reads_of(node) -> set[str]:
        if id(node) not in read_sets:
            read_sets[id(node)] = _reads(node) | (_sizes_read(node) & host_values if host_values else set())
        return read_sets[id(node)]

    def newest_read(node) -> int:
        reads = reads_of(node)
        hits = [i for i, g in enumerate(open_groups) if reads & g.names]
        return max(hits) if hits else -1

    nodes = list(graph.nodes)
    emitted = {b for b in graph.inputs if b is not None} | {b.name for b in graph.buffers if b.name.startswith("const")}
    prologues, refusals = find_prologues(nodes, planner, _reads, _simplify_expr) if prologue_rules.NORM_PROLOGUES \
        else ({}, [])
    refused += [WhyNoFuse(r.template, r.producer, f"not computed in the GEMV's prologue: {r.reason}") for r in refusals]
    hoisted: set[int] = {id(n) for taken in prologues.values() for n in taken}   # skipped where they stand

    def produced() -> set[str]:
        return emitted.union(*(g.names for g in open_groups))

    def hoist_into(groups: list[_Group], ahead: Sequence) -> None:
        """[Note: siblings across an extern] Before the groups an extern reads are flushed, a later
        pointwise node joins one of them if it fits and its inputs exist by then, or are made by a
        later extern that can run first (it reads only what kernels emitted already made): the
        gelu a weight-gradient matmul reads, recomputed in the backward, and the gelu's gradient,
        after the matmul that gives its input, read the same activation, and became one kernel
        reading it once (Inductor's `fused_gelu_gelu_backward`) instead of two. A node that shares no
        input with the group joins only if it is small (`HOIST_MAX_BYTES`): it saves a launch, where
        a big one made early would hold its memory longer. Moving nodes earlier is safe in a
        functional graph: each reads only what exists, and whatever reads it comes later."""
        ready: dict[str, ir.ExternKernel] = {}     # buffer -> a later extern that could run now
        for cand in ahead:
            if id(cand) in hoisted or isinstance(cand, (ir.MatmulTemplate, ir.SiblingGemvTemplate, ir.AttentionTemplate)):
                continue
            if isinstance(cand, ir.ExternKernel):
                if reads_of(cand) <= emitted:
                    ready.update({o: cand for o in cand.outputs if o is not None})
                continue
            if not isinstance(cand.body, ir.Pointwise):
                continue
            reads = reads_of(cand)
            numel = sympy.sympify(planner.buffers[cand.buffer].numel)
            small = numel.is_Integer and int(numel) * planner.buffers[cand.buffer].dtype.itemsize <= HOIST_MAX_BYTES
            missing = reads - produced()
            if not missing <= ready.keys():
                continue
            newest = newest_read(cand)
            for gi in range(len(groups) - 1, max(newest, 0) - 1, -1):
                g = groups[gi]
                if g.template is not None:
                    continue        # [Note: matmul template epilogues]
                if g.space[1] is not None or sympy.sympify(ir.product(g.space[0])) != numel:
                    continue        # pointwise groups of as many points: a reduction's stages stay as built
                if not small and not reads & set().union(*(reads_of(n) for n in g.nodes)):
                    continue        # made early, a big value would only hold memory longer
                result = planner.place(g.nodes + [cand], *g.space)
                if isinstance(result, str):
                    continue
                for extern in dict.fromkeys(ready[b] for b in missing):   # they run before the group
                    steps.append(extern)
                    hoisted.add(id(extern))
                    emitted.update(o for o in extern.outputs if o is not None)
                ready = {b: x for b, x in ready.items() if id(x) not in hoisted}
                g.nodes.append(cand)
                g.plan = result
                hoisted.add(id(cand))
                break

    for position, node in enumerate(nodes):
        if id(node) in hoisted:
            continue
        if isinstance(node, ir.SiblingGemvTemplate):    # opens a group of its own
            if len(open_groups) >= MAX_OPEN_GROUPS:
                flush_through(0)
            open_groups.append(dataclasses.replace(_sibling_group(node, planner), prologue=prologues.get(position, ())))
            continue
        last = newest_read(node)
        if isinstance(node, (ir.ExternKernel, ir.AttentionTemplate)) or isinstance(node.body, ir.Scan):
            # runs as its own step, after every open group it reads
            if last >= 0:
                if not isinstance(node, ir.ExternKernel):
                    refused.append(WhyNoFuse(tuple(sorted(open_groups[last].names)), node.buffer,
                                             f"{_ALONE[type(node)]} run as kernels of their own"))
                hoist_into(open_groups[:last + 1], nodes[position + 1:position + 1 + HOIST_LOOKAHEAD])
                flush_through(last)
            steps.append(node if isinstance(node, ir.ExternKernel) else _own_kernel(kernel_name(), node, planner))
            emitted.update(o for o in _writes(node) if o is not None)
            continue
        outer, inner = _space(node)
        joined = False
        if isinstance(node, ir.MatmulTemplate):      # opens a group of its own
            if len(open_groups) >= MAX_OPEN_GROUPS:
                flush_through(0)
            open_groups.append(_Group([node], (outer, None), planner.place([node], outer, None), node.product,
                                      prologue=prologues.get(position, ())))
            continue
        # newest group first; a node may join a group only if it reads no newer open group
        for gi in range(len(open_groups) - 1, max(last, 0) - 1, -1):
            g = open_groups[gi]
            if gi < last:
                break
            if g.template is not None and (why := _epilogue_refusal(g, node)) is not None:
                refused.append(WhyNoFuse(tuple(sorted(g.names)), node.buffer, why))
                continue
            if g.segments is not None:
                why = _join_segment(g, node, planner)
                if why is None:
                    joined = True
                    break
                refused.append(WhyNoFuse(tuple(sorted(g.names)), node.buffer, why))
                continue
            cands = [(outer, inner)] if (g.space[1] is None and inner is not None) else [g.space]
            result = None
            for cand in cands:
                result = planner.place(g.nodes + [node], *cand)
                if not isinstance(result, str):
                    g.nodes.append(node)
                    g.plan, g.space = result, cand
                    joined = True
                    break
            if joined:
                break
            refused.append(WhyNoFuse(tuple(sorted(g.names)), node.buffer, result))
        if joined:
            continue
        if len(open_groups) >= MAX_OPEN_GROUPS:
            flush_through(0)
        plan = planner.place([node], outer, inner)
        assert not isinstance(plan, str), plan
        open_groups.append(_Group([node], (outer, inner), plan))
    flush_through(len(open_groups) - 1)
    return Schedule(tuple(steps), tuple(refused), frozenset(local))


def _localize(expr, local_vars: dict[str, torch.dtype]):
    def fn(e):
        if isinstance(e, Load) and e.buffer in local_vars:
            return Var(e.buffer, e.dtype)
        return e
    return ir.map_expr(expr, fn)


# A value whose expression (inlined down to memory loads) is bigger than this is stored, not recomputed.
MAX_RECOMPUTE_NODES = 64

def _inline_earlier(expr, recompute: dict, stage_scope: dict):
    """Loads of inner values an earlier stage computed (and did not store) become their expressions."""
    def fn(e):
        if isinstance(e, Load) and e.buffer in recompute and e.buffer not in stage_scope:
            return recompute[e.buffer]
        return e
    return ir.map_expr(expr, fn)


def _scratch_for(p: _Placed, plan: list[_Placed], planner: _Planner) -> str | None:
    """A buffer that can hold inner value `p` from its stage until the later stage that reads it:
    the buffer of its last reader there, when that reader is stored anyway, at the same index, in
    the same dtype, and every later-stage read of `p` comes in that stage, at or before it (the
    value is reloaded at the stage's first read, before the reader overwrites it)."""
    if planner.buffers[p.node.buffer].device != "cpu":
        return None      # a Triton program's threads would need a barrier between store and reload
    later = [q for q in plan if q.stage != p.stage and p.node.buffer in _reads(q.node)]
    if not later or len({q.stage for q in later}) != 1:
        return None
    q = later[-1]
    buf, qbuf = planner.buffers[p.node.buffer], planner.buffers[q.node.buffer]
    if q.kind != "inner" or not isinstance(q.node.body, ir.Pointwise) or qbuf.dtype != buf.dtype \
            or sympy.expand(q.store_index - p.store_index) != 0 or planner.is_local(q, plan, recomputable=False):
        return None
    return q.node.buffer


def _emit_kernel(name: str, plan: list[_Placed], space, planner: _Planner,
                 template: ir.MatmulProduct | ir.SiblingGemvs | None = None):
    """[Note: inner values a later stage reads] An inner pointwise value that a later inner stage
    reads (softmax's exp(x - max), read again to normalize) is, when cheap, recomputed there from
    its expression (`recompute`: over memory loads and outer-scope values); when costly (an exp),
    written to the buffer of its reader in that stage and reloaded from there (`scratch`: the
    reader overwrites it in place, so the row stays in cache and no buffer of its own is
    allocated); failing both, stored in its own buffer."""
    outer, inner = space
    upper = _bounds(outer, inner)
    emitted: list[tuple[str, list]] = []
    locals_: set[str] = set()
    in_scope: dict[str, torch.dtype] = {}     # readable as Var in every later stage
    stage_scope: dict[str, torch.dtype] = {}  # readable as Var in the current inner stage only
    recompute: dict[str, ir.ScalarExpr] = {}  # inner values of earlier stages, by expression
    scratch: dict[str, tuple[str, sympy.Expr]] = {}   # inner values of earlier stages, in another buffer
    holders: set[str] = set()                 # buffers holding another value: stored, hold one only
    pending: list[Store] = []                 # reduction results to store once their stage ends
    current = -1
    for p in plan:
        if p.stage != current:
            if pending and p.kind != "once":
                emitted.append(("once", pending))
                emitted.append((p.kind, []))
            else:
                emitted.append((p.kind, list(pending)))
            pending, stage_scope, current = [], {}, p.stage
        body_list = emitted[-1][1]
        buf = planner.buffers[p.node.buffer]
        body = p.node.body
        expr = _simplify_expr(ir.subs_index(body.expr, p.mapping), upper)
        for ld in ir.loads_of(expr):    # a value kept in a scratch buffer: reloaded once per stage
            if ld.buffer in scratch and ld.buffer not in stage_scope:
                where, index = scratch[ld.buffer]
                body_list.append(Assign(ld.buffer, Load(where, index, ld.dtype)))
                stage_scope[ld.buffer] = ld.dtype
        expr = _inline_earlier(expr, recompute, stage_scope)
        again, keep_in = None, None
        if isinstance(body, ir.Pointwise) and p.kind == "inner" and buf.name not in holders:
            # its expression for a later stage: this stage's values inlined too
            again = _localize(_inline_earlier(expr, recompute, {}), in_scope)
            # an earlier value of this kernel that is not recomputed never reaches memory: an
            # expression loading it cannot be evaluated in another stage
            if sum(1 for _ in ir.walk(again)) > MAX_RECOMPUTE_NODES or \
                    any(isinstance(e, ir.Op) and e.name in EXPENSIVE_OPS for e in ir.walk(again)) or \
                    any(ld.buffer in locals_ for ld in ir.loads_of(again)):
                again, keep_in = None, _scratch_for(p, plan, planner)
                if keep_in in holders:
                    keep_in = None
        expr = _localize(expr, {**in_scope, **stage_scope})
        if isinstance(body, ir.Scatter):      # never local: it writes a buffer that exists already
            binds = tuple((t, _localize(_inline_earlier(_simplify_expr(ir.subs_index(x, p.mapping), upper), recompute,
                                                        stage_scope), {**in_scope, **stage_scope}))
                          for t, x in body.indirect)
            body_list.append(Store(buf.name, p.store_index, expr, binds, body.bounds, body.accumulate, body.origin))
            continue
        is_local = buf.name not in holders and \
            planner.is_local(p, plan, recomputable=again is not None or keep_in is not None)
        if is_local:
            locals_.add(buf.name)
            if again is not None:
                recompute[buf.name] = again
        if isinstance(body, ir.Reduction):
            body_list.append(Accumulate(buf.name, body.op, expr))
            in_scope[buf.name] = buf.dtype
            if not is_local:
                pending.append(Store(buf.name, p.store_index, Var(buf.name, buf.dtype)))
        else:
            body_list.append(Assign(buf.name, expr))
            (in_scope if p.kind == "once" else stage_scope)[buf.name] = buf.dtype
            if not is_local:
                body_list.append(Store(buf.name, p.store_index, Var(buf.name, buf.dtype)))
            elif keep_in is not None:
                holders.add(keep_in)
                scratch[buf.name] = (keep_in, p.store_index)
                body_list.append(Store(keep_in, p.store_index, Var(buf.name, buf.dtype)))
    if pending:
        emitted.append(("once", pending))
    stages = tuple(Stage(tuple(inner) if kind == "inner" else (), tuple(body)) for kind, body in emitted)
    if inner is None and template is None:     # a template's tiles fix its loop order
        outer, stages = choose_loop_order(tuple(outer), stages)
    return _finish(name, tuple(outer), stages, tuple(p.node.buffer for p in plan), template), locals_


def _emit_segments(name: str, segments: list[tuple[list, tuple]], planner: _Planner, template: ir.SiblingGemvs):
    """The kernel of sibling products of several Ns: segment i's members as its stage i, over
    `[M, N_i]`; the kernel's ranges are `[M, sum of N_i]`, the columns its programs cover."""
    stages, origins, locals_ = [], [], set()
    for plan, space in segments:
        kernel, local = _emit_kernel(name, plan, space, planner, template)
        (stage,) = kernel.stages
        stages.append(stage)
        origins += kernel.origins
        locals_ |= local
    m = segments[0][1][0][0]
    columns = sum(int(space[0][-1]) for _, space in segments)
    return _finish(name, (m, sympy.Integer(columns)), tuple(stages), tuple(origins), template), locals_


def _with_prologue(kernel: ir.Kernel, taken: tuple[ir.ComputedBuffer, ...], planner: _Planner) -> ir.Kernel:
    """A template's kernel computing A from the nodes it took in ([Note: norm prologues]): their
    stages first, A no longer an argument."""
    template = dataclasses.replace(kernel.template, prologue=True)
    stages = prologue_stages(taken, template.a, planner, _simplify_expr)
    return _finish(kernel.name, kernel.ranges, stages + kernel.stages,
                   tuple(n.buffer for n in taken) + kernel.origins, template)


def _accesses(stages) -> list[sympy.Expr]:
    out = []
    for st in stages:
        for s in st.body:
            if isinstance(s, Store):
                out.append(sympy.sympify(s.index))
            out += [sympy.sympify(ld.index) for ld in ir.loads_of(s.expr) if not ld.indirect]
    return out


def choose_loop_order(ranges: tuple, stages: tuple) -> tuple[tuple, tuple]:
    """The loop-order pass for pointwise kernels: the innermost loop becomes the dim along which
    loads and stores move least in memory (unit stride vectorizes and stays in cache lines).
    Steps are measured by moving each variable by one from a typical point, so div/mod indices
    (a decomposition's permuted layouts) count too."""
    n = len(ranges)
    if n < 2 or not all(sympy.sympify(r).is_number for r in ranges):
        return ranges, stages
    xs = [loop_var(k) for k in range(n)]
    point = {x: sympy.Integer(1 if int(r) > 1 else 0) for x, r in zip(xs, ranges)}
    accesses = _accesses(stages)

    def cost(k: int) -> int:
        if int(ranges[k]) == 1:
            return 1 << 30
        total = 0
        for index in accesses:
            step = sympy.sympify(index.xreplace({**point, xs[k]: point[xs[k]] + 1}) - index.xreplace(point))
            total += min(abs(int(step)), 64) if step.is_number else 64
        return total
    costs = [cost(k) for k in range(n)]
    best = min(range(n), key=lambda k: (costs[k], -k))
    if best == n - 1 or costs[best] >= costs[n - 1]:
        return ranges, stages
    order = [k for k in range(n) if k != best] + [best]           # old dims, outermost first
    rename = {xs[old]: xs[new] for new, old in enumerate(order)}

    def fix(e):
        return ir.subs_index(e, rename)
    new_stages = tuple(Stage(st.reduction_ranges, tuple(
        dataclasses.replace(ir.map_stmt(s, fix), index=sympy.sympify(s.index).xreplace(rename)) if isinstance(s, Store)
        else ir.map_stmt(s, fix) for s in st.body)) for st in stages)
    return tuple(ranges[k] for k in order), new_stages


def _scan_kernel(name: str, node: ir.ComputedBuffer, planner: _Planner) -> ir.Kernel:
    """A scan's buffer has dims `ranges + (scan axis,)`, walked by x... and r0."""
    body: ir.Scan = node.body
    buf = planner.buffers[node.buffer]
    index = buf.index([loop_var(k) for k in range(len(body.ranges))] + [reduction_var(0)])
    expr = _simplify_expr(body.expr, _bounds(body.ranges, (body.scan_range,)))
    stage = Stage((body.scan_range,), (ScanAccumulate(buf.name, body.op, expr),
                                       Store(buf.name, index, Var(buf.name, buf.dtype))))
    return _finish(name, tuple(body.ranges), (stage,), (node.buffer,))


_ALONE = {ir.ComputedBuffer: "scans", ir.AttentionTemplate: "attention templates"}


def _own_kernel(name: str, node, planner: _Planner) -> ir.Kernel:
    """The kernel of a node that runs alone: a scan, an attention template."""
    return _attention_kernel(name, node, planner) if isinstance(node, ir.AttentionTemplate) else \
        _scan_kernel(name, node, planner)


def _attention_exprs(node: ir.AttentionTemplate) -> tuple:
    return (node.query,) if node.mask is None else (node.query, node.mask)


def _attention_reads(node: ir.AttentionTemplate) -> set[str]:
    return {ld.buffer for e in _attention_exprs(node) for ld in ir.loads_of(e)} | {v.name for v in node.product.operands}


def _attention_kernel(name: str, node: ir.AttentionTemplate, planner: _Planner) -> ir.Kernel:
    """An attention template's kernel ([Note: decode attention] in attention_templates.py): q and the
    mask assigned, the output stored from the normalized sum; the printer places each."""
    buf = planner.buffers[node.buffer]
    ranges = tuple(buf.sizes)
    acc = ir.Var(ir.ACCUMULATOR, torch.float32)
    body = [Assign(ir.QUERY, node.query)] + ([Assign(ir.MASK, node.mask)] if node.mask is not None else [])
    body.append(Store(buf.name, buf.index([loop_var(k) for k in range(len(ranges))]),
                      acc if buf.dtype == torch.float32 else ir.Op("to_dtype", (acc,), buf.dtype)))
    kernel = _finish(name, ranges, (Stage((), tuple(body)),), (node.buffer,))
    operands = tuple(dict.fromkeys(v.name for v in node.product.operands))
    args = operands + tuple(a for a in kernel.buffer_args if a not in operands)
    return dataclasses.replace(kernel, buffer_args=args, template=node.product)


def _finish(name: str, ranges, stages, origins,
            template: ir.MatmulProduct | ir.SiblingGemvs | ir.AttentionProduct | None = None) -> ir.Kernel:
    args: list[str] = []
    sizes: set[sympy.Symbol] = set()

    def note(index, buffer=None):
        if buffer is not None and buffer not in args:
            args.append(buffer)
        sizes.update(s for s in sympy.sympify(index).free_symbols if not ir.is_loop_var(s))

    if template is not None:       # the operands first (their views are static)
        for operand in template.operands:
            note(0, operand.name)
    for r in ranges:
        note(r)
    for st in stages:
        for r in st.reduction_ranges:
            note(r)
        for s in st.body:
            exprs = ir.stmt_exprs(s)
            if isinstance(s, Store):
                note(s.index, s.buffer)
                for _, size in s.bounds:
                    note(size)
            for e in exprs:
                for sub in ir.walk(e):
                    if isinstance(sub, Load):
                        note(sub.index, sub.buffer)
                        for _, size in sub.bounds:
                            note(size)
                    elif isinstance(sub, ir.IndexValue):
                        note(sub.index)
    # outputs last for readability: inputs (only loaded) first
    stored = {s.buffer for st in stages for s in st.body if isinstance(s, Store)}
    ordered = [a for a in args if a not in stored] + [a for a in args if a in stored]
    return ir.Kernel(name, tuple(ranges), tuple(stages), tuple(ordered),
                     tuple(sorted(sizes, key=lambda s: s.name)), tuple(origins), template)
