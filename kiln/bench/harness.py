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
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
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
    env = dict(os.environ,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"),
               TRITON_CACHE_DIR=os.path.join(cache_dir, "triton"),
               KILN_CACHE_DIR=os.path.join(cache_dir, "kiln"),
               PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "kiln.bench.case", json.dumps(dataclasses.asdict(case))]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, start_new_session=True)   # own group: a timeout kills workers too
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        output, _ = process.communicate()
        return Outcome({"status": "fail_to_run",
                        "error": f"timed out after {timeout:g} s in the {case.phase} run (raise --timeout)"},
                       _tail(output))
    except BaseException:   # Ctrl-C or SIGTERM of the driver: the case's own session would outlive it
        _kill_group(process)
        raise
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARKER):
            return Outcome(json.loads(line[len(RESULT_MARKER):]), _tail(output))
    last = next((l for l in reversed(output.splitlines()) if l.strip()), "no output")
    return Outcome({"status": "fail_to_run",
                    "error": f"the case process died (exit code {process.returncode}): {last.strip()[:200]}"},
                   _tail(output))


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
    """The full row of one case: the cold run, then (for a compiler that compiles and a case
    that ran) a second process on the same caches for the warm compile time."""
    cache_dir = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    start, cpu_start = time.perf_counter(), _children_cpu_s()
    try:
        cold = run_process(case, cache_dir, timeout)
        row = dict(cold.row)
        if row["status"] in ("fail_to_run",) and cold.log_tail:
            row["log_tail"] = cold.log_tail
        if warm and get_compiler(case.compiler).compiles and row["status"] in ("pass", "fail_accuracy"):
            second = run_process(dataclasses.replace(case, phase="warm"), cache_dir, timeout)
            if second.row.get("status") == "pass":
                row["warm_compile_s"] = second.row["warm_compile_s"]
            else:
                row["warm_error"] = second.row.get("error", "the warm run failed")
        # What the case cost, processes included: to plan runs and budgets (JSON only).
        row["case_wall_s"] = time.perf_counter() - start
        row["case_cpu_s"] = _children_cpu_s() - cpu_start
        return row
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


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
            on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every case in order; `on_row` sees each finished row (the CLI appends it to the JSON
    lines file at once, so an interrupted run keeps what it measured)."""
    cases = list(cases)
    progress = Progress(len(cases))
    rows = []
    try:
        for case in cases:
            progress.start(case.key)
            row = {**case_fields(case), **run_case(case, timeout, warm)}
            rows.append(row)
            if on_row is not None:
                on_row(row)
            progress.finish(case.key, row)
    finally:
        progress.close()
    return rows


def case_fields(case: Case) -> dict:
    fields = dataclasses.asdict(case)
    fields.pop("phase")
    return fields
