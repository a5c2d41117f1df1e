"""A generate() loop with a growing key/value cache, as in the PyTorch 2.0 announcement's GPT-NeoX
example: the compiled forward must give eager's tokens, with at most 3 compilations (the prompt,
the first cached step, then one symbolic graph for every later cache length)."""
from __future__ import annotations

import torch
from torch import nn

import kiln.capture
from capture_support import Recorder
from kiln.config import CaptureConfig


class TinyLM(nn.Module):
    def __init__(self, vocab=50, dim=16, heads=2, layers=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.ModuleList([nn.Linear(dim, 3 * dim) for _ in range(layers)])
        self.out = nn.ModuleList([nn.Linear(dim, dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, past=None):
        x = self.embed(input_ids)
        b, t, d = x.shape
        new_past = []
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = qkv(x).split(d, dim=-1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            if past is not None:
                k = torch.cat([past[i][0], k], dim=2)
                v = torch.cat([past[i][1], v], dim=2)
            new_past.append((k, v))
            attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=past is None)
            x = x + out(attn.transpose(1, 2).reshape(b, t, d))
        return self.head(x), new_past


def generate(forward, prompt, steps):
    ids, past, tokens = prompt, None, []
    for _ in range(steps):
        logits, past = forward(ids, past)
        ids = logits[:, -1:].argmax(-1)
        tokens.append(ids)
    return torch.cat(tokens, dim=1)


def test_generate_matches_eager_with_few_compilations():
    torch.manual_seed(0)
    model = TinyLM().eval()
    prompt = torch.randint(0, 50, (1, 5))
    kiln.capture.reset()
    rec = Recorder()
    compiled_forward = kiln.capture.capture(model.forward, rec, CaptureConfig())
    with torch.no_grad():
        expected = generate(model.forward, prompt, 12)
        actual = generate(compiled_forward, prompt, 12)
    assert torch.equal(actual, expected)
    assert len(rec.graphs) == 3, f"{len(rec.graphs)} compilations"
