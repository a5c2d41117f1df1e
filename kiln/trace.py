"""The event log of a compile: `KILN_TRACE=dir` writes every event to `dir/kiln-trace.jsonl`.

Stages call `emit(kind, **fields)` at a few points; this module owns where the events go and
depends on no stage (it imports no torch and no other kiln module), so every stage may import it.

[Note: the event log] One JSON object per line, each with `kind`, `t` (seconds since this module
was imported), `pid` and the kind's fields. The kinds and who emits them:

    process    argv, python, cwd, started (unix time)              this module, before a process's first event
    frame_start function, file, line                               capture/trace_events.py
    frame      function, file, line, source, seconds, entries, guards, graph_nodes    (one compiled frame)
    guards     function, guards (each described as kiln.explain does)                  capture/trace_events.py
    graph      stage ("capture" | "aot forward" | "aot backward"), function, code, nodes, ops
    break      function, reason, where, line_text                 capture's Event stream (frame.py)
    recompile  function, reason                                    capture's Event stream
    eager      function, reason (the cache-size limit: the frame runs eagerly from now on)
    split      function, reason (a graph cut at DDP's gradient buckets: the pieces)   capture's Event stream
    stage      stage, seconds                                      aot's and codegen's pass timers
    backend    name, seconds (one call of the backend on a graph)  kiln/backends.py
    schedule   printer, ir (the loop IR), kernels [{name, source, origins, launch}], refused
               [{node, group, reason}], externs, host, matmuls (max-autotune's product choices)
                                                                   codegen/trace_events.py
    cache      cache ("graph program" | "C++ library"), hit, key   codegen, runtime

Events of one frame lie between its `frame_start` and its `frame`; a graph's kernels follow its
`graph` event. `kiln report` (kiln/report/) reads the file back into a page.

With neither `KILN_TRACE` nor a `KILN_LOG` topic that reads events set, `_SINKS` is empty and
`emit` returns after one test: stages build costly fields (graph code, kernel source) only
`if trace.active()`. Both variables are read when kiln is imported; `configure()` reads them again
(tests, or a program that sets them itself). Every process appends to the one file: a line is
written with one `write` on a file opened for appending, so processes (data-loader workers, a
launcher's children) never split one another's lines.

`KILN_LOG` topics printed from events (on stderr): `breaks` (a line per graph break), `guards` (a
line per compiled entry, then a line per guard), `graphs` (the captured graph, and its pieces when
it is cut at DDP's buckets; aot prints its forward and backward itself). The other topics print where their stage runs (recompiles.py,
aot/runtime.py, codegen/compile.py).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable

TRACE_FILE = "kiln-trace.jsonl"
_T0 = time.perf_counter()
_SINKS: list[Callable[[dict], None]] = []
_LOCK = threading.Lock()


def active() -> bool:
    """Whether any event is wanted: call sites test this before building costly fields."""
    return bool(_SINKS)


def emit(kind: str, **fields: Any) -> None:
    """Record one event (see [Note: the event log]); a no-op when nothing listens."""
    if not _SINKS:
        return
    event = {"kind": kind, "t": round(time.perf_counter() - _T0, 6), "pid": os.getpid(), **fields}
    for sink in _SINKS:
        sink(event)


class _TraceFile:
    """The JSON-lines file: one `write` per event, on a descriptor opened for appending."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, TRACE_FILE)
        self.fd: int | None = None

    def __call__(self, event: dict) -> None:
        line = (json.dumps(event, default=str) + "\n").encode()
        with _LOCK:                       # kernels build on a pool's threads
            try:
                if self.fd is None:       # opened at the first event: a process that compiles nothing writes nothing
                    os.makedirs(os.path.dirname(self.path), exist_ok=True)
                    self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    head = {"kind": "process", "t": event["t"], "pid": event["pid"], "argv": list(sys.argv),
                            "python": sys.version.split()[0], "cwd": os.getcwd(), "started": time.time()}
                    os.write(self.fd, (json.dumps(head, default=str) + "\n").encode())
                os.write(self.fd, line)
            except OSError as e:          # a log that cannot be written never stops a compile
                warnings.warn(f"kiln: KILN_TRACE: cannot write {self.path} ({e}); the event log is off")
                if self in _SINKS:
                    _SINKS.remove(self)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _where(event: dict) -> str:
    return f" at {event['where']}" if event.get("where") else ""


# KILN_LOG topic -> kind -> the line printed for an event of that kind
LINES: dict[str, dict[str, Callable[[dict], str]]] = {
    "breaks": {
        "break": lambda e: f"graph break in {e['function']}{_where(e)}: {e['reason']}",
        "eager": lambda e: f"{e['function']} runs eagerly: {e['reason']}",
    },
    "guards": {
        "guards": lambda e: f"{len(e['guards'])} guards on {e['function']}"
                            + "".join(f"\n    {g}" for g in e["guards"]),
    },
    "graphs": {
        "graph": lambda e: (f"{e['stage']} graph of {e['function']} ({e['nodes']} nodes):\n{e['code'].strip()}"
                            if e["stage"] == "capture" else None),
        "split": lambda e: f"graph of {e['function']} {e['reason']}",
    },
}


class _Lines:
    def __init__(self, topics: set[str]):
        self.kinds: dict[str, list[tuple[str, Callable]]] = {}
        for topic in topics:
            for kind, line in LINES.get(topic, {}).items():
                self.kinds.setdefault(kind, []).append((topic, line))

    def __call__(self, event: dict) -> None:
        for topic, line in self.kinds.get(event["kind"], ()):
            text = line(event)
            if text is not None:
                print(f"[kiln {topic}] {text}", file=sys.stderr)


def configure(folder: str | None = None, log: str | None = None) -> None:
    """Point the event log at `folder` (default `$KILN_TRACE`; "" turns it off) and print the
    `KILN_LOG` topics of `log` (default `$KILN_LOG`)."""
    folder = os.environ.get("KILN_TRACE", "") if folder is None else folder
    topics = set((os.environ.get("KILN_LOG", "") if log is None else log).split(",")) & set(LINES)
    for sink in _SINKS:
        if isinstance(sink, _TraceFile):
            sink.close()
    _SINKS.clear()
    if folder:
        _SINKS.append(_TraceFile(folder))
    if topics:
        _SINKS.append(_Lines(topics))


def trace_path() -> str | None:
    """The file events are written to, if any."""
    return next((s.path for s in _SINKS if isinstance(s, _TraceFile)), None)


configure()


def graph_event(stage: str, function: str | None, gm: Any, **fields: Any) -> None:
    """A `graph` event for an FX GraphModule: its code, node count, and call counts by namespace
    (aten, prims, torch, ...), which say how far a graph has been lowered."""
    if not _SINKS:
        return
    ops: dict[str, int] = {}
    nodes = list(gm.graph.nodes)
    for node in nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            space = (getattr(node.target, "namespace", None) or getattr(node.target, "__module__", None)
                     or node.op).split(".")[0].lstrip("_")
            ops[space] = ops.get(space, 0) + 1
    emit("graph", stage=stage, function=function, code=gm.code, nodes=len(nodes), ops=ops, **fields)
