"""Common buffers: a computed buffer equal to an earlier one is dropped and its readers read the earlier;
common kernels (`common_kernels`): a scheduled kernel equal to an earlier one is compiled once.

Lowering realizes a value once per extern that needs it whole, so a value three matmuls read (the
normalized hidden state before q, k and v projections) used to be computed and stored three times.
The loop IR is functional (every buffer is written by one node, once), so two `ComputedBuffer`s
with equal bodies and equal layouts hold equal values: the later one goes, and every load, extern
argument and graph output naming it is renamed. Bodies are compared after earlier renames, so
chains of copies collapse in one pass.
"""
from __future__ import annotations

import dataclasses

import torch

from kiln.codegen import ir


def _rename_expr(expr, rename: dict[str, str]):
    def fn(e):
        if isinstance(e, ir.Load) and e.buffer in rename:
            return dataclasses.replace(e, buffer=rename[e.buffer])
        return e
    return ir.map_expr(expr, fn)


def _rename_arg(value, rename: dict[str, str]):
    def fn(a):
        if isinstance(a, (ir.BufferArg, ir.ViewArg)) and a.name in rename:
            return dataclasses.replace(a, name=rename[a.name])
        return a
    return torch.utils._pytree.tree_map(fn, value)


def dedupe_buffers(graph: ir.Graph) -> ir.Graph:
    buffers = graph.buffer_map()
    outputs = {o if isinstance(o, str) else o.name for o in graph.outputs if isinstance(o, (str, ir.ViewArg))}
    rename: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    nodes = []
    # a buffer a scatter writes into is the scatter's alone, and a scatter's result is no value
    # computed afresh ([Note: scatters write in place] in ir.py): neither is merged with another
    scattered = {n.body.into for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and isinstance(n.body, ir.Scatter)}
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            if rename:
                node = dataclasses.replace(node, body=ir.map_body(node.body, lambda e: _rename_expr(e, rename)))
            if node.buffer in scattered or isinstance(node.body, ir.Scatter):
                nodes.append(node)
                continue
            buf = buffers[node.buffer]
            key = (node.body, buf.sizes, buf.strides, buf.offset, buf.dtype, buf.device)
            try:
                first = seen.get(key)
            except TypeError:      # an unhashable constant somewhere in the body
                nodes.append(node)
                continue
            if first is not None and node.buffer not in outputs:
                rename[node.buffer] = first
                continue
            seen.setdefault(key, node.buffer)
        elif rename:
            node = dataclasses.replace(node, args=_rename_arg(node.args, rename),
                                       kwargs=tuple((k, _rename_arg(v, rename)) for k, v in node.kwargs))
        nodes.append(node)
    if not rename:
        return graph
    return dataclasses.replace(graph, nodes=tuple(nodes),
                               buffers=tuple(b for b in graph.buffers if b.name not in rename),
                               outputs=tuple(_rename_arg(o, rename) if isinstance(o, ir.ViewArg) else o
                                             for o in graph.outputs))


def common_kernels(kernels: list[ir.Kernel], buffers: dict[str, ir.Buffer]) -> tuple[list[ir.Kernel], dict[str, str]]:
    """The distinct kernels, and for each repeat the name of the first kernel equal to it.

    A model's repeated layers schedule the same kernels on other buffers; two kernels that are
    equal once their buffers are named by position (`ir.canonical_kernel`) and whose arguments have
    equal layouts and dtypes compute the same function of their arguments, so one compiled kernel
    serves both (the host program passes each its own buffers)."""
    seen: dict[tuple, str] = {}
    unique, same = [], {}
    for kernel in kernels:
        shape, _ = ir.canonical_kernel(kernel)
        layouts = tuple((b.sizes, b.strides, b.offset, b.dtype, b.device) if (b := buffers.get(n)) is not None else n
                        for n in kernel.buffer_args)
        try:
            first = seen.get((shape, layouts))
        except TypeError:      # an unhashable constant somewhere in the body
            unique.append(kernel)
            continue
        if first is None:
            seen[(shape, layouts)] = kernel.name
            unique.append(kernel)
        else:
            same[kernel.name] = first
    return unique, same
