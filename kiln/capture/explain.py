"""`kiln.explain`: run a function under capture and report what happened.

The report lists each graph (printed), each graph break with its reason and the user's
`file:line`, each recompile with the guard that failed, and the guards of every entry.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from kiln.capture import frame
from kiln.capture.distributed import rank_dependent
from kiln.config import CaptureConfig


@dataclasses.dataclass
class ExplainReport:
    graphs: list[torch.fx.GraphModule]
    breaks: list[frame.Event]
    recompiles: list[frame.Event]
    guards: list[str]
    output: Any
    splits: list[frame.Event] = dataclasses.field(default_factory=list)   # graphs cut at DDP's buckets
    rank_guards: list[str] = dataclasses.field(default_factory=list)      # [Note: rank-dependent values]

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    def __str__(self) -> str:
        lines = [f"graphs: {self.graph_count}, graph breaks: {self.break_count}, recompiles: {len(self.recompiles)}"]
        for i, b in enumerate(self.breaks):
            lines.append(f"  break {i}: {b.detail}" + (f"  (at {b.where})" if b.where else ""))
        for r in self.recompiles:
            lines.append(f"  recompile of {r.function}: guard failed: {r.detail}")
        for s in self.splits:
            lines.append(f"  {s.function}: {s.detail.describe()}")
        if self.rank_guards:
            lines.append("guards that differ between ranks (each rank compiles its own graph):")
            lines += [f"  {g}" for g in self.rank_guards]
        for i, gm in enumerate(self.graphs):
            lines.append(f"graph {i}:")
            lines.append(gm.code.strip())
        lines.append("guards:")
        lines += [f"  {g}" for g in self.guards]
        return "\n".join(lines)

    # dict-style access, as the stopgap offered
    def __getitem__(self, key):
        return {"graphs": self.graphs, "graph_count": self.graph_count, "graph_breaks": self.break_count,
                "breaks": self.breaks, "recompiles": self.recompiles, "guards": self.guards,
                "output": self.output, "splits": self.splits, "rank_guards": self.rank_guards}[key]


def explain(fn: Callable, *args, **kwargs) -> ExplainReport:
    events: list[frame.Event] = []

    def recording_backend(gm, example_inputs):  # one per report: its wrappers are this report's
        return gm.forward

    frame._EVENT_SINKS.append(events)
    try:
        compiled = frame.capture(fn, recording_backend, CaptureConfig())
        output = compiled(*args, **kwargs)
    finally:
        frame._EVENT_SINKS.remove(events)
    wrappers = [w for w in list(frame._ALL_WRAPPERS) if w.backend is recording_backend]
    all_guards = [g for w in wrappers for e in w.entries for g in e.guards]
    return ExplainReport(
        graphs=[e.detail for e in events if e.kind == "graph"],
        breaks=[e for e in events if e.kind in ("break", "eager")],
        recompiles=[e for e in events if e.kind == "recompile"],
        guards=sorted({g.describe() for g in all_guards}), output=output,
        splits=[e for e in events if e.kind == "split"],
        rank_guards=sorted({g.describe() for g in all_guards if rank_dependent(g)}))

