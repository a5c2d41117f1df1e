"""The model suites a benchmark can run: the built-in zoo, transformers models, timm models, and
PyTorch 2.0's own suites (pt2-hf, pt2-timm, pt2-vision: `kiln.bench.pt2_suites`).

Each suite maps a model name to a `BenchModel` whose `make(device, batch, size)` returns
`(model, args, kwargs)` with random, seeded weights. transformers and timm models are built from
configs (`Model(config)`, `timm.create_model(pretrained=False)`), never downloaded; a suite whose
package is missing is reported as unavailable, with the package to install. Batch sizes and
shapes are those of ../shared/ANCHORS.md (and PyTorch's own benchmark lists).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
from typing import Callable

import torch

from kiln.bench.zoo import ZOO

Made = tuple[torch.nn.Module, tuple, dict]


@dataclasses.dataclass(frozen=True)
class BenchModel:
    suite: str
    name: str
    batch: int | None                    # default batch (None: the zoo size's own)
    build: Callable[[torch.device, int, str], Made]
    description: str = ""
    cpu_batch: int | None = None         # default batch off CUDA, where it differs (PyTorch 2.0 suites)

    def make(self, device: torch.device | str, batch: int | None = None, size: str = "bench") -> Made:
        device = torch.device(device)
        if batch is None:
            batch = self.batch if device.type == "cuda" or self.cpu_batch is None else self.cpu_batch
        return self.build(device, batch, size)


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    requires: tuple[str, ...]            # importable packages; the suite needs one of them
    models: Callable[[], dict[str, BenchModel]]

    def missing(self) -> str | None:
        if any(importlib.util.find_spec(p) for p in self.requires):
            return None
        return f"suite {self.name!r} needs {' or '.join(self.requires)} (pip install {self.requires[0]})"


# ------------------------------------------------------------------------------------------- zoo

def _zoo_models() -> dict[str, BenchModel]:
    def builder(name: str):
        def build(device, batch, size):
            model, inputs = ZOO[name].make(device, batch=batch, size=size)
            return model, inputs, {}
        return build
    return {name: BenchModel("zoo", name, None, builder(name), spec.description) for name, spec in ZOO.items()}


# -------------------------------------------------------------------------------- transformers

def _ids(vocab: int, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=generator).to(device)


def _hf_build(config_factory: Callable, model_class: str, inputs: Callable) -> Callable:
    def build(device, batch, size):
        ensure_torchvision_importable()
        import transformers
        config = config_factory(transformers)
        config.use_cache = False      # no KV cache objects in the outputs: one forward, one result
        torch.manual_seed(0)
        with torch.device(device):    # initialise on the device: a 1B model built on CPU is slow
            model = getattr(transformers, model_class)(config)
        return model.eval(), (), inputs(config, batch, device)
    return build


def _hf_models() -> dict[str, BenchModel]:
    def seq_inputs(seq):
        return lambda config, batch, device: {"input_ids": _ids(config.vocab_size, batch, seq, device)}

    def t5_inputs(config, batch, device):
        return {"input_ids": _ids(config.vocab_size, batch, 512, device),
                "decoder_input_ids": _ids(config.vocab_size, batch, 128, device)}

    llama_1b = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                    num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    t5_small = dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_decoder_layers=6, num_heads=8)
    models = (
        BenchModel("hf", "GPT2LMHeadModel", 8, _hf_build(lambda t: t.GPT2Config(), "GPT2LMHeadModel",
                                                         seq_inputs(512)), "GPT-2 124M, 8x512"),
        BenchModel("hf", "BertForMaskedLM", 8, _hf_build(lambda t: t.BertConfig(), "BertForMaskedLM",
                                                         seq_inputs(512)), "BERT-base MLM, 8x512"),
        BenchModel("hf", "T5ForConditionalGeneration", 8,
                   _hf_build(lambda t: t.T5Config(**t5_small), "T5ForConditionalGeneration", t5_inputs),
                   "T5-small, 8x512 encoder, 128 decoder"),
        BenchModel("hf", "LlamaForCausalLM-1.1B", 4,
                   _hf_build(lambda t: t.LlamaConfig(**llama_1b), "LlamaForCausalLM", seq_inputs(1024)),
                   "LLaMA 1.1B (2048 hidden, 22 layers, GQA 32/4), 4x1024"),
    )
    return {m.name: m for m in models}


# ----------------------------------------------------------------------------- timm/torchvision

# timm name -> (batch, torchvision's name for the same architecture, used when timm is absent)
_TIMM = {
    "resnet50": (128, "resnet50"),
    "vit_base_patch16_224": (64, "vit_b_16"),
    "convnext_tiny": (64, "convnext_tiny"),
    "efficientnet_b0": (128, "efficientnet_b0"),
    "mobilenetv3_large_100": (128, "mobilenet_v3_large"),
}


def ensure_torchvision_importable() -> None:
    """Make `import torchvision` (which transformers and timm do) work where its C++ ops cannot load.

    PyPI's torchvision 0.28.0, the release for torch 2.13, is a CUDA build: on the CPU-only torch its
    `_C` library does not load, and `torchvision._meta_registrations` then fails at import, taking
    `import torchvision` down with it. Model code never calls those ops (nms, roi_align, ...), so in
    that case alone this module is skipped. Called by the benchmark and the tests before they build
    models; kiln itself never imports torchvision.
    """
    if importlib.util.find_spec("torchvision") is None or "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401


def import_timm():
    """`import timm`, or None when it is not installed."""
    if importlib.util.find_spec("timm") is None:
        return None
    ensure_torchvision_importable()
    import timm
    return timm


def _timm_build(name: str, torchvision_name: str) -> Callable:
    def build(device, batch, size):
        torch.manual_seed(0)
        with torch.device(device):
            timm = import_timm()
            if timm is not None:
                model = timm.create_model(name, pretrained=False)
            else:
                import torchvision
                model = getattr(torchvision.models, torchvision_name)(weights=None)
        generator = torch.Generator().manual_seed(1)
        images = torch.randn(batch, 3, 224, 224, generator=generator).to(device)
        return model.eval(), (images,), {}
    return build


def _timm_models() -> dict[str, BenchModel]:
    return {name: BenchModel("timm", name, batch, _timm_build(name, tv), f"{name}, batch {batch}, 224x224")
            for name, (batch, tv) in _TIMM.items()}


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("zoo", ("torch",), _zoo_models),
    Suite("hf", ("transformers",), _hf_models),
    Suite("timm", ("timm", "torchvision"), _timm_models),
    Suite("pt2-hf", ("transformers",), lambda: _pt2_models("pt2-hf")),
    Suite("pt2-timm", ("timm",), lambda: _pt2_models("pt2-timm")),
    Suite("pt2-vision", ("torchvision",), lambda: _pt2_models("pt2-vision")),
)}


def _pt2_models(suite: str) -> dict[str, BenchModel]:
    """PyTorch 2.0's own suites, every model of its lists (kiln.bench.pt2_suites)."""
    from kiln.bench.pt2_suites import PT2_SUITES
    return PT2_SUITES[suite][1]()


def get_model(suite: str, name: str) -> BenchModel:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites are {sorted(SUITES)}")
    models = SUITES[suite].models()
    if name not in models:
        raise ValueError(f"suite {suite!r} has no model {name!r}; it has {sorted(models)}")
    return models[name]


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability to 0 (modules, and transformers' config fields that some
    attention functions read directly), and LayerDrop's (a whole layer skipped when a random draw
    falls under it: M2M100's, BART's encoder_layerdrop), so a training step is deterministic and
    compiled and eager gradients are comparable (PyTorch's harness gets the same by `fallback_random`)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        config = getattr(module, "config", None)
        for key, value in (list(vars(config).items()) if hasattr(config, "__dict__") else ()):
            if ("dropout" in key or "pdrop" in key or "layerdrop" in key) and isinstance(value, float):
                setattr(config, key, 0.0)
        for key in ("attention_dropout", "dropout", "layerdrop"):   # floats cached on modules
            if isinstance(getattr(module, key, None), float):
                setattr(module, key, 0.0)
