"""Gathers and scatters check their indices as eager does ([Note: index bounds checks] in
kiln/codegen/lowering_reduce.py): embedding, advanced indexing, index_select, gather, index_put
and index_copy with in-range and negative indices give eager's values, and an index outside the
dim raises where eager raises, on the C++ printer and under Triton's interpreter: the exception
eager raises for the op (IndexError or RuntimeError), naming the op and the user's line, and an
in-place op leaves its input unwritten ([Note: a scatter into an input checks before it writes]).
Indices the program computes in range (argmax, a clamp, `%`, an arange) carry no check."""
from __future__ import annotations

import re

import pytest
import torch

import kiln
from kiln.codegen import ir
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.reinplace import reinplace_input_writes
from kiln.codegen.scheduler import schedule
from tests.codegen.conftest import prim_graphs

PRINTERS = {"cpp": {}, "triton": {"triton_interpret": True}}

EMB = torch.nn.Embedding(10, 4)


def _embed(i):
    return EMB(i) * 2


def _index(x, i):
    return x[i] + 1


def _index_two(x, i, j):
    return x[i, j] * 3


def _index_select(x, i):
    return x.index_select(1, i) - 1


def _gather(x, i):
    return x.gather(1, i) + 2


def _index_put(x, i, v):
    x.index_put_((i,), v)
    return x * 2


def _index_copy(x, i, v):
    return x.index_copy(0, i, v) + 1


X = torch.randn(5, 3)
# name: (fn, inputs before the index, an index in range, a negative one eager takes (advanced
# indexing wraps it; embedding, index_select, gather, index_copy raise), indices eager refuses, after)
CASES = {
    "embedding": (_embed, (), [1, 2, 9], None, [[1, 12, 0], [-1, 3]], ()),
    "index": (_index, (X,), [0, 4, 2], [-5, 1, -1], [[0, 7], [-6, 0]], ()),
    "index_select": (_index_select, (X,), [0, 2], None, [[1, 3], [-1, 0]], ()),
    "gather": (_gather, (X,), [[0, 2]] * 5, None, [[[0, 3]] * 5, [[-1, 0]] * 5], ()),
    "index_put": (_index_put, (torch.zeros(4, 3),), [1, 3], [-1, -4], [[1, 9], [-5, 0]], (torch.ones(2, 3),)),
    "index_copy": (_index_copy, (torch.zeros(4, 3),), [0, 2], None, [[2, 4], [-1, 1]],
                   (torch.arange(6.).view(2, 3),)),
}


def _args(case, index):
    fn, before, *_, after = case
    return fn, [x.clone() for x in before] + [torch.tensor(index)] + [x.clone() for x in after]


@pytest.fixture(params=list(PRINTERS))
def options(request):
    return PRINTERS[request.param]


@pytest.mark.parametrize("name", list(CASES))
def test_in_range_and_negative_indices_give_eagers_values(name, options):
    case = CASES[name]
    compiled = None
    for index in [i for i in case[2:4] if i is not None]:
        fn, args = _args(case, index)
        expected = fn(*[a.clone() for a in args])
        compiled = compiled or kiln.compile(fn, options=options)
        got_args = [a.clone() for a in args]
        torch.testing.assert_close(compiled(*got_args), expected)


@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_index_raises_as_eager(name, options):
    case = CASES[name]
    fn, args = _args(case, case[2])
    compiled = kiln.compile(fn, options=options)
    compiled(*args)                                # compiled for in-range values first
    for bad in case[4]:
        fn, args = _args(case, bad)
        with pytest.raises((IndexError, RuntimeError), match="(?i)index|indices"):
            fn(*[a.clone() for a in args])
        with pytest.raises((IndexError, RuntimeError), match="(?i)index|indices"):
            compiled(*args)


def test_the_error_names_the_op_the_users_line_and_the_dim():
    fn, args = _args(CASES["embedding"], [1, 12, 0])
    with pytest.raises(IndexError, match=r"in embedding at .*test_index_bounds.py:\d+ in _embed: an index read outside a dim of size 10"):
        kiln.compile(fn)(*args)


def test_index_two_tensors(options):
    x = torch.randn(4, 5)
    compiled = kiln.compile(_index_two, options=options)
    for i, j in (([0, 3], [4, -5]), ([-4, 1], [-1, 2])):
        i, j = torch.tensor(i), torch.tensor(j)
        torch.testing.assert_close(compiled(x, i, j), _index_two(x, i, j))
    with pytest.raises(IndexError):
        _index_two(x, torch.tensor([0, 1]), torch.tensor([5, 0]))
    with pytest.raises((IndexError, RuntimeError), match="(?i)index|indices"):
        compiled(x, torch.tensor([0, 1]), torch.tensor([5, 0]))


# ---------------------------------------------------------------------------- the error eager raises, and what it leaves

def _index_fill(x, i):
    return x.index_fill(0, i, -1.0) * 2


def _index_fill_(x, i):
    x.index_fill_(0, i, -1.0)
    return x * 2


def _take(x, i):
    return torch.take(x, i) + 1


def _put_(x, i):
    x.put_(i, torch.full(i.shape, -1.0))
    return x * 2


def _scatter(x, i):
    return x.scatter(0, i, torch.full(i.shape, -1.0)) * 2


def _scatter_(x, i):
    x.scatter_(0, i, torch.full(i.shape, -1.0))
    return x * 2


def _scatter_add_(x, i):
    x.scatter_add_(0, i, torch.ones(i.shape))
    return x * 2


def _scatter_reduce(x, i):
    return x.scatter_reduce(0, i, torch.ones(i.shape), "amax") * 2


def _index_put_(x, i):
    x.index_put_((i,), torch.tensor(-1.0))
    return x * 2


def _setitem(x, i):
    x[i] = -1.0
    return x * 2


def _index_put_accumulate_(x, i):
    x.index_put_((i,), torch.tensor(5.0), accumulate=True)
    return x * 2


def _index_add(x, i):
    return x.index_add(0, i, torch.ones(len(i), 3)) * 2


def _index_add_(x, i):
    x.index_add_(0, i, torch.ones(len(i), 3))
    return x * 2


def _index_copy_(x, i):
    x.index_copy_(0, i, torch.full((len(i), 3), -1.0))
    return x * 2


def _rows(*rows):
    """A scatter's index of shape (len(rows), 3): each row's three columns at one row of x."""
    return torch.tensor(rows).view(-1, 1).expand(-1, 3).contiguous()


ROWS = [[0, 2], [1, 4], [4, 1], [1, -5]]          # in range, then bad last, bad first, negative bad
# name: (the ATen op an error names, fn, indices: in range, then out of range)
ERRORS = {
    "index_fill": ("index_fill", _index_fill, ROWS),
    "index_fill_": ("index_fill_", _index_fill_, ROWS),
    "take": ("take", _take, [[0, 11], [1, 12], [12, 1], [1, -13]]),
    "put_": ("put_", _put_, [[0, 11], [1, 12], [12, 1], [1, -13]]),
    "scatter": ("scatter", _scatter, [_rows(0, 3), _rows(1, 4), _rows(4, 1), _rows(1, -1)]),
    "scatter_": ("scatter_", _scatter_, [_rows(0, 3), _rows(1, 4), _rows(4, 1), _rows(1, -1)]),
    "scatter_add_": ("scatter_add_", _scatter_add_, [_rows(0, 3), _rows(1, 4), _rows(4, 1), _rows(1, -1)]),
    "scatter_reduce": ("scatter_reduce", _scatter_reduce, [_rows(0, 3), _rows(1, 4), _rows(4, 1), _rows(1, -1)]),
    "index_put_": ("index_put_", _index_put_, ROWS),
    "setitem": ("index_put_", _setitem, ROWS),
    "index_put_accumulate_": ("index_put_", _index_put_accumulate_, ROWS),
    "index_add": ("index_add", _index_add, ROWS),
    "index_add_": ("index_add_", _index_add_, ROWS),
    "index_copy_": ("index_copy_", _index_copy_, ROWS),
}


def _x():
    return torch.arange(12.).view(4, 3)


def _outcome(fn, index):
    """(the exception's type or None, the input after the call) of `fn` on a fresh input."""
    x = _x()
    try:
        fn(x, torch.as_tensor(index).clone())
    except (IndexError, RuntimeError) as e:
        return e, x
    return None, x


@pytest.mark.parametrize("name", list(ERRORS))
def test_an_index_out_of_range_raises_eagers_exception_naming_the_op(name, options):
    """The same type as eager's (IndexError or RuntimeError: it differs by op); a kiln kernel's
    check names the op and the user's line; an extern (ATen's scatter) raises ATen's own error,
    with the op and line in a note."""
    op, fn, (good, *bads) = ERRORS[name]
    compiled = kiln.compile(fn, options=options)
    torch.testing.assert_close(compiled(_x(), torch.as_tensor(good).clone()), fn(_x(), torch.as_tensor(good).clone()))
    for bad in bads:
        want, _ = _outcome(fn, bad)
        got, _ = _outcome(compiled, bad)
        assert want is not None and type(got) is type(want), (bad, want, got)
        if "kiln" in str(got) or "device_assert" in str(got):
            assert re.search(rf"in {op} at .*test_index_bounds.py:\d+ in {fn.__name__}: an index", str(got)), str(got)
        else:                  # ATen's error, as eager's, with a note naming the op and line
            assert str(got) == str(want)
            assert any(re.search(rf"for {op} at .*test_index_bounds.py:\d+ in {fn.__name__}", note)
                       for note in getattr(got, "__notes__", ())), got


@pytest.mark.parametrize("name, index", [("index_fill", [-1, 0]), ("index_fill_", [-4, 2]), ("take", [-12, 0]),
                                         ("put_", [-1, 3]), ("index_put_", [-4, 0]), ("setitem", [-1, -2]),
                                         ("index_put_accumulate_", [-1, -1])])
def test_negative_indices_in_range_give_eagers_values(name, index, options):
    """index_fill, take, put_ and index_put count a negative index from the end, as eager."""
    _, fn, (good, *_) = ERRORS[name]
    compiled = kiln.compile(fn, options=options)
    compiled(_x(), torch.as_tensor(good))
    x, y = _x(), _x()
    torch.testing.assert_close(compiled(x, torch.tensor(index)), fn(y, torch.tensor(index)))
    torch.testing.assert_close(x, y)


@pytest.mark.parametrize("name", [n for n in ERRORS if n.endswith("_") or n == "setitem"])
def test_an_in_place_op_with_a_bad_index_leaves_its_input_unwritten_on_the_cpp_printer(name):
    """[Note: a scatter into an input checks before it writes] in kiln/codegen/cpp.py: where eager
    leaves the input unwritten (the bad index first, or an op that checks every index first),
    kiln does too; where eager wrote the elements before the bad index, kiln writes none."""
    _, fn, (good, *bads) = ERRORS[name]
    compiled = kiln.compile(fn)
    compiled(_x(), torch.as_tensor(good).clone())
    for bad in bads:
        _, eager_x = _outcome(fn, bad)
        error, kiln_x = _outcome(compiled, bad)
        assert error is not None
        assert torch.equal(kiln_x, _x()), (bad, kiln_x)
    _, eager_x = _outcome(fn, bads[1])             # the bad index first: eager writes nothing either
    assert torch.equal(eager_x, _x())


def test_an_out_of_place_op_with_a_bad_index_leaves_its_input_unwritten(options):
    for name in ("index_fill", "take", "scatter", "scatter_reduce", "index_add"):
        _, fn, (good, *bads) = ERRORS[name]
        compiled = kiln.compile(fn, options=options)
        compiled(_x(), torch.as_tensor(good).clone())
        for bad in bads:
            error, x = _outcome(compiled, bad)
            assert error is not None and torch.equal(x, _x())


def _index_reduce(x, i):
    return x.index_reduce(0, i, torch.ones(2, 3), "prod") * 2


@pytest.mark.filterwarnings("ignore:index_reduce")
def test_index_reduce_raises_eagers_index_error(options):
    """index_reduce runs as ATen's scatter_reduce, whose RuntimeError is not eager's IndexError:
    its decomposition reads the index through a checked gather first."""
    compiled = kiln.compile(_index_reduce, options=options)
    for good in ([0, 2], [3, 3]):
        torch.testing.assert_close(compiled(_x(), torch.tensor(good)), _index_reduce(_x(), torch.tensor(good)))
    for bad in ([1, 4], [-1, 0]):
        with pytest.raises(IndexError):
            _index_reduce(_x(), torch.tensor(bad))
        with pytest.raises(IndexError, match=r"in index_reduce at .*test_index_bounds.py:\d+ in _index_reduce"):
            compiled(_x(), torch.tensor(bad))


# ---------------------------------------------------------------------------- no check where none is needed

def _bounds_of(fn, *inputs) -> list:
    """The bounds of every gather and scatter in the forward's kernels."""
    (gm, examples), _ = prim_graphs(fn, *inputs)
    reinplace_input_writes(gm)
    graph, _ = lower_graph(gm, examples)
    sched = schedule(optimize_layouts(dedupe_buffers(graph)))
    out = []
    for k in sched.steps:
        if isinstance(k, ir.Kernel):
            for st in k.stages:
                for s in st.body:
                    if isinstance(s, ir.Store) and s.indirect:
                        out.append(s.bounds)
                    out += [ld.bounds for e in ir.stmt_exprs(s) for ld in ir.loads_of(e) if ld.indirect]
    return out


def _through_argmax(x, table):
    return table[x.argmax(-1)]


def _through_clamp(i, table):
    return table[i.clamp(0, 9)]


def _through_remainder(i, table):
    return table[i % 10]


def _through_shift(i, table):
    return table[i % 7 - 3]       # -3..3: in [-10, 10), counted from the end where negative


@pytest.mark.parametrize("fn, inputs", [
    (_through_argmax, (torch.randn(4, 10), torch.randn(10, 3))),
    (_through_clamp, (torch.tensor([3, 14, -2]), torch.randn(10, 3))),
    (_through_remainder, (torch.tensor([3, 14, -2]), torch.randn(10, 3))),
    (_through_shift, (torch.tensor([3, 14, -2]), torch.randn(10, 3))),
])
def test_indices_computed_in_range_are_not_checked(fn, inputs):
    bounds = _bounds_of(fn, *inputs)
    assert bounds and all(b == () for b in bounds), bounds
    torch.testing.assert_close(kiln.compile(fn)(*inputs), fn(*inputs))


def test_an_input_index_is_checked():
    bounds = _bounds_of(_index, X, torch.tensor([0, 1]))
    assert bounds == [((ir.indirect_var(0), 5),)]


def test_a_kernel_without_checks_prints_as_before():
    """A kernel with no check returns void, and its host line does not test a result."""
    from kiln.codegen import cpp
    compiled = kiln.compile(_through_argmax)
    x, table = torch.randn(4, 10), torch.randn(10, 3)
    compiled(x, table)
    (gm, examples), _ = prim_graphs(_through_argmax, x, table)
    graph, _ = lower_graph(gm, examples)
    sched = schedule(optimize_layouts(dedupe_buffers(graph)))
    kernels = [k for k in sched.steps if isinstance(k, ir.Kernel)]
    text = "\n".join(cpp.print_kernel(k, graph.buffer_map()) for k in kernels)
    assert "kiln_error" not in text and 'extern "C" void' in text


def test_checked_cpp_kernel_text():
    from kiln.codegen import cpp
    (gm, examples), _ = prim_graphs(_index, X, torch.tensor([0, 1]))
    graph, _ = lower_graph(gm, examples)
    sched = schedule(optimize_layouts(dedupe_buffers(graph)))
    kernels = [k for k in sched.steps if isinstance(k, ir.Kernel)]
    text = cpp.print_module(kernels, graph.buffer_map())
    assert re.search(r'extern "C" .*int64_t kernel', text) and "int64_t kiln_error = 0;" in text
    assert "t0 = kiln_checked(t0, 5, kiln_error, 1);" in text and "return kiln_error;" in text


def test_triton_kernels_with_asserts_compile_them_in():
    """On a GPU, Triton drops `tl.device_assert` unless the function is compiled with debug on:
    a kernel that checks an index is; one that does not is not (debug builds check more)."""
    from kiln.codegen.triton.printer import canonical, print_canonical
    for fn, args, checked in ((_index, (X, torch.tensor([0, 1])), True),
                              (_through_argmax, (torch.randn(4, 10), torch.randn(10, 3)), False)):
        (gm, examples), _ = prim_graphs(fn, *args)
        graph, _ = lower_graph(gm, examples)
        sched = schedule(optimize_layouts(dedupe_buffers(graph)))
        kernels = [k for k in sched.steps if isinstance(k, ir.Kernel) and any(
            ld.indirect for st in k.stages for s in st.body for e in ir.stmt_exprs(s) for ld in ir.loads_of(e))]
        source = print_canonical(*canonical(kernels[0], graph.buffer_map()), interpret=False)
        assert ("debug=True" in source) == checked and ("tl.device_assert(" in source) == checked, source
