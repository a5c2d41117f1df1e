"""max-autotune's convolution template ([Note: convolution templates] in kiln/codegen/conv_templates.py):
2-D convolutions as implicit-GEMM Triton template kernels with their epilogue (bias, BatchNorm in
inference, ReLU/SiLU, residual add, cast) fused into the tile's store, run under Triton's interpreter
on CPU tensors and compared with eager; what is refused; and the autotuner timing the template
against the extern convolution with an injected timer (no GPU here).

Shapes are small and odd: channels no multiple of the 16-wide blocks (and one that is), batch 1,
outputs of M = N*Hout*Wout rows in several partial tiles."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen import ir
from kiln.codegen import triton as triton_printer
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.conv_templates import conv_candidates, refusal
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.matmul_templates import ExternChoice, use_matmul_templates
from kiln.codegen.scheduler import schedule
from kiln.codegen.triton import launcher, matmul_autotune
from kiln.codegen.triton.matmul_autotune import EPILOGUE, EXTERN, tune_matmuls
from tests.codegen.conftest import FakeTimer, no_timing

FP32 = dict(rtol=1e-4, atol=1e-4)      # float32 sums over K = Cin*KH*KW in another order than eager's
SMALL = ir.MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2)
WIDE = ir.MatmulConfig(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=3)


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(triton_printer, "matmul_configs", lambda m, n, k, dtype: [SMALL])
    return SMALL


def _lowered(graphs, fn, *inputs):
    (gm, examples), _ = graphs(fn, *inputs)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    return gm, examples, optimize_layouts(dedupe_buffers(graph))


def _convolutions(graph):
    return [n for n in graph.nodes if isinstance(n, ir.ExternKernel) and "convolution" in str(n.op)]


def _check(graphs, fn, *inputs, **tolerances):
    """`fn`'s forward compiled under max-autotune (the template forced: no timer here) equals eager;
    returns the schedule and the program."""
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    sched = schedule(use_matmul_templates(graph, triton_printer.matmul_configs))
    call = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=True)
    got = call(*inputs)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **(tolerances or FP32))
    return sched, call


def _templates(sched):
    return [s for s in sched.steps if isinstance(s, ir.Kernel) and isinstance(s.template, ir.ConvProduct)]


def _extern_convolutions(sched):
    return [s for s in sched.steps if isinstance(s, ir.ExternKernel) and "convolution" in str(s.op)]


def _copies(sched):
    """The layout pass's channels-last copies of graph inputs, which a template reads as the extern
    does ([Note: convolution templates]): kernels that only copy into `*_nhwc` buffers."""
    return [s for s in sched.steps if isinstance(s, ir.Kernel) and s.template is None
            and all(o.endswith("_nhwc") for o in s.origins)]


# (image N, Cin, H, W), (Cout, KH, KW), stride, padding, bias
SHAPES = {
    "1x1": ((2, 5, 7, 6), (11, 1, 1), 1, 0, True),
    "1x1 stride 2, batch 1": ((1, 19, 9, 9), (13, 1, 1), 2, 0, False),
    "3x3 padding 1": ((2, 7, 8, 7), (9, 3, 3), 1, 1, True),
    "3x3 padding 1 stride 2, batch 1": ((1, 17, 9, 10), (20, 3, 3), 2, 1, True),
    "3x3 no padding, channels in whole blocks": ((1, 32, 6, 5), (16, 3, 3), 1, 0, False),
    "5x5 padding 2": ((1, 3, 7, 7), (5, 5, 5), 1, 2, True),
    "3x3 stride 2 rectangular": ((2, 4, 5, 8), (6, 3, 3), (2, 1), (0, 1), True),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_convolution_of_odd_sizes_is_one_template_kernel(graphs, small_tiles, shape):
    (n, cin, h, w), (cout, kh, kw), stride, padding, bias = SHAPES[shape]
    torch.manual_seed(0)
    inputs = [torch.randn(n, cin, h, w), torch.randn(cout, cin, kh, kw)]
    if bias:
        inputs.append(torch.randn(cout))
        fn = lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding)
    else:
        fn = lambda x, w: F.conv2d(x, w, stride=stride, padding=padding)
    sched, _ = _check(graphs, fn, *inputs)
    (kernel,) = _templates(sched)
    assert kernel.template.config == small_tiles and not _extern_convolutions(sched), str(sched)
    # the NCHW image's copy, and a KxK weight's (a 1x1 weight is channels-last already)
    assert len(sched.steps) == 1 + len(_copies(sched)) and len(_copies(sched)) == (1 if kh == 1 else 2), str(sched)


def test_a_channels_last_image_is_read_in_place(graphs, small_tiles):
    """A channels-last graph input: the template reads it through its own strides (no copy kernel
    before it), and its result is stored channels-last too."""
    x = torch.randn(2, 9, 7, 7).to(memory_format=torch.channels_last)
    w = torch.randn(12, 9, 3, 3)
    fn = lambda x, w: F.conv2d(x, w, padding=1, stride=2)
    sched, _ = _check(graphs, fn, x, w)
    (kernel,) = _templates(sched)
    image = kernel.template.a
    assert [int(s) for s in image.strides] == list(x.stride()), str(sched)
    assert not any(isinstance(s, ir.Kernel) and image.name in s.origins for s in sched.steps), str(sched)


def test_bias_batch_norm_relu_and_residual_fuse_into_the_store(graphs, small_tiles):
    """A ResNet block's tail in inference: convolution, BatchNorm's per-channel affine, the residual
    add and ReLU run on the tile; the convolution's result never reaches memory."""
    torch.manual_seed(0)
    x, w, r = torch.randn(2, 6, 9, 9), torch.randn(10, 6, 3, 3), torch.randn(2, 10, 9, 9)
    mean, var, gamma, beta = torch.randn(10), torch.rand(10) + 0.5, torch.randn(10), torch.randn(10)
    fn = lambda x, w, r, mean, var, gamma, beta: F.relu(
        F.batch_norm(F.conv2d(x, w, padding=1), mean, var, gamma, beta, training=False) + r)
    sched, call = _check(graphs, fn, x, w, r, mean, var, gamma, beta)
    (kernel,) = _templates(sched)
    assert len(kernel.origins) > 1, str(sched)                  # the product, then its epilogue
    stores = [s for st in kernel.stages for s in st.body if isinstance(s, ir.Store)]
    assert len(stores) == 1 and kernel.origins[0] in sched.local_buffers, str(sched)
    loaded = {ld.buffer for st in kernel.stages for s in st.body for ld in ir.loads_of(s.expr)}
    assert len(loaded) >= 5, loaded                 # the residual, mean, var, gamma and beta
    assert "_extern" not in call.host_source and not _extern_convolutions(sched), call.host_source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_convolution_with_bias_silu_and_a_cast(graphs, small_tiles, dtype):
    """Half operands: the bias added to the float32 sum and rounded once, SiLU on the tile, then a
    cast to float32 stored: compared by the benchmark's rule against a float64 run."""
    from kiln.bench.accuracy import same
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 13, 8, 8).to(dtype), torch.randn(18, 13, 3, 3).to(dtype), torch.randn(18).to(dtype)
    fn = lambda x, w, b: F.silu(F.conv2d(x, w, b, stride=2, padding=1)).float()
    gm, examples, graph = _lowered(graphs, fn, x, w, b)
    sched = schedule(use_matmul_templates(graph, triton_printer.matmul_configs))
    (kernel,) = _templates(sched)
    assert len(sched.steps) == 1 + len(_copies(sched)) and len(kernel.origins) > 1, str(sched)
    (got,) = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=True)(x, w, b)
    assert got.dtype == torch.float32
    verdict = same(fn(x, w, b), got, fn(x.double(), w.double(), b.double()), tol=1e-2)
    assert verdict.ok, verdict.detail


def test_a_reduction_after_the_convolution_is_refused_with_a_reason(graphs, small_tiles):
    """Global average pooling reads the result along a reduction: refused from the epilogue (the
    scheduler says why), the template stores its result and the mean runs as its own kernel."""
    fn = lambda x, w: F.relu(F.conv2d(x, w)).mean((2, 3))
    sched, _ = _check(graphs, fn, torch.randn(2, 5, 6, 6), torch.randn(7, 5, 1, 1))
    (kernel,) = _templates(sched)
    assert any(kernel.origins[0] in w.group and "reduction" in w.reason for w in sched.refused), str(sched)


@pytest.mark.parametrize("kwargs, why", [
    (dict(groups=2), "groups=2"),
    (dict(dilation=2, padding=2), "dilation"),
])
def test_grouped_and_dilated_convolutions_keep_the_extern(graphs, small_tiles, kwargs, why):
    fn = lambda x, w: F.conv2d(x, w, **kwargs)
    w = torch.randn(6, 4 // kwargs.get("groups", 1), 3, 3)
    gm, examples, graph = _lowered(graphs, fn, torch.randn(1, 4, 9, 9), w)
    (node,) = _convolutions(graph)
    assert why in refusal(node, graph.buffer_map())
    assert [type(c) for c in conv_candidates(node, graph.buffer_map(), triton_printer.matmul_configs)] == [ExternChoice]


@pytest.mark.parametrize("fn, inputs, why", [
    (lambda x, w: F.conv_transpose2d(x, w, stride=2), ((1, 4, 5, 5), (4, 3, 3, 3)), "transposed"),
    (lambda x, w: F.conv1d(x, w), ((1, 4, 9), (3, 4, 3)), "1-D"),
    (lambda x, w: F.conv3d(x, w), ((1, 2, 4, 4, 4), (3, 2, 3, 3, 3)), "3-D"),
])
def test_transposed_and_other_dimensionalities_keep_the_extern(graphs, small_tiles, fn, inputs, why):
    gm, examples, graph = _lowered(graphs, fn, *(torch.randn(*s) for s in inputs))
    (node,) = _convolutions(graph)
    assert why in refusal(node, graph.buffer_map())
    assert not _templates(schedule(use_matmul_templates(graph, triton_printer.matmul_configs)))


def test_default_mode_keeps_the_extern(graphs):
    """Without max-autotune nothing replaces a convolution (no template is used untimed)."""
    fn = lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1))
    x, w, b = torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    gm, examples, _ = _lowered(graphs, fn, x, w, b)
    call = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=False)
    assert "_extern" in call.host_source, call.host_source
    torch.testing.assert_close(call(x, w, b)[0], fn(x, w, b), **FP32)


@pytest.fixture
def tilings(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_printer, "matmul_configs", lambda m, n, k, dtype: [SMALL, WIDE])


@pytest.mark.parametrize("times, picked", [({EXTERN: 3.0, str(SMALL): 2.0, str(WIDE): 1.0}, str(WIDE)),
                                           ({EXTERN: 1.0, EPILOGUE: 0.2, str(SMALL): 2.0, str(WIDE): 1.5}, EXTERN)])
def test_autotuning_times_the_extern_convolution_against_each_tiling(graphs, tilings, monkeypatch, times, picked):
    """The extern convolution, an epilogue pass (the ReLU the template fuses) and each tiling are
    timed on the real shapes; the fastest is kept, and a second compile reads it from disk."""
    fn = lambda x, w, b: F.relu(F.conv2d(x, w, b, stride=2, padding=1))
    inputs = (torch.randn(1, 5, 9, 9), torch.randn(7, 5, 3, 3), torch.randn(7))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    timer = FakeTimer(times)
    tuned, (decision,) = tune_matmuls(graph, triton_printer.matmul_configs, timer)
    assert timer.calls == [EXTERN, EPILOGUE, str(SMALL), str(WIDE)], timer.calls
    assert decision.op == "convolution" and decision.choice == picked and decision.benchmarked == 3, str(decision)
    assert decision.shape == "1x5x9x9 * 7x5x3x3 stride [2, 2] padding [1, 1]" and decision.epilogue, str(decision)
    assert bool(_convolutions(tuned)) == (picked == EXTERN)
    monkeypatch.setattr(matmul_autotune, "device_timer", lambda device: no_timing)
    _, (cached,) = tune_matmuls(graph, triton_printer.matmul_configs)
    assert cached.how == "cache" and cached.choice == picked and cached.benchmarked == 0
    call = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=True)
    torch.testing.assert_close(call(*inputs)[0], fn(*inputs), **FP32)
    assert ("_extern" in call.host_source) == (picked == EXTERN), call.host_source


def test_kiln_compile_a_conv_bn_relu_model_under_max_autotune(small_tiles):
    """Through `kiln.compile(mode="max-autotune")` on the interpreter: Conv2d + BatchNorm2d (eval) +
    ReLU is one template kernel, which records its tiling in its launch."""
    kiln.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(6, 10, 3, padding=1, bias=False), torch.nn.BatchNorm2d(10),
                                torch.nn.ReLU()).eval()
    model[1].running_mean.normal_()
    model[1].running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 6, 7, 7)
    before = {id(k) for k in launcher.BUILT}
    with torch.no_grad():
        got = kiln.compile(model, mode="max-autotune", options={"triton_interpret": True})(x)
        torch.testing.assert_close(got, model(x), **FP32)
    (kernel,) = [k for k in launcher.BUILT if id(k) not in before and k.template is not None]
    (config,) = kernel.configs.values()
    assert config.template == str(SMALL), config.describe()


def test_the_template_compiles_for_sm90_with_vector_loads_and_no_spills(graphs):
    """A ResNet layer's 3x3 convolution (bfloat16, channels-last, 64 channels) with BatchNorm, the
    residual add and ReLU at the printer's first tiling: Triton's compiler for an H100 takes the
    printed CUDA text (which the interpreter never checks), loads in 128-bit vectors and spills
    nothing."""
    pytest.importorskip("triton.backends.nvidia")
    import dataclasses
    from kiln.codegen.triton import heuristics
    from kiln.codegen.triton.offline import compile_for_gpu
    dtype = torch.bfloat16
    x = torch.randn(8, 64, 28, 28, dtype=dtype).to(memory_format=torch.channels_last)
    r = torch.randn(8, 64, 28, 28, dtype=dtype).to(memory_format=torch.channels_last)
    w, *affine = torch.randn(64, 64, 3, 3, dtype=dtype), *(torch.randn(64, dtype=dtype) for _ in range(4))
    fn = lambda x, w, r, mean, var, gamma, beta: F.relu(
        F.batch_norm(F.conv2d(x, w, padding=1), mean, var, gamma, beta, training=False) + r)
    _, _, graph = _lowered(graphs, fn, x, w, r, *affine)
    config = triton_printer.matmul_configs(8 * 28 * 28, 64, 64, dtype)[0]
    (kernel,) = _templates(schedule(use_matmul_templates(graph, lambda *_: [config])))
    assert isinstance(kernel.template, ir.ConvProduct) and len(kernel.origins) > 1
    build = compile_for_gpu(kernel, graph.buffer_map(), [], config=heuristics.template_launch(dataclasses.asdict(config)))
    assert build.vector_loads and build.vector_stores, sorted(build.memory_ops())
    assert build.spill_bytes in (0, None), build.spill_bytes


class _BasicBlock(torch.nn.Module):
    """A ResNet basic block that halves the resolution: 3x3 stride 2, 3x3, and a 1x1 stride-2
    downsample, each followed by a BatchNorm."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + self.down(x))


def test_a_resnet_block_is_three_template_kernels(small_tiles):
    """Inference through `kiln.compile(mode="max-autotune")`: each convolution a template, every
    BatchNorm, ReLU and the residual add in their epilogues; besides them only the channels-last
    copies of the NCHW image and the two 3x3 weights (a 1x1 weight is channels-last already)."""
    kiln.reset()
    torch.manual_seed(0)
    block = _BasicBlock(6, 10).eval()
    for bn in (m for m in block.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 1.5)
        torch.nn.init.normal_(bn.weight)
        torch.nn.init.normal_(bn.bias)
    x = torch.randn(2, 6, 9, 9)
    before = {id(k) for k in launcher.BUILT}
    with torch.no_grad():
        got = kiln.compile(block, mode="max-autotune", options={"triton_interpret": True})(x)
        torch.testing.assert_close(got, block(x), **FP32)
    built = [k for k in launcher.BUILT if id(k) not in before]
    assert len(built) == 6 and sum(k.template is not None for k in built) == 3, [k.name for k in built]


def test_training_step_gradients_match_eager(small_tiles):
    """Forward and backward under max-autotune: the forward's convolutions are templates (a training
    BatchNorm's statistics, reductions, are refused from the epilogue and read the stored result),
    the backward's convolution gradients stay externs, and the gradients are eager's."""
    import copy
    kiln.reset()
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(5, 9, 3, padding=1, stride=2), nn.BatchNorm2d(9), nn.ReLU(), nn.Conv2d(9, 7, 1), nn.SiLU())
    reference = copy.deepcopy(model)
    x = torch.randn(2, 5, 9, 9)
    before = {id(k) for k in launcher.BUILT}
    got = kiln.compile(model, mode="max-autotune", options={"triton_interpret": True})(x)
    want = reference(x)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want, **FP32)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=name)
    templates = [k for k in launcher.BUILT if id(k) not in before and k.template is not None]
    assert len(templates) == 2, [k.name for k in templates]


def test_the_autotuner_reports_why_a_convolution_has_no_template(graphs, tilings, capsys, monkeypatch):
    """A depthwise convolution beside a plain one: the plain one is timed, the depthwise one is the
    extern with the reason, in the decisions (`KILN_LOG=kernels`, the event log, `kiln report`)."""
    monkeypatch.setenv("KILN_LOG", "kernels")
    fn = lambda x, w, d: F.conv2d(F.conv2d(x, w, padding=1), d, groups=7)
    inputs = (torch.randn(1, 5, 6, 6), torch.randn(7, 5, 3, 3), torch.randn(7, 1, 3, 3))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    _, (timed, depthwise) = tune_matmuls(graph, triton_printer.matmul_configs, FakeTimer({}))
    assert timed.how == "timed" and depthwise.choice == EXTERN and depthwise.benchmarked == 0
    assert depthwise.how.startswith("no template: groups=7"), str(depthwise)
    assert depthwise.shape == "1x7x6x6 * 7x1x3x3", str(depthwise)
    assert "no template: groups=7" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(8))
def test_random_convolutions_match_eager(graphs, small_tiles, seed):
    """Random kernel sizes (1-3 a side), strides (1-3 a side), paddings (0-2), channels, batches
    and layouts: the index math ([Note: convolution templates]) against eager's."""
    g = torch.Generator().manual_seed(seed)

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=g))
    kh, kw = pick(1, 3), pick(1, 3)
    stride, padding = (pick(1, 3), pick(1, 3)), (pick(0, min(2, kh)), pick(0, min(2, kw)))
    n, cin, cout, h, w = pick(1, 2), pick(1, 20), pick(1, 20), pick(kh, 11), pick(kw, 11)
    x = torch.randn(n, cin, h, w, generator=g)
    if seed % 2:
        x = x.to(memory_format=torch.channels_last)
    weight, bias = torch.randn(cout, cin, kh, kw, generator=g), torch.randn(cout, generator=g)
    fn = lambda x, weight, bias: torch.relu(F.conv2d(x, weight, bias, stride=stride, padding=padding))
    sched, _ = _check(graphs, fn, x, weight, bias)
    assert len(_templates(sched)) == 1 and not _extern_convolutions(sched), str(sched)
