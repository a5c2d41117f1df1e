"""C++ modules read the prelude precompiled ([Note: precompiled prelude] in kiln/runtime/cpp_build.py):
the header is built once and kept in the cache, a module compiled with it computes what the full
source does, a damaged header is rebuilt, and without the cache it lives in the scratch folder."""
import ctypes
import warnings

import pytest
import torch

from kiln.codegen.cpp import PRELUDE
from kiln.runtime import cpp_build, store

KERNEL = """
extern "C" void k(const float* a, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = kiln_exp(a[i]) + kiln_max(a[i], 0.5f);
}
"""


def _run(lib: cpp_build.Library) -> torch.Tensor:
    a = torch.linspace(-3, 3, 37)
    out = torch.empty_like(a)
    lib.function("k", 2, 1)(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(out.data_ptr()), a.numel())
    torch.testing.assert_close(out, torch.exp(a) + torch.clamp(a, min=0.5))
    return out


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_DISABLE_CACHE", raising=False)
    monkeypatch.setattr(cpp_build, "_LOADED", {})
    monkeypatch.setattr(cpp_build, "_HEADERS", {})
    store.forget_checks()
    yield tmp_path / "cache"
    store.forget_checks()


def test_the_header_is_built_once_and_gives_the_same_results(fresh, monkeypatch):
    source = PRELUDE + KERNEL
    with_header = _run(cpp_build.load_library(source, header=PRELUDE))
    gch = list((fresh / "cpp-pch").glob("*.gch"))
    assert len(gch) == 1
    included = gch[0].with_suffix("")
    assert included.read_text() == PRELUDE       # g++ reads the text where the .gch does not fit
    # a new process: the header is found in the cache, not built again
    monkeypatch.setattr(cpp_build, "_LOADED", {})
    monkeypatch.setattr(cpp_build, "_HEADERS", {})
    built = []
    real_run = cpp_build.subprocess.run
    monkeypatch.setattr(cpp_build.subprocess, "run", lambda cmd, **k: (built.append(cmd), real_run(cmd, **k))[1])
    other = PRELUDE + KERNEL.replace("0.5f", "0.5f + 0.0f")
    _run(cpp_build.load_library(other, header=PRELUDE))
    assert len(built) == 1 and "-include" in built[0] and "c++-header" not in built[0]
    # the full source without the header builds the same function
    monkeypatch.setattr(cpp_build, "_LOADED", {})
    torch.testing.assert_close(_run(cpp_build.load_library(source + "\n")), with_header, rtol=0, atol=0)


def test_a_damaged_header_is_rebuilt(fresh, monkeypatch):
    _run(cpp_build.load_library(PRELUDE + KERNEL, header=PRELUDE))
    gch = next((fresh / "cpp-pch").glob("*.gch"))
    data = bytearray(gch.read_bytes())
    data[len(data) // 2] ^= 0x20
    gch.write_bytes(bytes(data))
    monkeypatch.setattr(cpp_build, "_LOADED", {})
    monkeypatch.setattr(cpp_build, "_HEADERS", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(cpp_build.load_library(PRELUDE + KERNEL.replace("0.5f", "(0.5f)"), header=PRELUDE))
    assert any("corrupted" in str(w.message) for w in caught)
    assert len(list((fresh / "cpp-pch").glob("*.gch"))) == 1


def test_without_the_cache_the_header_lives_in_scratch(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CACHE", "1")
    monkeypatch.setattr(cpp_build, "_LOADED", {})
    monkeypatch.setattr(cpp_build, "_HEADERS", {})
    _run(cpp_build.load_library(PRELUDE + KERNEL, header=PRELUDE))
    (included,) = cpp_build._HEADERS.values()
    assert included.startswith(store.scratch("cpp-pch"))
