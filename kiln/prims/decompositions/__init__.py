"""ATen -> prims decompositions; importing this package fills `DECOMPOSITIONS` (see table.py)."""
from kiln.prims.decompositions.table import DECOMPOSITIONS, add_inplace_rows, decompositions_for, register
from kiln.prims.decompositions import (elementwise, shapes, reductions, indexing, nn, normalization,  # noqa: F401
                                       losses, pooling, resampling, structured, externs)  # (each adds its rows)

add_inplace_rows()

__all__ = ["DECOMPOSITIONS", "decompositions_for", "register"]
