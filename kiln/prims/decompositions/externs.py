"""ATen ops that become extern prims: one row each, the same arguments passed through.

`addmm` and `baddbmm` stay externs: eager's cuBLAS / MKL call adds the bias before rounding the
product, and `mm` then `add` rounds twice. In bfloat16 that moved a quarter of GPT-NeoX's linear
outputs by one step in every layer, and generate() picked other tokens at near ties. Other
matmul-like ops (addbmm, mv, dot, ...) decompose into `mm`/`bmm` plus elementwise prims in nn.py.
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
