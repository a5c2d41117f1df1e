"""Symbolic sizes end to end: a graph whose dims capture made symbolic compiles to one program
(C++ or Triton kernels that take the sizes as arguments) that serves every size, vs eager."""
import pytest
import torch

import kiln
from tests.codegen.conftest import Counting


def _kernels(runtime) -> list[str]:
    """Names of the generated kernels the forward host program calls."""
    host = runtime.fw
    return [name for name in host.__globals__ if name.startswith("kernel")]


def _rotate_half(x, half=8):
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class CachedAttention(torch.nn.Module):
    """The KV-cache shapes of a decoder: cat along the cache dim, a causal mask from positions
    offset by the cache length, rotary halves and the last position (slices of symbolic dims),
    mean and var over the (symbolic) sequence."""

    def __init__(self, dim=16):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x, past):
        h = self.norm(x)
        q = _rotate_half(self.q(h))
        k = torch.cat([past, self.k(h)], 1)
        v = torch.cat([past, self.v(h)], 1)
        t, s = x.shape[1], k.shape[1]
        scores = q @ k.transpose(1, 2) / 4
        causal = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
        out = torch.softmax(scores, -1) @ v
        centered = out - out.mean(1, keepdim=True)
        return centered / (out.var(1, keepdim=True) + 1).sqrt() + x[:, -1:]


def test_one_cpp_program_for_every_sequence_length():
    torch.manual_seed(0)
    kiln.reset()
    model = CachedAttention().eval()
    backend = Counting()
    fast = kiln.compile(model, dynamic=True, backend=backend)
    with torch.no_grad():
        for t, p in ((3, 2), (4, 5), (6, 3), (9, 7), (13, 11)):
            x, past = torch.randn(2, t, 16), torch.randn(2, p, 16)
            torch.testing.assert_close(fast(x, past), model(x, past), rtol=1e-4, atol=1e-5)
    assert len(backend.compiled) == 1 and backend.programs() == 1
    (runtime,) = backend.compiled[0].programs.values()
    assert _kernels(runtime), "no C++ kernel: the test would compare eager with eager"
    assert "s0 = " in runtime.fw.host_source


def test_triton_kernels_take_the_sizes(monkeypatch, tmp_path):
    from kiln.codegen import compile as codegen_compile
    from kiln.codegen import triton as triton_printer

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(codegen_compile, "printer_for", lambda device: triton_printer)
    torch.manual_seed(0)
    kiln.reset()

    def f(x, y):
        h = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5) * 2
        return torch.softmax(h @ y.transpose(0, 1), -1).mean(0) + h[1:].sum(0).amax()

    backend = Counting()
    fast = kiln.compile(f, dynamic=True, backend=backend)
    for rows, cols in ((3, 5), (4, 7), (6, 5), (5, 9), (7, 6)):
        x, y = torch.randn(rows, cols), torch.randn(rows + 1, cols)
        torch.testing.assert_close(fast(x, y), f(x, y), rtol=1e-4, atol=1e-5)
    assert backend.programs() == 1
    (runtime,) = backend.compiled[0].programs.values()
    assert _kernels(runtime), "no Triton kernel: the test would compare eager with eager"


def test_training_with_a_symbolic_sequence_is_one_program():
    torch.manual_seed(0)
    kiln.reset()
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(),
                                torch.nn.Linear(8, 3))

    def loss_of(m, x):
        y = m(x)
        return (y - y.mean(1, keepdim=True)).square().mean()

    backend = Counting()
    fast = kiln.compile(lambda x: loss_of(model, x), dynamic=True, backend=backend)
    for seq in (3, 5, 4, 8, 6):
        x = torch.randn(2, seq, 6)
        model.zero_grad()
        got = fast(x)
        got.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want = loss_of(model, x)
        want.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    assert backend.programs() == 1
    (runtime,) = backend.compiled[0].programs.values()
    assert runtime.bw is not None and _kernels(runtime)


def test_gpt_neox_generate_compiles_each_graph_once():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    kiln.reset()
    cfg = transformers.GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    backend = Counting()
    model.forward = kiln.compile(model.forward, backend=backend)
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert torch.equal(got, want)
    # prefill, then decode with the KV length symbolic from its first step ([Note: sizes that change together])
    assert len(backend.compiled) == 2, "prefill and one decode graph"
    assert backend.programs() <= 2
