"""The op sweep: every OpInfo of torch's op database, decomposed into prims, against eager.

For each op and each of float32, float16, bfloat16, int64 and bool that the op supports on CPU, the
first sample input runs eagerly and under `PrimEvaluator` (every ATen op decomposed, prims run by
their references, meta rules checked), and the results are compared. Backward (float32): the
gradients autograd computes under the evaluator, whose backward ATen ops are decomposed too,
against eager's. Ops whose eager output changes with the seed (random and uninitialized outputs)
are compared by shape and dtype only.

    python -m kiln.prims.sweep [--ops name,...] [--out tests/prims/sweep_results.json]

prints one line per failing op, any failure missing from expected_failures.py, and the pass
rates; tests/prims/test_prims_sweep.py runs a representative slice in CI.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kiln.prims.evaluator import PrimEvaluator, UndecomposedOp

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool)
TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2),
             torch.float64: (1e-7, 1e-7)}


@dataclasses.dataclass
class OpResult:
    name: str
    forward: str = "pass"          # pass | fail | skip
    backward: str = "skip"
    reasons: list = dataclasses.field(default_factory=list)


def op_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def _first_sample(opinfo, dtype, requires_grad):
    torch.manual_seed(0)
    return next(iter(opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad)))


def _run(opinfo, sample, seed):
    torch.manual_seed(seed)
    return opinfo(sample.input, *sample.args, **sample.kwargs)


def _tensors(x):
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _compare(expected, got, exact_values: bool, where: str):
    e, g = tree_flatten(expected)[0], tree_flatten(got)[0]
    if len(e) != len(g):
        raise AssertionError(f"{where}: {len(g)} outputs, eager has {len(e)}")
    for x, y in zip(e, g):
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor):
                raise AssertionError(f"{where}: got {type(y).__name__}, eager gives a tensor")
            if x.shape != y.shape or x.dtype != y.dtype:
                raise AssertionError(f"{where}: got {tuple(y.shape)} {y.dtype}, eager {tuple(x.shape)} {x.dtype}")
            if exact_values and not x.is_complex() or exact_values:
                rtol, atol = TOLERANCE.get(x.dtype, (0, 0))
                torch.testing.assert_close(y.detach(), x.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                           check_stride=False, msg=lambda m: f"{where}: {m}")
        elif x != y and not (isinstance(x, float) and x != x and y != y):
            raise AssertionError(f"{where}: got {y!r}, eager {x!r}")


class _GeneratorUse(TorchDispatchMode):
    """Notes whether any ATen op that runs draws from a random generator."""

    def __init__(self):
        super().__init__()
        self.seeded = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seeded |= torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _upcast(x):
    return x.double() if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16) else x


def _compare_against_float64(opinfo, sample, expected, got, where: str):
    """Low precision: eager itself is off from the exact result; accept an error at most twice
    eager's, both measured against the op run in float64 (PyTorch's benchmark accuracy rule)."""
    from torch.utils._pytree import tree_map
    args = tree_map(_upcast, (sample.input, sample.args, sample.kwargs))
    reference = opinfo(args[0], *args[1], **args[2])
    for e, g, r in zip(tree_flatten(expected)[0], tree_flatten(got)[0], tree_flatten(reference)[0]):
        if not isinstance(e, torch.Tensor) or not e.dtype.is_floating_point:
            continue
        eager_error = (e.double() - r.double()).abs().nan_to_num(0).max().item() if e.numel() else 0.0
        our_error = (g.double() - r.double()).abs().nan_to_num(0).max().item() if g.numel() else 0.0
        if our_error > 2 * eager_error + 1e-3:
            raise AssertionError(f"{where}: error vs float64 {our_error:.3g}, eager's {eager_error:.3g}")


def _is_seeded(opinfo, sample) -> bool:
    """True when eager's output depends on the generator (random ops) or is uninitialized memory.

    Some OpInfos reseed inside their own wrapper, so two eager runs agree; the op's tags say it."""
    if "empty" in opinfo.name:  # uninitialized memory can repeat between two eager runs
        return True
    use = _GeneratorUse()
    try:
        with use:
            _run(opinfo, sample, 0)
    except Exception:
        pass
    if use.seeded:
        return True
    try:
        a, b = _run(opinfo, sample, 0), _run(opinfo, sample, 1)
        _compare(a, b, True, "")
        return False
    except Exception:
        return True


def check_forward(opinfo, dtype) -> str | None:
    """None when decomposed evaluation equals eager; else the reason."""
    try:
        sample = _first_sample(opinfo, dtype, False)
    except StopIteration:
        return None
    expected = _run(opinfo, sample, 0)
    seeded = _is_seeded(opinfo, sample)
    try:
        with PrimEvaluator(check_meta=True):
            got = _run(opinfo, sample, 0)
        try:
            _compare(expected, got, not seeded, f"forward {dtype}")
        except AssertionError:
            if dtype not in (torch.float16, torch.bfloat16):
                raise
            _compare_against_float64(opinfo, sample, expected, got, f"forward {dtype}")
    except UndecomposedOp as e:
        return f"undecomposed: {str(e).split('ATen op ')[1].split(' ')[0]}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def check_backward(opinfo) -> str | None:
    sample = _first_sample(opinfo, torch.float32, True)
    inputs = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    expected_out = _run(opinfo, sample, 0)
    outs = [t for t in _tensors(expected_out) if t.requires_grad and t.dtype.is_floating_point]
    if not inputs or not outs:
        return "skip"
    torch.manual_seed(0)
    cotangents = [torch.randn_like(t) for t in outs]
    expected = torch.autograd.grad(outs, inputs, cotangents, allow_unused=True)
    seeded = _is_seeded(opinfo, sample)
    try:
        with PrimEvaluator(check_meta=True):
            got_out = _run(opinfo, sample, 0)
            got_outs = [t for t in _tensors(got_out) if t.requires_grad and t.dtype.is_floating_point]
            got = torch.autograd.grad(got_outs, inputs, cotangents, allow_unused=True)
        _compare([g for g in expected], [g for g in got], not seeded, "backward float32")
    except UndecomposedOp as e:
        return f"undecomposed: {str(e).split('ATen op ')[1].split(' ')[0]}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def sweep_op(opinfo) -> OpResult:
    result = OpResult(op_name(opinfo))
    tried = 0
    for dtype in DTYPES:
        if not opinfo.supports_dtype(dtype, "cpu"):
            continue
        tried += 1
        reason = check_forward(opinfo, dtype)
        if reason is not None:
            result.forward = "fail"
            result.reasons.append(f"forward {dtype}: {reason}")
    if tried == 0:
        result.forward = "skip"
    if opinfo.supports_autograd and opinfo.supports_dtype(torch.float32, "cpu"):
        reason = check_backward(opinfo)
        result.backward = "skip" if reason == "skip" else "pass" if reason is None else "fail"
        if reason not in (None, "skip"):
            result.reasons.append(f"backward: {reason}")
    return result


def _skip_test_fn_lookup():
    """OpInfo's sample iterators walk the whole call stack (`inspect.stack()`) to find the calling
    unittest method, for error messages we do not use; that walk is ~90% of the sweep's time."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None


def selected_ops(names=None):
    from torch.testing._internal.common_methods_invocations import op_db
    _skip_test_fn_lookup()
    if names is None:
        return list(op_db)
    wanted = set(names)
    return [o for o in op_db if op_name(o) in wanted or o.name in wanted]


def unexpected_failures(results) -> list:
    from kiln.prims.expected_failures import EXPECTED_FAILURES
    out = []
    for r in results:
        expected = EXPECTED_FAILURES.get(r.name, {})
        for phase in ("forward", "backward"):
            if getattr(r, phase) == "fail" and phase not in expected:
                out.append(f"{r.name} ({phase})")
    return out


def summarize(results) -> dict:
    fw = [r for r in results if r.forward != "skip"]
    bw = [r for r in results if r.backward != "skip"]
    return {"ops": len(results),
            "forward_pass": sum(r.forward == "pass" for r in fw), "forward_total": len(fw),
            "backward_pass": sum(r.backward == "pass" for r in bw), "backward_total": len(bw)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    parser.add_argument("--out", help="write per-op results as JSON here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    ops = selected_ops(args.ops.split(",") if args.ops else None)
    results, start = [], time.time()
    for opinfo in ops:
        try:
            r = sweep_op(opinfo)
        except Exception as e:  # a broken sample generator is the database's problem, not ours
            r = OpResult(op_name(opinfo), "skip", "skip", [f"sample error: {type(e).__name__}: {e}"])
        results.append(r)
        if r.reasons:
            print(f"{r.name}: " + " | ".join(r.reasons), flush=True)
        if args.out:  # incremental, so an interrupted sweep still leaves its results
            with open(args.out + ".partial", "a") as f:
                f.write(json.dumps(dataclasses.asdict(r)) + "\n")
    summary = summarize(results)
    summary["seconds"] = round(time.time() - start, 1)
    unexpected = unexpected_failures(results)
    summary["unexpected_failures"] = unexpected
    for name in unexpected:
        print(f"UNEXPECTED (not in kiln/prims/expected_failures.py): {name}")
    print(json.dumps({k: v for k, v in summary.items() if k != "unexpected_failures"}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
