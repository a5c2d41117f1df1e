"""The CI fuzz campaign: 500 random programs of fixed seeds (kiln.testing.fuzz), each run eagerly
and compiled with the C++ backend, forward and backward: no wrong result, no crash, at most 2%
refused. Split in chunks so `pytest -n 2` runs them on both cores.

Cost: programs of up to 8 steps cost ~0.6 CPU-seconds each on the 2-core CI machine with a cold
kernel cache (one g++ per forward and per backward graph), ~0.2 s with a warm one
($KILN_CACHE_DIR kept between runs: the seeds are fixed, so are the kernels): 500 programs are
~5 min of CPU cold, ~1.5 min warm, half that in wall time on two workers. A failing seed is
reproduced and shrunk into tests/fuzz/ by
`python -m kiln.testing.fuzz --programs 1 --seed SEED --max-steps 8 --out tests/fuzz`."""
import pytest

from kiln.testing import fuzz

SEED, PROGRAMS, CHUNKS, MAX_STEPS = 100_000, 500, 10, 8


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_match_eager(chunk):
    per = PROGRAMS // CHUNKS
    lines: list[str] = []
    counts = fuzz.campaign(per, SEED + chunk * per, out=None, do_shrink=False, max_steps=MAX_STEPS, log=lines.append)
    failures = [line for line in lines if line.startswith("seed ")]
    assert counts["wrong"] == 0 and counts["crash"] == 0, "\n".join(failures)
    assert counts["refusal"] <= per // 50, "\n".join(failures)
