"""Programs through kiln's whole pipeline with Triton kernels: aot autograd -> prims -> lowering ->
scheduler -> the Triton printer -> Triton's interpreter on CPU tensors, forward and backward, vs
eager in float64.

The kiln backend sends CPU tensors to the C++ printer, so here the printer is chosen explicitly:
`triton_compiler` is `compile_prim_graph` with the Triton printer in place of C++.
"""
import torch
import torch.nn.functional as F

from kiln.codegen import ir
from kiln.codegen import triton as triton_printer


def triton_compiler(kernels_seen: list, split_reductions: bool = False, graphs: list | None = None):
    from kiln.codegen.host import link, plan_host
    from kiln.codegen.lowering import lower_graph
    from kiln.codegen.scheduler import schedule

    def compile_one(gm, example_inputs):
        graph, constants = lower_graph(gm, example_inputs, triton_printer.KERNEL_DTYPES, split_reductions)
        if graphs is not None:
            graphs.append(graph)
        sched = schedule(graph)
        kernels = [s for s in sched.steps if isinstance(s, ir.Kernel)]
        fns = triton_printer.build(kernels, graph.buffer_map())
        kernels_seen.extend(fns.values())
        program, binds = plan_host(graph, sched, takes_pointers=False)
        return link(program, fns, constants, binds)
    return compile_one


def compiled(fn, example_inputs, kernels_seen):
    from kiln.aot import aot_compile
    from kiln.prims import decompositions_for

    gm = torch.fx.symbolic_trace(fn)
    compiler = triton_compiler(kernels_seen)
    return aot_compile(gm, list(example_inputs), fw_compiler=compiler, bw_compiler=compiler,
                       decompositions=decompositions_for(set()))


def check(fn, *inputs, grad=True, max_kernels=None, rtol=1e-4, atol=1e-5):
    """Forward (and backward, for inputs that require grad) through Triton kernels vs float64 eager."""
    inputs = [x.detach().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    kernels = []
    out = compiled(fn, inputs, kernels)(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref_inputs = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x
                  for x in inputs]
    ref = fn(*ref_inputs)
    torch.testing.assert_close(out.double() if out.is_floating_point() else out, ref, rtol=rtol, atol=atol)
    assert kernels, "no Triton kernel was built: the test would compare eager with eager"
    if max_kernels is not None:
        assert len(kernels) <= max_kernels, [k.layout.name for k in kernels]
    if grad and out.requires_grad:
        tangent = torch.randn_like(out)
        got = torch.autograd.grad(out, [x for x in inputs if x.requires_grad], tangent)
        want = torch.autograd.grad(ref, [x for x in ref_inputs if x.requires_grad], tangent.double())
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, rtol=rtol, atol=atol)
    return kernels


def test_softmax_forward_is_one_kernel_and_backward_matches():
    x = torch.randn(6, 45) * 3
    kernels = check(lambda x: torch.softmax(x, -1), x)
    forward = [k for k in kernels if "max" in k.source and "exp" in k.source]
    assert forward and forward[0].layout.kind == "reduction"


def test_layer_norm_forward_backward():
    x, w, b = torch.randn(5, 40), torch.randn(40), torch.randn(40)
    check(lambda x, w, b: F.layer_norm(x, (40,), w, b, 1e-5), x, w, b)


def test_gelu_chain_is_fused():
    x = torch.randn(7, 33)
    check(lambda x: F.gelu(torch.tanh(x) * 2 + 1) * x, x, grad=True)


def test_var_mean_sum_over_outer_dim_and_argmax():
    x = torch.randn(9, 20)
    check(lambda x: torch.var(x, dim=1) + x.mean(1), x, rtol=1e-4, atol=1e-5)
    check(lambda x: x.sum(0) * 2, x)
    check(lambda x: torch.argmax(x, dim=1), x, grad=False)


def test_cumsum_forward_backward():
    x = torch.randn(4, 30)
    check(lambda x: torch.cumsum(x, 1) * 0.5, x)


def _split_compiled(fn, inputs):
    """`fn` through kiln with the Triton printer and split reductions, and the loop IR of its graphs."""
    from kiln.aot import aot_compile
    from kiln.prims import decompositions_for
    graphs = []
    compiler = triton_compiler([], split_reductions=True, graphs=graphs)
    return aot_compile(torch.fx.symbolic_trace(fn), list(inputs), fw_compiler=compiler, bw_compiler=compiler,
                       decompositions=decompositions_for(set())), graphs


def test_split_reductions_match_eager_forward_and_backward():
    # a bias gradient (a column sum over many rows), a full sum, a max over rows: each split in two passes
    def f(x, b):
        y = x + b
        return y.sum(0), y.sum(), y.amax(0), (y * y).sum()
    x, b = torch.randn(4096, 96).requires_grad_(), torch.randn(96).requires_grad_()
    compiled, graphs = _split_compiled(f, [x, b])
    got = compiled(x, b)
    want = f(x.double(), b.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)
    partials = [n for g in graphs for n in g.nodes if isinstance(n, ir.ComputedBuffer)
                and isinstance(n.body, ir.Reduction) and len(n.body.ranges) > 0 and n.body.ranges[0] != 96]
    assert partials, "no reduction was split"
    grads = torch.autograd.grad(sum(t.sum() for t in got), [x, b])
    want_grads = torch.autograd.grad(sum(t.sum() for t in f(x.double(), b.double())), [x, b])
    # the backward of y.sum(0) and of the full sums is pointwise; the bias gradient is a split column sum
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=1e-4)
