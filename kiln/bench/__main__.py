"""`kiln bench` and `python -m kiln.bench`: the command line of the benchmark harness.

Parses the flags, expands them into cases (suite x model x mode x precision x compiler), runs
them through `kiln.bench.harness` and prints and writes the results through `kiln.bench.report`.
The default is the demo: the built-in zoo at its bench size, CPU, infer, fp32, with eager,
inductor and kiln.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import torch

from kiln.bench.case import Case
from kiln.bench.compilers import COMPILERS, get_compiler
from kiln.bench.harness import run_all
from kiln.bench.report import SUMMARY_COLUMNS, ResultFiles, errors_of, merge, summary, text_table
from kiln.bench.suites import SUITES

MODES, PRECISIONS = ("infer", "train"), ("fp32", "bf16")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln bench",
        description="Benchmark compilers against eager PyTorch: each (model, mode, precision, compiler) "
                    "runs in its own process; rows report status, median step time, speedup, cold/warm "
                    "compile seconds, peak memory, graphs and breaks. Writes JSON lines and a markdown "
                    "summary under --out.",
        epilog="example (GPU): kiln bench --device cuda --suite hf,timm --precisions bf16 --modes infer,train")
    p.add_argument("--suite", default="zoo", help=f"comma list of suites: {','.join(SUITES)} (default zoo)")
    p.add_argument("--models", default=None, help="comma list of model names (default: every model of the suites)")
    p.add_argument("--compilers", default="eager,inductor,kiln",
                   help=f"comma list: {','.join(COMPILERS)}, or package.module:function (default eager,inductor,kiln)")
    p.add_argument("--modes", default="infer", help="comma list of infer,train (default infer)")
    p.add_argument("--precisions", default="fp32", help="comma list of fp32,bf16 (bf16 = autocast; default fp32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--method", choices=("interleaved", "separate"), default=None,
                   help="interleaved (the default): the compilers of one (model, mode, precision) in one process, "
                        "their steps interleaved (eager, inductor, kiln, eager, ...), so that a busy machine slows "
                        "every compiler alike; separate: one process per compiler, each timed against its own "
                        "eager (on cpu, peak memory is then the process's RSS growth)")
    p.add_argument("--profile", nargs="?", const="", default=None, metavar="MODELS",
                   help="profile one steady step of each compiler after timing (torch.profiler, cuda) and write "
                        "GPU time by category side by side; implies --method interleaved; MODELS as --models")
    p.add_argument("--prewarm", type=int, default=0, metavar="N",
                   help="first compile every case, N processes at a time, into shared on-disk caches; then time "
                        "one case at a time (rows report warm compile seconds): for a GPU machine of many cores")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps of each compiler (default 30 interleaved, 20 separate)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case process (default 600)")
    p.add_argument("--size", default="bench", choices=("test", "bench"), help="zoo model size (default bench)")
    p.add_argument("--batch", type=int, default=None, help="override every model's batch size")
    p.add_argument("--share-process", dest="share_process", action=argparse.BooleanOptionalAction, default=None,
                   help="run the compilers of one model, mode and precision in one process (default: on cuda only; "
                        "a hang or crash still costs only its own case)")
    p.add_argument("--no-warm", dest="warm", action="store_false",
                   help="skip the second process that measures the warm (cached) compile time")
    p.add_argument("--out", default="bench/results/runs", help="folder for the .jsonl and .md files (default bench/results/runs)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only the I-th of N shards (0 <= I < N) of the models, dealt round-robin in list order: "
                        "a suite split over several short runs (merge their .jsonl with --merge)")
    p.add_argument("--resume", default=None, metavar="JSONL",
                   help="append rows to this results file, skipping cases whose rows it already holds (a stopped or "
                        "timed-out sweep goes on where it was)")
    p.add_argument("--list", action="store_true", help="list suites, models and compilers, then exit")
    p.add_argument("--merge", nargs="+", metavar="JSONL", default=None,
                   help="instead of running: merge these results files into one .jsonl and .md under --out")
    return p


def split(value: str, allowed: tuple[str, ...] | None, flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if allowed is not None and v not in allowed]
    if bad or not items:
        raise SystemExit(f"kiln bench: {flag} {value!r}: choose from {','.join(allowed or ())}")
    return items


def build_cases(args: argparse.Namespace) -> tuple[list[Case], list[str]]:
    """The cases the flags ask for, and notes on what was left out (missing packages, unknown names)."""
    suites = split(args.suite, tuple(SUITES), "--suite")
    compilers = split(args.compilers, None, "--compilers")
    for name in compilers:
        try:
            get_compiler(name)
        except ValueError as e:
            raise SystemExit(f"kiln bench: {e}")
    modes, precisions = split(args.modes, MODES, "--modes"), split(args.precisions, PRECISIONS, "--precisions")
    wanted = set(split(args.models, None, "--models")) if args.models else None
    if not args.device.startswith(("cpu", "cuda")):
        raise SystemExit(f"kiln bench: --device {args.device!r}: choose cpu or cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"kiln bench: --device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    interleaved = args.method == "interleaved"
    steps = args.steps or (30 if interleaved else 20)
    cases, notes, found = [], [], set()
    for suite_name in suites:
        suite = SUITES[suite_name]
        missing = suite.missing()
        if missing:
            notes.append(f"skipped: {missing}")
            continue
        for name in suite.models():
            if wanted is not None and name not in wanted:
                continue
            found.add(name)
            for mode in modes:
                for precision in precisions:
                    if interleaved:
                        cases.append(Case(suite_name, name, mode, precision, ",".join(compilers), args.device,
                                          steps, args.warmup, args.batch, args.size, compilers=tuple(compilers),
                                          profile=args.profile is not None))
                        continue
                    for compiler in compilers:
                        cases.append(Case(suite_name, name, mode, precision, compiler, args.device, steps,
                                          args.warmup, args.batch, args.size))
    for name in sorted((wanted or set()) - found):
        notes.append(f"skipped: no model {name!r} in suites {','.join(suites)}")
    if args.shard:
        cases = shard(cases, args.shard)
    if args.resume and os.path.exists(args.resume):
        done = rows_done(args.resume)
        kept = [c for c in cases if not all(key in done for key in case_keys(c))]
        if len(kept) < len(cases):
            notes.append(f"resumed: {len(cases) - len(kept)} cases already in {args.resume}")
        cases = kept
    return cases, notes


def shard(cases: list[Case], spec: str) -> list[Case]:
    """The cases of every N-th model starting at the I-th (`spec` is "I/N"), in the cases' order."""
    try:
        index, count = (int(x) for x in spec.split("/"))
        assert 0 <= index < count
    except (ValueError, AssertionError):
        raise SystemExit(f"kiln bench: --shard {spec!r}: give I/N with 0 <= I < N, e.g. 0/4")
    models = list(dict.fromkeys((c.suite, c.model) for c in cases))
    mine = set(models[index::count])
    return [c for c in cases if (c.suite, c.model) in mine]


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("suite", "model", "mode", "precision", "compiler", "device", "batch"))


def case_keys(case: Case) -> list[tuple]:
    """The keys of the rows a case will write: one per compiler of an interleaved case."""
    return [(case.suite, case.model, case.mode, case.precision, name, case.device, case.batch)
            for name in (case.compilers or (case.compiler,))]


def rows_done(path: str) -> set[tuple]:
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {row_key(r) for r in records if r.get("type") == "row"}


def list_everything() -> None:
    for name, suite in SUITES.items():
        missing = suite.missing()
        print(f"suite {name}" + (f"  ({missing})" if missing else ""))
        if not missing:
            for model in suite.models().values():
                print(f"  {model.name:28s} {model.description}")
    print("compilers")
    for c in COMPILERS.values():
        print(f"  {c.name:28s} {c.description}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.list:
        list_everything()
        return 0
    if args.merge:
        for path in merge(args.merge, args.out, argv):
            print(f"wrote {path}")
        return 0
    if args.steps is not None and args.steps < 1:
        raise SystemExit("kiln bench: --steps must be at least 1 (30 or more for published figures)")
    if args.profile:
        args.models = args.profile
    if args.method is None:   # [Note: interleaved timing] in kiln.bench.interleaved, on every device
        args.method = "interleaved"
    if args.profile is not None and args.method != "interleaved":
        raise SystemExit("kiln bench: --profile needs --method interleaved")
    cases, notes = build_cases(args)
    for note in notes:
        print(f"kiln bench: {note}", file=sys.stderr)
    if not cases:
        if args.resume and os.path.exists(args.resume):
            print(f"kiln bench: every case is already in {args.resume}", file=sys.stderr)
            return 0
        print("kiln bench: nothing to run", file=sys.stderr)
        return 1
    # SIGTERM becomes SystemExit, so the harness can kill the running case's process group.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    files = ResultFiles(args.out, args.device, split(args.suite, tuple(SUITES), "--suite"), argv, append_to=args.resume)
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        files.add_row(row)

    try:
        run_all(cases, args.timeout, warm=args.warm, on_row=keep,
                share_process=args.share_process if args.share_process is not None else args.device == "cuda",
                prewarm_workers=args.prewarm)
    finally:   # an interrupted run still leaves a summary of the rows it finished
        if len(rows) < len(cases):
            notes.append(f"interrupted: {len(rows)} of {len(cases)} cases finished")
        files.write_markdown(rows, notes + [f"{cases[0].steps} timed steps after {args.warmup} warm-up steps; "
                                            f"zoo size {args.size}; per-case timeout {args.timeout:g} s"])
    print()
    print(text_table(rows))
    print()
    print(text_table(summary(rows), SUMMARY_COLUMNS))
    for line in errors_of(rows):
        print(f"  {line}")
    if args.profile is not None:
        files.write_attribution(rows)
        print(f"\nwrote {files.attribution}")
    print(f"\nwrote {files.jsonl}\n      {files.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
