"""A bounded, representative part of the OpInfo sweep through aot_eager (every 10th autograd op,
plus the expected failures to keep their list honest). The full sweep is
tests/aot/sweeps/op_sweep.py; its last output is tests/aot/sweeps/op_sweep.md."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "sweeps"))
from op_sweep import autograd_ops, check_op, op_name  # noqa: E402

from expected_failures import EXPECTED_FAILURES  # noqa: E402

_OPS = autograd_ops()
_SUBSET = [o for i, o in enumerate(_OPS) if i % 10 == 0 or op_name(o) in EXPECTED_FAILURES]


@pytest.mark.parametrize("opinfo", _SUBSET, ids=op_name)
def test_op_matches_eager(opinfo):
    result = check_op(opinfo)
    if result.name in EXPECTED_FAILURES:
        assert result.status == "fail", f"{result.name} passes now: remove it from expected_failures.py"
        pytest.xfail(EXPECTED_FAILURES[result.name])
    if result.status == "skip":
        pytest.skip(result.detail)
    assert result.status == "pass", f"{result.name}: {result.detail}"
