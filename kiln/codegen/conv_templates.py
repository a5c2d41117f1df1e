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
the one rounding, as the template's addmm adds its bias), a BatchNorm in inference (a
per-channel affine: loads indexed by co only), ReLU/SiLU, a residual add and a cast join its
kernel and run on the tile before the one store, in the result's own layout (NHWC where the
layout pass chose it). The tile printer names the result's dims from the tile's rows and columns:
(n, ho, wo) from m, co from the column.

The template reads what the extern reads, the layout pass's channels-last copies of graph inputs
included (`w_nhwc`: an NCHW model's 3x3 weights, copied every call). It could read the NCHW
originals in place, one kernel fewer a convolution, but its tiles load best along the input
channels (K within a tap): a `[Cout, Cin, 3, 3]` weight has them 9 elements apart, so every
program's every weight tile would be gathered element by element instead of loaded in vectors,
which is likely to cost more than one small copy (not measured: a question for the GPU, where
the autotuner could time both). A model made channels-last has no copies at all.

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
`refusal(node, buffers) -> str | None`.
"""
from __future__ import annotations

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

