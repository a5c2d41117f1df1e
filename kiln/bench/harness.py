"""The driver: runs each benchmark case in its own process, with a timeout, and collects rows.

Owns the process protocol (a `Case` as JSON in, one marked JSON line out), the per-case on-disk
caches (fresh for the cold run, reused by the warm run, deleted after), killing a case that
hangs (its whole process group, so compile workers go too), and the progress bar. Hands a list
of row dicts to `kiln.bench.report`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable

from kiln.bench.case import RESULT_MARKER, Case
from kiln.bench.compilers import get_compiler


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What came back from one case process: its row, or why there is none."""

    row: dict
    log_tail: str = ""


def run_process(case: Case, cache_dir: str, timeout: float) -> Outcome:
    return run_processes([case], cache_dir, timeout)[0]


def run_processes(cases: list[Case], cache_dir: str, timeout: float) -> list[Outcome]:
    """Run `cases` one after another in one process, each within `timeout` seconds of the one
    before; a case that hangs or kills the process is reported and the rest go on in a new one."""
    outcomes: list[Outcome] = []
    while len(outcomes) < len(cases):
        outcomes += _one_process(cases[len(outcomes):], cache_dir, timeout)
    return outcomes


def _one_process(cases: list[Case], cache_dir: str, timeout: float) -> list[Outcome]:
    """Outcomes of a prefix of `cases` (at least one): the process stops early only when a case
    hangs or dies, and that case's outcome says so."""
    env = dict(os.environ,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"),
               TRITON_CACHE_DIR=os.path.join(cache_dir, "triton"),
               KILN_CACHE_DIR=os.path.join(cache_dir, "kiln"),
               PYTHONUNBUFFERED="1")
    payload = [dataclasses.asdict(c) for c in cases]
    command = [sys.executable, "-m", "kiln.bench.case", json.dumps(payload)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, start_new_session=True)   # own group: a timeout kills workers too
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    outcomes: list[Outcome] = []
    output: list[str] = []          # the current case's output, for its log tail
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < len(cases):
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                _kill_group(process)
                case = cases[len(outcomes)]
                outcomes.append(Outcome({"status": "fail_to_run", "error":
                                         f"timed out after {timeout:g} s in the {case.phase} run (raise --timeout)"},
                                        _tail("".join(output))))
                break
            if line is None:        # the process ended before this case's result
                process.wait()
                last = next((l for l in reversed(output) if l.strip()), "no output")
                outcomes.append(Outcome({"status": "fail_to_run", "error":
                                         f"the case process died (exit code {process.returncode}): {last.strip()[:200]}"},
                                        _tail("".join(output))))
                break
            if line.startswith(RESULT_MARKER):
                outcomes.append(Outcome(json.loads(line[len(RESULT_MARKER):]), _tail("".join(output))))
                output, deadline = [], time.monotonic() + timeout
            else:
                output.append(line)
    except BaseException:   # Ctrl-C or SIGTERM of the driver: the case's own session would outlive it
        _kill_group(process)
        raise
    if len(outcomes) == len(cases):
        process.wait()
    return outcomes


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(output: str, lines: int = 40) -> str:
    return "\n".join(output.splitlines()[-lines:])


def run_case(case: Case, timeout: float, warm: bool = True) -> dict:
    return run_group([case], timeout, warm)[0]


def run_group(cases: list[Case], timeout: float, warm: bool = True, cache_dir: str | None = None) -> list[dict]:
    """The full rows of `cases`, run in one process: the cold runs, then (for compilers that
    compile and cases that ran) a second process on the same caches for the warm compile times.
    With `cache_dir` (kept by the caller: `prewarm`), the on-disk caches are that folder's."""
    own_cache = cache_dir is None
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="kiln-bench-cache-")
    start, cpu_start = time.perf_counter(), _children_cpu_s()
    try:
        rows = []
        for outcome in run_processes(cases, cache_dir, timeout):
            row = dict(outcome.row)
            if row["status"] == "fail_to_run" and outcome.log_tail:
                row["log_tail"] = outcome.log_tail
            rows.append(row)
        again = [i for i, (case, row) in enumerate(zip(cases, rows))
                 if warm and not case.compilers and get_compiler(case.compiler).compiles and row["status"] in ("pass", "fail_accuracy")]
        seconds = run_processes([dataclasses.replace(cases[i], phase="warm") for i in again], cache_dir, timeout)
        for i, second in zip(again, seconds):
            if second.row.get("status") == "pass":
                rows[i]["warm_compile_s"] = second.row["warm_compile_s"]
                rows[i]["warm_compile_stages"] = second.row.get("warm_compile_stages", {})
            else:
                rows[i]["warm_error"] = second.row.get("error", "the warm run failed")
        # What the cases cost, processes included: to plan runs and budgets (JSON only).
        for row in rows:
            row["case_wall_s"] = (time.perf_counter() - start) / len(cases)
            row["case_cpu_s"] = (_children_cpu_s() - cpu_start) / len(cases)
            row["shared_process"] = len(cases) > 1
        return rows
    finally:
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)


def prewarm(cases: list[Case], timeout: float, workers: int, cache_dir: str) -> list[str]:
    """[Note: prewarm] Compile every case once, `workers` processes at a time, into `cache_dir`, so
    that the timed runs after it, one case at a time, find every compiler's on-disk caches filled:
    compiling is CPU-bound, and on a GPU machine of many cores the cases' compiles overlap well,
    while the timing must not. The timed rows then report warm compile seconds. Returns one line
    per case that failed here (the timed run reports it again)."""
    import concurrent.futures
    failures = []

    def one(case: Case) -> Outcome:
        return run_process(dataclasses.replace(case, phase="prewarm"), cache_dir, timeout)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for case, outcome in zip(cases, pool.map(one, cases)):
            if outcome.row.get("status") != "pass":
                failures.append(f"prewarm {case.key}: {outcome.row.get('error', outcome.row.get('status'))}")
    return failures


class Progress:
    """tqdm when it is installed, else one plain line per case on stderr."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr)
        except ImportError:
            self.bar = None

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description(label)
        else:
            print(f"[{self.done + 1}/{self.total}] {label} ...", file=sys.stderr, flush=True)

    def finish(self, label: str, row: dict) -> None:
        self.done += 1
        summary = row["status"] + (f" {row['speedup']:.2f}x" if "speedup" in row else "")
        if self.bar is not None:
            self.bar.write(f"{label}: {summary}", file=sys.stderr)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {label}: {summary}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_all(cases: Iterable[Case], timeout: float, warm: bool = True,
            on_row: Callable[[dict], None] | None = None, share_process: bool = False,
            prewarm_workers: int = 0) -> list[dict]:
    """Run every case in order; `on_row` sees each finished row (the CLI appends it to the JSON
    lines file at once, so an interrupted run keeps what it measured). With `share_process`, the
    compilers of one (model, mode, precision) share a process: on a GPU, starting a process and
    building a large model cost more than the measurement. Not on CPU, where the peak-memory
    figure is the process's peak RSS."""
    cases = list(cases)
    cache_dir = None
    if prewarm_workers:
        cache_dir = tempfile.mkdtemp(prefix="kiln-bench-prewarm-")
        print(f"kiln bench: prewarming {len(cases)} cases, {prewarm_workers} processes at a time", file=sys.stderr)
        for line in prewarm(cases, timeout, prewarm_workers, cache_dir):
            print(f"kiln bench: {line}", file=sys.stderr)
        warm = False      # the timed runs' compile seconds are the warm ones already
    progress = Progress(sum(max(len(c.compilers), 1) for c in cases))
    rows = []
    try:
        for group in _groups(cases, share_process):
            for case in group:
                progress.start(case.key)
            for case, result in zip(group, run_group(group, timeout, warm, cache_dir)):
                if cache_dir is not None:
                    result = _as_warm(result)
                for row in expand(case, result):
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
                    progress.finish(f"{case.suite}/{case.model} {case.mode} {case.precision} {row['compiler']}", row)
    finally:
        progress.close()
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return rows


def _as_warm(result: dict) -> dict:
    """A timed result after `prewarm`: its first-call seconds are warm-start seconds."""
    def rename(row: dict) -> dict:
        row = dict(row)
        for cold, warm in (("cold_compile_s", "warm_compile_s"), ("compile_stages", "warm_compile_stages")):
            if cold in row:
                row[warm] = row.pop(cold)
        return row
    result = rename(result)
    if "rows" in result:
        result["rows"] = [rename(r) for r in result["rows"]]
    return result


def _groups(cases: list[Case], share_process: bool) -> list[list[Case]]:
    if not share_process:
        return [[case] for case in cases]
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault((case.suite, case.model, case.mode, case.precision, case.device), []).append(case)
    return list(groups.values())


def case_fields(case: Case) -> dict:
    fields = dataclasses.asdict(case)
    for key in ("phase", "compilers", "profile"):
        fields.pop(key)
    return fields


def expand(case: Case, result: dict) -> list[dict]:
    """The rows of one case's result: one, or one per compiler of an interleaved case (whose
    failure to run at all is every compiler's row)."""
    shared = {**case_fields(case), "method": "interleaved" if case.compilers else "separate"}
    if not case.compilers:
        return [{**shared, **result}]
    if "rows" not in result:
        return [{**shared, **result, "compiler": name} for name in case.compilers]
    extra = {k: v for k, v in result.items() if k not in ("rows", "status")}
    return [{**shared, **extra, **row} for row in result["rows"]]
