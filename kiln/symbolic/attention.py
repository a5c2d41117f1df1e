"""`F.scaled_dot_product_attention` on fake CUDA tensors with symbolic sizes, without pinning them.

[Note: attention kernels chosen at the hints] SDPA is a composite: it asks a device's kernel chooser
which fused kernel can run (flash, memory-efficient, cuDNN or the math fallback), then calls that
kernel's op. On CPU the chooser reads sizes symbolically. On CUDA it reads some of them as plain
ints, which on kiln's fakes turns each symbolic size into a guard `Eq(s, hint)`: HF BERT on the H200
compiled a graph per sequence length under `dynamic=True` (issue #17; `bench/guard_origin.py`
traces such a guard to its Python caller). Here the chooser runs on real, empty CUDA tensors of the
hint sizes (what eager would pick for the traced call), and the chosen kernel's op runs on the fakes,
whose meta rules are symbolic: no size is pinned.

What the choice depends on is static across sequence lengths for the models that vary them (dtype,
head size, a mask or not, causal or not, dropout, gradients), so the kernel chosen at one length is
the kernel for the others; a length at which it cannot run makes it raise, as eager's forced
choice (`torch.nn.attention.sdpa_kernel`) does. Calls this module does not model (a nested tensor,
`enable_gqa`, a mask of another dtype than bool or the query's) keep the composite and its guards.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils._python_dispatch

aten = torch.ops.aten

MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3        # torch's SDPBackend values, as _fused_sdp_choice returns them
MEM_EFFICIENT_ALIGNMENT = 16                       # the memory-efficient kernel's bias: last-dim stride aligned


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                                 scale=None, enable_gqa=False):
    """`F.scaled_dot_product_attention`, whose kernel is chosen at the hints on symbolic CUDA fakes."""
    choice = kernel_choice(query, key, value, attn_mask, dropout_p, is_causal, scale) \
        if _chosen_at_hints(query, key, value, attn_mask, enable_gqa) else None
    if choice not in (MATH, FLASH, EFFICIENT, CUDNN):     # not a fake, no CUDA here, or a kernel not modelled
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if choice == FLASH:
        return _flash(query, key, value, dropout_p, is_causal, scale)
    if choice == EFFICIENT:
        bias = None if attn_mask is None else _aligned_bias(_additive(attn_mask, query.dtype), query, key)
        return aten._scaled_dot_product_efficient_attention(query, key, value, bias, grads, dropout_p, is_causal,
                                                            scale=scale)[0]
    if choice == CUDNN:
        bias = None if attn_mask is None else _additive(attn_mask, query.dtype)
        return aten._scaled_dot_product_cudnn_attention(query, key, value, bias, grads, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    return _math(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _chosen_at_hints(query, key, value, attn_mask, enable_gqa) -> bool:
    from kiln.symbolic.fake import FakeTensor
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    if not all(isinstance(t, FakeTensor) for t in tensors) or query.device.type != "cuda":
        return False
    if enable_gqa or any(t.is_nested for t in tensors) or query.dim() != 4:
        return False
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, query.dtype):
        return False
    return any(isinstance(d, torch.SymInt) for t in tensors for d in (*t.shape, *t.stride()))


def kernel_choice(query, key, value, attn_mask, dropout_p, is_causal, scale) -> int | None:
    """What ATen's chooser picks for tensors of the fakes' hint sizes and strides (a SDPBackend value);
    None where CUDA cannot run (a CPU machine tracing the CUDA path in tests)."""
    if not torch.cuda.is_available():
        return None
    def stand_in(t):
        if t is None:
            return None
        out = torch.empty_strided(_hints(t.shape), _hints(t.stride()), dtype=t.dtype, device=t.device)
        return out.requires_grad_(t.requires_grad and torch.is_grad_enabled() and out.is_floating_point())
    with torch.utils._python_dispatch._disable_current_modes():     # real tensors: no fake or tracing mode
        q, k, v, m = (stand_in(t) for t in (query, key, value, attn_mask))
        return torch._fused_sdp_choice(q, k, v, m, dropout_p, is_causal, scale=scale)


def _hints(sizes) -> list[int]:
    return [int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in sizes]


def _flash(query, key, value, dropout_p, is_causal, scale):
    """The flash kernel takes a head size that is a multiple of 8: pad and slice back, as ATen does."""
    head = query.shape[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(head)
    pad = (-head) % 8
    if pad:
        query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
    out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    return out.narrow(-1, 0, head) if pad else out


def _math(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """ATen's math fallback written out in torch ops. Its C++ composite reads the batch and sequence
    sizes as ints on CUDA (a guard per length on the H200), where each op below keeps them symbolic.
    The same steps as ATen's: half and bfloat16 computed in float unless
    `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`, the scale's square root applied
    to the query and to the key, a boolean mask made additive, and a softmax that gives 0, not NaN,
    for a row with every key masked."""
    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16) and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
        query, key, value = (t.float() for t in (query, key, value))
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    root = math.copysign(math.sqrt(abs(scale)), scale)     # a negative scale negates the query's factor
    mask = None if attn_mask is None else _additive(attn_mask, query.dtype)
    if is_causal:
        keep = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        mask = _additive(keep, query.dtype)
    scores = _batched_mm(query * root, key.transpose(-2, -1) * abs(root))
    if mask is not None:
        scores = scores + mask
    weights = aten._safe_softmax(scores, -1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p, training=True)
    return _batched_mm(weights, value).to(dtype)


def _batched_mm(a, b):
    """`torch.matmul` of 4-d tensors as the bmm it folds them into. torch 2.11's C++ matmul reads
    the batch and row sizes as ints (a pinning guard each, seen on the H200); bmm and reshape keep
    them symbolic."""
    batch, heads = a.shape[0], a.shape[1]
    b = b.expand(batch, heads, b.shape[-2], b.shape[-1])
    out = torch.bmm(a.reshape(batch * heads, a.shape[-2], a.shape[-1]), b.reshape(batch * heads, b.shape[-2], b.shape[-1]))
    return out.view(batch, heads, a.shape[-2], b.shape[-1])


def _additive(mask, dtype):
    """A boolean mask as the additive bias the fused kernels take: 0 where kept, -inf where masked."""
    if mask.dtype != torch.bool:
        return mask
    return mask.new_zeros(mask.shape, dtype=dtype).masked_fill(mask.logical_not(), float("-inf"))


def _aligned_bias(bias, query, key):
    """The memory-efficient kernel reads its bias with an aligned row stride and as a 4-d
    (batch, heads, queries, keys) tensor: pad the last dim to the alignment and slice it back."""
    last = bias.shape[-1]
    if not (isinstance(last, int) and last % MEM_EFFICIENT_ALIGNMENT == 0):
        # 1 to ALIGNMENT columns, as ATen's pad_bias: never an empty block whose size would be guarded
        pad = MEM_EFFICIENT_ALIGNMENT - last % MEM_EFFICIENT_ALIGNMENT
        bias = torch.cat((bias, bias.new_zeros((*bias.shape[:-1], pad))), dim=-1).narrow(-1, 0, last)
    shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return bias.expand(shape)
