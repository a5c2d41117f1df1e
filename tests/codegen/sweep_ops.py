"""The op sweep through the whole kiln backend (capture -> aot -> prims -> C++ kernels), forward.

For each OpInfo in torch's `op_db` (float32 on CPU), its first sample input is run eagerly and
through `kiln.compile(fn, backend="kiln")`, and compared by `torch.testing.assert_close` with the
op's default float32 tolerances (loosened to 1e-4 / 1e-5: kernels sum in another order).
Run as a script for the full sweep (writes tests/codegen/results/op_sweep.md):

    OMP_NUM_THREADS=1 python tests/codegen/sweep_ops.py [--limit N] [--ops a,b,c]

`test_sweep_subset.py` runs a fixed, representative subset in CI.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback

import torch


def _sample(op):
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    return next(iter(samples))


# Ops whose result is uninitialized memory: nothing to compare.
UNINITIALIZED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}


def run_op(op, backend_context=contextlib.nullcontext) -> tuple[str, str]:
    """('pass' | 'fail' | 'skip', detail) for one OpInfo; the compiled call runs inside
    `backend_context()` (the Triton sweep swaps the printer there)."""
    import kiln
    if op.name in UNINITIALIZED:
        return "skip", "result is uninitialized memory"
    try:
        sample = _sample(op)
    except (StopIteration, Exception) as e:
        return "skip", f"no float32 sample ({type(e).__name__})"
    args = (sample.input, *sample.args)
    kwargs = dict(sample.kwargs)
    fn = op.op

    def f(*a):
        return fn(*a, **kwargs)
    try:
        expected = f(*args)
    except Exception as e:
        return "skip", f"eager raised {type(e).__name__}"
    kiln.reset()
    try:
        with backend_context():
            got = kiln.compile(f, backend="kiln")(*args)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True, check_dtype=True,
                                   check_stride=False)
        return "pass", ""
    except Exception as e:
        return "fail", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def main(argv=None) -> int:
    from torch.testing._internal.common_methods_invocations import op_db
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--ops", default=None)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "op_sweep.md"))
    ns = parser.parse_args(argv)
    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if ns.ops:
        wanted = set(ns.ops.split(","))
        ops = [o for o in ops if o.name in wanted]
    if ns.limit:
        ops = ops[:ns.limit]
    rows, counts = [], {"pass": 0, "fail": 0, "skip": 0}
    start = time.time()
    for op in ops:
        status, detail = run_op(op)
        counts[status] += 1
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        rows.append(f"| {name} | {status} | {detail.replace('|', '/')} |")
        print(f"{name:40s} {status} {detail}", flush=True)
    tested = counts["pass"] + counts["fail"]
    rate = counts["pass"] / max(tested, 1)
    with open(ns.out, "w") as f:
        f.write("# Op sweep through the kiln backend (C++), forward, float32, first sample\n\n")
        f.write(f"Command: `OMP_NUM_THREADS=1 python tests/codegen/sweep_ops.py`  ({time.time() - start:.0f} s)\n\n")
        f.write(f"pass {counts['pass']}, fail {counts['fail']}, skipped (no sample / eager raised) {counts['skip']}; "
                f"pass rate over tested ops: {rate:.1%}\n\n| op | status | detail |\n|---|---|---|\n")
        f.write("\n".join(rows) + "\n")
    print(f"pass rate {rate:.1%} ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
