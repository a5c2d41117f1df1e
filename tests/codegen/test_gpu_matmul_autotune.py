"""max-autotune's matmul autotuner on a real GPU ([Note: matmul autotuning]): kiln's timer times
the extern and every tiling, the pick is kept on disk, a second compile benchmarks nothing, and the
compiled results equal eager's (bf16 by the benchmark's rule against float64). Skipped without CUDA;
`bash bench/gpu_checks.sh tests` runs it on the GPU machine."""
import pytest
import torch
import torch.nn.functional as F

from kiln.bench.accuracy import same
from tests.codegen.conftest import compile_traced

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("m, n, k", [(37, 45, 23), (1, 512, 256), (300, 200, 64)])
def test_the_gpu_autotuner_times_every_candidate_once(tmp_path, monkeypatch, m, n, k):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    x, w, b = (torch.randn(*s, device="cuda").to(torch.bfloat16) for s in ((m, k), (n, k), (n,)))
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    benchmarked = []
    for run in range(2):
        got, decisions = compile_traced(fn, (x, w, b), tmp_path / f"trace{run}", dynamic=False,
                                        mode="max-autotune-no-cudagraphs")
        verdict = same(fn(x, w, b), got, fn(x.double(), w.double(), b.double()), tol=1e-2)
        assert verdict.ok, verdict.detail
        benchmarked.append(sum(d["benchmarked"] for d in decisions))
        if run == 0:
            (d,) = decisions
            assert d["how"] == "timed" and "extern" in d["timings"] and len(d["timings"]) >= 3, d
    # the second compile: the program (or, past the program cache, the choice) from the disk cache
    assert benchmarked[0] >= 3 and benchmarked[1] == 0, benchmarked
