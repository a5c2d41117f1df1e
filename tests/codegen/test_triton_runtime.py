"""The parts of kiln's Triton path around the kernels: index text that keeps accesses contiguous,
block-size heuristics, the on-disk source cache, and the max-autotune choice and its disk cache."""

import pytest
import torch

from kiln.codegen import ir
from kiln.codegen.triton import autotune, build, heuristics, source_cache
from kiln.runtime import store
from kiln.codegen.triton.heuristics import LaunchConfig
from kiln.codegen.triton.index import IndexPrinter, LoopSpace

s0, s1, s2 = ir.size_var("s0"), ir.size_var("s1"), ir.size_var("s2")
x0, x1, x2, x3 = (ir.loop_var(k) for k in range(4))


def offset(expr, ranges):
    return IndexPrinter([LoopSpace("x", tuple(ranges), "xindex")], {}).offset(expr)


@pytest.mark.parametrize("expr, ranges, text", [
    (x0 * s1 + x1, (s0, s1), "xindex"),                             # contiguous: the flat index
    (x0 * s1 * s2 + x1 * s2 + x2, (s0, s1, s2), "xindex"),
    (x1, (s0, s1), "(xindex - xq0_ * s1)"),                         # a row broadcast over rows
    (x0, (s0, s1), "xq0_"),                                         # one value per row
    (x0 * s2 + x2, (s0, 1, s2), "xindex"),                          # size-1 dims do not break runs
    (x1 * s2 + x2 + 7, (s0, s1, s2), "(xindex - xq0_ * (s1 * s2)) + 7"),   # the two inner dims, shifted
    (x0 * 3 * s2 + x2, (s0, 1, s2), "(3 * s2) * xq0_ + (xindex - xq1_ * s2)"),  # a gap: two runs
    (x1, (4, 8), "(xindex % 8)"),                                   # static ranges: as ever
    (x0 * 24 + x2, (4, 1, 8), "24 * (xindex // 8) + (xindex % 8)"),
])
def test_offsets_collapse_contiguous_runs(expr, ranges, text):
    """[Note: collapsing runs of dims]; with a symbolic range the quotients of the flat index are
    names ([Note: one division per symbolic dim])."""
    assert offset(expr, ranges) == text


def test_quotients_of_a_symbolic_space_are_one_chain():
    space = LoopSpace("x", (s0, 12, s1, 64), "xindex")
    printer = IndexPrinter([space], {})
    text = printer.offset(x0 * 768 * s1 + x1 * 64 + x2 * 768 + x3)      # a head split's read
    assert text == "(768 * s1) * xq0_ + 64 * (xq1_ % 12) + 768 * (xq2_ - xq1_ * s1) + (xindex % 64)"
    assert printer.quotient_lines(space) == ["xq2_ = (xindex // 64)", "xq1_ = (xq2_ // s1)", "xq0_ = (xq1_ // 12)"]


def test_offsets_of_a_transpose_use_per_dim_indices():
    printer = IndexPrinter([LoopSpace("x", (s0, s1), "xindex")], {})
    text = printer.offset(x0 + x1 * s0)
    assert text == "xq0_ + s0 * (xindex - xq0_ * s1)"


def test_heuristics_persistent_rows_fit_registers_and_long_rows_loop():
    softmax_row = heuristics.reduction(8192, 8192)
    assert softmax_row.persistent and softmax_row.RBLOCK == 8192 and softmax_row.XBLOCK == 1
    assert softmax_row.num_warps == 16
    short = heuristics.reduction(10000, 100)
    assert short.persistent and short.RBLOCK == 128 and short.XBLOCK * short.RBLOCK <= 4096
    long = heuristics.reduction(4, 1 << 20)
    assert not long.persistent and long.RBLOCK < (1 << 20)
    pointwise = heuristics.pointwise(8192 * 8192)
    assert pointwise.XBLOCK == 1024 and pointwise.num_warps == 4
    assert heuristics.pointwise(5).XBLOCK == 16
    # the heuristic's choice leads the autotune candidates, which are all distinct
    candidates = heuristics.autotune_candidates("reduction", 8192, 8192)
    assert candidates[0] == softmax_row and len(set(candidates)) == len(candidates) > 1


def test_wide_reductions_launch_enough_programs():
    """ResNet-50's batch norm gradient over its first stage (8192 outputs of 12544, wide in x) ran
    as 128 programs of 64 outputs, one a multiprocessor, at a third of copy bandwidth."""
    for xnumel, rnumel in ((8192, 12544), (16384, 6272), (12288, 3136)):
        config = heuristics.reduction(xnumel, rnumel, rows_contiguous=True)
        assert -(-xnumel // config.XBLOCK) >= heuristics.MIN_WIDE_PROGRAMS, (xnumel, config)
        assert config.XBLOCK >= 16 and config.XBLOCK * config.RBLOCK <= 4096
    assert heuristics.reduction(1 << 20, 3136, rows_contiguous=True).XBLOCK == 64   # plenty of programs


def test_source_cache_writes_once_and_loads_once(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    source = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, XBLOCK: tl.constexpr):\n    pass\n"
    first = source_cache.load_module(source, interpret=True)
    again = source_cache.load_module(source, interpret=True)
    assert first is again
    files = list((tmp_path / "triton").glob("*.py"))
    assert [f.read_text() for f in files] == [source]


def _double_kernel(n):
    bufs = {"a": ir.Buffer("a", (n,), (1,), torch.float32), "o": ir.Buffer("o", (n,), (1,), torch.float32)}
    expr = ir.Op("mul", (ir.Load("a", x0, torch.float32), ir.Constant(2.0, torch.float32)), torch.float32)
    kernel = ir.Kernel("double", (n,), (ir.Stage((), (ir.Store("o", x0, expr),)),), ("a", "o"), ())
    return build([kernel], bufs)["double"]


def test_autotune_picks_the_fastest_config_and_remembers_it_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    n = 3000
    fn = _double_kernel(n)
    a, out = torch.randn(n), torch.zeros(n)
    candidates = heuristics.autotune_candidates("pointwise", n)
    fastest = candidates[2]
    timed = []

    def fake_timer(launch):
        launch()  # each candidate really runs (on clones of the written buffers)
        config = candidates[len(timed)]
        timed.append(config)
        return 1.0 if config == fastest else 5.0

    assert autotune.tune(fn, (n,), [a, out], timer=fake_timer) == fastest
    assert timed == candidates
    assert torch.equal(out, torch.zeros(n)), "timing launches must not write the real output"
    table = store.read_json("autotune", autotune.cache_name(fn))
    assert LaunchConfig(**table[str(n)]) == fastest

    def no_timing(launch):
        raise AssertionError("a cached choice must not be timed again")
    fresh = _double_kernel(n)
    assert autotune.tune(fresh, (n,), [a, out], timer=no_timing) == fastest
    fresh.launch(fastest, [a, out], (n,))
    torch.testing.assert_close(out, a * 2)


def test_index_math_widens_to_int64_only_for_buffers_past_2_to_the_31():
    import triton.language as tl
    bufs = {"a": ir.Buffer("a", (s0, s1), (s1, 1), torch.float32), "o": ir.Buffer("o", (s0, s1), (s1, 1), torch.float32)}
    expr = ir.Load("a", x0 * s1 + x1, torch.float32)
    kernel = ir.Kernel("copy2d", (s0, s1), (ir.Stage((), (ir.Store("o", x0 * s1 + x1, expr),)),), ("a", "o"), (s0, s1))
    fn = build([kernel], bufs)["copy2d"]
    assert fn.plan((8192, 8192), []).index_dtype == tl.int32      # planned only: nothing is launched
    assert fn.plan((65536, 32768), []).index_dtype == tl.int64
    assert fn.plan((0, 5), []) is None                             # empty output: no launch at all


def test_static_cuda_kernels_are_precompiled_with_their_first_launch_arguments(monkeypatch):
    # No GPU here: record the warmup calls (Triton's JIT warmup needs a driver) and check they
    # bind to the printed signature with the launch's numels and constexprs.
    import inspect

    from kiln.codegen.triton import launcher
    calls = []

    def fake_warmup(self):
        plan = self.plans[()] = self.plan((), ())
        fn = plan.fn
        inspect.signature(fn.fn).bind(*self.arg_dtypes, *plan.numels, XBLOCK=plan.config.XBLOCK,
                                      RBLOCK=plan.config.RBLOCK, INDEX_DTYPE=plan.index_dtype)
        calls.append((self.layout.name, plan.numels, tuple(self.arg_dtypes)))

    monkeypatch.setattr(launcher.TritonKernel, "warmup", fake_warmup)
    static = {"a": ir.Buffer("a", (6, 40), (40, 1), torch.bfloat16, device="cuda"),
              "o": ir.Buffer("o", (6,), (1,), torch.float32, device="cuda")}
    r0 = ir.reduction_var(0)
    k_static = ir.Kernel("rowsum", (6,), (ir.Stage((40,), (ir.Accumulate("t", "sum", ir.Load("a", x0 * 40 + r0, torch.bfloat16)),)),
                                          ir.Stage((), (ir.Store("o", x0, ir.Var("t", torch.float32)),))), ("a", "o"), ())
    symbolic = {"b": ir.Buffer("b", (s0,), (1,), torch.float32, device="cuda")}
    k_symbolic = ir.Kernel("fill", (s0,), (ir.Stage((), (ir.Store("b", x0, ir.Constant(1.0, torch.float32)),)),), ("b",), (s0,))
    fns = build([k_static, k_symbolic], {**static, **symbolic})
    assert calls == [("rowsum", (6, 40), (torch.bfloat16, torch.float32))]
    assert () in fns["rowsum"].plans and not fns["fill"].plans
