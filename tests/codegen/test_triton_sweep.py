"""The op sweep with Triton kernels: OpInfo samples through kiln.compile with the Triton printer
(Triton's interpreter on CPU tensors) in place of C++, forward, float32, vs eager.

The kiln backend prints C++ for CPU tensors; here `compile_prim_graph` is swapped for the same
passes with the Triton printer (`triton_prim_compiler`), with no warm-start cache (so a Triton
program never lands where the C++ backend would load it). CI runs `SUBSET`; the full sweep is a
script whose table is committed as kiln/codegen/triton/op_sweep.md:

    OMP_NUM_THREADS=1 python tests/codegen/test_triton_sweep.py [--every N] [--ops a,b]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import pytest
import torch

# Ops whose kernels cover the printer's paths: pointwise math, comparisons, where, casts,
# reductions (sum/amax/argmax/var/prod/any), scans, softmax-likes, indexing.
SUBSET = ["abs", "atan2", "clamp", "div.floor_rounding", "remainder", "sigmoid", "nn.functional.gelu",
          "sum", "amax", "argmax", "var", "prod", "any", "cumsum", "logcumsumexp", "softmax",
          "log_softmax", "nn.functional.layer_norm", "index_select", "std_mean"]


def triton_prim_compiler(gm, example_inputs, **options):
    """`compile_prim_graph` with the Triton printer: lower, schedule, print, host program, link."""
    from kiln.codegen import triton as triton_printer
    from kiln.codegen.compile import compile_prim_graph
    return compile_prim_graph(gm, example_inputs, **{**options, "printer": triton_printer})


@contextlib.contextmanager
def triton_backend():
    import kiln.pipeline as backend
    saved = backend.compile_prim_graph
    backend.compile_prim_graph = triton_prim_compiler
    try:
        yield
    finally:
        backend.compile_prim_graph = saved


def full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def run_op(op) -> tuple[str, str]:
    """('pass' | 'fail' | 'skip', detail): the C++ sweep's comparison, with the Triton printer."""
    from sweep_ops import run_op as run_op_through_kiln
    return run_op_through_kiln(op, backend_context=triton_backend)


def _ops(names=None):
    from torch.testing._internal.common_methods_invocations import op_db
    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if names is not None:
        by_name = {full_name(o): o for o in ops}
        return [by_name[n] for n in names if n in by_name]
    return ops


@pytest.mark.parametrize("name", SUBSET)
def test_op_through_triton_kernels(name):
    ops = _ops([name])
    if not ops:
        pytest.skip(f"{name} is not an OpInfo with float32 CPU support in this torch")
    status, detail = run_op(ops[0])
    if status == "skip":
        pytest.skip(detail)
    assert status == "pass", detail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=1, help="run every N-th op (a sample of the sweep)")
    parser.add_argument("--ops", default=None)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "kiln", "codegen",
                                                      "triton", "op_sweep.md"))
    ns = parser.parse_args(argv)
    ops = _ops(ns.ops.split(",") if ns.ops else None)[::ns.every]
    counts, rows, start = {"pass": 0, "fail": 0, "skip": 0}, [], time.time()
    for op in ops:
        status, detail = run_op(op)
        counts[status] += 1
        rows.append(f"| {full_name(op)} | {status} | {detail.replace('|', '/')} |")
        print(f"{full_name(op):40s} {status} {detail}", flush=True)
    tested = counts["pass"] + counts["fail"]
    command = "OMP_NUM_THREADS=1 python tests/codegen/test_triton_sweep.py" + (f" --every {ns.every}" if ns.every > 1 else "")
    with open(ns.out, "w") as f:
        f.write("# Op sweep with Triton kernels (interpreter, CPU tensors), forward, float32, first sample\n\n")
        f.write(f"Command: `{command}`  ({time.time() - start:.0f} s)\n\n")
        f.write(f"pass {counts['pass']}, fail {counts['fail']}, skipped {counts['skip']}; "
                f"pass rate over tested ops: {100 * counts['pass'] / max(tested, 1):.1f}%\n\n")
        f.write("| op | status | detail |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    print(f"pass {counts['pass']} fail {counts['fail']} skip {counts['skip']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
