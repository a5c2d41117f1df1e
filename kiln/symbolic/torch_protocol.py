"""What torch's own Python shape helpers call on `node.shape_env`, answered by kiln's ShapeEnv.

Many meta kernels are written in Python inside torch (the reference implementations and meta
registrations). When they branch on a size they call helpers such as `guard_or_false`,
`statically_known_true` or `guarding_hint_or_throw`, and those reach into `sym.node.shape_env`
expecting torch's ShapeEnv. kiln does not import or subclass that class; this mixin gives kiln's
ShapeEnv the few methods those helpers use, each mapped onto kiln's own evaluate/static_value.
kiln has no data-dependent (unbacked) symbols, so the unbacked-symbol bookkeeping is empty.
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
        return self.evaluate(node)

    def _maybe_evaluate_static(self, expr, *args, **kwargs) -> sympy.Basic | None:
        value = self.static_value(expr)
        return None if value is None else sympy.sympify(value)

    def guarding_hint_or_throw(self, expr) -> Any:
        return self.hint_of(expr)

    def optimization_hint(self, expr, fallback: Any = None) -> Any:
        return self.hint_of(expr)

    def size_hint(self, expr, *args, **kwargs) -> Any:
        return sympy.sympify(self.hint_of(expr))

    # Older torch releases (2.11) route the same helpers through these names.
    def evaluate_expr(self, orig_expr, hint: Any = None, fx_node: Any = None,
                      size_oblivious: bool = False, fallback_value: Any = None,
                      **kwargs) -> Any:
        return self.evaluate(self._node_for(orig_expr))

    def guard_or_defer_runtime_assert(self, orig_expr, msg: str = "", fx_node: Any = None) -> bool:
        return bool(self.evaluate(self._node_for(orig_expr)))

    defer_runtime_assert = guard_or_defer_runtime_assert

    @property
    def var_to_val(self) -> dict:
        return {s: sympy.Integer(v) for s, v in self.hints.items()}

    backed_var_to_val = var_to_val

    def is_unbacked_symint(self, symbol) -> bool:
        return False

    def _node_for(self, expr):
        from kiln.symbolic.node import SymNode

        expr = sympy.sympify(expr)
        hint = self.hint_of(expr)
        return SymNode(expr, self, type(hint), hint)
