"""ATen -> prims decompositions; importing this package fills `DECOMPOSITIONS` (see table.py)."""
from kiln.prims.decompositions.table import DECOMPOSITIONS, decompositions_for, register
from kiln.prims.decompositions import elementwise, shapes, reductions, indexing, nn, normalization, losses, pooling, resampling, structured, externs  # noqa: F401  (each module adds its rows)

__all__ = ["DECOMPOSITIONS", "decompositions_for", "register"]
