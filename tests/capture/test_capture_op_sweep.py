"""A bounded slice of the capture op sweep (`sweeps/capture_op_sweep.py`, whose full output is
`sweeps/capture_op_sweep.md`): every op in the slice is captured as one graph equal to eager, or kiln
says why it cannot capture it; no wrong answers and no crashes."""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest")   # absent on the GPU machine
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "sweeps"))
import capture_op_sweep as op_sweep  # noqa: E402

# every 16th op: ~40 ops across the alphabet of op_db, a few seconds on one core
SLICE = op_sweep.opinfos()[::16]


@pytest.mark.parametrize("opinfo", SLICE, ids=[op_sweep.op_name(o) for o in SLICE])
def test_op_captures_or_says_why(opinfo):
    result = op_sweep.run_op(opinfo)
    assert result.status != "fail", result.detail
