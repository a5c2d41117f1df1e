"""The CI fuzz campaign: 500 random programs of fixed seeds (kiln.testing.fuzz), each run eagerly
and compiled with the C++ backend, forward and backward: no wrong result, no crash, at most 2%
refused. Split in chunks so `pytest -n 2` runs them on both cores.

Cost: programs of up to 8 steps cost ~0.6 CPU-seconds each on the 2-core CI machine with a cold
kernel cache (one g++ per forward and per backward graph), ~0.2 s with a warm one
($KILN_CACHE_DIR kept between runs: the seeds are fixed, so are the kernels): 500 programs are
~5 min of CPU cold, ~1.5 min warm, half that in wall time on two workers. A failing seed is
reproduced and shrunk into tests/fuzz/ by
`python -m kiln.testing.fuzz --programs 1 --seed SEED --max-steps 8 --out tests/fuzz`
(add `--triton-interpret --half` for a seed of the interpreted campaign below)."""
import pytest

from kiln.testing import fuzz

SEED, PROGRAMS, CHUNKS, MAX_STEPS = 100_000, 500, 10, 8
# Through the Triton printer under Triton's interpreter (`--triton-interpret --half`): float16 and
# bfloat16 values, autocast regions, split-size reductions and dynamic programs included
# ([Note: GPU features of the generator]). ~0.3 CPU-seconds a program on the CI machine (no g++;
# the interpreter runs numpy per block): 300 programs are ~1.5 min of CPU.
INTERPRETED_SEED, INTERPRETED_PROGRAMS, INTERPRETED_CHUNKS = 300_000, 300, 6
HALF = ("float32", "int64", "bool", "float16", "bfloat16")


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_match_eager(chunk):
    per = PROGRAMS // CHUNKS
    lines: list[str] = []
    counts = fuzz.campaign(per, SEED + chunk * per, out=None, do_shrink=False, max_steps=MAX_STEPS, log=lines.append)
    failures = [line for line in lines if line.startswith("seed ")]
    assert counts["wrong"] == 0 and counts["crash"] == 0, "\n".join(failures)
    assert counts["refusal"] <= per // 50, "\n".join(failures)


@pytest.mark.parametrize("chunk", range(INTERPRETED_CHUNKS))
def test_random_programs_through_the_triton_interpreter_match_eager(chunk):
    per = INTERPRETED_PROGRAMS // INTERPRETED_CHUNKS
    lines: list[str] = []
    counts = fuzz.campaign(per, INTERPRETED_SEED + chunk * per, out=None, do_shrink=False, dtypes=HALF,
                           max_steps=MAX_STEPS, log=lines.append, target="triton-interpret")
    failures = [line for line in lines if line.startswith("seed ")]
    assert counts["wrong"] == 0 and counts["crash"] == 0, "\n".join(failures)
    assert counts["refusal"] <= per // 50, "\n".join(failures)
    assert counts["ok"] >= per * 9 // 10, counts      # the programs ran through kiln, not around it


def test_a_parallel_campaigns_workers_end_with_it(tmp_path):
    """Killed by its pid, a campaign (`--jobs 2`) left its pool workers running, writing into the
    next campaign's log and cache: each worker now ends with its parent (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    campaign = subprocess.Popen([sys.executable, "-m", "kiln.testing.fuzz", "--programs", "400", "--jobs", "2",
                                 "--out", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")})

    def workers():
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(campaign.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
    deadline = time.time() + 90      # until both workers run programs (their first kernels built)
    while len(list((tmp_path / "cache").glob("cpp/*.so"))) < 2 and time.time() < deadline:
        time.sleep(0.5)
    started = workers()
    assert len(started) >= 2, "the campaign started no workers"
    campaign.send_signal(signal.SIGKILL)
    campaign.wait()
    deadline = time.time() + 20
    alive = started
    while alive and time.time() < deadline:
        time.sleep(0.5)
        alive = [p for p in started if os.path.exists(f"/proc/{p}") and
                 open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    assert not alive, f"workers {alive} outlived their campaign"
