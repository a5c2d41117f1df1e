"""PyTorch 2.0's own benchmark suites: `pt2-hf`, `pt2-timm` and `pt2-vision`.

Every model of the lists in `lists/` (PyTorch's benchmarks/dynamo lists at the 2.0 release: 53
Hugging Face models, 62 timm models, and TorchBench's 12 torchvision models), built from its config
or constructor with random weights, never downloaded, with inputs made the way PyTorch's own runner
makes them: sequence lengths by model family, labels for the loss of a training step, timm images at
the model's own input size. On CUDA a model runs at its list's batch size, elsewhere at `CPU_BATCH`
(a CPU measures whether kiln compiles and matches eager, not throughput).

A list name that this install cannot build (a model transformers or timm removed, an operator
library that does not load) is still a model of the suite: building it raises `ModelUnavailable`,
whose message says why and names the replacement when there is one, and its row says so
(status `unavailable`). `reason_unavailable(suite, name)` says the same without building.

Hands `BenchModel`s to the suite table of `kiln.bench.suites`.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Callable

import torch

from kiln.bench.suites import BenchModel, Made, ensure_torchvision_importable, import_timm

CPU_BATCH = 2
LISTS = os.path.join(os.path.dirname(__file__), "lists")


class ModelUnavailable(RuntimeError):
    """A model of a suite's list that this install cannot build; the message says why."""


def read_list(filename: str) -> dict[str, int]:
    """name -> batch size, from a list of `name,batch` or `name batch` lines."""
    out = {}
    with open(os.path.join(LISTS, filename)) as f:
        for line in f:
            fields = line.replace(",", " ").split()
            if fields:
                out[fields[0]] = int(fields[1])
    return out


def _generator(seed: int = 1337) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randint(high: int, shape: tuple, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randint(0, max(high, 1), shape, generator=generator, dtype=torch.int64).to(device)


# -------------------------------------------------------------------------------------- pt2-hf

# [Note: pt2-hf names] Most names are transformers classes built from their config class's
# defaults (`Cls(Cls.config_class())`). The others are hub checkpoints in PyTorch's runner, loaded
# there by `AutoConfig.from_pretrained`; here each is that checkpoint's configuration written out
# (the architecture's published sizes), so nothing is downloaded.
_HF_NAMED = {   # list name -> (config class, its fields, model class)
    "DistillGPT2": ("GPT2Config", dict(n_layer=6), "GPT2LMHeadModel"),           # distilgpt2
    "GoogleFnet": ("FNetConfig", {}, "FNetForMaskedLM"),                        # google/fnet-base
    "YituTechConvBert": ("ConvBertConfig", {}, "ConvBertForMaskedLM"),          # YituTech/conv-bert-base
    "T5Small": ("T5Config", {}, "T5ForConditionalGeneration"),                  # t5-small
    "Reformer": ("ReformerConfig", {}, "ReformerForMaskedLM"),                  # ReformerConfig()
    "BigBird": ("BigBirdConfig", dict(attention_type="block_sparse"), "BigBirdForMaskedLM"),
    "AllenaiLongformerBase": ("LongformerConfig", dict(                         # allenai/longformer-base-4096
        attention_window=512, max_position_embeddings=4098, vocab_size=50265, type_vocab_size=1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2), "LongformerForMaskedLM"),
    "CamemBert": ("CamembertConfig", dict(                                      # camembert-base
        vocab_size=32005, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
        bos_token_id=5, eos_token_id=6), "CamembertForMaskedLM"),
}
_HF_REMOVED = {
    "Speech2Text2ForCausalLM": "transformers 5 removed Speech2Text2 (deprecated since 4.40); no replacement class",
}
_HF_PAD_ZERO = ("GPT2ForSequenceClassification", "GPTNeoForSequenceClassification", "GPTJForSequenceClassification")


def hf_sequence_length(name: str) -> int:
    """The sequence length PyTorch's runner gives each model family."""
    if name.startswith("Blenderbot"):
        return 128
    if name.startswith(("GPT2", "Bart", "T5", "PLBart", "MBart")) or name in ("AllenaiLongformerBase", "BigBird"):
        return 1024
    if name.startswith("OPT"):
        return 2048
    if "Reformer" in name:
        return 4096           # ReformerConfig's axial position embeddings are 64 x 64
    if name.startswith(("Albert", "Deberta", "Layout", "Electra", "XLNet", "MegatronBert", "Bert", "Roberta")) \
            or name in ("DistillGPT2", "GoogleFnet", "YituTechConvBert"):
        return 512
    if name == "TrOCRForCausalLM":
        return 256
    return 128                # MobileBert and the rest


def hf_inputs(name: str, config, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    """input_ids (and decoder_input_ids, labels) as PyTorch's runner makes them for `name`."""
    seq, vocab, g = hf_sequence_length(name), config.vocab_size, _generator()
    ids = _randint(1 if name.startswith("Roberta") else vocab, (batch, seq), g, device)
    if "Bart" in name:
        ids[:, -1] = config.eos_token_id
    inputs = {"input_ids": ids}
    if name.startswith(("T5", "M2M100", "MT5")) or name == "BlenderbotForConditionalGeneration":
        inputs["decoder_input_ids"] = ids
    if name.endswith("QuestionAnswering"):
        inputs["start_positions"] = _randint(seq, (batch,), g, device)
        inputs["end_positions"] = _randint(seq, (batch,), g, device)
    elif name.endswith("SequenceClassification"):
        inputs["labels"] = _randint(config.num_labels - 1, (batch,), g, device)
    elif name.endswith("ForConditionalGeneration"):
        inputs["labels"] = _randint(vocab - 1, (batch, seq), g, device)
    else:                     # MaskedLM, CausalLM, LMHeadModel and the named checkpoints
        inputs["labels"] = _randint(vocab, (batch, seq), g, device)
    return inputs


def hf_classes(name: str, transformers) -> tuple[type, object]:
    """(model class, config) for a list name, or ModelUnavailable."""
    if name in _HF_REMOVED:
        raise ModelUnavailable(f"{name}: {_HF_REMOVED[name]}")
    if name in _HF_NAMED:
        config_class, fields, model_class = _HF_NAMED[name]
        return getattr(transformers, model_class), getattr(transformers, config_class)(**fields)
    model_class = getattr(transformers, name, None)
    if model_class is None:
        raise ModelUnavailable(f"{name}: not in transformers {transformers.__version__}")
    config = model_class.config_class()
    if name in _HF_PAD_ZERO or name.startswith("Roberta"):
        config.pad_token_id = 0   # sequence classification pools at the last non-pad token
    return model_class, config


# A training case holds the float32 weights and gradients and a float64 copy of both (the accuracy
# rule's reference): 24 bytes a parameter before activations.
BYTES_PER_PARAMETER = 24


def too_large_for_cpu(parameters: int) -> str | None:
    """Why a model of `parameters` cannot be benchmarked in this machine's memory, or None: past
    half of it, one case would push the machine (and whoever shares it) into swapping or the OOM killer."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = parameters * BYTES_PER_PARAMETER
    if need <= memory / 2:
        return None
    return (f"{parameters / 1e9:.2f}B parameters need about {need / 2**30:.0f} GiB on the CPU (float32 weights and "
            f"gradients, and their float64 reference), more than half of this machine's {memory / 2**30:.0f} GiB")


def _hf_build(name: str) -> Callable[[torch.device, int, str], Made]:
    def build(device, batch, size):
        ensure_torchvision_importable()
        import transformers
        model_class, config = hf_classes(name, transformers)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        if device.type == "cpu":
            with torch.device("meta"):     # the size first, without the memory
                reason = too_large_for_cpu(sum(p.numel() for p in model_class(config).parameters()))
            if reason:
                raise ModelUnavailable(f"{name}: {reason}")
        torch.manual_seed(0)
        with torch.device(device):
            model = model_class(config)
        return model.eval(), (), hf_inputs(name, config, batch, device)
    return build


def _hf_models() -> dict[str, BenchModel]:
    return {name: BenchModel("pt2-hf", name, batch, _hf_build(name), _hf_description(name, batch),
                             cpu_batch=CPU_BATCH)
            for name, batch in read_list("pt2_huggingface.txt").items()}


def _hf_description(name: str, batch: int) -> str:
    if name in _HF_REMOVED:
        return f"unavailable: {_HF_REMOVED[name]}"
    built = f"{_HF_NAMED[name][2]} ({_HF_NAMED[name][0]})" if name in _HF_NAMED else name
    return f"{built}, seq {hf_sequence_length(name)}, batch {batch} (cuda) / {CPU_BATCH}"


# ------------------------------------------------------------------------------------ pt2-timm

# List names that timm renamed (built under the new name) or removed (with the nearest model).
_TIMM_RENAMED = {
    "adv_inception_v3": "inception_v3.tf_adv_in1k",
    "gluon_inception_v3": "inception_v3.gluon_in1k",
    "jx_nest_base": "nest_base_jx",
    "swsl_resnext101_32x16d": "resnext101_32x16d.fb_swsl_ig1b_ft_in1k",
}
_TIMM_REMOVED = {
    "gluon_xception65": "timm 0.9 removed the Gluon Xception port; replacement: xception65 (aligned Xception-65)",
}


def _timm_build(name: str) -> Callable[[torch.device, int, str], Made]:
    def build(device, batch, size):
        if name in _TIMM_REMOVED:
            raise ModelUnavailable(f"{name}: {_TIMM_REMOVED[name]}")
        timm = import_timm()
        torch.manual_seed(0)
        with torch.device(device):
            model = timm.create_model(_TIMM_RENAMED.get(name, name), pretrained=False, drop_rate=0.0)
        # The model's own input size, as timm's resolve_data_config gives it (its training size),
        # and PyTorch's runner's image: integers 0..255 normalized to mean 0, std 1.
        input_size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        images = torch.randint(256, (batch, *input_size), generator=_generator()).float()
        images = ((images - images.mean()) / images.std()).to(device)
        return model.eval(), (images,), {}
    return build


def _timm_models() -> dict[str, BenchModel]:
    def description(name, batch):
        if name in _TIMM_REMOVED:
            return f"unavailable: {_TIMM_REMOVED[name]}"
        renamed = f" (timm's name now {_TIMM_RENAMED[name]})" if name in _TIMM_RENAMED else ""
        return f"batch {batch} (cuda) / {CPU_BATCH}, the model's input size{renamed}"
    return {name: BenchModel("pt2-timm", name, batch, _timm_build(name), description(name, batch),
                             cpu_batch=CPU_BATCH)
            for name, batch in read_list("pt2_timm.txt").items()}


# ---------------------------------------------------------------------------------- pt2-vision

_VISION_CONSTRUCTOR = {"vision_maskrcnn": "maskrcnn_resnet50_fpn"}


def torchvision_ops_missing() -> str | None:
    """Why torchvision's C++ operators (nms, roi_align) cannot run here, or None if they can."""
    ensure_torchvision_importable()
    try:
        torch.ops.torchvision.nms
    except (AttributeError, RuntimeError):
        return ("torchvision's C++ operators (nms, roi_align) do not load with this torch "
                f"({torch.__version__}); install the torchvision build made for it")
    return None


def _maskrcnn_inputs(batch: int, device: torch.device) -> tuple:
    """Images and training targets (one box, label and mask per image) as TorchBench's COCO
    sample would give them; an eval-mode model ignores the targets."""
    g = _generator()
    images = [torch.rand(3, 480, 640, generator=g).to(device) for _ in range(batch)]
    targets = []
    for _ in range(batch):
        mask = torch.zeros(1, 480, 640, dtype=torch.uint8)
        mask[:, 100:300, 200:400] = 1
        targets.append({"boxes": torch.tensor([[200.0, 100.0, 400.0, 300.0]], device=device),
                        "labels": torch.tensor([1], device=device), "masks": mask.to(device)})
    return images, targets


def _vision_build(name: str) -> Callable[[torch.device, int, str], Made]:
    def build(device, batch, size):
        if name in _VISION_CONSTRUCTOR:
            missing = torchvision_ops_missing()
            if missing:
                raise ModelUnavailable(f"{name}: {missing}")
        ensure_torchvision_importable()
        import torchvision
        torch.manual_seed(0)
        # random weights throughout: a detection model's backbone would otherwise be downloaded
        # (weights=None leaves weights_backbone at ImageNet's)
        weights = {"weights": None, "weights_backbone": None} if name in _VISION_CONSTRUCTOR else {"weights": None}
        with torch.device(device):
            model = getattr(torchvision.models.detection if name in _VISION_CONSTRUCTOR else torchvision.models,
                            _VISION_CONSTRUCTOR.get(name, name))(**weights)
        if name in _VISION_CONSTRUCTOR:
            return model.eval(), _maskrcnn_inputs(batch, device), {}
        images = torch.randn(batch, 3, 224, 224, generator=_generator()).to(device)
        return model.eval(), (images,), {}
    return build


def _vision_models() -> dict[str, BenchModel]:
    def description(name, batch):
        built = f"torchvision {_VISION_CONSTRUCTOR.get(name, name)}"
        shape = "480x640 images, with targets" if name in _VISION_CONSTRUCTOR else "224x224"
        return f"{built}, {shape}, batch {batch} (cuda) / {CPU_BATCH}"
    return {name: BenchModel("pt2-vision", name, batch, _vision_build(name), description(name, batch),
                             cpu_batch=CPU_BATCH)
            for name, batch in read_list("pt2_vision.txt").items()}


# ------------------------------------------------------------------------------------ together

PT2_SUITES = {"pt2-hf": (("transformers",), _hf_models),
              "pt2-timm": (("timm",), _timm_models),
              "pt2-vision": (("torchvision",), _vision_models)}


def reason_unavailable(suite: str, name: str) -> str | None:
    """Why this install cannot build a list model (without building it), or None."""
    if suite == "pt2-hf":
        if name in _HF_REMOVED:
            return _HF_REMOVED[name]
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed"
        ensure_torchvision_importable()
        import transformers
        try:
            hf_classes(name, transformers)
        except ModelUnavailable as e:
            return str(e)
        return None
    if suite == "pt2-timm":
        if name in _TIMM_REMOVED:
            return _TIMM_REMOVED[name]
        timm = import_timm()
        if timm is None:
            return "timm is not installed"
        return None if timm.is_model(_TIMM_RENAMED.get(name, name)) else f"not in timm {timm.__version__}"
    if suite == "pt2-vision":
        return torchvision_ops_missing() if name in _VISION_CONSTRUCTOR else None
    raise ValueError(f"unknown suite {suite!r}; the PyTorch 2.0 suites are {sorted(PT2_SUITES)}")
