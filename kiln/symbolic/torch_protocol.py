"""What torch's own Python shape helpers call on `node.shape_env`, answered by kiln's ShapeEnv.

Many meta kernels are written in Python inside torch (the reference implementations and meta
registrations). When they branch on a size they call helpers such as `guard_or_false`,
`statically_known_true` or `guarding_hint_or_throw`, and those reach into `sym.node.shape_env`
expecting torch's ShapeEnv. kiln does not import or subclass that class; this mixin gives kiln's
ShapeEnv the few methods those helpers use, each mapped onto kiln's own evaluate/static_value.
Unbacked symbols ([Note: unbacked sizes] in shape_env.py) need no renaming or pending bookkeeping
in kiln (they are made by kiln's fake rules, not discovered afterwards), so those lists are empty.
"""
from __future__ import annotations

from typing import Any

import sympy


class TorchHelperProtocol:
    """Mixed into ShapeEnv: the torch-helper surface (names are torch's, not kiln's)."""

    @property
    def pending_fresh_unbacked_symbols(self) -> list:
        return []

    @property
    def ignorable_fresh_unbacked_symbols(self) -> list:
        return []

    @property
    def unbacked_renamings(self) -> dict:
        return {}

    def evaluate_sym_node(self, node, size_oblivious: bool = False,
                          fallback_value: Any = None) -> Any:
        if size_oblivious:
            return self.size_oblivious(node)
        return self.evaluate(node, fallback=fallback_value)

    def _maybe_evaluate_static(self, expr, *args, **kwargs) -> sympy.Basic | None:
        value = self.static_value(expr)
        return None if value is None else sympy.sympify(value)

    def guarding_hint_or_throw(self, expr) -> Any:
        return self.hint_of(expr)

    def optimization_hint(self, expr, fallback: Any = None) -> Any:
        return self.hint_of(self._unbacked_as(expr, fallback))

    def size_hint(self, expr, allow_none: bool = False, *args, **kwargs) -> Any:
        if allow_none and self.has_unbacked(expr):
            return None
        return sympy.sympify(self.hint_of(expr))

    def _unbacked_as(self, expr, fallback: Any):
        """`expr` with each unbacked symbol at `fallback` (an estimate, never a guard)."""
        expr = self.simplify(sympy.sympify(expr))
        if not self.has_unbacked(expr):
            return expr
        return expr.xreplace({s: sympy.Integer(8192 if fallback is None else fallback)
                              for s in expr.free_symbols if s in self.unbacked})

    # Older torch releases (2.11) route the same helpers through these names.
    def evaluate_expr(self, orig_expr, hint: Any = None, fx_node: Any = None,
                      size_oblivious: bool = False, fallback_value: Any = None,
                      **kwargs) -> Any:
        return self.evaluate_sym_node(self._node_for(orig_expr), size_oblivious, fallback_value)

    def guard_or_defer_runtime_assert(self, orig_expr, msg: str = "", fx_node: Any = None) -> bool:
        return self.expect_true(self._node_for(orig_expr))

    defer_runtime_assert = guard_or_defer_runtime_assert

    @property
    def var_to_val(self) -> dict:
        return {s: sympy.Integer(v) for s, v in self.hints.items()}

    backed_var_to_val = var_to_val

    def is_unbacked_symint(self, symbol) -> bool:
        return symbol in self.unbacked

    def _node_for(self, expr):
        from kiln.symbolic.node import SymNode

        expr = sympy.sympify(expr)
        if self.has_unbacked(expr):
            return SymNode(expr, self, bool if isinstance(expr, sympy.logic.boolalg.Boolean) else int, None)
        hint = self.hint_of(expr)
        return SymNode(expr, self, type(hint), hint)
