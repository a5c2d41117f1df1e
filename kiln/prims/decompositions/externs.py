"""ATen ops that become extern prims: one row each, the same arguments passed through.

Matmul-like ATen ops that are not themselves externs (addmm, baddbmm, mv, dot, ...) decompose into
`mm`/`bmm` plus elementwise prims in nn.py, so a backend sees one matmul extern and fusible epilogues.
"""
from __future__ import annotations

import torch

from kiln.prims.decompositions.table import register
from kiln.prims.externs import EXTERN_OF_ATEN


def _passthrough(extern):
    def decomposition(*args, **kwargs):
        return extern(*args, **kwargs)
    decomposition.__name__ = f"extern_{extern.__name__}"
    return decomposition


for _aten, _extern in EXTERN_OF_ATEN.items():
    register(_aten)(_passthrough(_extern))
