"""The on-disk cache is safe to share ([Note: a cache safe to share] in kiln/runtime/store.py):
concurrent writers, damaged entries, directories others can write, and no pickle anywhere."""
import os
import pathlib
import stat
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import kiln
from kiln.runtime import cpp_build, store

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


# A training step of `_model` under kiln and under eager; prints how many programs it compiled and
# lowered. The process waits for the file argv[1] to exist, so several start compiling at once.
CHILD = textwrap.dedent("""
    import os, sys, time, torch, kiln
    import kiln.pipeline as backend
    from kiln.codegen import compile as c
    sys.path.insert(0, {tests!r})
    from test_store import _model
    programs, lowered = [], []
    orig_compile, orig_lower = backend.compile_prim_graph, c.lower_graph
    backend.compile_prim_graph = lambda *a, **k: (programs.append(1), orig_compile(*a, **k))[1]
    c.lower_graph = lambda *a: (lowered.append(1), orig_lower(*a))[1]
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    model, x = _model(), torch.randn(5, 8)
    ref = model(x); ref.sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = kiln.compile(model)(x); got.sum().backward()
    torch.testing.assert_close(got, ref)
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g)
    print("programs", len(programs), "lowered", len(lowered))
""").format(tests=str(pathlib.Path(__file__).parent))


def _spawn(cache: pathlib.Path, go: pathlib.Path) -> subprocess.Popen:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("KILN_DISABLE_CACHE", None)
    return subprocess.Popen([sys.executable, "-c", CHILD, str(go)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def test_four_processes_compiling_one_model_into_one_empty_cache(tmp_path, monkeypatch):
    cache, go = tmp_path / "cache", tmp_path / "go"
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))   # this process reads what they wrote
    procs = [_spawn(cache, go) for _ in range(4)]
    time.sleep(1.0)
    go.touch()                      # all four start compiling the same programs now
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "corrupted" not in err and "not using the cache" not in err, err[-3000:]
    counts = {tuple(out.split()) for out, _ in outs}
    assert len(counts) == 1, counts
    programs = int(counts.pop()[1])
    assert programs >= 2            # forward and backward
    entries = sorted((cache / "graphs").iterdir())
    assert len(entries) == programs, entries
    for entry in entries:
        assert store.read_json("graphs", entry.name) is not None   # every entry is whole
    index = list((cache / "cpp").glob("*.index"))
    assert index and all(store.library("cpp", i.name[:-len(".index")]) for i in index)
    leftovers = [p for p in cache.rglob("*") if p.name.startswith((".tmp-", ".build-"))]
    assert not leftovers, leftovers
    # and a fifth process finds everything: it lowers nothing
    go2 = tmp_path / "go2"
    go2.touch()
    fifth = _spawn(cache, go2)
    out, err = fifth.communicate(timeout=600)
    assert fifth.returncode == 0, err[-3000:]
    assert out.split()[-1] == "0", out


def _train_step(model, x):
    kiln.reset()
    got = kiln.compile(model)(x)
    got.sum().backward()
    return got


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """A fresh cache in tmp_path and a count of lowered programs; the process forgets loaded libraries."""
    from kiln.codegen import compile as c
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_DISABLE_CACHE", raising=False)
    monkeypatch.setattr(cpp_build, "_LOADED", {})
    lowered = []
    orig = c.lower_graph
    monkeypatch.setattr(c, "lower_graph", lambda *a: (lowered.append(1), orig(*a))[1])
    return tmp_path / "cache", lowered


def _damage(path: pathlib.Path, how: str) -> None:
    """Truncate the file or flip one byte, as a new file: this process still maps the library it
    loaded, and rewriting a mapped file in place would crash it (a later process sees the damage)."""
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) * 2 // 3] ^= 0x20
    damaged = path.with_name(path.name + ".damaged")
    damaged.write_bytes(bytes(data))
    os.replace(damaged, path)


@pytest.mark.parametrize("how", ["truncate", "flip"])
@pytest.mark.parametrize("what", ["graph", "library", "aot"])
def test_a_damaged_entry_is_detected_recompiled_and_warned_about_once(counted, how, what):
    cache, lowered = counted
    model, x = _model(), torch.randn(5, 8)
    ref = model(x)
    _train_step(model, x)
    cold = len(lowered)
    assert cold >= 2
    folder, pattern = {"graph": ("graphs", "*.json"), "library": ("cpp", "*.so"), "aot": ("aot", "*.json")}[what]
    victim = sorted((cache / folder).glob(pattern))[0]
    _damage(victim, how)
    cpp_build._LOADED.clear()            # as a new process: libraries are read from disk again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _train_step(model, x)
    torch.testing.assert_close(got, ref)
    corrupted = [w for w in caught if "corrupted" in str(w.message)]
    assert len(corrupted) == 1 and victim.name in str(corrupted[0].message), [str(w.message) for w in caught]
    if what == "graph":
        assert len(lowered) == cold + 1            # only the damaged program is compiled again
    if what == "aot":
        assert len(lowered) == cold                # traced again; both programs come from the cache
    # the entry is whole again: the next run reads everything and warns about nothing
    cpp_build._LOADED.clear()
    before = len(lowered)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(_train_step(model, x), ref)
    assert not [w for w in caught if "corrupted" in str(w.message)]
    assert len(lowered) == before


@pytest.mark.parametrize("problem", ["writable by others", "owned by another user"])
def test_an_unsafe_cache_directory_is_refused_with_one_warning(counted, monkeypatch, problem):
    cache, lowered = counted
    cache.mkdir(mode=0o700)
    if problem == "writable by others":
        os.chmod(cache, 0o777)
        expected = "writable by group and others"
    else:
        uid = os.getuid()
        monkeypatch.setattr(store.os, "getuid", lambda: uid + 1)
        expected = f"owned by uid {uid}"
    store.forget_checks()
    model, x = _model(), torch.randn(5, 8)
    ref = model(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _train_step(model, x)
        got2 = _train_step(model, x)         # compiled again, still without the disk cache
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got2, ref)
    refused = [str(w.message) for w in caught if "not using the cache directory" in str(w.message)]
    assert len(refused) == 1 and expected in refused[0], [str(w.message) for w in caught]
    assert list(cache.iterdir()) == []       # nothing was written there
    assert len(lowered) >= 4                 # both runs compiled: nothing came from the refused cache
    store.forget_checks()


def test_a_new_cache_directory_is_private(counted):
    cache, _ = counted
    model, x = _model(), torch.randn(5, 8)
    _train_step(model, x)
    for path in [cache, *(p for p in cache.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_no_pickle_in_the_runtime_or_the_code_generator():
    found = subprocess.run(["grep", "-rn", "pickle", "kiln/runtime", "kiln/codegen"], cwd=ROOT,
                           capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == "", found.stdout
