"""The GEMV form of the matmul template ([Note: the GEMV form], [Note: GEMV by default]): products of
a few rows (decoding's) as Triton kernels with their bias, activation and residual fused, used by
default where the rule says so, run under Triton's interpreter on CPU tensors and compared with
eager (float32 closely, bfloat16 by the benchmark's rule against float64).

The rule's size thresholds (a weight of 1 MiB, 132 column blocks) would make every shape here
slow under the interpreter, so most tests lower them (`any_size`); `test_a_decode_shape_...` keeps
them and compiles a real 1 MiB layer. M, N and K are no multiples of the blocks (3 rows in a
4-row block, 77 columns in blocks of 4, K = 300 in steps of 256), so the masked paths run."""
import dataclasses

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
from kiln.codegen.triton import heuristics, launcher, matmul_autotune
from kiln.codegen.triton.heuristics import default_matmul_configs, gemv_config, matmul_configs
from tests.codegen.conftest import compare_with_eager

ON = {"triton_interpret": True}
FP32 = dict(rtol=1e-5, atol=1e-5)     # float32 sums over K in another order than eager's


def _schedule(graphs, fn, *inputs, configs_for=None):
    """`fn`'s forward scheduled as the default mode compiles it for the Triton printer."""
    (gm, examples), _ = graphs(fn, *inputs)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    graph = optimize_layouts(dedupe_buffers(graph))
    return schedule(use_matmul_templates(graph, configs_for or triton_printer.default_matmul_configs)), gm, examples


def _gemvs(sched):
    return [s for s in sched.steps if isinstance(s, ir.Kernel) and s.template is not None
            and s.template.config.form == "gemv"]


def _externs(sched):
    return [s for s in sched.steps if isinstance(s, ir.ExternKernel)]


# -- the rule

@pytest.mark.parametrize("shape, block_n, block_k", [
    ((1, 7680, 2560), 8, 512),      # dolly qkv: the probe's best tiling
    ((1, 10240, 2560), 16, 512),    # dolly fc1
    ((1, 2560, 10240), 4, 512),     # dolly fc2
    ((1, 2048, 2048), 4, 256),      # LLaMA o
    ((1, 11264, 2048), 16, 256),    # LLaMA gate+up
    ((4, 32000, 2048), 16, 256),    # LLaMA's head at 4 rows
])
def test_the_default_rule_takes_the_probes_tilings(shape, block_n, block_k):
    m, n, k = shape
    (config,) = default_matmul_configs(m, n, k, torch.bfloat16)
    assert (config.form, config.BLOCK_M, config.BLOCK_N, config.BLOCK_K) == ("gemv", m, block_n, block_k), config
    (half_k,) = default_matmul_configs(m, n, k, torch.float32)      # float32: the same bytes a step
    assert half_k.BLOCK_K == (256 if k * 4 > 4096 else 128), half_k


@pytest.mark.parametrize("shape, dtype, why", [
    ((5, 7680, 2560), torch.bfloat16, "more rows than GEMV_DEFAULT_ROWS"),
    ((16, 7680, 2560), torch.bfloat16, "16 rows: the tensor cores' (the probe: no faster than cuBLAS)"),
    ((1, 512, 512), torch.bfloat16, "a 512 KiB weight"),
    ((1, 256, 8192), torch.bfloat16, "4 MiB, but 64 column blocks for 132 SMs"),
])
def test_the_default_rule_keeps_the_extern(shape, dtype, why):
    assert default_matmul_configs(*shape, dtype) == [], why


def test_max_autotune_offers_gemv_tilings_first_for_few_rows():
    configs = matmul_configs(3, 7680, 2560, torch.bfloat16)
    forms = [c.form for c in configs]
    assert forms[0] == "gemv" and configs[0] == gemv_config(3, 7680, 2560, torch.bfloat16)
    assert forms.count("gemv") >= 5 and "dot" in forms and len(set(configs)) == len(configs)
    assert all(c.BLOCK_M == 4 for c in configs if c.form == "gemv")
    assert "gemv" not in [c.form for c in matmul_configs(9, 7680, 2560, torch.bfloat16)]


# -- numerics under the default mode

def _mm(x, w, b, r):
    return x @ w.t()


def _addmm(x, w, b, r):
    return F.linear(x, w, b)


def _gelu_residual(x, w, b, r):
    return F.gelu(F.linear(x, w, b)) + r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("fn", [_mm, _addmm, _gelu_residual])
@pytest.mark.parametrize("k", [300, 512])
def test_default_mode_computes_few_row_products_as_one_gemv_kernel(graphs, any_size, fn, m, dtype, k):
    """mm, linear with a bias (addmm, or for float32 mm + add: the add on the tile either way) and
    linear + GELU + residual (all fused into the product's store): one kernel, no extern, eager's
    answer. K = 300 masks its last step, 512 none."""
    torch.manual_seed(0)
    n = 77
    inputs = [torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype) / k ** 0.5,
              torch.randn(n).to(dtype), torch.randn(m, n).to(dtype)]
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    (kernel,) = sched.steps         # the epilogue in the product's kernel
    assert kernel.template is not None and kernel.template.config.form == "gemv", str(sched)
    assert kernel.template.config.BLOCK_M >= m and n % kernel.template.config.BLOCK_N != 0
    program = compile_prim_graph(gm, examples, printer=triton_printer)
    assert "_extern" not in program.host_source, program.host_source
    (got,) = program(*inputs)
    compare_with_eager(fn, got, inputs, dtype)


def test_a_batched_product_of_few_rows(graphs, monkeypatch):
    """bmm in the GEMV form (a batch element a group of programs), each batch's B read along K."""
    tiling = gemv_config(2, 33, 40, torch.float32, block_n=8, block_k=16)
    monkeypatch.setattr(triton_printer, "matmul_configs", lambda m, n, k, dtype: [tiling])
    a, w = torch.randn(3, 2, 40), torch.randn(3, 33, 40)
    fn = lambda a, w: torch.relu(torch.bmm(a, w.transpose(1, 2)))
    sched, gm, examples = _schedule(graphs, fn, a, w, configs_for=triton_printer.matmul_configs)
    (kernel,) = sched.steps
    assert kernel.template.config == tiling, str(sched)
    (got,) = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=True)(a, w)
    torch.testing.assert_close(got, fn(a, w), **FP32)


# -- where the GEMV is not used

def test_many_rows_keep_the_extern(graphs, any_size):
    fn = _gelu_residual
    inputs = [torch.randn(40, 64), torch.randn(77, 64), torch.randn(77), torch.randn(40, 77)]
    sched, gm, examples = _schedule(graphs, fn, *inputs)
    assert not _gemvs(sched) and len(_externs(sched)) == 1, str(sched)
    program = compile_prim_graph(gm, examples, printer=triton_printer)
    assert "_extern" in program.host_source
    torch.testing.assert_close(program(*inputs)[0], fn(*inputs), **FP32)


def test_a_weight_not_contiguous_along_k_keeps_the_extern(graphs, any_size):
    """`x @ w` with w `[K, N]` row-major: the GEMV would read B across K; the extern stays, and
    max-autotune is not offered the form either."""
    x, w = torch.randn(1, 64), torch.randn(64, 77)
    sched, gm, examples = _schedule(graphs, lambda x, w: x @ w, x, w)
    assert not _gemvs(sched) and _externs(sched), str(sched)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES)
    (node,) = [n for n in graph.nodes if isinstance(n, ir.ExternKernel)]
    choices = candidates(node, graph.buffer_map(), triton_printer.matmul_configs)
    assert isinstance(choices[0], ExternChoice) and len(choices) > 1
    assert all(c.product.config.form == "dot" for c in choices[1:])


def test_the_cpp_printer_keeps_the_extern(graphs, any_size):
    inputs = [torch.randn(1, 64), torch.randn(77, 64), torch.randn(77), torch.randn(1, 77)]
    (gm, examples), _ = graphs(_gelu_residual, *inputs)
    program = compile_prim_graph(gm, examples, use_cache=False)     # the device's own: C++
    assert "_extern" in program.host_source
    torch.testing.assert_close(program(*inputs)[0], _gelu_residual(*inputs), **FP32)


# -- through kiln.compile, at the rule's own thresholds

def test_a_decode_shape_compiles_to_a_gemv_by_default():
    """A bfloat16 layer of 1 MiB (512 -> 1024) at one token, linear + GELU + residual, the rule's
    thresholds as they are: kiln.compile's default mode builds one GEMV kernel, no extern call."""
    torch.manual_seed(0)
    kiln.reset()
    before = {id(k) for k in launcher.BUILT}
    layer = torch.nn.Linear(512, 1024).to(torch.bfloat16)
    fn = lambda x, r: F.gelu(layer(x)) + r
    x, r = torch.randn(1, 512).to(torch.bfloat16), torch.randn(1, 1024).to(torch.bfloat16)
    with torch.no_grad():
        got = kiln.compile(fn, options=ON)(x, r)
        want = fn(x, r)
        verdict = same(want, got, F.gelu(F.linear(x.double(), layer.weight.double(), layer.bias.double())) + r.double(),
                       tol=1e-2)
    assert verdict.ok, verdict.detail
    built = [k for k in launcher.BUILT if id(k) not in before]
    assert [k.template["form"] for k in built if k.template] == ["gemv"], built
    assert len(built) == 1, built         # the bias, GELU and the residual add in its epilogue


def test_max_autotune_times_the_gemv_against_the_extern(graphs, monkeypatch, tmp_path):
    """The autotuner's candidates for one row include the GEMV tilings; when they time fastest the
    product is one, and still eager's answer."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    timed = []

    def timer(trial):
        timed.append(trial.label)
        trial()
        return 1.0 if trial.label.startswith("gemv") else 5.0
    monkeypatch.setattr(matmul_autotune, "device_timer", lambda device: timer)
    inputs = [torch.randn(1, 300), torch.randn(77, 300), torch.randn(77), torch.randn(1, 77)]
    (gm, examples), _ = graphs(_gelu_residual, *inputs)
    program = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=True)
    assert "extern" in timed and any(t.startswith("gemv") for t in timed) and any(t.startswith("BLOCK_M") for t in timed)
    assert "_extern" not in program.host_source
    torch.testing.assert_close(program(*inputs)[0], _gelu_residual(*inputs), **FP32)


# -- the GPU text, compiled for sm_90 without a GPU

@pytest.mark.parametrize("m, dtype", [(1, torch.bfloat16), (4, torch.bfloat16), (1, torch.float32)])
def test_the_gemv_compiles_for_sm90_with_vector_loads_and_no_spills(graphs, m, dtype):
    """dolly's qkv product with its epilogue at the rule's tiling: Triton's compiler for an H100
    takes the printed GEMV (the interpreter never checks that), reads the weight in 128-bit loads
    and keeps every row's sums in registers."""
    pytest.importorskip("triton.backends.nvidia")
    from kiln.codegen.triton.offline import compile_for_gpu
    k, n = 2560, 7680
    inputs = [torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.randn(n).to(dtype), torch.randn(m, n).to(dtype)]
    sched, gm, examples = _schedule(graphs, _gelu_residual, *inputs)
    (kernel,) = sched.steps
    assert kernel.template.config == gemv_config(m, n, k, dtype), str(sched)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    config = heuristics.template_launch(dataclasses.asdict(kernel.template.config))
    build = compile_for_gpu(kernel, graph.buffer_map(), [], config=config)
    assert build.vector_loads, sorted(build.memory_ops())
    assert build.spill_bytes in (0, None), build.spill_bytes
