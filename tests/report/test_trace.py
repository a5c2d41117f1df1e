"""The event log in process: what `kiln.trace` writes, the KILN_LOG lines it prints, that it does
nothing when off, and how `kiln.report.run` folds a log into frames."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
import torch

import kiln
from kiln import trace
from kiln.report import main as report_main
from kiln.report.run import read_run


def breaks_once(x):
    y = x + 1
    print("a side effect")
    return y * 2


BREAK_LINE = breaks_once.__code__.co_firstlineno + 2


@pytest.fixture
def restore_trace():
    yield
    trace.configure(folder="", log="")


def test_kiln_log_breaks_and_guards_print_a_line_per_event(capsys, restore_trace):
    kiln.reset()
    trace.configure(folder="", log="breaks,guards")
    fast = kiln.compile(breaks_once, backend="eager")
    torch.testing.assert_close(fast(torch.ones(3)), torch.full((3,), 4.0))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[kiln ")]
    where = f"{__file__}:{BREAK_LINE} in breaks_once"
    assert lines[0] == f"[kiln breaks] graph break in breaks_once at {where}: print() has a side effect outside the graph"
    assert lines[1] == "[kiln guards] 6 guards on breaks_once", lines   # the autocast, default-dtype and global-state guards among them
    assert any(line.startswith("[kiln guards]") and "__kiln_resume_breaks_once_at_" in line for line in lines[2:])


def test_nothing_is_written_or_built_when_no_one_listens(tmp_path, restore_trace):
    class Unprintable:
        def __str__(self):
            raise AssertionError("an event's fields were serialized with the log off")

    trace.configure(folder="", log="")
    assert not trace.active() and trace.trace_path() is None
    trace.emit("stage", stage="x", seconds=Unprintable())
    trace.configure(folder=str(tmp_path), log="")
    assert trace.active() and not os.listdir(tmp_path)          # opened at the first event only
    with pytest.raises(AssertionError, match="serialized"):
        trace.emit("stage", stage="x", seconds=Unprintable())


def test_the_log_of_one_compile_in_process(tmp_path, restore_trace):
    kiln.reset()
    trace.configure(folder=str(tmp_path), log="")
    fast = kiln.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager")
    x = torch.randn(5, requires_grad=True)
    fast(x).backward()
    trace.configure(folder="", log="")
    with open(tmp_path / "kiln-trace.jsonl") as f:
        log = [json.loads(line) for line in f]
    # kiln.log's stages: capture, then aot's trace, functionalize and partition, then the guards
    assert [(e["kind"], e.get("stage")) for e in log] == [
        ("process", None), ("frame_start", None), ("stage", "capture"), ("stage", "aot trace"),
        ("stage", "functionalize"), ("stage", "partition"), ("graph", "aot forward"), ("graph", "aot backward"),
        ("backend", None), ("stage", "guards"), ("graph", "capture"), ("guards", None), ("frame", None)]
    assert {e["pid"] for e in log} == {os.getpid()} and all(e["t"] >= 0 for e in log)
    graphs = {e["stage"]: e for e in log if e["kind"] == "graph"}
    assert graphs["capture"]["ops"] == {"call_method": 2, "operator": 1} and graphs["capture"]["nodes"] == 5
    # sin, mul, sum and sin's derivative, cos, which the partition computes in the forward and saves
    assert graphs["aot forward"]["ops"] == {"aten": 4} and "aten.cos.default(user_0)" in graphs["aot forward"]["code"]
    assert graphs["aot backward"]["ops"] == {"aten": 3} and "def forward(self, cos_default, tangent_1)" in \
        graphs["aot backward"]["code"]
    frame = log[-1]
    assert len(frame["source"]) == 1 and "lambda x: (x.sin() * 2).sum()" in frame["source"][0]
    assert frame["graph_nodes"] == 5 and frame["entries"] == 1 and frame["seconds"] > 0


def _write(path, events: list[dict], torn: str = "") -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps({"pid": 7, "t": 0.0, **e}) + "\n" for e in events)
        f.write(torn)
    return str(path)


def test_the_reader_folds_nested_failed_and_recompiled_frames(tmp_path):
    log = _write(tmp_path / "kiln-trace.jsonl", [
        {"kind": "process", "argv": ["train.py"]},
        {"kind": "frame_start", "function": "outer", "file": "a.py", "line": 1},
        {"kind": "backend", "name": "kiln", "seconds": 1.0},
        {"kind": "stage", "stage": "lower", "seconds": 0.25},
        {"kind": "stage", "stage": "lower", "seconds": 0.25},
        {"kind": "frame_start", "function": "inner", "file": "a.py", "line": 9},
        {"kind": "frame", "function": "inner", "file": "a.py", "line": 9, "source": ["def inner():"], "seconds": 0.5},
        {"kind": "frame", "function": "outer", "file": "a.py", "line": 1, "source": ["def outer():"], "seconds": 2.0},
        {"kind": "recompile", "function": "outer", "reason": "x.size(0) == 4 (now 8)"},
        {"kind": "frame_start", "function": "outer", "file": "a.py", "line": 1},
        {"kind": "break", "function": "outer", "reason": "why", "where": "a.py:3 in outer", "file": "a.py", "line": 3},
        {"kind": "graph", "stage": "aot forward", "function": None, "code": "def forward(): pass", "nodes": 2},
        {"kind": "schedule", "printer": "p", "ir": "", "kernels": [{"name": "k0", "origins": ["buf0"], "source": "s",
                                                                   "launch": ""}], "refused": [], "externs": [], "host": ""},
    ], torn='{"kind": "frame", "funct')
    run = read_run(str(tmp_path))
    (process,) = run.processes
    outer, inner, again = process.frames
    assert (outer.done, inner.done, again.done) == (True, True, False)    # the last compile raised
    assert outer.nested_seconds == 0.5 and inner.stages == {} and outer.stages == {"lower": 0.5}
    assert outer.stage_seconds() == {"capture": 0.5, "lower": 0.5, "backend other": 0.5}
    assert (outer.recompile, again.recompile, again.index) == (None, "x.size(0) == 4 (now 8)", 1)
    assert [k["name"] for k in again.kernels] == ["k0"] and again.breaks[0]["line"] == 3
    summary = run.summary()
    assert summary["compile seconds"] == 2.0 and summary["frames compiled"] == 2 and summary["kernels"] == 1


def test_kiln_report_refuses_a_folder_without_a_log(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 2
    assert "no kiln-trace.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report_main([])


def test_triton_kernels_are_logged_with_the_launch_the_launcher_uses(tmp_path, restore_trace):
    from kiln.aot import aot_compile
    from kiln.codegen import triton as triton_printer
    from kiln.codegen.compile import compile_prim_graph
    from kiln.codegen.triton.launcher import BUILT
    from kiln.prims import decompositions_for

    def compiler(gm, example_inputs):
        return compile_prim_graph(gm, example_inputs, printer=triton_printer)

    gm = torch.fx.symbolic_trace(lambda x: torch.softmax(x, dim=-1))
    x = torch.randn(8, 32)
    before = set(BUILT)
    trace.configure(folder=str(tmp_path), log="")
    program = aot_compile(gm, [x], fw_compiler=compiler, bw_compiler=compiler, decompositions=decompositions_for(set()))
    torch.testing.assert_close(program(x), torch.softmax(x, dim=-1))
    trace.configure(folder="", log="")
    with open(tmp_path / "kiln-trace.jsonl") as f:
        (schedule,) = [e for e in map(json.loads, f) if e["kind"] == "schedule"]
    assert schedule["printer"] == "kiln.codegen.triton"
    (kernel,) = schedule["kernels"]
    (built,) = set(BUILT) - before
    (config,) = built.configs.values()          # chosen at the first launch
    grid = (8 + config.XBLOCK - 1) // config.XBLOCK
    assert kernel["launch"] == f"reduction, xnumel=8, rnumel=32, grid=({grid},), {config.describe()} (heuristic)"
    assert "@triton.jit" in kernel["source"]


def test_processes_appending_to_one_log_never_split_a_line(tmp_path):
    writer = ("import sys; from kiln import trace\n"
              "trace.configure(folder=sys.argv[1], log='')\n"
              "for i in range(300): trace.emit('graph', stage='capture', function=sys.argv[2], code='x' * 20000, n=i)\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(tmp_path), name], env=env) for name in ("a", "b", "c")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    with open(tmp_path / "kiln-trace.jsonl") as f:
        log = [json.loads(line) for line in f]          # every line whole
    assert collections.Counter(e["kind"] for e in log) == {"process": 3, "graph": 900}
    for name in "abc":
        assert [e["n"] for e in log if e.get("function") == name] == list(range(300))


def test_a_log_that_cannot_be_written_warns_and_turns_itself_off(tmp_path, restore_trace):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    trace.configure(folder=str(blocked / "trace"), log="")        # a folder under a file
    with pytest.warns(UserWarning, match="KILN_TRACE: cannot write"):
        trace.emit("stage", stage="x", seconds=1.0)
    assert not trace.active()


def test_a_graph_cut_at_ddp_buckets_is_on_its_frame(tmp_path):
    from kiln.report.page import _frame
    text = "split for DDP into 2 graphs at its gradient buckets (bucket_cap 25 MiB, first bucket 1 MiB):"
    _write(tmp_path / "kiln-trace.jsonl", [
        {"kind": "process", "argv": ["train.py"]},
        {"kind": "frame_start", "function": "forward", "file": "m.py", "line": 1},
        {"kind": "split", "function": "forward", "reason": text},
        {"kind": "frame", "function": "forward", "file": "m.py", "line": 1, "source": ["def forward():"], "seconds": 1.0},
    ])
    (frame,) = read_run(str(tmp_path)).processes[0].frames
    assert frame.splits == [text]
    assert f'<pre class="split">{text}</pre>' in _frame(0, frame)
