"""`kiln report`: the event log of a run (`KILN_TRACE`, kiln/trace.py) as one HTML page.

    kiln report [-o report.html] TRACE_DIR                      # a log written before
    kiln report [-o report.html] [--trace DIR] -- python train.py ARGS   # run it with KILN_TRACE set

`run.py` reads the log into frames, graphs, kernels and stage seconds; `page.py` renders them
(`chart.py` draws the time charts as inline SVG, `assets.py` holds the inline style and script).
The page is self-contained: it loads nothing from the network or the disk. This package reads the
log only; it imports no stage of the compiler.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from kiln.report.page import render
from kiln.report.run import Run, read_run, trace_file
from kiln.trace import TRACE_FILE

__all__ = ["Run", "main", "read_run", "render", "write_report"]


def write_report(trace: str, out: str, title: str | None = None) -> str:
    """Render the log in `trace` (a KILN_TRACE folder or its file) to `out`; returns `out`."""
    run = read_run(trace)
    html = render(run, title or "kiln report")
    with open(out, "w", encoding="utf-8") as f:
        f.write(html)
    return out


def run_traced(command: list[str], folder: str) -> int:
    """Run `command` with KILN_TRACE=folder (a fresh log) and return its exit status."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, TRACE_FILE)
    if os.path.exists(path):
        os.remove(path)
    return subprocess.call(command, env={**os.environ, "KILN_TRACE": folder})


USAGE = """kiln report [-o OUT.html] TRACE_DIR
kiln report [-o OUT.html] [--trace DIR] -- COMMAND [ARGS...]"""


def main(argv: list[str]) -> int:
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="kiln report", usage=USAGE,
                                     description="Write one self-contained HTML page of what kiln did in a run.")
    parser.add_argument("trace_dir", nargs="?", help="a folder written under KILN_TRACE (or its kiln-trace.jsonl)")
    parser.add_argument("-o", "--output", default="kiln_report.html", help="the page to write (kiln_report.html)")
    parser.add_argument("--trace", help="with -- COMMAND: keep the log in this folder (default: a temporary one)")
    args = parser.parse_args(argv)
    if bool(command) == bool(args.trace_dir):
        parser.error("give either TRACE_DIR or -- COMMAND")
    status = 0
    if command:
        with tempfile.TemporaryDirectory(prefix="kiln-trace-") as tmp:
            folder = args.trace or tmp
            status = run_traced(command, folder)
            if not os.path.exists(os.path.join(folder, TRACE_FILE)):
                print(f"kiln report: {' '.join(command)!r} wrote no events (exit status {status}): "
                      "it compiled nothing with kiln", file=sys.stderr)
                return status or 1
            write_report(folder, args.output, f"kiln report: {' '.join(command)}")
    else:
        if not os.path.exists(trace_file(args.trace_dir)):
            print(f"kiln report: no {TRACE_FILE} in {args.trace_dir}", file=sys.stderr)
            return 2
        write_report(args.trace_dir, args.output)
    print(f"kiln report: wrote {os.path.abspath(args.output)}", file=sys.stderr)
    return status
