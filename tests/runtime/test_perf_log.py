"""KILN_LOG=perf: one line per compiled frame with the seconds of each stage ([Note: compile stages])."""
import re

import torch

import kiln
from kiln import log


def _frame_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[kiln perf] frame ")]


def _stages(line: str) -> dict[str, float]:
    inner = line[line.index("(") + 1:line.index(")")]
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"([a-z][a-z ]*?) (\d+\.\d+)", inner)}


def test_perf_log_times_every_stage_of_a_cold_and_a_warm_compile(capfd, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_LOG", "perf")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILN_DISABLE_CACHE", raising=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    x = torch.randn(4, 8)
    for _ in range(2):               # cold, then warm from the disk cache
        kiln.reset()
        got = kiln.compile(model)(x)
        torch.testing.assert_close(got, model(x))
        got.sum().backward()
    cold, warm = _frame_lines(capfd.readouterr().err)
    stages = _stages(cold)
    for name in ("capture", "guards", "aot trace", "decompose", "partition", "lower", "schedule", "print", "compile"):
        assert name in stages, (name, cold)
    total = float(re.search(r": (\d+\.\d+) s", cold).group(1))
    assert abs(sum(stages.values()) - total) < 0.05 * total + 0.03, cold    # each second counted once
    assert "2 programs compiled" in cold and "from the cache" not in cold
    assert "2 programs from the cache" in warm and "lower" not in _stages(warm), warm


def test_nested_stages_count_each_second_once():
    with log.frame("outer") as frame:
        with log.stage("aot trace"):
            with log.stage("decompose"):
                sum(range(200000))
            sum(range(200000))
    assert set(frame.seconds) == {"aot trace", "decompose"}
    assert frame.seconds["decompose"] > 0 and frame.seconds["aot trace"] > 0
