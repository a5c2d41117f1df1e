"""[Note: libdevice]: kiln's Triton kernels link the libdevice of torch's own CUDA release, so their
erf, exp, tanh round as eager's CUDA kernels do. The finder is checked on made-up toolkits; the
bit-equality on a GPU (skipped without one)."""
import json
import os

import pytest
import torch

import kiln
from kiln.codegen.triton import libdevice


def _toolkit(root, version: str | None, name: str = "cuda"):
    path = root / name / "nvvm" / "libdevice"
    path.mkdir(parents=True)
    (path / "libdevice.10.bc").write_bytes(b"BC")
    if version is not None:
        (root / name / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": version}}))
    return str(root / name)


def test_the_toolkit_of_torchs_cuda_version_is_found(tmp_path, monkeypatch):
    home = _toolkit(tmp_path, "12.8.93")
    monkeypatch.setenv("CUDA_HOME", home)
    assert libdevice.find("12.8") == os.path.join(home, "nvvm", "libdevice", "libdevice.10.bc")
    assert libdevice.find("12.8.1") == os.path.join(home, "nvvm", "libdevice", "libdevice.10.bc")


def test_a_toolkit_of_another_release_is_not_linked(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", _toolkit(tmp_path, "12.4.0"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert libdevice.find("99.1") is None


def test_a_toolkit_without_version_json_is_read_from_its_directory_name(tmp_path, monkeypatch):
    home = _toolkit(tmp_path, None, name="cuda-77.3")
    monkeypatch.setenv("CUDA_HOME", home)
    assert libdevice.find("77.3") == os.path.join(home, "nvvm", "libdevice", "libdevice.10.bc")
    monkeypatch.setenv("CUDA_HOME", _toolkit(tmp_path, None, name="toolkit"))
    assert libdevice.find("77.3") is None


def test_no_cuda_build_links_nothing(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert libdevice.find() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gelu_and_erf_are_bit_equal_to_eager_on_the_gpu():
    if not libdevice.link_options():
        pytest.skip(f"no CUDA {torch.version.cuda} toolkit installed: Triton's own libdevice is linked")
    x = torch.randn(1 << 20, device="cuda") * 3
    for fn in (torch.nn.functional.gelu, torch.erf, torch.exp, torch.tanh):
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            kiln.reset()
            got, want = kiln.compile(lambda t: fn(t))(xd), fn(xd)
            assert torch.equal(got, want), f"{fn.__name__}: {int((got != want).sum())} of {x.numel()} {dtype} differ"
