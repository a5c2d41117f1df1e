"""Decompositions of ATen ops that only CUDA (or ROCm) programs dispatch, found by reading which
CompositeImplicit ops and autograd formulas branch on the device: cuDNN's and MIOpen's batch norm
(at::batch_norm on CUDA), _fused_rms_norm and its backward (F.rms_norm on CUDA), and _softmax /
_log_softmax with half_to_float (softmax(x_fp16, dtype=float32) on CUDA). Their kernels do not run on
this CPU-only CI, so each decomposition runs on CPU tensors against native_batch_norm(_backward), the
CPU forward kernel or float64 autograd. For batch norm, cuDNN's conventions (see [Note: cuDNN and
MIOpen batch norm]): saved mean and inverse std in the weight's dtype (empty in eval), running
buffers updated in place, an empty uint8 reserve, and a backward taking input before grad_output
that always trains. The tests marked `cuda` run on a CUDA machine only: the decomposition against
the real cuDNN kernels, and the attention externs' meta rules against the CUDA kernels."""
import pytest
import torch

from kiln.prims import DECOMPOSITIONS, PrimEvaluator

aten = torch.ops.aten


def _inputs(dtype, channels_last):
    torch.manual_seed(0)
    x = (torch.randn(4, 3, 5, 6) * 2 + 1).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    weight, bias = torch.rand(3) + 0.5, torch.randn(3)
    running_mean, running_var = torch.randn(3), torch.rand(3) + 0.5
    return x, weight, bias, running_mean, running_var


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", ["cudnn", "miopen"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype,channels_last", [(torch.float32, False), (torch.float32, True),
                                                 (torch.bfloat16, False), (torch.float16, True)])
def test_batch_norm_forward_matches_native(op, training, dtype, channels_last):
    x, weight, bias, rm, rv = _inputs(dtype, channels_last)
    ref_rm, ref_rv = rm.clone(), rv.clone()
    # eager's native kernel wants the input's dtype for the statistics: compute it in float32
    out, save_mean, save_invstd = aten.native_batch_norm(x.float(), weight, bias, ref_rm, ref_rv, training, 0.1, 1e-5)
    with PrimEvaluator(strict=True):
        got = DECOMPOSITIONS[getattr(aten, f"{op}_batch_norm").default](x, weight, bias, rm, rv, training, 0.1, 1e-5)
    assert len(got) == (4 if op == "cudnn" else 3)
    torch.testing.assert_close(got[0], out.to(dtype), **_tol(dtype))
    assert got[0].dtype == dtype
    torch.testing.assert_close((rm, rv), (ref_rm, ref_rv))   # running buffers written in place, as cuDNN does
    if training:
        torch.testing.assert_close(got[1], save_mean, **_tol(dtype))
        torch.testing.assert_close(got[2], save_invstd, **_tol(dtype))   # the inverse std, not the variance
    else:
        assert got[1].shape == got[2].shape == (0,)
    assert got[1].dtype == got[2].dtype == weight.dtype
    if op == "cudnn":
        assert got[3].dtype == torch.uint8 and got[3].shape == (0,)


@pytest.mark.parametrize("op", ["cudnn", "miopen"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_backward_matches_native(op, dtype):
    x, weight, _, rm, rv = _inputs(dtype, False)
    grad = torch.randn(x.shape).to(dtype)
    _, save_mean, save_invstd = aten.native_batch_norm(x.float(), weight, None, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    expected = aten.native_batch_norm_backward(grad.float(), x.float(), weight, rm, rv, save_mean, save_invstd, True,
                                               1e-5, [True, True, True])
    args = (x, grad, weight, rm, rv, save_mean, save_invstd, 1e-5)
    if op == "cudnn":
        args += (torch.empty(0, dtype=torch.uint8),)
    with PrimEvaluator(strict=True):
        got = DECOMPOSITIONS[getattr(aten, f"{op}_batch_norm_backward").default](*args)
    torch.testing.assert_close(got[0], expected[0].to(dtype), **_tol(dtype))
    torch.testing.assert_close(got[1:], expected[1:], **_tol(dtype))
    assert got[0].dtype == dtype and got[1].dtype == got[2].dtype == torch.float32


def test_cudnn_batch_norm_autograd_formula_round_trip():
    # what autograd does on CUDA (derivatives.yaml): the forward's saved mean and inverse std and its
    # reserve feed cudnn_batch_norm_backward; decomposed end to end, the gradients are eager's
    x, weight, bias, rm, rv = _inputs(torch.float32, False)
    x64 = x.double().requires_grad_()
    w64, b64 = weight.double().requires_grad_(), bias.double().requires_grad_()
    out64 = torch.nn.functional.batch_norm(x64, rm.double(), rv.double(), w64, b64, True, 0.1, 1e-5)
    grad = torch.randn(x.shape)
    expected = torch.autograd.grad(out64, [x64, w64, b64], grad.double())
    with PrimEvaluator(strict=True):
        out, mean, invstd, reserve = DECOMPOSITIONS[aten.cudnn_batch_norm.default](x, weight, bias, rm, rv, True,
                                                                                  0.1, 1e-5)
        got = DECOMPOSITIONS[aten.cudnn_batch_norm_backward.default](x, grad, weight, rm, rv, mean, invstd, 1e-5,
                                                                     reserve)
    torch.testing.assert_close(out, out64.float().detach(), rtol=1e-5, atol=1e-5)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e.float(), rtol=1e-4, atol=1e-4)


# ---- on a CUDA machine only (skipped in CPU CI): the real cuDNN kernels and the attention externs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_cudnn_batch_norm_decomposition_matches_cudnn(training):
    x, weight, bias, rm, rv = (t.cuda() for t in _inputs(torch.float32, False))
    rm2, rv2 = rm.clone(), rv.clone()
    real = aten.cudnn_batch_norm(x, weight, bias, rm, rv, training, 0.1, 1e-5)
    got = DECOMPOSITIONS[aten.cudnn_batch_norm.default](x, weight, bias, rm2, rv2, training, 0.1, 1e-5)
    for g, r in zip(got[:3], real[:3]):
        assert g.shape == r.shape and g.dtype == r.dtype and g.device == r.device
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close((rm2, rv2), (rm, rv))
    assert got[3].dtype == real[3].dtype == torch.uint8
    if training:
        grad = torch.randn_like(x)
        real_back = aten.cudnn_batch_norm_backward(x, grad, weight, rm, rv, real[1], real[2], 1e-5, real[3])
        got_back = DECOMPOSITIONS[aten.cudnn_batch_norm_backward.default](x, grad, weight, rm, rv, got[1], got[2],
                                                                          1e-5, got[3])
        torch.testing.assert_close(got_back, real_back, rtol=1e-4, atol=1e-4)


def _attention_calls():
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return {
        "flash": (aten._scaled_dot_product_flash_attention.default, (q, k, v, 0.0, True)),
        "efficient": (aten._scaled_dot_product_efficient_attention.default, (q, k, v, None, True, 0.0, True)),
        "cudnn": (aten._scaled_dot_product_cudnn_attention.default, (q, k, v, None, True, 0.0, True)),
    }


def _strides(t):
    return [st for n, st in zip(t.shape, t.stride()) if n > 1]   # a size-1 dim's stride is arbitrary


@cuda
@pytest.mark.parametrize("kind", ["flash", "efficient", "cudnn"])
def test_attention_extern_meta_rule_matches_the_cuda_kernel(kind):
    # aot traces on kiln's fakes, so what a backend allocates for an extern's outputs comes from its meta
    # rule: sizes, strides, dtype and device must be what the CUDA kernel returns
    from kiln.prims.externs import EXTERN_OF_ATEN
    from kiln.symbolic import FakeTensorMode
    op, args = _attention_calls()[kind]
    try:
        real = op(*args)
    except RuntimeError as e:
        pytest.skip(f"{kind} attention does not run here: {str(e).splitlines()[0]}")
    mode = FakeTensorMode()
    fake_args = [mode.from_real(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        fake = EXTERN_OF_ATEN[op](*fake_args)
    assert len(fake) == len(real)
    for i, (f, r) in enumerate(zip(fake, real)):
        if isinstance(r, torch.Tensor):
            assert isinstance(f, torch.Tensor), f"output {i}: meta gives {f!r}, CUDA a tensor"
            assert (tuple(f.shape), f.dtype, f.device) == (tuple(r.shape), r.dtype, r.device), f"output {i}"
            assert _strides(f) == _strides(r), f"output {i}: meta strides {f.stride()}, CUDA {r.stride()}"
        else:
            assert type(f) is type(r) and f == r, f"output {i}: meta gives {f!r}, CUDA {r!r}"


@pytest.mark.skipif(not hasattr(aten, "_fused_rms_norm_backward"), reason="torch without _fused_rms_norm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_weight,eps", [(True, 1e-6), (False, None)])
def test_fused_rms_norm_matches_eager(dtype, with_weight, eps):
    # F.rms_norm reaches _fused_rms_norm on CUDA; its forward kernel also runs on CPU, its backward
    # (CUDA only) is checked against float64 autograd of the composite rms_norm
    torch.manual_seed(0)
    # small values when eps is None: the computation dtype's epsilon then shows (bfloat16's would not pass)
    x = (torch.randn(2, 3, 8) * (1e-2 if eps is None else 1)).to(dtype)
    weight = (torch.rand(8) + 0.5).to(dtype) if with_weight else None
    out, rstd = aten._fused_rms_norm(x, [8], weight, eps)
    with PrimEvaluator(strict=True):
        got_out, got_rstd = DECOMPOSITIONS[aten._fused_rms_norm.default](x, [8], weight, eps)
    torch.testing.assert_close((got_out, got_rstd), (out, rstd), **_tol(dtype))
    assert got_rstd.shape == rstd.shape == (2, 3, 1) and got_rstd.dtype == rstd.dtype

    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if with_weight else None
    eps64 = torch.finfo(torch.float32).eps if eps is None else eps   # the computation dtype's epsilon
    grad = torch.randn(x.shape).to(dtype)
    ref = torch.nn.functional.rms_norm(x64, [8], w64, eps64)
    expected = torch.autograd.grad(ref, [x64] + ([w64] if with_weight else []), grad.double())
    with PrimEvaluator(strict=True):
        got = DECOMPOSITIONS[aten._fused_rms_norm_backward.default](grad, x, [8], rstd, weight, [True, True])
    torch.testing.assert_close(got[0], expected[0].to(dtype), **_tol(dtype))
    if with_weight:
        torch.testing.assert_close(got[1], expected[1].to(dtype), **_tol(dtype))
    else:
        assert got[1] is None


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_half_to_float_softmax_matches_eager(log):
    # softmax(x, dtype=float32) of a float16 CUDA tensor (LLaMA's eager attention under fp16) calls
    # _softmax(x, dim, half_to_float=True), which has no CPU kernel; its backward gets input_dtype=half
    torch.manual_seed(0)
    x = (torch.randn(3, 7) * 4).half()
    x64 = x.double().requires_grad_()
    ref = torch.log_softmax(x64, -1) if log else torch.softmax(x64, -1)
    grad = torch.randn(3, 7)
    expected_grad = torch.autograd.grad(ref, x64, grad.double())[0]
    forward = aten._log_softmax.default if log else aten._softmax.default
    backward = aten._log_softmax_backward_data.default if log else aten._softmax_backward_data.default
    with PrimEvaluator(strict=True):
        out = DECOMPOSITIONS[forward](x, -1, True)
        got_grad = DECOMPOSITIONS[backward](grad, out, -1, torch.float16)
    assert out.dtype == torch.float32 and got_grad.dtype == torch.float16
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, expected_grad.half(), rtol=2e-3, atol=2e-3)
