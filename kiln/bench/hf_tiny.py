"""Tiny transformers models, for every class in transformers' auto mappings: config and inputs.

`corpus_entries(mappings)` lists `(model_type, class name)` pairs from transformers'
`MODEL_*_MAPPING_NAMES` (the base models of `MODEL_MAPPING_NAMES`, then the task heads: causal
LM, masked LM, seq2seq, classification, ...), one per class. `build(entry)` shrinks the default
config of the model type to a tiny one (`SIZE_OVERRIDES`: hidden sizes ~32, 2 layers, 4 heads, 4
experts, small vocabularies, 64-pixel images), builds the model with seeded random weights on CPU
in eval mode (never a hub download), and makes inputs from `forward`'s parameters (`make_inputs`).
A model whose config does not shrink, or whose inputs kiln's corpus cannot make, raises `Skip`
with the reason. Used by `hf_corpus.py`.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from kiln.bench.suites import ensure_torchvision_importable

# the mappings the corpus walks, base models first (the broadest coverage of architectures)
MAPPINGS = ("MODEL_MAPPING_NAMES", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES")

# config attribute -> tiny value, applied wherever the default config (or a sub-config) has it
SIZE_OVERRIDES: dict[str, Any] = {
    **{k: 32 for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "word_embed_proj_dim", "projection_dim",
                       "text_embed_dim", "vision_embed_dim", "embedding_size", "dim")},
    **{k: 64 for k in ("intermediate_size", "d_ff", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                       "hidden_dim", "mlp_dim")},
    **{k: 2 for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                      "num_encoder_layers", "num_decoder_layers")},
    **{k: 4 for k in ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                      "decoder_attention_heads")},
    "num_key_value_heads": 2, "d_kv": 8, "head_dim": 8,
    # mixture of experts
    **{k: 4 for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")},
    **{k: 32 for k in ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size")},
    "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    # multi-head latent attention (DeepSeek), state-space layers (Mamba, Bamba)
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "kv_lora_rank": 16, "q_lora_rank": 16,
    "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1, "state_size": 8, "mamba_d_state": 8,
    # positions and images
    "max_position_embeddings": 128, "n_positions": 128, "image_size": 64,
}
VOCAB = 128
MAX_PARAMETERS = 30_000_000  # past this the config did not shrink: not a tiny model
BATCH, SEQ, DECODER_SEQ = 2, 8, 4


class Skip(Exception):
    """This model is not in the corpus run: the reason says why (no tiny config, no inputs)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    model_type: str
    class_name: str
    mapping: str

    @property
    def name(self) -> str:
        return self.class_name


def corpus_entries(mappings: tuple[str, ...] = MAPPINGS) -> list[Entry]:
    ensure_torchvision_importable()
    from transformers.models.auto import modeling_auto
    seen, entries = set(), []
    for mapping in mappings:
        for model_type, names in getattr(modeling_auto, mapping).items():
            for class_name in (names,) if isinstance(names, str) else names:
                if class_name not in seen:
                    seen.add(class_name)
                    entries.append(Entry(model_type, class_name, mapping))
    return entries


def _overrides(config) -> dict:
    """Keyword arguments that rebuild `config` tiny (sub-configs as dicts, shrunk the same way)."""
    import transformers
    out = {}
    for key, value in vars(config).items():
        if isinstance(value, transformers.PretrainedConfig):
            out[key] = {**value.to_dict(), **_overrides(value)}
        elif key == "num_key_value_heads" and value == getattr(config, "num_attention_heads", None):
            out[key] = SIZE_OVERRIDES["num_attention_heads"]  # no grouped-query attention: keep it so
        elif key in SIZE_OVERRIDES and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, SIZE_OVERRIDES[key]) if key not in ("max_position_embeddings",) else SIZE_OVERRIDES[key]
        elif key in ("depths", "num_layers_per_stage") and isinstance(value, (list, tuple)):
            out[key] = [1] * len(value)
        elif key == "vocab_size" and isinstance(value, int):
            out[key] = max(VOCAB, _largest_token_id(config) + 1)
    layers = out.get("num_hidden_layers")
    if layers is not None and isinstance(getattr(config, "layer_types", None), (list, tuple)):
        out["layer_types"] = list(config.layer_types[:layers])  # one entry per layer, as validated
    return out


def _without(overrides: dict, key: str) -> dict:
    return {k: _without(v, key) if isinstance(v, dict) else v for k, v in overrides.items() if k != key}


def _keys(overrides: dict) -> set:
    return {k for k, v in overrides.items()} | {k2 for v in overrides.values() if isinstance(v, dict) for k2 in _keys(v)}


def _largest_token_id(config) -> int:
    ids = [v for k, v in vars(config).items() if (k.endswith("_token_id") or k.endswith("_token_index"))
           and isinstance(v, int) and not isinstance(v, bool)]
    return max(ids, default=0)


def tiny_config(model_type: str):
    ensure_torchvision_importable()
    import transformers
    cls = transformers.CONFIG_MAPPING[model_type]
    overrides = _overrides(cls())
    for _ in range(4):  # a shrunk value the config rejects by name (heads that must divide, ...) is left default
        try:
            config = cls(**overrides)
            break
        except Exception as e:
            named = [k for k in _keys(overrides) if isinstance(k, str) and k in str(e)]
            if not named and "layer_types" in overrides:  # derived from the layer count in some configs
                named = ["layer_types"]
            if not named:
                raise
            overrides = _without(overrides, max(named, key=len))
    else:
        config = cls(**overrides)
    config.use_cache = False  # no cache objects in the outputs: one forward, one result
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    return config


def build(entry: Entry) -> tuple[torch.nn.Module, dict]:
    """The tiny model (eval mode, seeded random weights) and its keyword inputs; raises `Skip`."""
    ensure_torchvision_importable()
    import transformers
    cls = getattr(transformers, entry.class_name, None)
    if cls is None:
        raise Skip(f"transformers has no {entry.class_name}")
    try:
        config = tiny_config(entry.model_type)
        torch.manual_seed(0)
        model = cls(config).eval()
    except Exception as e:
        raise Skip(f"no tiny config: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMETERS:
        raise Skip(f"no tiny config: {n / 1e6:.0f}M parameters after shrinking")
    return model, make_inputs(model, config)


def _image_size(config) -> int | None:
    for c in (config, getattr(config, "vision_config", None), getattr(config, "backbone_config", None)):
        size = getattr(c, "image_size", None) if c is not None else None
        if size is not None:
            return size if isinstance(size, int) else size[0]
    return None


def make_inputs(model: torch.nn.Module, config) -> dict:
    """Inputs from `forward`'s parameters: token ids (and decoder ids), else images, else audio;
    images with the ids when forward requires both (text-conditioned detectors)."""
    params = inspect.signature(model.forward).parameters
    g = torch.Generator().manual_seed(1)
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or VOCAB
    inputs = {}
    if "input_ids" in params:
        high = min(vocab, VOCAB)
        inputs["input_ids"] = torch.randint(3, high, (BATCH, SEQ), generator=g)
        if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = torch.randint(3, high, (BATCH, DECODER_SEQ), generator=g)
    required = "pixel_values" in params and params["pixel_values"].default is inspect.Parameter.empty
    if "pixel_values" in params and (required or not inputs):
        size = _image_size(config) or 64
        channels = getattr(config, "num_channels", None) or getattr(getattr(config, "vision_config", None),
                                                                     "num_channels", 3)
        inputs["pixel_values"] = torch.randn(BATCH, channels, size, size, generator=g)
    if inputs:
        return inputs
    if "input_values" in params:
        return {"input_values": torch.randn(BATCH, 4000, generator=g)}
    raise Skip(f"no inputs the corpus can make for forward({', '.join(list(params)[:4])}, ...)")
