"""CI's share of the op sweep: a fixed representative subset of op_db on fake tensors.

The full sweep is `sym_op_sweep.py` (its committed output is results/op_sweep.md); this runs one or
two ops of each family (pointwise, reductions, views, indexing, matmul, convolution, pooling,
normalization, losses, fft, linalg, factories) plus a few of the expected failures, whose
failing is checked too so the expected-failures file stays true.
"""
import os
import re
import warnings

import pytest

from sym_op_sweep import sweep_op, op_name
from sym_expected_failures import EXPECTED_FAILURES

SUBSET = [
    # pointwise, broadcasting, type promotion
    "add", "mul", "div.floor_rounding", "where", "clamp", "sigmoid", "pow", "nn.functional.gelu",
    # reductions
    "sum", "mean", "amax", "var_mean", "logsumexp", "cumsum", "sort", "topk", "argmax",
    # views and shape ops
    "reshape", "view", "transpose", "permute", "expand", "squeeze", "unsqueeze", "flatten",
    "narrow", "split", "chunk", "unbind", "cat", "stack", "repeat", "roll", "flip", "tril",
    "as_strided", "unfold", "movedim", "contiguous",
    # indexing and scatter
    "index_select", "gather", "scatter_add", "index_put", "masked_fill", "take_along_dim",
    # matmul family
    "matmul", "bmm", "addmm", "baddbmm", "einsum", "nn.functional.linear",
    # convolution, pooling, interpolation, padding
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.interpolate.bilinear",
    "nn.functional.pad.constant",
    # normalization, attention, losses
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "softmax", "nn.functional.scaled_dot_product_attention", "nn.functional.cross_entropy",
    "nn.functional.mse_loss", "nn.functional.embedding", "nn.functional.dropout",
    # fft, linalg, factories, dtype casts
    "fft.rfft", "linalg.vector_norm", "linalg.cholesky", "new_zeros", "full_like", "arange",
    "clone", "double",
    # expected failures (checked to still fail, with their reason on record)
    "select_scatter", "linalg.eig", "index_add",
]


@pytest.fixture(scope="module")
def ops_by_name():
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_name(op): op for op in op_db}


@pytest.mark.parametrize("name", SUBSET)
def test_op_on_fakes_matches_eager(ops_by_name, name):
    if name not in ops_by_name:
        pytest.skip(f"{name} is not in this torch's op_db")
    result = sweep_op(ops_by_name[name])
    if name in EXPECTED_FAILURES:
        assert result.status == "fail", (
            f"{name} is listed as an expected failure ({EXPECTED_FAILURES[name]}) but now gives "
            f"{result.status}: remove it from sym_expected_failures.py")
        return
    assert result.status == "pass", f"{name}: {result.status}: {result.detail}"


def test_committed_sweep_agrees_with_expected_failures():
    path = os.path.join(os.path.dirname(__file__), "results", "op_sweep.md")
    with open(path) as f:
        text = f.read()
    failing = set(re.findall(r"^\| (\S+) \| fail \|", text, re.M))
    assert failing == set(EXPECTED_FAILURES), (
        f"unlisted failures: {sorted(failing - set(EXPECTED_FAILURES))}; "
        f"listed but passing: {sorted(set(EXPECTED_FAILURES) - failing)}")
    share = re.search(r"dim 0 symbolic: (\d+) / (\d+)", text)
    assert int(share.group(1)) >= 0.95 * int(share.group(2))
