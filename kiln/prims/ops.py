"""`ops`: the prims as attributes (`ops.add(a, b)`), for writing decompositions that read like math."""
from __future__ import annotations

import types

from kiln.prims import elementwise, externs, indexing, reductions, views  # noqa: F401  (registers prims)
from kiln.prims.prim import PRIMS

ops = types.SimpleNamespace(**{name: prim.op for name, prim in PRIMS.items()})
