"""2-D convolutions as template kernels (`ir.MatmulTemplate` of an `ir.ConvProduct`): max-autotune's
alternative to the extern convolution (cuDNN, oneDNN), timed against it like a matrix product.

[Note: convolution templates] The 1x1 and 3x3 convolutions that dominate TIMM's models (ResNets,
RegNets, EfficientNets' pointwise layers) are matrix products in disguise. With the result's
element (n, co, ho, wo), the image x `[N, Cin, H, W]` and the weight w `[Cout, Cin, KH, KW]`:

    y[n, co, ho, wo] = sum over (i, j, ci) of x[n, ci, ho*sh - ph + i, wo*sw - pw + j] * w[co, ci, i, j]

(sh, sw the stride, ph, pw the padding; an image element outside `[0, H) x [0, W)` is a padded
zero). That is a GEMM of M = N*Hout*Wout rows (one per output pixel, m = (n*Hout + ho)*Wout + wo),
N = Cout columns and K = Cin*KH*KW, whose A is never built in memory (an implicit GEMM): the
template computes each A tile's addresses from m and k as it loads it. The index math:

- a row m is the pixel n = m // (Hout*Wout), ho = (m // Wout) % Hout, wo = m % Wout, computed once
  a program; its window's corner is (h0, w0) = (ho*sh - ph, wo*sw - pw), and the image row it
  reads for tap (i, j) starts at x's offset + n*sN + (h0 + i)*sH + (w0 + j)*sW (x's own strides, so
  NCHW and channels-last images alike are read in place, as the matmul template reads transposed
  operands);
- K is walked tap by tap, and within a tap `BLOCK_K` input channels at a time: one flat loop over
  KH*KW*ceil(Cin/BLOCK_K) steps, step s being tap t = s // ceil(Cin/BLOCK_K) (i = t // KW,
  j = t % KW) and channels c0 = (s % ceil(Cin/BLOCK_K))*BLOCK_K onward. So a K tile never spans two
  taps, its channel offsets are `c * sC` (contiguous for a channels-last image) and its spatial
  part one offset per row; a flat loop (not three nested ones) is what Triton pipelines;
- A's tile `[BLOCK_M, BLOCK_K]` loads under a mask `inside & c < Cin`, where `inside` tests only
  the bounds the window can cross: `h >= 0` only where ph > 0, `h < H` only where the last row's
  last tap, (Hout-1)*sh - ph + KH-1, reaches H (likewise along w). A 1x1 convolution without
  padding has no spatial test at all; channels a multiple of `BLOCK_K` have no channel test. B's
  tile `[BLOCK_K, BLOCK_N]` is w[co, c0 + c, i, j];
- rows past M and columns past Cout are read at m % M (co % Cout), as the matmul template's
  ([Note: unmasked operand loads] in triton/matmul.py), and never stored.

The result tile is handed to the same epilogue as a matrix product's ([Note: matmul template
epilogues] in scheduler.py): the template is placed as a pointwise node over the convolution's
`[N, Cout, Hout, Wout]` result, so the bias (the extern's own, added to the float32 sum before
the one rounding, as the template's addmm adds its bias), a BatchNorm in inference (a per-channel affine: loads indexed by co
only), ReLU/SiLU, a residual add and a cast join its kernel and run on the tile before the one
store, in the result's own layout (NHWC where the layout pass chose it). The tile printer names
the result's dims from the tile's rows and columns: (n, ho, wo) from m, co from the column.

The layout pass made the convolution's graph inputs channels-last copies for the extern; a
template reads them where they are ([Note: convolution templates read in place] below).

Under max-autotune the extern and a template per tiling are timed on the device on the real
shapes ([Note: matmul autotuning] in triton/matmul_autotune.py, which treats a convolution as
one more product); nothing uses a template untimed except where no timer exists (Triton's
interpreter on the CPU, tests), as for matrix products. The tilings are the printer's
`matmul_configs` for an `[M, Cin] @ [Cin, Cout]` product (the K of one tap, so BLOCK_K fits the
channels), their "dot" form only.

A convolution is offered as a template only where the index math above is the whole story:
- 2-D (a 4-D image): a 1-D or 3-D convolution has another window (3-D: one more tap loop and
  stride, not built);
- groups = 1: a grouped or depthwise convolution is a product per group of Cin/groups channels,
  mostly far too thin for `tl.dot`'s 16-wide blocks (depthwise: K = KH*KW, one channel);
- not transposed: a transposed convolution scatters each input pixel to a window of outputs (its
  gather form has strided holes: output pixels whose taps skip rows), another template;
- dilation 1: a dilated window is the same math with taps dilation apart, untested, so refused;
- static sizes and strides, float16, bfloat16 or float32 operands of one dtype (a bias of that
  dtype too), as any template ([Note: matmul templates]).
Any kernel size, stride and padding are offered (the tests run 1x1 at stride 1 and 2, 3x3 with
padding 0 and 1 at stride 1 and 2, a rectangular stride, and a 5x5); padding is zeros (the only kind
a convolution prim has: `padding_mode="reflect"` and the like pad before it).
Float32 on CUDA follows `torch.backends.cudnn.allow_tf32` (True by default: eager's float32
convolutions run in TF32 on tensor cores unless it is turned off), not the matmul flag.

Hands on: `conv_candidates(node, buffers, configs_for) -> [ExternChoice, ir.MatmulTemplate...]`,
`refusal(node, buffers) -> str | None`, `read_through_copies(graph) -> graph` (run by
`matmul_templates.use_matmul_templates`).
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.matmul_templates import TEMPLATE_DTYPES, ConfigsFor, ExternChoice, MatmulChoice, static_operand, to_dtype

# convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
CONV_ARGS = 9


def conv_precision(dtype: torch.dtype, device: str) -> str:
    """Eager's float32 convolutions on CUDA are TF32 unless cuDNN's flag is off; exact elsewhere."""
    if dtype == torch.float32 and str(device).startswith("cuda") and torch.backends.cudnn.allow_tf32:
        return "tf32"
    return "ieee"


def refusal(node: ir.ExternKernel, buffers: dict) -> str | None:
    """Why the convolution `node` may not be a template ([Note: convolution templates]), or None."""
    if len(node.args) != CONV_ARGS or node.kwargs or len(node.outputs) != 1:
        return "not a convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups) call"
    x, w, bias, stride, padding, dilation, transposed, _, groups = node.args
    if transposed:
        return "transposed convolutions scatter each pixel to a window of outputs"
    if groups != 1:
        return f"groups={groups}: a grouped convolution's products are too thin for tl.dot"
    if len(stride) != 2:
        return f"a {len(stride)}-D convolution; the template computes 2-D ones"
    if any(d != 1 for d in dilation):
        return f"dilation {list(dilation)}; the template's taps are adjacent"
    out = buffers.get(node.outputs[0])
    if out is None or out.dtype not in TEMPLATE_DTYPES:
        return "the result's dtype has no template"
    views = [static_operand(x, buffers), static_operand(w, buffers)]
    if bias is not None:
        views.append(static_operand(bias, buffers))
    if any(v is None for v in views):
        return "an operand of symbolic sizes, strides or offset"
    if {buffers[v.name].dtype for v in views} != {out.dtype}:
        return "operands of another dtype than the result"
    sizes = [sympy.sympify(s) for s in out.sizes]
    if not all(s.is_Integer and s > 0 for s in sizes):
        return "a result of symbolic or zero sizes"
    return None


def conv_candidates(node: ir.ExternKernel, buffers: dict, configs_for: ConfigsFor) -> list[MatmulChoice]:
    """The ways to compute the convolution `node` makes: the extern first, then a template per
    "dot" tiling `configs_for` offers for its per-tap product, where one may be used."""
    extern = [ExternChoice(node)]
    if refusal(node, buffers) is not None:
        return extern
    x, w, bias, stride, padding = node.args[:5]
    a, b = static_operand(x, buffers), static_operand(w, buffers)
    out = buffers[node.outputs[0]]
    sizes = tuple(sympy.Integer(int(s)) for s in out.sizes)
    acc = ir.Var(ir.ACCUMULATOR, torch.float32)
    value: ir.ScalarExpr = acc
    if bias is not None:
        bias = static_operand(bias, buffers)
        load = ir.Load(bias.name, bias.offset + ir.loop_var(1) * bias.strides[0], out.dtype)
        value = ir.Op("add", (acc, to_dtype(load, torch.float32)), torch.float32)
    body = ir.Pointwise(sizes, to_dtype(value, out.dtype))
    batch, cout, hout, wout = (int(s) for s in sizes)
    cin = int(a.sizes[1])
    precision = conv_precision(out.dtype, out.device)
    return extern + [ir.MatmulTemplate(out.name, body, ir.ConvProduct(a, b, tuple(stride), tuple(padding),
                                                                      precision, config))
                     for config in configs_for(batch * hout * wout, cout, cin, out.dtype) if config.form == "dot"]


def _copy_source(node: ir.Node, buffers: dict) -> ir.ViewArg | None:
    """Where `node` is a plain copy of another buffer (a `Pointwise` loading one element of it at an
    index linear in the loop variables, in the same dtype: the layout pass's `_nhwc` copies), that
    buffer as a view of the copy's sizes, else None."""
    if not isinstance(node, ir.ComputedBuffer) or not isinstance(node.body, ir.Pointwise):
        return None
    load, buf = node.body.expr, buffers[node.buffer]
    if not isinstance(load, ir.Load) or load.indirect or buffers[load.buffer].dtype != buf.dtype:
        return None
    index = sympy.expand(sympy.sympify(load.index))
    xs = [ir.loop_var(d) for d in range(len(node.body.ranges))]
    strides = [index.coeff(x) for x in xs]
    offset = index.xreplace({x: 0 for x in xs})
    if sympy.expand(index - offset - sum(s * x for s, x in zip(strides, xs))) != 0:
        return None
    if not all(sympy.sympify(v).is_Integer and v >= 0 for v in [*strides, offset, *node.body.ranges]):
        return None
    return ir.ViewArg(load.buffer, tuple(node.body.ranges), tuple(strides), offset)


def read_through_copies(graph: ir.Graph) -> ir.Graph:
    """[Note: convolution templates read in place] The layout pass gives each convolution that reads
    a buffer kiln does not compute (a graph input: the first image, every weight) a channels-last
    copy of it (`x_nhwc`), because oneDNN and cuDNN would otherwise reorder it on every call. A
    template reads any strides, so a template's operand that is such a copy, read whole, is read
    from the copy's source instead, and the copy, read by nothing else, is dropped: one copy kernel
    fewer for each convolution template (its weight's), and one more where its image is a graph
    input. The autotuner charges the extern for the copies it keeps ([Note: matmul autotuning]).
    Not where a scatter lies between the copy and the template (it may write the source's storage
    in place)."""
    buffers = graph.buffer_map()
    sources = {n.buffer: (i, view) for i, n in enumerate(graph.nodes) if (view := _copy_source(n, buffers)) is not None}
    if not sources:
        return graph
    scatters = [i for i, n in enumerate(graph.nodes) if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Scatter)]

    def source(view: ir.ViewArg, at: int) -> ir.ViewArg:
        found = sources.get(view.name)
        if found is None or any(found[0] < i < at for i in scatters):
            return view
        buf = buffers[view.name]
        whole = (tuple(view.sizes), tuple(view.strides), view.offset) == \
            tuple(tuple(sympy.sympify(s) for s in v) for v in (buf.sizes, buf.strides)) + (sympy.sympify(buf.offset),)
        return found[1] if whole else view

    nodes, bypassed = [], set()
    for at, node in enumerate(graph.nodes):
        if isinstance(node, ir.MatmulTemplate) and isinstance(node.product, ir.ConvProduct):
            a, b = source(node.product.a, at), source(node.product.b, at)
            if (a, b) != (node.product.a, node.product.b):
                bypassed |= {node.product.a.name, node.product.b.name}
                node = dataclasses.replace(node, product=dataclasses.replace(node.product, a=a, b=b))
        nodes.append(node)
    if not bypassed:
        return graph
    from kiln.codegen.scheduler import _reads
    outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    read = set().union(*(_reads(n) for n in nodes))
    dead = {name for name in bypassed if name in sources and name not in read and name not in outputs}
    return dataclasses.replace(graph, nodes=tuple(n for n in nodes if not (isinstance(n, ir.ComputedBuffer) and n.buffer in dead)),
                               buffers=tuple(b for b in graph.buffers if b.name not in dead),
                               origins=tuple((b, o) for b, o in graph.origins if b not in dead))
