"""bfloat16 autocast through the Triton printer (the GPU path), run by Triton's interpreter on CPU
tensors: casts, fills, views, pads, reductions and indexing in bf16 are kernels, and only matmul,
convolution and attention stay ATen calls. Results must pass the benchmark's `same` rule against
eager under the same autocast, with a float64 eager run as the arbiter.
"""
import contextlib

import pytest
import torch
from torch import nn

import kiln
from kiln.bench.accuracy import same, tolerance

# Ops left to ATen under the Triton printer's dtype policy: the library kernels themselves.
LIBRARY_EXTERNS = ("mm", "bmm", "convolution", "scaled_dot_product")


@pytest.fixture(autouse=True)
def _fresh_compile(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")


@contextlib.contextmanager
def triton_programs(programs: list):
    """kiln's backend compiling every prim graph with the Triton printer; keeps each program."""
    import kiln.pipeline as backend
    from kiln.codegen import triton as triton_printer

    saved = backend.compile_prim_graph

    def compile_one(gm, example_inputs, **options):
        call = saved(gm, example_inputs, **{**options, "printer": triton_printer})
        programs.append(call)
        return call
    backend.compile_prim_graph = compile_one
    try:
        yield
    finally:
        backend.compile_prim_graph = saved


def _linked(programs) -> list:
    """The linked host programs (a program still building is a `PendingProgram`: [Note: parallel builds])."""
    return [call.finish() if hasattr(call, "finish") else call for call in programs]


def _externs(programs) -> list[str]:
    """The ops each host program calls as externs (its `_externN` globals)."""
    return [str(v) for call in _linked(programs) for k, v in call.__globals__.items() if k.startswith("_extern")]


def _kernels(programs) -> list[str]:
    return [k for call in _linked(programs) for k in call.__globals__ if k.startswith("kernel")]


def check_bf16(model, *inputs):
    model.eval()
    programs: list = []
    kiln.reset()
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref = model(*inputs)
            with triton_programs(programs):
                got = kiln.compile(model, backend="kiln")(*inputs)
        fp64 = model.double()(*[x.double() if x.is_floating_point() else x for x in inputs])
    verdict = same(ref, got, fp64, tol=tolerance("zoo", "infer", "bf16"))
    assert verdict.ok, verdict.detail
    assert _kernels(programs), "no Triton kernel: eager compared with eager"
    others = [op for op in _externs(programs) if not any(name in op for name in LIBRARY_EXTERNS)]
    assert not others, f"bf16 ops left to ATen: {others}"
    return programs


def _compiled_to_kernels_only(fn, x):
    """fn(x) through kiln's Triton path, which must leave no op to ATen, and eagerly."""
    programs: list = []
    kiln.reset()
    with triton_programs(programs):
        got = kiln.compile(fn, backend="kiln")(x)
    assert _kernels(programs) and not _externs(programs), _externs(programs)
    return got, fn(x)


def test_bf16_cast_rounds_to_nearest_even_like_eager():
    # Triton's interpreter truncates float32 -> bfloat16; eager (and the GPU) round to nearest even
    x = torch.randn(1000) * 3

    def fn(x):
        return x.to(torch.bfloat16) * 2, (x + 1).to(torch.bfloat16)
    got, want = _compiled_to_kernels_only(fn, x)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_bf16_linear_with_bias_rounds_once_like_eager():
    # eager's addmm adds the bias before rounding the product; mm then add rounds twice, which moved
    # a quarter of a 2560-wide bf16 linear's outputs by one step (GPT-NeoX generate() then diverged)
    torch.manual_seed(0)
    layer = nn.Linear(256, 256)
    x = torch.randn(64, 256)
    programs: list = []
    kiln.reset()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.relu(layer(x))
        with triton_programs(programs):
            got = kiln.compile(lambda x: torch.relu(layer(x)), backend="kiln")(x)
    assert got.dtype == torch.bfloat16 and _kernels(programs)
    assert any("addmm" in op for op in _externs(programs)), _externs(programs)
    assert torch.equal(got, want), f"{(got != want).float().mean():.1%} of outputs differ from eager"


def test_bf16_pool_pad_and_reduction_are_kernels():
    def fn(x):
        y = torch.nn.functional.max_pool2d(x.relu(), 3, 2, 1)
        return torch.nn.functional.pad(y, (1, 1)).amax(dim=(2, 3)), y.sum(1)
    x = torch.randn(2, 4, 9, 9).bfloat16()
    got, want = _compiled_to_kernels_only(fn, x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)     # max and pad are exact
    torch.testing.assert_close(got[1], want[1], rtol=2e-2, atol=2e-2)


def test_hf_gpt2_tiny_bf16_autocast():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    check_bf16(transformers.GPT2Model(config), torch.randint(0, 128, (2, 16)))


def test_hf_bert_tiny_bf16_autocast():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    check_bf16(transformers.BertModel(config), torch.randint(0, 128, (2, 16)))


def _timm():
    from kiln.bench.suites import import_timm
    timm = import_timm()
    if timm is None:
        pytest.skip("timm is not installed")
    return timm


def test_timm_resnet_tiny_bf16_autocast():
    _timm()
    from timm.models.resnet import Bottleneck, ResNet
    torch.manual_seed(0)
    model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=8, stem_width=8, channels=(4, 8, 8, 8))
    check_bf16(model, torch.randn(1, 3, 32, 32))


def test_timm_convnext_tiny_bf16_autocast():
    _timm()
    from timm.models.convnext import ConvNeXt
    torch.manual_seed(0)
    model = ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), num_classes=8)
    check_bf16(model, torch.randn(1, 3, 32, 32))
