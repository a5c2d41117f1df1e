"""torch.distributed queries in traced code without a process group (kiln/capture/distributed.py);
with one, on 2 ranks: tests/distributed/."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import kiln

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def rank_or_minus_one(x):
    try:
        r = dist.get_rank()
    except ValueError:       # no default process group
        r = -1
    return x + r + dist.get_world_size() if dist.is_initialized() else x + r


def test_a_query_that_raises_raises_in_the_program_and_is_guarded():
    assert not dist.is_initialized()
    x = torch.zeros(2)
    torch.testing.assert_close(kiln.compile(rank_or_minus_one, backend="eager")(x), rank_or_minus_one(x))
    report = kiln.explain(rank_or_minus_one, x)
    assert "torch.distributed.is_initialized() == False" in report.guards
    assert report.rank_guards == [] and report.graph_count == 1


def local_rank_offset(x):
    return x + int(os.environ.get("LOCAL_RANK", "0")) + int(os.environ.get("KILN_TEST_FLAG", "0"))


def test_environment_reads_are_guarded_and_ranks_reported(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv("KILN_TEST_FLAG", raising=False)
    compiled = kiln.compile(local_rank_offset, backend="eager")
    x = torch.zeros(1)
    assert compiled(x).item() == 3
    monkeypatch.setenv("KILN_TEST_FLAG", "2")        # absent at the first call: guarded as absent
    assert compiled(x).item() == 5
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert compiled(x).item() == 3
    report = kiln.explain(local_rank_offset, x)
    assert report.rank_guards == ["globals()['os'].environ._data[b'LOCAL_RANK'] == b'1'"], report.guards
