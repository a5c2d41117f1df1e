"""One benchmark case, run in its own process: `python -m kiln.bench.case '<json Case>'`.

The harness starts this module once per (model, mode, precision, compiler) with fresh on-disk
caches (the cold run), and again with the same caches for the warm compile time. It prints one
line `RESULT_MARKER {json}` on stdout; anything else it prints is diagnostics. The order of work
is chosen for the memory figures: eager warm-up, compile and first call, interleaved timing,
accuracy, and the float64 reference last (on CPU peak RSS only grows).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import resource
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch

RESULT_MARKER = "@@KILN_BENCH_RESULT@@"


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    model: str
    mode: str              # infer | train
    precision: str         # fp32 | bf16 (autocast)
    compiler: str
    device: str = "cpu"
    steps: int = 20
    warmup: int = 2
    batch: int | None = None
    size: str = "bench"    # zoo models only
    phase: str = "cold"    # cold: the full measurement; warm: only the compile time, caches filled;
                           # prewarm: only compile, to fill the caches (interleaved cases)
    # The headline method ([Note: interleaved timing] in kiln.bench.interleaved): these compilers in
    # this one process, their steps interleaved; `compiler` then only labels the case.
    compilers: tuple[str, ...] = ()
    profile: bool = False  # interleaved only: profile one steady step of each compiler afterwards

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.model} {self.mode} {self.precision} {self.compiler}"


# --------------------------------------------------------------------------------- one step


@dataclasses.dataclass
class SuiteCase:
    """A suite model built for one bf16 (autocast) case, for the diagnostic scripts of bench/:
    `step(fn)` is a step of `fn` (the model or a compiled one) in the case's mode."""

    model: torch.nn.Module
    args: tuple
    kwargs: dict
    case: Case
    params: list

    @staticmethod
    def build(spec: str, device: str, batch: int | None = None) -> "SuiteCase":
        """`spec` is suite:model:mode (`timm:resnet50:train`); training runs with dropout off."""
        from kiln.bench.suites import disable_dropout, get_model
        suite, name, mode = spec.split(":")
        model, args, kwargs = get_model(suite, name).make(device, batch=batch)
        if mode == "train":
            model.train()
            disable_dropout(model)
        case = Case(suite=suite, model=name, mode=mode, precision="bf16", compiler="kiln", device=device)
        return SuiteCase(model, args, kwargs, case, [p for p in model.parameters() if p.requires_grad])

    def step(self, fn: Callable) -> Callable:
        return make_step(fn, self.args, self.kwargs, self.case, self.params, True)


def make_step(fn: Callable, args: tuple, kwargs: dict, case: Case, params: list, bf16: bool) -> Callable:
    """A step of the case's mode: inference under no_grad, or forward + loss + backward."""
    from kiln.bench.zoo import loss_of
    device_type = torch.device(case.device).type

    def autocast():
        if bf16:
            return torch.autocast(device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    if case.mode == "infer":
        def infer_step():
            with torch.no_grad(), autocast():
                return fn(*args, **kwargs)
        return infer_step

    def train_step():
        for p in params:
            p.grad = None
        with autocast():
            loss = loss_of(fn(*args, **kwargs))
        loss.backward()
        return loss
    return train_step


def results_of(out: Any, case: Case, params: list) -> list:
    """What accuracy compares: the outputs (infer), or the loss and every parameter's gradient."""
    from kiln.bench.accuracy import flatten
    if case.mode == "infer":
        return [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in flatten(out)]
    return [out.detach().clone()] + [None if p.grad is None else p.grad.detach().clone() for p in params]


class Clock:
    """Wall time of one call, with the device synchronized on both sides."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def time(self, step: Callable) -> float:
        self.sync()
        start = time.perf_counter()
        step()
        self.sync()
        return time.perf_counter() - start


# [Note: noisy rows] A row's eager step times spread: (90th percentile - 10th) / median, over the
# eager steps timed beside the compiled ones. On a busy CPU eager's own time moved 20x between rows,
# so a ratio over eager from such steps says little; the table marks a row past NOISY_SPREAD.
NOISY_SPREAD = 0.20


def spread_of(times: list[float]) -> float | None:
    """(p90 - p10) / median of step times ([Note: noisy rows]); None for fewer than two."""
    if len(times) < 2:
        return None
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    return (deciles[-1] - deciles[0]) / statistics.median(times)


def noise_fields(eager_times: list[float]) -> dict:
    spread = spread_of(eager_times)
    return {} if spread is None else {"eager_spread": spread, "noisy": spread > NOISY_SPREAD}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux reports KiB


def cuda_step_peak_mb(step: Callable) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


# ------------------------------------------------------------------------------------ the case


@dataclasses.dataclass
class Bench:
    """A case's model built and warmed up eagerly: what every compiler of the case is measured on."""

    case: Case
    model: torch.nn.Module
    args: tuple
    kwargs: dict
    params: list
    buffers: dict
    clock: Clock
    eager_step: Callable

    @staticmethod
    def build(case: Case) -> "Bench":
        from kiln.bench.suites import disable_dropout, get_model
        device = torch.device(case.device)
        torch.manual_seed(0)
        model, args, kwargs = get_model(case.suite, case.model).make(device, case.batch, case.size)
        if case.mode == "train":
            model.train()
            disable_dropout(model)
        params = [p for p in model.parameters() if p.requires_grad]
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        clock = Clock(device)
        eager_step = make_step(model, args, kwargs, case, params, case.precision == "bf16")
        for _ in range(case.warmup):
            clock.time(eager_step)
        return Bench(case, model, args, kwargs, params, buffers, clock, eager_step)

    def step_of(self, fn: Callable) -> Callable:
        return make_step(fn, self.args, self.kwargs, self.case, self.params, self.case.precision == "bf16")

    def restore_buffers(self) -> None:
        """Buffers as built (BatchNorm's running statistics move with every training step)."""
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(self.buffers[name])


def run(case: Case) -> dict:
    from kiln.bench.accuracy import same, tolerance
    from kiln import log
    from kiln.bench.compilers import GraphCounter, get_compiler

    device = torch.device(case.device)
    compiler = get_compiler(case.compiler)
    row: dict[str, Any] = {"status": "fail_to_run"}
    rss_before = peak_rss_mb()
    bench = Bench.build(case)
    model, args, kwargs, params, clock = bench.model, bench.args, bench.kwargs, bench.params, bench.clock
    eager_step = bench.eager_step
    if device.type == "cpu":
        row["eager_peak_mem_mb"] = peak_rss_mb() - rss_before

    counter = GraphCounter()
    stages_before = log.totals()
    start = time.perf_counter()
    compiled = compiler.compile(model, counter)
    compiled_step = bench.step_of(compiled)
    clock.time(compiled_step)
    first_call_s = time.perf_counter() - start
    counter.finish(case.compiler)
    if compiler.compiles:
        row.update(graphs=counter.graphs, graph_breaks=counter.breaks, compile_stages=stages_since(stages_before))
        if counter.graphs == 0 and ":" not in case.compiler:   # custom compilers are not counted
            row["note"] = "nothing was captured: the model ran eagerly under the compiler"
    for _ in range(case.warmup):
        clock.time(compiled_step)

    if case.phase in ("warm", "prewarm"):
        steady = statistics.median(clock.time(compiled_step) for _ in range(max(3, case.steps // 4)))
        return {"status": "pass", "warm_compile_s": max(first_call_s - steady, 0.0),
                "warm_compile_stages": row.get("compile_stages", {})}

    eager_times, compiled_times = [], []
    for _ in range(case.steps):          # interleaved, so drifts in machine load hit both alike
        if compiler.compiles:
            eager_times.append(clock.time(eager_step))
        compiled_times.append(clock.time(compiled_step))
    eager_times = eager_times or compiled_times
    row.update(eager_ms=1e3 * statistics.median(eager_times), ms=1e3 * statistics.median(compiled_times),
               **noise_fields(eager_times))
    row["speedup"] = row["eager_ms"] / row["ms"]
    row["cold_compile_s"] = max(first_call_s - row["ms"] / 1e3, 0.0) if compiler.compiles else 0.0
    if device.type == "cuda":
        row["eager_peak_mem_mb"] = cuda_step_peak_mb(eager_step)
        row["peak_mem_mb"] = cuda_step_peak_mb(compiled_step)
    else:
        row["peak_mem_mb"] = peak_rss_mb() - rss_before

    restore_buffers = bench.restore_buffers
    restore_buffers()
    ref = results_of(eager_step(), case, params)
    restore_buffers()
    res = results_of(compiled_step(), case, params)
    restore_buffers()
    for p in params:
        p.grad = None
    fp64_ref = float64_reference(model, args, kwargs, case)
    verdict = same(ref, res, fp64_ref, tol=tolerance(case.suite, case.mode, case.precision))
    row["status"] = "pass" if verdict.ok else "fail_accuracy"
    if not verdict.ok:
        row["error"] = verdict.detail
    return row


def float64_reference(model: torch.nn.Module, args: tuple, kwargs: dict, case: Case) -> list | None:
    """The eager step in float64 without autocast, the arbiter of the RMSE rule; None if the
    model cannot run in float64 (then accuracy falls back to allclose alone)."""
    def to64(x):
        return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    try:
        model64 = copy.deepcopy(model).double()
        params64 = [p for p in model64.parameters() if p.requires_grad]
        step = make_step(model64, tuple(map(to64, args)), {k: to64(v) for k, v in kwargs.items()},
                         case, params64, bf16=False)
        return results_of(step(), case, params64)
    except Exception as e:  # e.g. an op without a float64 kernel on this device
        print(f"kiln bench: no float64 reference ({type(e).__name__}: {e})", file=sys.stderr)
        return None


def stages_since(before: dict[str, float]) -> dict[str, float]:
    """kiln's compile seconds per stage ([Note: compile stages] in kiln.log) since `before` (an
    earlier `kiln.log.totals()`), the ones that took any time; empty under other compilers."""
    from kiln import log
    return {name: round(s - before.get(name, 0.0), 3) for name, s in log.totals().items()
            if s - before.get(name, 0.0) >= 0.0005}


def status_of_error(error: BaseException) -> dict:
    from kiln.bench.pt2_suites import ModelUnavailable
    from kiln.errors import NotYetImplemented
    if isinstance(error, ModelUnavailable):   # a list's model this install cannot build: not a compiler's failure
        return {"status": "unavailable", "error": str(error)}
    chain, seen = error, set()
    while chain is not None and id(chain) not in seen:   # torch.compile wraps backend errors
        if isinstance(chain, NotYetImplemented):
            return {"status": "not_yet", "error": first_line(chain)}
        seen.add(id(chain))
        chain = chain.__cause__ or chain.__context__
    return {"status": "fail_to_run", "error": first_line(error)}


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".strip()
    return line if len(line) <= 300 else line[:297] + "..."


def main(argv: list[str]) -> int:
    """Run one case, or a JSON list of cases one after another in this process (the harness
    shares a process between the compilers of one model on CUDA, where starting a process and
    building a large model cost more than the measurement). One result line per case."""
    payload = json.loads(argv[0])
    for fields in payload if isinstance(payload, list) else [payload]:
        case = Case(**{**fields, "compilers": tuple(fields.get("compilers", ()))})
        try:
            if case.compilers:
                from kiln.bench.interleaved import run_interleaved
                row = run_interleaved(case)
            else:
                row = run(case)
        except BaseException as e:  # the row reports it; the traceback goes to stderr for the log
            traceback.print_exc()
            row = status_of_error(e)
        forget_compiled_state()
        sys.stdout.flush()
        print(f"\n{RESULT_MARKER} {json.dumps(row)}", flush=True)
    return 0


def forget_compiled_state() -> None:
    """Between cases of one process: drop compiled code and cached memory, so the next case
    compiles from nothing (its on-disk caches are its own) and measures its own peak memory."""
    import gc
    import kiln
    kiln.reset()
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main(sys.argv[1:]))
