"""The benchmark harness: a wrong compiler is fail_accuracy, a crashing, dying or hanging one is
fail_to_run, kiln's missing parts are not_yet, and a tiny `kiln bench` run writes its files."""
import json
import textwrap

import pytest
import torch

from kiln.bench import case as bench_case
from kiln.bench.__main__ import build_cases, main, parser
from kiln.bench.case import Case, run, status_of_error
from kiln.bench.harness import run_case
from kiln.errors import CompileStageError, NotYetImplemented

COMPILERS = textwrap.dedent("""
    import os, time
    import kiln

    def wrong(model):                      # off by 1% and a bit: far outside any tolerance
        return lambda *args, **kwargs: model(*args, **kwargs) * 1.01 + 1e-3

    def fx_eager(model):                   # a correct compiler: kiln's capture, graphs run as FX
        return kiln.compile(model, backend="eager")

    def crash(model):
        def compiled(*args, **kwargs):
            raise RuntimeError("deliberate crash in the compiled model\\nsecond line")
        return compiled

    def die(model):
        os._exit(3)

    def hang(model):
        time.sleep(3600)
""")


@pytest.fixture
def custom_compilers(tmp_path, monkeypatch):
    (tmp_path / "bench_test_compilers.py").write_text(COMPILERS)
    monkeypatch.syspath_prepend(str(tmp_path))                  # this process
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))             # the case processes
    return "bench_test_compilers"


def tiny(compiler, mode="infer", model="mlp", **kw):
    return Case("zoo", model, mode, "fp32", compiler, steps=3, warmup=1, size="test", **kw)


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_wrong_compiler_is_fail_accuracy_and_a_correct_one_passes(custom_compilers, mode):
    wrong = run(tiny(f"{custom_compilers}:wrong", mode))
    assert wrong["status"] == "fail_accuracy"
    assert "RMSE" in wrong["error"]
    good = run(tiny(f"{custom_compilers}:fx_eager", mode, model="gpt2"))
    assert good["status"] == "pass", good.get("error")
    assert good["ms"] > 0 and good["eager_ms"] > 0 and good["speedup"] > 0


def test_errors_map_to_statuses():
    assert status_of_error(NotYetImplemented("no codegen yet"))["status"] == "not_yet"
    wrapped = RuntimeError("backend failed")
    wrapped.__cause__ = NotYetImplemented("deep inside")
    assert status_of_error(wrapped) == {"status": "not_yet", "error": "NotYetImplemented: deep inside"}
    bug = status_of_error(CompileStageError("aot", "boom"))
    assert bug["status"] == "fail_to_run" and bug["error"].startswith("CompileStageError: kiln aot stage failed")


def test_crashing_compiler_is_fail_to_run_with_the_errors_first_line(custom_compilers):
    row = run_case(tiny(f"{custom_compilers}:crash"), timeout=120)
    assert row["status"] == "fail_to_run"
    assert row["error"] == "RuntimeError: deliberate crash in the compiled model"


def test_a_dying_process_is_fail_to_run(custom_compilers):
    row = run_case(tiny(f"{custom_compilers}:die"), timeout=120)
    assert row["status"] == "fail_to_run" and "exit code 3" in row["error"]


def test_a_hanging_case_is_killed_at_the_timeout(custom_compilers):
    row = run_case(tiny(f"{custom_compilers}:hang"), timeout=8)
    assert row["status"] == "fail_to_run" and "timed out after 8 s" in row["error"]


def test_tiny_end_to_end_kiln_bench(custom_compilers, tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["--size", "test", "--models", "mlp", "--compilers", f"eager,kiln-aot_eager,{custom_compilers}:wrong",
            "--steps", "3", "--warmup", "1", "--out", str(out), "--method", "separate"]
    assert main(argv) == 0
    (jsonl,) = out.glob("*_cpu_zoo.jsonl")
    (markdown,) = out.glob("*_cpu_zoo.md")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert records[0]["type"] == "run" and "--compilers" in records[0]["command"]
    rows = {r["compiler"]: r for r in records[1:]}
    assert set(rows) == {"eager", "kiln-aot_eager", f"{custom_compilers}:wrong"}
    assert rows["eager"]["status"] == "pass" and rows["eager"]["speedup"] == 1.0
    assert rows[f"{custom_compilers}:wrong"]["status"] == "fail_accuracy"
    assert rows[f"{custom_compilers}:wrong"]["warm_compile_s"] >= 0
    aot = rows["kiln-aot_eager"]
    assert aot["status"] in ("pass", "not_yet", "fail_to_run", "fail_accuracy")
    if aot["status"] == "pass":
        assert aot["graphs"] >= 1 and aot["ms"] > 0 and "warm_compile_s" in aot
    else:
        assert aot["error"]
    text = markdown.read_text()
    assert records[0]["command"] in text and "geomean speedup" in text and "| mlp | infer | fp32 | eager |" in text
    printed = capsys.readouterr().out
    assert "geomean speedup" in printed and "fail_accuracy" in printed


def test_kiln_rows_carry_their_compile_stages_cold_and_warm(tmp_path):
    """Issue #20 item 1: a bench run says where kiln's compile seconds went, per case, cold and warm,
    in its JSON rows and in a table of the markdown."""
    out = tmp_path / "results"
    assert main(["--size", "test", "--models", "mlp", "--modes", "infer", "--compilers", "kiln",
                 "--steps", "2", "--warmup", "1", "--out", str(out), "--method", "separate"]) == 0
    (jsonl,) = out.glob("*_cpu_zoo.jsonl")
    (row,) = [json.loads(line) for line in jsonl.read_text().splitlines()[1:]]
    assert row["status"] == "pass"
    cold, warm = row["compile_stages"], row["warm_compile_stages"]
    assert {"capture", "aot trace", "lower", "compile"} <= set(cold)   # a cold compile runs the pipeline
    assert "cache load" in warm and "lower" not in warm and "compile" not in warm   # a warm one loads it
    assert 0 < sum(cold.values()) <= row["cold_compile_s"] + 0.5
    text = next(out.glob("*_cpu_zoo.md")).read_text()
    assert "compile seconds by stage" in text and "| mlp | infer | fp32 | cold |" in text and "| mlp | infer | fp32 | warm |" in text


def test_cpu_default_is_interleaved_and_rows_say_how_noisy_eager_was(custom_compilers, tmp_path, capsys):
    """Issue #35 item 5: on the CPU too, eager and the compilers of a case share a process, steps
    alternated; each row carries eager's spread, and the table marks a row past 20% noisy."""
    out = tmp_path / "results"
    assert main(["--size", "test", "--models", "mlp", "--compilers", f"eager,{custom_compilers}:wrong",
                 "--steps", "5", "--warmup", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in next(out.glob("*.jsonl")).read_text().splitlines()[1:]]
    assert {r["method"] for r in rows} == {"interleaved"} and len(rows) == 2
    assert all(r["eager_spread"] >= 0 and r["noisy"] == (r["eager_spread"] > 0.2) for r in rows)
    assert {r["compiler"]: r["status"] for r in rows} == {"eager": "pass", f"{custom_compilers}:wrong": "fail_accuracy"}
    assert "eager spread" in capsys.readouterr().out


def test_spread_is_the_interdecile_range_over_the_median_and_past_20_percent_is_noisy():
    from kiln.bench.case import noise_fields, spread_of
    from kiln.bench.report import text_table
    assert spread_of([1.0]) is None and spread_of([1.0] * 10) == 0.0
    assert spread_of([1.0, 2.0]) == pytest.approx((1.9 - 1.1) / 1.5)
    quiet, busy = noise_fields([1.0, 1.05, 1.1, 1.0]), noise_fields([1.0, 1.0, 3.0, 1.0, 0.5])
    assert not quiet["noisy"] and busy["noisy"]
    base = {"model": "m", "mode": "infer", "precision": "fp32", "compiler": "eager", "status": "pass"}
    table = text_table([{**base, **quiet}, {**base, **busy}])
    assert table.count("noisy") == 1 and f"{busy['eager_spread']:.0%} noisy" in table


def test_cli_checks_its_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--compilers" in capsys.readouterr().out
    for bad in (["--modes", "fly"], ["--precisions", "fp8"], ["--suite", "nope"], ["--compilers", "nope"],
                ["--device", "tpu"]):
        with pytest.raises(SystemExit, match="kiln bench"):
            build_cases(parser().parse_args(bad))


def test_cases_expand_over_flags_and_missing_models_are_noted():
    cases, notes = build_cases(parser().parse_args(
        ["--models", "mlp,gpt2,nosuch", "--modes", "infer,train", "--precisions", "fp32,bf16",
         "--compilers", "eager,kiln"]))
    assert len(cases) == 2 * 2 * 2 * 2
    assert any("nosuch" in n for n in notes)
    assert {c.model for c in cases} == {"mlp", "gpt2"}


def test_merge_combines_runs_and_a_rerun_replaces_its_row(tmp_path):
    def run_file(name, command, rows):
        path = tmp_path / name
        records = [{"type": "run", "command": command, "started": "2026-01-01T00:00", "device": "cuda"}]
        records += [{"type": "row", "suite": "hf", "mode": "infer", "precision": "bf16", "device": "cuda",
                     "size": "bench", "batch": None, **r} for r in rows]
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
        return str(path)

    first = run_file("a.jsonl", "kiln bench --models A", [
        {"model": "A", "compiler": "inductor", "status": "pass", "speedup": 2.0},
        {"model": "A", "compiler": "kiln", "status": "fail_to_run", "error": "Boom: first try"}])
    second = run_file("b.jsonl", "kiln bench --models B", [
        {"model": "B", "compiler": "inductor", "status": "pass", "speedup": 8.0},
        {"model": "A", "compiler": "kiln", "status": "pass", "speedup": 1.5}])
    assert main(["--merge", first, second, "--out", str(tmp_path / "merged")]) == 0
    (jsonl,) = (tmp_path / "merged").glob("*_cuda_merged.jsonl")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [p["command"] for p in records[0]["parts"]] == ["kiln bench --models A", "kiln bench --models B"]
    rows = {(r["model"], r["compiler"]): r for r in records[1:]}
    assert len(rows) == 3 and rows["A", "kiln"]["status"] == "pass"
    text = next((tmp_path / "merged").glob("*.md")).read_text()
    assert "kiln bench --models B" in text and "| inductor | infer | bf16 | 2/2 | 4.00x |" in text


def test_resume_appends_to_one_file_and_skips_the_cases_it_holds(custom_compilers, tmp_path, capsys):
    results = tmp_path / "sweep" / "cpu_zoo.jsonl"
    argv = ["--size", "test", "--compilers", f"eager,{custom_compilers}:wrong", "--steps", "2", "--warmup", "1",
            "--out", str(tmp_path / "unused"), "--resume", str(results)]
    assert main(argv + ["--models", "mlp"]) == 0
    assert main(argv + ["--models", "mlp,gpt2"]) == 0          # mlp is done: only gpt2 runs
    assert main(argv + ["--models", "mlp,gpt2"]) == 0          # everything is done
    assert "every case is already in" in capsys.readouterr().err
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["type"] for r in records].count("run") == 2                 # the third run wrote nothing
    assert sorted((r["model"], r["compiler"]) for r in records if r["type"] == "row") == sorted(
        (m, c) for m in ("mlp", "gpt2") for c in ("eager", f"{custom_compilers}:wrong"))
    text = (tmp_path / "sweep" / "cpu_zoo.md").read_text()
    assert "| mlp | infer | fp32 | eager |" in text and "| gpt2 | infer | fp32 | eager |" in text


def test_a_shared_process_reports_each_case_and_survives_deaths_and_hangs(custom_compilers):
    from kiln.bench.harness import run_group
    names = ["die", "fx_eager", "hang", "wrong", "crash"]
    rows = run_group([tiny(f"{custom_compilers}:{n}") for n in names], timeout=30, warm=False)
    statuses = [row["status"] for row in rows]
    assert statuses == ["fail_to_run", "pass", "fail_to_run", "fail_accuracy", "fail_to_run"]
    assert "died" in rows[0]["error"] and "timed out" in rows[2]["error"]
    assert "deliberate crash" in rows[4]["error"]
    assert all(row["shared_process"] for row in rows)


def test_interleaved_case_times_every_compiler_in_one_process_and_isolates_a_crash(custom_compilers):
    """[Note: interleaved timing]: one process, one row per compiler; a crashing compiler fails its
    own row while the others are timed against the same eager steps, and vs_inductor-style ratios
    come from those steps."""
    from kiln.bench.harness import expand, run_group
    compilers = ("eager", f"{custom_compilers}:fx_eager", f"{custom_compilers}:crash", f"{custom_compilers}:wrong")
    case = tiny(",".join(compilers), compilers=compilers)
    (result,) = run_group([case], timeout=300)
    rows = {r["compiler"]: r for r in expand(case, result)}
    assert list(rows) == list(compilers)
    assert all(r["method"] == "interleaved" for r in rows.values())
    assert rows["eager"]["status"] == "pass" and rows["eager"]["speedup"] == 1.0
    good = rows[f"{custom_compilers}:fx_eager"]
    assert good["status"] == "pass" and good["eager_ms"] == rows["eager"]["ms"] and good["ms"] > 0
    assert rows[f"{custom_compilers}:crash"]["status"] == "fail_to_run"
    assert "deliberate crash" in rows[f"{custom_compilers}:crash"]["error"]
    assert rows[f"{custom_compilers}:wrong"]["status"] == "fail_accuracy"


def test_a_results_title_says_whether_its_figures_are_headline():
    from kiln.bench.report import method_of
    base = {"device": "cuda", "method": "interleaved", "gpu_neighbours": 0}
    assert "headline" in method_of([base, base])
    assert "exploration only: 3 other" in method_of([base, {**base, "gpu_neighbours": 3}])
    assert "separate processes" in method_of([base, {**base, "method": "separate"}])
    assert method_of([{"device": "cpu", "method": "separate"}]) == ""


def test_vs_inductor_geomean_counts_rows_where_both_passed():
    from kiln.bench.report import summary
    row = dict(suite="hf", mode="infer", precision="bf16", device="cuda", size="bench", batch=None)
    rows = [{**row, "model": "a", "compiler": "inductor", "status": "pass"},
            {**row, "model": "a", "compiler": "kiln", "status": "pass", "vs_inductor": 2.0},
            {**row, "model": "b", "compiler": "inductor", "status": "pass"},
            {**row, "model": "b", "compiler": "kiln", "status": "pass", "vs_inductor": 0.5},
            {**row, "model": "c", "compiler": "inductor", "status": "fail_accuracy"},
            {**row, "model": "c", "compiler": "kiln", "status": "pass", "vs_inductor": 9.0}]
    kiln_row = next(s for s in summary(rows) if s["compiler"] == "kiln")
    assert kiln_row["geomean_vs_inductor"] == pytest.approx(1.0)


@pytest.mark.parametrize("name,category", [
    ("kiln_poi_3fa9b2c1", "copy/cast"), ("kiln_poi_to_dtype_3fa9b2c1", "copy/cast"),
    ("kiln_poi_add_mul_0a0b0c0d", "pointwise"), ("kiln_red_add_12345678", "reduction"),
    ("triton_poi_fused__to_copy_0", "copy/cast"), ("triton_poi_fused_convolution_relu_2", "pointwise"),
    ("triton_per_fused_native_layer_norm_3", "reduction"), ("triton_tem_fused_mm_1", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "matmul"), ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "convolution"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("void at::native::(anonymous namespace)::direct_copy_kernel_cuda(at::TensorIteratorBase&)", "copy/cast"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduction"),
])
def test_kernel_categories_by_name(name, category):
    from kiln.bench.attribution import category_of
    assert category_of(name) == category


def test_busy_time_counts_overlapping_kernels_once():
    from kiln.bench.attribution import _union_us
    assert _union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20


def test_the_max_autotune_compilers_are_built_in(monkeypatch):
    """`kiln bench --compilers ...,inductor-max-autotune,kiln-max-autotune`: both names resolve, and
    kiln's compiles with mode="max-autotune" (a matmul template kernel is built, here under Triton's
    interpreter) and equals eager."""
    from kiln.bench.compilers import GraphCounter, get_compiler
    from kiln.codegen.triton import launcher
    import kiln
    assert "max-autotune" in get_compiler("inductor-max-autotune").description
    monkeypatch.setenv("KILN_TRITON_INTERPRET", "1")
    kiln.reset()
    before = {id(k) for k in launcher.BUILT}
    model = torch.nn.Sequential(torch.nn.Linear(23, 45), torch.nn.ReLU())
    x = torch.randn(37, 23)
    counter = GraphCounter()
    with torch.no_grad():
        got = get_compiler("kiln-max-autotune").compile(model, counter)(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert counter.graphs == 1
    assert any(id(k) not in before and k.template is not None for k in launcher.BUILT)
