"""Benchmark output: the terminal table, geomean speedups per compiler, JSON lines, markdown.

Owns the formats; the rows come from `kiln.bench.harness`. The JSON lines file starts with one
`{"type": "run", ...}` record (command line, date, versions, device) followed by one
`{"type": "row", ...}` per case, written as each case finishes. The markdown summary repeats the
command line so a committed result says how it was made.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import sys
from typing import Iterable

import torch

COLUMNS = (  # (header, row key, format)
    ("model", "model", "{}"), ("mode", "mode", "{}"), ("prec", "precision", "{}"),
    ("compiler", "compiler", "{}"), ("status", "status", "{}"),
    ("eager ms", "eager_ms", "{:.2f}"), ("ms", "ms", "{:.2f}"), ("speedup", "speedup", "{:.2f}x"),
    ("vs inductor", "vs_inductor", "{:.2f}"),
    ("cold s", "cold_compile_s", "{:.1f}"), ("warm s", "warm_compile_s", "{:.1f}"),
    ("peak MB", "peak_mem_mb", "{:.0f}"), ("eager MB", "eager_peak_mem_mb", "{:.0f}"),
    ("graphs", "graphs", "{}"), ("breaks", "graph_breaks", "{}"),
    ("eager spread", "eager_spread", lambda row: f"{row['eager_spread']:.0%}" + (" noisy" if row.get("noisy") else "")),
)


def cell(row: dict, key: str, fmt) -> str:
    """A table cell: `fmt` is a format string for the value, or a function of the whole row."""
    value = row.get(key)
    if value is None:
        return "-"
    return fmt(row) if callable(fmt) else fmt.format(value)


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(rows: list[dict]) -> list[dict]:
    """Per (compiler, mode, precision): pass count, geomean speedup over passing rows, mean
    cold and warm compile seconds over passing rows."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["compiler"], row["mode"], row["precision"]), []).append(row)
    inductor_passed = {_case_key(r): r["status"] == "pass" for r in rows if r["compiler"] == "inductor"}
    out = []
    for (compiler, mode, precision), group in groups.items():
        passing = [r for r in group if r["status"] == "pass"]
        statuses = {}
        for r in group:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        out.append({"compiler": compiler, "mode": mode, "precision": precision,
                    "passed": f"{len(passing)}/{len(group)}",
                    "statuses": ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())),
                    "geomean_speedup": geomean(r.get("speedup") for r in passing),
                    # Inductor ms / this compiler's ms, over rows where both passed in one process
                    "geomean_vs_inductor": geomean(r.get("vs_inductor") for r in passing
                                                   if inductor_passed.get(_case_key(r))),
                    "mean_cold_s": _mean(r.get("cold_compile_s") for r in passing),
                    "mean_warm_s": _mean(r.get("warm_compile_s") for r in passing)})
    return out


def _case_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("suite", "model", "mode", "precision", "device", "size", "batch"))


def _mean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


SUMMARY_COLUMNS = (("compiler", "compiler", "{}"), ("mode", "mode", "{}"), ("prec", "precision", "{}"),
                   ("passed", "passed", "{}"), ("geomean speedup", "geomean_speedup", "{:.2f}x"),
                   ("geomean vs inductor", "geomean_vs_inductor", "{:.2f}"),
                   ("mean cold s", "mean_cold_s", "{:.1f}"), ("mean warm s", "mean_warm_s", "{:.1f}"),
                   ("statuses", "statuses", "{}"))


def text_table(rows: list[dict], columns=COLUMNS) -> str:
    cells = [[header for header, _, _ in columns]] + [[cell(r, k, f) for _, k, f in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, k, f) for _, k, f in columns) + " |" for r in rows]
    return "\n".join(lines)


def stage_rows(rows: list[dict]) -> list[dict]:
    """One row per (case, cold or warm) that recorded kiln's compile stages: the compile's
    seconds and each stage's ([Note: compile stages] in kiln.log); "outside" is the first call's
    seconds that no stage claims (the first step itself, Python around the compile)."""
    out = []
    for row in rows:
        for run, stages_key, seconds_key in (("cold", "compile_stages", "cold_compile_s"),
                                             ("warm", "warm_compile_stages", "warm_compile_s")):
            stages = row.get(stages_key)
            if not stages:
                continue
            total = row.get(seconds_key)
            out.append({"model": row.get("model"), "mode": row.get("mode"), "precision": row.get("precision"),
                        "compiler": row.get("compiler"), "run": run, "seconds": total, **stages,
                        "outside": None if total is None else max(total - sum(stages.values()), 0.0)})
    return out


def stage_columns(rows: list[dict]) -> tuple:
    from kiln.log import STAGES
    seen = {k for r in rows for k in r} - {"model", "mode", "precision", "compiler", "run", "seconds", "outside"}
    names = [s for s in STAGES if s in seen] + sorted(seen - set(STAGES))
    return (("model", "model", "{}"), ("mode", "mode", "{}"), ("prec", "precision", "{}"), ("run", "run", "{}"),
            ("compile s", "seconds", "{:.2f}")) + tuple((n, n, "{:.2f}") for n in names) + (
            ("outside", "outside", "{:.2f}"),)


def errors_of(rows: list[dict]) -> list[str]:
    """One line per row that failed, is not built yet, or ran without capturing anything."""
    return [f"{r['model']} {r['mode']} {r['precision']} {r['compiler']}: {r['status']}: "
            + "; ".join(r[k] for k in ("error", "note", "warm_error") if r.get(k))
            for r in rows if r.get("error") or r.get("note") or r.get("warm_error")]


def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
           "cpu_count": os.cpu_count(), "device": device,
           # other processes' load skews CPU timings; say how busy the machine was at the start
           "load_average_1min": round(os.getloadavg()[0], 2)}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


class ResultFiles:
    """`<out>/<date>_<device>_<suites>.jsonl` and `.md`; rows are appended as they finish."""

    def __init__(self, out_dir: str, device: str, suites: list[str], argv: list[str], append_to: str | None = None):
        """With `append_to` (`kiln bench --resume`), rows go to that file, after a run record of
        their own, and the markdown beside it summarizes every row the file holds."""
        os.makedirs(out_dir, exist_ok=True)
        self.started = datetime.datetime.now(datetime.timezone.utc)
        # letters, digits, '.', '_' and '-' only: a name a copying tool will not refuse
        stem = f"{self.started:%Y%m%d-%H%M%S}_{device.replace(':', '')}_{'-'.join(suites)}"
        self.jsonl = append_to or os.path.join(out_dir, stem + ".jsonl")
        self.markdown = self.jsonl[:-len(".jsonl")] + ".md" if self.jsonl.endswith(".jsonl") else self.jsonl + ".md"
        self.command = "kiln bench " + " ".join(shlex.quote(a) for a in argv)
        self.env = environment(device)
        self.appending = bool(append_to)
        if append_to:
            os.makedirs(os.path.dirname(os.path.abspath(append_to)), exist_ok=True)
        with open(self.jsonl, "a" if append_to else "w") as f:
            f.write(json.dumps({"type": "run", "command": self.command, "argv": argv,
                                "started": self.started.isoformat(), **self.env}) + "\n")

    def add_row(self, row: dict) -> None:
        with open(self.jsonl, "a") as f:
            f.write(json.dumps({"type": "row", **row}) + "\n")

    def rows(self) -> list[dict]:
        """Every row of the results file, a later row of one case replacing an earlier one."""
        return list(read_rows([self.jsonl])[1].values())

    @property
    def attribution(self) -> str:
        return self.markdown[:-len(".md")] + "_attribution.md"

    def write_attribution(self, rows: list[dict]) -> None:
        from kiln.bench.attribution import side_by_side
        if self.appending:    # a resumed sweep's attribution covers every profiled row of its file
            rows = self.rows()
        cases: dict[tuple, dict[str, dict]] = {}
        for row in rows:
            if "profile" in row:
                cases.setdefault((row["model"], row["mode"], row["precision"]), {})[row["compiler"]] = row["profile"]
        text = [f"# GPU time by category: {self.started:%Y-%m-%d %H:%M} UTC", "", f"Command: `{self.command}`", "",
                "One steady step of each compiler under torch.profiler, after the interleaved timing; kernels "
                "sorted by name (`kiln.bench.attribution.category_of`); idle = the unprofiled median step minus "
                "the union of kernel intervals (the GPU waiting for the host).", ""]
        for (model, mode, precision), profiles in cases.items():
            text.append(side_by_side(f"{model} {mode} {precision}", profiles))
        with open(self.attribution, "w") as f:
            f.write("\n".join(text))

    def write_markdown(self, rows: list[dict], notes: list[str]) -> None:
        env = ", ".join(f"{k} {v}" for k, v in self.env.items())
        if self.appending:    # a resumed sweep's summary covers every row of its file
            rows = self.rows()
        with open(self.markdown, "w") as f:
            f.write(markdown_report(f"{self.started:%Y-%m-%d %H:%M} UTC", [f"`{self.command}`"], [env],
                                    rows, notes))


def method_of(rows: list[dict]) -> str:
    """What a results file's figures may be used for, for its title: a CUDA run is headline only
    when every row was timed interleaved with no other process seen on the GPU."""
    cuda = [r for r in rows if str(r.get("device", "cpu")).startswith("cuda")]
    if not cuda:
        return ""
    shared = max((r.get("gpu_neighbours") or 0 for r in cuda), default=0)
    if shared:
        return f" (exploration only: {shared} other process(es) on the GPU)"
    if any(r.get("method") != "interleaved" for r in cuda):
        return " (exploration only: compilers timed in separate processes)"
    return " (headline method: one case at a time, compilers interleaved in one process)"


def markdown_report(when: str, commands: list[str], environments: list[str], rows: list[dict],
                    notes: list[str]) -> str:
    text = [f"# kiln bench: {when}{method_of(rows)}", "", "Command:", ""] + [f"- {c}" for c in commands] + [
        "", "Environment:", ""] + [f"- {e}" for e in environments] + [
        "", "## Summary (geomean speedup over eager, passing rows only)", "",
        markdown_table(summary(rows), SUMMARY_COLUMNS), "", "## Rows", "", markdown_table(rows), ""]
    stages = stage_rows(rows)
    if stages:
        text += ["## kiln's compile seconds by stage (`kiln.log.totals()` over the first call)", "",
                 markdown_table(stages, stage_columns(stages)), ""]
    errors = errors_of(rows)
    if errors:
        text += ["## Failures, not-yet rows and notes", ""] + [f"- {e}" for e in errors] + [""]
    text += ["## How these figures are made", ""] + [f"- {n}" for n in notes + METHOD] + [""]
    return "\n".join(text)


def read_rows(paths: list[str]) -> tuple[list[dict], dict[tuple, dict]]:
    """The run records and the rows of results files; a later row of one case replaces an earlier one."""
    runs, rows = [], {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                if record.get("type") == "run":
                    runs.append(record)
                elif record.get("type") == "row":
                    key = tuple(record.get(k) for k in ("suite", "model", "mode", "precision", "compiler", "device",
                                                         "size", "batch"))
                    rows[key] = {k: v for k, v in record.items() if k != "type"}
    return runs, rows


def merge(paths: list[str], out_dir: str, argv: list[str]) -> tuple[str, str]:
    """One JSON lines file and one markdown summary from several runs' JSON lines (e.g. a GPU
    sweep split into one command per model). A later row for the same case replaces an earlier
    one; every part's command is kept."""
    runs, rows = read_rows(paths)
    if not runs:
        raise ValueError(f"no kiln bench run records in {paths}")
    now = datetime.datetime.now(datetime.timezone.utc)
    devices = sorted({r.get("device", "cpu").replace(":", "") for r in runs})
    stem = os.path.join(out_dir, f"{now:%Y%m%d-%H%M%S}_{'-'.join(devices)}_merged")
    os.makedirs(out_dir, exist_ok=True)
    command = "kiln bench " + " ".join(shlex.quote(a) for a in argv)
    with open(stem + ".jsonl", "w") as f:
        f.write(json.dumps({"type": "run", "command": command, "parts": runs, "started": now.isoformat()}) + "\n")
        for row in rows.values():
            f.write(json.dumps({"type": "row", **row}) + "\n")
    skip = {"type", "command", "argv", "started"}
    environments = sorted({", ".join(f"{k} {v}" for k, v in r.items() if k not in skip) for r in runs})
    with open(stem + ".md", "w") as f:
        f.write(markdown_report(f"{now:%Y-%m-%d %H:%M} UTC (merged from {len(runs)} runs)",
                                [f"`{command}`"] + [f"`{r['command']}` ({r['started'][:16]})" for r in runs],
                                environments, list(rows.values()), []))
    return stem + ".jsonl", stem + ".md"


METHOD = [
    "eager spread = (90th percentile - 10th) / median of eager's timed steps in the row's process; "
    "a row past 20% is marked noisy: the machine's load moved eager's own time, so its ratios are doubtful",
    "interleaved (the headline method, the default): the compilers of one (model, mode, precision) "
    "in one process, timed round-robin (eager, inductor, kiln, eager, ...) after warm-up; ms is each "
    "compiler's median, speedup = eager ms / ms, vs inductor = inductor ms / ms from the same steps; "
    "cold s there is each compiler's first call minus a steady step in that shared process (a later "
    "compiler finds imports done)",
    "separate (--method separate): each case in its own process, "
    "ms the median of the compiled steps, eager ms the median "
    "of eager steps interleaved with them, after warm-up; speedup = eager ms / ms",
    "cold s = first compiled call (compile included) minus a steady step, in a process with empty "
    "on-disk caches; warm s = the same in a second process that finds the caches the first filled",
    "peak MB: on CUDA, max allocated during one steady step (compiled; eager MB for eager); on CPU, "
    "the growth of the process's peak RSS over the built model, up to the end of the timed steps "
    "(it includes the compiler's own memory)",
    "accuracy (PyTorch's `same`): allclose at the suite tolerance, else RMSE against a float64 eager "
    "run at most 2x (fp32) / 3x (bf16) eager's RMSE; train compares the loss and every parameter's "
    "gradient; train runs with dropout probabilities set to 0 so that runs are comparable",
    "train = forward + loss + backward, no optimizer step; bf16 = autocast; infer runs under no_grad",
    "graphs: graphs handed to the compiler's backend; breaks: torch.compile's counter for inductor, "
    "graphs - 1 for kiln (1 when nothing was captured)",
]
