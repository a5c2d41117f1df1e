"""The headline method: several compilers of one case in one process, their steps interleaved.

[Note: interleaved timing] Eager's own step time moved by tens of percent between processes on one
GPU (other processes, clocks, the allocator's state), so a speedup over an eager measured in another
process, or a ratio between two compilers measured in two, carries that noise. Here one process
builds the model once, compiles it with every compiler of the case (each its own wrapper of the same
module, sharing its parameters), and then times the steps round-robin: eager, inductor, kiln, eager,
inductor, kiln, ... A drift in the machine's state hits every compiler alike, and the ratio
kiln / Inductor comes from the same minutes. One case at a time on the GPU: `gpu_neighbours` records
the other processes seen on it before and after the timed steps, and the report titles a run that
had any as exploration only.

`run_interleaved(case)` returns `{"status": ..., "rows": [one row per compiler]}`; a compiler that
fails to compile or to run gets its own failing row and the others go on. With `case.profile`, one
steady step of each compiler is profiled afterwards (`kiln.bench.attribution`).
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
import traceback
from typing import Any

import torch

from kiln import log
from kiln.bench.case import (Bench, Case, cuda_step_peak_mb, first_line, float64_reference, noise_fields,
                             results_of, stages_since, status_of_error)


def gpu_neighbours() -> int | None:
    """How many other processes hold a context on the GPUs now (None: nvidia-smi cannot say)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    pids = {line.strip() for line in out.splitlines() if line.strip().isdigit()}
    pids.discard(str(os.getpid()))
    return len(pids)


def run_interleaved(case: Case) -> dict:
    from kiln.bench.accuracy import same, tolerance
    from kiln.bench.compilers import GraphCounter, get_compiler

    device = torch.device(case.device)
    bench = Bench.build(case)
    model, params, clock, eager_step = bench.model, bench.params, bench.clock, bench.eager_step
    rows: dict[str, dict[str, Any]] = {}
    steps: dict[str, Any] = {}
    for name in case.compilers:
        compiler = get_compiler(name)
        row: dict[str, Any] = {"compiler": name, "status": "fail_to_run"}
        rows[name] = row
        if not compiler.compiles:
            steps[name] = eager_step
            continue
        try:
            counter = GraphCounter()
            stages_before = log.totals()
            start = time.perf_counter()
            compiled = compiler.compile(model, counter)
            step = bench.step_of(compiled)
            clock.time(step)
            first_call_s = time.perf_counter() - start
            counter.finish(name)
            row.update(graphs=counter.graphs, graph_breaks=counter.breaks)
            if name.startswith("kiln"):      # kiln.log's stages are kiln's own
                row["compile_stages"] = stages_since(stages_before)
            for _ in range(case.warmup):
                clock.time(step)
            row["cold_compile_s"] = max(first_call_s - clock.time(step), 0.0)
            steps[name] = step
        except Exception as e:  # this compiler's row says so; the others are still measured
            traceback.print_exc()
            row.update(status_of_error(e))

    if case.phase == "prewarm":      # [Note: prewarm] in kiln.bench.harness: the caches are filled
        return {"status": "pass", "rows": [{**row, "status": "pass"} if row["compiler"] in steps else row
                                           for row in rows.values()]}
    neighbours = [gpu_neighbours()] if device.type == "cuda" else []
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(case.steps):          # [Note: interleaved timing]
        for name, step in list(steps.items()):
            try:
                times[name].append(clock.time(step))
            except Exception as e:
                traceback.print_exc()
                rows[name].update(status_of_error(e))
                del steps[name], times[name]
    if device.type == "cuda":
        neighbours.append(gpu_neighbours())
    eager_ms = 1e3 * statistics.median(times["eager"]) if "eager" in times else None
    noise = noise_fields(times["eager"]) if "eager" in times else {}    # [Note: noisy rows] in kiln.bench.case
    for name, ts in times.items():
        rows[name]["ms"] = 1e3 * statistics.median(ts)
        if eager_ms is not None:
            rows[name].update(eager_ms=eager_ms, speedup=eager_ms / rows[name]["ms"], **noise)
        if device.type == "cuda":
            rows[name]["peak_mem_mb"] = cuda_step_peak_mb(steps[name])
            rows[name]["gpu_neighbours"] = max((n for n in neighbours if n is not None), default=None)
    inductor = rows.get("inductor", {}).get("ms")
    for name, row in rows.items():
        if inductor and row.get("ms") and name != "inductor":
            row["vs_inductor"] = inductor / row["ms"]
        if "eager" in rows and rows["eager"].get("peak_mem_mb") is not None:
            row["eager_peak_mem_mb"] = rows["eager"]["peak_mem_mb"]

    restore_buffers = bench.restore_buffers
    restore_buffers()
    ref = results_of(eager_step(), case, params)
    results = {}
    for name, step in steps.items():
        if name == "eager":
            continue
        restore_buffers()
        try:
            results[name] = results_of(step(), case, params)
        except Exception as e:
            rows[name].update(status_of_error(e))
    restore_buffers()
    for p in params:
        p.grad = None
    fp64_ref = float64_reference(model, bench.args, bench.kwargs, case) if results else None
    tol = tolerance(case.suite, case.mode, case.precision)
    for name in steps:
        row = rows[name]
        if name == "eager":
            row["status"] = "pass"
            continue
        if name not in results:
            continue
        verdict = same(ref, results[name], fp64_ref, tol=tol)
        row["status"] = "pass" if verdict.ok else "fail_accuracy"
        if not verdict.ok:
            row["error"] = verdict.detail

    if case.profile and device.type == "cuda":
        from kiln.bench.attribution import profile_step
        for name, step in steps.items():
            try:
                rows[name]["profile"] = profile_step(step, rows[name]["ms"]).to_json()
                if name.startswith("kiln"):
                    rows[name]["profile"]["sources"] = kiln_sources(rows[name]["profile"]["top"])
            except Exception as e:  # a profiler failure costs the table, not the row
                rows[name]["profile_error"] = first_line(e)
    return {"status": "pass", "rows": list(rows.values())}


def kiln_sources(top: list) -> dict[str, str]:
    """The printed source and launch plans of kiln's Triton kernels among the most expensive ones."""
    from kiln.codegen.triton.launcher import BUILT
    names = [entry[0] for entry in top if entry[0].startswith("kiln_")]
    sources = {}
    for kernel in list(BUILT):
        match = next((n for n in names if n.startswith(kernel.function)), None)
        if match and kernel.function not in sources:
            plans = {str(k): (p.numels, str(p.config)) for k, p in kernel.plans.items() if p is not None}
            sources[kernel.function] = f"# plans {plans}\n{kernel.source}"[:6000]
    return sources
