"""Printed Triton kernels to callables the host program launches.

`build(kernels, buffers)` prints each kernel, loads its source through the on-disk cache, and
returns `{kernel.name: TritonKernel}`. A `TritonKernel` is called as the loop IR's printer
interface says: `fn(*tensors_for(kernel.buffer_args), *ints_for(kernel.size_args))`. Per call it
evaluates `xnumel`/`rnumel`s from the size ints, picks a `LaunchConfig` (the heuristic, or the
autotuner's choice under max-autotune; memoized per sizes), picks the persistent or looped
function, and launches it on a 1-D grid of `ceil(xnumel / XBLOCK)` programs.

CUDA kernels compile on first launch (Triton caches the binaries on disk); `build(...,
workers=N)` prints and loads sources in parallel threads.
"""
from __future__ import annotations

import concurrent.futures
import weakref
from typing import Callable, Mapping, Sequence

import sympy
import torch

from kiln.codegen import ir
from kiln.codegen.triton import heuristics
from kiln.codegen.triton.heuristics import LaunchConfig
from kiln.codegen.triton.printer import KernelLayout, layout_of, print_kernel
from kiln.codegen.triton.source_cache import load_module, source_path


def _numel_function(layout: KernelLayout) -> Callable[..., tuple[int, ...]]:
    """A Python function from size ints to (xnumel, *rnumels), printed once from sympy."""
    args = [s.name for s in layout.size_args]
    exprs = [layout.xnumel, *layout.rnumels]
    body = ", ".join(_py(e) for e in exprs)
    text = f"def numels({', '.join(args)}):\n    return ({body},)\n"
    scope: dict = {}
    exec(compile(text, f"<kiln numels of {layout.name}>", "exec"), scope)
    return scope["numels"]


def _py(e) -> str:
    e = sympy.sympify(e)
    if e.free_symbols:
        return f"int({sympy.pycode(e)})"
    return str(int(e))


# Every kernel built in this process, for diagnostics (`bandwidth` lists their launch configs).
BUILT: "weakref.WeakSet[TritonKernel]" = weakref.WeakSet()


class TritonKernel:
    """One printed kernel, callable as `kernel(*tensors, *size_ints)`."""

    def __init__(self, kernel: ir.Kernel, source: str, interpret: bool, autotune: bool = False):
        self.kernel = kernel
        self.source = source
        self.interpret = interpret
        self.layout = layout_of(kernel)
        self.path = source_path(source)
        module = load_module(source, interpret)
        self.persistent_fn = getattr(module, self.layout.name)
        self.looped_fn = getattr(module, f"{self.layout.name}_looped", None)
        self.numels = _numel_function(self.layout)
        self.n_buffers = len(kernel.buffer_args)
        self.autotune = autotune
        self.configs: dict[tuple, LaunchConfig] = {}
        BUILT.add(self)

    def __repr__(self):
        return f"TritonKernel({self.layout.name}, {self.layout.kind}, source={self.path})"

    def config_for(self, numels: tuple[int, ...], args: Sequence) -> LaunchConfig:
        config = self.configs.get(numels)
        if config is None:
            xnumel, rnumel = numels[0], max(numels[1:], default=1)
            if self.autotune and not self.interpret:
                from kiln.codegen.triton.autotune import tune
                config = tune(self, numels, args)
            else:
                config = heuristics.choose(self.layout.kind, xnumel, rnumel, self.layout.rows_contiguous)
            self.configs[numels] = config
        return config

    def launch(self, config: LaunchConfig, args: Sequence, numels: tuple[int, ...]) -> None:
        xnumel = numels[0]
        rnumel = max(numels[1:], default=1)
        persistent = self.looped_fn is None or (config.persistent and config.RBLOCK >= rnumel)
        fn = self.persistent_fn if persistent else self.looped_fn
        grid = ((xnumel + config.XBLOCK - 1) // config.XBLOCK,)
        fn[grid](*args, *numels, XBLOCK=config.XBLOCK, RBLOCK=config.RBLOCK,
                 num_warps=config.num_warps, num_stages=config.num_stages)

    def __call__(self, *args):
        sizes = args[self.n_buffers:]
        numels = tuple(self.numels(*sizes))
        if numels[0] == 0:
            return
        self.launch(self.config_for(numels, args), args, numels)


def interpret_for(kernel: ir.Kernel, buffers: Mapping[str, ir.Buffer]) -> bool:
    """CPU buffers run under Triton's interpreter; CUDA buffers compile for the GPU."""
    return not any(str(buffers[b].device).startswith("cuda") for b in kernel.buffer_args if b in buffers)


def build(kernels: Sequence[ir.Kernel], buffers: Mapping[str, ir.Buffer], autotune: bool = False,
          workers: int = 1) -> dict[str, TritonKernel]:
    """Print and load every kernel; the printer interface of `kiln.codegen.ir`."""

    def one(kernel: ir.Kernel) -> TritonKernel:
        interpret = interpret_for(kernel, buffers)
        return TritonKernel(kernel, print_kernel(kernel, buffers, interpret), interpret, autotune)

    if workers > 1 and len(kernels) > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            built = list(pool.map(one, kernels))
    else:
        built = [one(k) for k in kernels]
    return {k.name: b for k, b in zip(kernels, built)}
