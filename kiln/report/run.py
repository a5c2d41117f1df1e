"""The event log read back: `read_run(path)` turns `kiln-trace.jsonl` into a `Run`.

A `Run` is the processes that wrote the file; each holds its compiled frames (`FrameCompile`, one
per compile of a function: a recompile is a second one) in the order they started. A frame owns
the events written between its `frame_start` and its `frame` ([Note: the event log] in
kiln/trace.py): its graph breaks, its graphs, each aot graph's schedule (kernels, refused fusions),
the seconds of each stage, and the cache's answers. A frame's time outside its backend calls is its
`capture` stage (bytecode capture, guards, the entry's code); the backend's time no stage timer
claims is `backend other` (imports on the first compile, cache keys, linking).
"""
from __future__ import annotations

import dataclasses
import json
import os

from kiln.log import STAGES
from kiln.trace import TRACE_FILE

CAPTURE, BACKEND_OTHER = "capture", "backend other"
# pipeline order of the stages' names: kiln.log's stages ([Note: compile stages]), then the rest
STAGE_ORDER = (*STAGES, BACKEND_OTHER)
GRAPH_ORDER = ("capture", "aot forward", "aot backward")


@dataclasses.dataclass
class Graph:
    stage: str
    code: str
    nodes: int
    ops: dict
    note: str = ""
    schedule: dict | None = None      # the `schedule` event of this graph's program (aot graphs)
    cached: bool = False              # its program came from the warm-start cache: no kernels generated


@dataclasses.dataclass
class FrameCompile:
    function: str
    file: str
    line: int
    pid: int
    index: int = 0                     # which compile of this function (0: the first)
    source: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    done: bool = False                 # False: the compile raised (no `frame` event)
    eager: bool = False
    recompile: str | None = None       # the guard that failed, when this compile is a recompile
    guards: list = dataclasses.field(default_factory=list)
    breaks: list = dataclasses.field(default_factory=list)      # `break` events
    splits: list = dataclasses.field(default_factory=list)      # `split` events: a graph cut at DDP's buckets
    graphs: list = dataclasses.field(default_factory=list)
    stages: dict = dataclasses.field(default_factory=dict)      # stage -> seconds
    caches: list = dataclasses.field(default_factory=list)      # `cache` events
    nested_seconds: float = 0.0        # frames compiled while this one compiled
    backend_seconds: float = 0.0       # in calls of the backend (`backend` events)

    @property
    def kernels(self) -> list:
        return [k for g in self.graphs if g.schedule for k in g.schedule["kernels"]]

    def stage_seconds(self) -> dict:
        """Seconds per stage (kiln.log's, which time capture itself), the frame's time outside the
        backend as `capture` when no stage timed it, and the backend's time no stage claimed as
        `backend other`."""
        claimed = sum(self.stages.values())
        out = {CAPTURE: max(self.seconds - self.backend_seconds - self.nested_seconds, 0.0), **self.stages}
        if CAPTURE in self.stages:
            claimed -= self.stages[CAPTURE]     # timed outside the backend
        if self.backend_seconds:
            out[BACKEND_OTHER] = max(self.backend_seconds - claimed, 0.0)
        return out


@dataclasses.dataclass
class Process:
    pid: int
    argv: list = dataclasses.field(default_factory=list)
    frames: list = dataclasses.field(default_factory=list)
    loose: FrameCompile | None = None  # graphs compiled outside a kiln frame (torch.compile's backend)
    eager: list = dataclasses.field(default_factory=list)       # functions past their cache-size limit


@dataclasses.dataclass
class Run:
    processes: list

    @property
    def frames(self) -> list:
        return [f for p in self.processes for f in p.frames + ([p.loose] if p.loose else [])]

    def summary(self) -> dict:
        frames = self.frames
        caches = [c for f in frames for c in f.caches]
        breaks = [b for f in frames for b in f.breaks]

        def hits(name, hit):
            return sum(1 for c in caches if c["cache"] == name and c["hit"] is hit)
        return {
            "frames compiled": sum(1 for f in frames if f.done),
            "functions": len({(f.pid, f.function) for f in frames if f.done}),
            "graphs": sum(1 for f in frames for g in f.graphs if g.stage == "capture"),
            "graph breaks": len(breaks),
            "break sites": len({(b.get("where"), b["reason"]) for b in breaks}),
            "recompiles": sum(1 for f in frames if f.recompile is not None),
            "eager fallbacks": sum(len(p.eager) for p in self.processes),
            "kernels": sum(len(f.kernels) for f in frames),
            "refused fusions": sum(len(g.schedule["refused"]) for f in frames for g in f.graphs if g.schedule),
            # a frame compiled inside another is in the outer one's seconds already
            "compile seconds": sum(f.seconds - f.nested_seconds for p in self.processes for f in p.frames),
            "program cache hits": hits("graph program", True),
            "program cache misses": hits("graph program", False),
            "C++ library cache hits": hits("C++ library", True),
            "C++ library cache misses": hits("C++ library", False),
        }

    def stage_totals(self) -> dict:
        totals: dict[str, float] = {}
        for f in self.frames:
            for stage, seconds in f.stage_seconds().items():
                totals[stage] = totals.get(stage, 0.0) + seconds
        return order_stages(totals)


def order_stages(seconds: dict) -> dict:
    known = [s for s in STAGE_ORDER if s in seconds]
    return {s: seconds[s] for s in known + sorted(s for s in seconds if s not in STAGE_ORDER)}


def trace_file(path: str) -> str:
    """The event log in `path` (a KILN_TRACE folder, or the file itself)."""
    return os.path.join(path, TRACE_FILE) if os.path.isdir(path) else path


def read_run(path: str) -> Run:
    processes: dict[int, _Reader] = {}
    with open(trace_file(path)) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:      # a process killed mid-line: keep the rest
                continue
            pid = event.get("pid", 0)
            if pid not in processes:
                processes[pid] = _Reader(Process(pid))
            processes[pid].read(event)
    return Run([r.finish() for r in processes.values()])


class _Reader:
    """Folds one process's events into its `Process`, keeping a stack of frames compiling."""

    def __init__(self, process: Process):
        self.process = process
        self.open: list[FrameCompile] = []
        self.recompiles: dict[str, str] = {}      # function -> the failed guard, until it compiles
        self.compiles: dict[str, int] = {}

    def current(self) -> FrameCompile:
        if self.open:
            return self.open[-1]
        if self.process.loose is None:
            self.process.loose = FrameCompile("graphs compiled outside a kiln frame", "", 0, self.process.pid,
                                              done=True)
        return self.process.loose

    def read(self, e: dict) -> None:
        kind = e["kind"]
        handler = getattr(self, "on_" + kind, None)
        if handler is not None:
            handler(e)

    def on_process(self, e):
        self.process.argv = e.get("argv", [])

    def on_frame_start(self, e):
        name = e["function"]
        frame = FrameCompile(name, e.get("file", ""), e.get("line", 0), self.process.pid,
                             index=self.compiles.get(name, 0), recompile=self.recompiles.pop(name, None))
        self.compiles[name] = frame.index + 1
        self.process.frames.append(frame)
        self.open.append(frame)

    def on_frame(self, e):
        frame = next((f for f in reversed(self.open) if f.function == e["function"]), None)
        if frame is None:
            return
        while self.open and self.open[-1] is not frame:   # an inner frame that raised
            self.open.pop()
        self.open.pop()
        frame.done, frame.seconds, frame.source = True, e.get("seconds", 0.0), e.get("source", [])
        frame.eager = e.get("eager", False)
        if self.open:
            self.open[-1].nested_seconds += frame.seconds

    def on_guards(self, e):
        self.current().guards = e["guards"]

    def on_break(self, e):
        self.current().breaks.append(e)

    def on_split(self, e):
        self.current().splits.append(e["reason"])

    def on_recompile(self, e):
        self.recompiles[e["function"]] = e["reason"]

    def on_eager(self, e):
        self.process.eager.append(e)

    def on_graph(self, e):
        note = " ".join(f"{k}: {e[k]}" for k in ("traced_on", "saved") if e.get(k))
        self.current().graphs.append(Graph(e["stage"], e["code"], e.get("nodes", 0), e.get("ops", {}), note))

    def on_schedule(self, e):
        frame = self.current()
        target = next((g for g in reversed(frame.graphs) if g.stage != "capture" and g.schedule is None), None)
        if target is None:
            target = Graph("prims", "", 0, {})
            frame.graphs.append(target)
        target.schedule = e

    def on_stage(self, e):
        stages = self.current().stages
        stages[e["stage"]] = stages.get(e["stage"], 0.0) + e["seconds"]

    def on_backend(self, e):
        self.current().backend_seconds += e["seconds"]

    def on_cache(self, e):
        frame = self.current()
        frame.caches.append(e)
        if e["cache"] == "graph program" and e["hit"] and frame.graphs and frame.graphs[-1].stage != "capture":
            frame.graphs[-1].cached = True

    def finish(self) -> Process:
        for frame in self.process.frames:
            frame.graphs.sort(key=lambda g: GRAPH_ORDER.index(g.stage) if g.stage in GRAPH_ORDER else len(GRAPH_ORDER))
        return self.process
