"""A dim split by reshapes and put back together indexes as the plain dim (`_merge_div_mod` in
kiln/codegen/indexing.py). An attention block's fused qkv gradient is the stack of q, k and v's
gradients read as [3, heads, head_dim] and reshaped back to one dim: unsimplified, its loads index
`Mod(x, 16) + 16*Mod(floor(x/16), 3) + 48*floor(x/48)`, which hides that the bias gradient reads
rows along x (the heuristics then launched one column a program: 193 us a layer on ViT-B's H200
training step) and that a transpose of it is a view."""
from __future__ import annotations

import re

import sympy
import torch

import kiln
from kiln import backends
from kiln.codegen.indexing import simplify_index

x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)


def test_a_dim_split_in_three_merges_back():
    split = sympy.Mod(x0, 64) + 64 * sympy.Mod(sympy.floor(x0 / 64), 12) + 768 * sympy.floor(x0 / 768)
    assert simplify_index(2304 * x1 + split, {x0: 2304, x1: 100}) == 2304 * x1 + x0


def test_symbolic_sizes_merge_and_other_coefficients_do_not():
    n = sympy.Symbol("s0", integer=True, positive=True)
    assert simplify_index(sympy.Mod(x0, n) + n * sympy.floor(x0 / n) + x1, {x0: 4 * n, x1: 3}) == x0 + x1
    wrong = sympy.Mod(x0, 64) + 64 * sympy.Mod(sympy.floor(x0 / 64), 12) + 700 * sympy.floor(x0 / 768)
    assert simplify_index(wrong, {x0: 2304}).has(sympy.Mod)


class Attention(torch.nn.Module):
    """timm's attention: one qkv projection, reshaped to (3, heads, head_dim) and unbound."""

    def __init__(self, dim=48, heads=3):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(a.transpose(1, 2).reshape(b, n, c))


def test_the_qkv_gradient_is_indexed_without_div_or_mod(monkeypatch, tmp_path):
    from kiln.codegen import compile as codegen_compile
    from kiln.codegen import triton as triton_printer
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(codegen_compile, "printer_for", lambda device: triton_printer)   # interpreted on CPU
    kiln.reset()
    torch.manual_seed(0)
    model, programs = Attention(), []
    fast = kiln.compile(model, backend=lambda gm, ex: programs.append(backends.kiln(gm, ex)) or programs[-1])
    x = torch.randn(4, 10, 48)
    fast(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    (runtime,) = programs[0].programs.values()
    sources = [k.source for name, k in runtime.bw.__globals__.items() if name.startswith("kernel")]
    assert sources, "no Triton kernel in the backward: the test would check nothing"
    assert not [s for s in sources if "Mod(" in s or "floor(" in s], "\n\n".join(sources)


def test_the_transposed_qkv_gradient_is_a_view_not_a_copy(monkeypatch):
    """Past the point-by-point check's size (a million elements) only a simplified index proves a
    view: the weight gradient's matmul took a transposed copy of the qkv gradient (ViT-B on the
    H200: a 207 us uncoalesced copy a layer)."""
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    kiln.reset()
    torch.manual_seed(0)
    model, programs = Attention(768, 12), []
    fast = kiln.compile(model, backend=lambda gm, ex: programs.append(backends.kiln(gm, ex)) or programs[-1])
    x = torch.randn(8, 64, 768)       # the qkv gradient: 8 * 64 * 2304 elements
    fast(x).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
    (runtime,) = programs[0].programs.values()
    source = runtime.bw.host_source
    assert "_view(buf" in source and "(2304, 512, ), (1, 2304, )" in source, source     # the matmul's transposed view
    assert not re.search(r"_(keep|empty)\((\d+, )?\(2304, 512, \)", source), source        # and no copy of it
