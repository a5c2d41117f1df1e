"""`torch.linalg.lstsq` compiled end to end (fullgraph=True) against eager, forward and gradients.

torch has no meta kernel for linalg_lstsq: kiln's fake rule gives its four outputs as ATen's CPU
kernel lays them out ([Note: lstsq's residuals] in kiln/symbolic/data_dependent.py) and the
program runs it as an extern. The residuals of one matrix under gelsd or gelss with m > n exist
only where A has full rank: a length known only at run time, bound from the extern's output, one
program for full-rank and rank-deficient inputs; their gradient is kiln's where the length is
symbolic ([Note: lstsq's residuals in backward] in kiln/aot/rules.py). A batch of those changes
the residuals' number of dims with the data: a graph break, refused under fullgraph."""
import pytest
import torch

import kiln
from kiln.errors import KilnError
from tests.codegen.conftest import Counting

DRIVERS = [None, "gelsy", "gelsd", "gelss", "gels"]
SHAPES = [(5, 3), (3, 3), (3, 5)]        # m > n, m == n, m < n


def _by_rank(driver, m, n) -> bool:
    """Residuals only where every matrix of A has full rank: known only at run time."""
    return driver in ("gelsd", "gelss") and m > n


def _well_conditioned(*shape, dtype=torch.float64):
    a = torch.randn(*shape, dtype=dtype)
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    s = torch.linspace(1.0, 2.0, min(shape[-2:]), dtype=torch.float64).to(dtype)
    return u @ torch.diag_embed(s) @ vh


def _check(fn, calls, *, dynamic=None, graphs=1):
    """Compile `fn` (fullgraph) and call it on each tuple of `calls`: outputs equal eager's, and
    so are the gradients of every float input for seeded cotangents of the differentiable outputs."""
    kiln.reset()
    backend = Counting()
    compiled = kiln.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)
    for args in calls:
        results = []
        for f in (compiled, fn):
            inputs = [a.clone().requires_grad_(a.is_floating_point() or a.is_complex()) for a in args]
            out = f(*inputs)
            diff = [o for o in out if o.requires_grad]
            gen = torch.Generator().manual_seed(0)
            cot = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff]
            results.append((out, torch.autograd.grad(diff, inputs, cot, allow_unused=True)))
        (got, got_grads), (want, want_grads) = results
        torch.testing.assert_close(got, want)
        assert [g.stride() for g in got if g.numel() > 1] == [w.stride() for w in want if w.numel() > 1]
        torch.testing.assert_close(got_grads, want_grads)
    assert len(backend.compiled) == graphs
    return backend


@pytest.mark.parametrize("driver", DRIVERS, ids=str)
@pytest.mark.parametrize("m,n", SHAPES, ids=lambda v: str(v))
def test_lstsq_matches_eager_with_gradients(driver, m, n):
    """A matrix and a vector B on one A, and a batch of both (a batch by rank has its own test)."""
    batched = not _by_rank(driver, m, n)

    def fn(a, b, v, a3, b3, v3):
        outs = [*torch.linalg.lstsq(a, b, driver=driver), *torch.linalg.lstsq(a, v, driver=driver)]
        if batched:
            outs += [*torch.linalg.lstsq(a3, b3, driver=driver), *torch.linalg.lstsq(a3, v3, driver=driver)]
        return tuple(outs)
    args = (_well_conditioned(m, n), torch.randn(m, 2, dtype=torch.float64), torch.randn(m, dtype=torch.float64),
            _well_conditioned(2, 3, m, n), torch.randn(2, 3, m, 2, dtype=torch.float64),
            torch.randn(2, 3, m, dtype=torch.float64))
    _check(fn, [args])


@pytest.mark.parametrize("driver", ["gelsd", "gelss"])
def test_residuals_of_full_and_deficient_rank_in_one_program(driver):
    """Full rank: residuals of length k; rank-deficient: empty. One program binds the length from the
    extern's output (u0 = buf.shape[0]), and the residuals' gradient is eager's in both."""
    def fn(a, b, v):
        x, r, rank, s = torch.linalg.lstsq(a, b, driver=driver)
        y, rv, _, _ = torch.linalg.lstsq(a, v, driver=driver)
        return x * 2, r + 1, rank, s, y, rv.exp()
    full = _well_conditioned(6, 3)
    deficient = full.clone()
    deficient[:, 2] = deficient[:, 1]
    calls = [(a, torch.randn(6, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64))
             for a in (full, deficient, full * 3)]
    assert torch.linalg.lstsq(deficient, calls[1][1], driver=driver).residuals.shape == (0,)
    backend = _check(fn, calls)
    (program,) = backend.compiled[0].programs.values()
    assert "u0 = " in program.fw.host_source


def test_batched_residuals_by_rank_break_the_graph():
    """(*batch, k) for a full-rank batch, (0,) otherwise: no size can say that, so fullgraph refuses
    it plainly; without fullgraph the call runs eagerly and the results are eager's."""
    def fn(a, b):
        return tuple(torch.linalg.lstsq(a * 1, b, driver="gelsd"))
    a, b = _well_conditioned(2, 5, 3), torch.randn(2, 5, 2, dtype=torch.float64)
    kiln.reset()
    with pytest.raises(KilnError, match="number of dims depends on the data .driver gels or gelsy"):
        kiln.compile(fn, fullgraph=True)(a, b)
    kiln.reset()
    compiled = kiln.compile(fn)
    deficient = a.clone()
    deficient[1, :, 2] = deficient[1, :, 1]
    for x in (a, deficient):
        torch.testing.assert_close(compiled(x, b), fn(x, b))


@pytest.mark.parametrize("driver", ["gels", "gelsd", "gelsy"])
def test_lstsq_dynamic_sizes_with_gradients(driver):
    """Symbolic m, n and k: torch's backward formula reads the residuals' numel(), which a symbolic
    size cannot give; kiln's node for the residuals' gradient serves every size."""
    def fn(a, b):
        return tuple(torch.linalg.lstsq(a, b, driver=driver))
    calls = [(_well_conditioned(m, n), torch.randn(m, k, dtype=torch.float64)) for m, n, k in [(6, 3, 2), (7, 4, 3), (9, 2, 5)]]
    _check(fn, calls, dynamic=True)


def test_lstsq_complex_with_gradients():
    def fn(a, b):
        x, r, _, s = torch.linalg.lstsq(a, b, driver="gelsd")
        return x, r, s
    a = _well_conditioned(6, 3, dtype=torch.complex128)
    _check(fn, [(a, torch.randn(6, 2, dtype=torch.complex128))])
