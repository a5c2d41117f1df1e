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
    assert "2 programs from the cache" in warm and "1 graphs from the cache" in warm, warm
    assert not {"aot trace", "decompose", "lower", "compile"} & set(_stages(warm)), warm


def test_nested_stages_count_each_second_once():
    with log.frame("outer") as frame:
        with log.stage("aot trace"):
            with log.stage("decompose"):
                sum(range(200000))
            sum(range(200000))
    assert set(frame.seconds) == {"aot trace", "decompose"}
    assert frame.seconds["decompose"] > 0 and frame.seconds["aot trace"] > 0


class _Terminal:
    """A stand-in stderr that says it is a terminal and keeps what was written."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, []

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text.append(s)

    def flush(self):
        pass


def _slow_frame(seconds: float):
    import time
    with log.frame("forward"):
        log.count("kernels", 40)
        log.count("kernels compiled", 12)
        with log.stage("lower"):
            time.sleep(seconds)


def test_progress_line_shows_frame_stage_and_kernels_while_a_compile_is_slow(monkeypatch):
    monkeypatch.setattr(log, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(log, "PROGRESS_EVERY_S", 0.05)
    monkeypatch.delenv("KILN_LOG", raising=False)
    for tty, setting, shown in [(True, None, True), (False, None, False), (True, "off", False)]:
        if setting:
            monkeypatch.setenv("KILN_LOG", setting)
        err = _Terminal(tty)
        monkeypatch.setattr("sys.stderr", err)
        _slow_frame(0.6)
        text = "".join(err.text)
        assert ("[kiln] compiling forward: lower, 12/40 kernels compiled" in text) == shown, (tty, setting, text)
        if shown:
            assert text.endswith("\r\x1b[K"), "the line is erased when the compile ends"
