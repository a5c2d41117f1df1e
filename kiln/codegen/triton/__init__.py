"""kiln's Triton code generator: loop-IR kernels to Triton source, and source to launchable kernels.

- `printer.print_kernel(kernel, buffers) -> str`: the source of one fused kernel (`ops` holds the
  scalar-op table, `index` the sympy index printer, `reductions` the reduction/scan bodies);
- `print_module(kernels, buffers) -> str`: every kernel's source, for logs;
- `launcher.build(kernels, buffers) -> {name: TritonKernel}`: the printer interface the host
  program calls (`kiln.codegen.ir`'s docstring);
- `heuristics`: block sizes per launch, `autotune`: max-autotune's timed choice, cached on disk;
- `matmul`: the matmul template's kernels, and `matmul_configs(m, n, k, dtype)`, the tilings it
  offers: a printer with `matmul_configs` gets max-autotune's products as templates
  ([Note: matmul templates] in kiln/codegen/matmul_templates.py), and `matmul_autotune.tune_matmuls`,
  which times the extern against each tiling on the device and keeps the fastest ([Note: matmul
  autotuning]); `default_matmul_configs(m, n, k, dtype)`, the tilings used without max-autotune
  (the GEMV form's for decoding's products, [Note: GEMV by default] in heuristics.py, else none),
  and `default_sibling_gemv_config(m, ns, k, dtype)`, the tiling of products of one A computed as
  one GEMV kernel without max-autotune ([Note: sibling GEMVs] in kiln/codegen/matmul_templates.py);
- `conv`: the convolution template's kernels (2-D convolutions as implicit GEMMs, offered under
  max-autotune with the `matmul_configs` of their per-tap product and timed with the products:
  [Note: convolution templates] in kiln/codegen/conv_templates.py);
- `attention`: the attention template's kernels, and `attention_configs(lq, lk, d, dtype)`, what it
  offers decoding's attention ([Note: decode attention] in kiln/codegen/attention_templates.py);
- `source_cache`: sources on disk by hash, loaded interpreted (CPU tensors) or compiled (CUDA);
- `binaries`: a static kernel's compiled binary found again on a warm start, without Triton's JIT;
- `offline`: compile a kernel's CUDA text for sm_90 without a GPU (PTX, registers, spills);
  `python -m kiln.bench.bandwidth` (GB/s of memory-bound kernels on a GPU) and
  `kiln.bench.bandwidth_offline` (their kernels for sm_90) run them on whole programs;
- `op_sweep.md`: the op sweep through Triton kernels (tests/codegen/test_triton_sweep.py).
"""
import torch

from kiln.codegen.lowering import KERNEL_DTYPES as _COMMON_DTYPES
from kiln.codegen.triton.attention import attention_configs
from kiln.codegen.triton.heuristics import default_matmul_configs, default_sibling_gemv_config, matmul_configs
from kiln.codegen.triton.launcher import TritonKernel, build, restore, saved
from kiln.codegen.triton.matmul_autotune import tune_matmuls
from kiln.codegen.triton.printer import print_kernel, print_module

# The host program passes tensors (Triton takes them as pointers itself), not data_ptr() ints.
TAKES_POINTERS = False

# The dtype policy: float16/bfloat16 buffers are loaded, computed in float32 and rounded on store
# (and at each explicit conversion), as Inductor does; so under bf16 autocast the casts, fills,
# views, pads and reductions between the matmuls and convolutions are kernels, not ATen calls.
KERNEL_DTYPES = _COMMON_DTYPES | {torch.float16, torch.bfloat16}

# Reductions with few outputs are split in two passes, so they run on more than a few programs
# ([Note: split reductions] in kiln.codegen.lowering); C++ kernels need no such thing on 2 cores.
SPLIT_REDUCTIONS = True

__all__ = ["attention_configs", "KERNEL_DTYPES", "SPLIT_REDUCTIONS", "TAKES_POINTERS", "TritonKernel", "build",
           "default_matmul_configs", "default_sibling_gemv_config", "matmul_configs",
           "print_kernel", "print_module", "restore", "saved", "tune_matmuls"]
