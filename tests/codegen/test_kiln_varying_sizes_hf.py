"""Hugging Face models over varying sequence lengths through the kiln backend: how many graphs
capture hands it and how many programs it builds, results equal to eager's.

dynamic=True: one graph and one program for every length. dynamic=None: the first length static,
then one graph with the length symbolic (two graphs, a program each). Training GPT-2 over five
lengths: at most two compiles, loss and every gradient equal to eager's. Tiny configs, random
weights; a CUDA twin of the inference case is tests/codegen/test_gpu_varying_lengths.py.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln import backends
from kiln.config import Options

transformers = pytest.importorskip("transformers")

LENGTHS = (16, 23, 32, 9, 41)
VOCAB = 97


def hf_model(name: str, device: str = "cpu") -> torch.nn.Module:
    """BERT, GPT-2 or LLaMA at a tiny size, dropout off (eager and compiled draw no random numbers)."""
    torch.manual_seed(0)
    if name == "bert":
        config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=37, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
        model = transformers.BertForMaskedLM(config)
    elif name == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=48, max_position_embeddings=128)
        model = transformers.LlamaForCausalLM(config)
    return model.to(device)


class Counting:
    """The kiln backend, counting the graphs it is handed and the programs it builds for them."""

    def __init__(self):
        self.compile = backends.resolve("kiln", Options())
        self.graphs, self.programs = [], []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        program = self.compile(gm, example_inputs)
        self.programs.append(program)
        return program

    def program_count(self) -> int:
        return sum(len(getattr(p, "programs", None) or {0: p}) for p in self.programs)


def symbolic_placeholders(gm) -> bool:
    from kiln.pipeline import symbolic_examples
    return symbolic_examples(gm) is not None


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_inference_over_lengths_compiles_once(name, dynamic):
    kiln.reset()
    model = hf_model(name).eval()
    counting = Counting()
    fast = kiln.compile(model, backend=counting, dynamic=dynamic)
    for length in LENGTHS:
        ids = torch.randint(0, VOCAB, (2, length))
        with torch.no_grad():
            torch.testing.assert_close(fast(input_ids=ids).logits, model(input_ids=ids).logits)
    graphs = 1 if dynamic else 2
    assert len(counting.graphs) == graphs and counting.program_count() == graphs
    assert symbolic_placeholders(counting.graphs[-1]), "the last graph serves every length"


def test_gpt2_training_over_lengths_compiles_at_most_twice():
    kiln.reset()
    model = hf_model("gpt2").train()
    counting = Counting()
    fast = kiln.compile(model, backend=counting)
    for length in LENGTHS:
        ids = torch.randint(0, VOCAB, (2, length))
        model.zero_grad()
        loss = fast(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expected = model(input_ids=ids, labels=ids).loss
        expected.backward()
        torch.testing.assert_close(loss, expected)
        for (name, p), g in zip(model.named_parameters(), grads):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} at {length}: {m}")
    assert len(counting.graphs) <= 2 and counting.program_count() == len(counting.graphs)
