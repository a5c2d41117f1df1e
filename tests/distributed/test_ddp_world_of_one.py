"""DDP in a group of one process: nothing to overlap, so the graph is not split at the buckets
(`_alone` in kiln/capture/buckets.py), and compiled training equals eager DDP's."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from kiln import backends

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])


def test_a_group_of_one_keeps_one_graph_and_trains_as_eager(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        compiled_model, eager_model = _model(), _model()
        graphs = []
        fast = kiln.compile(DDP(compiled_model, bucket_cap_mb=0.01),    # buckets of ~2 layers: a split would cut
                            backend=lambda gm, ex: graphs.append(gm) or backends.kiln(gm, ex))
        eager = DDP(eager_model, bucket_cap_mb=0.01)
        for step in range(3):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))
            for m in (fast, eager):
                m(x).square().mean().backward()
            for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
                a.grad = b.grad = None
        assert len(graphs) == 1
        report = kiln.explain(fast, torch.randn(8, 64))
        assert "split for DDP" not in str(report)
    finally:
        dist.destroy_process_group()
