"""A warm start loads each static kernel's binary from where the cold compile's Triton filed it,
without Triton's JIT front end ([Note: warm binaries] in kiln/codegen/triton/binaries.py), and
falls back to the JIT whenever the record may not name the binary the JIT would pick.

Triton's NVIDIA backend compiles without a GPU, so the cold precompile runs here for real (through
`fn.warmup`, with a stub driver for sm_90); everything up to loading the binary into a GPU is
checked on CPU. The last test runs a model cold then warm on a GPU, where there is one."""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from kiln.codegen import ir  # noqa: E402
from kiln.codegen.triton import binaries, launcher, source_cache  # noqa: E402

x0, r0 = ir.loop_var(0), ir.reduction_var(0)


class StubDriver:
    """Triton's JIT front end without a GPU: device 0, stream 0, an sm_90 (or `arch`) target."""

    def __init__(self, arch=90):
        self.arch = arch

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)


@pytest.fixture
def gpu_less(tmp_path, monkeypatch):
    """Fresh kiln and Triton caches, the stub driver, and a count of the JIT's runs (warmups and launches)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(driver, "_active", StubDriver())
    monkeypatch.setattr(source_cache, "_LOADED", {})      # no kernel compiled by another test in memory
    runs = []
    run = JITFunction.run

    def counted(self, *args, **kwargs):
        runs.append(self.__name__)
        return run(self, *args, **kwargs)
    monkeypatch.setattr(JITFunction, "run", counted)
    return runs


def _rowsum():
    bufs = {"a": ir.Buffer("a", (6, 40), (40, 1), torch.bfloat16, device="cuda"),
            "o": ir.Buffer("o", (6,), (1,), torch.float32, device="cuda")}
    kernel = ir.Kernel("rowsum", (6,), (ir.Stage((40,), (ir.Accumulate("t", "sum", ir.Load("a", x0 * 40 + r0, torch.bfloat16)),)),
                                        ir.Stage((), (ir.Store("o", x0, ir.Var("t", torch.float32)),))), ("a", "o"), ())
    return kernel, bufs


def _cold(monkeypatch):
    """A cold restore (compiling through the JIT), then the entry as a later process reads it, with
    the kernel modules forgotten (a later process imports them anew: no JIT cache in memory)."""
    kernel, bufs = _rowsum()
    entry = launcher.saved([kernel], bufs)
    cold = launcher.restore(entry)["rowsum"]
    monkeypatch.setattr(source_cache, "_LOADED", {})
    return cold, json.loads(json.dumps(entry, sort_keys=True))     # as kiln's store writes it


def test_the_loaded_binary_keeps_the_parameters_order(gpu_less, monkeypatch):
    """Triton's launcher parses arguments in the signature's order; kiln's store sorts JSON keys, and
    a signature kept as a JSON object came back alphabetical (INDEX_DTYPE first): the H200's first
    warm launch read INDEX_DTYPE where an int was due."""
    cold, entry = _cold(monkeypatch)
    warm = launcher.restore(entry)["rowsum"]
    original = cold.warmed.result(ignore_errors=True) if hasattr(cold.warmed, "result") else cold.warmed
    assert list(warm.prebuilt.src.signature.items()) == list(original.src.signature.items())
    assert list(warm.prebuilt.src.signature) == warm.prebuilt.src.fn.arg_names


def test_a_warm_restore_loads_the_cold_binary_without_the_jit(gpu_less, monkeypatch):
    cold, entry = _cold(monkeypatch)
    assert gpu_less == [cold.plans[()].fn.__name__]            # the cold one compiled through fn.warmup
    compiled = cold.warmed.result()
    record = entry["binaries"]["rowsum"]
    assert record["hash"] == compiled.hash and sorted(os.path.splitext(f)[1] for f in record["files"]) == [".cubin", ".json"]
    warm = launcher.restore(entry)["rowsum"]
    assert len(gpu_less) == 1                                   # no warmup this time
    assert warm.plans[()].fn is not cold.plans[()].fn           # the module was imported anew
    assert warm.prebuilt.hash == compiled.hash and warm.prebuilt.kernel == compiled.kernel
    assert warm.prebuilt.packed_metadata == compiled.packed_metadata
    assert warm.prebuilt.src.signature == compiled.src.signature and warm.prebuilt.src.constants == compiled.src.constants
    assert entry["binaries"]["rowsum"] == record               # kept as it was


@pytest.mark.parametrize("spoil", ["triton version", "file outside the folder", "missing binary", "other hash",
                                   "other warps", "other environment", "always compile"])
def test_a_record_in_doubt_falls_back_to_the_jit(gpu_less, monkeypatch, spoil):
    cold, entry = _cold(monkeypatch)
    record = entry["binaries"]["rowsum"]
    folder = binaries._folder(record["hash"])
    if spoil == "triton version":
        record["triton"] = "0.0.0"
    elif spoil == "file outside the folder":
        record["files"] = [f"../{os.path.basename(folder)}/{f}" for f in record["files"]]
    elif spoil == "missing binary":
        os.remove(os.path.join(folder, next(f for f in record["files"] if f.endswith(".cubin"))))
    elif spoil == "other hash":
        record["hash"] = "0" * 64
    elif spoil == "other warps":          # the plan of this kiln would compile with other options
        choose = launcher.heuristics.choose
        monkeypatch.setattr(launcher.heuristics, "choose",
                            lambda *a: dataclasses.replace(choose(*a), num_warps=2 * choose(*a).num_warps))
    elif spoil == "other environment":
        monkeypatch.setattr(binaries, "_env", lambda: {"TRITON_SOME_SETTING": "1"})
    elif spoil == "always compile":
        monkeypatch.setattr(binaries.triton.knobs.compilation, "always_compile", True)
    warm = launcher.restore(entry)["rowsum"]
    assert warm.prebuilt is None and len(gpu_less) == 2         # warmed up through the JIT again
    assert spoil in ("missing binary", "other warps", "other environment", "always compile") or \
        entry["binaries"]["rowsum"]["hash"] == cold.warmed.result().hash    # the record is the JIT's again


def test_the_first_call_launches_the_loaded_binary_directly(gpu_less, monkeypatch):
    _, entry = _cold(monkeypatch)
    warm = launcher.restore(entry)["rowsum"]
    prebuilt = warm.prebuilt
    launches = []

    class Direct:                       # stands in for the launch through Triton's C launcher (a GPU's)
        def __init__(self, compiled, plan, tensors, aligned=False):
            self.compiled, self.plan, self.aligned = compiled, plan, aligned

        def launch(self, args):
            launches.append(args)
            return True
    monkeypatch.setattr(launcher, "_DirectLaunch", Direct)
    a, o = torch.empty(6, 40, dtype=torch.bfloat16), torch.empty(6)
    warm(a, o)
    warm(a, o)
    direct = warm.direct[()]
    assert direct.compiled is prebuilt and direct.aligned and direct.plan is warm.plans[()]
    assert len(launches) == 2 and len(gpu_less) == 1 and warm.prebuilt is None


def test_a_launcher_that_refuses_the_arguments_falls_back_to_the_jit(gpu_less, monkeypatch):
    """On the H200 the first launch of a loaded binary raised TypeError from Triton's argument
    parsing (nothing launched): the call goes the JIT path instead of failing."""
    _, entry = _cold(monkeypatch)
    warm = launcher.restore(entry)["rowsum"]
    assert warm.prebuilt is not None

    class Refusing:
        def __init__(self, compiled, plan, tensors, aligned=False):
            self.signature = {}

        def launch(self, args):
            raise TypeError("'dtype' object cannot be interpreted as an integer")
    monkeypatch.setattr(launcher, "_DirectLaunch", Refusing)
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: gpu_less.append("jit"))
    warm(torch.empty(6, 40, dtype=torch.bfloat16), torch.empty(6))
    assert gpu_less[-1] == "jit" and warm.prebuilt is None and () not in warm.direct


def test_a_binary_for_another_gpu_is_not_launched(gpu_less, monkeypatch):
    _, entry = _cold(monkeypatch)
    warm = launcher.restore(entry)["rowsum"]
    assert warm.prebuilt is not None
    monkeypatch.setattr(driver, "_active", StubDriver(arch=80))
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: gpu_less.append("jit"))
    warm(torch.empty(6, 40, dtype=torch.bfloat16), torch.empty(6))
    assert gpu_less[-1] == "jit" and not warm.direct


WARM_CHILD = textwrap.dedent("""
    import torch, kiln
    from triton.runtime.jit import JITFunction
    runs = []
    run = JITFunction.run
    JITFunction.run = lambda self, *a, **k: (runs.append(1), run(self, *a, **k))[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).cuda()
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x), rtol=1e-4, atol=1e-4)
    print("jit runs", len(runs))
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_second_process_on_the_gpu_runs_no_triton_jit(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "kiln"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    env.pop("KILN_DISABLE_CACHE", None)
    runs = [subprocess.run([sys.executable, "-c", WARM_CHILD], env=env, capture_output=True, text=True, cwd=str(root))
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    cold, warm = (int(r.stdout.split()[-1]) for r in runs)
    assert cold > 0 and warm == 0, (cold, warm)
