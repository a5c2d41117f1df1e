"""A representative slice of the op sweep (tests/codegen/sweep_ops.py) in CI: each op through the
whole kiln backend, forward, against eager. The full sweep's output is results/op_sweep.md."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sweep_ops import run_op  # noqa: E402

# (`where` and `index_select` fail today in capture, not codegen: their OpInfo lambdas read module
#  globals that the capture stage resolves in the wrong module; see results/op_sweep.md)
SUBSET = ["add", "mul", "sigmoid", "softmax", "sum", "amax", "cumsum", "nn.functional.layer_norm", "exp",
          "maximum"]


@pytest.mark.parametrize("name", SUBSET)
def test_op_matches_eager(name):
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == name and not o.variant_test_name)
    status, detail = run_op(op)
    assert status == "pass", detail
