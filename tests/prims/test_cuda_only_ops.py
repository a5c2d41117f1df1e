"""Decompositions of ATen ops that only CUDA (or ROCm) programs dispatch: cuDNN's and MIOpen's
batch norm. Their kernels cannot run on this CPU-only CI, so each decomposition is run on CPU tensors
and compared with what native_batch_norm / native_batch_norm_backward compute for the same inputs,
translated into cuDNN's conventions (see [Note: cuDNN and MIOpen batch norm]): saved mean and
inverse std in the weight's dtype (empty in eval), running buffers updated in place, an empty uint8
reserve, and a backward taking input before grad_output that always trains."""
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
