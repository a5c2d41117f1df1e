"""Unbacked symbols ([Note: unbacked sizes] in kiln/symbolic/shape_env.py): sizes known only at
run time have no hint and are never guarded on; the fake rules of data-dependent ops give them."""
import pytest
import sympy
import torch

from kiln.errors import KilnError
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


# --- linalg_lstsq ([Note: lstsq's residuals] in kiln/symbolic/data_dependent.py) -------------------
_LSTSQ_DRIVERS = [None, "gelsy", "gelsd", "gelss", "gels"]


def _lstsq_inputs(batch, m, n, vector, a_batch=None):
    A = torch.randn(*(batch if a_batch is None else a_batch), m, n, dtype=torch.float64)
    B = torch.randn(*batch, m, dtype=torch.float64) if vector else torch.randn(*batch, m, 2, dtype=torch.float64)
    return A, B


def _residuals_by_rank(driver, batch, m, n) -> bool:
    return driver in ("gelsd", "gelss") and m > n


@pytest.mark.parametrize("driver", _LSTSQ_DRIVERS, ids=str)
@pytest.mark.parametrize("m,n", [(5, 3), (3, 3), (3, 5), (0, 3), (5, 0)], ids=lambda v: str(v))
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=str)
@pytest.mark.parametrize("vector", [False, True], ids=["matrix", "vector"])
def test_lstsq_fake_outputs_are_eager_s(driver, m, n, batch, vector):
    """Sizes, strides and dtypes of all four outputs as eager's CPU kernel gives them; where the
    residuals exist only for full-rank A (gelsd, gelss, m > n) one matrix gets an unbacked length
    of at most k, and a batch, whose residuals change their number of dims with the data, is a
    data-dependent op."""
    A, B = _lstsq_inputs(batch, m, n, vector)
    want = torch.linalg.lstsq(A, B, driver=driver)
    mode = FakeTensorMode()
    env = mode.shape_env
    fa, fb = mode.from_real(A), mode.from_real(B)
    if _residuals_by_rank(driver, batch, m, n) and n > 0 and batch:
        with mode, pytest.raises(DataDependentOp, match="number of dims depends on the data"):
            torch.linalg.lstsq(fa, fb, driver=driver)
        return
    with mode:
        got = torch.linalg.lstsq(fa, fb, driver=driver)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.device == w.device, i
        if i == 1 and _residuals_by_rank(driver, batch, m, n) and n > 0:
            (length,) = g.shape
            _is_count(length, env, upper=1 if vector else 2)
            assert tuple(w.shape) == ((1,) if vector else (2,))     # well conditioned: full rank
            continue
        assert tuple(g.shape) == tuple(w.shape), (i, g.shape, w.shape)
        assert tuple(g.stride()) == tuple(w.stride()), (i, g.stride(), w.stride())
    assert env.guards == []


def test_lstsq_fake_broadcasts_batches_as_eager():
    mode = FakeTensorMode()
    for a_batch, batch in [((1,), (4,)), ((4,), (1,)), ((2, 1), (2, 3)), ((1, 3), (2, 1))]:
        A, B = _lstsq_inputs(batch, 5, 3, False, a_batch=a_batch)
        for driver in ("gelsy", "gels"):
            want = torch.linalg.lstsq(A, B, driver=driver)
            with mode:
                got = torch.linalg.lstsq(mode.from_real(A), mode.from_real(B), driver=driver)
            assert [(tuple(g.shape), g.stride()) for g in got] == [(tuple(w.shape), w.stride()) for w in want]


@pytest.mark.parametrize("A,B,driver", [
    (torch.ones(5), torch.ones(5), None),
    (torch.ones(5, 3), torch.ones(()), None),
    (torch.ones(5, 3), torch.ones(5, 2, dtype=torch.float64), None),
    (torch.ones(2, 5, 3), torch.ones(5), None),
    (torch.ones(5, 3), torch.ones(4, 2), None),
    (torch.ones(5, 3), torch.ones(4), None),
    (torch.ones(2, 5, 3), torch.ones(1, 5), None),
    (torch.ones(5, 3), torch.ones(5, 2), "foo"),
    (torch.ones(2, 1, 5, 3), torch.ones(3, 5, 2), None),
    (torch.ones(5, 3, dtype=torch.long), torch.ones(5, 2, dtype=torch.long), None),
], ids=["1d", "0d_b", "dtypes", "dims", "rows", "rows_vector", "vector_not_batched", "driver", "b_one_dim_less",
        "long"])
def test_lstsq_fake_refuses_what_eager_refuses(A, B, driver):
    with pytest.raises(RuntimeError) as eager:
        torch.linalg.lstsq(A, B, driver=driver)
    mode = FakeTensorMode()
    with mode, pytest.raises(RuntimeError) as fake:
        torch.linalg.lstsq(mode.from_real(A), mode.from_real(B), driver=driver)
    assert not isinstance(fake.value, KilnError)       # the user's error, as eager's, not kiln's
    if not str(eager.value).startswith("The size of tensor"):    # a broadcast's message differs
        assert str(fake.value).startswith(str(eager.value).splitlines()[0][:40])


def test_lstsq_fake_driver_names_are_case_blind_as_eager():
    A, B = _lstsq_inputs((), 5, 3, False)
    mode = FakeTensorMode()
    with mode:
        got = torch.linalg.lstsq(mode.from_real(A), mode.from_real(B), driver="GELSY")
    assert got.singular_values.shape == (0,) and got.rank.shape == ()
