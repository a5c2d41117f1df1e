"""Symbolic sizes in traced graphs: a SymInt argument becomes nodes that compute it at run time.

When the tracer runs on fake tensors with symbolic sizes, ops receive `torch.SymInt`s (say
`view(x, [s0 * 3])`). The graph must compute that value from the real inputs when it runs: each
symbol is read once from the input that introduced it (`aten.sym_size.int(input, dim)`), and an
expression over symbols becomes `operator` calls, one per sympy node, from the table `_SYMPY_OPS`.
An unbacked symbol ([Note: unbacked sizes] in kiln/symbolic/shape_env.py) is read from the op that
made it: `aten.sym_size.int(nonzero, 0)`, or the node of `_local_scalar_dense` itself.

`computed_from_inputs` and `evaluate` let code outside the graph (the runtime rebuilding an
output as a view of an input) compute such a size node from the real inputs.
"""
from __future__ import annotations

import functools
import operator

import sympy
import torch
import torch.fx as fx

from kiln.errors import NotYetImplemented

aten = torch.ops.aten


def _floordiv_type():
    try:
        from kiln.symbolic.sympy_ops import FloorDiv
        return FloorDiv
    except ImportError:  # kiln.symbolic absent: no symbolic sizes can reach us either
        return None


def _fold(op):
    return lambda graph, args: functools.reduce(lambda a, b: graph.call_function(op, (a, b)), args)


_SYMPY_OPS = {
    sympy.Add: _fold(operator.add),
    sympy.Mul: _fold(operator.mul),
    sympy.Mod: lambda graph, args: graph.call_function(operator.mod, tuple(args)),
    sympy.Pow: lambda graph, args: graph.call_function(operator.pow, tuple(args)),
    sympy.Max: _fold(max),
    sympy.Min: _fold(min),
    # conditions (a SymBool of `torch._check` over a value read from a tensor: [Note: run-time checks])
    sympy.Ge: _fold(operator.ge), sympy.Gt: _fold(operator.gt), sympy.Le: _fold(operator.le),
    sympy.Lt: _fold(operator.lt), sympy.Eq: _fold(operator.eq), sympy.Ne: _fold(operator.ne),
    sympy.And: _fold(operator.and_), sympy.Or: _fold(operator.or_),
    sympy.Not: lambda graph, args: graph.call_function(operator.not_, tuple(args)),
}
if _floordiv_type() is not None:
    _SYMPY_OPS[_floordiv_type()] = lambda graph, args: graph.call_function(operator.floordiv, tuple(args))


# the ops a size node is built of: `sym_size` (or `sym_stride`) of an input, then `_SYMPY_OPS`' targets
SIZE_OPS = frozenset({aten.sym_size.int, aten.sym_stride.int, operator.add, operator.mul, operator.mod, operator.pow,
                      operator.floordiv, max, min})


def computed_from_inputs(node: fx.Node, inputs) -> bool:
    """Whether size node `node` reads only the placeholders `inputs` (their sizes, or their values
    where a placeholder is a SymInt), through `SIZE_OPS`: then `evaluate` computes it."""
    if node.op == "placeholder":
        return node in inputs
    return (node.op == "call_function" and node.target in SIZE_OPS
            and all(computed_from_inputs(a, inputs) for a in node.all_input_nodes))


def evaluate(node: fx.Node, inputs: dict):
    """The value of size node `node` (`computed_from_inputs`) on the real values of the placeholders."""
    if node.op == "placeholder":
        return inputs[node]
    return node.target(*[evaluate(a, inputs) if isinstance(a, fx.Node) else a for a in node.args])


class SymbolTable:
    """Symbols of one trace: where each comes from, and the node already computing each expression."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self._sources: dict[sympy.Symbol, tuple[fx.Node, int]] = {}
        self._strides: dict[sympy.Symbol, tuple[fx.Node, int]] = {}
        self._nodes: dict[sympy.Expr, fx.Node] = {}

    def add_input(self, node: fx.Node, value) -> None:
        """Remember the symbols among the sizes of input `node` (a placeholder)."""
        if not isinstance(value, torch.Tensor):
            if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
                self._nodes.setdefault(value.node.expr, node)
            return
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                self._sources.setdefault(size.node.expr, (node, dim))
        # a stride of its own (dim 0 of `x[::2]` of one row: kiln.symbolic gives a non-dense
        # stride a symbol), read where no size has it: a clone keeps the input's strides
        for dim, stride in enumerate(value.stride()):
            if isinstance(stride, torch.SymInt) and stride.node.expr.is_Symbol:
                self._strides.setdefault(stride.node.expr, (node, dim))

    def add_output(self, node: fx.Node, value) -> None:
        """Remember the symbols an op's output introduces (unbacked ones: the first op to hold a
        symbol is where it is read); `node` is the op's node, or its getitem for one output."""
        if isinstance(value, torch.SymInt):
            if value.node.expr.is_Symbol:
                self._nodes.setdefault(value.node.expr, node)
            return
        if isinstance(value, torch.SymBool):      # a bool read from a tensor: Eq(u, 1), u its 0 or 1
            self._nodes.setdefault(value.node.expr, node)
            for symbol in value.node.expr.free_symbols:
                self._nodes.setdefault(symbol, node)
            return
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    self._sources.setdefault(size.node.expr, (node, dim))

    def node_of(self, value):
        """An int, or the node computing a SymInt/SymFloat/SymBool at run time."""
        expr = sympy.sympify(value.node.expr)
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        return self._build(expr)

    def _build(self, expr: sympy.Expr):
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:          # a SymFloat's constant: 2.0 in var's backward's 2.0 / (s0 - 1.0)
            return int(expr) if expr == int(expr) and not expr.is_Float else float(expr)
        if expr in self._nodes:
            return self._nodes[expr]
        if expr.is_Symbol:
            if expr in self._sources:
                source, dim = self._sources[expr]
                node = self.graph.call_function(aten.sym_size.int, (source, dim))
            elif expr in self._strides:
                source, dim = self._strides[expr]
                node = self.graph.call_function(aten.sym_stride.int, (source, dim))
            else:
                raise NotYetImplemented(f"kiln.aot: the symbol {expr} comes from no traced input")
        else:
            rule = _SYMPY_OPS.get(type(expr))
            if rule is None:
                raise NotYetImplemented(f"kiln.aot: cannot compute the symbolic size {expr} in a graph "
                                        f"({type(expr).__name__} has no rule in kiln/aot/symbols.py)")
            node = rule(self.graph, [self._build(a) for a in expr.args])
        _annotate(node)
        self._nodes[expr] = node
        return node


def _annotate(node: fx.Node) -> None:
    """Give `node` and the size nodes under it their SymInt (`meta['val']`), as every traced node
    has its value: later passes evaluate ops on their arguments' values."""
    if not isinstance(node, fx.Node) or "val" in node.meta:
        return
    for a in node.args:
        _annotate(a)
    args = [a.meta["val"] if isinstance(a, fx.Node) else a for a in node.args]
    if node.target is aten.sym_size.int:
        node.meta["val"] = args[0].shape[args[1]]
    elif node.target is aten.sym_stride.int:
        node.meta["val"] = args[0].stride()[args[1]]
    else:   # max/min of SymInts: torch's, which builds Max/Min where Python's would compare (a guard)
        node.meta["val"] = {max: torch.sym_max, min: torch.sym_min}.get(node.target, node.target)(*args)
