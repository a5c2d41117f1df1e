"""A representative slice of the op sweep (kiln/prims/sweep.py) in CI: each family of
decompositions (elementwise, promotion, reductions, views, indexing, creation, nn, losses, pooling,
resampling, externs) is exercised forward in every supported dtype and backward in float32.
The full sweep runs as `python -m kiln.prims.sweep`; its results are committed next to this file."""
import pytest
import torch

from kiln.prims.sweep import check_backward, check_forward, selected_ops, op_name, DTYPES
from kiln.prims.expected_failures import EXPECTED_FAILURES

CI_OPS = [
    # elementwise and type promotion
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "floor_divide", "remainder", "pow",
    "atan2", "exp", "log1p", "sigmoid", "tanh", "erf", "sqrt", "rsqrt", "abs", "sign", "clamp", "where",
    "maximum", "eq", "lt", "logical_and", "bitwise_xor", "nan_to_num", "lerp", "addcmul", "xlogy", "float_power",
    "special.i0e", "lgamma", "round", "true_divide", "copysign", "hypot",
    # reductions and scans
    "sum", "mean", "var", "std_mean", "amax", "argmax", "max.reduction_with_dim", "prod", "any", "all",
    "logsumexp", "linalg.vector_norm", "cumsum", "cummax", "logcumsumexp", "median", "count_nonzero",
    # views and movement
    "view", "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "select", "narrow",
    "diagonal", "as_strided", "unfold", "split", "chunk", "cat", "stack", "flip", "roll", "rot90", "repeat",
    "tril", "triu", "diag_embed", "nn.functional.pad.constant", "nn.functional.pad.reflect",
    "slice_scatter", "select_scatter", "diagonal_scatter", "contiguous", "clone",
    # indexing
    "index_select", "gather", "scatter", "scatter_add", "scatter_reduce.amax", "index_put", "index_add",
    "index_copy", "index_fill", "masked_fill", "masked_scatter", "take", "take_along_dim", "__getitem__",
    # creation
    "arange", "linspace", "eye", "full", "zeros_like", "new_ones", "empty_like",
    # nn
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.hardswish", "nn.functional.hardsigmoid",
    "nn.functional.relu", "nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.mish",
    "nn.functional.softplus", "softmax", "log_softmax", "nn.functional.layer_norm",
    "nn.functional.batch_norm", "nn.functional.group_norm", "nn.functional.embedding", "nn.functional.linear",
    "nn.functional.dropout", "nn.functional.glu",
    # losses
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.smooth_l1_loss",
    # pooling and resampling
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.interpolate.bilinear", "nn.functional.interpolate.nearest", "nn.functional.unfold",
    # externs and matmul epilogues
    "mm", "bmm", "addmm", "baddbmm", "matmul", "nn.functional.conv2d",
    "nn.functional.scaled_dot_product_attention", "sort", "topk", "linalg.solve", "fft.rfft",
]

_BY_NAME = {op_name(o): o for o in selected_ops()}


def _case(name, phase):
    reason = EXPECTED_FAILURES.get(name, {}).get(phase)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(name, marks=marks, id=name)


def test_ci_ops_exist():
    missing = [n for n in CI_OPS if n not in _BY_NAME]
    assert not missing, f"not OpInfo names in this torch: {missing}"


@pytest.mark.parametrize("name", [_case(n, "forward") for n in CI_OPS])
def test_forward_matches_eager(name):
    opinfo = _BY_NAME[name]
    failures = [f"{dtype}: {reason}" for dtype in DTYPES if opinfo.supports_dtype(dtype, "cpu")
                for reason in [check_forward(opinfo, dtype)] if reason is not None]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", [_case(n, "backward") for n in CI_OPS
                                  if _BY_NAME.get(n) is not None and _BY_NAME[n].supports_autograd])
def test_backward_matches_eager(name):
    reason = check_backward(_BY_NAME[name])
    assert reason in (None, "skip"), reason
