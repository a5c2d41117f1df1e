"""Op sweep: each OpInfo op (float32, CPU, supports autograd) through aot_compile vs eager.

For the first sample input of an op, the program `op(sample)` with every tensor of the sample as
an input is run eagerly and through `aot_compile` (forward and backward as FX graphs); forward
outputs and the gradients of every input that requires grad (for a random cotangent) must agree.
Ops whose eager backward fails on the sample are not counted. Expected failures, with reasons,
live in tests/aot/expected_failures.py.

Run the whole sweep:  python tests/aot/sweeps/op_sweep.py  (writes tests/aot/sweeps/op_sweep.md)
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback

import torch
import torch.utils._pytree as pytree

from kiln.aot import aot_compile


@dataclasses.dataclass(frozen=True)
class OpResult:
    name: str
    status: str    # pass | fail | skip (eager backward does not run, or no sample)
    detail: str = ""
    traced_on: str = ""   # fake | real (fake tracing fell back to real tensors)


def op_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


class _OpProgram(torch.nn.Module):
    """`op(sample)` with the sample's tensors as arguments, so aot_compile can trace it."""

    def __init__(self, opinfo, sample, spec, leaves):
        super().__init__()
        self.opinfo, self.spec, self.leaves = opinfo, spec, leaves
        self.slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for slot, t in zip(self.slots, tensors):
            leaves[slot] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.opinfo.op(inp, *args, **kwargs)


def _grads(out, inputs, cotangents):
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [x for x in inputs if x.requires_grad]
    if not outs or not wrt:
        return []
    loss = sum((o * c).sum().real for o, c in zip(outs, cotangents(outs)))  # real, for complex outputs
    return [g if g is not None else torch.zeros_like(x)
            for g, x in zip(torch.autograd.grad(loss, wrt, allow_unused=True), wrt)]


def _fresh(tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def check_op(opinfo) -> OpResult:
    name = op_name(opinfo)
    try:
        sample = next(iter(opinfo.sample_inputs("cpu", torch.float32, requires_grad=True)))
    except StopIteration:
        return OpResult(name, "skip", "no float32 sample")
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    program = _OpProgram(opinfo, sample, spec, leaves)
    inputs = [leaves[i] for i in program.slots]
    cache: dict[int, list] = {}

    def cotangents(outs):
        if "c" not in cache:
            g = torch.Generator().manual_seed(0)
            cache["c"] = [torch.randn(o.shape, generator=g, dtype=o.dtype)
                          if o.is_floating_point() or o.is_complex() else torch.zeros_like(o) for o in outs]
        return cache["c"]

    try:
        eager_in = _fresh(inputs)
        expected = program(*eager_in)
        expected_grads = _grads(expected, eager_in, cotangents)
    except Exception as e:
        return OpResult(name, "skip", f"eager backward does not run: {type(e).__name__}")
    try:
        compiled = aot_compile(program, _fresh(inputs), fw_compiler=lambda g, _: g.forward,
                               bw_compiler=lambda g, _: g.forward)
        got_in = _fresh(inputs)
        got = compiled(*got_in)
        got_grads = _grads(got, got_in, cotangents)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True)
        torch.testing.assert_close(got_grads, expected_grads, rtol=1e-4, atol=1e-4, equal_nan=True)
    except Exception as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return OpResult(name, "fail", f"{type(e).__name__}: {first}")
    return OpResult(name, "pass", traced_on=compiled.joint.traced_on)


def autograd_ops():
    from torch.testing._internal.common_methods_invocations import op_db
    return [o for o in op_db if o.supports_autograd and torch.float32 in o.supported_dtypes("cpu")]


def main(argv=None):
    from expected_failures import EXPECTED_FAILURES  # noqa: E402  (this folder's parent is on the path)
    ops = autograd_ops()
    results, start = [], time.time()
    for opinfo in ops:
        results.append(check_op(opinfo))
        r = results[-1]
        print(f"{r.status:5} {r.name} {r.detail}", file=sys.stderr)
    counted = [r for r in results if r.status != "skip"]
    passed = [r for r in counted if r.status == "pass"]
    lines = [f"# aot_eager op sweep (float32, CPU, first sample per op)", "",
             f"{len(ops)} OpInfo ops with autograd; eager backward runs for {len(counted)}; "
             f"{len(passed)} pass ({100 * len(passed) / max(len(counted), 1):.1f}%); "
             f"{len(counted) - len(passed)} fail; {time.time() - start:.0f} s", "",
             "| op | status | detail | expected failure reason |", "|---|---|---|---|"]
    for r in results:
        if r.status != "pass":
            lines.append(f"| {r.name} | {r.status} | {r.detail.replace('|', '/')} | "
                         f"{EXPECTED_FAILURES.get(r.name, '')} |")
    unexplained = [r.name for r in results if r.status == "fail" and r.name not in EXPECTED_FAILURES]
    stale = [n for n in EXPECTED_FAILURES if n in {r.name for r in passed}]
    real = [r.name for r in passed if r.traced_on == "real"]
    lines += ["", f"fails without a listed reason: {unexplained}", f"listed but passing: {stale}",
              f"passing ops traced on real tensors because fake tracing failed ({len(real)}): {real}"]
    out = os.path.join(os.path.dirname(__file__), "op_sweep.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:3]))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
