"""The Triton interpreter switch: CPU tensors through the Triton printer, not the C++ one.

[Note: the Triton interpreter switch] `kiln.compile(..., options={"triton_interpret": True})`, or
`KILN_TRITON_INTERPRET=1` in the environment (the option's default), compiles every CPU graph with
the Triton printer: the same lowering policy as on a GPU (float16/bfloat16 kernels, split
reductions), the same scheduler, index printer, masks and block sizes, and the kernels run under
Triton's interpreter (numpy) on the CPU tensors. So the GPU code path runs end to end, forward and
backward, on a machine without one: CI fuzzes it (`python -m kiln.testing.fuzz --triton-interpret`).
What stays as on a GPU: extern calls (matmul, convolution, attention, sort) are ATen kernels, here
ATen's CPU ones. What differs: the interpreter has no libdevice (the printer refuses the few scalar
ops that need it, by name), computes float16/bfloat16 loads in float32 as compiled kernels do, but
rounds through numpy (bfloat16 is carried as float32 bits), and neither times nor autotunes.
Programs so compiled bypass the warm-start and program caches (`compile_prim_graph` keeps a chosen
printer out of them), so a C++ program is never loaded for a Triton one, nor the reverse.
CUDA tensors are unaffected: they take the Triton printer compiled for the GPU either way.
"""
from __future__ import annotations

from kiln.config import Options


def printer_for(options: Options, on_cuda: bool):
    """The printer module a graph is compiled with instead of its device's own, or None."""
    if on_cuda or not options.triton_interpret:
        return None
    from kiln.codegen import triton as triton_printer
    return triton_printer
