"""ATen -> prims decompositions; importing this package fills `DECOMPOSITIONS` (see table.py)."""
from kiln.prims.decompositions.table import DECOMPOSITIONS, add_inplace_rows, decompositions_for, register
from kiln.prims.decompositions import (elementwise, shapes, creation, reductions, indexing, nn,  # noqa: F401
                                       normalization, losses, sampling, pooling, resampling, structured,
                                       externs)  # (each module adds its rows)

add_inplace_rows()

__all__ = ["DECOMPOSITIONS", "decompositions_for", "register"]
