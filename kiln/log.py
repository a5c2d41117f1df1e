"""`KILN_LOG`: what kiln prints about its work, and where a compile spends its time.

`KILN_LOG` is a comma-separated list of topics (`graphs,guards,breaks,recompiles,kernels,perf`);
`enabled(topic)` asks for one, `emit(topic, title, text)` prints under it. `KILN_LOG=off` also
silences the progress line ([Note: progress line]).

[Note: compile stages] Every stage of a compile times itself with `stage(name)`, the one timing
helper, and `frame(name)` wraps one compiled frame (capture to loaded program). Stages nest, and
each second is counted once, in the innermost stage running (a decomposition inside the aot trace
counts as "decompose", not as "aot trace"); time inside a frame that no stage claims is "other".
Under `KILN_LOG=perf` each frame prints one line: its stages in pipeline order and the programs
it found in the warm-start cache; `totals()` sums every stage over the process (bench). The
stage names are `STAGES`; a stage not listed there prints after them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Iterator
from kiln import trace

STAGES = ("import", "capture", "guards", "aot trace", "decompose", "functionalize", "partition", "cache key",
          "cache load", "lower", "dedupe", "layouts", "schedule", "host program", "print", "compile",
          "load", "first launch", "other")


def enabled(topic: str) -> bool:
    return topic in os.environ.get("KILN_LOG", "").split(",")


def emit(topic: str, title: str, text: str = "") -> None:
    if enabled(topic):
        print(f"[kiln {topic}] {title}" + (f"\n{text}" if text else ""), file=sys.stderr)


@dataclasses.dataclass
class Frame:
    """The stages of one compiled frame, in seconds, and what the cache answered."""

    name: str
    start: float
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    stage: str = ""                        # the innermost stage running (the progress line)

    def summary(self, total: float) -> str:
        other = total - sum(self.seconds.values())
        seconds = {**self.seconds, "other": self.seconds.get("other", 0.0) + max(other, 0.0)}
        order = [s for s in STAGES if s in seconds] + sorted(s for s in seconds if s not in STAGES)
        parts = ", ".join(f"{s} {seconds[s]:.2f}" for s in order)
        counts = "".join(f"; {n} {k}" for k, n in sorted(self.counts.items()))
        return f"frame {self.name}: {total:.2f} s ({parts}){counts}"


@dataclasses.dataclass
class _Running:
    name: str
    start: float
    children: float = 0.0


class _State(threading.local):
    def __init__(self):
        self.frames: list[Frame] = []
        self.stages: list[_Running] = []


_STATE = _State()
_LOCK = threading.Lock()
_TOTALS: dict[str, float] = {}
ACTIVE: list[Frame] = []                   # frames compiling now, any thread (the progress line)


def _add(name: str, seconds: float) -> None:
    if _STATE.frames:
        frame = _STATE.frames[-1]
        frame.seconds[name] = frame.seconds.get(name, 0.0) + seconds
    with _LOCK:
        _TOTALS[name] = _TOTALS.get(name, 0.0) + seconds


@contextlib.contextmanager
def stage(name: str) -> Iterator[_Running]:
    """Time a stage of compilation (see [Note: compile stages]); the yielded record's `name` may
    be changed before the stage ends (a build that found its library cached was a load)."""
    running = _Running(name, time.perf_counter())
    outer = _STATE.stages[-1] if _STATE.stages else None
    frame = _STATE.frames[-1] if _STATE.frames else None
    if frame is not None:
        frame.stage = name
    _STATE.stages.append(running)
    try:
        yield running
    finally:
        _STATE.stages.pop()
        elapsed = time.perf_counter() - running.start
        if outer is not None:
            outer.children += elapsed
        if frame is not None:
            frame.stage = outer.name if outer is not None else ""
        _add(running.name, elapsed - running.children)
        trace.emit("stage", stage=running.name, seconds=round(elapsed, 6))   # KILN_TRACE's report


def count(what: str, n: int = 1) -> None:
    """Count an event of the current frame ("programs from the cache", "kernels compiled")."""
    if _STATE.frames:
        frame = _STATE.frames[-1]
        frame.counts[what] = frame.counts.get(what, 0) + n


def current() -> Frame | None:
    return _STATE.frames[-1] if _STATE.frames else None


@contextlib.contextmanager
def frame(name: str) -> Iterator[Frame]:
    """One compiled frame: its stages are collected, and printed under KILN_LOG=perf."""
    record = Frame(name, time.perf_counter())
    _STATE.frames.append(record)
    # a frame compiled while another compiles (a nested function) is not the outer's time
    saved_stages, _STATE.stages = _STATE.stages, []
    with _LOCK:
        ACTIVE.append(record)
    _start_progress()
    try:
        yield record
    finally:
        with _LOCK:
            ACTIVE.remove(record)
        if _PROGRESS and _PROGRESS[0].shown:     # erase the line before anything else prints
            _PROGRESS[0].shown = False
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        _STATE.stages = saved_stages
        _STATE.frames.pop()
        total = time.perf_counter() - record.start
        unclaimed = total - sum(record.seconds.values())
        if unclaimed > 0:
            with _LOCK:
                _TOTALS["other"] = _TOTALS.get("other", 0.0) + unclaimed
        if saved_stages:
            saved_stages[-1].children += total
        emit("perf", record.summary(total))


PROGRESS_AFTER_S = 3.0      # a compile shorter than this never shows the line
PROGRESS_EVERY_S = 0.5


def progress_line(frame: Frame, now: float) -> str:
    """[Note: progress line] While a frame has compiled for more than PROGRESS_AFTER_S, stderr
    shows one line, rewritten in place: the frame, the stage running, the kernels loaded of those
    scheduled so far, and the seconds. It is off when stderr is not a terminal (logs, CI) or
    KILN_LOG=off, and erased when the compile ends."""
    kernels = frame.counts.get("kernels", 0)
    done = f", {frame.counts.get('kernels compiled', 0)}/{kernels} kernels compiled" if kernels else ""
    return f"[kiln] compiling {frame.name}: {frame.stage or 'other'}{done}, {now - frame.start:.0f} s"


def _progress_wanted() -> bool:
    return "off" not in os.environ.get("KILN_LOG", "").split(",") and sys.stderr.isatty()


class _Progress(threading.Thread):
    """The one thread that draws the progress line; started by the first frame that may need it."""

    def __init__(self):
        super().__init__(name="kiln-progress", daemon=True)
        self.shown = False
        self.wake = threading.Event()

    def run(self):
        while True:
            self.wake.wait(PROGRESS_EVERY_S)
            self.wake.clear()
            with _LOCK:
                frame = ACTIVE[0] if ACTIVE else None
            now = time.perf_counter()
            if frame is not None and now - frame.start >= PROGRESS_AFTER_S and _progress_wanted():
                sys.stderr.write("\r\x1b[K" + progress_line(frame, now))
                sys.stderr.flush()
                self.shown = True
            elif frame is None and self.shown:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
                self.shown = False


_PROGRESS: list[_Progress] = []


def _start_progress() -> None:
    with _LOCK:
        if not _PROGRESS and _progress_wanted():
            _PROGRESS.append(_Progress())
            _PROGRESS[0].start()
        elif _PROGRESS:
            _PROGRESS[0].wake.set()


def totals() -> dict[str, float]:
    """Seconds per stage over every compile of this process so far."""
    with _LOCK:
        return dict(_TOTALS)
