"""`kiln report` end to end: a program runs under `kiln report -- python ...`, its event log is
checked against what the program does, and the page is loaded in headless Chromium, whose rendered
DOM must show the breaks (reason and user line), the recompile (the failed guard), the graphs
after each stage and the kernels' source; a screenshot is saved. Without Chromium the browser
checks skip (the log checks still run)."""
from __future__ import annotations

import collections
import os
import re

import pytest

from report_support import chromium, events, rendered_dom, run_report, screenshot

BREAK_LINES = {9: 'print("first break")', 11: 'print("second break")'}   # two_breaks.py
REASON = "print() has a side effect outside the graph"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, or a skip before the programs run (module scope: set up first)."""
    return chromium()


@pytest.fixture(scope="module")
def two_breaks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two_breaks")
    trace, page, result = run_report("two_breaks.py", str(folder))
    # each print runs in the compiled calls as in the eager ones
    assert result.stdout.count("first break") == result.stdout.count("second break") == 4, result.stdout
    return trace, page, str(folder)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    trace, page, _ = run_report("gpt2_step.py", str(folder))
    return trace, page, str(folder)


def test_the_log_of_two_breaks_and_a_recompile(two_breaks):
    log = events(two_breaks[0])
    kinds = collections.Counter(e["kind"] for e in log)
    breaks = [e for e in log if e["kind"] == "break"]
    # step, its rest after each break; then all three again for the new scale
    assert [(e["line"], e["line_text"], e["reason"]) for e in breaks] == \
        [(9, BREAK_LINES[9], REASON), (11, BREAK_LINES[11], REASON)] * 2
    assert [e["reason"] for e in log if e["kind"] == "recompile"] == ["scale == 2.0 (now 3.0)"] * 3
    assert kinds["frame_start"] == kinds["frame"] == 6
    frames = [e for e in log if e["kind"] == "frame"]
    assert frames[0]["function"] == "step" and frames[0]["source"][0] == "def step(x, scale):"
    assert frames[0]["source"][9 - frames[0]["line"]].strip() == BREAK_LINES[9]
    # every graph is lowered (no program cache in these tests): one schedule per aot forward
    program_cache = [e["hit"] for e in log if e["kind"] == "cache" and e["cache"] == "graph program"]
    assert program_cache == [False] * kinds["schedule"]
    assert kinds["schedule"] == sum(1 for e in log if e["kind"] == "graph" and e["stage"] == "aot forward") > 0
    kernels = [k for e in log if e["kind"] == "schedule" for k in e["kernels"]]
    assert kernels and all('extern "C" void ' + k["name"] in k["source"] for k in kernels)
    for k in kernels:   # the launch names the loops and the OpenMP pragmas of the source
        pragmas = [line.strip() for line in k["source"].splitlines() if line.strip().startswith("#pragma omp")]
        assert k["launch"].startswith("loops over [") and all(p in k["launch"] for p in pragmas), k
    assert {e["stage"] for e in log if e["kind"] == "stage"} >= {"aot trace", "lower", "schedule", "load"}   # kiln.log.STAGES


def test_report_of_two_breaks_and_a_recompile_in_a_browser(browser, two_breaks):
    trace, page, folder = two_breaks
    dom = rendered_dom(page, os.path.join(folder, "profile"))
    assert dom.find("body").attrs.get("data-ready") == "1", "the page's script did not run to its end"
    stat = {s.attrs["data-key"]: s.find("b").text for s in dom.find_all(cls="stat")}
    assert (stat["graph breaks"], stat["break sites"], stat["recompiles"], stat["frames compiled"]) == ("4", "2", "3", "6")
    sites = [s.text for s in dom.find_all("li", cls="break-site")]
    assert len(sites) == 2
    for site, (line, text) in zip(sites, sorted(BREAK_LINES.items())):
        assert REASON in site and f"two_breaks.py:{line}" in site and text in site, site
    recompiles = [r.text for r in dom.find_all("li", cls="recompile-reason")]
    assert len(recompiles) == 3 and recompiles[0] == "step #2: scale == 2.0 (now 3.0)", recompiles
    assert all(re.fullmatch(r"step \(resumed @\d+\) #2: scale == 2\.0 \(now 3\.0\)", r) for r in recompiles[1:])
    # the frame's own source, its break line marked, the reason under it
    step = dom.find("article", cls="frame", data_function="step")
    marked = step.find_all("tr", cls="brk")
    assert [(int(r.attrs["data-line"]), r.find("code").text.strip()) for r in marked] == [(9, BREAK_LINES[9])]
    assert REASON in step.find("tr", cls="brk-note").text
    kernel_sources = [d.find("code").text for d in dom.find_all("details", cls="kernel-source")]
    assert kernel_sources and all(re.search(r'extern "C" void kernel\d+\(', s) for s in kernel_sources)
    width, height = screenshot(page, os.path.join(folder, "two_breaks.png"), os.path.join(folder, "profile"))
    assert (width, height) == (1280, 2000)


def test_report_of_gpt2_in_a_browser(browser, gpt2):
    trace, page, folder = gpt2
    log = events(trace)
    dom = rendered_dom(page, os.path.join(folder, "profile"))
    assert dom.find("body").attrs.get("data-ready") == "1", "the page's script did not run to its end"
    stat = {s.attrs["data-key"]: s.find("b").text for s in dom.find_all(cls="stat")}
    kernels = [k for e in log if e["kind"] == "schedule" for k in e["kernels"]]
    refused = [r for e in log if e["kind"] == "schedule" for r in e["refused"]]
    assert (stat["graphs"], stat["graph breaks"], stat["recompiles"]) == ("1", "0", "0")
    assert int(stat["kernels"]) == len(kernels) == len(dom.find_all("article", cls="kernel")) > 10
    assert int(stat["refused fusions"]) == len(refused)
    # the graphs after capture and aot, with the node counts of the log
    graphs = {g["stage"]: g["nodes"] for g in log if g["kind"] == "graph"}
    shown = {d.attrs["data-stage"]: int(d.attrs["data-nodes"]) for d in dom.find_all("details", cls="graph")}
    assert shown == graphs and set(shown) == {"capture", "aot forward", "aot backward"}
    capture = dom.find("details", cls="graph", data_stage="capture")
    assert f"{graphs['capture']} nodes" in capture.find("summary").text and "def forward" in capture.find("code").text
    # a kernel: its source, launch and the fusions refused around it, as the log has them
    first = dom.find("article", cls="kernel")
    assert first.find("details", cls="kernel-source").find("code").text == kernels[0]["source"]
    assert first.find("p", cls="launch").text == "launch: " + kernels[0]["launch"]
    reasons = [s.text for s in dom.find_all("ul", cls="fusion") for s in s.find_all("span", cls="reason")]
    assert reasons and set(reasons) <= {r["reason"] for r in refused}
    # the stage chart has a bar per stage timed in the log
    bars = {g.attrs["data-stage"] for g in dom.find_all("g", cls="stage-bar")}
    assert bars >= {e["stage"] for e in log if e["kind"] == "stage"} | {"capture"}
    width, height = screenshot(page, os.path.join(folder, "gpt2.png"), os.path.join(folder, "profile"))
    assert (width, height) == (1280, 2000)
