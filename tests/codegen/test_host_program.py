"""The host program (kiln/codegen/host.py): what it holds alive, Python values externs return, and
its per-call overhead. CPU only: buffers here are extern results and C++-free (no kernel builds)."""
import dataclasses
import weakref

import torch

from kiln.codegen import ir
from kiln.codegen.host import link, plan_host
from kiln.codegen.lowering import lower_graph
from kiln.codegen.scheduler import schedule


def _program(gm, example_inputs):
    graph, constants = lower_graph(gm, example_inputs)
    sched = schedule(graph)
    assert not any(isinstance(s, ir.Kernel) for s in sched.steps), "these tests build no kernel"
    program, binds = plan_host(graph, sched, takes_pointers=False)
    return program, constants, binds


def _watching_externs(program):
    """The program with each extern wrapped to record, after each call, the bytes of every extern
    result still alive (held by the host program: the test keeps only weak references)."""
    alive: list[weakref.ref] = []
    peaks: list[int] = []

    def watch(op):
        def call(*args, **kwargs):
            out = op(*args, **kwargs)
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    alive.append(weakref.ref(t))
            storages = {r().untyped_storage().data_ptr(): r().untyped_storage().nbytes()
                        for r in alive if r() is not None}
            peaks.append(sum(storages.values()))
            return out
        return call
    externs = tuple((name, watch(op)) for name, op in program.externs)
    return dataclasses.replace(program, externs=externs), peaks


def test_extern_results_are_released_after_their_last_use():
    # a chain of 8 matmuls (each an extern): eager holds two results at a time, at most
    def chain(x, w):
        for _ in range(8):
            x = torch.ops.aten.mm.default(x, w)
        return torch.ops.aten.mm.default(x, w)
    x, w = torch.randn(256, 256) / 16, torch.randn(256, 256) / 16
    gm = torch.fx.symbolic_trace(chain)
    program, constants, binds = _program(gm, [x, w])
    watched, peaks = _watching_externs(program)
    out = link(watched, {}, constants, binds)(x, w)
    torch.testing.assert_close(out[0], chain(x, w))
    one = x.numel() * x.element_size()
    assert len(peaks) == 9
    # each call sees its input and its result; before, every result stayed bound until the return
    assert max(peaks) <= 2 * one, (max(peaks) // one, program.source)


def test_unused_results_of_a_multi_output_extern_are_released():
    def top(x):
        values, _ = torch.ops.aten.topk.default(x, 3)
        return torch.ops.aten.mm.default(values, torch.ops.aten.t.default(values))
    gm = torch.fx.symbolic_trace(top)
    x = torch.randn(64, 100)
    program, constants, binds = _program(gm, [x])
    lines = program.source.splitlines()
    mm = next(k for k, line in enumerate(lines) if "_extern1(" in line)
    assert any(line.strip().startswith("del ") for line in lines[:mm]), program.source  # the indices
    torch.testing.assert_close(link(program, {}, constants, binds)(x)[0], top(x))


_lib = torch.library.Library("kiln_host_test", "DEF")
_lib.define("split_count(Tensor x) -> (Tensor, SymInt)")
_lib.define("repeat_rows(Tensor x, SymInt n) -> Tensor")


def _split_count(x):
    return x.flip(0), int((x.shape[0] + 1) // 2)


def _repeat_rows(x, n):
    return x[:n].repeat(2, 1)


_lib.impl("split_count", _split_count, "CPU")
_lib.impl("split_count", lambda x: (torch.empty_like(x), (x.shape[0] + 1) // 2), "Meta")
_lib.impl("repeat_rows", _repeat_rows, "CPU")
_lib.impl("repeat_rows", lambda x, n: x.new_empty((2 * n, x.shape[1])), "Meta")


def test_extern_returning_an_int_hands_it_to_a_later_extern_and_the_outputs():
    # CUDA attention returns its max sequence lengths as SymInts beside the tensors; kiln once
    # refused such an extern ("returns int, which kiln cannot hold in a buffer")
    def fn(x):
        y, n = torch.ops.kiln_host_test.split_count.default(x)
        return torch.ops.kiln_host_test.repeat_rows.default(y, n), n
    x = torch.randn(7, 3)
    gm = torch.fx.symbolic_trace(fn)
    program, constants, binds = _program(gm, [x])
    got = link(program, {}, constants, binds)(x)
    want = fn(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == 4


def test_boxed_program_frees_each_input_after_its_last_use():
    # a backward's saved activations: eager frees each once its node has run; a boxed program
    # (a list it empties) must drop each input after its last reader, not hold all to the end
    def chain(w, a0, a1, a2, a3, a4, a5):
        g = w
        for a in (a0, a1, a2, a3, a4, a5):
            g = torch.ops.aten.mm.default(a, g)
        return (g,)
    w = torch.randn(256, 256) / 16
    acts = [torch.randn(256, 256) / 16 for _ in range(6)]
    gm = torch.fx.symbolic_trace(chain)
    graph, constants = lower_graph(gm, [w, *acts])
    program, binds = plan_host(graph, schedule(graph), takes_pointers=False, boxed=True)
    alive_per_call: list[int] = []
    refs = [weakref.ref(a) for a in acts]

    def watch(op):
        def call(*args, **kwargs):
            alive_per_call.append(sum(r() is not None for r in refs))
            return op(*args, **kwargs)
        return call
    watched = dataclasses.replace(program, externs=tuple((n, watch(op)) for n, op in program.externs))
    call = link(watched, {}, constants, binds)
    assert call.boxed
    want = chain(w, *acts)[0]
    args = [w, *acts]
    del acts
    got = call(args)[0]
    assert args == [], "a boxed program empties the list it is given"
    torch.testing.assert_close(got, want)
    # before the k-th matmul, only inputs k.. are alive: the earlier ones were freed after their use
    assert alive_per_call == [6, 5, 4, 3, 2, 1], (alive_per_call, program.source)


def test_views_with_a_size_one_dim_reach_externs_and_outputs_without_copies():
    # a batch of one: a (1, 4, 8, 16) chunk of a matmul result, as GPT-NeoX's v is, is a strided
    # view of the buffer. Realized as a copy, cuDNN attention got other strides than eager's and
    # picked another plan (46% of its bf16 outputs differed on the H200); outputs were copied too.
    aten = torch.ops.aten

    def fn(x, w):
        qkv = aten.mm.default(x, w)
        v = aten.slice.Tensor(aten.permute.default(aten.view.default(qkv, [1, 8, 4, 48]), [0, 2, 1, 3]), 3, 32, 48)
        return v, aten.view.default(qkv, [1, 8, 192])
    x, w = torch.randn(8, 32), torch.randn(32, 192)
    program, constants, binds = _program(torch.fx.symbolic_trace(fn), [x, w])   # asserts: no kernel
    got = link(program, {}, constants, binds)(x, w)
    for g, e in zip(got, fn(x, w)):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride(), (g.stride(), e.stride())


# ------------------------------------------------------------- kept buffers ([Note: kept buffers])

def _cpu_program(fn, *inputs):
    """`fn` through aot, prims and the C++ code generator: the linked forward host program."""
    from kiln.codegen.compile import compile_prim_graph
    from tests.codegen.conftest import prim_graphs
    (gm, examples), _ = prim_graphs(fn, *inputs)
    return compile_prim_graph(gm, examples, use_cache=False)


def _mlp(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
    return torch.nn.functional.linear(h, w2, b2).relu(), h.sum(0)


def _mlp_inputs(rows=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 64, generator=g), torch.randn(128, 64, generator=g) / 8,
            torch.randn(128, generator=g), torch.randn(64, 128, generator=g) / 8, torch.randn(64, generator=g))


def test_cpu_program_keeps_internal_buffers_and_matmuls_write_into_them():
    call = _cpu_program(_mlp, *_mlp_inputs())
    source = call.host_source
    assert "_keep(" in source and "out=" in source, source
    first_inputs, second_inputs = _mlp_inputs(seed=1), _mlp_inputs(seed=2)
    first = call(*first_inputs)
    kept = [t.clone() for t in first]
    second = call(*second_inputs)
    # outputs are fresh each call: the second call left the first's results alone
    for got, want in zip(first, kept):
        assert torch.equal(got, want)
    for got, want in zip(first, _mlp(*first_inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(second, _mlp(*second_inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not {t.untyped_storage().data_ptr() for t in first} & {t.untyped_storage().data_ptr() for t in second}


def test_outputs_viewing_a_matmul_result_are_not_kept():
    def fn(x, w, b):
        y = torch.nn.functional.linear(x, w, b)
        return y.t(), (y * 2).sum(1)
    x, w, b = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)
    call = _cpu_program(fn, x, w, b)
    first = call(x, w, b)[0]
    kept = first.clone()
    call(x + 1, w, b)
    assert torch.equal(first, kept)
    torch.testing.assert_close(first, fn(x, w, b)[0], rtol=1e-5, atol=1e-5)


def test_kept_buffers_are_per_thread():
    import concurrent.futures
    call = _cpu_program(_mlp, *_mlp_inputs(rows=256))
    seeds = list(range(16))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda s: call(*_mlp_inputs(rows=256, seed=s)), seeds))
    for seed, got in zip(seeds, results):
        for g, w in zip(got, _mlp(*_mlp_inputs(rows=256, seed=seed))):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_kept_buffers_grow_with_a_dynamic_size():
    import kiln
    kiln.reset()
    fast = kiln.compile(_mlp, dynamic=True)
    for rows in (8, 40, 12, 96, 33):
        inputs = _mlp_inputs(rows=rows, seed=rows)
        for got, want in zip(fast(*inputs), _mlp(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_externs_called_through_torch_bindings_equal_their_overloads():
    """[Note: externs through torch's bindings]: the binding a host program calls for an extern gives
    the overload's result (the out overload too), and an overload the binding could confuse with
    another keeps the OpOverload."""
    from kiln.codegen.host import _binding
    aten = torch.ops.aten
    a, b, c = torch.randn(4, 6), torch.randn(6, 5), torch.randn(5)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    cases = [(aten.mm.default, (a, b), {}), (aten.addmm.default, (c, a, b), {"beta": 0.5, "alpha": 2.0}),
             (aten.bmm.default, (a[None], b[None]), {}),
             (aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {})]
    for op, args, kwargs in cases:
        binding = _binding(op)
        assert binding is not op, op
        torch.testing.assert_close(binding(*args, **kwargs), op(*args, **kwargs), rtol=0, atol=0)
    out_op = aten.mm.out
    got, want = torch.empty(4, 5), torch.empty(4, 5)
    _binding(out_op)(a, b, out=got)
    out_op(a, b, out=want)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # sort's list overloads (sort.int(self, reverse)) require nothing sort.default lacks: kept as the overload
    assert _binding(aten.sort.default) is aten.sort.default
