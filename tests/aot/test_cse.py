"""[Note: common subexpressions] in kiln/aot/cse.py: an op computed twice on the same arguments is
computed once, forward and backward; constants that compare equal but differ (0.0 and -0.0, 1 and
1.0) and random draws stay apart; results equal eager's."""
import torch
import torch.fx as fx

import kiln
from kiln.aot.cse import eliminate_common_subexpressions

aten = torch.ops.aten


def _graph(fn, *shapes):
    gm = fx.symbolic_trace(fn)
    return gm


def test_a_repeated_op_is_computed_once():
    def twice(x):
        return aten.sin.default(x) + aten.sin.default(x)
    gm = _graph(twice)
    assert eliminate_common_subexpressions(gm.graph) == 1
    gm.recompile()
    x = torch.randn(5)
    torch.testing.assert_close(gm(x), twice(x))
    assert sum(n.target is aten.sin.default for n in gm.graph.nodes) == 1


def test_constants_equal_under_python_but_not_as_ops_stay_apart():
    def fills(x):
        a = aten.full.default([3], 0.0)
        b = aten.full.default([3], -0.0)
        c = aten.full.default([3], 1)
        d = aten.full.default([3], 1.0)
        e = aten.full.default([3], True)
        return x / a, x / b, c, d, e
    gm = _graph(fills)
    assert eliminate_common_subexpressions(gm.graph) == 0
    gm.recompile()
    x = torch.ones(3)
    got, expected = gm(x), fills(x)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and torch.equal(g, e)
    assert torch.equal(got[1], torch.full((3,), float("-inf")))


def test_writes_and_random_draws_are_not_merged():
    def effects(x):
        noise_a, noise_b = aten.rand_like.default(x), aten.rand_like.default(x)
        y = aten.add_.Tensor(x, 1)
        z = aten.add_.Tensor(x, 1)
        return noise_a, noise_b, y, z
    gm = _graph(effects)
    assert eliminate_common_subexpressions(gm.graph) == 0


def test_compiled_training_with_repeated_subexpressions_equals_eager():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8) / 3)

        def forward(self, x):
            h = torch.tanh(x @ self.w)
            gate = torch.tanh(x @ self.w) > 0          # the same value, compared: one node decides it
            return (h * gate).sum() + torch.sigmoid(x @ self.w).mean()

    torch.manual_seed(0)
    eager, compiled_model = Twice(), Twice()
    compiled_model.load_state_dict(eager.state_dict())
    x = torch.randn(4, 8)
    kiln.reset()
    compiled = kiln.compile(compiled_model)
    eager(x).backward()
    compiled(x).backward()
    torch.testing.assert_close(compiled_model.w.grad, eager.w.grad)


def test_dropout_masks_stay_distinct_under_compile():
    def two_masks(x):
        return torch.nn.functional.dropout(x, 0.5, True), torch.nn.functional.dropout(x, 0.5, True)
    kiln.reset()
    a, b = kiln.compile(two_masks)(torch.ones(4096))
    assert not torch.equal(a, b)
