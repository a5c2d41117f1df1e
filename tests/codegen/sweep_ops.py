"""The op sweep through the whole kiln backend (capture -> aot -> prims -> C++ kernels).

First sample, forward (`run_op`, what CI's `test_sweep_subset.py` and the Triton sweep call): for
each OpInfo in torch's `op_db` (float32 on CPU), its first sample input is run eagerly and through
`kiln.compile(fn, backend="kiln")`, and compared by `torch.testing.assert_close` (1e-4 / 1e-5:
kernels sum in another order). Writes tests/codegen/results/op_sweep.md:

    OMP_NUM_THREADS=1 python tests/codegen/sweep_ops.py [--limit N] [--ops a,b,c]

Every sample, forward and gradients (`run_sample`): every sample input of every op (or of every
Nth op, `--every N`, in op_db's order), compiled with fullgraph=True, float32, CPU. A pair
(op, sample) is checked with gradients when the op supports autograd: its float inputs require
grad, the compiled call's outputs are compared with eager's (forward) and then the gradients of
every input for seeded cotangents (gradient). Where that compile fails, the sample runs again
without grad, which alone decides forward. Shards (`--shard K/N`, each a process) write JSON
lines (a shard's process that dies on a sample, a segfault in a kernel, is recorded as that
sample's crash and the shard goes on in a new process: `supervise`); `--summarize` merges them into one table with the failure reasons (an op a later file ran
again keeps the later file's rows), and marks each miss that tests/codegen/sweep_expected_failures.py
gives a reason for:

    OMP_NUM_THREADS=1 python tests/codegen/sweep_ops.py --every-sample --every 8 --shard 0/2 --jsonl a.jsonl
    python tests/codegen/sweep_ops.py --summarize a.jsonl b.jsonl --out bench/results/...md

`--device cuda` runs the every-sample sweep's samples on the GPU (kiln's Triton kernels; issue
#38's CUDA sweep, `bash bench/gpu_checks.sh sweep K N DTYPE`).
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


FORWARD_TOL = dict(rtol=1e-4, atol=1e-5)
GRAD_TOL = dict(rtol=1e-3, atol=1e-4)
# [Note: reduced-precision sweep] A bfloat16 pair is held to the benchmark's accuracy rule
# (kiln.bench.accuracy.same, bf16 inference / training tolerances), not to eager's bits: kiln
# computes a fused expression in float32 and rounds once where eager rounds after every op, so
# the two differ by bfloat16 spacings; the sample's values run in float64 decide which is closer.
REDUCED_TOL = {"forward": 1e-2, "gradient": 4e-2}
PAIR_SECONDS = 120          # a pair that compiles longer than this is a failure ("timeout")


class _Timeout(Exception):
    pass


def _flat_tensors(x):
    from torch.utils._pytree import tree_leaves
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _reason(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"


def _compare(got, expected, tol) -> str:
    try:
        torch.testing.assert_close(got, expected, equal_nan=True, check_dtype=True, check_stride=False, **tol)
        return ""
    except Exception as e:
        return _reason(e)


def _grads(out, wrt, dtype=torch.float32):
    """The gradients of `wrt` for seeded cotangents, drawn in float32 and rounded to `dtype` (the
    sweep's), so that a float64 reference run gets the very values the sweep's dtype holds; a
    complex output's cotangent is drawn complex."""
    outs = [o for o in _flat_tensors(out) if o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)]
    if not outs or not wrt:
        return None
    g = torch.Generator().manual_seed(0)
    cot = [(torch.randn(o.shape, generator=g, dtype=o.dtype) if o.dtype.is_complex else
            torch.randn(o.shape, generator=g).to(dtype).to(o.dtype)).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, wrt, cot, allow_unused=True)
    return [torch.zeros_like(w) if x is None else x for x, w in zip(grads, wrt)]


def _call(op, sample):
    """(f, args): the op on the sample as a function of the sample's positional values."""
    args = (sample.input, *sample.args)
    kwargs = dict(sample.kwargs)
    fn = op.op

    def f(*a):
        return fn(*a, **kwargs)
    return f, args


def _compiled(f, args):
    import kiln
    kiln.reset()
    return kiln.compile(f, backend="kiln", fullgraph=True)(*args)


RANDOM = ("random output: the sample draws random numbers (dropout, fractional pooling, ...); "
          "eager draws from torch's generator, kiln from its own (seed, offset) stream, so values "
          "cannot be compared (and OpInfo's wrapper_set_seed reseeds inside the call, which kiln "
          "refuses under fullgraph)")


def _draws_random(f, args) -> bool:
    """Does eager's call run an op that draws from the generator?"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        seen = False

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                Watch.seen = True
            return func(*a, **(kw or {}))
    try:
        with torch.no_grad(), Watch():
            f(*[x.detach() if isinstance(x, torch.Tensor) else x for x in args])
    except Exception:
        return False
    return Watch.seen


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    """A reduced-precision floating tensor's values in float64, a leaf that requires grad as the
    original does; other tensors as they are."""
    if t.dtype not in (torch.bfloat16, torch.float16):
        return t
    return t.detach().double().requires_grad_(t.requires_grad)


def _float64_reference(op, sample, wrt_count: int, dtype) -> tuple:
    """(outputs, gradients) of the op on the sample's values in float64: the arbiter of the
    benchmark's accuracy rule (`kiln.bench.accuracy.same`) for a reduced-precision sweep; (None,
    None) when float64 cannot run it."""
    from torch.utils._pytree import tree_map_only
    try:
        args, kwargs = tree_map_only(torch.Tensor, _as_float64, ((sample.input, *sample.args), dict(sample.kwargs)))
        if kwargs.get("dtype") in (torch.bfloat16, torch.float16):   # a factory (linspace) asked for the dtype
            kwargs["dtype"] = torch.float64
        wrt = [t for t in _flat_tensors((args, kwargs)) if t.requires_grad]
        out = op.op(*args, **kwargs)
        return out, (_grads(out, wrt, dtype) if wrt_count and len(wrt) == wrt_count else None)
    except Exception:
        return None, None


def _compare_reduced(got, expected, fp64, tol: float) -> str:
    """The benchmark's rule: allclose at `tol`, or an RMSE against float64 within 3x eager's."""
    from kiln.bench.accuracy import same
    verdict = same(expected, got, fp64, tol=tol)
    return "" if verdict.ok else f"AssertionError: {verdict.detail}"


def run_sample(op, sample, grad: bool, dtype=torch.float32) -> dict:
    """One (op, sample) pair: {"forward": status, "gradient": status, "why": reason}, statuses
    pass | fail | skip (eager raised, the output is random, or no gradient to take). float32
    pairs compare at fixed tolerances; bfloat16 pairs by the benchmark's rule, with the sample
    run in float64 as the arbiter ([Note: reduced-precision sweep])."""
    f, args = _call(op, sample)
    wrt = [t for t in _flat_tensors((args, sample.kwargs)) if t.requires_grad] if grad else []
    result = {"forward": "skip", "gradient": "skip", "why": ""}
    if _draws_random(f, args):
        result["why"] = RANDOM
        return result
    try:
        expected = f(*args)
        eager_grads = _grads(expected, wrt, dtype) if wrt else None
    except Exception as e:
        result["why"] = f"eager raised {_reason(e)}"
        return result
    if eager_grads is None:
        wrt = []
    if dtype in (torch.float32, torch.complex64):
        def forward_check(got, want):
            return _compare(got, want, FORWARD_TOL)

        def gradient_check(got):
            return _compare(got, eager_grads, GRAD_TOL)
    else:
        fp64_out, fp64_grads = _float64_reference(op, sample, len(wrt), dtype)

        def forward_check(got, want):
            return _compare_reduced(got, want, fp64_out, REDUCED_TOL["forward"])

        def gradient_check(got):
            return _compare_reduced(got, eager_grads, fp64_grads, REDUCED_TOL["gradient"])
    try:
        got = _compiled(f, args)
    except Exception as e:
        got, why = None, _reason(e)
    else:
        why = forward_check(got, expected)
    if wrt:
        if got is None:
            result["gradient"] = "fail"
        else:
            try:
                mine = _grads(got, wrt, dtype)
                gwhy = "no gradient flows through the compiled outputs" if mine is None else gradient_check(mine)
            except Exception as e:
                gwhy = _reason(e)
            result["gradient"] = "fail" if gwhy else "pass"
            result["why_gradient"] = gwhy
            why = why if got is not None else why
    if got is None and wrt:     # the compile with gradients failed: forward alone decides forward
        result["why_gradient"] = why
        detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            with torch.no_grad():
                expected = f(*detached)
            why = forward_check(_compiled(f, detached), expected)
        except Exception as e:
            why = _reason(e)
    result["forward"] = "fail" if why else "pass"
    result["why"] = why
    return result


# the every-sample sweep's device (`--device cuda`: the samples on the GPU, kiln's Triton kernels)
DEVICE = "cpu"


def _samples(op, grad: bool, dtype=torch.float32):
    torch.manual_seed(0)
    return list(op.sample_inputs(DEVICE, dtype, requires_grad=grad))


STARTED, CRASH = "started", "crash: the sweep's process died on this sample"


def _resume(out_path: str) -> set[str]:
    """The ops a JSON-lines file already has whole: the file's last op may have stopped midway,
    so its rows are dropped (and it runs again), unless its last row records a crash."""
    import json
    if not os.path.exists(out_path):
        return set()
    rows = [line for line in open(out_path) if line.strip()]
    if not rows:
        return set()
    last = json.loads(rows[-1])
    kept = rows if last["why"].startswith(CRASH) else [line for line in rows if json.loads(line)["op"] != last["op"]]
    with open(out_path, "w") as f:
        f.writelines(kept)
    return {json.loads(line)["op"] for line in kept}


def sweep_every_sample(ops, out_path: str, log=print, dtype=torch.float32, resume: bool = False) -> None:
    import json
    import signal
    import warnings

    def alarm(*_):
        raise _Timeout(f"over {PAIR_SECONDS} s")
    signal.signal(signal.SIGALRM, alarm)
    done = _resume(out_path) if resume else set()
    tag = {} if dtype == torch.float32 else {"dtype": str(dtype).removeprefix("torch.")}
    with open(out_path, "a") as out:
        for op in ops:
            name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
            if name in done:
                continue
            if op.name in UNINITIALIZED:
                out.write(json.dumps({"op": name, "sample": -1, "forward": "skip", "gradient": "skip",
                                      "why": "result is uninitialized memory", **tag}) + "\n")
                continue
            grad = bool(op.supports_autograd) and dtype in op.supported_backward_dtypes(DEVICE)
            try:
                samples = _samples(op, grad, dtype)
            except Exception as e:
                out.write(json.dumps({"op": name, "sample": -1, "forward": "skip", "gradient": "skip",
                                      "why": f"no {dtype} samples ({_reason(e)})", **tag}) + "\n")
                continue
            start = time.time()
            out.write(json.dumps({"op": name, "sample": -2, "forward": "skip", "gradient": "skip",
                                  "why": STARTED, **tag}) + "\n")
            out.flush()
            for k, sample in enumerate(samples):
                signal.alarm(PAIR_SECONDS)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        row = run_sample(op, sample, grad, dtype)
                except _Timeout as e:
                    row = {"forward": "fail", "gradient": "fail" if grad else "skip", "why": f"timeout {e}"}
                except Exception as e:
                    row = {"forward": "fail", "gradient": "fail" if grad else "skip", "why": _reason(e)}
                finally:
                    signal.alarm(0)
                out.write(json.dumps({"op": name, "sample": k, **row, **tag}) + "\n")
                out.flush()
            log(f"{name}: {len(samples)} samples, {time.time() - start:.0f} s")


def record_crash(out_path: str, returncode: int) -> str:
    """After the sweep's process died (a segfault in a kernel): a failing row for the sample after
    the last one the file has of its last op, so that a resumed sweep goes on past that op and the
    summary names the crash. Returns the op."""
    import json
    last = json.loads([line for line in open(out_path) if line.strip()][-1])
    row = {**last, "sample": last["sample"] + 1 if last["sample"] >= 0 else 0, "forward": "fail",
           "gradient": "fail", "why": f"{CRASH} (exit status {returncode})"}
    with open(out_path, "a") as f:
        f.write(json.dumps(row) + "\n")
    return last["op"]


def supervise(argv: list[str], out_path: str, program: tuple[str, ...] = ()) -> int:
    """Run the sweep in a child process, and each time the child is killed by a signal (a segfault,
    an abort in a native kernel), record the crash for the sample it was on and resume in a new
    child past that op. A segfault ended whole shards before, silently."""
    import subprocess
    while True:
        before = os.path.getsize(out_path)
        rc = subprocess.call([*(program or (sys.executable, os.path.abspath(__file__))), *argv, "--resume"],
                             env={**os.environ, "KILN_SWEEP_CHILD": "1"})
        if rc >= 0 or os.path.getsize(out_path) == before:    # finished, a Python error, or no progress
            return rc
        print(f"the sweep's process died (exit status {rc}) in {record_crash(out_path, rc)}; resuming", flush=True)


def summarize(paths, out_path: str, command: str) -> str:
    import collections
    import json
    rows: list[dict] = []
    for p in paths:          # an op a later file ran again (after a fix) keeps the later file's rows
        later = [json.loads(line) for line in open(p) if line.strip()]
        again = {r["op"] for r in later}
        rows = [r for r in rows if r["op"] not in again] + later
    for r in rows:    # rows of a run before `_draws_random`: kiln's refusal names the same cause
        if "random ops inside a region that restores the RNG state" in r.get("why", ""):
            r.update(forward="skip", gradient="skip", why=RANDOM)
    counts = {kind: collections.Counter(r[kind] for r in rows if r["sample"] >= 0) for kind in ("forward", "gradient")}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sweep_expected_failures import expected
    reasons = collections.Counter()
    failing = collections.defaultdict(list)
    unlisted = collections.defaultdict(list)        # misses sweep_expected_failures.py does not give a reason for
    for r in rows:
        for kind in ("forward", "gradient"):
            if r[kind] == "fail" and expected(r["op"], kind, r["sample"], r.get("dtype", "float32")) is None:
                unlisted[(r["op"], kind)].append(r["sample"])
            if r[kind] == "fail":
                why = r.get("why_gradient") if kind == "gradient" and r.get("why_gradient") else r["why"]
                group = why.split(":")[0] + ": " + " ".join(why.split(":", 1)[-1].split()[:8]) if why else "?"
                reasons[(kind, group)] += 1
                failing[(r["op"], kind)].append((r["sample"], why))

    def rate(c):
        tested = c["pass"] + c["fail"]
        return f"{c['pass']}/{tested} = {c['pass'] / max(tested, 1):.1%}"
    ops = sorted({r["op"] for r in rows})
    dtypes = ", ".join(sorted({r.get("dtype", "float32") for r in rows})) or "float32"
    lines = [f"# Every-sample OpInfo sweep through kiln (fullgraph=True, {dtypes}, CPU, C++ backend)", "",
             f"Command: `{command}`", "",
             f"Ops: {len(ops)}; (op, sample) pairs: {sum(1 for r in rows if r['sample'] >= 0)}. "
             "Skipped pairs (eager raised on the sample, or no gradient to take) are not counted.", "",
             f"Of the skipped, {sum(1 for r in rows if r['sample'] >= 0 and r['why'] == RANDOM)} pairs draw random "
             f"numbers: {RANDOM}.", "",
             f"- forward: {rate(counts['forward'])} (skipped {counts['forward']['skip']})",
             f"- gradient: {rate(counts['gradient'])} (skipped {counts['gradient']['skip']})", "",
             f"- ops whose every compared sample passes forward and gradient: "
             f"{len(ops) - len({op for op, _ in failing})} of {len(ops)}", "",
             "## Failure groups", "", "| kind | reason | pairs |", "|---|---|---|"]
    lines += [f"| {k} | {g.replace('|', '/')} | {n} |" for (k, g), n in reasons.most_common()]
    lines += ["", "## Failing pairs by op", "",
              "| op | kind | samples failing | first reason | listed in sweep_expected_failures.py |", "|---|---|---|---|---|"]
    for (op, kind), items in sorted(failing.items()):
        listed = "no" if (op, kind) in unlisted else "yes"
        lines.append(f"| {op} | {kind} | {len(items)} ({', '.join(str(s) for s, _ in items[:8])}"
                     f"{', ...' if len(items) > 8 else ''}) | {items[0][1].replace('|', '/')[:160]} | {listed} |")
    lines += ["", f"## Misses not in sweep_expected_failures.py: {sum(map(len, unlisted.values()))} pairs", ""]
    lines += [f"- {op} {kind}: samples {', '.join(map(str, samples))}" for (op, kind), samples in sorted(unlisted.items())]
    lines += ["", "## Ops run", "", ", ".join(ops), ""]
    text = "\n".join(lines)
    with open(out_path, "w") as f:
        f.write(text)
    return text


def main(argv=None) -> int:
    from torch.testing._internal.common_methods_invocations import op_db
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--ops", default=None)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "op_sweep.md"))
    parser.add_argument("--every-sample", action="store_true", help="every sample, forward and gradients")
    parser.add_argument("--every", type=int, default=1, help="every Nth op of op_db (every sample of each)")
    parser.add_argument("--shard", default="0/1", help="K/N: this process runs the Kth of N slices of the ops")
    parser.add_argument("--jsonl", default="op_sweep_every_sample.jsonl")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "complex64"),
                        help="the every-sample sweep's dtype (bfloat16: the benchmark's accuracy rule; "
                             "complex64: float32's tolerances)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="the every-sample sweep's device (cuda: kiln's Triton kernels on the GPU)")
    parser.add_argument("--resume", action="store_true", help="keep the ops --jsonl already has whole")
    parser.add_argument("--summarize", nargs="*", default=None, help="JSON-lines files to merge into --out")
    parser.add_argument("--command", default="", help="the command recorded in the summary")
    ns = parser.parse_args(argv)
    if ns.summarize is not None:
        print(summarize(ns.summarize, ns.out, ns.command).split("## Failing")[0])
        return 0
    global DEVICE
    DEVICE = ns.device
    dtype = getattr(torch, ns.dtype)
    ops = [o for o in op_db if dtype in o.supported_dtypes(DEVICE)]
    if ns.ops:
        wanted = set(ns.ops.split(","))
        ops = [o for o in ops if o.name in wanted]
    if ns.every_sample:
        if not os.environ.get("KILN_SWEEP_CHILD"):
            if not ns.resume:
                open(ns.jsonl, "w").close()       # a fresh sweep; --resume goes on with the file's ops
            return supervise([a for a in (sys.argv[1:] if argv is None else argv) if a != "--resume"], ns.jsonl)
        k, n = (int(x) for x in ns.shard.split("/"))
        chosen = ops[::ns.every]
        sweep_every_sample(chosen[k::n], ns.jsonl, log=lambda m: print(m, flush=True), dtype=dtype, resume=ns.resume)
        return 0
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
