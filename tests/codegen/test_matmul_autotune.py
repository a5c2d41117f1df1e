"""max-autotune's timed choice of each matrix product ([Note: matmul autotuning]): the extern against
each template tiling, the epilogue rule, the choice remembered on disk, and what the logs and the
report show. There is no GPU here: Triton's interpreter runs the kernels on CPU tensors and a
deterministic timer, injected for `device_timer`, answers by candidate (every candidate still runs
once, so each standalone template kernel is built and launched). Every compiled result is compared
with eager at odd shapes (M, N, K no multiples of the blocks, K = 1, a batch of 1)."""
import pytest
import torch
import torch.nn.functional as F

from kiln import trace
from kiln.codegen import ir
from kiln.codegen import triton as triton_printer
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.triton import heuristics, matmul_autotune
from kiln.codegen.triton.matmul_autotune import EPILOGUE, EXTERN, tune_matmuls
from tests.codegen.conftest import FakeTimer, compile_traced, no_timing

FP32 = dict(rtol=1e-5, atol=1e-5)
SMALL = ir.MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2)
WIDE = ir.MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=3)


@pytest.fixture
def tilings(monkeypatch, tmp_path):
    """Two small tilings, and a private disk cache."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_printer, "matmul_configs", lambda m, n, k, dtype: [SMALL, WIDE])
    return SMALL, WIDE


def _use_timer(monkeypatch, timer):
    monkeypatch.setattr(matmul_autotune, "device_timer", lambda device: timer)


def _lowered(graphs, fn, *inputs):
    (gm, examples), _ = graphs(fn, *inputs)
    graph, _ = lower_graph(gm, examples, triton_printer.KERNEL_DTYPES, triton_printer.SPLIT_REDUCTIONS)
    return gm, examples, optimize_layouts(dedupe_buffers(graph))


def _compiled_equals_eager(gm, examples, fn, inputs, **tolerances):
    call = compile_prim_graph(gm, examples, printer=triton_printer, max_autotune=True)
    got = call(*inputs)
    want = fn(*inputs)
    torch.testing.assert_close(got[0], want, **(tolerances or FP32))
    return call


def _chosen(graph):
    return [n.product.config if isinstance(n, ir.MatmulTemplate) else EXTERN for n in graph.nodes
            if isinstance(n, ir.MatmulTemplate) or (isinstance(n, ir.ExternKernel) and "mm" in str(n.op))]


@pytest.mark.parametrize("m, n, k", [(37, 45, 23), (5, 33, 1), (1, 17, 40), (33, 45, 32)])   # the last: K in whole steps
def test_the_fastest_tiling_is_kept_and_a_second_compile_times_nothing(graphs, tilings, monkeypatch, m, n, k):
    fn = lambda a, b: torch.mm(a, b)
    inputs = (torch.randn(m, k), torch.randn(k, n))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    timer = FakeTimer({EXTERN: 3.0, str(SMALL): 2.0, str(WIDE): 1.0})
    tuned, (decision,) = tune_matmuls(graph, triton_printer.matmul_configs, timer)
    assert timer.calls == [EXTERN, str(SMALL), str(WIDE)]          # no epilogue: no epilogue pass
    assert decision.choice == str(WIDE) and decision.benchmarked == 3 and decision.how == "timed"
    assert _chosen(tuned) == [WIDE]
    # the second compile, through the whole code generator: the cached choice, nothing timed
    _use_timer(monkeypatch, no_timing)
    again, (cached,) = tune_matmuls(graph, triton_printer.matmul_configs)
    assert cached.choice == str(WIDE) and cached.benchmarked == 0 and cached.how == "cache"
    assert cached.timings == decision.timings and _chosen(again) == [WIDE]
    call = _compiled_equals_eager(gm, examples, fn, inputs)
    assert "_extern" not in call.host_source, call.host_source


def test_the_extern_wins_when_it_is_fastest(graphs, tilings, monkeypatch):
    fn = lambda a, b: torch.mm(a, b)
    inputs = (torch.randn(37, 23), torch.randn(23, 45))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    _use_timer(monkeypatch, FakeTimer({EXTERN: 1.0, str(SMALL): 2.0, str(WIDE): 1.5}))
    tuned, (decision,) = tune_matmuls(graph, triton_printer.matmul_configs)
    assert decision.choice == EXTERN and _chosen(tuned) == [EXTERN]
    call = _compiled_equals_eager(gm, examples, fn, inputs)
    assert "_extern" in call.host_source, call.host_source


@pytest.mark.parametrize("template_ms, picked", [(1.2, str(WIDE)), (1.6, EXTERN)])
def test_an_epilogue_counts_against_the_extern(graphs, tilings, monkeypatch, template_ms, picked):
    """linear + GELU: the template stores GELU's result; the extern needs a kernel after it, whose
    estimate (the epilogue pass) is added to the extern's time: 1.0 + 0.5 against the template."""
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    inputs = (torch.randn(37, 23), torch.randn(45, 23), torch.randn(45))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    timer = FakeTimer({EXTERN: 1.0, EPILOGUE: 0.5, str(WIDE): template_ms})
    _use_timer(monkeypatch, timer)
    tuned, (decision,) = tune_matmuls(graph, triton_printer.matmul_configs)
    assert timer.calls == [EXTERN, EPILOGUE, str(SMALL), str(WIDE)]
    assert decision.epilogue and decision.benchmarked == 3 and decision.choice == picked, str(decision)
    assert _chosen(tuned) == [WIDE if picked != EXTERN else EXTERN]
    _use_timer(monkeypatch, no_timing)
    _compiled_equals_eager(gm, examples, fn, inputs)


def test_no_epilogue_no_epilogue_pass(graphs, tilings, monkeypatch):
    """The same timings as above for a bfloat16 addmm alone (one product whose bias is the extern's
    own, rounded once): no epilogue pass, and the extern alone is faster than the template."""
    fn = lambda x, w, b: torch.addmm(b, x, w)
    inputs = tuple(torch.randn(*s).to(torch.bfloat16) for s in ((37, 23), (23, 45), (45,)))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    timer = FakeTimer({EXTERN: 1.0, EPILOGUE: 0.5, str(WIDE): 1.2})
    _use_timer(monkeypatch, timer)
    _, (decision,) = tune_matmuls(graph, triton_printer.matmul_configs)
    assert EPILOGUE not in timer.calls and not decision.epilogue and decision.choice == EXTERN, str(decision)
    assert decision.op == "addmm" and decision.dtype == "bfloat16"
    _use_timer(monkeypatch, no_timing)
    _compiled_equals_eager(gm, examples, fn, inputs, rtol=0, atol=0)     # eager's own addmm


@pytest.mark.parametrize("batch", [1, 3])
def test_bmm_with_a_fused_bias_and_a_tiling_that_fails(graphs, tilings, monkeypatch, batch):
    fn = lambda a, b, c: torch.relu(torch.bmm(a, b) + c)
    inputs = (torch.randn(batch, 19, 21), torch.randn(batch, 21, 34), torch.randn(batch, 1, 34))
    gm, examples, graph = _lowered(graphs, fn, *inputs)
    timer = FakeTimer({EXTERN: 5.0, str(SMALL): 2.0, str(WIDE): 1.0}, fail=(str(WIDE),))
    _use_timer(monkeypatch, timer)
    with pytest.warns(UserWarning, match="out of resources"):
        _, (decision,) = tune_matmuls(graph, triton_printer.matmul_configs)
    assert decision.choice == str(SMALL) and str(WIDE) not in decision.timings, str(decision)
    assert decision.shape == f"{batch}x19x34x21" and decision.benchmarked == 2
    _use_timer(monkeypatch, no_timing)
    _compiled_equals_eager(gm, examples, fn, inputs)


def test_kiln_compile_under_max_autotune_logs_and_reports_the_choice(tilings, monkeypatch, capsys, tmp_path):
    """Through kiln.compile: KILN_LOG=kernels prints each product's choice and the configurations
    benchmarked, the event log carries them into `kiln report`, and a second process-like compile
    (kiln.reset) reads the choice from the disk cache: 0 benchmarked."""
    from kiln.report.page import render
    from kiln.report.run import read_run
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(23, 45), torch.nn.GELU(), torch.nn.Linear(45, 7))
    x = torch.randn(37, 23)
    timer = FakeTimer({str(WIDE): 1.0, EXTERN: 2.0})
    _use_timer(monkeypatch, timer)
    monkeypatch.setenv("KILN_LOG", "kernels")
    benchmarked = []
    for run in range(2):
        folder = tmp_path / f"trace{run}"
        got, decisions = compile_traced(model, (x,), folder, mode="max-autotune", options={"triton_interpret": True})
        torch.testing.assert_close(got, model(x), **FP32)
        assert [d["choice"] for d in decisions] == [str(WIDE)] * 2
        benchmarked.append(sum(d["benchmarked"] for d in decisions))
        page = render(read_run(str(folder / trace.TRACE_FILE)))
        assert f"{benchmarked[-1]} configurations benchmarked" in page and "BLOCK_N=32" in page
        _use_timer(monkeypatch, no_timing)
    assert benchmarked == [6, 0]
    err = capsys.readouterr().err
    assert err.count("[kiln kernels] matmul autotune") == 2 and "3 configurations benchmarked" in err
    assert "(cache; 0 configurations benchmarked)" in err


def test_large_products_are_offered_large_tilings():
    """Big products get 128 x 256 (and 256 x 128) tiles with K in steps of 64 and 8 warps among the
    candidates; every tiling fits the shared memory budget; small products get clamped blocks."""
    big = heuristics.matmul_configs(4096, 4096, 4096, torch.bfloat16)
    assert len(set(big)) == len(big)
    assert any((c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_warps) == (128, 256, 64, 8) for c in big)
    assert any((c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_warps) == (256, 128, 64, 8) for c in big)
    for dtype in (torch.bfloat16, torch.float32):
        for c in heuristics.matmul_configs(4096, 4096, 4096, dtype):
            smem = (c.BLOCK_M + c.BLOCK_N) * c.BLOCK_K * dtype.itemsize * c.num_stages
            assert smem <= heuristics.MATMUL_SHARED_MEMORY, (c, dtype)
    small = heuristics.matmul_configs(20, 33, 1, torch.float32)
    assert all(c.BLOCK_M <= 32 and c.BLOCK_N <= 64 and c.BLOCK_K == 16 for c in small), small


def test_a_large_tiling_computes_eager_results_at_odd_sizes(graphs, monkeypatch):
    """The largest tiling the printer offers, at a product larger than one tile in each dim whose
    sizes are no multiple of it."""
    big = max(heuristics.matmul_configs(4096, 4096, 4096, torch.float32), key=lambda c: c.BLOCK_M * c.BLOCK_N)
    monkeypatch.setattr(triton_printer, "matmul_configs", lambda m, n, k, dtype: [big])
    fn = lambda x, w, b: torch.tanh(F.linear(x, w, b))
    inputs = (torch.randn(big.BLOCK_M + 3, 70), torch.randn(big.BLOCK_N + 5, 70), torch.randn(big.BLOCK_N + 5))
    gm, examples, _ = _lowered(graphs, fn, *inputs)
    _compiled_equals_eager(gm, examples, fn, inputs, rtol=1e-4, atol=1e-4)
