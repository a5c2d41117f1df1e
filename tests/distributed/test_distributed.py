"""DDP and FSDP2 on the CPU (gloo, 2 processes): compiled training equals eager training.

One spawn of two ranks runs every case of distributed_cases.py (3 optimizer steps each, eager
and compiled from the same weights, each rank its own data); the tests read what each rank saved.
A hang fails the test after `TIMEOUT` seconds instead of stalling CI.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.multiprocessing as mp

import distributed_cases

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

WORLD = 2
TIMEOUT = 300


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    context = mp.start_processes(distributed_cases.run_rank, nprocs=WORLD, join=False, start_method="spawn",
                                 args=(WORLD, str(out / "store"), str(out), list(distributed_cases.CASES)))
    deadline = time.monotonic() + TIMEOUT
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} ranks did not finish within {TIMEOUT} s (a hang?)")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
                p.join(10)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _case(ranks, name):
    results = [r[name] for r in ranks]
    for rank, res in enumerate(results):
        assert "error" not in res, f"rank {rank}:\n{res['error']}"
    return results


def _same_training(res):
    (e_losses, e_grads), (c_losses, c_grads) = res["eager"], res["compiled"]
    torch.testing.assert_close(torch.tensor(c_losses), torch.tensor(e_losses), rtol=1e-4, atol=1e-5)
    for step, (eg, cg) in enumerate(zip(e_grads, c_grads)):
        for i, (a, b) in enumerate(zip(eg, cg)):
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5, msg=lambda m: f"step {step}, parameter {i}: {m}")


def _overlaps(events: list[str]) -> bool:
    """Whether some bucket's all-reduce started before the backward's last compiled piece ran."""
    last_piece = max(i for i, e in enumerate(events) if e == "backward")
    return "allreduce" in events[:last_piece]


@pytest.mark.parametrize("case", ["ddp_gpt2_outer", "ddp_resnet_inner", "ddp_mlp_kiln"])
def test_ddp_trains_as_eager_with_graphs_at_buckets(ranks, case):
    results = _case(ranks, case)
    for res in results:
        _same_training(res)
        assert res["graphs"] >= 3, f"the graph was not cut at DDP's buckets ({res['graphs']} graphs)"
        assert _overlaps(res["events"]), f"no all-reduce started during the backward: {res['events']}"
    # every rank ends with the same gradients: DDP averaged them
    for a, b in zip(results[0]["compiled"][1][-1], results[1]["compiled"][1][-1]):
        torch.testing.assert_close(a, b)


def test_ddp_one_graph_when_asked(ranks):
    for res in _case(ranks, "ddp_gpt2_one_graph"):
        _same_training(res)
        assert res["graphs"] == 1
        assert not _overlaps(res["events"]), res["events"]


@pytest.mark.parametrize("case", ["fsdp_gpt2", "fsdp_resnet"])
def test_fsdp2_trains_as_eager_with_blocks_compiled(ranks, case):
    for res in _case(ranks, case):
        _same_training(res)
        # each block's forward is a graph of its own between FSDP2's hooks; a root that calls the blocks
        # in a loop breaks there at each, so it runs as Python ([Note: a graph break in a loop])
        assert res["graphs"] >= res["blocks"], res


def test_explain_reports_the_split(ranks):
    for res in _case(ranks, "explain"):
        split, = res["splits"]
        assert len(split.pieces) >= 3 and res["graphs"] == 1, res["text"]
        assert all(p.nbytes >= split.bucket_bytes for p in split.pieces[1:-1]), res["text"]  # each piece fills a bucket
        assert "split for DDP into" in res["text"] and "piece 0:" in res["text"]
        assert res["inference_splits"] == 0      # no backward, no buckets to overlap


def test_rank_dependent_guards_reported_and_recompile_names_the_rank(ranks):
    results = _case(ranks, "ranks")
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["out"], res["expected"])
        assert res["rank_guards"] == [f"torch.distributed.get_rank() == {rank} (rank-dependent: each rank "
                                      "compiles its own graph)"], res["text"]
    assert any("rank 1 recompiles" in w for w in results[1]["warnings"]), results[1]["warnings"]
    assert not any("recompiles" in w for w in results[0]["warnings"]), results[0]["warnings"]
