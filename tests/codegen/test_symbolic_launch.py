"""Kernels of symbolic sizes launch as the static ones do at the same sizes (issue #17, item 3).

A Triton kernel's launch (block sizes, warps, persistent or looped body, grid, index dtype) is
chosen by the launcher from the size ints of each call (`launcher.TritonKernel.plan`, by
`heuristics.choose`), for static and symbolic kernels alike. What made a symbolic program slower
than the static one at the same length was upstream of the launch: index expressions that the
simplifier could not decide with symbolic bounds ([Note: symbolic index bounds]: a layer_norm's
epilogue unfused, divisions by runtime sizes per element) and matrix products left unpadded
([Note: padding products of symbolic sizes]). These tests compile a BERT-shaped model for CUDA on
the CPU (fakes re-reported on "cuda", as tests/codegen/test_symbolic_guards_cuda_path.py does),
once with a symbolic length and once per static length, and compare every kernel's launch plan at
each length; and run the symbolic program (Triton's interpreter) against eager.
"""
from __future__ import annotations

import re

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
import kiln.capture
from kiln.codegen import matmul_padding
from kiln.codegen.indexing import simplify_index
from kiln.codegen.ir import loop_var, reduction_var
from kiln.config import CaptureConfig, Options
from kiln.symbolic.fake import FakeTensor

pytestmark = pytest.mark.filterwarnings("ignore:kiln could not precompile Triton kernels")

S0, S1 = (sympy.Symbol(f"s{i}", integer=True, positive=True) for i in range(2))
X0, X1, X2, X3 = (loop_var(k) for k in range(4))
R0 = reduction_var(0)


@pytest.mark.parametrize("index, upper, expected", [
    # a reshape's split put back together (layer_norm's epilogue read of its reduction's row)
    (S1 * sympy.floor((S1 * X0 + X1) / S1) + sympy.Mod(X1, S1), {X0: S0, X1: S1}, S1 * X0 + X1),
    # heads split off a row of 64*s1: the quotient is 0, the remainder the index itself
    (64 * sympy.Mod(X1, S1) + 64 * S1 * sympy.floor((X3 + 64 * X1) / (64 * S1)), {X1: S1, X3: 64}, 64 * X1),
    # a [s1, s1] block walked through one flat reduction index
    (S1 * sympy.Mod(X2 + sympy.floor(R0 / S1), S1) + S1 ** 2 * sympy.floor((R0 + X2 * S1) / S1 ** 2)
     + sympy.Mod(R0, S1), {X2: S1, R0: S1}, R0 + S1 * X2),
    # not decided: x1 runs to s0, not s1
    (sympy.Mod(X1, S1), {X1: S0}, sympy.Mod(X1, S1)),
    (sympy.floor((S1 * X0 + X1) / S1), {X0: S0, X1: S1 + 1}, sympy.floor((S1 * X0 + X1) / S1)),
    # numbers as before
    (sympy.floor((32 * X0 + X1) / 32) + sympy.Mod(32 * X0 + X1, 32), {X0: 4, X1: 32}, X0 + X1),
])
def test_symbolic_bounds_decide_div_and_mod(index, upper, expected):
    assert sympy.expand(simplify_index(index, upper) - expected) == 0


class BertShaped(torch.nn.Module):
    """Embeddings + layer_norm, one encoder layer (fused qkv, SDPA, GELU MLP, two post-norms) and a
    masked-LM head whose vocabulary (4001) is no multiple of 16 bytes, so its product is padded."""

    def __init__(self, dim=64, heads=2, vocab=4001):
        super().__init__()
        self.heads = heads
        self.emb, self.pos, self.ln = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(512, dim), torch.nn.LayerNorm(dim)
        self.qkv, self.out, self.ln1 = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim), torch.nn.LayerNorm(dim)
        self.up, self.down, self.ln2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim), torch.nn.LayerNorm(dim)
        self.dense, self.hln, self.decoder = torch.nn.Linear(dim, dim), torch.nn.LayerNorm(dim), torch.nn.Linear(dim, vocab)

    def forward(self, ids, pos):
        x = self.ln(self.emb(ids) + self.pos(pos))
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, t, d)))
        x = self.ln2(x + self.down(F.gelu(self.up(x))))
        return self.decoder(self.hln(F.gelu(self.dense(x))))


# The rows of every product (BATCH * length) stay a multiple of 16 bytes of float32, as BERT's
# 16 * length do in bf16: a static product pads misaligned rows, a symbolic one never does.
BATCH = 4
# The vocabulary product (4*t*64*4001 multiply-adds) is padded at every length here, statically
# and symbolically; the attention products at the misaligned length (4*2*77*77*32) are not, so the
# static program pads no symbolic dim there.
PAD_MIN_MACS = 1 << 22


def _inputs(length: int):
    return torch.randint(0, 4001, (BATCH, length)), torch.arange(length).expand(BATCH, length)


def _cuda_reported(x):
    return FakeTensor(x._meta, torch.device("cuda"), x.fake_mode) if isinstance(x, torch.Tensor) else x


def _captured(model, dynamic: bool, *args, **kwargs) -> torch.fx.GraphModule:
    graphs = []
    captured = kiln.capture.capture(model, lambda gm, ex: graphs.append(gm) or gm.forward, CaptureConfig(dynamic=dynamic))
    with torch.no_grad():
        captured(*args, **kwargs)
    (gm,) = graphs
    return gm


def _built(gm, examples, m) -> dict:
    """`gm` compiled by the kiln backend (under the patches of monkeypatch context `m`): its
    Triton kernels, name -> TritonKernel."""
    from kiln.pipeline import compile_graph_module
    from kiln.codegen.triton import launcher
    loaded = []
    load = launcher._load
    m.setattr(launcher, "_load", lambda *a: loaded.append(load(*a)) or loaded[-1])
    with torch.no_grad():
        compile_graph_module(gm, examples, Options())
    return {name: k for part in loaded for name, k in part.items()}


def _cuda_kernels(model, length: int, dynamic: bool, monkeypatch) -> dict:
    """The Triton kernels of `model` captured at `length` and compiled for CUDA."""
    from kiln.aot import trace
    gm = _captured(model, dynamic, *_inputs(length))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [_cuda_reported(n.meta["example_value"]) for n in placeholders]
    for node, example in zip(placeholders, examples):
        node.meta["example_value"] = example
    with monkeypatch.context() as m:
        stand_in = trace.fake_stand_in
        m.setattr(trace, "fake_stand_in", lambda mode, x, grad: _cuda_reported(stand_in(mode, x, grad)))
        return _built(gm, examples, m)


def _plans(kernels: dict, sizes: tuple) -> list[tuple]:
    """Each kernel's launch at these size ints, as comparable data (kernel names left out: a
    kernel's name hashes its loop IR, which names symbols where the static one has numbers)."""
    out = []
    for k in kernels.values():
        plan = k.plan(sizes if k.spec.size_args else (), ())
        looped = plan.fn is k.looped_fn and k.looped_fn is not None
        out.append((k.spec.kind, plan.numels, plan.config.describe(), plan.grid, str(plan.index_dtype), looped))
    return sorted(out, key=repr)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BertShaped().eval()


@pytest.fixture(scope="module")
def symbolic(model):
    """The model's kernels compiled once with a symbolic batch and length (traced at length 128)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("KILN_DISABLE_CACHE", "1")
        m.setattr(matmul_padding, "PAD_MIN_MACS", PAD_MIN_MACS)
        yield _cuda_kernels(model, 128, True, m)


@pytest.mark.parametrize("length", [77, 128, 200, 512])
def test_symbolic_kernels_launch_as_the_static_ones_at_each_length(model, symbolic, length, monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    monkeypatch.setattr(matmul_padding, "PAD_MIN_MACS", PAD_MIN_MACS)
    static = _cuda_kernels(model, length, False, monkeypatch)
    (names,) = {k.spec.size_args for k in symbolic.values() if k.spec.size_args}
    assert set(names) == {"s0", "s1"}            # the batch and the length
    sizes = tuple({"s0": BATCH, "s1": length}[n] for n in names)
    plans = _plans(static, ())
    assert _plans(symbolic, sizes) == plans
    # the vocabulary product is padded in both: the weight's padded copy (64 x 4004 float32) is there
    assert any(p[1] == (64 * 4004,) for p in plans), plans


# A division or remainder by a runtime size (`// s1`, `% (64 * s1)`) in printed Triton text.
RUNTIME_DIVISION = re.compile(r"(//|%)\s*\(?\s*(\d+\s*\*\s*)?s\d")


def test_symbolic_kernels_divide_by_a_runtime_size_once(symbolic):
    """[Note: one division per symbolic dim]: the head split of q/k/v over (s0, 12, s1, 64), which
    printed run by run divided by 192*s1, 64*s1 and s1 per element, names one chain of quotients."""
    for k in symbolic.values():
        for function in k.source.split("@triton.jit")[1:]:
            divisions = [line.strip() for line in function.splitlines() if RUNTIME_DIVISION.search(line)]
            assert len(divisions) <= 1, f"{k.layout.name}: {divisions}"


def test_symbolic_program_with_padded_products_equals_eager(monkeypatch, tmp_path):
    """The symbolic program run through Triton's interpreter, products padded as on CUDA, at four
    lengths with one program: eager's results."""
    from kiln.codegen import compile as codegen_compile
    from kiln.codegen import layout
    from kiln.codegen import triton as triton_printer
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matmul_padding, "PAD_MIN_MACS", PAD_MIN_MACS)
    monkeypatch.setattr(codegen_compile, "printer_for", lambda device: triton_printer)
    padded = []

    def pad_everywhere(graph, devices=("cuda",)):
        out = matmul_padding.pad_matmuls(graph, ("cpu", "cuda"))
        padded.extend(b.name for b in out.buffers if "_pad" in b.name)
        return out
    monkeypatch.setattr(layout, "pad_matmuls", pad_everywhere)
    torch.manual_seed(0)
    model = BertShaped(dim=32, vocab=1001).eval()
    kiln.reset()
    programs = []
    fast = kiln.compile(model, dynamic=True, backend=lambda gm, ex: programs.append(kiln.backends.kiln(gm, ex)) or programs[-1])
    with torch.no_grad():
        for length in (9, 16, 23, 16):
            ids, pos = torch.randint(0, 1001, (BATCH, length)), torch.arange(length).expand(BATCH, length)
            torch.testing.assert_close(fast(ids, pos), model(ids, pos), rtol=1e-4, atol=1e-4)
    assert len(programs) == 1 and len(programs[0].programs) == 1
    assert padded, "no product was padded: the test would not exercise symbolic padding"


def _hf_kernels(model, length: int, dynamic: bool, monkeypatch) -> dict:
    """Hugging Face's model captured at `length` and compiled with Triton kernels on CPU tensors
    (printed for the interpreter; the launch plans are the launcher's either way)."""
    from kiln.codegen import compile as codegen_compile
    from kiln.codegen import triton as triton_printer
    gm = _captured(model, dynamic, input_ids=torch.randint(0, 1000, (BATCH, length)))
    with monkeypatch.context() as m:
        m.setattr(codegen_compile, "printer_for", lambda device: triton_printer)
        return _built(gm, [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"], m)


def test_hugging_face_bert_launches_as_static_at_each_length(monkeypatch):
    """BertForMaskedLM (tiny config): with a symbolic length its mask is elided as the static
    capture's is ([Note: masks of symbolic sizes]) and every kernel launches as the static one's."""
    from kiln.bench.suites import ensure_torchvision_importable
    ensure_torchvision_importable()
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=128)
    model = transformers.BertForMaskedLM(config).eval()
    symbolic = _hf_kernels(model, 16, True, monkeypatch)
    (names,) = {k.spec.size_args for k in symbolic.values() if k.spec.size_args}
    for length in (9, 16, 23):
        sizes = tuple({"s0": BATCH, "s1": length}[n] for n in names)
        assert _plans(symbolic, sizes) == _plans(_hf_kernels(model, length, False, monkeypatch), ()), length
