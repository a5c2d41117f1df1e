"""Torch functions the aot trace runs its own way instead of through their ATen composite
(`_traced_rules` in kiln/aot/trace.py): same results, a better graph.

[Note: linear over rows] `F.linear` on an input of 3 or more dims is ATen's `matmul`, which folds
the leading dims into the rows of one matrix product only when that is a view; otherwise it runs a
batched product against the weight expanded over the batch. Traced, the decision is taken on the
strides the trace sees, which are not the strides the compiled program runs with: in convnext the
input is a permuted layer norm of a convolution's output, NCHW-strided in the trace (the meta
rule's layout) but channels-last when run (kiln/codegen/layout.py), and each of its MLP's first
linears became a `bmm` with a stride-0 weight (cuBLAS's small-tile batched kernels: 2.4 ms of
convnext_tiny's inference matmuls on the H200 against Inductor's 1.25 ms). Folded here whatever
the strides, the product is one `addmm` (the bias in cuBLAS's epilogue); where the fold copies, the
copy is a pointwise kernel kiln fuses with the producer of its input.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, its leading dims folded into rows."""
    if not isinstance(x, torch.Tensor) or x.dim() < 3 or weight.dim() != 2:
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    return F.linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
