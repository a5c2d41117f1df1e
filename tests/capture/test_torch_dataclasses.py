"""torch's own dataclasses built inside captured code: `F.linear_cross_entropy`'s chunked path
builds its frozen, slotted `LinearCrossEntropyOptions` through `dataclasses.replace`, which was
refused ("constructing a LinearCrossEntropyOptions inside captured code is not supported")."""
import pytest
import torch
import torch.nn.functional as F

import kiln

options_type = pytest.importorskip("torch.nn.modules.linear_cross_entropy_options").LinearCrossEntropyOptions


def test_linear_cross_entropy_with_options_is_one_graph_and_equals_eager():
    def fn(x, w, target):
        return F.linear_cross_entropy(x, w, target, options=options_type(batch_chunk_size=4))
    torch.manual_seed(0)
    x, w, target = torch.randn(10, 8), torch.randn(12, 8), torch.randint(0, 12, (10,))
    ours, theirs = (x.clone().requires_grad_(), w.clone().requires_grad_()), (x.clone().requires_grad_(), w.clone().requires_grad_())
    got = kiln.compile(fn, fullgraph=True)(*ours, target)
    want = fn(*theirs, target)
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)
