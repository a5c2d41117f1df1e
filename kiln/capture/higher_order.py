"""torch's higher-order functions inside captured code: `torch.cond`, `wrap`.

`torch.cond(pred, true_fn, false_fn, operands)` with a Python constant `pred` (a bool, int or
float) calls the branch `pred` picks on the operands, as torch.cond itself does outside a
compiler: the branch is traced inline. With a tensor (or symbolic) `pred` both branches would be
captured as subgraphs of a `cond` node, which kiln does not do yet: the call is a graph break, and
torch.cond runs there as torch wrote it.

`wrap(fn, *args, **kwargs)` (torch._higher_order_ops.wrap) is `fn(*args, **kwargs)`: torch's
compiler keeps the body as a subgraph under one `wrap` node, kiln traces it inline, so the values
are the same and the graph holds the body's ops in place of the one node.
"""
from __future__ import annotations

import sys

import torch  # noqa: F401  (torch.cond's module is loaded with torch)

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.constants import python_value

_cond = sys.modules["torch._higher_order_ops.cond"].cond
_wrap = sys.modules["torch._higher_order_ops.wrap"].wrap


@handles(_wrap)
def _torch_wrap(tx, args, kwargs):
    if not args:
        tx.raise_(TypeError, "wrap() missing the function to call")
    return tx.call(args[0], list(args[1:]), kwargs)


@handles(_cond)
def _torch_cond(tx, args, kwargs):
    from kiln.capture.semantics import iterate
    names = ("pred", "true_fn", "false_fn", "operands")
    bound = dict(zip(names, args)) | kwargs
    pred = bound.get("pred")
    if not (isinstance(pred, V.Constant) and type(pred.value) in (bool, int, float)):
        kind = "tensor" if isinstance(pred, V.TensorVar) else type(pred).__name__
        raise tx.unsupported(f"torch.cond with a {kind} predicate: kiln does not capture its branches as "
                             "subgraphs yet")
    branch = bound["true_fn"] if python_value(pred) else bound["false_fn"]
    operands = bound.get("operands")
    return tx.call(branch, iterate(tx, operands) if operands is not None else [])
