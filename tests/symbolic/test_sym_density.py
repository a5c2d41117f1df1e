"""`is_non_overlapping_and_dense` of a tensor that is not dense at its traced sizes: the answer is
guarded by a reason that keeps holding (a stride-0 dim; strides off the running product), not by
every size equal to its traced value, which made each new sequence length recompile."""
from __future__ import annotations

import pytest
import sympy
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as eager_dense

from kiln.symbolic import ShapeEnv
from kiln.symbolic.node import SymNode


def _node(env, value):
    return value.node if isinstance(value, torch.SymInt) else SymNode(sympy.Integer(value), env, int, value)


def _ask(layout, batch=16, length=128):
    """Trace `layout(b, s) -> (sizes, strides)` on symbolic b, s; ask density as a kernel would."""
    env = ShapeEnv()
    b, s = env.create_symint(batch, "b"), env.create_symint(length, "s")
    sizes, strides = layout(b, s)
    node = _node(env, b).is_non_overlapping_and_dense([_node(env, x) for x in sizes], [_node(env, x) for x in strides])
    return env, node.guard_bool("", 0)


LAYOUTS = {   # (b, s) -> sizes, strides; `real(b, s)` builds the same view for eager
    "expanded row": (lambda b, s: ((b, s), (0, 1)), lambda b, s: torch.zeros(1, s).expand(b, s)),
    "slice of a 512 buffer": (lambda b, s: ((b, s), (512, 1)), lambda b, s: torch.zeros(b, 512)[:, :s]),
    "every other column": (lambda b, s: ((b, s), (2 * s, 2)), lambda b, s: torch.zeros(b, 2 * s)[:, ::2]),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_not_dense_holds_for_other_lengths_without_a_pin(name):
    layout, real = LAYOUTS[name]
    env, answer = _ask(layout)
    assert answer is eager_dense(real(16, 128)) is False
    guard = env.guard_function("b", "s")
    for b, s in ((16, 200), (4, 77), (16, 511), (3, 300)):
        assert guard(b, s), f"{name}: ({b}, {s}) rejected by {env.format_guards()}"
        assert eager_dense(real(b, s)) is False
    if name == "slice of a 512 buffer":
        assert not guard(16, 512) and eager_dense(real(16, 512))   # there the slice is the whole buffer
