"""Small but real vision architectures (and an MLP) for the built-in zoo, in plain PyTorch.

ResNet brings convolutions, BatchNorm (whose running statistics are an input mutation in
training) and residual adds; the ViT brings a patch-embedding convolution, a cls token and pre-LN
attention; the MLP is the smallest model with every layer kind a training step needs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """ResNet basic block: conv-bn-relu-conv-bn plus a (projected when shapes change) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """Stem conv + BN + ReLU + max-pool, stages of basic blocks (stride 2 between stages),
    global average pool, linear classifier."""

    def __init__(self, widths: tuple[int, ...], blocks_per_stage: int, classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], widths[0]
        for i, width in enumerate(widths):
            for j in range(blocks_per_stage):
                stages.append(BasicBlock(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        h = self.stages(self.stem(images))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class ViTBlock(nn.Module):
    """Pre-LN encoder block: x + drop(attn(ln(x))), x + drop(mlp(ln(x))); GELU MLP."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.proj_drop = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.mlp_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = self.attn_drop(F.softmax((q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5), dim=-1))
        x = x + self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, d)))
        return x + self.mlp_drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class ViT(nn.Module):
    """Vision transformer: patch-embedding conv, cls token, learned positions, pre-LN blocks,
    final LN, classifier on the cls token."""

    def __init__(self, image: int, patch: int, dim: int, layers: int, heads: int, classes: int,
                 dropout: float = 0.1):
        super().__init__()
        patches = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        self.pos_drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(ViTBlock(dim, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)       # (batch, patches, dim)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.pos_drop(torch.cat((cls, x), dim=1) + self.pos_embed)
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class MLP(nn.Module):
    """Linear-GELU-Dropout stacks with a LayerNorm before the classifier."""

    def __init__(self, features: int, hidden: int, layers: int, classes: int, dropout: float = 0.1):
        super().__init__()
        dims = [features] + [hidden] * layers
        body = []
        for cin, cout in zip(dims, dims[1:]):
            body += [nn.Linear(cin, cout), nn.GELU(), nn.Dropout(dropout)]
        self.body = nn.Sequential(*body)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.body(x)))


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Transformer-style initialisation (normal(0, std) linears and embeddings), so that logits
    have the magnitudes a trained model's have rather than PyTorch's default uniform ones."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
