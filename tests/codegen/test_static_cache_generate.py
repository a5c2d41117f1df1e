"""generate() with transformers' StaticCache (`cache_implementation="static"`) through kiln's backend:
one graph per phase (prefill, decode), eager's tokens, no recompile as the position advances, and
the cache written in place ([Note: writes into inputs in place] in kiln/codegen/reinplace.py).
Tiny GPT-NeoX (dolly-v2's architecture) and LLaMA configs, random weights, on the CPU."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from tests.codegen.conftest import Counting

transformers = pytest.importorskip("transformers")

VOCAB = 97
NEW_TOKENS = 20


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gpt_neox":
        config = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25,
                                            use_parallel_residual=True)
        return transformers.GPTNeoXForCausalLM(config).eval()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=48, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(model, ids) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                              cache_implementation="static")


def _in_place_writes(backend: Counting) -> int:
    """index_put_ nodes in the forward prim graphs the backend's programs were built from."""
    count = 0
    for fn in backend.compiled:
        for program in getattr(fn, "programs", {}).values():
            fw = getattr(program, "graphs", (None,))[0]
            if fw is not None:
                count += sum(str(n.target) == "kiln_prims.index_put_.default" for n in fw.graph.nodes)
    return count


@pytest.mark.parametrize("arch", ["gpt_neox", "llama"])
def test_static_cache_decodes_in_one_graph_per_phase_with_eager_tokens(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))   # traced here, not warm-started: graphs to read
    kiln.reset()
    model = _model(arch)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (1, 7))
    expected = _generate(model, ids)
    backend = Counting()
    model.forward = kiln.compile(model.forward, backend=backend)
    assert torch.equal(_generate(model, ids), expected)
    assert len(backend.compiled) == 2, f"{len(backend.compiled)} graphs over {NEW_TOKENS} positions: prefill and decode"
    assert backend.programs() == 2, "the decode step's program serves every position"
    # every layer's keys and values are written into the cache's own storage in the decode step
    assert _in_place_writes(backend) == 2 * model.config.num_hidden_layers
    assert torch.equal(_generate(model, ids), expected)     # a second generate(): a new cache, no recompile
    assert len(backend.compiled) == 2


def _compile_config(**fields):
    config = transformers.CompileConfig(**fields)
    config._compile_all_devices = True       # transformers compiles the decode step on the CPU too
    return config


@pytest.mark.parametrize("form", ["forward", "module"])
def test_static_cache_on_a_kiln_compiled_model_needs_no_flag(form, monkeypatch):
    """transformers compiles the decoding step itself with a static cache; on a model kiln compiled
    that is kiln's compiled call, never torch.compile ([Note: libraries that compile the model
    themselves] in kiln/api.py)."""
    kiln.reset()
    model = _model("gpt_neox")
    ids = torch.randint(1, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    expected = _generate(model, ids)

    def refuse(*args, **kwargs):
        raise AssertionError("transformers reached torch.compile on a kiln-compiled model")
    monkeypatch.setattr(torch, "compile", refuse)
    if form == "forward":
        model.forward = kiln.compile(model.forward)
        target = model
    else:
        target = kiln.compile(model)
    with torch.no_grad():
        got = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                              cache_implementation="static", compile_config=_compile_config())
    assert torch.equal(got, expected)


def test_compile_config_backend_kiln_takes_the_mode():
    """`CompileConfig(backend="kiln")`: transformers' torch.compile hands mode="reduce-overhead" to
    kiln's registered backend, which takes it as kiln.compile would."""
    model = _model("llama")
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    expected = _generate(model, ids)
    with torch.no_grad():
        got = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                             cache_implementation="static", compile_config=_compile_config(backend="kiln"))
    assert torch.equal(got, expected)


def test_reduce_overhead_generate_decodes_with_a_static_cache():
    """[Note: reduce-overhead decodes with a static cache]: the seed's lines, default cache."""
    kiln.reset()
    model = _model("gpt_neox")
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                  do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)        # eager, transformers' default DynamicCache
        fast = kiln.compile(model, mode="reduce-overhead")
        got = fast.generate(ids, **kwargs)
        chosen = fast.generate(ids, **kwargs, cache_implementation="dynamic")
    assert torch.equal(got.sequences, expected.sequences)
    assert type(got.past_key_values).__name__ == "StaticCache"
    assert type(expected.past_key_values).__name__ == "DynamicCache"
    assert type(chosen.past_key_values).__name__ == "DynamicCache", "a cache the user chose is kept"
    assert torch.equal(chosen.sequences, expected.sequences)


def test_static_cache_generate_over_batches_and_lengths_on_one_compiled_model():
    """A second batch size makes the batch dim symbolic; the prefill writes the new cache through a
    view whose shape holds that size (functionalizing it failed: a view step's nested size node)."""
    kiln.reset()
    model = _model("llama")
    fast = kiln.compile(model, mode="reduce-overhead")
    for batch, prompt in ((1, 6), (2, 9), (3, 4)):
        ids = torch.randint(1, VOCAB, (batch, prompt), generator=torch.Generator().manual_seed(batch))
        assert torch.equal(_generate(fast, ids), _generate(model, ids)), f"batch {batch}, prompt {prompt}"
