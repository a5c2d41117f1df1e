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
def test_static_cache_decodes_in_one_graph_per_phase_with_eager_tokens(arch):
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
