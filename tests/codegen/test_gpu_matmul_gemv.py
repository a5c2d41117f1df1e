"""The GEMV form on a real GPU ([Note: GEMV by default] in kiln/codegen/triton/heuristics.py): in the
default mode a decoding layer's product at a few tokens compiles to one GEMV kernel with its bias,
GELU and residual add fused (no cuBLAS call), its result eager's (bf16/fp16 by the benchmark's rule
against float64, float32 closely); at many tokens the extern stays. Skipped without CUDA;
`bash bench/gpu_checks.sh tests` runs it on the GPU machine."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.bench.accuracy import same
from kiln.codegen.triton import launcher

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _linear_gelu_residual(x, w, b, r):
    return F.gelu(F.linear(x, w, b)) + r


def _compiled(fn, *inputs):
    """fn compiled in the default mode, its result, and the kernels it built."""
    kiln.reset()
    before = {id(k) for k in launcher.BUILT}
    got = kiln.compile(fn, dynamic=False)(*inputs)
    torch.cuda.synchronize()
    return got, [k for k in launcher.BUILT if id(k) not in before]


@pytest.mark.parametrize("m, k, n, dtype", [
    (1, 2560, 7680, torch.bfloat16),      # dolly's qkv at one token
    (3, 2560, 10240, torch.bfloat16),     # dolly's fc1 at three tokens: three rows of a 4-row block
    (1, 10240, 2560, torch.float16),      # dolly's fc2
    (1, 2048, 2048, torch.float32),       # LLaMA's o, float32
    (2, 2000, 3001, torch.bfloat16),      # K and N no multiples of any block
])
def test_decode_products_are_fused_gemvs(m, k, n, dtype):
    torch.manual_seed(0)
    x, r = torch.randn(m, k, device="cuda").to(dtype), torch.randn(m, n, device="cuda").to(dtype)
    w, b = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype), torch.randn(n, device="cuda").to(dtype)
    got, built = _compiled(_linear_gelu_residual, x, w, b, r)
    assert [k.template["form"] for k in built if k.template] == ["gemv"], built
    assert len(built) == 1, built         # bias, GELU and residual in the GEMV's epilogue
    want = _linear_gelu_residual(x, w, b, r)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:
        verdict = same(want, got, _linear_gelu_residual(x.double(), w.double(), b.double(), r.double()), tol=1e-2)
        assert verdict.ok, verdict.detail


def test_many_tokens_keep_cublas():
    torch.manual_seed(0)
    x, w, b, r = (torch.randn(*s, device="cuda").to(torch.bfloat16) for s in ((64, 2560), (7680, 2560), (7680,), (64, 7680)))
    got, built = _compiled(_linear_gelu_residual, x, w, b, r)
    assert not [k for k in built if k.template], built
    verdict = same(_linear_gelu_residual(x, w, b, r), got,
                   _linear_gelu_residual(x.double(), w.double(), b.double(), r.double()), tol=1e-2)
    assert verdict.ok, verdict.detail


def test_a_compiled_decoder_layer_stack_matches_eager():
    """An MLP block of dolly's sizes at one token, bf16: both products GEMVs, eager's answer."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(2560, 10240), torch.nn.GELU(), torch.nn.Linear(10240, 2560))
    mlp = mlp.to("cuda", torch.bfloat16)
    x = torch.randn(1, 2560, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got, built = _compiled(lambda x: mlp(x) + x, x)
        want = mlp(x) + x
        ref = mlp.to(torch.float64)(x.double()) + x.double()
    assert [k.template["form"] for k in built if k.template] == ["gemv", "gemv"], built
    verdict = same(want, got, ref, tol=1e-2)
    assert verdict.ok, verdict.detail


def _llama_mlp(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _qkv(x, w_q, w_k, w_v):
    return F.linear(x, w_q), F.linear(x, w_k), F.linear(x, w_v)


@pytest.mark.parametrize("m", [1, 3])
def test_llama_siblings_are_one_kernel_each(m):
    """[Note: sibling GEMVs] (kiln/codegen/matmul_templates.py) at LLaMA-1.1B's sizes, bf16: q, k and
    v one kernel (k and v too narrow to be GEMVs alone); gate, up and silu(gate) * up one kernel,
    down another. Eager's answers. (Written on a machine without a GPU: not yet run on one.)"""
    torch.manual_seed(0)
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    weights = [(torch.randn(n, 2048, device="cuda") / 2048 ** 0.5).to(torch.bfloat16) for n in (2048, 256, 256)]
    with torch.no_grad():
        got, built = _compiled(_qkv, x, *weights)
        reference = _qkv(x.double(), *(w.double() for w in weights))
    assert len(built) == 1 and built[0].template["form"] == "gemv", built
    for g, w, r in zip(got, _qkv(x, *weights), reference):
        verdict = same(w, g, r, tol=1e-2)
        assert verdict.ok, verdict.detail
    weights = [(torch.randn(*s, device="cuda") / s[1] ** 0.5).to(torch.bfloat16) for s in ((5632, 2048), (5632, 2048), (2048, 5632))]
    with torch.no_grad():
        got, built = _compiled(_llama_mlp, x, *weights)
        reference = _llama_mlp(x.double(), *(w.double() for w in weights))
    assert [k.template["form"] for k in built if k.template] == ["gemv", "gemv"] and len(built) == 2, built
    verdict = same(_llama_mlp(x, *weights), got, reference, tol=1e-2)
    assert verdict.ok, verdict.detail


def _rms_norm(x, w):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def _rms_qkv(x, w, w_q, w_k, w_v):
    return _qkv(_rms_norm(x, w), w_q, w_k, w_v)


def _rms_mlp(x, w, w_gate, w_up, w_down):
    return _llama_mlp(_rms_norm(x, w), w_gate, w_up, w_down)


def _layer_norm_qkv(x, w, b, w_qkv, b_qkv):
    return F.linear(F.layer_norm(x, (x.shape[-1],), w, b), w_qkv, b_qkv)


def _check(fn, inputs, kernels):
    with torch.no_grad():
        got, built = _compiled(fn, *inputs)
        reference = fn(*(x.double() for x in inputs))
    assert len(built) == kernels and all(k.template and k.template["form"] == "gemv" for k in built), built
    want = fn(*inputs)
    for g, w, r in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (got, want, reference))):
        verdict = same(w, g, r, tol=1e-2)
        assert verdict.ok, verdict.detail


@pytest.mark.parametrize("m", [1, 4])
def test_norms_are_computed_in_their_gemvs(m, monkeypatch):
    """[Note: norm prologues] (kiln/codegen/prologues.py) at LLaMA-1.1B's and dolly's sizes, bf16: the
    RMSNorm before q/k/v is one kernel with them, before gate/up one kernel with them (down another),
    dolly's LayerNorm before qkv one kernel. Eager's answers. (Written on a machine without a GPU:
    not yet run on one.) Off by default until timed (prologues.NORM_PROLOGUES): on here."""
    from kiln.codegen import prologues
    monkeypatch.setattr(prologues, "NORM_PROLOGUES", True)
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, w = torch.randn(m, 2048, **bf16), torch.rand(2048, **bf16) + 0.5
    qkv = [torch.randn(n, 2048, **bf16) / 2048 ** 0.5 for n in (2048, 256, 256)]
    _check(_rms_qkv, [x, w, *qkv], 1)
    mlp = [torch.randn(*s, **bf16) / s[1] ** 0.5 for s in ((5632, 2048), (5632, 2048), (2048, 5632))]
    _check(_rms_mlp, [x, w, *mlp], 2)
    x = torch.randn(m, 2560, **bf16)
    ln = [torch.rand(2560, **bf16) + 0.5, torch.randn(2560, **bf16), torch.randn(7680, 2560, **bf16) / 2560 ** 0.5,
          torch.randn(7680, **bf16)]
    _check(_layer_norm_qkv, [x, *ln], 1)
