"""The torch functions aot traces through kiln's own rules (kiln/aot/rules.py, `_traced_rules`)."""
import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.capture
from kiln.aot import trace
from kiln.config import CaptureConfig
from kiln.prims.ops import ops as p


class ConvNextBlock(torch.nn.Module):
    """convnext's block: depthwise conv, permute to channels-last, layer norm, MLP, permute back."""

    def __init__(self, dim=8):
        super().__init__()
        self.dw = torch.nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


def _captured(model, x):
    graphs = []
    captured = kiln.capture.capture(model, lambda gm, ex: graphs.append(gm) or gm.forward, CaptureConfig())
    captured(x)
    (gm,) = graphs
    return gm, [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]


def test_a_linear_over_a_permuted_input_is_one_matrix_product_with_its_bias():
    """[Note: linear over rows]: both linears of the block are addmm (the first read its input
    through a permute, which ATen's matmul turns into a batched product when it cannot view it)."""
    torch.manual_seed(0)
    gm, examples = _captured(ConvNextBlock().eval(), torch.randn(2, 8, 6, 6))
    before = gm.code
    with torch.no_grad():
        joint = trace.trace_joint(gm, examples, decompositions=kiln.prims.decompositions_for(set()))
    targets = [n.target for n in joint.gm.graph.nodes if n.op == "call_function"]
    assert targets.count(p.addmm) == 2 and p.bmm not in targets, [t for t in targets if "mm" in str(t)]
    assert gm.code == before      # the user's graph is restored


@pytest.mark.parametrize("shape", [(2, 8, 6, 6), (3, 8, 5, 7)])
def test_the_block_trains_equal_to_eager(shape):
    kiln.reset()
    torch.manual_seed(0)
    model, reference = ConvNextBlock(), ConvNextBlock()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(*shape)
    got = kiln.compile(model)(x)
    want = reference(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.square().sum().backward()
    want.square().sum().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


def test_numerics_eager_keeps_atens_linear():
    """Under numerics="eager" the rule is off: ATen's own decision (here not a single addmm)."""
    torch.manual_seed(0)
    gm, examples = _captured(ConvNextBlock().eval(), torch.randn(2, 8, 6, 6))
    with torch.no_grad():
        fast = trace.trace_joint(gm, examples, decompositions=kiln.prims.decompositions_for(set()))
        eager = trace.trace_joint(gm, examples, decompositions=kiln.prims.decompositions_for(set(), "eager"),
                                  numerics="eager")
    count = [[n.target for n in j.gm.graph.nodes].count(p.addmm) for j in (fast, eager)]
    assert count[0] == 2 and count[1] < 2, count
