"""Small but real language-model architectures for the built-in zoo, in plain PyTorch.

Each class follows the published architecture closely enough that the compiler meets the same
op patterns it meets in the real model (attention written as matmul + softmax + masking, the
real norm placement, tied heads, dropout where the original has it), at sizes small enough for
CPU tests. Every model traces with `torch.fx.symbolic_trace`: sequence lengths are read from
`.shape` and only used in tensor ops (slicing, arange), never in Python branches.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class LMSize:
    """The shape of a transformer: vocabulary, width, depth, heads and the longest sequence."""

    vocab: int
    dim: int
    layers: int
    heads: int
    max_len: int
    kv_heads: int | None = None   # grouped-query attention (LLaMA); None means heads
    hidden: int | None = None     # MLP width; None means 4 * dim


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)


def causal_mask(t: int, device: torch.device) -> torch.Tensor:
    """(t, t) bool, True where query i may attend to key j <= i; built from arange so that it
    traces with a symbolic length (slicing a stored buffer by a traced length does not)."""
    i = torch.arange(t, device=device)
    return i[None, :] <= i[:, None]


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


# ---------------------------------------------------------------------------------------- GPT-2


class GPT2Block(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x)); causal attention, GELU (tanh) MLP."""

    def __init__(self, size: LMSize, dropout: float):
        super().__init__()
        self.heads = size.heads
        self.ln_1 = nn.LayerNorm(size.dim)
        self.c_attn = nn.Linear(size.dim, 3 * size.dim)
        self.c_proj = nn.Linear(size.dim, size.dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(size.dim)
        self.c_fc = nn.Linear(size.dim, 4 * size.dim)
        self.mlp_proj = nn.Linear(4 * size.dim, size.dim)
        self.mlp_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(self.ln_1(x)).split(x.shape[-1], dim=2)
        q, k, v = (_split_heads(z, self.heads) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~causal_mask(x.shape[1], x.device), float("-inf"))
        attn = self.attn_dropout(F.softmax(scores, dim=-1))
        x = x + self.resid_dropout(self.c_proj(_merge_heads(attn @ v)))
        h = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + self.mlp_dropout(h)


class GPT2LM(nn.Module):
    """GPT-2: token + learned position embeddings, pre-LN blocks, final LN, LM head tied to wte."""

    def __init__(self, size: LMSize, dropout: float = 0.1):
        super().__init__()
        self.wte = nn.Embedding(size.vocab, size.dim)
        self.wpe = nn.Embedding(size.max_len, size.dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPT2Block(size, dropout) for _ in range(size.layers))
        self.ln_f = nn.LayerNorm(size.dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)   # tied LM head


# ---------------------------------------------------------------------------------------- BERT


class BertLayer(nn.Module):
    """Post-LN encoder layer: LN(x + drop(attn(x))), then LN(x + drop(ffn(x)))."""

    def __init__(self, size: LMSize, dropout: float):
        super().__init__()
        self.heads = size.heads
        self.query = nn.Linear(size.dim, size.dim)
        self.key = nn.Linear(size.dim, size.dim)
        self.value = nn.Linear(size.dim, size.dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.attn_out = nn.Linear(size.dim, size.dim)
        self.attn_out_dropout = nn.Dropout(dropout)
        self.attn_ln = nn.LayerNorm(size.dim, eps=1e-12)
        self.intermediate = nn.Linear(size.dim, 4 * size.dim)
        self.output = nn.Linear(4 * size.dim, size.dim)
        self.out_dropout = nn.Dropout(dropout)
        self.out_ln = nn.LayerNorm(size.dim, eps=1e-12)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(proj(x), self.heads) for proj in (self.query, self.key, self.value))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(pad, float("-inf"))
        attn = self.attn_dropout(F.softmax(scores, dim=-1))
        x = self.attn_ln(x + self.attn_out_dropout(self.attn_out(_merge_heads(attn @ v))))
        h = self.output(F.gelu(self.intermediate(x)))
        return self.out_ln(x + self.out_dropout(h))


class BertMLM(nn.Module):
    """BERT for masked LM: word + position + token-type embeddings with LN, post-LN encoder,
    padding mask from `attention_mask` (1 = token, 0 = padding), MLM head tied to the word embeddings."""

    def __init__(self, size: LMSize, dropout: float = 0.1):
        super().__init__()
        self.word = nn.Embedding(size.vocab, size.dim)
        self.position = nn.Embedding(size.max_len, size.dim)
        self.token_type = nn.Embedding(2, size.dim)
        self.emb_ln = nn.LayerNorm(size.dim, eps=1e-12)
        self.emb_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(BertLayer(size, dropout) for _ in range(size.layers))
        self.head_dense = nn.Linear(size.dim, size.dim)
        self.head_ln = nn.LayerNorm(size.dim, eps=1e-12)
        self.head_bias = nn.Parameter(torch.zeros(size.vocab))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        types = torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.position(positions) + self.token_type(types)
        x = self.emb_dropout(self.emb_ln(x))
        pad = (attention_mask == 0)[:, None, None, :]   # (batch, 1, 1, keys): masks padded keys
        for layer in self.layers:
            x = layer(x, pad)
        h = self.head_ln(F.gelu(self.head_dense(x)))
        return F.linear(h, self.word.weight, self.head_bias)


# ---------------------------------------------------------------------------------------- LLaMA


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as LLaMA does."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm pre-norm; attention with rotary embeddings and grouped-query heads; SwiGLU MLP."""

    def __init__(self, size: LMSize):
        super().__init__()
        head_dim = size.dim // size.heads
        self.heads, self.kv_heads, self.head_dim = size.heads, size.kv_heads or size.heads, head_dim
        self.attn_norm = RMSNorm(size.dim)
        self.q_proj = nn.Linear(size.dim, size.heads * head_dim, bias=False)
        self.k_proj = nn.Linear(size.dim, self.kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(size.dim, self.kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(size.heads * head_dim, size.dim, bias=False)
        self.mlp_norm = RMSNorm(size.dim)
        hidden = size.hidden or 4 * size.dim
        self.gate_proj = nn.Linear(size.dim, hidden, bias=False)
        self.up_proj = nn.Linear(size.dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, size.dim, bias=False)

    def forward(self, x, cos, sin, causal):
        h = self.attn_norm(x)
        q = _split_heads(self.q_proj(h), self.heads)
        k = _split_heads(self.k_proj(h), self.kv_heads)
        v = _split_heads(self.v_proj(h), self.kv_heads)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)   # under autocast q is bf16; keep rope in its dtype
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        repeat = self.heads // self.kv_heads          # each kv head serves `repeat` query heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = F.softmax(scores.float(), dim=-1).type_as(q)
        x = x + self.o_proj(_merge_heads(attn @ v))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaLM(nn.Module):
    """LLaMA: embeddings, RMSNorm/rotary/GQA/SwiGLU blocks, final RMSNorm, untied LM head; no dropout."""

    def __init__(self, size: LMSize, rope_base: float = 10000.0):
        super().__init__()
        self.embed = nn.Embedding(size.vocab, size.dim)
        self.blocks = nn.ModuleList(LlamaBlock(size) for _ in range(size.layers))
        self.norm = RMSNorm(size.dim)
        self.lm_head = nn.Linear(size.dim, size.vocab, bias=False)
        head_dim = size.dim // size.heads
        inv_freq = 1.0 / rope_base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Rotary angles are recomputed from positions each call, as transformers' LLaMA does.
        positions = torch.arange(input_ids.shape[1], device=input_ids.device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin, causal = angles.cos(), angles.sin(), causal_mask(input_ids.shape[1], input_ids.device)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, causal)
        return self.lm_head(self.norm(x))
