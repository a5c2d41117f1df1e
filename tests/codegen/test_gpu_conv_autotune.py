"""max-autotune's convolution templates on a real GPU ([Note: convolution templates]): kiln's timer
times the extern convolution (cuDNN) against every tiling on a ResNet block's real shapes, the picks
are kept on disk, a second compile benchmarks nothing, and the results equal eager's; a template
forced by a timer that favours it computes eager's results too (compiled, not interpreted).
Skipped without CUDA: not yet run (written on a machine without a GPU); add it to
`bench/gpu_checks.sh tests`."""
import pytest
import torch

from kiln.bench.accuracy import same
from kiln.codegen.triton import matmul_autotune
from kiln.codegen.triton.matmul_autotune import EPILOGUE, EXTERN
from tests.codegen.conftest import compile_traced

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _block(dtype):
    """A ResNet basic block halving 28 x 28 to 14 x 14 (64 -> 128 channels), in inference."""
    nn = torch.nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(64, 128, 3, 2, 1, bias=False), nn.BatchNorm2d(128)
            self.conv2, self.bn2 = nn.Conv2d(128, 128, 3, 1, 1, bias=False), nn.BatchNorm2d(128)
            self.down = nn.Sequential(nn.Conv2d(64, 128, 1, 2, bias=False), nn.BatchNorm2d(128))

        def forward(self, x):
            y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(y + self.down(x))
    block = Block().eval()
    for bn in (m for m in block.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.normal_(0, 0.1)
        bn.running_var.uniform_(0.5, 1.5)
    return block.to(device="cuda", dtype=dtype).to(memory_format=torch.channels_last)


def _check(block, x, got):
    reference = _block(torch.float64)
    reference.load_state_dict({k: v.double() for k, v in block.state_dict().items()})
    with torch.no_grad():
        verdict = same(block(x), got, reference(x.double()), tol=1e-2)
    assert verdict.ok, verdict.detail


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gpu_autotuner_times_cudnn_against_every_tiling(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    block = _block(dtype)
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    benchmarked = []
    for run in range(2):
        got, decisions = compile_traced(block, (x,), tmp_path / f"trace{run}", mode="max-autotune-no-cudagraphs")
        _check(block, x, got)
        convolutions = [d for d in decisions if d["op"] == "convolution"]
        benchmarked.append(sum(d["benchmarked"] for d in convolutions))
        if run == 0:
            assert len(convolutions) == 3, convolutions
            for d in convolutions:
                assert d["how"] == "timed" and EXTERN in d["timings"] and len(d["timings"]) >= 3, d
    assert benchmarked[0] >= 9 and benchmarked[1] == 0, benchmarked


def test_forced_templates_compute_eager_results(tmp_path, monkeypatch):
    """A timer that makes every template the fastest: the block runs as three compiled template
    kernels, and its result is eager's."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))

    def favour_templates(trial) -> float:
        trial()
        return 1.0 if trial.label in (EXTERN, EPILOGUE) else 0.5
    monkeypatch.setattr(matmul_autotune, "device_timer", lambda device: favour_templates)
    block = _block(torch.bfloat16)
    x = torch.randn(2, 64, 28, 28, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    got, decisions = compile_traced(block, (x,), tmp_path / "trace", mode="max-autotune-no-cudagraphs")
    _check(block, x, got)
    assert all(d["choice"] != EXTERN for d in decisions if d["op"] == "convolution")
