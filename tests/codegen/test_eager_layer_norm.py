"""[Note: eager's layer_norm statistics]: the `var_mean` prim, which Triton kernels reduce in the
order of eager's own CUDA layer_norm kernel. On CPU that order runs under Triton's interpreter (its
fma rounds twice, so results are close, not equal); on a GPU mean and rstd must be eager's bit for
bit (skipped without one). On CUDA, layer_norm's decomposition takes the prim; on CPU it keeps two
passes, so the CPU tests of whole models route it through the prim themselves."""
import pytest
import torch

import kiln
import kiln.prims.ops  # noqa: F401  (registers the prims)
from kiln.codegen.triton.launcher import BUILT

var_mean = torch.ops.kiln_prims.var_mean


@pytest.fixture(autouse=True)
def _fresh_compile(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")


@pytest.mark.parametrize("rows,cols", [(6, 1000), (33, 64), (3, 2560)])
def test_var_mean_in_eagers_order_under_the_interpreter(rows, cols):
    from test_gpu_bf16 import triton_programs
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)) * 3 + 2

    def fn(t):
        return var_mean(t * 2, [1])
    programs = []
    kiln.reset()
    BUILT.clear()
    with triton_programs(programs):
        var, mean = kiln.compile(fn)(x)
    want_var, want_mean = torch.var_mean(x.double() * 2, 1, correction=0)
    torch.testing.assert_close(mean.double(), want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var.double(), want_var, rtol=1e-5, atol=1e-4)
    assert any("_k_ln_combine" in k.source for k in list(BUILT)), "the eager-order Welford was not printed"


def test_var_mean_of_a_value_the_kernel_also_stores():
    """A sum stored, reduced and normalized by one kernel."""
    from test_gpu_bf16 import triton_programs
    x, r = torch.randn(2, 7, 520).unbind(0)

    def fn(a, b):
        h = (a + b) * 3
        var, mean = var_mean(h, [1])
        return h, (h - mean[:, None]) * torch.rsqrt(var[:, None] + 1e-5)
    kiln.reset()
    BUILT.clear()
    with triton_programs([]):
        h, normed = kiln.compile(fn)(x, r)
    want = (x + r) * 3
    torch.testing.assert_close(h, want)
    torch.testing.assert_close(normed, torch.nn.functional.layer_norm(want, (520,)), rtol=1e-4, atol=1e-4)
    assert any("_k_ln_combine" in k.source for k in list(BUILT))


def test_every_layer_norm_of_gpt_neox_takes_the_eager_order(monkeypatch):
    """With layer_norm routed through var_mean (as it would be on CUDA), each of GPT-NeoX's
    statistics kernels prints the eager order, the fused residual sums included."""
    transformers = pytest.importorskip("transformers")
    from kiln.bench.suites import ensure_torchvision_importable
    from kiln.prims.decompositions import normalization
    from kiln.prims.ops import ops as p
    from test_gpu_bf16 import triton_programs
    ensure_torchvision_importable()
    monkeypatch.setattr(normalization, "_layer_norm_stats", lambda device_type: lambda x, dims: p.var_mean(x, dims)[::-1])
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=64, rotary_pct=0.25)).eval()
    ids = torch.randint(0, 500, (1, 8))
    kiln.reset()
    BUILT.clear()
    with torch.no_grad(), triton_programs([]):
        got = kiln.compile(lambda i: model(input_ids=i, use_cache=False).logits)(ids)
        want = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    stats = [k.source for k in list(BUILT) if "wmean" in k.source]
    assert len(stats) >= 3 and all("_k_ln_combine" in src for src in stats)


def test_eager_order_kernels_launch_one_row_on_128_threads():
    """The printed kernel states its threads a row, and the launcher runs it so, whatever the
    heuristic would pick (lane t must be thread t for Triton's reduction to take eager's order)."""
    from test_gpu_bf16 import triton_programs
    x = torch.randn(8, 4096)
    kiln.reset()
    BUILT.clear()
    with triton_programs([]):
        var, mean = kiln.compile(lambda t: var_mean(t, [1]))(x)
    torch.testing.assert_close(mean, x.mean(1), rtol=1e-5, atol=1e-5)
    (kernel,) = [k for k in list(BUILT) if "_k_ln_combine" in k.source]
    assert kernel.row_threads == 128
    (config,) = kernel.configs.values()
    assert (config.XBLOCK, config.num_warps) == (1, 4)
    from kiln.codegen.triton import heuristics
    looped = heuristics.LaunchConfig(XBLOCK=1, RBLOCK=2048, num_warps=8, persistent=False)
    assert heuristics.pin_row_threads(looped, 40000, 128) == looped


def test_rows_eager_does_not_vectorize_keep_kilns_own_statistics():
    """Eager's layer_norm takes another kernel (another order) for rows of N % 4 != 0, so there is
    no order to match and kiln keeps its faster statistics."""
    from test_gpu_bf16 import triton_programs
    x = torch.randn(6, 1001)
    kiln.reset()
    BUILT.clear()
    with triton_programs([]):
        var, mean = kiln.compile(lambda t: var_mean(t, [1]))(x)
    want_var, want_mean = torch.var_mean(x, 1, correction=0)
    torch.testing.assert_close(mean, want_mean)
    torch.testing.assert_close(var, want_var, rtol=1e-5, atol=1e-5)
    assert not any("_k_ln_combine" in k.source for k in list(BUILT))


def test_var_mean_on_the_cpp_backend():
    x = torch.randn(5, 300) * 4 - 1
    kiln.reset()
    var, mean = kiln.compile(lambda t: var_mean(t, [1]))(x)
    want_var, want_mean = torch.var_mean(x, 1, correction=0)
    torch.testing.assert_close(mean, want_mean)
    torch.testing.assert_close(var, want_var, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cols", [768, 1000, 2560, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_var_mean_gives_eagers_layer_norm_statistics_on_the_gpu(cols, dtype):
    g = torch.Generator(device="cuda").manual_seed(cols)
    x = (torch.randn(64, cols, device="cuda", generator=g) * torch.rand(64, 1, device="cuda", generator=g) * 8
         + torch.randn(64, 1, device="cuda", generator=g) * 4).to(dtype)
    residual = torch.randn_like(x)

    def fn(x, r):
        var, mean = var_mean((x + r).float(), [1])
        return mean, torch.rsqrt(var + 1e-5)
    kiln.reset()
    mean, rstd = kiln.compile(fn)(x, residual)
    _, want_mean, want_rstd = torch.native_layer_norm(x + residual, (cols,), None, None, 1e-5)
    for name, a, e in (("mean", mean, want_mean.flatten()), ("rstd", rstd, want_rstd.flatten())):
        assert torch.equal(a, e), f"{name}: {int((a != e).sum())} of {e.numel()} differ"


def test_a_name_assigned_again_later_does_not_stand_for_the_earlier_value():
    """The eager-order statistics recompute a whole-row `Var` from its assignment: the one before
    the statistics, not a later stage's assignment of the same name."""
    from kiln.codegen import ir
    from kiln.codegen.triton.reductions import _assigned_before
    x0, r0 = ir.size_var("x0"), ir.size_var("r0")
    F32 = torch.float32
    doubled = ir.Op("mul", (ir.Load("a", x0 * 64 + r0, F32), ir.Constant(2.0, F32)), F32)
    stats = ir.Accumulate("v", "welford_mean", ir.Var("t", F32))
    reloaded = ir.Load("out", x0 * 64 + r0, F32)
    kernel = ir.Kernel("k", (x0,), (ir.Stage((r0,), (ir.Assign("t", doubled), ir.Store("out", x0 * 64 + r0, ir.Var("t", F32)),
                                                   stats)),
                                    ir.Stage((r0,), (ir.Assign("t", reloaded),))), ("a", "out"), ())
    assert _assigned_before(kernel, stats) == {"t": doubled}
