"""Capture's events for the event log (`kiln.trace`, [Note: the event log]).

`frame.py` calls three functions here and nothing else (this module reads a `CompiledFunction`'s
`user_name` and `user_code`, and imports nothing of capture): `frame_start` before a frame compiles,
`frame_done` after (its guards and source), and `capture_event` for every `frame.Event` it emits
(graphs, breaks, recompiles: the stream `kiln.explain` reads, not a second one). Each returns at
once when nothing listens.
"""
from __future__ import annotations

import linecache
import re
import time
import types

from kiln import trace

_WHERE = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<function>.*)$")


def _source(code: types.CodeType) -> list[str]:
    """The lines of `code`, from its first line to its last (a resume function's code keeps the
    original function's line numbers)."""
    lines = [line for _, _, line in code.co_lines() if line is not None]
    last = max(lines, default=code.co_firstlineno)
    return [linecache.getline(code.co_filename, n).rstrip("\n") for n in range(code.co_firstlineno, last + 1)]


def frame_start(compiled, args: tuple) -> float | None:
    """Before `compiled` (a `frame.CompiledFunction`) compiles: the start time, or None when no
    one listens (then `frame_done` does nothing)."""
    if not trace.active():
        return None
    code = compiled.user_code(args)
    trace.emit("frame_start", function=compiled.user_name(), file=code.co_filename, line=code.co_firstlineno)
    return time.perf_counter()


def frame_done(compiled, entry, args: tuple, started: float | None) -> None:
    if started is None:
        return
    seconds = time.perf_counter() - started
    name = compiled.user_name()
    guards = [g.describe() for g in entry.guards]
    trace.emit("guards", function=name, guards=guards)
    code = compiled.user_code(args)
    trace.emit("frame", function=name, file=code.co_filename, line=code.co_firstlineno, source=_source(code),
               seconds=round(seconds, 6), entries=len(compiled.entries), guards=len(guards),
               graph_nodes=len(entry.graph.graph.nodes) if entry.graph is not None else 0,
               eager=entry.graph is None and entry.source == "<eager>")


def capture_event(event) -> None:
    """One `frame.Event` as an event of the log."""
    if not trace.active():
        return
    if event.kind == "graph":
        trace.graph_event("capture", event.function, event.detail)
        return
    detail = event.detail.describe() if hasattr(event.detail, "describe") else str(event.detail)  # a BucketSplit
    fields = {"function": event.function, "reason": detail}
    if event.where:
        fields["where"] = event.where
        match = _WHERE.match(event.where)
        if match:
            fields["file"], fields["line"] = match["file"], int(match["line"])
            fields["line_text"] = linecache.getline(match["file"], int(match["line"])).strip()
    trace.emit(event.kind, **fields)
