"""The real-world capture corpus: every transformers model class that has a tiny config, run
eagerly, through kiln.compile and through torch.compile, each with the same counting backend.

    python -m kiln.bench.hf_corpus                      # the full corpus (long: hours on 2 cores)
    python -m kiln.bench.hf_corpus --models GPT2Model,MixtralForCausalLM
    python -m kiln.bench.hf_corpus --report bench/results/hf_corpus/<run>.jsonl   # table only

Per model (`run_model`): the eager output, then each compiler's output on two calls (the second
hits the cache), compared with eager (`same`); the graphs its backend received; its graph breaks
with their reasons (kiln's from its break events, as `kiln.explain` reports them; torch.compile's
from dynamo's counters, which bench alone may read). The backend is `counting_backend`: it counts
the graph and runs it as FX Python, so the row measures capture alone.

Models run one after another in ONE worker process (transformers imports once); the driver
restarts the worker after a model that crashes it or runs past `--timeout`, so one bad model costs
only its own row. Rows are appended to a JSON-lines file as they finish (a run that is stopped
keeps what it did; `--resume` skips the models already there), and `report.py`-style markdown
(totals, failure groups by reason, one row per model) is written next to it.

`--compilers kiln --resume run.jsonl` reruns one compiler's column of a run (after a fix): each new
row keeps the other compilers' results from the run's latest row for that model, so the table
compares kiln at this commit with the torch.compile results already measured. `--compilers
"kiln fullgraph"` adds a column of kiln under fullgraph=True: one graph, or `raised` (an
Unsupported error naming the user's line); the report counts them.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
import warnings

import torch

from kiln.bench.hf_tiny import MAPPINGS, Entry, Skip, build, corpus_entries

ROW_MARKER, START_MARKER = "@@kiln-corpus-row ", "@@kiln-corpus-start "
COMPILERS = ("kiln", "torch.compile")


class _Counter:
    """The counting backend: each graph it is handed is counted and run as FX Python."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _tensors(value) -> list[torch.Tensor]:
    """The tensors of a model output, in order (ModelOutput, tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def same(actual, expected) -> str | None:
    """None when `actual` equals eager's `expected` (allclose, NaNs equal), else what differs."""
    a, e = _tensors(actual), _tensors(expected)
    if len(a) != len(e):
        return f"{len(a)} output tensors, eager has {len(e)}"
    for i, (x, y) in enumerate(zip(a, e)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {i}: {tuple(x.shape)} {x.dtype} vs eager's {tuple(y.shape)} {y.dtype}"
        if not torch.allclose(x.float(), y.float(), rtol=1e-4, atol=1e-5, equal_nan=True):
            return f"output {i}: max difference {(x.float() - y.float()).abs().max().item():.3g}"
    return None


def _kiln(model, inputs: dict, fullgraph: bool = False) -> dict:
    import kiln
    from kiln.capture import frame
    kiln.reset()
    counter, events = _Counter(), []
    frame._EVENT_SINKS.append(events)
    try:
        compiled = kiln.compile(model, backend=counter, fullgraph=fullgraph)
        outputs = [compiled(**inputs) for _ in range(2)]
    finally:
        frame._EVENT_SINKS.remove(events)
    breaks = [{"reason": e.detail, "where": e.where} for e in events if e.kind in ("break", "eager")]
    return {"outputs": outputs, "graphs": counter.graphs, "breaks": breaks}


def _torch_compile(model, inputs: dict, fullgraph: bool = False) -> dict:
    import torch._dynamo  # bench only: torch.compile is the thing to compare with
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    counter = _Counter()
    compiled = torch.compile(model, backend=counter, fullgraph=fullgraph)
    outputs = [compiled(**inputs) for _ in range(2)]
    breaks = [{"reason": reason, "where": None} for reason, n in counters["graph_break"].items() for _ in range(n)]
    return {"outputs": outputs, "graphs": counter.graphs, "breaks": breaks}


# "kiln fullgraph" (`--compilers "kiln fullgraph"`): one graph, or `raised`: an Unsupported error
# that names the user's line, as fullgraph=True promises; "torch.compile fullgraph" the same of
# torch.compile (`raised`: its Unsupported), so issue #39's rule (kiln keeps one graph on every
# class torch.compile does) reads off one run
_RUNNERS = {"kiln": _kiln, "torch.compile": _torch_compile, "kiln fullgraph": functools.partial(_kiln, fullgraph=True),
            "torch.compile fullgraph": functools.partial(_torch_compile, fullgraph=True)}


def _error(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first[:300]}"


def _eager_as_compiled(model, inputs: dict):
    """Eager's output with `torch.compiler.is_compiling()` True: the code path a model takes under
    any compiler (transformers materializes masks it skips in eager, [Note: model's own differences])."""
    real = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        return model(**inputs)
    finally:
        torch.compiler.is_compiling = real


def _status(model, inputs, outputs: list, expected, eager_again, cache: dict) -> tuple[str, str | None]:
    """[Note: model's own differences] A compiled output that differs from eager's is `wrong` unless
    the model is to blame: `eager_varies` when eager differs from itself on a second call (random
    masking, sampled durations), `compile_path` when eager itself gives the compiled output once told
    it is being compiled (the model computes another function under any compiler)."""
    diffs = [same(out, expected) for out in outputs]
    wrong = next((d for d in diffs if d is not None), None)
    if wrong is None:
        return "correct", None
    if same(eager_again, expected) is not None:
        return "eager_varies", wrong
    if "as_compiled" not in cache:
        cache["as_compiled"] = _eager_as_compiled(model, inputs)
    if all(same(out, cache["as_compiled"]) is None for out in outputs):
        return "compile_path", wrong
    return "wrong", wrong


def run_model(entry: Entry, compilers=COMPILERS) -> dict:
    """One row: eager vs each compiler. `status` per compiler: correct | wrong | error, or one of the
    model's own differences (`_status`): eager_varies | compile_path."""
    row = {"model": entry.class_name, "model_type": entry.model_type, "mapping": entry.mapping}
    try:
        model, inputs = build(entry)
    except Skip as e:
        return {**row, "skipped": str(e)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected = model(**inputs)
            eager_again = model(**inputs)
        except Exception as e:
            return {**row, "skipped": f"eager fails: {_error(e)}"}
        cache: dict = {}
        for name in compilers:
            start = time.perf_counter()
            try:
                result = _RUNNERS[name](model, inputs)
                status, wrong = _status(model, inputs, result.pop("outputs"), expected, eager_again, cache)
                row[name] = {"status": status, "detail": wrong, **result}
            except Exception as e:
                from kiln.errors import Unsupported
                raised = (name == "kiln fullgraph" and isinstance(e, Unsupported) and e.where is not None) or \
                    (name == "torch.compile fullgraph" and type(e).__name__ == "Unsupported")
                row[name] = {"status": "raised" if raised else "error", "detail": _error(e), "graphs": None,
                             "breaks": [], "traceback": traceback.format_exc(limit=-8)}
            row[name]["seconds"] = round(time.perf_counter() - start, 2)
    return row


# -- the worker and its driver -----------------------------------------------------------------------
def _worker(names: list[str], mappings, compilers=COMPILERS) -> None:
    entries = {e.class_name: e for e in corpus_entries(mappings)}
    for name in names:
        print(START_MARKER + name, flush=True)
        row = run_model(entries[name], compilers)
        print(ROW_MARKER + json.dumps(row, default=str), flush=True)


def run_corpus(names: list[str], out_path: str, timeout: float, mappings, compilers=COMPILERS) -> None:
    """Run `names` in a worker process, restarting it after a crash or a timeout; append rows."""
    pending = list(names)
    earlier = _latest_rows(out_path) if tuple(compilers) != COMPILERS else {}
    while pending:
        command = [sys.executable, "-m", "kiln.bench.hf_corpus", "--worker", "--mappings", ",".join(mappings),
                   "--compilers", ",".join(compilers), "--models", ",".join(pending)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in process.stdout] + [lines.put(None)],
                         daemon=True).start()
        current, started = None, time.monotonic()
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                if current is not None and time.monotonic() - started > timeout:
                    process.kill()
                    break
                continue
            if line is None:
                break
            if line.startswith(START_MARKER):
                current, started = line[len(START_MARKER):].strip(), time.monotonic()
            elif line.startswith(ROW_MARKER):
                row = json.loads(line[len(ROW_MARKER):])
                row = _with_earlier(row, earlier.get(row["model"]))
                _append(out_path, row)
                pending.remove(row["model"])
                current = None
                print(f"[{len(names) - len(pending)}/{len(names)}] {_one_line(row)}", flush=True)
        process.wait()
        if current is not None:  # the worker died or hung on this model
            why = f"timeout after {timeout:.0f}s" if process.returncode == -9 else \
                f"worker exited with {process.returncode}"
            _append(out_path, {"model": current, "skipped": f"crashed: {why}"})
            pending.remove(current)
        elif pending:  # died before starting a model (an import failed): do not loop forever
            _append(out_path, {"model": pending[0], "skipped": f"crashed: worker exited with {process.returncode}"})
            pending.pop(0)


def _latest_rows(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    return {row["model"]: row for row in map(json.loads, filter(str.strip, open(path)))}


def _with_earlier(row: dict, earlier: dict | None) -> dict:
    """A row of some compilers completed by the other compilers' results of the run's earlier row."""
    if earlier is None or "skipped" in row or "skipped" in earlier:
        return row
    merged = dict(row)
    for c in _RUNNERS:
        if c in earlier and c not in row:
            merged[c] = earlier[c]
    return merged


def _append(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def _one_line(row: dict) -> str:
    if "skipped" in row:
        return f"{row['model']}: skipped ({row['skipped'][:80]})"
    parts = [f"{c} {row[c]['status']} {row[c]['graphs']}g/{len(row[c]['breaks'])}b" for c in _RUNNERS if c in row]
    return f"{row['model']}: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln.bench.hf_corpus", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=None, help="comma list of model class names (default: the whole corpus)")
    p.add_argument("--mappings", default=",".join(MAPPINGS), help="comma list of transformers auto mappings")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model (default 300)")
    p.add_argument("--out", default="bench/results/hf_corpus", help="folder for the .jsonl and .md")
    p.add_argument("--resume", default=None, metavar="JSONL",
                   help="append to this run, skipping its models (all of --models run; a later row wins)")
    p.add_argument("--report", default=None, metavar="JSONL", help="only write the markdown of this run")
    p.add_argument("--compilers", default=",".join(COMPILERS),
                   help="comma list of compilers to run (with --resume: the others' results are kept)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    mappings = tuple(m for m in args.mappings.split(",") if m)
    compilers = tuple(c for c in args.compilers.split(",") if c)
    if args.worker:
        _worker(args.models.split(","), mappings, compilers)
        return 0
    if args.report:
        from kiln.bench.hf_corpus_report import write_markdown
        print(write_markdown(args.report))
        return 0
    names = args.models.split(",") if args.models else [e.class_name for e in corpus_entries(mappings)]
    os.makedirs(args.out, exist_ok=True)
    path = args.resume or os.path.join(args.out, time.strftime("%Y%m%d-%H%M%S") + "_cpu.jsonl")
    if args.resume and os.path.exists(path) and not args.models:
        done = {json.loads(line)["model"] for line in open(path) if line.strip()}
        names = [n for n in names if n not in done]
    print(f"{len(names)} models -> {path}", flush=True)
    run_corpus(names, path, args.timeout, mappings, compilers)
    from kiln.bench.hf_corpus_report import write_markdown
    print(write_markdown(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
