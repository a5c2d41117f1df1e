"""Compile a printed kernel for an NVIDIA GPU without one, and read what the machine code does.

Triton's wheel carries its NVIDIA backend and `ptxas`, so a kernel's CUDA source compiles to PTX
and SASS on any Linux machine. This is how CI checks the GPU text of the printer (which the
interpreter never runs: libdevice helpers, int32 index math) and the properties copy bandwidth
depends on: 128-bit vector loads and stores, and no register spills in a persistent reduction.
The argument specialization mirrors Triton's launcher: pointers and ints divisible by 16 get
divisibility hints, ints equal to 1 become constants, except the ints the kernel's decorator leaves
unspecialized.

    python -m kiln.bench.bandwidth_offline   # the bandwidth programs' kernels at 8192 x 8192

Hands on: `compile_for_gpu(kernel, buffers, sizes, arch=90) -> GpuBuild`.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from typing import Mapping, Sequence

import torch

from kiln.codegen import ir
from kiln.codegen.triton import heuristics
from kiln.codegen.triton.launcher import _extent, _sizes_function
from kiln.codegen.triton.libdevice import link_options
from kiln.codegen.triton.printer import canonical, layout_of, print_kernel
from kiln.codegen.triton.source_cache import load_module

POINTER_TYPE = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float64: "*fp64",
                torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8",
                torch.uint8: "*u8", torch.bool: "*i1"}


@dataclasses.dataclass(frozen=True)
class GpuBuild:
    function: str                  # the printed function compiled (persistent or looped)
    config: heuristics.LaunchConfig
    ptx: str
    registers: int | None          # per thread, from ptxas -v
    spill_bytes: int | None        # spill stores, from ptxas -v

    def memory_ops(self) -> set[str]:
        return set(re.findall(r"(?:ld|st)\.global(?:\.\w+)*", self.ptx))

    @property
    def vector_loads(self) -> bool:
        return any(op.startswith("ld.global") and ".v4" in op for op in self.memory_ops())

    @property
    def vector_stores(self) -> bool:
        return any(op.startswith("st.global") and ".v4" in op for op in self.memory_ops())

    @property
    def scalar_loads(self) -> bool:
        """Global loads of one 32-bit value (a broadcast or strided access, or a missed vector)."""
        return any(op.startswith("ld.global") and ".v" not in op for op in self.memory_ops())


def _ptxas_report(ptx: str, arch: int) -> tuple[int | None, int | None]:
    import triton.backends.nvidia as nvidia
    ptxas = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")
    if not os.path.exists(ptxas):
        return None, None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        suffix = "a" if arch >= 90 else ""
        done = subprocess.run([ptxas, f"-arch=sm_{arch}{suffix}", "-v", path, "-o", os.path.join(d, "k.cubin")],
                              capture_output=True, text=True)
    text = done.stdout + done.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores", text)
    return (int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else None)


def compile_for_gpu(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer], sizes: Sequence[int],
                    arch: int = 90, config: heuristics.LaunchConfig | None = None) -> GpuBuild:
    """Compile `kernel`'s CUDA text as a launch with these size ints would, for sm_`arch`."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    layout = layout_of(kernel)
    *numels, extent = _sizes_function(layout, _extent(kernel, buffers))(*sizes)
    module = load_module(print_kernel(kernel, buffers, interpret=False), interpret=False)
    rnumel = max(numels[1:], default=1)
    if config is None:
        config = heuristics.pin_row_threads(heuristics.choose(layout.kind, numels[0], rnumel, layout.rows_contiguous),
                                            rnumel, getattr(module, "ROW_THREADS", None))
    persistent = layout.kind == "pointwise" or (config.persistent and config.RBLOCK >= rnumel)
    printed, printed_buffers = canonical(kernel, buffers)   # the function and parameter names the source has
    name = printed.name if persistent else f"{printed.name}_looped"
    signature, constexprs, attrs = {}, {}, {}
    ints = list(sizes) + list(numels)
    int_names = [s.name for s in kernel.size_args] + ["xnumel"] + [f"rnumel{g}" for g in range(len(numels) - 1)]
    position = 0
    for b in printed.buffer_args:
        signature[f"p_{b}"] = POINTER_TYPE[printed_buffers[b].dtype]
        attrs[(position,)] = [["tt.divisibility", 16]]
        position += 1
    fn = getattr(module, name)
    params = fn.arg_names
    loose = {p.name for p in fn.params if p.do_not_specialize}   # [Note: symbolic sizes are not specialized]
    for value, param in zip(ints, params[position:]):
        if param in loose:
            signature[param] = "i64" if abs(value) >= 2 ** 31 else "i32"
        elif value == 1:
            signature[param] = "constexpr"
            constexprs[param] = 1
        else:
            signature[param] = "i64" if abs(value) >= 2 ** 31 else "i32"
            if value % 16 == 0:
                attrs[(position,)] = [["tt.divisibility", 16]]
        position += 1
    index_dtype = tl.int64 if extent >= 2 ** 31 else tl.int32
    for param, value in (("XBLOCK", config.XBLOCK), ("RBLOCK", config.RBLOCK), ("INDEX_DTYPE", index_dtype)):
        signature[param] = "constexpr"
        constexprs[param] = value
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages,
                                       **link_options()})
    ptx = compiled.asm["ptx"]
    registers, spills = _ptxas_report(ptx, arch)
    return GpuBuild(name, config, ptx, registers, spills)
