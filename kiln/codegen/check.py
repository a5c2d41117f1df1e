"""Which kernel computes a wrong value: every buffer a kernel writes, checked against the graph run eagerly.

`KILN_CHECK=kernels` compiles each prim graph with probes (`plan_host(probe=True)`) and, on every
call, runs the same graph as FX Python on the same inputs (the prims' reference kernels, that is
eager ATen). Each buffer a kernel wrote that holds one graph node's value (`ir.Graph.origins`) is
compared with that node's eager value; mismatches are printed to stderr in program order, each with
its kernel's name, the node and the kernel's source file, and the first is what to look at: a later
one may only inherit its error. It costs an eager run and a comparison per buffer: a debugging
tool, not a mode to run a model in.

The tolerance is loose on purpose (kernels compute half types in float32 and round once, eager
rounds after every op): a buffer is reported when its error exceeds 1% of its largest magnitude
plus 1e-3, which a wrong index, mask or op exceeds by far.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class Mismatch:
    kernel: str
    buffer: str
    node: str
    max_abs_diff: float
    ref_max_abs: float
    source: str | None

    producers: str = ""     # the graph lines computing the node, a few levels up

    def __str__(self):
        where = f" (source {self.source})" if self.source else ""
        return (f"kernel {self.kernel} wrote {self.buffer} = node {self.node}: max |diff| {self.max_abs_diff:.4g} "
                f"where max |eager| is {self.ref_max_abs:.4g}{where}")


def producers(node: torch.fx.Node, depth: int = 4) -> str:
    """The graph lines that compute `node`, `depth` levels up, in graph order."""
    seen, frontier = {node}, [node]
    for _ in range(depth):
        frontier = [a for n in frontier for a in n.all_input_nodes if a not in seen]
        seen.update(frontier)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return "\n".join(n.format_node() for n in sorted(seen, key=order.get))


def enabled() -> bool:
    import os
    return "kernels" in os.environ.get("KILN_CHECK", "").split(",")


def checked(call, gm: torch.fx.GraphModule, origins: dict[str, str], kernels: dict, report=None):
    """Wrap a probed program `call` (its globals hold `_probe`) so each call checks its buffers
    against `gm` run eagerly; mismatches go to `report` (default: stderr)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    found: list[Mismatch] = []
    state: dict[str, Any] = {}

    def probe(kernel: str, buffer: str, value: torch.Tensor) -> None:
        node = origins.get(buffer)
        ref = state["values"].get(nodes[node]) if node in nodes else None
        if not isinstance(ref, torch.Tensor) or ref.shape != value.shape or ref.is_complex():
            return
        got, want = value.detach().double(), ref.detach().double()
        finite = torch.isfinite(want)
        if not torch.equal(finite, torch.isfinite(got)) and not ref.dtype == torch.bool:
            diff, scale = float("inf"), float(want[finite].abs().max()) if finite.any() else 0.0
        else:
            delta = (got - want).abs()[finite]
            diff = float(delta.max()) if delta.numel() else 0.0
            scale = float(want[finite].abs().max()) if finite.any() else 0.0
        if diff > 0.01 * scale + 1e-3:
            fn = kernels.get(kernel)
            found.append(Mismatch(kernel, buffer, node, diff, scale, getattr(fn, "path", None),
                                  producers(nodes[node]) if not found else ""))

    call.__globals__["_probe"] = probe

    def run(*args):
        # on copies: a graph may write its inputs (copy_ epilogues), and the program must see them unwritten
        state["values"] = _node_values(gm, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        found.clear()
        out = call(*args)
        if found:
            lines = [f"[kiln check] {len(found)} buffers differ from eager; the first is the one to look at:"]
            lines += [f"  {m}" for m in found]
            lines += ["the graph computing the first:", found[0].producers]
            print("\n".join(lines), file=report or sys.stderr)
        run.mismatches = list(found)
        return out

    run.mismatches = []
    run.program = call
    return run


def _node_values(gm: torch.fx.GraphModule, args: Sequence[Any]) -> dict:
    """Every node's value when `gm` runs eagerly on `args`."""
    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.no_grad():
        Recorder(gm).run(*args)
    return values
