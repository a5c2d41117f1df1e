"""Decompositions apply below autograd: the backward is traced on ATen ops, then decomposed."""
import copy
import math
import operator

import pytest
import torch
import torch.nn.functional as F

from kiln.aot import aot_compile, functionalize, trace_joint

aten = torch.ops.aten


def _gelu(x, approximate="none"):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _gelu_backward(grad, x, approximate="none"):
    cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return grad * (cdf + x * pdf)


def _program(x, w):
    return F.gelu(x @ w).sum()


def _targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def test_table_ops_leave_the_graph_and_results_stay():
    table = {aten.gelu.default: _gelu, aten.gelu_backward.default: _gelu_backward}
    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    gm = torch.fx.symbolic_trace(_program)
    joint = functionalize(trace_joint(gm, [x, w], decompositions=table))
    targets = _targets(joint.gm)
    assert aten.gelu.default not in targets and aten.gelu_backward.default not in targets
    assert aten.erf.default in targets and aten.mm.default in targets   # mm is not in the table

    compiled = aot_compile(gm, [x, w], fw_compiler=lambda g, _: g.forward, bw_compiler=lambda g, _: g.forward,
                           decompositions=table)
    expected = _program(x, w)
    ex, ew = torch.autograd.grad(expected, [x, w])
    got = compiled(x, w)
    gx, gw = torch.autograd.grad(got, [x, w])
    torch.testing.assert_close((got, gx, gw), (expected, ex, ew))


def _erf(x):
    return 2 * torch.special.ndtr(x * math.sqrt(2.0)) - 1


def test_decomposition_is_applied_recursively():
    # gelu -> _gelu, which calls erf, itself in the table -> _erf (over special_ndtr)
    table = {aten.gelu.default: _gelu, aten.erf.default: _erf}
    x = torch.randn(6)
    joint = functionalize(trace_joint(torch.fx.symbolic_trace(lambda t: F.gelu(t)), [x], decompositions=table))
    targets = _targets(joint.gm)
    assert aten.erf.default not in targets and aten.gelu.default not in targets
    assert aten.special_ndtr.default in targets
    torch.testing.assert_close(joint.gm(x)[0], F.gelu(x))


def test_prims_table_on_a_small_mlp():
    prims = pytest.importorskip("kiln.prims")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    gm = torch.fx.symbolic_trace(model)
    table = prims.decompositions_for(())
    joint = functionalize(trace_joint(gm, [x], decompositions=table))
    leftover = {t for t in _targets(joint.gm)
                if isinstance(t, torch._ops.OpOverload) and t in prims.DECOMPOSITIONS}
    assert not leftover, f"ops in the table survived tracing: {leftover}"
    compiled = aot_compile(gm, [x], fw_compiler=lambda g, _: g.forward, bw_compiler=lambda g, _: g.forward,
                           decompositions=table)
    expected = model(x).sum()
    expected.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = compiled(x).sum()
    got.backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close([p.grad for p in model.parameters()], want, rtol=1e-4, atol=1e-5)


class _CudnnBatchNorm(torch.nn.Module):
    """A BatchNorm2d that calls what at::batch_norm calls on CUDA: cudnn_batch_norm, whose autograd
    formula calls cudnn_batch_norm_backward. Neither has a CPU kernel: traced with kiln's
    decompositions, neither kernel ever runs, so the CUDA program's graph is testable on a CPU."""

    def __init__(self, channels):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        bn = self.bn
        return aten.cudnn_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, True, bn.momentum,
                                     bn.eps)[0].relu()


def test_cudnn_batch_norm_program_trains_as_eager_batch_norm():
    from kiln.prims import DECOMPOSITIONS, is_prim
    torch.manual_seed(0)
    model = _CudnnBatchNorm(3)
    with torch.no_grad():
        model.bn.weight.uniform_(0.5, 1.5), model.bn.bias.normal_()
    reference = torch.nn.Sequential(copy.deepcopy(model.bn), torch.nn.ReLU())
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    graphs = []

    def keep(g, _):
        graphs.append(g)
        return g.forward
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled = aot_compile(model, [x.clone().requires_grad_()], fw_compiler=keep, bw_compiler=keep,
                           decompositions=DECOMPOSITIONS)
    out = compiled(x1)
    out.square().sum().backward()
    expected = reference(x2)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close((model.bn.weight.grad, model.bn.bias.grad), (reference[0].weight.grad,
                                                                             reference[0].bias.grad), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close((model.bn.running_mean, model.bn.running_var),
                               (reference[0].running_mean, reference[0].running_var))
    assert len(graphs) == 2
    for g in graphs:   # forward and backward: prims only, no cuDNN op left
        left = {str(n.target) for n in g.graph.nodes if n.op == "call_function" and not is_prim(n.target)
                and n.target is not operator.getitem}
        assert not left, left
