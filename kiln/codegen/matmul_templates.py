"""Matrix products as template kernels (`ir.MatmulTemplate`) instead of extern calls: max-autotune's,
and decoding's GEMVs by default.

[Note: matmul templates] Lowering leaves every matrix product (mm, bmm, addmm) to ATen: cuBLAS on a
GPU, one extern call whose result is written to memory and read back by the kernel that applies
the bias, the activation or the residual add. Under mode="max-autotune" (and
"max-autotune-no-cudagraphs") a printer that can tile products (Triton's: its `matmul_configs`)
may compute one itself instead: the extern becomes an `ir.MatmulTemplate`, which the scheduler
treats as a pointwise producer, so the pointwise consumers of the product join its kernel and are
applied to each tile of the result in registers before it is stored (an epilogue); consumers that
cannot (one that reads the product transposed, a reduction) are refused with a reason, as any
fusion is. A 2-D convolution is offered the same way, as an implicit GEMM (an `ir.MatmulTemplate`
whose product is an `ir.ConvProduct`: [Note: convolution templates] in conv_templates.py).

Whether the extern or a template, and which tiling, is faster is a question for the GPU:
`candidates` lists the choices for one product (the extern first, then a template per tiling the
printer offers) and `use_matmul_templates` takes the one its `choose` picks. A template may be used
at all for static sizes and strides, float16, bfloat16 or float32 operands of one dtype, and
(addmm) beta = alpha = 1. A printer that can time its kernels says which is faster: the Triton
printer's `tune_matmuls` ([Note: matmul autotuning] in triton/matmul_autotune.py) times every
candidate on the device and passes its pick as `choose`; `first_template` (the printer's first
tiling whenever a template may be used) is the choice where nothing is timed. For printers with
no `matmul_configs` (C++), this pass does not run.

Without max-autotune the pass runs, untimed, on the printer's `default_matmul_configs` where it
has them: tilings only where a template is known to beat the extern without timing, none elsewhere
(the extern kept). The Triton printer offers its GEMV form there for products of a few rows and
a large weight, decoding's ([Note: GEMV by default] in triton/heuristics.py). A GEMV tiling
(`MatmulConfig.form == "gemv"`) is offered only for B contiguous along K.

[Note: sibling GEMVs] At decoding's batch 1 a LLaMA-family layer (LLaMA, Mistral, Qwen, Gemma...)
multiplies one normalized activation by several weights: q, k and v (LLaMA-1.1B: 2048 x 2048,
2048 x 256 and 2048 x 256), and gate and up (2048 x 5632 each), whose results meet again in
`silu(gate) * up`. As separate products that is five launches and a sixth kernel for the
`silu * up`, and k and v, each too narrow for [Note: GEMV by default]'s rule (64 column blocks
each), go to cuBLAS. Every launch costs a few microseconds on an H100 whatever its bytes (a
LLaMA-1.1B decode step ran at 37% of the bandwidth floor, bound by its many small kernels), and
each product reads the activation again and writes its result for the next kernel to read back.
So `group_sibling_gemvs` (before `use_matmul_templates`, without max-autotune only) makes the
products that read the same A one template kernel (`ir.SiblingGemvTemplate`, printed by
[Note: the GEMV form]'s loop over every member): the members of one N (gate and up) are computed
over the same column block by one program, A's slice loaded once a K step and each member's B tile
loaded and multiplied into a float32 sum of its own; the members are placed as pointwise nodes of
one group, so a consumer of both (`silu(gate) * up`) joins as the epilogue ([Note: matmul template
epilogues]) and gate and up stay in registers when nothing else reads them. Members of different
N (q against k and v) are segments of one launch: the programs are the segments' column blocks
stacked, each program computing one segment (a dispatch on the program id), each member storing
its own result. An epilogue there joins the one segment whose results it reads (Qwen's float32
bias adds, which lowering leaves after the products); one reading two segments' results is
refused with that reason, as the scheduler records refusals. (LLaMA's readers of q, k and v, the
rotary embedding, reading columns half a head apart, and the cache's scatter, are refused from any
template's epilogue anyway.)

The rule, for the products (mm, addmm) that read the same buffer at the same view as A:
- each may be a GEMV template at all ([Note: matmul templates]: static sizes and strides, one
  dtype, beta = alpha = 1) with B contiguous along K; A of 2 dims (no batch);
- the group as a whole meets [Note: GEMV by default]'s rule: M <= GEMV_DEFAULT_ROWS, the members'
  weights together GEMV_MIN_WEIGHT_BYTES or more, their column blocks of 4 together
  GEMV_MIN_COLUMN_BLOCKS or more (the printer's `default_sibling_gemv_config`, which also picks
  the tiling: k and v join q though neither would be a GEMV alone);
- the group is placed where its first member was, so every other member's B and bias must exist
  there (graph inputs, or made by a node before the first member); then no member reads another's
  result, and moving a later member up is safe in a functional graph;
- two members at least; products of one A that fail the rule are left as they were (each to the
  single-product rule).
Under max-autotune the autotuner keeps its per-product choice ([Note: matmul autotuning]: it
times each product alone, extern against tilings); timing a group as one choice is not done.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Union

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.matmul_padding import extern_name

TEMPLATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# op -> (bias position or None, A position, B position)
PRODUCTS = {"mm": (None, 0, 1), "bmm": (None, 0, 1), "addmm": (0, 1, 2)}
# the externs a template may replace: the products, and 2-D convolutions as implicit GEMMs
# ([Note: convolution templates] in conv_templates.py), whose bias is their third argument
BIAS_AT = {**{op: bias for op, (bias, _, _) in PRODUCTS.items()}, "convolution": 2}


@dataclasses.dataclass(frozen=True)
class ExternChoice:
    """Keep the extern call (cuBLAS, MKL) that lowering made."""

    node: ir.ExternKernel


MatmulChoice = Union[ExternChoice, ir.MatmulTemplate]
# (M, N, K, dtype) -> the tilings a printer can print for a product of those sizes, best guess first
ConfigsFor = Callable[[int, int, int, torch.dtype], Sequence[ir.MatmulConfig]]


def static_operand(arg, buffers: dict) -> ir.ViewArg | None:
    """An extern's operand as a static strided view of its buffer, its offset from the storage's
    start (as a `Load`'s index counts it, the buffer's own offset included), or None."""
    if isinstance(arg, ir.BufferArg):
        buf = buffers[arg.name]
        arg = ir.ViewArg(arg.name, buf.sizes, buf.strides, buf.offset)
    elif isinstance(arg, ir.ViewArg):
        arg = dataclasses.replace(arg, offset=ir.as_expr(arg.offset) + ir.as_expr(buffers[arg.name].offset))
    else:
        return None
    values = [sympy.sympify(e) for e in (*arg.sizes, *arg.strides, arg.offset)]
    if not all(v.is_Integer and v >= 0 for v in values):
        return None
    return ir.ViewArg(arg.name, tuple(sympy.Integer(int(s)) for s in arg.sizes),
                      tuple(sympy.Integer(int(s)) for s in arg.strides), sympy.Integer(int(arg.offset)))


def _bias_load(bias: ir.ViewArg, out_sizes: tuple, dtype: torch.dtype) -> ir.Load | None:
    """The bias at the result's element (x0, x1[, x2]), broadcast as eager broadcasts it."""
    if len(bias.sizes) > len(out_sizes):
        return None
    lead = len(out_sizes) - len(bias.sizes)
    index = ir.as_expr(bias.offset)
    for d, (size, stride) in enumerate(zip(bias.sizes, bias.strides)):
        if size == out_sizes[lead + d]:
            index = index + ir.loop_var(lead + d) * stride
        elif size != 1:
            return None
    return ir.Load(bias.name, index, dtype)


def _precision(dtype: torch.dtype, device: str) -> str:
    """Eager's float32 products are exact unless TF32 is allowed for CUDA matmuls."""
    if dtype == torch.float32 and str(device).startswith("cuda") and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def candidates(node: ir.ExternKernel, buffers: dict, configs_for: ConfigsFor) -> list[MatmulChoice]:
    """The ways to compute the product `node` makes: the extern call first, then a template for each
    tiling `configs_for` offers, when one may be used (see [Note: matmul templates]; a convolution's:
    `conv_templates.conv_candidates`). The autotuner times them ([Note: matmul autotuning])."""
    extern = [ExternChoice(node)]
    name = extern_name(node)
    if name == "convolution":
        from kiln.codegen.conv_templates import conv_candidates   # it builds on this module
        return conv_candidates(node, buffers, configs_for)
    if name not in PRODUCTS or len(node.outputs) != 1 or node.outputs[0] not in buffers:
        return extern
    bias_at, a_at, b_at = PRODUCTS[name]
    scale = list(node.args[3:]) + [v for k, v in node.kwargs if k in ("beta", "alpha")]
    if any(s != 1 for s in scale):
        return extern
    out = buffers[node.outputs[0]]
    a, b = (static_operand(node.args[i], buffers) for i in (a_at, b_at))
    if a is None or b is None or out.dtype not in TEMPLATE_DTYPES:
        return extern
    if {buffers[a.name].dtype, buffers[b.name].dtype} != {out.dtype}:
        return extern
    sizes = tuple(sympy.sympify(s) for s in out.sizes)
    if not all(s.is_Integer and s > 0 for s in sizes) or len(sizes) != len(a.sizes):
        return extern
    acc = ir.Var(ir.ACCUMULATOR, torch.float32)
    value: ir.ScalarExpr = acc
    if bias_at is not None:
        bias = static_operand(node.args[bias_at], buffers)
        load = _bias_load(bias, sizes, buffers[bias.name].dtype) if bias is not None else None
        if load is None or buffers[bias.name].dtype != out.dtype:
            return extern
        value = ir.Op("add", (acc, to_dtype(load, torch.float32)), torch.float32)
    body = ir.Pointwise(sizes, to_dtype(value, out.dtype))
    (m, n), k = sizes[-2:], a.sizes[-1]
    precision = _precision(out.dtype, out.device)
    return extern + [ir.MatmulTemplate(out.name, body, ir.MatmulProduct(a, b, precision, config))
                     for config in configs_for(int(m), int(n), int(k), out.dtype)
                     if config.form != "gemv" or _along_k(b)]


def _along_k(b: ir.ViewArg) -> bool:
    """Whether B (`[.., K, N]`) is contiguous along K, as `F.linear`'s weight read as `w.t()` is: the
    GEMV form reads B in runs along K ([Note: the GEMV form] in triton/matmul.py)."""
    return int(b.strides[-2]) == 1 or int(b.sizes[-2]) == 1


def to_dtype(e: ir.ScalarExpr, dtype: torch.dtype) -> ir.ScalarExpr:
    return e if e.dtype == dtype else ir.Op("to_dtype", (e,), dtype)


def first_template(choices: Sequence[MatmulChoice]) -> MatmulChoice:
    """The untimed choice: the printer's first tiling whenever a template may be used, else the extern."""
    return next((c for c in choices if isinstance(c, ir.MatmulTemplate)), choices[0])


# (M, each member's N, K, dtype) -> the tiling of products of one A as one GEMV kernel, or None
SiblingConfig = Callable[[int, Sequence[int], int, torch.dtype], "ir.MatmulConfig | None"]
# A tiling that only asks `candidates` whether a product may be a GEMV; the group's replaces it.
_ANY_GEMV = ir.MatmulConfig(BLOCK_M=1, BLOCK_N=1, BLOCK_K=1, GROUP_M=1, form="gemv")


@dataclasses.dataclass
class _Sibling:
    position: int                 # the product's node in the graph
    template: ir.MatmulTemplate   # the product as a GEMV (its tiling a placeholder)
    reads: frozenset[str]         # what it reads besides A: its B and its bias


def _as_gemv(node: ir.Node, buffers: dict) -> _Sibling | None:
    if not isinstance(node, ir.ExternKernel) or extern_name(node) not in ("mm", "addmm"):
        return None
    choices = candidates(node, buffers, lambda m, n, k, dtype: [_ANY_GEMV])
    if len(choices) < 2 or len(choices[-1].product.a.sizes) != 2:
        return None
    template = choices[-1]
    return _Sibling(-1, template, frozenset({template.product.b.name} | {ld.buffer for ld in ir.loads_of(template.body.expr)}))


def made_by(node: ir.Node) -> tuple:
    """The buffers `node` makes."""
    if isinstance(node, ir.ExternKernel):
        return node.outputs
    if isinstance(node, ir.SiblingGemvTemplate):
        return tuple(m.buffer for m in node.members)
    return (node.buffer,)


def _reading(body: ir.Pointwise, accumulator: str) -> ir.Pointwise:
    """`body` reading its sum over K as `Var(accumulator)`."""
    def fn(e):
        return ir.Var(accumulator, e.dtype) if isinstance(e, ir.Var) and e.name == ir.ACCUMULATOR else e
    return dataclasses.replace(body, expr=ir.map_expr(body.expr, fn))


def group_sibling_gemvs(graph: ir.Graph, config_for: SiblingConfig) -> ir.Graph:
    """The pass: the products that read one A, each the GEMV it may be, as one template kernel where
    [Note: sibling GEMVs]'s rule holds, placed where the first of them was."""
    buffers = graph.buffer_map()
    made: dict[str, int] = {}
    by_a: dict[tuple, list[_Sibling]] = {}
    for i, node in enumerate(graph.nodes):
        sibling = _as_gemv(node, buffers)
        if sibling is not None:
            product = sibling.template.product
            key = (product.a, product.precision, buffers[sibling.template.buffer].dtype)
            by_a.setdefault(key, []).append(dataclasses.replace(sibling, position=i))
        for name in made_by(node):
            made.setdefault(name, i)
    replaced: dict[int, ir.Node | None] = {}
    for (a, precision, dtype), found in by_a.items():
        first = found[0].position
        members = [s for s in found if all(made.get(name, -1) < first for name in s.reads)]
        if len(members) < 2:
            continue
        ns = [int(s.template.product.b.sizes[-1]) for s in members]
        config = config_for(int(a.sizes[-2]), ns, int(a.sizes[-1]), dtype)
        if config is None:
            continue
        segments = tuple(tuple(j for j, n in enumerate(ns) if n == each) for each in dict.fromkeys(ns))
        product = ir.SiblingGemvs(a, tuple(s.template.product.b for s in members), segments, precision, config)
        replaced[first] = ir.SiblingGemvTemplate(
            tuple(ir.ComputedBuffer(s.template.buffer, _reading(s.template.body, product.accumulator(j)))
                  for j, s in enumerate(members)), product)
        replaced.update((s.position, None) for s in members[1:])
    if not replaced:
        return graph
    nodes = (replaced.get(i, node) for i, node in enumerate(graph.nodes))
    return dataclasses.replace(graph, nodes=tuple(n for n in nodes if n is not None))


def use_matmul_templates(graph: ir.Graph, configs_for: ConfigsFor,
                         choose: Callable[[Sequence[MatmulChoice]], MatmulChoice] = first_template) -> ir.Graph:
    """The pass: each product (and convolution) extern replaced by the template `choose` picks among
    its `candidates`."""
    buffers = graph.buffer_map()
    nodes = []
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel) and extern_name(node) in BIAS_AT:
            choice = choose(candidates(node, buffers, configs_for))
            node = choice.node if isinstance(choice, ExternChoice) else choice
        nodes.append(node)
    return dataclasses.replace(graph, nodes=tuple(nodes))
