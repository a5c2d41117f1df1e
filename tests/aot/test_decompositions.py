"""Decompositions apply below autograd: the backward is traced on ATen ops, then decomposed."""
import math

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
