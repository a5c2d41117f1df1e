"""A suite model's Triton kernels as the GPU would get them, planned on this machine without one:
captured and traced on CPU tensors (bf16 autocast), lowered with the Triton printer's policy,
laid out and scheduled, each kernel's launch configuration chosen by the heuristics for the real
sizes. Per kernel: programs launched, bytes it must move (every buffer argument once, at most
one element per point of its loop nest), the time
those bytes take at copy bandwidth, and that time scaled up when the grid leaves SMs idle: a
ranking of the kernels likely to be far from their floor, to look at before spending GPU time.

    python bench/plan_offline.py timm:convnext_tiny:train --batch 128 [--top 25]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math

import torch

import kiln
from kiln.bench.case import SuiteCase

COPY_BYTES_PER_US = 4.3e6     # the H200's measured copy bandwidth (bytes read + written), per microsecond
SMS = 132


@dataclasses.dataclass
class KernelPlan:
    graph: str
    name: str
    kind: str
    numels: tuple[int, ...]
    config: str
    programs: int
    bytes: int
    ir: str = dataclasses.field(repr=False, default="")

    @property
    def floor_us(self) -> float:
        return self.bytes / COPY_BYTES_PER_US

    @property
    def estimate_us(self) -> float:
        """The floor, divided by the share of SMs the grid can keep busy."""
        return self.floor_us / min(1.0, self.programs / SMS)


def _nbytes(buf) -> int:
    from kiln.codegen.host import _storage_key
    return int(_storage_key(buf)[2]) * buf.dtype.itemsize


def memory_profile(label: str, graph, steps, local: frozenset, boxed: bool) -> list[str]:
    """Bytes the host program holds step by step, under its own rule (a buffer from its first
    write to its last use; a boxed program's inputs until their last use, as [Note: boxed programs]
    frees them; outputs to the end), and what is live at the peak: the buffers to look at when a
    training peak stands above Inductor's. Extern workspaces are not counted."""
    from kiln.codegen import ir
    buffers = graph.buffer_map()
    inputs = [b for b in graph.inputs if b is not None]
    outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    born, last, writer = {}, {}, {}
    for i, step in enumerate(steps):
        if isinstance(step, ir.Kernel):
            written = {st.buffer for stage in step.stages for st in stage.body if isinstance(st, ir.Store)}
            names = list(step.buffer_args)
            what = step.name
        else:
            written = {o for o in step.outputs if o is not None}
            names = [a.name for a in torch.utils._pytree.tree_leaves((step.args, [v for _, v in step.kwargs]))
                     if isinstance(a, (ir.BufferArg, ir.ViewArg))] + list(written)
            what = str(step.op)
        for b in names:
            if b in buffers and b not in local:
                last[b] = i
                if b in written and b not in born:
                    born[b], writer[b] = i, what
    for b in inputs:
        born.setdefault(b, -1)
        writer.setdefault(b, "input")
        if not boxed or b in outputs:
            last[b] = len(steps)
    for b in outputs:
        last[b] = len(steps)
    live = [sum(_nbytes(buffers[b]) for b in born if born[b] <= i <= last.get(b, born[b])
                and (boxed or b not in inputs)) for i in range(len(steps))]
    peak = max(range(len(steps)), key=live.__getitem__)
    at = sorted((b for b in born if born[b] <= peak <= last.get(b, born[b]) and (boxed or b not in inputs)),
                key=lambda b: -_nbytes(buffers[b]))
    saved = sum(_nbytes(buffers[b]) for b in outputs if b in buffers)
    out = [f"== {label} memory: peak {live[peak] / 2**20:.0f} MB at step {peak} of {len(steps)} "
           f"({writer.get(next(iter(at), ''), '')}...), outputs {saved / 2**20:.0f} MB; live at the peak:"]
    out += [f"  {_nbytes(buffers[b]) / 2**20:8.1f} MB  {b:<12} {str(buffers[b].dtype):<15} {tuple(buffers[b].sizes)} "
            f"written by {writer[b]} at {born[b]}, last read at {last.get(b)}"
            + (" (input)" if b in inputs else "") + (" (output)" if b in outputs else "")
            for b in at[:25]]
    return out


MEMORY: list[str] = []     # memory_profile's lines, when asked for


def plan_graph(label: str, gm: torch.fx.GraphModule, example_inputs) -> list[KernelPlan]:
    from kiln.codegen import ir, triton as triton_printer
    from kiln.codegen.compile import _saved_outputs
    from kiln.codegen.dedupe import dedupe_buffers
    from kiln.codegen.layout import optimize_layouts
    from kiln.codegen.lowering import lower_graph
    from kiln.codegen.scheduler import schedule
    from kiln.codegen.triton import heuristics
    from kiln.codegen.triton.launcher import KernelSpec

    graph, _ = lower_graph(gm, example_inputs, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph), _saved_outputs(graph, gm.meta.get("kiln_user_outputs")))
    buffers = {b.name: dataclasses.replace(b, device="cuda") for b in graph.buffers}
    plans = []
    sched = schedule(graph)
    MEMORY.extend(memory_profile(label, graph, sched.steps, sched.local_buffers, boxed=label == "backward"))
    for kernel in (s for s in sched.steps if isinstance(s, ir.Kernel)):
        spec = KernelSpec.of(kernel, buffers)
        numels = tuple(int(eval(e, {})) for e in spec.numels[:-1])      # static sizes: plain ints
        xnumel, rnumel = numels[0], max(numels[1:], default=1)
        config = heuristics.choose(spec.kind, xnumel, rnumel, spec.rows_contiguous)
        points = math.prod(numels)      # a buffer is touched at most once per point of the loop nest
        moved = sum(min(math.prod(int(s) for s in buffers[b].sizes), points) * buffers[b].dtype.itemsize
                    for b in dict.fromkeys(kernel.buffer_args) if b in buffers)
        plans.append(KernelPlan(label, spec.function, spec.kind, numels, config.describe(),
                                -(-xnumel // config.XBLOCK), moved, str(kernel)))
    return plans


class _Planned(Exception):
    """Raised once both halves are planned: nothing is run."""


def plan_model(spec: str, batch: int | None) -> list[KernelPlan]:
    from kiln.aot import aot_compile, min_cut_partition
    from kiln.prims import RECOMPUTABLE_MOVEMENT, decompositions_for
    built = SuiteCase.build(spec, "cpu", batch)
    plans: list[KernelPlan] = []

    def backend(gm, example_inputs):
        def planner(label):
            def compile_one(g, inputs):
                plans.extend(plan_graph(label, g, inputs))
                return g.forward
            return compile_one
        aot_compile(gm, example_inputs, fw_compiler=planner("forward"), bw_compiler=planner("backward"),
                    decompositions=decompositions_for(set(), device_type="cuda"),
                    partition=functools.partial(min_cut_partition, recomputable_ops=RECOMPUTABLE_MOVEMENT))
        raise _Planned

    kiln.reset()
    try:
        built.step(kiln.compile(built.model, backend=backend))()
    except Exception as e:      # the planner's stop, possibly wrapped by kiln's error reporting
        if not plans:
            raise
        if not isinstance(e, _Planned) and not isinstance(e.__cause__, _Planned):
            print(f"(stopped by {type(e).__name__}: {str(e)[:120]})")
    return plans


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", help="suite:model:mode")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--show", action="append", default=[], help="print the loop IR of kernels of this name")
    p.add_argument("--memory", action="store_true", help="print each program's peak and the buffers live at it")
    a = p.parse_args()
    plans = plan_model(a.case, a.batch)
    for graph in ("forward", "backward"):
        part = [k for k in plans if k.graph == graph]
        print(f"== {graph}: {len(part)} kernels, floor {sum(k.floor_us for k in part) / 1e3:.2f} ms, "
              f"estimate {sum(k.estimate_us for k in part) / 1e3:.2f} ms")
    print(f"{'estimate us':>12} {'floor us':>9} {'programs':>8}  kernel  numels  config")
    for k in sorted(plans, key=lambda k: -k.estimate_us)[:a.top]:
        print(f"{k.estimate_us:12.1f} {k.floor_us:9.1f} {k.programs:8d}  {k.graph[:2]} {k.name}  {k.numels}  {k.config}")
    if a.memory:
        print("\n".join(MEMORY))
    for name in a.show:
        print(next((k.ir for k in plans if k.name == name), f"no kernel {name}"))


if __name__ == "__main__":
    main()
