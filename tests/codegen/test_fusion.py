"""The scheduler on real prim graphs (from aot + prims): fusion decisions, then results vs eager."""
import pytest
import torch

from kiln.codegen import ir
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.lowering import lower_graph
from kiln.codegen.scheduler import schedule


def _kernels(g, examples):
    graph, _ = lower_graph(g, examples)
    sched = schedule(graph)
    return [s for s in sched.steps if isinstance(s, ir.Kernel)], sched


def _check_runs(g, examples):
    """The compiled graph equals the prim graph run eagerly (prims' reference implementations)."""
    # aot's example inputs may be fake tensors: make real ones of the same metadata
    examples = [torch.randn(tuple(x.shape), dtype=x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point()
                else x for x in examples]
    got = compile_prim_graph(g, examples)(*examples)
    ref = g(*examples)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_softmax_forward_and_backward_one_kernel_each(graphs):
    x = torch.randn(8, 32, requires_grad=True)
    fw, bw = graphs(lambda x: torch.softmax(x, -1), x)
    for g, examples in (fw, bw):
        kernels, sched = _kernels(g, examples)
        assert len(kernels) == 1, str(sched)
        assert not any(isinstance(s, ir.ExternKernel) for s in sched.steps)
        _check_runs(g, examples)


def test_layer_norm_forward_one_kernel_backward_row_kernel(graphs):
    x = torch.randn(8, 32, requires_grad=True)
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    fw, bw = graphs(lambda x, w, b: torch.nn.functional.layer_norm(x, (32,), w, b), x, w, b)
    kernels, sched = _kernels(*fw)
    assert len(kernels) == 1, str(sched)
    _check_runs(*fw)
    kernels, sched = _kernels(*bw)
    # grad input (row reductions) is one kernel; grad weight/bias reduce over columns: another
    assert len(kernels) <= 3, str(sched)
    assert sched.refused and all(w.reason for w in sched.refused)
    _check_runs(*bw)


def test_pointwise_chain_fuses_and_intermediates_stay_local(graphs):
    x = torch.randn(64, 16)
    fw, _ = graphs(lambda x: (torch.nn.functional.gelu(x) * 2 + x.sin()).tanh(), x)
    kernels, sched = _kernels(*fw)
    assert len(kernels) == 1
    stores = [s for st in kernels[0].stages for s in st.body if isinstance(s, ir.Store)]
    assert len(stores) == 1, str(sched)          # only the output touches memory
    _check_runs(*fw)


def test_views_become_index_expressions(graphs):
    x = torch.randn(6, 4)
    fw, _ = graphs(lambda x: x.t()[1:3, ::2].exp() + x.view(4, 6)[:2, 1:4].unsqueeze(0), x)
    kernels, sched = _kernels(*fw)
    assert len(kernels) == 1 and not any(isinstance(s, ir.ExternKernel) for s in sched.steps), str(sched)
    _check_runs(*fw)


def _stored(kernel: ir.Kernel) -> list[str]:
    return [s.buffer for st in kernel.stages for s in st.body if isinstance(s, ir.Store)]


def test_softmax_keeps_exp_in_its_output_buffer(graphs):
    """[Note: inner values a later stage reads] The exp a masked softmax normalizes in its last
    stage is written to the output's buffer and reloaded there (no buffer of its own); a fully
    masked row (all -inf) gives eager's NaNs."""
    x = torch.randn(2, 3, 16, 16)
    mask = torch.ones(16, 16, dtype=torch.bool).tril()

    def f(x, mask):
        return torch.softmax(x.masked_fill(~mask, float("-inf")) / 4.0, -1)
    (g, examples), _ = graphs(f, x, mask)
    kernels, sched = _kernels(g, examples)
    assert len(kernels) == 1, str(sched)
    (out,) = set(_stored(kernels[0]))
    assert _stored(kernels[0]) == [out, out], str(kernels[0])
    x[0, 1, 3] = float("-inf")
    (got,) = compile_prim_graph(g, [x, mask])(x, mask)
    torch.testing.assert_close(got, f(x, mask), rtol=1e-6, atol=1e-7, equal_nan=True)
    assert got[0, 1, 3].isnan().all() and not got[0, 1, 2].isnan().any()


def test_a_cheap_inner_value_is_recomputed_in_a_later_stage():
    """buf0 = a + b, realized, read by a row sum (stage 0) and by buf0 - sum (stage 1): recomputed
    in stage 1, never stored. (Lowering inlines most such values itself; this builds the IR.)"""
    from kiln.codegen import cpp
    from kiln.codegen.host import link, plan_host
    x0, x1, r0 = ir.loop_var(0), ir.loop_var(1), ir.reduction_var(0)
    f32 = torch.float32

    def buf(name, sizes):
        return ir.Buffer(name, sizes, ir.contiguous_strides(sizes), f32)
    load = lambda name, index: ir.Load(name, index, f32)
    nodes = (
        ir.ComputedBuffer("buf0", ir.Pointwise((8, 32), ir.Op("add", (load("arg0", 32 * x0 + x1),
                                                                       load("arg1", 32 * x0 + x1)), f32))),
        ir.ComputedBuffer("buf1", ir.Reduction((8,), (32,), "sum", load("buf0", 32 * x0 + r0))),
        ir.ComputedBuffer("buf2", ir.Pointwise((8, 32), ir.Op("sub", (load("buf0", 32 * x0 + x1),
                                                                       load("buf1", x0)), f32))),
    )
    graph = ir.Graph((buf("arg0", (8, 32)), buf("arg1", (8, 32)), buf("buf0", (8, 32)), buf("buf1", (8,)),
                      buf("buf2", (8, 32))), nodes, ("arg0", "arg1"), ("buf2",))
    sched = schedule(graph)
    (kernel,) = [s for s in sched.steps if isinstance(s, ir.Kernel)]
    assert _stored(kernel) == ["buf2"], str(kernel)
    program, binds = plan_host(graph, sched, takes_pointers=True)
    call = link(program, cpp.build([kernel], graph.buffer_map()), {}, binds)
    a, b = torch.randn(8, 32), torch.randn(8, 32)
    (got,) = call(a, b)
    torch.testing.assert_close(got, (a + b) - (a + b).sum(-1, keepdim=True), rtol=1e-5, atol=1e-5)


def test_float_exp_matches_eager_on_special_values():
    """kiln's inlined float exp (cpp.PRELUDE): within 1 ulp of float64, and eager's inf, 0, NaN,
    subnormals and FLT_MAX at the ends of its range."""
    import kiln
    x = torch.cat([torch.linspace(-110, 95, 100_003),
                   torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 88.72, 88.7228,
                                 88.73, -87.3, -103.9, -104.1, 1e-8, -1e-8])])
    kiln.reset()
    got = kiln.compile(lambda t: torch.exp(t) + 0.0, backend="kiln")(x)
    want = torch.exp(x.double())
    torch.testing.assert_close(got.double(), want.float().double(), rtol=2.4e-7, atol=1e-44, equal_nan=True)
    assert torch.equal(torch.isinf(got), torch.isinf(torch.exp(x)))


def test_softmax_computes_each_exp_once_on_cpu(graphs):
    """Lowering realizes a value with an exp that two consumers read (on CPU, an exp costs about a
    store and a reload); the scheduler keeps it in the output's buffer: one exp per element."""
    x = torch.randn(6, 40)
    (g, examples), _ = graphs(lambda x: torch.softmax(x * 0.5, -1), x)
    kernels, sched = _kernels(g, examples)
    assert len(kernels) == 1, str(sched)
    exps = [e for st in kernels[0].stages for s in st.body if hasattr(s, "expr")
            for e in ir.walk(s.expr) if isinstance(e, ir.Op) and e.name == "exp"]
    assert len(exps) == 1, str(kernels[0])
    _check_runs(g, examples)


def test_chained_costly_values_each_find_memory(graphs):
    """sin(x) * 2 kept for the exp's stage, the exp kept for the normalization: a buffer holding
    one value is stored, and holds no other (it was once left unallocated)."""
    x = torch.randn(5, 12)
    (g, examples), _ = graphs(lambda x: torch.softmax(x.sin() * 2, -1) + x.sin(), x)
    kernels, sched = _kernels(g, examples)
    assert len(kernels) == 1, str(sched)
    _check_runs(g, examples)


def test_recomputed_gelu_and_its_gradient_are_one_kernel_across_the_matmuls(graphs):
    """[Note: siblings across an extern]: the backward of linear-gelu-linear recomputes the gelu for
    the second weight's gradient (a matmul reads it) and takes the gelu's gradient after the other
    matmul; both read the first linear's output and are one kernel."""
    import functools
    from kiln.aot import aot_compile, min_cut_partition
    from kiln.prims import RECOMPUTABLE_MOVEMENT, decompositions_for
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))
    x = torch.randn(16, 24)
    captured = {}

    def keep(name):
        def compiler(g, examples):
            captured[name] = (g, examples)
            return g.forward
        return compiler
    gm = torch.fx.symbolic_trace(lambda x, w1, b1, w2, b2: torch.nn.functional.linear(
        torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1)), w2, b2))
    params = [p.detach().requires_grad_() for p in block.parameters()]
    aot_compile(gm, [x, *params], fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                decompositions=decompositions_for(set()),
                partition=functools.partial(min_cut_partition, recomputable_ops=RECOMPUTABLE_MOVEMENT))
    g, examples = captured["bw"]
    kernels, sched = _kernels(g, examples)
    reading_activation = [k for k in kernels if len(k.ranges) == 2 and "erf" in str(k)]
    assert len(reading_activation) == 1, str(sched)
    _check_runs(g, examples)


def test_a_host_value_is_made_before_the_extern_that_reads_it():
    """[Note: host values are read too] `val0` (a number an extern returns) sizes a later extern;
    that extern, ready early by its buffers alone, was moved ahead of the group that an earlier
    extern flushed, before `val0` existed (fuzz seed 1003674: UnboundLocalError in the host program)."""
    import operator
    import sympy
    x0, f32 = ir.loop_var(0), torch.float32
    exp = lambda name: ir.Pointwise((4,), ir.Op("exp", (ir.Load(name, x0, f32),), f32))
    nodes = (ir.ComputedBuffer("buf0", exp("arg0")),
             ir.ExternKernel(("buf1",), torch.ops.aten.neg.default, (ir.BufferArg("buf0"),)),
             ir.ExternKernel(("val0",), operator.mul, (2, 2)),
             ir.ExternKernel(("buf2",), torch.ops.aten.view.default,
                             (ir.BufferArg("arg0"), (ir.SizeArg(sympy.Symbol("val0")),))),
             ir.ComputedBuffer("buf3", exp("buf2")))
    graph = ir.Graph(tuple(ir.Buffer(n, (4,), (1,), f32) for n in ("arg0", "buf0", "buf1", "buf2", "buf3")),
                     nodes, ("arg0",), ("buf1", "buf3"))
    steps = schedule(graph).steps
    at = {s.outputs[0]: i for i, s in enumerate(steps) if isinstance(s, ir.ExternKernel)}
    assert at["val0"] < at["buf2"]
