"""Sizes known only at run time, end to end ([Note: unbacked sizes], [Note: sizes bound by externs]):
each data-dependent op compiles under fullgraph=True to one graph and one C++ program, whose host
program runs the op as an extern and binds its count (`u0 = buf1.shape[0]`, or the number `.item()`
returns) for the kernels after it. Every test calls the compiled function with data of different
counts, zero among them, and checks the results (and gradients) against eager and that nothing
recompiled."""
import pytest
import torch

import kiln
from tests.codegen.conftest import Counting


def _host_sources(fn) -> str:
    """The host programs of a compiled graph (forward and backward)."""
    (program,) = fn.programs.values()
    parts = [program.fw, program.bw] if hasattr(program, "fw") else [program]
    return "\n".join(getattr(p, "host_source", "") for p in parts if p is not None)


def _run(fn, calls, grad=False):
    """Compile `fn` (fullgraph) and call it on each argument tuple of `calls`; compare with eager,
    gradients of the float arguments too when `grad`. Returns the compiled graph's host source."""
    kiln.reset()
    backend = Counting()
    compiled = kiln.compile(fn, fullgraph=True, backend=backend)
    for args in calls:
        ours = [a.clone().requires_grad_(grad and a.is_floating_point()) for a in args]
        theirs = [a.clone().requires_grad_(grad and a.is_floating_point()) for a in args]
        got, want = compiled(*ours), fn(*theirs)
        torch.testing.assert_close(got, want, equal_nan=True)
        if grad:
            got.backward()
            want.backward()
            for a, b in zip(ours, theirs):
                if a.requires_grad:
                    torch.testing.assert_close(a.grad, b.grad)
    assert len(backend.compiled) == 1, "recompiled for another count"
    source = _host_sources(backend.compiled[0])
    assert "u0 = " in source, source    # the count is bound at run time: kiln's program, not eager
    return source


def _floats(*shape):
    return [(torch.randn(*shape),), (torch.randn(*shape) + 1,), (-torch.ones(*shape),)]


def test_nonzero():
    _run(lambda x: torch.nonzero(x > 0) * 2 + 1, _floats(5, 3))


def test_argwhere():
    _run(lambda x: torch.argwhere(x > 0).sum(0), _floats(6))


def test_masked_select_with_gradient():
    def fn(x, w):
        return (torch.masked_select(x * w, x > 0) ** 2).sum()
    _run(fn, [(x, torch.randn(4, 5)) for (x,) in _floats(4, 5)], grad=True)


def test_boolean_mask_indexing_with_gradient():
    def fn(x, w):
        return ((x[x > 0] * w[x > 0]).exp()).sum() + x[x > 0].numel()
    _run(fn, [(x, torch.randn(12)) for (x,) in _floats(12)], grad=True)


def test_boolean_mask_rows_with_gradient():
    def fn(x, w):
        return ((x @ w)[x.sum(1) > 0] ** 2).sum()
    _run(fn, [(x, torch.randn(3, 3)) for (x,) in _floats(6, 3)], grad=True)


def test_masked_fill_of_a_view_by_setitem():
    # Longformer's `scores[:, 1:][mask == 0] = finfo.max`: the count of selected elements lays out
    # the broadcast value; "is that contiguous?" on a count that may be 0 or 1 copies rather than guards
    def fn(x, m):
        y = x.clone()
        y[:, 1:][m[:, 1:] == 0] = 3.0e38
        return y * 2
    masks = [torch.randint(0, 2, (3, 6)), torch.ones(3, 6, dtype=torch.long), torch.eye(3, 6, dtype=torch.long)]
    _run(fn, [(torch.randn(3, 6), m) for m in masks])


def test_nonzero_indexing_with_gradient():
    def fn(x, w):
        idx = torch.nonzero(x > 0).squeeze(1)
        return (x[idx] * w[idx]).sum()
    _run(fn, [(x, torch.randn(9)) for (x,) in _floats(9)], grad=True)


def _ints(*shape):
    return [(torch.randint(0, 4, shape),), (torch.randint(0, 9, shape),), (torch.zeros(shape, dtype=torch.long),)]


@pytest.mark.parametrize("kwargs", [{}, {"sorted": False}, {"return_inverse": True},
                                    {"return_inverse": True, "return_counts": True}, {"return_counts": True}],
                         ids=["sorted", "unsorted", "inverse", "inverse_counts", "counts"])
def test_unique(kwargs):
    def fn(x):
        out = torch.unique(x, **kwargs)
        if not kwargs.get("sorted", True):
            return out.sort().values * 2
        return tuple(o * 2 for o in out) if isinstance(out, tuple) else out * 2
    _run(fn, _ints(3, 4))


def test_unique_dim():
    _run(lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True), _ints(6, 2))


@pytest.mark.parametrize("dim", [None, 1])
def test_unique_consecutive(dim):
    _run(lambda x: torch.unique_consecutive(x, return_inverse=True, return_counts=True, dim=dim), _ints(2, 8))


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("inverse, counts", [(False, False), (True, False), (False, True)])
def test_unique_consecutive_of_a_vector_along_its_dim(dim, inverse, counts):
    # a 1-D input with dim=0 takes ATen's flat path, which returns inverse and counts only when
    # asked; with dim=-1 it returns both (the OpInfo sweep's unique_consecutive samples 18-20, 36-38)
    _run(lambda x: torch.unique_consecutive(x, return_inverse=inverse, return_counts=counts, dim=dim), _ints(9))


def test_unique_of_an_empty_tensor():
    """Nothing to count: the count is the constant 0, no symbol."""
    kiln.reset()
    x = torch.zeros(0, dtype=torch.long)
    compiled = kiln.compile(lambda t: torch.unique(t, return_counts=True), fullgraph=True)
    for got, want in zip(compiled(x), torch.unique(x, return_counts=True)):
        torch.testing.assert_close(got, want)


def test_repeat_interleave_of_counts():
    _run(lambda r: torch.repeat_interleave(r) + 1, _ints(5))


def test_repeat_interleave_with_tensor_repeats_and_gradient():
    def fn(x, r):
        return (torch.repeat_interleave(x, r, dim=0) ** 2).sum()
    _run(fn, [(torch.randn(4, 3), r) for (r,) in _ints(4)], grad=True)


def _counts():
    return [(torch.randn(12), torch.tensor(4)), (torch.randn(12), torch.tensor(3)), (torch.randn(12), torch.tensor(0))]


def test_item_as_arange_length():
    _run(lambda x, n: torch.arange(n.item()) + x.sum(), _counts())


def test_int_of_a_tensor_as_a_size():
    _run(lambda x, n: torch.zeros(int(n), 2) + x.sum(), _counts())


def test_tensor_passed_as_a_size():
    _run(lambda x, n: torch.arange(n) * x.mean(), _counts())


def test_item_in_view_with_gradient():
    def fn(x, n):
        return (x.view(n.item(), -1).softmax(-1) * torch.arange(x.numel() // n.item())).sum()
    _run(fn, [(torch.randn(12), torch.tensor(k)) for k in (4, 3, 6)], grad=True)


def test_triton_host_program_binds_the_count(monkeypatch, tmp_path):
    """The host program is shared: under the Triton printer (its interpreter, on CPU tensors) the
    extern's count reaches the Triton kernel as a size argument too."""
    pytest.importorskip("triton")
    from kiln.codegen import compile as codegen_compile
    from kiln.codegen import triton as triton_printer

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(codegen_compile, "printer_for", lambda device: triton_printer)
    source = _run(lambda x: (torch.masked_select(x, x > 0) * 3).exp(), _floats(7))
    assert "u0" in source.split("u0 = ", 1)[1], source


def test_histogramdd_and_histc():
    """Not unbacked (the sizes follow from `bins`), but torch has no meta kernel for histogramdd's
    steps, whose values come from the data's range (kiln/symbolic/data_dependent.py), and its
    result nests the edges in a list, which capture reads item by item. (Seeded: the second call's
    data, doubled, can leave no point in density's range, 0 / 0 in eager as in kiln.)"""
    torch.manual_seed(0)
    for fn, args in [(lambda x, w: torch.histogramdd(x, bins=[3, 4], weight=w), (torch.rand(10, 2), torch.rand(10))),
                     (lambda x: torch.histogramdd(x, bins=[2, 3], range=[0., 1., 0., 1.], density=True),
                      (torch.rand(10, 2),)),
                     (lambda x: torch.histc(x, bins=5), (torch.rand(10),))]:
        kiln.reset()
        backend = Counting()
        compiled = kiln.compile(fn, fullgraph=True, backend=backend)
        for _ in range(2):
            got, want = compiled(*args), fn(*args)
            assert type(got) is type(want)
            torch.testing.assert_close(tuple(got) if isinstance(got, tuple) else got,
                                       tuple(want) if isinstance(want, tuple) else want, equal_nan=True)
            args = tuple(a * 2 for a in args)
        assert len(backend.compiled) == 1


def test_counts_the_program_assumed_equal_are_checked_at_run_time():
    """`x[m1] * y[m2]` assumes the two counts equal (eager raises where they are not): the program
    checks it where the second count is known, instead of reading past the first's buffer."""
    def fn(x, y):
        return x[x > 0] * y[y > 0]
    kiln.reset()
    compiled = kiln.compile(fn, fullgraph=True, backend=Counting())
    x, y = torch.tensor([1., -1., 2.]), torch.tensor([-3., 4., 5.])
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    y = torch.tensor([3., 4., 5.])
    with pytest.raises(RuntimeError):
        fn(x, y)
    with pytest.raises(RuntimeError, match="assumed"):
        compiled(x, y)


@torch.library.custom_op("kiln_tests::doubled_and_rows", mutates_args=())
def _doubled_and_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x * 2, x.shape[0]


@_doubled_and_rows.register_fake
def _(x):
    return torch.empty_like(x), x.shape[0]


def test_extern_returning_an_input_size_leaves_its_binding_at_the_top():
    """An extern may return a size the inputs already give (CUDA flash attention's max_seqlen_q is
    the query's length): it stays bound from the input at the top of the program. Named after the
    symbol, the extern's result became its binding, after the kernels that read it, and every
    dynamic=True BERT on CUDA in bf16 raised UnboundLocalError ('s1')."""
    def fn(x):
        doubled, rows = torch.ops.kiln_tests.doubled_and_rows((x + 1).sin())   # a kernel over s0 first
        return doubled.sum(0) * rows
    kiln.reset()
    backend = Counting()
    compiled = kiln.compile(fn, dynamic=True, fullgraph=True, backend=backend)
    for rows in (5, 7, 9):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(backend.compiled) == 1
