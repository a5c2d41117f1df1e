"""Symbolic sequence lengths survive attention and the CUDA code path without a guard that pins them.

A guard raised while a stage traces a symbolic graph joins capture's ShapeEnv ([Note: one program
per symbolic graph] in kiln/pipeline/__init__.py); one that pins the length to its traced value makes
every new length recompile (issue #17: HF BERT on the H200 compiled a graph per length). On the
CPU build CUDA itself cannot run, but kiln's own CUDA path can be traced: the capture's fakes are
re-reported on "cuda", so the decompositions take their CUDA branch (layer_norm's eager-order
var_mean) and lowering prints Triton kernels, which compile at their first launch for symbolic
sizes. The CUDA kernels' own choice (ATen's SDPA backend selection) is the GPU test's:
tests/codegen/test_gpu_varying_lengths.py.
"""
from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln.capture
from kiln.config import CaptureConfig, Options
from kiln.symbolic import FakeTensorMode
from kiln.symbolic.fake import FakeTensor

LENGTHS = (77, 128, 200, 317, 511, 512)


class Block(torch.nn.Module):
    """A BERT layer's shape: fused qkv, SDPA, output projection, residual and layer_norm."""

    def __init__(self, dim=64, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out, self.ln = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim), torch.nn.LayerNorm(dim)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.ln(x + self.out(a.transpose(1, 2).reshape(b, t, d)))


def _accepts(env, names, make):
    guard = env.guard_function(*names)
    return {n: guard(*make(n)) for n in LENGTHS}


def test_sdpa_with_symbolic_lengths_pins_no_length():
    mode = FakeTensorMode()
    q = mode.from_real(torch.randn(2, 2, 128, 32), "q", dynamic_dims=(2,))
    mask = mode.from_real(torch.ones(128, 128, dtype=torch.bool), "m", dynamic_dims=(0, 1))
    with torch.no_grad(), mode:
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    accepted = _accepts(mode.shape_env, ["q", "m"], lambda n: (torch.randn(2, 2, n, 32), torch.ones(n, n, dtype=torch.bool)))
    assert all(accepted.values()), f"{accepted}; guards: {mode.shape_env.format_guards()}"


def _cuda_reported(fake: FakeTensor) -> FakeTensor:
    return FakeTensor(fake._meta, torch.device("cuda"), fake.fake_mode)


def _captured_block() -> torch.fx.GraphModule:
    """The graph capture gives for `Block` with a dynamic sequence length."""
    graphs = []
    captured = kiln.capture.capture(Block().eval(), lambda gm, ex: graphs.append(gm) or gm.forward,
                                    CaptureConfig(dynamic=True))
    with torch.no_grad():
        captured(torch.randn(2, 128, 64))
    (gm,) = graphs
    return gm


def test_the_kiln_backends_cuda_path_adds_no_guard_on_symbolic_sizes(monkeypatch):
    from kiln.aot import trace
    from kiln.codegen import compile as codegen_compile
    from kiln.pipeline import compile_graph_module
    gm = _captured_block()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [_cuda_reported(n.meta["example_value"]) for n in placeholders]
    for node, example in zip(placeholders, examples):
        node.meta["example_value"] = example
    env = examples[0].fake_mode.shape_env
    before = list(env.guards)
    stand_in = trace.fake_stand_in   # parameters too: every tensor of the trace reports "cuda"
    monkeypatch.setattr(trace, "fake_stand_in", lambda mode, x, grad: _cuda_reported(stand_in(mode, x, grad)))
    printers = []
    printer_for = codegen_compile.printer_for
    monkeypatch.setattr(codegen_compile, "printer_for", lambda device: printers.append(device) or printer_for(device))
    with torch.no_grad():
        program = compile_graph_module(gm, examples, Options())
    assert program is not None and printers and set(printers) == {"cuda"}, printers   # Triton kernels printed
    added = env.guards[len(before):]
    assert not added, "the CUDA path guarded symbolic sizes:\n" + "\n".join(map(str, added))
    names = [n.name for n in placeholders]
    accepted = _accepts(env, names, lambda n: (torch.randn(2, n, 64),))
    assert all(accepted.values()), accepted


@pytest.mark.parametrize("kernel", ["math", "flash", "efficient", "cudnn"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "bool-mask"])
def test_cuda_attention_chosen_at_the_hints_pins_no_length(kernel, masked):
    """[Note: attention kernels chosen at the hints]: each kernel's op on symbolic CUDA fakes, through
    kiln's rule (the choice itself needs CUDA: it is given here), adds no guard that pins a size."""
    from kiln.symbolic import attention
    choice = {"math": attention.MATH, "flash": attention.FLASH, "efficient": attention.EFFICIENT,
              "cudnn": attention.CUDNN}[kernel]
    if masked and choice == attention.FLASH:
        pytest.skip("the flash kernel takes no mask; the chooser never picks it for one")
    mode = FakeTensorMode()
    q = _cuda_reported(mode.from_real(torch.randn(2, 2, 128, 64), "q", dynamic_dims=(2,)))
    mask = _cuda_reported(mode.from_real(torch.ones(2, 1, 128, 128, dtype=torch.bool), "m", dynamic_dims=(2, 3))) \
        if masked else None
    chooser = attention.kernel_choice
    attention.kernel_choice = lambda *a: choice
    try:
        with torch.no_grad(), mode:
            out = attention.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    finally:
        attention.kernel_choice = chooser
    assert out.device.type == "cuda" and tuple(out.shape) == tuple(q.shape) and out.dtype == q.dtype
    pins = [g for g in mode.shape_env.guards if isinstance(g.expr, sympy.Eq) and any(a.is_Integer for a in g.expr.args)]
    assert not pins, mode.shape_env.format_guards()


def test_aot_routes_attention_through_the_rule_and_restores_the_graph(monkeypatch):
    from kiln.aot import trace
    from kiln.symbolic.rules import SYMBOLIC_RULES
    calls = []
    rule = SYMBOLIC_RULES[F.scaled_dot_product_attention]     # the table both capture and aot route by
    monkeypatch.setitem(SYMBOLIC_RULES, F.scaled_dot_product_attention, lambda *a, **k: calls.append(1) or rule(*a, **k))
    gm = _captured_block()
    before = gm.code
    examples = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    trace.trace_joint(gm, examples)
    assert calls, "the aot trace did not call kiln's attention rule"
    assert gm.code == before      # the user's graph is restored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["plain", "bool-mask", "float-mask", "causal", "negative-scale", "masked-row"])
def test_the_math_kernel_written_out_equals_atens(case, dtype):
    """The math fallback kiln writes out in torch ops (its C++ composite pins sizes on CUDA) computes
    what ATen's math kernel does, on real tensors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from kiln.symbolic import attention
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 16, dtype=dtype) for _ in range(3))
    mask, causal, scale = None, case == "causal", -0.3 if case == "negative-scale" else None
    if case in ("bool-mask", "masked-row"):
        mask = torch.rand(2, 1, 37, 37) > 0.3
        if case == "masked-row":
            mask[0, 0, 5] = False          # every key masked: ATen's softmax gives 0 there, not NaN
    elif case == "float-mask":
        mask = torch.randn(2, 1, 37, 37, dtype=dtype)
    with sdpa_kernel(SDPBackend.MATH):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    got = attention._math(q, k, v, mask, 0.0, causal, scale)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
