"""Unbacked symbols ([Note: unbacked sizes] in kiln/symbolic/shape_env.py): sizes known only at
run time have no hint and are never guarded on; the fake rules of data-dependent ops give them."""
import pytest
import sympy
import torch

from kiln.symbolic import DataDependentGuard, DataDependentOp, FakeTensorMode, ShapeEnv
from kiln.symbolic.decide import expect_true, guard_or_false, guard_or_true, same_size


def _env_and_count(upper=float("inf")):
    env = ShapeEnv()
    return env, env.unbacked_symint(upper=upper)


def test_an_unbacked_size_has_no_hint_and_a_branch_on_it_raises():
    env, u = _env_and_count()
    assert not u.node.has_hint() and (u * 2 + 1).node.hint is None
    with pytest.raises(DataDependentGuard, match="u0"):
        bool(u > 3)
    with pytest.raises(DataDependentGuard):
        int(u)
    assert env.guards == []


def test_the_facts_answer_without_a_guard():
    env, u = _env_and_count(upper=12)
    assert bool(u >= 0) and bool(u * 2 != -1) and bool(u <= 12) and not bool(u > 12)
    assert env.guards == []


def test_guard_or_false_and_true_take_the_general_case():
    env, u = _env_and_count()
    assert guard_or_false(u == 1) is False and guard_or_true(u != 1) is True
    assert env.guards == []


def test_size_oblivious_takes_counts_as_at_least_two():
    env, u = _env_and_count()
    assert (u == 1).node.guard_size_oblivious("", 0) is False and (u >= 2).node.guard_size_oblivious("", 0)
    assert env.guards == []


def test_expect_true_is_assumed_and_learnt_not_guarded():
    env = ShapeEnv()
    s = env.create_symint(5, "n")
    u = env.unbacked_symint()
    assert expect_true(u == s)
    assert env.guards == [] and env.runtime_asserts
    assert env.simplify(u.node.expr) == env.symbol_of(s)      # the unbacked one is replaced
    assert bool(u + 1 == s + 1)


def test_same_size_broadcasts_a_one_and_assumes_a_count():
    env, u = _env_and_count()
    assert same_size(1, u) is False and not env.runtime_asserts
    assert same_size(u, 7) and env.simplify(u.node.expr) == 7


def test_guard_function_ignores_unbacked_symbols():
    env = ShapeEnv()
    mode = FakeTensorMode(env)
    x = mode.from_real(torch.randn(6, 3), "x", dynamic_dims=[0])
    with mode:
        y = torch.nonzero(x > 0)
        (y * 2).sum()
    assert all(not (g.expr.free_symbols & env.unbacked) for g in env.guards)
    guard = env.guard_function("x")
    assert guard(torch.randn(9, 3)) and not guard(torch.randn(9, 4))


def _fake(*tensors):
    mode = FakeTensorMode()
    return mode, [mode.from_real(t) for t in tensors]


def _is_count(n, env, upper=None):
    expr = env.symbol_of(n)
    assert isinstance(expr, sympy.Symbol) and expr in env.unbacked
    if upper is not None:
        assert env.upper[expr] == upper


def test_fake_rules_shapes_and_bounds():
    mode, (x, i) = _fake(torch.randn(4, 3), torch.randint(0, 5, (6,)))
    env = mode.shape_env
    with mode:
        nz = torch.nonzero(x > 0)
        _is_count(nz.shape[0], env, upper=12)
        assert nz.shape[1] == 2 and nz.stride() == (1, nz.shape[0]) and nz.dtype == torch.int64
        _is_count(torch.masked_select(x, x > 0).shape[0], env, upper=12)
        rows = x[x.sum(1) > 0]
        _is_count(rows.shape[0], env, upper=4)
        assert rows.shape[1] == 3
        values, inverse, counts = torch.unique(i, return_inverse=True, return_counts=True)
        _is_count(values.shape[0], env, upper=6)
        assert inverse.shape == (6,) and counts.shape == values.shape
        values, inverse, counts = torch.ops.aten.unique_dim(x, 1, True, False, False)
        assert values.shape[0] == 4 and inverse.shape == (3,) and counts.shape[0] == values.shape[1]
        _is_count(torch.repeat_interleave(i).shape[0], env)
        n = i.sum().item()
        assert env.symbol_of(n) in env.unbacked and env.lower[env.symbol_of(n)] == -float("inf")
        assert torch.zeros(n).shape[0] is not None and env.lower[env.symbol_of(n)] == 0   # sizes are >= 0
        with pytest.raises(DataDependentOp):
            x.sum().item()        # a float: no size, still data-dependent
    assert env.guards == []


def test_nothing_to_count_is_zero():
    mode, (x,) = _fake(torch.randn(0, 3))
    with mode:
        assert torch.nonzero(x).shape == (0, 2)
    assert not mode.shape_env.unbacked
