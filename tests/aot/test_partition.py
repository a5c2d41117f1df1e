"""Min-cut partition: what the forward saves, what the backward recomputes, and its bytes."""
import os
import sys

import pytest
import torch

from kiln.aot import aot_compile, functionalize, min_cut_partition, save_all_partition, trace_joint

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "sweeps"))
from partition_bytes import measure  # noqa: E402

aten = torch.ops.aten


def _mlp_block(x, w):
    h = x @ w
    return ((h.sin() * 2 + 1).cos() * h).sum()


def _joint(fn, *inputs):
    return functionalize(trace_joint(torch.fx.symbolic_trace(fn), list(inputs)))


def test_matmul_saved_pointwise_recomputed():
    x, w = torch.randn(64, 32), torch.randn(32, 48, requires_grad=True)
    fw_gm, bw_gm, info = min_cut_partition(_joint(_mlp_block, x, w))
    saved_targets = {n.target for n in fw_gm.graph.nodes if n.name in info.saved}
    assert aten.mm.default in saved_targets, "the matmul output must be saved, not recomputed"
    assert saved_targets.isdisjoint({aten.sin.default, aten.mul.Tensor, aten.add.Tensor, aten.cos.default})
    bw_targets = {n.target for n in bw_gm.graph.nodes}
    assert aten.sin.default in bw_targets, "cheap pointwise ops are recomputed in the backward"
    assert info.bytes_saved < info.bytes_save_all
    print(info)


@pytest.mark.parametrize("partition", [min_cut_partition, save_all_partition])
def test_both_partitions_give_eager_gradients(partition):
    x, w = torch.randn(16, 8), torch.randn(8, 12, requires_grad=True)
    compiled = aot_compile(torch.fx.symbolic_trace(_mlp_block), [x, w], fw_compiler=lambda g, _: g.forward,
                           bw_compiler=lambda g, _: g.forward, partition=partition)
    (expected,) = torch.autograd.grad(_mlp_block(x, w), w)
    (got,) = torch.autograd.grad(compiled(x, w), w)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ["mlp", "resnet", "gpt2", "bert", "llama", "vit"])
def test_min_cut_saves_no_more_than_saving_everything(name):
    info = measure(name)
    print(f"{name}: {info}")
    assert info.bytes_saved <= info.bytes_save_all
    if name in ("gpt2", "bert", "llama", "vit"):   # transformers: measurably fewer bytes
        assert info.bytes_saved < 0.9 * info.bytes_save_all
