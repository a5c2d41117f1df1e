"""Differential fuzzing: random programs run eagerly and through `kiln.compile`, compared.

    python -m kiln.testing.fuzz --programs N --seed S [--out tests/fuzz] [--no-shrink]
                                [--triton-interpret | --device cuda] [--half]

Each program (`kiln.testing.programs`) runs eagerly, in float64 (the arbiter of `same`), and
compiled by kiln, twice (the second call reuses the cached entry and the kept buffers; a `dynamic`
program's second call has other sizes, under `dynamic=True`), on one of the `TARGETS`: "cpp" (CPU
tensors, the C++ printer: the default), "triton-interpret" (CPU tensors, the Triton printer under
Triton's interpreter: [Note: the Triton interpreter switch]) or "cuda" (CUDA tensors, compiled
Triton kernels; eager runs on the GPU too). The Triton targets draw the generator's GPU features
([Note: GPU features of the generator]); `--half` adds float16/bfloat16 values. Forward results, inputs the program mutates, and gradients of every input and parameter
that requires grad after a backward with seeded tangents are compared by the benchmark's accuracy
rule (`kiln.bench.accuracy.same`: RMSE against the float64 run at most 2x eager's, 3x for
float16/bfloat16), with its absolute terms scaled by the reference's magnitude
([Note: tolerances relative to the reference]): a gradient whose values are all tiny is held to
its own scale, not passed by a fixed atol. A program ends in one `Outcome`:

- ok;
- wrong: kiln returned a result that differs (the one thing kiln must never do);
- crash: kiln raised where eager did not (a kiln bug, however clearly reported);
- refusal: kiln said it does not support the program (`Unsupported`, `NotYetImplemented`);
- unstable: kiln's result is off by the rule, but so is eager's for the same inputs moved by one
  rounding: the program's result is not determined to that tolerance in float32 ([Note: results
  eager cannot pin down]).

A failing program is shrunk (`shrink`: drop steps while it fails the same way) and saved as a
standalone test file under `--out` (`write_repro`), which pytest then runs as a regression test.
"""
from __future__ import annotations

import argparse
import dataclasses
import linecache
import os
import sys
import tempfile
import time
import traceback
import warnings

import torch

from kiln.testing.programs import NAMESPACE, Input, Program, Step, generate

FORWARD_TOL, GRAD_TOL = 1e-4, 1e-3


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the compiled side of a program runs: its tensors' device and kiln's options."""

    name: str
    device: str = "cpu"
    options: tuple = ()            # (key, value) pairs of kiln.compile's options
    gpu_features: bool = False     # [Note: GPU features of the generator]


TARGETS = {"cpp": Target("cpp"),
           "triton-interpret": Target("triton-interpret", options=(("triton_interpret", True),), gpu_features=True),
           "cuda": Target("cuda", device="cuda", gpu_features=True)}


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: str            # ok | wrong | crash | refusal | unstable
    detail: str = ""

    @property
    def signature(self) -> str:
        """What a shrunk program must keep failing with: the kind and the error's type/first line."""
        return self.kind + ":" + self.detail.split("\n")[0][:60] if self.kind == "crash" else self.kind


def build(program: Program, double: bool = False, tag: str = "", device: str = "cpu"):
    """(callable, args, leaves): the program as a function or a freshly built module, its argument
    tensors, and every tensor (argument, parameter or buffer) by input name, on `device`."""
    source = program.source()
    filename = f"<kiln fuzz program {program.seed}{tag}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {**NAMESPACE, "DEVICE": device}
    exec(compile(source, filename, "exec"), scope)
    tensors = {i.name: i.make(double, device) for i in program.inputs}
    if program.module:
        state = {i.name: tensors[i.name] for i in program.inputs if i.role != "arg"}
        mod = scope["M"](state)
        for i in program.inputs:   # the module's own Parameter objects are what get .grad
            if i.role != "arg":
                tensors[i.name] = getattr(mod, i.name)
        fn = mod
    else:
        fn = scope["f"]
    args = [tensors[i.name] for i in program.inputs if not (program.module and i.role != "arg")]
    return fn, args, tensors


def _tangents(outputs, double: bool):
    g = torch.Generator().manual_seed(1234)
    out = []
    for o in outputs:
        t = torch.randn(o.shape, generator=g)
        out.append(t.to(o.device, torch.float64 if double else o.dtype))
    return out


def execute(program: Program, fn, args, tensors, double: bool = False):
    """Call, then backward through every float output that requires grad; returns what is
    compared: (outputs, input values after the call, gradients)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = fn(*args)
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        diff = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
        if diff:
            torch.autograd.backward(diff, _tangents(diff, double))
        results = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs]
        after = [tensors[i.name].detach().clone() for i in program.inputs]
        # an input written in place with a value that requires grad requires grad too (no .grad)
        grads = [tensors[i.name].grad for i in program.inputs if tensors[i.name].requires_grad]
    return results, after, grads


def eager_run(program: Program, double: bool = False, device: str = "cpu"):
    """Eager results; `double`: float inputs and factories (torch.ones(...)) in float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if double else previous)
    try:
        fn, args, tensors = build(program, double, device=device)
        return execute(program, fn, args, tensors, double)
    finally:
        torch.set_default_dtype(previous)


# [Note: results eager cannot pin down] The accuracy rule allows the compiled result twice eager's
# error against float64, plus tol / 10 times the reference's magnitude. A result that is a sum of terms cancelling to almost nothing
# is decided by rounding alone: fuzz seed 2610 takes a gradient through group norm and batch norm of
# a constant (each scales by 1 / sqrt(eps) = 316), and the layer norm bias's gradient sums 32 terms
# of about 1e5 to zero. Eager's float32 gave 2e-11 there, kiln's 0.0078; with other random values
# eager's own float32 gives 0.0156. Such a program is reported as `unstable`, not `wrong`, when
# eager itself, run on its inputs each moved by one rounding (every float element times 1 +- eps,
# signs drawn per element), is as far from float64 as kiln: then no float32 program could be held
# to eager's first answer. The perturbed inputs are only a second opinion on a result that failed.
# A first opinion needs no run: a failing result whose float64 value is (almost) zero while eager's
# float32 lands farther from it than its own size (RMSE against float64 above the float64 values'
# RMS) has no digit that float32 determines, and twice eager's noise is no bound on another order
# of the same sums (fuzz seed 2610's layer norm over one element: a gradient of 1e-13 in float64,
# eager's 6e-5, kiln's 1.5e-4). With relative tolerances ([Note: tolerances relative to the
# reference] in kiln/bench/accuracy.py) such a result is `unstable`; a wrong result where eager
# has digits to keep is still `wrong`, however small it is. A program whose float64 run fails (a
# float16 einsum's output strides differ in float64, and a `.view` of it raised: seed 510383) has
# no arbiter: its result is `unstable` when kiln's differs from eager's by at most twice what
# eager's own moves under one rounding of the inputs (a float16 layer norm over one element: a
# gradient of rounding noise around zero).
#
# A third case: a result that is exactly zero in float64 and in eager's float32, because the terms
# that cancel are computed the same way on both sides (the GPU fuzz's five "wrong" programs of 600
# at 00:40 were all `atan2(x, x)`'s gradient, x / (2x^2) - x / (2x^2)), while kiln computes them in
# another order or with a fused multiply-add and is left with a rounding's worth of them (2e-10 to
# 3e-6). The relative rule has no scale there (the reference's is 0) and moving the inputs moves
# both terms alike. The evidence is kiln's own float64 compile of the program: if its distance to
# float64's zero shrinks with the precision (at least 2^20 times smaller than in float32, float32's
# and float64's epsilons being 2^29 apart), the float32 residue is rounding, not a wrong formula,
# which would be as far off in float64. Only for results within the benchmark's own absolute rule
# (PyTorch's `same` at the tolerance), so a cancellation left with a large residue stays `wrong`.
PERTURBED_RUNS = 3
PRECISION_SHRINK = 2.0 ** 20


def _undetermined(ref, res, fp64, tol: float) -> str | None:
    """Evidence that float32 determines no digit of any failing result: eager's own RMSE against
    float64 exceeds the float64 values' RMS, for each failing float leaf."""
    from kiln.bench.accuracy import flatten, rmse, same
    found = None
    for a, b, c in zip(flatten(ref), flatten(res), flatten(fp64)):
        if not isinstance(c, torch.Tensor) or not c.is_floating_point() or same(a, b, c, tol=tol, relative=True).ok:
            continue
        size, error = c.double().square().mean().sqrt().item(), rmse(c, a)
        if not error > size:          # eager has digits here (or a non-finite error): no excuse
            return None
        found = (f"eager's float32 is {error:.3g} from float64 (RMSE), more than the float64 values' "
                 f"RMS {size:.3g}: float32 determines no digit of it")
    return found


def _rounding_of_a_cancellation(program: Program, index: int, ref, res, fp64, tol: float,
                                target: Target) -> str | None:
    """Evidence that a result float64 and eager give as exactly zero is kiln's rounding of terms that
    cancel: within the benchmark's absolute rule, and kiln's float64 compile much closer to zero."""
    import kiln
    from kiln.bench.accuracy import flatten, same
    failing = [(a, b, c) for a, b, c in zip(flatten(ref), flatten(res), flatten(fp64))
               if isinstance(c, torch.Tensor) and c.is_floating_point() and not same(a, b, c, tol=tol, relative=True).ok]
    if not failing or any(a.count_nonzero() or c.count_nonzero() or not same(a, b, c, tol=tol).ok
                          for a, b, c in failing):
        return None
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        fn, args, tensors = build(program, double=True, tag=" compiled in float64", device=target.device)
        res64 = execute(program, kiln.compile(fn, options=dict(target.options)), args, tensors, double=True)[index]
    except Exception:
        return None
    finally:
        torch.set_default_dtype(previous)
    error32, error64 = _max_diff(fp64, res), _max_diff(fp64, res64)
    if not error32 > 0 or error64 * PRECISION_SHRINK > error32:
        return None
    return (f"float64 gives exactly 0; kiln's float32 lands {error32:.3g} from it, its float64 compile "
            f"{error64:.3g}: a rounding of terms that cancel, not a wrong formula")


def perturbed_eager_run(program: Program, trial: int, device: str = "cpu"):
    """Eager results on the program's inputs with every float element moved by one rounding."""
    fn, args, tensors = build(program, tag=f" perturbed {trial}", device=device)
    g = torch.Generator().manual_seed(trial)
    seen = set()
    with torch.no_grad():
        for t in tensors.values():
            storage = t.untyped_storage()
            if not t.is_floating_point() or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())   # views of one storage (an expanded input): moved once
            flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage)
            sign = torch.randint(0, 2, flat.shape, generator=g).to(t.device, t.dtype) * 2 - 1
            flat.mul_(1 + torch.finfo(t.dtype).eps * sign)
    return execute(program, fn, args, tensors)


def _unstable(program: Program, index: int, res, fp64, tol: float, device: str = "cpu", ref=None) -> str | None:
    """Evidence that eager's own result moves as far as kiln's under one rounding of the inputs:
    measured against float64, or without a float64 run (`fp64` None) against eager's `ref`."""
    from kiln.bench.accuracy import same
    for trial in range(PERTURBED_RUNS):
        try:
            moved = perturbed_eager_run(program, trial, device)[index]
        except Exception:
            return None
        if fp64 is not None and same(moved, res, fp64, tol=tol, relative=True).ok:
            return f"eager on inputs moved by one rounding (trial {trial}) is as far from float64"
        if fp64 is None and ref is not None and _max_diff(ref, res) <= 2 * _max_diff(ref, moved):
            return (f"eager on inputs moved by one rounding (trial {trial}) moves "
                    f"{_max_diff(ref, moved):.3g}, kiln differs by {_max_diff(ref, res):.3g}")
    return None


def _max_diff(a, b) -> float:
    """The largest |difference| between the float leaves of two results (inf where they disagree
    in structure or in where they are non-finite)."""
    import math
    from kiln.bench.accuracy import flatten
    worst = 0.0
    for x, y in zip(flatten(a), flatten(b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.is_floating_point():
            if x.shape != y.shape:
                return math.inf
            d = (x.double() - y.double()).abs()
            finite = torch.isfinite(x) & torch.isfinite(y)
            if not torch.equal(x[~finite].double().nan_to_num(), y[~finite].double().nan_to_num()):
                return math.inf
            worst = max(worst, d[finite].max().item() if finite.any() else 0.0)
    return worst


def _is_refusal(e: BaseException) -> bool:
    from kiln.errors import NotYetImplemented, Unsupported
    while e is not None:
        if isinstance(e, (NotYetImplemented, Unsupported)):
            return True
        e = e.__cause__
    return False


def check(program: Program, calls: int = 2, target: Target | str = "cpp") -> Outcome:
    """Run `program` eagerly and under kiln on `target` (a `TARGETS` name or a `Target`); the verdict."""
    import kiln
    from kiln.bench.accuracy import same
    target = TARGETS[target] if isinstance(target, str) else target
    device = target.device
    # a dynamic program's later calls run it with its resized arguments ([Note: GPU features of the generator])
    runs = [program] + [program.with_resized_inputs()] * (calls - 1)
    references = []
    for run in runs[:2]:
        try:
            ref = eager_run(run, device=device)
        except Exception as e:
            return Outcome("invalid", f"eager raised {type(e).__name__}: {e}")
        try:
            fp64 = eager_run(run, double=True, device=device)
        except Exception:
            fp64 = None   # the program mixes float64 with float32 tensors: plain allclose decides
        references.append((ref, fp64))
    kiln.reset()
    debug_dir = os.path.join(tempfile.gettempdir(), "kiln_fuzz_debug")
    for call, run in enumerate(runs):
        ref, fp64 = references[min(call, 1)]
        fn, args, tensors = build(run, tag=f" compiled", device=device)
        if call == 0:
            compiled = kiln.compile(fn, options={"debug_dir": debug_dir, **dict(target.options)},
                                    dynamic=True if program.resized else None)
        elif program.module:   # the same compiled module object, fresh state
            compiled._orig_mod.load_state_dict(fn.state_dict())
            fresh = dict(fn.named_buffers())
            for name, b in compiled._orig_mod.named_buffers():
                # a buffer the first call wrote with a value requiring grad requires grad, its
                # history the first call's graph (seed 1003200): fresh state is a fresh leaf
                if b.requires_grad != fresh[name].requires_grad:
                    b.detach_().requires_grad_(fresh[name].requires_grad)
            for name, p in compiled._orig_mod.named_parameters():
                p.grad = None
            tensors.update({i.name: getattr(compiled._orig_mod, i.name) for i in program.inputs if i.role != "arg"})
        try:
            res = execute(run, compiled, args, tensors)
        except Exception as e:
            kind = "refusal" if _is_refusal(e) else "crash"
            return Outcome(kind, f"call {call + 1}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-6)}")
        for what, i, tol in (("outputs", 0, FORWARD_TOL), ("inputs after the call", 1, FORWARD_TOL),
                             ("gradients", 2, GRAD_TOL)):
            verdict = same(ref[i], res[i], fp64[i] if fp64 is not None else None, tol=tol, relative=True)
            if not verdict.ok:
                evidence = (_undetermined(ref[i], res[i], fp64[i], tol) if fp64 is not None else None) or \
                    _unstable(run, i, res[i], fp64[i] if fp64 is not None else None, tol, device, ref=ref[i]) or \
                    (_rounding_of_a_cancellation(run, i, ref[i], res[i], fp64[i], tol, target) if fp64 is not None else None)
                kind = "unstable" if evidence else "wrong"
                return Outcome(kind, f"call {call + 1}, {what}: {verdict.detail}" + (f"; {evidence}" if evidence else ""))
    return Outcome("ok")


def shrink(program: Program, outcome: Outcome, budget: int = 200, target: Target | str = "cpp") -> Program:
    """Drop steps (one at a time, last first, then the outputs one by one, then the second call's
    other sizes) while the program fails on `target` with the same signature."""
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        for k in reversed(range(len(program.steps))):
            if k >= len(program.steps):
                continue
            smaller = program.without({k})
            if not smaller.steps:
                continue
            tries += 1
            if check(smaller, target=target).signature == outcome.signature:
                program, changed = smaller, True
        for o in list(program.outputs):
            if len(program.outputs) > 1:
                smaller = dataclasses.replace(program, outputs=[x for x in program.outputs if x != o])
                smaller = smaller.without(set())
                tries += 1
                if check(smaller, target=target).signature == outcome.signature:
                    program, changed = smaller, True
        if program.resized:
            smaller = dataclasses.replace(program, resized=None)
            tries += 1
            if check(smaller, target=target).signature == outcome.signature:
                program, changed = smaller, True
    return program


def regression_test(program: Program, target: str = "cpp"):
    """A pytest test function: `program` under kiln on `target` matches eager (see `check`);
    skipped for the "cuda" target on a machine without a GPU."""
    def test():
        if TARGETS[target].device == "cuda" and not torch.cuda.is_available():
            import pytest
            pytest.skip("the program's target is a CUDA GPU")
        outcome = check(program, target=target)
        assert outcome.kind in ("ok", "unstable"), outcome.detail
    return test


def write_repro(program: Program, outcome: Outcome, folder: str, name: str | None = None,
                target: str = "cpp") -> str:
    """A standalone regression test file: the program as data (what `check` runs) and as text."""
    os.makedirs(folder, exist_ok=True)
    name = name or f"test_fuzz_{program.seed}" + ("" if target == "cpp" else f"_{target.replace('-', '_')}")
    path = os.path.join(folder, f"{name}.py")
    first = outcome.detail.split("\n")[0]
    flag = {"cpp": "", "triton-interpret": " --triton-interpret", "cuda": " --device cuda"}[target]
    lines = [f'"""Found by `python -m kiln.testing.fuzz{flag}` (seed {program.seed}), shrunk: {outcome.kind}.', "",
             first, '"""', "from kiln.testing.fuzz import regression_test",
             "from kiln.testing.programs import Input, Program, Step", "",
             *[f"# {line}" for line in program.source().splitlines()], "",
             f"PROGRAM = {_program_repr(program)}", "",
             f"{name} = regression_test(PROGRAM{'' if target == 'cpp' else f', target={target!r}'})", "",
             f'if __name__ == "__main__":', f"    {name}()", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _program_repr(p: Program) -> str:
    inputs = ",\n        ".join(repr(i) for i in p.inputs)
    steps = ",\n        ".join(repr(s) for s in p.steps)
    return (f"Program(\n    seed={p.seed},\n    inputs=[\n        {inputs},\n    ],\n    steps=[\n        {steps},\n"
            f"    ],\n    outputs={p.outputs!r},\n    module={p.module!r},\n"
            + (f"    resized={p.resized!r},\n" if p.resized else "") + ")")


def campaign(programs: int, seed: int, out: str | None, do_shrink: bool = True, dtypes=("float32", "int64", "bool"),
             max_steps: int = 30, log=print, target: str = "cpp", progress: str | None = None) -> dict:
    """Generate and check `programs` programs from seeds seed, seed+1, ... on `target`; returns the
    counts. `progress`: a file that holds the seed being checked, so that a campaign whose process
    died (an interpreted kernel reading out of bounds can end it with SIGSEGV) names that seed
    and resumes after it."""
    counts = {"ok": 0, "wrong": 0, "crash": 0, "refusal": 0, "unstable": 0, "invalid": 0}
    failures = []
    start, cpu_start = time.time(), _cpu_seconds()
    for s in range(seed, seed + programs):
        if progress:
            with open(progress, "w") as f:
                f.write(f"{s}\n")
        try:
            program = generate(s, dtypes, max_steps, gpu_features=TARGETS[target].gpu_features)
        except RuntimeError:
            counts["invalid"] += 1
            continue
        outcome = check(program, target=target)
        counts[outcome.kind] += 1
        if outcome.kind in ("wrong", "crash"):
            first = outcome.detail.split("\n")[0][:200]
            log(f"seed {s}: {outcome.kind}: {first}")
            if out:
                small = shrink(program, outcome, target=target) if do_shrink else program
                path = write_repro(small, check(small, target=target) if do_shrink else outcome, out, target=target)
                log(f"  -> {path} ({len(small.steps)} steps)")
            failures.append((s, outcome))
        elif outcome.kind in ("refusal", "unstable"):
            log(f"seed {s}: {outcome.kind}: {outcome.detail.split(chr(10))[0][:300]}")
        done = s - seed + 1
        if done % 50 == 0:
            log(f"[{done}/{programs}] {counts} {(time.time() - start) / done:.2f}s/program")
    counts["seconds"] = round(time.time() - start, 1)
    counts["cpu_seconds"] = round(_cpu_seconds() - cpu_start, 1)
    log(f"done: {counts}, {counts['seconds'] / max(programs, 1):.2f}s/program "
        f"({counts['cpu_seconds'] / max(programs, 1):.2f} CPU s/program, g++ included)")
    return counts


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (g++): what a program costs on a
    machine shared with other work, where wall time says more about the neighbours."""
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _shard(args) -> dict:
    programs, seed, out, do_shrink, dtypes, max_steps, target = args
    return campaign(programs, seed, out, do_shrink, dtypes, max_steps, log=lambda m: print(m, flush=True),
                    target=target)


# Programs one worker process runs before a fresh one takes over. Each compiled program loads a
# shared library that stays mapped: one process of a 10,000-program run (--jobs 1) ran out of
# Linux's 65,530 memory mappings (vm.max_map_count) after about 7,500, and every later load failed.
BLOCK = 2000


def _die_with_parent() -> None:
    """A worker ends when the campaign's process does (Linux's PR_SET_PDEATHSIG): killed by its
    pid, a campaign left its workers running into the next campaign's log and cache."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                                                             # not Linux: workers outlive a kill


def parallel_campaign(programs: int, seed: int, jobs: int, out, do_shrink, dtypes, max_steps, target="cpp") -> dict:
    """`campaign` over `jobs` processes (a machine's cores), in contiguous blocks of seeds of at
    most `BLOCK` programs, each block in a fresh process."""
    import multiprocessing
    rounds = -(-programs // (jobs * BLOCK))          # blocks a multiple of jobs: no core idles at the end
    per = -(-programs // (jobs * rounds))
    blocks = [(min(per, programs - k * per), seed + k * per, out, do_shrink, dtypes, max_steps, target)
              for k in range(-(-programs // per))]
    start = time.time()
    with multiprocessing.get_context("spawn").Pool(min(jobs, len(blocks)), initializer=_die_with_parent,
                                                   maxtasksperchild=1) as pool:
        parts = pool.map(_shard, blocks, chunksize=1)
    total = {k: sum(p[k] for p in parts) for k in parts[0]}
    total["seconds"] = round(time.time() - start, 1)
    print(f"all {len(blocks)} blocks on {jobs} jobs: {total}, {total['seconds'] / max(programs, 1):.2f}s/program wall", flush=True)
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder for shrunk repro tests (default: none written)")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--half", action="store_true", help="also draw float16/bfloat16 tensors")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one per core)")
    parser.add_argument("--progress", default=None, help="file holding the seed being checked (resume a campaign whose process died)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--triton-interpret", action="store_true",
                       help="CPU tensors through the Triton printer under Triton's interpreter")
    where.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cuda: CUDA tensors and compiled Triton kernels, compared with eager on the GPU")
    a = parser.parse_args(argv)
    target = "triton-interpret" if a.triton_interpret else ("cuda" if a.device == "cuda" else "cpp")
    if target == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    dtypes = ("float32", "int64", "bool") + (("float16", "bfloat16") if a.half else ())
    if a.jobs > 1 or a.programs > BLOCK:
        counts = parallel_campaign(a.programs, a.seed, a.jobs, a.out, not a.no_shrink, dtypes, a.max_steps, target)
    else:
        counts = campaign(a.programs, a.seed, a.out, not a.no_shrink, dtypes, a.max_steps,
                          log=lambda m: print(m, flush=True), target=target, progress=a.progress)
    return 1 if counts["wrong"] or counts["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
