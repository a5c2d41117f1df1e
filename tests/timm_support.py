"""The five timm models of issues #4 and #5 at CI sizes, for tests/capture, tests/aot and tests/prims.

Random weights (no download), batch 2 at 64x64. vit_base_patch16_224 is built with img_size=64 and
depth=2 (two of its twelve identical blocks: the same ops, a sixth of the time). Each model is built
once per process; callers get a deep copy, so a training step in one test leaves the next unchanged.
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch

TIMM_MODELS = ["resnet50", "vit_base_patch16_224", "convnext_tiny", "efficientnet_b0", "mobilenetv3_large_100"]
_OPTIONS = {"vit_base_patch16_224": dict(img_size=64, depth=2)}


def timm_or_skip():
    from kiln.bench.suites import import_timm
    timm = import_timm()
    if timm is None:
        pytest.skip("timm is not installed")
    return timm


@functools.lru_cache(maxsize=None)
def _built(name: str):
    timm = timm_or_skip()
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **_OPTIONS.get(name, {}))
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return model, images


def tiny_timm(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """(a fresh copy of the model, in train mode; its input images)."""
    model, images = _built(name)
    return copy.deepcopy(model).train(), images.clone()
