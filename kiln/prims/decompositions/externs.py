"""ATen ops that become extern prims: one row each, the same arguments passed through.

`addmm` and `baddbmm` stay externs: eager's cuBLAS / MKL call adds the bias before rounding the
product, and `mm` then `add` rounds twice. In bfloat16 that moved a quarter of GPT-NeoX's linear
outputs by one step in every layer, and generate() picked other tokens at near ties. Other
matmul-like ops (addbmm, mv, dot, ...) decompose into `mm`/`bmm` plus elementwise prims in nn.py.
"""
from __future__ import annotations

import torch

from kiln.prims.decompositions.refs import convert
from kiln.prims.decompositions.table import register
from kiln.prims.externs import EXTERN_OF_ATEN
from kiln.prims.ops import ops as p


def _passthrough(extern):
    def decomposition(*args, **kwargs):
        return extern(*args, **kwargs)
    decomposition.__name__ = f"extern_{extern.__name__}"
    return decomposition


_CONVOLUTION = torch.ops.aten.convolution.default

for _aten, _extern in EXTERN_OF_ATEN.items():
    register(_aten, numerics="eager" if _aten is _CONVOLUTION else "fast")(_passthrough(_extern))


def adds_bias_apart(x) -> bool:
    """Whether ATen adds a convolution's bias in a kernel of its own on `x`'s device."""
    return x.device.type == "cuda"


@register(_CONVOLUTION)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """[Note: convolution bias on CUDA] ATen's cuDNN path adds a convolution's bias in a separate
    elementwise kernel after cuDNN returns (one more pass over the output: 22 of them, 0.46 ms of
    convnext_tiny's 7 ms inference step on the H200). The convolution without its bias and an add
    that fuses into the kernel reading its output do the same work for nothing. The sum is then not
    rounded to the output's dtype before its consumer reads it; `numerics="eager"` keeps ATen's call.
    On the CPU oneDNN adds the bias inside the convolution: it stays."""
    conv = EXTERN_OF_ATEN[_CONVOLUTION]
    if bias is None or not adds_bias_apart(x):
        return conv(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    out = conv(x, weight, None, stride, padding, dilation, transposed, output_padding, groups)
    return p.add(out, p.broadcast_in_dim(convert(bias, out.dtype), list(out.shape), [1]))
