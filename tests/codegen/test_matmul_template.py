"""max-autotune's matmul template ([Note: matmul templates]): mm, bmm and addmm as Triton template
kernels with their pointwise consumers fused into the tile's store, run under Triton's interpreter
on CPU tensors and compared with eager.

Shapes are small and odd (the interpreter runs numpy per program): M, N and K are no multiples
of the blocks, and `small_tiles` makes the template tile them 16 x 16 x 16 in groups of 2 row
tiles, so several programs, partial tiles and the grouped program order are all exercised."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.bench.accuracy import same
from kiln.codegen import ir
from kiln.codegen import triton as triton_printer
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.matmul_templates import ExternChoice, candidates, use_matmul_templates
from kiln.codegen.scheduler import schedule
from kiln.codegen.trace_events import LAUNCH
from kiln.codegen.triton import launcher

ON = {"triton_interpret": True}
FP32 = dict(rtol=1e-5, atol=1e-5)     # float32 sums over K in another order than eager's


@pytest.fixture
def small_tiles(monkeypatch):
    tiling = ir.MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2)
    monkeypatch.setattr(triton_printer, "matmul_configs", lambda m, n, k, dtype: [tiling])
    return tiling


def _forward(graphs, fn, *inputs):
    (gm, examples), _ = graphs(fn, *inputs)
    return gm, examples


def _schedule(gm, examples):
    """The forward's schedule as max-autotune compiles it for the Triton printer."""
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph))
    return schedule(use_matmul_templates(graph, triton_printer.matmul_configs))


def _program(gm, examples, max_autotune=True, printer=triton_printer):
    return compile_prim_graph(gm, examples, printer=printer, max_autotune=max_autotune)


def _template_kernels(sched):
    return [s for s in sched.steps if isinstance(s, ir.Kernel) and s.template is not None]


def _externs(sched):
    return [s for s in sched.steps if isinstance(s, ir.ExternKernel)]


def _check(graphs, fn, *inputs, **tolerances):
    """`fn`'s forward compiled under max-autotune equals eager; returns its schedule."""
    gm, examples = _forward(graphs, fn, *inputs)
    sched = _schedule(gm, examples)
    got = _program(gm, examples)(*inputs)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **(tolerances or FP32))
    return sched


@pytest.mark.parametrize("m, n, k", [(37, 45, 23), (5, 33, 1), (1, 17, 40)])
def test_mm_of_odd_sizes_is_one_template_kernel(graphs, small_tiles, m, n, k):
    sched = _check(graphs, lambda a, b: torch.mm(a, b), torch.randn(m, k), torch.randn(k, n))
    (kernel,) = _template_kernels(sched)
    assert kernel.template.config == small_tiles and not _externs(sched), str(sched)


def test_mm_of_transposed_operands_reads_them_in_place(graphs, small_tiles):
    a, b = torch.randn(23, 37).t(), torch.randn(45, 23).t()
    sched = _check(graphs, lambda a, b: a @ b, a, b)
    (kernel,) = [s for s in sched.steps if isinstance(s, ir.Kernel)]
    assert kernel.template is not None and not _externs(sched), str(sched)


@pytest.mark.parametrize("batch", [3, 1])
def test_bmm(graphs, small_tiles, batch):
    sched = _check(graphs, lambda a, b: torch.bmm(a, b), torch.randn(batch, 19, 21), torch.randn(batch, 21, 34))
    assert len(_template_kernels(sched)) == 1 and not _externs(sched), str(sched)


def test_bmm_epilogue_reads_a_per_batch_bias(graphs, small_tiles):
    fn = lambda a, b, c: torch.relu(torch.bmm(a, b) + c)
    sched = _check(graphs, fn, torch.randn(3, 19, 21), torch.randn(3, 21, 34), torch.randn(3, 1, 34))
    (kernel,) = sched.steps
    assert kernel.template is not None and len(kernel.origins) == 2, str(sched)


def test_addmm_bias_and_gelu_fuse_into_the_store(graphs, small_tiles):
    """linear + GELU: the bias add and the activation run on the tile; nothing else is launched."""
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    sched = _check(graphs, fn, torch.randn(37, 23), torch.randn(45, 23), torch.randn(45))
    (kernel,) = sched.steps
    assert kernel.template is not None and len(kernel.origins) == 2, str(sched)   # the product, then the rest
    stores = [s for st in kernel.stages for s in st.body if isinstance(s, ir.Store)]
    assert len(stores) == 1, str(sched)      # only the result: the product stays in registers
    assert "BLOCK_M=16" in LAUNCH["kiln.codegen.triton"](kernel, {}, "")     # the event log's launch
    gm, examples = _forward(graphs, fn, torch.randn(37, 23), torch.randn(45, 23), torch.randn(45))
    source = _program(gm, examples).host_source
    assert "_extern" not in source and source.count("kernel") == 1, source


def test_linear_residual_add_and_cast(graphs, small_tiles):
    fn = lambda x, w, b, r: (F.silu(F.linear(x, w, b)) + r).to(torch.float16)
    sched = _check(graphs, fn, torch.randn(37, 23), torch.randn(45, 23), torch.randn(45), torch.randn(37, 45),
                   rtol=1e-3, atol=1e-3)
    assert len(sched.steps) == 1 and sched.steps[0].template is not None, str(sched)


def test_bfloat16_linear_gelu_matches_eager(graphs):
    """bf16 operands: addmm stays one product with its bias (rounded once, as eager's), GELU on the
    tile; compared by the benchmark's accuracy rule against a float64 run."""
    torch.manual_seed(0)
    x, w, b = (torch.randn(*s).to(torch.bfloat16) for s in ((37, 40), (45, 40), (45,)))
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    gm, examples = _forward(graphs, fn, x, w, b)
    sched = _schedule(gm, examples)
    assert len(sched.steps) == 1 and sched.steps[0].template is not None, str(sched)
    (got,) = _program(gm, examples)(x, w, b)
    assert got.dtype == torch.bfloat16
    verdict = same(fn(x, w, b), got, fn(x.double(), w.double(), b.double()), tol=1e-2)
    assert verdict.ok, verdict.detail


def test_a_consumer_reading_the_product_transposed_is_refused(graphs, small_tiles):
    """`(a @ b).t() + c`: the add reads the product at another element than the tile holds, so it
    is refused (with the scheduler's reason) and runs as a kernel of its own on the stored product."""
    fn = lambda a, b, c: (a @ b).t() + c
    sched = _check(graphs, fn, torch.randn(24, 17), torch.randn(17, 24), torch.randn(24, 24))
    template, other = [s for s in sched.steps if isinstance(s, ir.Kernel)]
    assert template.template is not None and other.template is None, str(sched)
    product = template.stages[0].body[0].name
    assert any(isinstance(s, ir.Store) and s.buffer == product for s in template.stages[0].body), str(sched)
    assert any(product in w.group and "reads" in w.reason for w in sched.refused), str(sched)


def test_a_reduction_of_the_product_is_refused(graphs, small_tiles):
    sched = _check(graphs, lambda a, b: (a @ b).sum(1), torch.randn(24, 17), torch.randn(17, 30))
    assert len(_template_kernels(sched)) == 1, str(sched)
    assert any("reduction" in w.reason for w in sched.refused), str(sched)


def test_candidates_list_the_extern_first_then_the_tilings(graphs):
    gm, examples = _forward(graphs, lambda a, b: torch.mm(a, b), torch.randn(37, 23), torch.randn(23, 45))
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES)
    (node,) = [n for n in graph.nodes if isinstance(n, ir.ExternKernel)]
    choices = candidates(node, graph.buffer_map(), triton_printer.matmul_configs)
    assert isinstance(choices[0], ExternChoice) and choices[0].node == node
    tilings = [c.product.config for c in choices[1:]]
    assert tilings and tilings == triton_printer.matmul_configs(37, 45, 23, torch.float32)
    # float64 has no template: the extern alone
    gm, examples = _forward(graphs, lambda a, b: torch.mm(a, b), torch.randn(5, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES)
    (node,) = [n for n in graph.nodes if isinstance(n, ir.ExternKernel)]
    assert [type(c) for c in candidates(node, graph.buffer_map(), triton_printer.matmul_configs)] == [ExternChoice]


def test_default_mode_and_the_cpp_printer_keep_the_extern(graphs):
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    x, w, b = torch.randn(37, 23), torch.randn(45, 23), torch.randn(45)
    gm, examples = _forward(graphs, fn, x, w, b)
    for call in (_program(gm, examples, max_autotune=False), _program(gm, examples, printer=None)):
        assert "_extern" in call.host_source, call.host_source
        torch.testing.assert_close(call(x, w, b)[0], fn(x, w, b), **FP32)


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs", None])
def test_kiln_compile_modes(mode):
    """Through `kiln.compile`: the max-autotune modes build a template kernel (which records its
    tiling in its launch), the default mode none."""
    kiln.reset()
    before = {id(k) for k in launcher.BUILT}
    model = torch.nn.Sequential(torch.nn.Linear(23, 45), torch.nn.ReLU())
    x = torch.randn(37, 23)
    with torch.no_grad():
        got = kiln.compile(model, mode=mode, options=ON)(x)
        torch.testing.assert_close(got, model(x), **FP32)
    templates = [k for k in launcher.BUILT if id(k) not in before and k.template is not None]
    if mode is None:
        assert not templates
        return
    (kernel,) = templates
    (config,) = kernel.configs.values()
    assert config.template == str(ir.MatmulConfig(**kernel.template)) and "BLOCK_M=" in config.describe()


def test_training_step_gradients_match_eager():
    """Forward and backward under max-autotune: the backward's products (of transposed views of the
    saved activations and gradients) are templates too, and the gradients are eager's."""
    import copy
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(23, 45), torch.nn.GELU(), torch.nn.Linear(45, 7))
    twin = copy.deepcopy(model)
    kiln.reset()
    before = {id(k) for k in launcher.BUILT}
    x = torch.randn(37, 23)
    kiln.compile(model, mode="max-autotune", options=ON)(x).square().sum().backward()
    twin(x).square().sum().backward()
    for ours, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)
    templates = [k for k in launcher.BUILT if id(k) not in before and k.template is not None]
    assert len(templates) >= 4, templates       # two products forward, at least two backward
