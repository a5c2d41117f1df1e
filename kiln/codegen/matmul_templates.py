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
fusion is.

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


@dataclasses.dataclass(frozen=True)
class ExternChoice:
    """Keep the extern call (cuBLAS, MKL) that lowering made."""

    node: ir.ExternKernel


MatmulChoice = Union[ExternChoice, ir.MatmulTemplate]
# (M, N, K, dtype) -> the tilings a printer can print for a product of those sizes, best guess first
ConfigsFor = Callable[[int, int, int, torch.dtype], Sequence[ir.MatmulConfig]]


def _operand(arg, buffers: dict) -> ir.ViewArg | None:
    """An operand as a static strided view of its buffer, or None."""
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
    tiling `configs_for` offers, when one may be used (see [Note: matmul templates]). This is where
    the autotuner will time them (issue #40, item 2)."""
    extern = [ExternChoice(node)]
    name = extern_name(node)
    if name not in PRODUCTS or len(node.outputs) != 1 or node.outputs[0] not in buffers:
        return extern
    bias_at, a_at, b_at = PRODUCTS[name]
    scale = list(node.args[3:]) + [v for k, v in node.kwargs if k in ("beta", "alpha")]
    if any(s != 1 for s in scale):
        return extern
    out = buffers[node.outputs[0]]
    a, b = (_operand(node.args[i], buffers) for i in (a_at, b_at))
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
        bias = _operand(node.args[bias_at], buffers)
        load = _bias_load(bias, sizes, buffers[bias.name].dtype) if bias is not None else None
        if load is None or buffers[bias.name].dtype != out.dtype:
            return extern
        value = ir.Op("add", (acc, _to(load, torch.float32)), torch.float32)
    body = ir.Pointwise(sizes, _to(value, out.dtype))
    (m, n), k = sizes[-2:], a.sizes[-1]
    precision = _precision(out.dtype, out.device)
    return extern + [ir.MatmulTemplate(out.name, body, ir.MatmulProduct(a, b, precision, config))
                     for config in configs_for(int(m), int(n), int(k), out.dtype)
                     if config.form != "gemv" or _along_k(b)]


def _along_k(b: ir.ViewArg) -> bool:
    """Whether B (`[.., K, N]`) is contiguous along K, as `F.linear`'s weight read as `w.t()` is: the
    GEMV form reads B in runs along K ([Note: the GEMV form] in triton/matmul.py)."""
    return int(b.strides[-2]) == 1 or int(b.sizes[-2]) == 1


def _to(e: ir.ScalarExpr, dtype: torch.dtype) -> ir.ScalarExpr:
    return e if e.dtype == dtype else ir.Op("to_dtype", (e,), dtype)


def first_template(choices: Sequence[MatmulChoice]) -> MatmulChoice:
    """The untimed choice: the printer's first tiling whenever a template may be used, else the extern."""
    return next((c for c in choices if isinstance(c, ir.MatmulTemplate)), choices[0])


def use_matmul_templates(graph: ir.Graph, configs_for: ConfigsFor,
                         choose: Callable[[Sequence[MatmulChoice]], MatmulChoice] = first_template) -> ir.Graph:
    """The pass: each product extern replaced by the template `choose` picks among its `candidates`."""
    buffers = graph.buffer_map()
    nodes = []
    for node in graph.nodes:
        if isinstance(node, ir.ExternKernel) and extern_name(node) in PRODUCTS:
            choice = choose(candidates(node, buffers, configs_for))
            node = choice.node if isinstance(choice, ExternChoice) else choice
        nodes.append(node)
    return dataclasses.replace(graph, nodes=tuple(nodes))
