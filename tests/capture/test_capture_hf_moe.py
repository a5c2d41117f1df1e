"""Mixture-of-experts transformers at tiny sizes: ONE graph under fullgraph=True, equal to eager.

They used to run wholly eagerly (0 graphs, even under fullgraph=True): transformers' experts call
`torch.ops.transformers.grouped_mm_fallback`, and kiln asked `torch.ops` for its wrapper marker by
`getattr`, which made `torch.ops` grow a namespace named after the marker (see
`builder.compiled_original`).
"""
from __future__ import annotations

import pytest
import torch

import kiln
from capture_support import Recorder, assert_same, assert_train_step_equal, quiet_transformers  # noqa: F401

transformers = pytest.importorskip("transformers")

_COMMON = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, vocab_size=100, max_position_embeddings=64, num_experts_per_tok=2)


def _tiny(name):
    t = transformers
    if name == "mixtral":
        return t.MixtralForCausalLM(t.MixtralConfig(num_local_experts=4, **_COMMON))
    return t.Qwen2MoeForCausalLM(t.Qwen2MoeConfig(num_experts=4, moe_intermediate_size=32,
                                                  shared_expert_intermediate_size=32, **_COMMON))


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_moe_infer_one_graph_and_train_grads_equal(name):
    torch.manual_seed(0)
    model = _tiny(name).eval()
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    rec = Recorder()
    kiln.reset()
    compiled = kiln.compile(model, fullgraph=True, backend=rec)
    with torch.no_grad():
        assert_same(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    assert len(rec.graphs) == 1

    model.train()
    kiln.reset()
    compiled = kiln.compile(model, fullgraph=True, backend="aot_eager")
    assert_train_step_equal(model, compiled, dict(input_ids=ids, labels=ids))
