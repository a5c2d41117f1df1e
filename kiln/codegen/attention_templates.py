"""Decoding's attention as a template kernel (`ir.AttentionTemplate`) instead of an SDPA extern.

[Note: decode attention] A decode step computes one new token: its attention reads, per layer,
the whole KV cache against one query row per head and writes one row per head. It is launch- and
copy-bound, not compute-bound: each small kernel costs a few microseconds to launch on an H100,
and lowering left three of them around every attention besides the SDPA extern (cuDNN or the
memory-efficient kernel): the rotary embedding of q, a kernel of its own because its space
differs from the cache write's; for grouped-query attention (LLaMA, Mistral, Qwen: 32 query heads
sharing 4 or 8 kv heads) transformers' `repeat_kv`, which copies K and V H/Hkv times (the whole
cache, every layer, every token: SDPA's `enable_gqa` falls back to its math kernel when a mask is
present, and a static cache always has one); and the mask's `where(mask, 0, -inf)`.

This pass replaces a forward SDPA extern (`_scaled_dot_product_efficient_attention`,
`_scaled_dot_product_cudnn_attention`, `_scaled_dot_product_flash_attention`, and the Triton
interpreter's `_scaled_dot_product_flash_attention_for_cpu`) by a template when the printer
offers one (`attention_configs`: the Triton printer, on CUDA and under the interpreter) and:
static sizes and strides; at most `MAX_QUERY_ROWS` query rows (decoding: the template unrolls its
rows, each a multiply and row sum against a tile of keys, as the GEMV form does; past a few rows
a tiled `tl.dot` kernel, the extern's flash attention, is the right one, and prefill keeps it);
q, k, v and the output of one dtype among float16, bfloat16, float32; no dropout; `is_causal`
false; a head dim of at most `MAX_HEAD_DIM`, the same for q, k and v; an optional additive float
mask broadcastable to `[B, H, Lq, Lk]` (a boolean mask reaches the externs as its
`where(mask, 0, -inf)`, inlined as a prologue, below); and only the attention, the
first output, read by anything (the logsumexp and the rest unread: inference; a training
forward saves the logsumexp for its backward and keeps the extern).

The template (kiln/codegen/triton/attention.py) runs a program a (batch, query head): it walks
the keys `BLOCK_N` at a time with an online softmax in float32 and writes its `[Lq, D]` rows at
the extern's output layout; a head dim that is not a power of two (GPT-NeoX's 80) is masked.
Around it the pass removes the kernels the extern made necessary:
- grouped-query attention without the copy: where K (or V) is a view of a buffer made by a
  pointwise node that only copies another buffer (its value one load of the same dtype), the
  view's elements are traced back through the copy's index expression (sympy, simplified with the
  loop bounds) to the source. Head h is written `g * hk + r` (0 <= r < g) for each divisor g of
  H, largest first; where the source's index no longer depends on r and is affine in (b, hk, l, d),
  the template reads the source directly as a strided `[B, H / g, Lk, D]` view with kv head
  `h // g`. The copy node goes once nothing reads it. Nothing here knows `repeat_kv` by name:
  any copy whose value repeats along the head (or none, g = 1) is seen through.
- prologues: a pointwise producer of q, or of the mask, that only attention templates read (the
  rotary embedding of q, the mask's `where`) is computed inside the template where it loads the
  operand, and its kernel disappears. A mask's producer is evaluated once per query head that
  reads it, so it must be small and free of expensive ops (`MAX_PROLOGUE_NODES`).
A read moved later (the copy's source, a prologue's inputs) must see the values it saw where it
was: no scatter in between may write into the storage it reads ([Note: scatters write in place]).

Not done: splitting the keys over several programs (flash-decoding): B x H programs (32 for a
batch-1 LLaMA) use a quarter of an H100's SMs; a long cache would want the split, so past
`triton.attention.MAX_KEYS` keys the printer offers no config and the extern stays.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.indexing import simplify_index
from kiln.codegen.lowering import EXPENSIVE_OPS, bind_arguments
from kiln.codegen.matmul_padding import extern_name
from kiln.codegen.matmul_templates import made_by, static_operand
from kiln.codegen.scheduler import _reads, _sizes_read

# the forward SDPA externs, and the name of each one's mask argument (None: it takes none)
ATTENTION_OPS = {
    "_scaled_dot_product_efficient_attention": "attn_bias",
    "_scaled_dot_product_cudnn_attention": "attn_bias",
    "_scaled_dot_product_flash_attention": None,
    "_scaled_dot_product_flash_attention_for_cpu": "attn_mask",
}
TEMPLATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_QUERY_ROWS = 4          # decoding's (a token, or a few speculated ones): see the Note
MAX_HEAD_DIM = 256
MAX_PROLOGUE_NODES = 64     # a mask's producer, recomputed by every query head

# (Lq, Lk, head dim, dtype) -> the configs a printer offers for an attention of those sizes
ConfigsFor = Callable[[int, int, int, torch.dtype], Sequence[ir.AttentionConfig]]

_B, _H, _G, _L, _D = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("ab", "ah", "ag", "al", "ad"))


def _element(view: ir.ViewArg, indices: Sequence) -> sympy.Expr:
    return view.offset + sum((ir.as_expr(i) * s for i, s in zip(indices, view.strides)), sympy.Integer(0))


def _loop_indices(buf: ir.Buffer, flat: sympy.Expr, upper: dict) -> list | None:
    """The loop index of a node filling `buf` that writes the element at storage offset `flat`,
    simplified with `upper`; None where two elements could share an offset. Any order of dims, and
    gaps (a row padded to an alignment, as the memory-efficient kernel's mask is): from the largest
    stride down, each dim's index is what remains over its stride, since every smaller-strided dim
    together spans less than that stride."""
    sizes = [sympy.sympify(s) for s in buf.sizes]
    strides = [sympy.sympify(s) for s in buf.strides]
    if not all(v.is_Integer for v in (*sizes, *strides, sympy.sympify(buf.offset))):
        return None
    dims = sorted((k for k, s in enumerate(sizes) if s != 1), key=lambda k: int(strides[k]))
    span = 0
    for k in dims:
        if int(strides[k]) <= span:
            return None
        span += (int(sizes[k]) - 1) * int(strides[k])
    rest = simplify_index(flat - sympy.sympify(buf.offset), upper)
    out = [sympy.Integer(0)] * len(sizes)
    for k in reversed(dims):
        out[k] = simplify_index(sympy.floor(rest / strides[k]), upper)
        rest = simplify_index(rest - out[k] * strides[k], upper)
    return out


def _simplified(e: ir.ScalarExpr, upper: dict) -> ir.ScalarExpr:
    def fn(node):
        if isinstance(node, (ir.Load, ir.IndexValue)):
            return dataclasses.replace(node, index=simplify_index(node.index, upper))
        return node
    return ir.map_expr(e, fn)


def _affine(index: sympy.Expr, variables: Sequence[sympy.Symbol]) -> tuple[int, list[int]] | None:
    """(constant, coefficients) of an index affine in `variables` with integer coefficients, or None."""
    constant, coefficients = 0, {v: 0 for v in variables}
    for term in sympy.Add.make_args(sympy.expand(index)):
        if term.is_Integer:
            constant += int(term)
            continue
        coefficient, rest = term.as_coeff_Mul()
        if rest not in coefficients or not coefficient.is_Integer:
            return None
        coefficients[rest] += int(coefficient)
    return constant, [coefficients[v] for v in variables]


@dataclasses.dataclass
class _Context:
    """What the pass knows of the graph: buffers, each buffer's producer and readers (node
    positions), the graph's outputs, and the storage each scatter writes into."""

    buffers: dict
    producers: dict
    readers: dict
    outputs: set
    position: dict
    storage: dict           # buffer -> the name of the storage it lives in (scatters share)
    nodes: list
    sizes_read: set         # names read as sizes: an extern's host values ([Note: host values are read too])

    @classmethod
    def of(cls, graph: ir.Graph) -> "_Context":
        producers, readers, storage = {}, {}, {}
        for i, node in enumerate(graph.nodes):
            if isinstance(node, ir.ComputedBuffer):
                producers[node.buffer] = node
                if isinstance(node.body, ir.Scatter):
                    storage[node.buffer] = storage.get(node.body.into, node.body.into)
            for name in _reads(node):
                readers.setdefault(name, set()).add(i)
        outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
        return cls(graph.buffer_map(), producers, readers, outputs, {id(n): i for i, n in enumerate(graph.nodes)},
                   storage, list(graph.nodes), set().union(*(_sizes_read(n) for n in graph.nodes)))

    def written_between(self, names: set, start: int, end: int) -> bool:
        """Whether a node after `start` and before `end` writes into the storage of a buffer named."""
        stores = {self.storage.get(n, n) for n in names}
        for node in self.nodes[start + 1:end]:
            if isinstance(node, ir.ComputedBuffer) and isinstance(node.body, ir.Scatter) \
                    and self.storage.get(node.buffer, node.body.into) in stores:
                return True
        return False


def _copied(ctx: _Context, name: str) -> ir.Load | None:
    """The one load of a node that only copies another buffer into `name` (same dtype), or None."""
    node = ctx.producers.get(name)
    if node is None or not isinstance(node.body, ir.Pointwise):
        return None
    load = node.body.expr
    if not isinstance(load, ir.Load) or load.indirect or ctx.buffers[load.buffer].dtype != ctx.buffers[name].dtype:
        return None
    if [sympy.sympify(r) for r in node.body.ranges] != [sympy.sympify(s) for s in ctx.buffers[name].sizes]:
        return None
    return load


def _keys(ctx: _Context, view: ir.ViewArg, heads: int, at: int) -> tuple[ir.ViewArg, int] | None:
    """K (or V), a `[B, Hkv, Lk, D]` view, as the template reads it: (a view of the buffer read,
    the number of query heads sharing a kv head). Through a copy where one repeats the heads."""
    b, hkv, lk, d = (int(s) for s in view.sizes)
    if heads % hkv:
        return None
    direct = (view, heads // hkv)
    load = _copied(ctx, view.name) if hkv == heads else None
    if load is None or ctx.written_between({load.buffer}, ctx.position[id(ctx.producers[view.name])], at):
        return direct
    copy = ctx.buffers[view.name]
    for group in (g for g in range(heads, 0, -1) if heads % g == 0):
        upper = {_B: b, _H: heads // group, _G: group, _L: lk, _D: d}
        indices = _loop_indices(copy, _element(view, (_B, group * _H + _G, _L, _D)), upper)
        if indices is None:
            return direct
        index = simplify_index(sympy.sympify(load.index).xreplace(
            {ir.loop_var(k): e for k, e in enumerate(indices)}), upper)
        if _G in index.free_symbols:
            continue
        form = _affine(index, (_B, _H, _L, _D))
        if form is None or form[0] < 0:
            continue
        offset, strides = form
        source = ir.ViewArg(load.buffer, (view.sizes[0], sympy.Integer(heads // group), view.sizes[2], view.sizes[3]),
                            tuple(sympy.Integer(s) for s in strides), sympy.Integer(offset))
        return source, group
    return direct


def _operand_value(ctx: _Context, view: ir.ViewArg, sizes: Sequence[int], at: int, readers_ok: set,
                   recomputed: bool) -> ir.ScalarExpr | None:
    """The value of a (broadcast) operand at the template's loop index `(x0, x1, x2, x3)` over
    `sizes`: its pointwise producer inlined where only attention templates (`readers_ok`) read it
    (a prologue), else a load. None if it does not broadcast to `sizes`."""
    lead = len(sizes) - len(view.sizes)
    if lead < 0:
        return None
    indices = []
    for k, size in enumerate(view.sizes):
        if int(size) == sizes[lead + k]:
            indices.append(ir.loop_var(lead + k))
        elif int(size) == 1:
            indices.append(sympy.Integer(0))
        else:
            return None
    upper = {ir.loop_var(k): n for k, n in enumerate(sizes)}
    flat = _element(view, indices)
    buf = ctx.buffers[view.name]
    producer = ctx.producers.get(view.name)
    value = _prologue(ctx, producer, flat, upper, at, readers_ok, recomputed) if producer is not None else None
    if value is not None:
        return value
    return ir.Load(view.name, simplify_index(flat, upper), buf.dtype)


def _prologue(ctx: _Context, producer: ir.ComputedBuffer, flat: sympy.Expr, upper: dict, at: int,
              readers_ok: set, recomputed: bool) -> ir.ScalarExpr | None:
    """`producer`'s value at storage offset `flat` as an expression of the template's loop index,
    where it may be computed inside the template; else None."""
    name = producer.buffer
    body = producer.body
    if not isinstance(body, ir.Pointwise) or name in ctx.outputs or not ctx.readers.get(name, set()) <= readers_ok:
        return None
    if any(ld.indirect for ld in ir.loads_of(body.expr)):
        return None
    if recomputed and (sum(1 for _ in ir.walk(body.expr)) > MAX_PROLOGUE_NODES
                       or any(isinstance(e, ir.Op) and e.name in EXPENSIVE_OPS for e in ir.walk(body.expr))):
        return None
    if [sympy.sympify(r) for r in body.ranges] != [sympy.sympify(s) for s in ctx.buffers[name].sizes]:
        return None
    if ctx.written_between({ld.buffer for ld in ir.loads_of(body.expr)}, ctx.position[id(producer)], at):
        return None
    indices = _loop_indices(ctx.buffers[name], flat, upper)
    if indices is None:
        return None
    value = _simplified(ir.subs_index(body.expr, {ir.loop_var(k): e for k, e in enumerate(indices)}), upper)
    if any(not ir.is_loop_var(s) for e in ir.walk(value) if isinstance(e, (ir.Load, ir.IndexValue))
           for s in sympy.sympify(e.index).free_symbols):
        return None         # a symbolic size: templates are static
    dtype = ctx.buffers[name].dtype
    # the store the producer's kernel made rounded its value to the buffer's dtype
    rounded = isinstance(value, ir.Op) and value.name == "to_dtype"
    if value.dtype == dtype and (rounded or dtype not in (torch.float16, torch.bfloat16)):
        return value
    return ir.Op("to_dtype", (value,), dtype)


@dataclasses.dataclass(frozen=True)
class _Attention:
    """An SDPA extern the template can compute: its operands as static views."""

    node: ir.ExternKernel
    query: ir.ViewArg
    key: ir.ViewArg
    value: ir.ViewArg
    mask: ir.ViewArg | None
    scale: float


def _candidate(ctx: _Context, node: ir.Node, configs_for: ConfigsFor) -> _Attention | None:
    """`node` as an attention the template computes, or None (the rule: [Note: decode attention])."""
    if not isinstance(node, ir.ExternKernel) or extern_name(node) not in ATTENTION_OPS:
        return None
    args = bind_arguments(node.op, tuple(node.args), dict(node.kwargs))
    if args.get("dropout_p", 0.0) != 0.0 or args.get("is_causal", False) or args.get("return_debug_mask", False):
        return None
    out, *rest = node.outputs
    if out is None or out not in ctx.buffers:
        return None
    if any(o is not None and (o in ctx.readers or o in ctx.outputs or o in ctx.sizes_read) for o in rest):
        return None         # the logsumexp (a training forward's) or the rest is read
    q, k, v = (static_operand(args.get(n), ctx.buffers) for n in ("query", "key", "value"))
    mask_name = ATTENTION_OPS[extern_name(node)]
    mask_arg = args.get(mask_name) if mask_name else None
    mask = static_operand(mask_arg, ctx.buffers) if mask_arg is not None else None
    if q is None or k is None or v is None or (mask_arg is not None and mask is None):
        return None
    if not (len(q.sizes) == len(k.sizes) == len(v.sizes) == 4):
        return None
    (b, h, lq, d), (kb, hk, lk, kd), (vb, hv, vl, vd) = ([int(s) for s in t.sizes] for t in (q, k, v))
    dtype = ctx.buffers[out].dtype
    if {ctx.buffers[t.name].dtype for t in (q, k, v)} != {dtype} or dtype not in TEMPLATE_DTYPES:
        return None
    if [int(s) for s in ctx.buffers[out].sizes] != [b, h, lq, d] or not (kb == vb == b and vl == lk and kd == vd == d):
        return None
    if lq > MAX_QUERY_ROWS or d > MAX_HEAD_DIM or lk == 0 or h % hk or h % hv or b * h == 0:
        return None
    if mask is not None and (len(mask.sizes) > 4 or not ctx.buffers[mask.name].dtype.is_floating_point):
        return None         # ATen's fused kernels take float masks: a boolean one is `where(m, 0, -inf)`
    if not configs_for(lq, lk, d, dtype):
        return None
    scale = args.get("scale")
    return _Attention(node, q, k, v, mask, float(scale) if scale is not None else 1.0 / math.sqrt(d))


def _template(ctx: _Context, att: _Attention, readers_ok: set, configs_for: ConfigsFor) -> ir.AttentionTemplate | None:
    at = ctx.position[id(att.node)]
    b, h, lq, d = (int(s) for s in att.query.sizes)
    lk = int(att.key.sizes[2])
    keys, values = _keys(ctx, att.key, h, at), _keys(ctx, att.value, h, at)
    query = _operand_value(ctx, att.query, (b, h, lq, d), at, readers_ok, recomputed=False)
    mask = None
    if att.mask is not None:
        mask = _operand_value(ctx, att.mask, (b, h, lq, lk), at, readers_ok, recomputed=True)
        if mask is None:
            return None
    if keys is None or values is None or query is None:
        return None
    dtype = ctx.buffers[att.node.outputs[0]].dtype
    config = configs_for(lq, lk, d, dtype)[0]
    product = ir.AttentionProduct(keys[0], values[0], keys[1], values[1], att.scale, config)
    return ir.AttentionTemplate(att.node.outputs[0], query, mask, product)


def use_attention_templates(graph: ir.Graph, configs_for: ConfigsFor) -> ir.Graph:
    """The pass: each attention extern the rule admits replaced by a template; then the copies
    and producers the templates no longer read removed ([Note: decode attention])."""
    ctx = _Context.of(graph)
    candidates = [a for a in (_candidate(ctx, n, configs_for) for n in graph.nodes) if a is not None]
    if not candidates:
        return graph
    readers_ok = {ctx.position[id(a.node)] for a in candidates}
    nodes = list(graph.nodes)
    for att in candidates:
        template = _template(ctx, att, readers_ok, configs_for)
        if template is not None:
            nodes[ctx.position[id(att.node)]] = template
    return _without_dead(graph, ctx, nodes)


def _without_dead(graph: ir.Graph, ctx: _Context, nodes: list) -> ir.Graph:
    """`graph` with `nodes`, less the pointwise nodes that were read before the pass and are read by
    nothing now (the copies and the producers the templates took in), and their buffers."""
    outputs = ctx.outputs
    while True:
        read = set().union(*(_reads(n) for n in nodes))
        dead = [n for n in nodes if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Pointwise)
                and n.buffer in ctx.readers and n.buffer not in read and n.buffer not in outputs]
        if not dead:
            break
        nodes = [n for n in nodes if all(n is not x for x in dead)]
    kept = set(graph.inputs) | outputs | set().union(*(_reads(n) for n in nodes))
    kept |= {o for n in nodes for o in made_by(n) if o is not None}
    kept |= {n.body.into for n in nodes if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Scatter)}
    buffers = tuple(b for b in graph.buffers if b.name in kept or b.name.startswith("const"))
    names = {b.name for b in buffers}
    return dataclasses.replace(graph, nodes=tuple(nodes), buffers=buffers,
                               origins=tuple((b, o) for b, o in graph.origins if b in names))
