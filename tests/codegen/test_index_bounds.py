"""Gathers and scatters check their indices as eager does ([Note: index bounds checks] in
kiln/codegen/lowering_reduce.py): embedding, advanced indexing, index_select, gather, index_put
and index_copy with in-range and negative indices give eager's values, and an index outside the
dim raises where eager raises, on the C++ printer and under Triton's interpreter. Indices the
program computes in range (argmax, a clamp, `%`, an arange) carry no check."""
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
