"""The bandwidth programs' Triton kernels compiled for an H100 (sm_90) on a machine without a GPU.

    python -m kiln.bench.bandwidth_offline   # each kernel's launch config, registers, spills, memory ops

The programs of `kiln.bench.bandwidth` go through aot, the prims and codegen's lowering and
scheduler on CPU; their kernels, relabelled CUDA, are compiled by `kiln.codegen.triton.offline`.
"""
from __future__ import annotations

import dataclasses

import torch

from kiln.codegen import ir
from kiln.codegen.triton.offline import compile_for_gpu


def bandwidth_kernels(n: int):
    """The bandwidth programs (see `kiln.bench.bandwidth`), lowered and scheduled on CPU, relabelled CUDA."""
    import torch.nn.functional as F

    from kiln.aot import aot_compile
    from kiln.codegen.lowering import lower_graph
    from kiln.codegen.scheduler import schedule
    from kiln.prims import decompositions_for

    weight, bias = torch.randn(n), torch.randn(n)
    programs = {"gelu chain": lambda x: F.gelu(x * 1.5 + 0.5) * torch.sigmoid(x),
                "softmax": lambda x: torch.softmax(x, -1),
                "layer_norm": lambda x: F.layer_norm(x, (n,), weight, bias, 1e-5)}
    found = {}
    for name, fn in programs.items():
        def capture(gm, example_inputs, name=name):
            graph, _ = lower_graph(gm, example_inputs)
            sched = schedule(graph)
            buffers = {b.name: dataclasses.replace(b, device="cuda") for b in graph.buffers}
            found[name] = ([s for s in sched.steps if isinstance(s, ir.Kernel)], buffers)
            return lambda *a: None
        x = torch.randn(64, n)     # lowering needs only metadata; 64 rows keep tracing cheap
        with torch.no_grad():
            aot_compile(torch.fx.symbolic_trace(fn), [x], fw_compiler=capture, bw_compiler=capture,
                        decompositions=decompositions_for(set(), device_type="cuda"))
    return found


def main() -> None:
    n = 8192
    for name, (kernels, buffers) in bandwidth_kernels(n).items():
        for kernel in kernels:
            build = compile_for_gpu(kernel, buffers, [n] * len(kernel.size_args))
            print(f"{name:<11} {kernel.name}: {build.function} {build.config.describe()} regs={build.registers} "
                  f"spills={build.spill_bytes} memory ops={sorted(build.memory_ops())}")


if __name__ == "__main__":
    main()
