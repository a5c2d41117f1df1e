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

[Note: lstsq's residuals in backward] torch's backward formula for linalg_lstsq (C++) adds the
residuals' term only where their gradient has elements, asking its `numel()`, which a tensor of a
symbolic size cannot answer ("Cannot call numel() on tensor with symbolic sizes"): every traced
backward through residuals of a symbolic size failed. Those are (*batch, k) under dynamic sizes, and
for one matrix under gelsd or gelss with m > n a length known only at run time, k or 0 ([Note:
lstsq's residuals] in kiln/symbolic/data_dependent.py). For those calls `lstsq` below leaves the
solution's gradient to torch's formula (the residuals it hands on are detached from torch's node) and
gives the residuals their own autograd node, `_ResidualsGradient`, which computes torch's term with
torch's ops in torch's order; a length known only at run time is first put into k zeros, so where
eager skips the term (no residuals) kiln adds zeros. Static sizes keep torch's formula, whole.
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


def _known_only_at_run_time(n) -> bool:
    return isinstance(n, torch.SymInt) and not n.node.has_hint()


class _ResidualsGradient(torch.autograd.Function):
    """The residuals of `lstsq` as they are; their gradient into A and B as torch's formula gives it,
    op for op: r = A X - B, dA = 2 (g * r) X^H, dB = -2 g * r, g the residuals' gradient (one value
    per column of B, a column for a vector B)."""

    @staticmethod
    def forward(ctx, residuals, A, B, X, vector: bool):
        ctx.save_for_backward(A, B, X)
        ctx.vector = vector
        ctx.counted = residuals.dim() == 1 and _known_only_at_run_time(residuals.shape[0])
        return residuals.view_as(residuals)

    @staticmethod
    def backward(ctx, grad):
        A, B, X = ctx.saved_tensors
        if ctx.vector:
            B, X = B.unsqueeze(-1), X.unsqueeze(-1)
        if ctx.counted:
            # length u0 (k or 0) -> k, zeros where there is none; put by index, as kiln's pad and
            # scatter ask whether k - u0 < 0 or u0 == 0, which a symbolic k leaves open
            index = torch.arange(grad.shape[0], device=grad.device)
            grad = grad.new_zeros(B.shape[-1]).index_put((index,), grad)
        r = A.matmul(X) - B
        g = grad.unsqueeze(-2)
        grad_A = (g * r).matmul(X.mH) * 2 if ctx.needs_input_grad[1] else None
        grad_B = g * -2 * r if ctx.needs_input_grad[2] else None
        if grad_B is not None and ctx.vector:
            grad_B = grad_B.squeeze(-1)
        return None, grad_A, grad_B, None, None


def lstsq(A: torch.Tensor, B: torch.Tensor, rcond: float | None = None, *, driver: str | None = None):
    """`torch.linalg.lstsq`, the residuals' gradient by kiln where their size is symbolic ([Note:
    lstsq's residuals in backward]); else torch's own."""
    out = torch.linalg.lstsq(A, B, rcond, driver=driver)
    residuals = out.residuals
    if not (residuals.requires_grad and any(isinstance(d, torch.SymInt) for d in residuals.shape)):
        return out
    vector = B.dim() == 1 or (A.dim() - 1 == B.dim() and tuple(B.shape) == tuple(A.shape[:-1]))
    residuals = _ResidualsGradient.apply(residuals.detach(), A, B, out.solution.detach(), vector)
    return torch.return_types.linalg_lstsq((out.solution, residuals, out.rank, out.singular_values))
