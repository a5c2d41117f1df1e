"""Row normalizations computed in a GEMV template's prologue: which producers of A a GEMV takes in,
and the kernel stages it computes them by. The scheduler asks `find_prologues` before it fuses
anything and builds a template kernel's leading stages with `prologue_stages`.

[Note: norm prologues] At decoding's batch 1 a transformer layer's norms (LayerNorm, RMSNorm) are
kernels of their own: each reads a `[1, hidden]` activation and writes its normalized copy, which
the next GEMV template ([Note: the GEMV form] in triton/matmul.py) reads as A. Each is a launch of
a few microseconds on an H100 for a few KiB of work (LLaMA-1.1B: input_layernorm before q/k/v,
post_attention_layernorm before gate/up, the final norm before the head; dolly: ln1 and ln2 of one
x before qkv and fc1). A GEMV program walks all of K for every row of A (M <= 4) anyway, so it can
compute the normalization itself: first the row's statistics over K, then, in its K loop, A's
value from its producer's expression instead of a load. The norm's kernel disappears.

Nothing here knows a norm by name. The lowered graph holds one as ComputedBuffers: reductions over
the row (`sum(x - x[0])` and the centred sum of squares for LayerNorm's mean and variance, the sum
of squares for RMSNorm), pointwise values over `[M, K]` that they and the output read (dolly's
centred `x - mean`, shared by ln1 and ln2), and the output, a pointwise value reading them (with
every cast of the unfused kernel: LLaMA's float32 upcast and its cast back to the weight's dtype
before the product by the weight). A GEMV template takes in A's producer P and, recursively, the
reductions and pointwise values P reads, where:
- every reader of each of them is taken in too: P is read only by GEMV templates, as A (not in an
  epilogue), the others only by nodes taken in (two norms of one x, each before its own GEMV, share
  their mean and variance: each GEMV computes them again; whatever another kernel reads stays
  where it was, and with it the norm's kernel, so a normalized value with another reader (a model
  returning it, a second use) is not taken in at all: its kernel must run to store it, and the
  GEMV then reads it from memory, cheaper than computing it again);
- at least one is a reduction (a pointwise producer alone is left to the scheduler: it is most
  often some template's epilogue already); the reductions are float32 sums (the statistics norms
  make: a mean, a variance, a mean of squares); P covers A's view element for element, and every
  read between them is at the element written (`place`, the scheduler's own rule for one kernel);
- the template is in the GEMV form: the dot form loads A in `[BLOCK_M, BLOCK_K]` tiles of many
  rows, and has no per-row prologue (refused with that reason, as any fusion is);
- the recomputation is bounded. Every program (N / BLOCK_N of them) computes the statistics
  again: each statistics stage walks the row's inputs over K once more (LayerNorm: two stages,
  RMSNorm: one), and A's value reads its inputs instead of A. Every program reads the same few
  KiB, from L2 (and in a later stage or row, from L1), while its weight streams from memory: the
  distinct bytes its prologue reads beyond A (x's rows, a residual's addends, the norm's weight
  and bias) may be up to `MAX_PROLOGUE_READ_RATIO` times the weight bytes it reads (LLaMA-1.1B's
  q block of 4 columns at M = 1: x and the norm's weight, 4 KiB besides A, for 16 KiB of weight;
  at M = 4 with a residual add inlined, 20 KiB; dolly's qkv block of 8 columns at M = 4, ln1 of
  a residual sum of three addends: 50 KiB for 40).
  A guess, to be timed on the GPU; the statistics' extra walk over K is latency each program adds
  before its product's loop. Expressions are at most `MAX_PROLOGUE_NODES` nodes;
- moving the taken nodes later, to the template, changes nothing they read: no scatter in between
  writes into the storage they load ([Note: scatters write in place]; the KV cache is written
  between a norm and its GEMV, never the activation).
A gather in a norm (the first layers' residual sum inlined back to the embedding row, read through
the token's id) moves into the GEMV with its bounds check, and the GEMV then compiles with
`debug=True` for its `device_assert`, as the norm's kernel did (Triton then also checks int32
overflow in its index math: a cost to time on the GPU, for those first GEMVs only).
A residual add feeding the norm (`x = residual + out`) is part of the norm's expressions where
lowering inlined it (the prologue then loads both addends); where x is stored because later layers
read it, it has another reader and stays its own node: the scheduler joins it to the producing
GEMV's epilogue where it can, and the prologue loads x.

If taking its nodes in fails for a template (a bound, or a value read at another element than the
one written: LayerNorm's shifted mean reads x's first element, so an x computed in the prologue
would be needed at two elements at once), the pointwise values among them (a residual sum, a
centred x) are left stored, by a kernel of their own or in another group with the reductions they
read, and the prologue loads them: the rest of the norm still goes. If it fails without any, the
template is refused, and the others that shared its nodes cannot take them either (they stay
stored): the search repeats until it settles.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy
import torch

from kiln.codegen import ir

# Off by default: on an H100 (bench/results/generate/20261208-0010_cuda_decoding_prologues.md) the
# GEMVs that computed their norms in BLOCK_K steps took 17-28 us each where GEMV and norm kernel had
# taken ~10 and ~19.5, and LLaMA-1.1B's GPU time a token rose from 1,423 to 1,739 us with 43 fewer
# launches. The statistics now walk the row in one block (triton/matmul.py's STATISTICS_BLOCK), not
# yet timed: `bash bench/gpu_checks.sh prologue_ab` decides, then this default.
NORM_PROLOGUES = False

# Bounds on what every program of a GEMV recomputes (see the Note): bytes of the prologue's reads
# over the weight bytes a program reads; nodes of one expression.
MAX_PROLOGUE_READ_RATIO = 2
MAX_PROLOGUE_NODES = 128


@dataclasses.dataclass(frozen=True)
class Refusal:
    template: tuple[str, ...]   # the template's buffers
    producer: str               # A's producer
    reason: str


def _templates(node) -> bool:
    return isinstance(node, (ir.MatmulTemplate, ir.SiblingGemvTemplate))


def _bodies(node) -> list[ir.Pointwise]:
    return [m.body for m in node.members] if isinstance(node, ir.SiblingGemvTemplate) else [node.body]


def _outputs(node) -> tuple[str, ...]:
    return tuple(m.buffer for m in node.members) if isinstance(node, ir.SiblingGemvTemplate) else (node.buffer,)


def find_prologues(nodes, planner, reads: Callable, simplify: Callable) -> tuple[dict[int, tuple], list[Refusal]]:
    """For each GEMV template (by position in `nodes`) that takes in its A's producer, the nodes it
    takes in, in graph order; and the templates that could not, with why. From the scheduler:
    `planner` (buffers, readers, outputs, `place`), `reads(node)` (the buffers a node reads) and
    `simplify(expr, bounds)` (an expression's indices simplified under loop bounds)."""
    producers = {n.buffer: i for i, n in enumerate(nodes)
                 if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, (ir.Pointwise, ir.Reduction))}
    candidates = {}      # template position -> position of A's producer
    for t, node in enumerate(nodes):
        if not _templates(node) or node.product.a.name not in producers:
            continue
        p = producers[node.product.a.name]
        if isinstance(nodes[p].body, ir.Pointwise) and any(
                isinstance(nodes[producers[b]].body, ir.Reduction) for b in reads(nodes[p]) if b in producers):
            candidates[t] = p
    refused: list[Refusal] = []
    kept: set[int] = set()       # pointwise values left stored, after a failure that took them in
    while True:
        taken = _closure(nodes, planner, producers, candidates, reads, kept)
        found, failed = {}, False
        for t, p in candidates.items():
            members = tuple(sorted(i for i in taken if _reaches(nodes, producers, taken, p, i, reads)))
            why = _refusal(nodes, planner, simplify, t, members)
            if why is None:
                found[t] = tuple(nodes[i] for i in members)
                continue
            failed = True
            values = {i for i in members if i != p and isinstance(nodes[i].body, ir.Pointwise)}
            if values:
                kept |= values
            else:
                refused.append(Refusal(_outputs(nodes[t]), nodes[p].buffer, why))
                del candidates[t]
            break
        if not failed:
            return found, refused


def _closure(nodes, planner, producers, candidates, reads, kept: set[int]) -> set[int]:
    """Positions of the nodes the candidates take in together: each A's producer read only by
    candidates, as A, and the nodes they read whose readers are all taken in, but `kept`."""
    taken = set()
    for p in set(candidates.values()):
        name = nodes[p].buffer
        readers = planner.readers.get(name, set())
        as_a = readers <= candidates.keys() and all(candidates[r] == p for r in readers)
        otherwise = any(v.name == name for r in readers for v in nodes[r].product.operands[1:]) or any(
            ld.buffer == name for r in readers for b in _bodies(nodes[r]) for ld in ir.loads_of(b.expr))
        if name not in planner.outputs and as_a and not otherwise:
            taken.add(p)
    while True:
        more = {producers[b] for i in taken for b in reads(nodes[i]) if b in producers} - taken - kept
        more = {q for q in more if nodes[q].buffer not in planner.outputs
                and planner.readers.get(nodes[q].buffer, set()) <= taken}
        if not more:
            return taken
        taken |= more


def _reaches(nodes, producers, taken, start, target, reads) -> bool:
    """Whether `target` is `start` or read by it through taken nodes."""
    stack, seen = [start], set()
    while stack:
        i = stack.pop()
        if i == target:
            return True
        if i in seen:
            continue
        seen.add(i)
        stack += [producers[b] for b in reads(nodes[i]) if b in producers and producers[b] in taken]
    return False


def _refusal(nodes, planner, simplify, t: int, members: tuple[int, ...]) -> str | None:
    """Why template `t` cannot take in `members` (positions), or None."""
    template = nodes[t]
    product = template.product
    if not members or nodes[members[-1]].buffer != product.a.name:
        return "A's producer has readers besides GEMV templates reading it as A (it stays stored)"
    if not any(isinstance(nodes[i].body, ir.Reduction) for i in members):
        return "the statistics A's producer reads have readers outside the prologue (they stay stored)"
    if product.config.form != "gemv":
        return ("a norm prologue is computed by the GEMV form only (the dot form loads A in tiles of "
                "BLOCK_M rows: [Note: norm prologues])")
    for i in members:
        body = nodes[i].body
        if isinstance(body, ir.Reduction) and (body.op != "sum" or planner.buffers[nodes[i].buffer].dtype != torch.float32):
            return f"{nodes[i].buffer} is a {body.op} in {planner.buffers[nodes[i].buffer].dtype}; a prologue's statistics are float32 sums"
    loaded = {ld.buffer for i in members for ld in ir.body_loads(nodes[i].body)} - {nodes[i].buffer for i in members}
    written = _scatter_storage(nodes[members[0] + 1:t], nodes)
    if {_storage(nodes, b) for b in loaded} & written:
        return "a scatter between the norm and its GEMV writes what the norm reads"
    stages = prologue_stages(tuple(nodes[i] for i in members), product.a, planner, simplify)
    if isinstance(stages, str):
        return stages
    for stage in stages:
        for s in stage.body:
            if sum(1 for _ in ir.walk(s.expr)) > MAX_PROLOGUE_NODES:
                return f"an expression of more than {MAX_PROLOGUE_NODES} nodes, computed by every program"
            sizes = [x for e in ir.walk(s.expr) if isinstance(e, (ir.Load, ir.IndexValue))
                     for x in (e.index, *(n for _, n in getattr(e, "bounds", ())))]
            if any(not ir.is_loop_var(x) for size in sizes for x in sympy.sympify(size).free_symbols):
                return "a symbolic size in the norm (templates are static)"
    ratio = _read_bytes(stages, planner.buffers, product.a) / _weight_bytes(product, planner.buffers)
    if ratio > MAX_PROLOGUE_READ_RATIO:
        return (f"every program would read {ratio:.1f}x its weight bytes again for the norm "
                f"(MAX_PROLOGUE_READ_RATIO {MAX_PROLOGUE_READ_RATIO})")
    return None


def _storage(nodes, name: str) -> str:
    """The buffer whose storage `name` lives in (a scatter's result is the buffer it writes into)."""
    for n in nodes:
        if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Scatter) and n.buffer == name:
            return _storage(nodes, n.body.into)
    return name


def _scatter_storage(between, nodes) -> set[str]:
    return {_storage(nodes, n.body.into) for n in between
            if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Scatter)}


def _read_bytes(stages, buffers, a: ir.ViewArg) -> int:
    """Bytes a program's prologue reads per element of K beyond the A it replaces: its distinct
    loads along K, of every row (a vector read by several stages or rows, the norm's weight, is
    read once from L2 and again from L1)."""
    m = int(a.sizes[-2])
    loads = {(ld.buffer, sympy.sympify(ld.index).xreplace({ir.loop_var(0): i}))
             for stage in stages for s in stage.body for ld in ir.loads_of(s.expr)
             if ir.reduction_var(0) in sympy.sympify(ld.index).free_symbols for i in range(m)}
    return max(0, sum(buffers[b].dtype.itemsize for b, _ in loads) - m * buffers[a.name].dtype.itemsize)


def _weight_bytes(product, buffers) -> int:
    """Weight bytes a program reads per element of K: BLOCK_N rows of each B of its segment (the
    smallest segment: its programs recompute the most for the least weight)."""
    config = product.config
    if isinstance(product, ir.SiblingGemvs):
        per = min(sum(buffers[product.bs[j].name].dtype.itemsize for j in seg) for seg in product.segments)
    else:
        per = buffers[product.b.name].dtype.itemsize
    return config.BLOCK_N * per


def prologue_stages(members: tuple[ir.ComputedBuffer, ...], a: ir.ViewArg, planner,
                    simplify: Callable) -> tuple[ir.Stage, ...] | str:
    """The kernel stages of a prologue over `(x0, r0)` = (row of A, index along K): the reductions as
    `Accumulate`s, stage by stage (a reduction that reads another comes a stage later), then one
    stage assigning A's element (`Assign(a.name)`), rounded to A's dtype as P's store rounded it.
    The pointwise members are inlined where read. A string says why there is none."""
    m, k = (sympy.Integer(int(s)) for s in a.sizes[-2:])
    plan = planner.place(list(members), (m,), (k,))
    if isinstance(plan, str):
        return plan
    am, ak = (int(s) for s in a.strides[-2:])
    producer = plan[-1]
    if sympy.expand(producer.store_index - (a.offset + ir.loop_var(0) * am + ir.reduction_var(0) * ak)) != 0:
        return f"{producer.node.buffer} is not stored where the GEMV reads A"
    upper = {ir.loop_var(0): m, ir.reduction_var(0): k}
    inlined: dict[str, ir.ScalarExpr] = {}
    statistics = {p.node.buffer for p in plan if isinstance(p.node.body, ir.Reduction)}

    def value(p) -> ir.ScalarExpr:
        def fn(e):
            if isinstance(e, ir.Load) and e.buffer in inlined:
                return inlined[e.buffer]
            if isinstance(e, ir.Load) and e.buffer in statistics:
                return ir.Var(e.buffer, e.dtype)
            return e
        expr = ir.subs_index(p.node.body.expr, p.mapping)
        return ir.map_expr(simplify(expr, upper), fn)

    stages: dict[int, list] = {}
    for p in plan[:-1]:
        if isinstance(p.node.body, ir.Reduction):
            stages.setdefault(p.stage, []).append(ir.Accumulate(p.node.buffer, p.node.body.op, value(p)))
        else:
            inlined[p.node.buffer] = value(p)
    dtype = planner.buffers[a.name].dtype
    expr = value(producer)
    if not (expr.dtype == dtype and (dtype == torch.float32 or isinstance(expr, ir.Op) and expr.name == "to_dtype")):
        expr = ir.Op("to_dtype", (expr,), dtype)     # the producer's store rounded it to A's dtype
    body = [ir.Stage((k,), tuple(stmts)) for _, stmts in sorted(stages.items())]
    return tuple(body) + (ir.Stage((k,), (ir.Assign(a.name, expr),)),)

