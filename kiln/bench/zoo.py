"""The built-in model zoo: small real architectures, random seeded weights, no downloads.

Owns the registry `ZOO` (name -> `ModelSpec`) and `loss_of`, the one rule by which a training
step turns any model output into a scalar loss. Hands on `(model, example_inputs)` pairs to the
benchmark harness and to every stage's tests:

    model, inputs = ZOO["gpt2"].make("cpu")                # the test size
    model, inputs = ZOO["gpt2"].make("cpu", size="bench")  # a bit bigger, for the CPU benchmark
    loss_of(model(*inputs)).backward()

`make` seeds its own RNG (fork_rng), so the same call returns the same weights and inputs every
time and leaves the caller's random state alone. Models come back in eval mode; call `.train()`
for a training step (dropout and BatchNorm statistics then behave as in training).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch
from torch import nn

from kiln.bench.models.language import BertMLM, GPT2LM, LlamaLM, LMSize
from kiln.bench.models.vision import MLP, ResNet, ViT, init_weights

SIZES = ("test", "bench")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model and its example inputs.

    build(size, batch, generator) -> (model on CPU, inputs on CPU); `make` adds seeding, the
    default batch of the size, and the device move.
    """

    name: str
    description: str
    build: Callable[[str, int, torch.Generator], tuple[nn.Module, tuple]]
    batch: dict[str, int]                 # default batch per size
    suite: str = "zoo"
    seed: int = 0

    def make(self, device: torch.device | str = "cpu", batch: int | None = None, size: str = "test"
             ) -> tuple[nn.Module, tuple]:
        if size not in SIZES:
            raise ValueError(f"zoo model {self.name!r}: size must be one of {SIZES}, got {size!r}")
        batch = self.batch[size] if batch is None else batch
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            generator = torch.Generator().manual_seed(self.seed + 1)
            model, inputs = self.build(size, batch, generator)
        model = model.to(device).eval()
        return model, tuple(x.to(device) for x in inputs)


def loss_of(output: Any) -> torch.Tensor:
    """A scalar loss from any model output: the sum over its floating tensors of their means.

    Walks tensors, tuples/lists and dicts (transformers' ModelOutput is a dict); a mean rather
    than a sum keeps gradients of one magnitude whatever the batch and vocabulary.
    """
    leaves = [x for x in _tensor_leaves(output) if x.is_floating_point()]
    if not leaves:
        raise ValueError(f"loss_of: the model output ({type(output).__name__}) holds no floating tensor")
    return functools.reduce(torch.add, (x.float().mean() for x in leaves))


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _tensor_leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _tensor_leaves(v)]
    return []


# ----------------------------------------------------------------------------- sizes and builders

_LM_SIZES = {
    "gpt2": {"test": (LMSize(vocab=512, dim=64, layers=2, heads=4, max_len=64), 32),
             "bench": (LMSize(vocab=2048, dim=128, layers=2, heads=4, max_len=128), 128)},
    "bert": {"test": (LMSize(vocab=512, dim=64, layers=2, heads=4, max_len=64), 32),
             "bench": (LMSize(vocab=2048, dim=128, layers=2, heads=4, max_len=128), 128)},
    "llama": {"test": (LMSize(vocab=512, dim=64, layers=2, heads=4, kv_heads=2, hidden=176, max_len=64), 32),
              "bench": (LMSize(vocab=2048, dim=128, layers=2, heads=4, kv_heads=2, hidden=352, max_len=128), 128)},
}


def _tokens(vocab: int, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def _gpt2(size: str, batch: int, generator: torch.Generator):
    shape, seq = _LM_SIZES["gpt2"][size]
    model = GPT2LM(shape)
    init_weights(model)
    return model, (_tokens(shape.vocab, batch, seq, generator),)


def _bert(size: str, batch: int, generator: torch.Generator):
    shape, seq = _LM_SIZES["bert"][size]
    model = BertMLM(shape)
    init_weights(model)
    # Sequences of random lengths in [seq/2, seq], padded: the padding mask does real work.
    lengths = torch.randint(seq // 2, seq + 1, (batch, 1), generator=generator)
    attention_mask = (torch.arange(seq)[None, :] < lengths).long()
    return model, (_tokens(shape.vocab, batch, seq, generator), attention_mask)


def _llama(size: str, batch: int, generator: torch.Generator):
    shape, seq = _LM_SIZES["llama"][size]
    model = LlamaLM(shape)
    init_weights(model)
    return model, (_tokens(shape.vocab, batch, seq, generator),)


_VISION_SIZES = {
    "resnet": {"test": dict(widths=(8, 16, 32), blocks_per_stage=1, image=16),
               "bench": dict(widths=(16, 32, 64), blocks_per_stage=2, image=32)},
    "vit": {"test": dict(image=32, patch=8, dim=64, layers=2, heads=4),
            "bench": dict(image=32, patch=4, dim=128, layers=3, heads=4)},
    "mlp": {"test": dict(features=128, hidden=256, layers=3),
            "bench": dict(features=256, hidden=1024, layers=3)},
}


def _images(batch: int, image: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(batch, 3, image, image, generator=generator)


def _resnet(size: str, batch: int, generator: torch.Generator):
    cfg = _VISION_SIZES["resnet"][size]
    model = ResNet(cfg["widths"], cfg["blocks_per_stage"], classes=10)
    return model, (_images(batch, cfg["image"], generator),)


def _vit(size: str, batch: int, generator: torch.Generator):
    cfg = dict(_VISION_SIZES["vit"][size])
    image = cfg["image"]
    model = ViT(classes=10, **cfg)
    init_weights(model)
    return model, (_images(batch, image, generator),)


def _mlp(size: str, batch: int, generator: torch.Generator):
    cfg = _VISION_SIZES["mlp"][size]
    model = MLP(cfg["features"], cfg["hidden"], cfg["layers"], classes=10)
    return model, (torch.randn(batch, cfg["features"], generator=generator),)


ZOO: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("mlp", "MLP: Linear-GELU-Dropout x3, LayerNorm, classifier", _mlp, {"test": 8, "bench": 64}),
    ModelSpec("gpt2", "GPT-2-style LM: learned positions, pre-LN, causal attention, tied head",
              _gpt2, {"test": 2, "bench": 4}),
    ModelSpec("bert", "BERT-style MLM: post-LN encoder, padding mask, tied MLM head",
              _bert, {"test": 2, "bench": 4}),
    ModelSpec("llama", "LLaMA-style LM: RMSNorm, rotary, SwiGLU, grouped-query attention",
              _llama, {"test": 2, "bench": 4}),
    ModelSpec("resnet", "ResNet-style CNN: BatchNorm, basic residual blocks", _resnet, {"test": 2, "bench": 16}),
    ModelSpec("vit", "ViT: patch-embedding conv, cls token, pre-LN encoder", _vit, {"test": 2, "bench": 16}),
)}
