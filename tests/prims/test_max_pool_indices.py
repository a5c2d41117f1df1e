"""Max pooling with indices, unrolled ([Note: unrolled max pooling]), and its gradient as a gather
([Note: max pooling's gradient as a gather]): eager's values, eager's indices (first element inside
the input, then greater or NaN), eager's gradients; no argmax, no scatter."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.aot import trace
from kiln.prims.ops import ops as p

POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
SHAPES = {1: (2, 3, 11), 2: (2, 3, 9, 10), 3: (1, 2, 5, 6, 7)}
CASES = [(2, 3, 2, 1, False), (2, 2, 2, 0, False), (2, 3, 1, 1, False), (2, 3, 2, 1, True), (2, 3, 2, 0, True),
         (1, 3, 2, 1, False), (3, 2, 2, 0, False), (2, (3, 2), (2, 1), (1, 0), False)]


def _input(k: int, channels_last: bool) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(*SHAPES[k])
    flat = x.view(-1)
    flat[::7] = float("-inf")       # windows of -inf only: the first element inside the input
    flat[5] = float("nan")           # a NaN wins its windows
    flat[10:14] = 1.0                # ties: the first
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x.requires_grad_(True)


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
@pytest.mark.parametrize("k,kernel,stride,padding,ceil_mode", CASES)
def test_max_pool_values_indices_and_gradients_equal_eagers(k, kernel, stride, padding, ceil_mode, channels_last):
    if channels_last and k != 2:
        pytest.skip("channels-last is 2-d")
    x = _input(k, channels_last)

    def pool(t):
        return POOLS[k](t, kernel, stride, padding, ceil_mode=ceil_mode, return_indices=True)
    kiln.reset()
    got, want = kiln.compile(pool)(x), pool(x)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=0, atol=0)
    g = torch.randn_like(want[0])
    got_grad, want_grad = (torch.autograd.grad(out[0], x, g)[0] for out in (got, want))
    torch.testing.assert_close(got_grad, want_grad, equal_nan=True)


def test_the_pool_is_pointwise_forward_and_backward():
    x = torch.randn(2, 4, 12, 12, requires_grad=True)
    graph = torch.fx.symbolic_trace(lambda t: F.max_pool2d(t, 3, 2, 1))
    joint = trace.trace_joint(graph, [x], decompositions=kiln.prims.decompositions_for(set()))
    targets = {n.target for n in joint.gm.graph.nodes if n.op == "call_function"}
    assert not targets & {p.argmax, p.scatter_reduce, p.amax}, targets & {p.argmax, p.scatter_reduce, p.amax}
