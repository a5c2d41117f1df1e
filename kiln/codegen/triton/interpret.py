"""The Triton interpreter switch: CPU tensors through the Triton printer, not the C++ one.

[Note: the Triton interpreter switch] `kiln.compile(..., options={"triton_interpret": True})`, or
`KILN_TRITON_INTERPRET=1` in the environment (the option's default), compiles every CPU graph with
the Triton printer: the same lowering policy as on a GPU (float16/bfloat16 kernels, split
reductions), the same scheduler, index printer, masks and block sizes, and the kernels run under
Triton's interpreter (numpy) on the CPU tensors. So the GPU code path runs end to end, forward and
backward, on a machine without one: CI fuzzes it (`python -m kiln.testing.fuzz --triton-interpret`).
What stays as on a GPU: extern calls (matmul, convolution, attention, sort) are ATen kernels, here
ATen's CPU ones. float16/bfloat16 are loaded, computed in float32 and rounded on store as on a GPU
(numpy rounds float16 to nearest even itself; bfloat16's rounding is kiln's own bit arithmetic,
`_k_to_bf16`, since the interpreter's cast truncates). What differs: the interpreter has no
libdevice, so the scalar ops that need it have formulas of their own in `ops.py` (atan2, erf,
tanh, ...: not the GPU's bits) and erfinv, lgamma and nextafter are refused by name at print time;
it runs numpy per block (slow: for tests, not speed) and neither times nor autotunes; an address
out of bounds reads host memory (garbage, or SIGSEGV) where a GPU would fault (a gather's or
scatter's index out of range is checked, and its device_assert raises: the launcher turns the
interpreter's asserts on for those kernels, [Note: index bounds checks]).
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
