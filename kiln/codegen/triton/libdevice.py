"""The libdevice kiln's CUDA kernels link: the CUDA toolkit's of torch's own CUDA version, if installed.

[Note: libdevice] Eager's CUDA kernels compute erff, expf, tanhf, ... with the math library of the
CUDA release torch was built with. Triton links the copy of libdevice it bundles, which can be of
another release with other polynomials: on the H200 (torch 2.11+cu130, Triton 3.6) Triton's erf
differed from torch.erf by an ulp in 551,546 of 4M float32 values, and gelu's bfloat16 results in
58,395; linked against CUDA 13.0's own libdevice, none differed (`bench/erf_probe.py`,
bench/results/diagnostics/20261201-142500_cuda_erf.md). One ulp of erf near -1 is a large relative error of
`1 + erf(x)`, so gelu's differences survive rounding to bfloat16 and change a model's tokens.

`link_options()` is what every Triton compile of kiln passes: `extern_libs` naming the libdevice of
the toolkit whose version equals `torch.version.cuda`, or nothing (Triton's own copy) when no such
toolkit is found, or when the user chose one with Triton's `TRITON_LIBDEVICE_PATH`.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import re

import torch

_RELATIVE = os.path.join("nvvm", "libdevice", "libdevice.10.bc")


def _toolkit_version(root: str) -> str | None:
    """"13.0" from a toolkit's version.json (CUDA 11.1 and later), else from a `cuda-13.0` name."""
    try:
        with open(os.path.join(root, "version.json")) as f:
            full = json.load(f)["cuda"]["version"]
        return ".".join(full.split(".")[:2])
    except (OSError, KeyError, ValueError, TypeError):
        pass
    m = re.search(r"cuda-(\d+\.\d+)$", os.path.realpath(root))
    return m.group(1) if m else None


def _pip_roots() -> list[tuple[str, str | None]]:
    """The nvcc pip packages (`nvidia-cuda-nvcc-cu12`, `nvidia-cuda-nvcc`) with their versions."""
    from importlib import metadata
    roots = []
    for dist in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc-cu13", "nvidia-cuda-nvcc"):
        try:
            d = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        version = ".".join(d.version.split(".")[:2])
        for f in d.files or ():
            if str(f).endswith(_RELATIVE.replace(os.sep, "/")):
                roots.append((str(d.locate_file(f))[: -len(_RELATIVE)], version))
    return roots


def find(cuda_version: str | None = None) -> str | None:
    """The path of the libdevice of CUDA `cuda_version` ("13.0"; default torch's), or None."""
    want = cuda_version or torch.version.cuda
    if not want:
        return None
    want = ".".join(want.split(".")[:2])
    candidates = [(os.environ[v], None) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    candidates += [(r, None) for r in ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]]
    candidates += _pip_roots()
    for root, version in candidates:
        path = os.path.join(root, _RELATIVE)
        if os.path.isfile(path) and (version or _toolkit_version(root)) == want:
            return path
    return None


@functools.cache
def link_options() -> dict:
    """Keyword options for Triton's compile: `{"extern_libs": ...}` or `{}` (see the note)."""
    if os.environ.get("TRITON_LIBDEVICE_PATH"):
        return {}
    path = find()
    return {"extern_libs": (("libdevice", path),)} if path else {}
