"""generate() as users write it: `model = kiln.compile(model); model.generate(ids, ...)`.

`generate` is read through the OptimizedModule and calls `self(...)`: that must reach the compiled
forward ([Note: methods that call the model] in kiln/api.py), with eager's tokens. A decoder's
generate compiles two graphs, the prompt (prefill) and a cached step (decode) symbolic in the cache
length ([Note: sizes that change together] in kiln/capture/frame.py): other max lengths and other
prompt lengths reuse them ([Note: token dims of a model-calling method] in kiln/api.py), under
dynamic=None as under dynamic=True. Tiny GPT-2, GPT-NeoX (dolly-v2's
architecture) and LLaMA configs, random weights.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from capture_support import Recorder

transformers = pytest.importorskip("transformers")

VOCAB = 97


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64)
        return transformers.GPT2LMHeadModel(config).eval()
    if arch == "gpt_neox":   # dolly-v2-3b's shape, shrunk: rotary on a quarter of the head, parallel residual
        config = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25,
                                            use_parallel_residual=True)
        return transformers.GPTNeoXForCausalLM(config).eval()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=48, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(model, prompt: int, new: int) -> torch.Tensor:
    torch.manual_seed(prompt)
    ids = torch.randint(0, VOCAB, (1, prompt))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama"])
def test_generate_through_the_compiled_module_compiles_prefill_and_decode(arch):
    kiln.reset()
    model = _model(arch)
    rec = Recorder()
    fast = kiln.compile(model, backend=rec)
    for new in (5, 8):    # two max lengths: the same two graphs
        assert torch.equal(_generate(fast, 7, new), _generate(model, 7, new))
        assert len(rec.graphs) == 2, f"{len(rec.graphs)} graphs: prefill and decode expected"
    assert "forward" not in model.__dict__, "the original's forward is redirected only during the call"
    assert torch.equal(_generate(fast, 11, 5), _generate(model, 11, 5))
    assert torch.equal(_generate(fast, 11, 8), _generate(model, 11, 8))
    # [Note: token dims of a model-calling method]: the prefill was traced symbolic in the prompt's
    # length, so another prompt length compiles nothing (static-first tracing gave a third graph)
    assert len(rec.graphs) == 2, f"{len(rec.graphs)} graphs for two prompt lengths"


def test_dolly_shaped_generate_with_dynamic_true_compiles_two_graphs_for_every_length():
    kiln.reset()
    model = _model("gpt_neox")
    rec = Recorder()
    fast = kiln.compile(model, backend=rec, dynamic=True)
    for prompt, new in ((7, 5), (7, 8), (11, 5), (11, 8)):
        assert torch.equal(_generate(fast, prompt, new), _generate(model, prompt, new))
    assert len(rec.graphs) == 2


def test_methods_of_the_module_reach_the_compiled_forward_and_leave_the_original_eager():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).relu()

        def twice(self, x):            # a method that calls the model, as generate does
            return self(x) + self.forward(x)

    kiln.reset()
    net = Net()
    rec = Recorder()
    fast = kiln.compile(net, backend=rec)
    x = torch.randn(3, 4)
    torch.testing.assert_close(fast.twice(x), net.twice(x))
    assert len(rec.graphs) == 1
    torch.testing.assert_close(net(x), Net.forward(net, x))
    assert len(rec.graphs) == 1, "the original module called directly stays eager"
    assert fast.lin is net.lin and fast.training is net.training
