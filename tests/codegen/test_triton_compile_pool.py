"""Compile workers fill Triton's cache with static kernels' binaries ([Note: compile workers] in
kiln/codegen/triton/compile_pool.py), and the parent's warmup then only finds them.

Triton's NVIDIA backend compiles without a GPU, so the workers compile for real here (for sm_90,
under their stub driver) and the parent's warmup runs under the stub driver of
test_triton_warm_binaries.py; Triton's compilation listener says which of the parent's compiles
were cache hits."""
import dataclasses
import os
import time
import warnings

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402

from kiln.codegen import ir  # noqa: E402
from kiln.codegen.triton import compile_pool, launcher, source_cache  # noqa: E402

from tests.codegen.test_triton_warm_binaries import StubDriver  # noqa: E402

x0, r0 = ir.loop_var(0), ir.reduction_var(0)
N = 8


def _rowsums(n=N):
    """`n` distinct static CUDA kernels (row sums of rows 40, 48, ... long, times 1, 2, ...: each
    its own Triton binary) and their buffers."""
    kernels, bufs = [], {}
    for i in range(n):
        length = 40 + 8 * i
        a, o = f"a{i}", f"o{i}"
        bufs[a] = ir.Buffer(a, (6, length), (length, 1), torch.bfloat16, device="cuda")
        bufs[o] = ir.Buffer(o, (6,), (1,), torch.float32, device="cuda")
        load = ir.Load(a, x0 * length + r0, torch.bfloat16)
        scaled = ir.Op("mul", (ir.Var("t", torch.float32), ir.Constant(float(i + 1), torch.float32)), torch.float32)
        kernels.append(ir.Kernel(f"rowsum{i}", (6,), (ir.Stage((length,), (ir.Accumulate("t", "sum", load),)),
                                                      ir.Stage((), (ir.Store(o, x0, scaled),))),
                                 (a, o), ()))
    return kernels, bufs


@pytest.fixture
def gpu_less(tmp_path, monkeypatch):
    """Fresh kiln and Triton caches, the stub driver, a fresh pool state, and the parent's compiles
    as Triton's listener reports them (True: a cache hit)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(driver, "_active", StubDriver())
    monkeypatch.setattr(source_cache, "_LOADED", {})
    for name, value in (("_POOL", None), ("_BROKEN", False), ("_WARNED", False)):
        monkeypatch.setattr(compile_pool, name, value)
    hits = []
    monkeypatch.setattr(triton.knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))
    yield hits
    if compile_pool._POOL is not None:
        compile_pool._POOL.close()


def _compiled(fns):
    return {name: fn.warmed.result() for name, fn in fns.items()}


def test_workers_fill_the_cache_and_the_parent_only_finds_the_binaries(gpu_less, monkeypatch, tmp_path):
    kernels, bufs = _rowsums()
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    pooled = _compiled(launcher.build(kernels, bufs))
    assert compile_pool._POOL is not None and gpu_less == [True] * N       # every parent compile a hit
    # The in-process path, in a fresh cache: the same binaries under the same keys.
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton2"))
    monkeypatch.setattr(source_cache, "_LOADED", {})
    gpu_less.clear()
    alone = _compiled(launcher.build(kernels, bufs))
    assert gpu_less == [False] * N
    for name, compiled in alone.items():
        assert pooled[name].hash == compiled.hash
        assert pooled[name].asm["ptx"] == compiled.asm["ptx"] and pooled[name].kernel == compiled.kernel
        assert pooled[name].metadata == compiled.metadata
    # The same pool, under a third cache dir: its workers, which hold these kernels loaded, file them anew.
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton3"))
    monkeypatch.setattr(source_cache, "_LOADED", {})
    gpu_less.clear()
    assert {n: c.hash for n, c in _compiled(launcher.build(kernels, bufs)).items()} == {n: c.hash for n, c in alone.items()}
    assert gpu_less == [True] * N


def test_the_pool_is_reused_and_records_still_name_the_binaries(gpu_less, monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    kernels, bufs = _rowsums()
    entry = launcher.saved(kernels[:4], bufs)
    monkeypatch.setattr(compile_pool, "MIN_KERNELS", 4)
    fns = launcher.restore(entry)
    pool = compile_pool._POOL
    assert pool is not None and gpu_less == [True] * 4
    assert {r["hash"] for r in entry["binaries"].values()} == {c.hash for c in _compiled(fns).values()}
    gpu_less.clear()
    launcher.build(kernels[4:], bufs)
    assert compile_pool._POOL is pool and gpu_less == [True] * 4


def test_prestart_starts_the_pool_that_the_build_then_uses(gpu_less, monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "0")
    compile_pool.prestart()
    assert compile_pool._POOL is None                             # off: nothing started
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    compile_pool.prestart()                                       # as the backend does before aot
    pool = compile_pool._POOL
    assert pool is not None and len(pool.workers) == 2
    kernels, bufs = _rowsums()
    launcher.build(kernels, bufs)
    assert compile_pool._POOL is pool and gpu_less == [True] * N  # the workers compiled every kernel


def test_fewer_kernels_or_workers_off_compile_in_process(gpu_less, monkeypatch):
    started = []
    monkeypatch.setattr(compile_pool, "CompilePool", lambda n: started.append(n))
    kernels, bufs = _rowsums()
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    launcher.build(kernels[:N - 1], bufs)                         # below MIN_KERNELS
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "0")
    launcher.build(kernels, bufs)
    assert started == [] and gpu_less.count(False) == N
    monkeypatch.delenv("KILN_COMPILE_WORKERS")                   # the default is auto:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert compile_pool.size() == 0                               # fewer than 4 cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert compile_pool.size() == 16
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "auto")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert compile_pool.size() == 7


def _fallback(gpu_less, monkeypatch, tmp_path):
    """A build whose pool fails: the parent compiles every kernel itself, warning once, as without a pool."""
    kernels, bufs = _rowsums()
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fns = launcher.build(kernels, bufs)
        compiled = _compiled(fns)
        monkeypatch.setattr(source_cache, "_LOADED", {})
        launcher.build(kernels, bufs)                               # a later compile: no pool, no warning
    assert [str(w.message) for w in caught if "compile workers" in str(w.message)][:1] == [str(caught[0].message)]
    assert len([w for w in caught if "compile workers" in str(w.message)]) == 1
    assert compile_pool._BROKEN and compile_pool._POOL is None
    assert not all(gpu_less[:N])                                  # the parent compiled what the pool did not
    assert all(c is not None for c in compiled.values())
    return compiled


def test_a_worker_that_raises_falls_back(gpu_less, monkeypatch, tmp_path):
    job = launcher.TritonKernel.compile_job
    monkeypatch.setattr(launcher.TritonKernel, "compile_job",
                        lambda self: dataclasses.replace(job(self), function="no_such_kernel"))
    _fallback(gpu_less, monkeypatch, tmp_path)
    assert gpu_less[:N] == [False] * N


@pytest.mark.parametrize("worker", ["import sys; sys.exit(3)", "import time; time.sleep(60)"], ids=["dies", "hangs"])
def test_a_worker_that_dies_or_hangs_falls_back(gpu_less, monkeypatch, tmp_path, worker):
    monkeypatch.setattr(compile_pool, "_worker_command", lambda: [compile_pool.sys.executable, "-c", worker])
    monkeypatch.setattr(compile_pool, "TIMEOUT_S", 2.0)
    started = time.perf_counter()
    _fallback(gpu_less, monkeypatch, tmp_path)
    assert time.perf_counter() - started < 50                     # the hung workers were killed, not awaited


def test_symbolic_kernels_compile_ahead_for_the_first_sizes_and_serve_later_ones(gpu_less, monkeypatch):
    # `N` row sums over a symbolic number of rows s0 (rows 72, 80, ... long): built for the call that
    # binds s0 = 16, the workers compile them all; a later s0 = 17 or 31 picks the same launch config,
    # and its launch finds that binary (s0 and xnumel are unspecialized: [Note: symbolic sizes are not
    # specialized]), where a specialized one would compile again for "not divisible by 16".
    s0 = ir.size_var("s0")
    kernels, bufs = [], {}
    for i in range(N):
        length = 72 + 8 * i
        a, o = f"a{i}", f"o{i}"
        bufs[a] = ir.Buffer(a, (s0, length), (length, 1), torch.bfloat16, device="cuda")
        bufs[o] = ir.Buffer(o, (s0,), (1,), torch.float32, device="cuda")
        load = ir.Load(a, x0 * length + r0, torch.bfloat16)
        kernels.append(ir.Kernel(f"rowsum{i}", (s0,), (ir.Stage((length,), (ir.Accumulate("t", "sum", load),)),
                                                       ir.Stage((), (ir.Store(o, x0, ir.Var("t", torch.float32)),))),
                                 (a, o), (s0,)))
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    fns = launcher.build(kernels, bufs, hints={"s0": 16})
    assert compile_pool._POOL is not None and gpu_less == [True] * N       # compiled by the workers
    first = _compiled(fns)
    for name, fn in fns.items():
        assert fn.first_sizes == (16,) and () not in fn.plans
        for later in (17, 31):
            plan = fn.plan((later,), ())
            assert plan.config == fn.plans[(16,)].config
            assert launcher.warm(plan, fn.arg_dtypes, fn.link) is first[name]   # the JIT's binary, no compile
    assert gpu_less == [True] * N
    # without hints (an unbacked size), nothing is compiled ahead
    monkeypatch.setattr(source_cache, "_LOADED", {})
    assert all(fn.warmed is None and not fn.precompiled for fn in launcher.build(kernels, bufs).values())
