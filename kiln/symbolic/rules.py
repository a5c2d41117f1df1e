"""Composites that run as kiln's rules on symbolic sizes, for capture's example values and aot's trace alike.

Their ATen implementations read symbolic sizes as ints, or make a size of data that the sizes alone
decide; the rules keep the sizes symbolic. Both capture (`kiln.capture.examples`) and aot
(`kiln.aot.trace`) route by these tables, which is why they live under both, here.
"""
from __future__ import annotations

import operator

import torch

from kiln.symbolic import attention, combinations, matmul

# Composites whose ATen implementation reads symbolic sizes as ints, or makes a size of data that
# the sizes alone decide, run as kiln's rules instead ([Note: attention kernels chosen at the hints],
# [Note: matmul on symbolic sizes], [Note: combinations without a mask]); a method call
# (`x.matmul(y)`) runs the function of its METHOD_RULES entry on (self, *args).
SYMBOLIC_RULES: dict = {torch.nn.functional.scaled_dot_product_attention: attention.scaled_dot_product_attention,
                        torch.matmul: matmul.matmul, operator.matmul: matmul.matmul,
                        torch.nn.functional.linear: matmul.linear,
                        torch.combinations: combinations.combinations}
METHOD_RULES: dict = {"matmul": matmul.matmul, "__matmul__": matmul.matmul}
