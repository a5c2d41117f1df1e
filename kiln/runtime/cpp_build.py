"""Compiling C++ kernel modules: one shared library per graph, cached on disk by source hash.

g++ costs about a second per invocation, so a graph's kernels share one translation unit, builds
run on a thread pool (the compiler runs as a subprocess, so graphs compile in parallel while
Python lowers the next one), and a library whose source hash is already in the cache directory
(`$KILN_CACHE_DIR`, default `~/.cache/kiln`) is loaded without compiling.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading

from kiln import trace
from kiln.errors import CompileStageError

CXX = os.environ.get("CXX", "g++")
# -fno-trapping-math: results stay IEEE (NaN and inf as before), but float compares may be
# speculated, so `?:` and clamps if-convert and their loops vectorize.
CXXFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fno-trapping-math",
            "-Wno-unused-variable", "-Wno-unused-label")

LDFLAGS = ("-lmvec",)   # glibc's vector math (see cpp.VECTOR_MATH)

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
_LOADED: dict[str, "Library"] = {}
_LOCK = threading.Lock()


def cache_dir() -> str:
    path = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    os.makedirs(path, exist_ok=True)
    return path


class Library:
    """A loaded kernel library; `function` returns a ctypes function taking data pointers and ints."""

    def __init__(self, path: str):
        self.path = path
        self._lib = ctypes.CDLL(path)

    def function(self, name: str, n_pointers: int, n_ints: int):
        fn = getattr(self._lib, name)
        fn.argtypes = [ctypes.c_void_p] * n_pointers + [ctypes.c_int64] * n_ints
        fn.restype = None
        return fn


def source_key(source: str) -> str:
    h = hashlib.sha256()
    h.update(" ".join((CXX,) + CXXFLAGS + LDFLAGS).encode())
    h.update(source.encode())
    return h.hexdigest()[:32]


def _compile(source: str, key: str) -> str:
    folder = cache_dir()
    so_path = os.path.join(folder, f"k{key}.so")
    trace.emit("cache", cache="C++ library", hit=os.path.exists(so_path), key=key)
    if os.path.exists(so_path):
        return so_path
    cpp_path = os.path.join(folder, f"k{key}.cpp")
    with open(cpp_path, "w") as f:
        f.write(source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    proc = subprocess.run([CXX, *CXXFLAGS, cpp_path, "-o", tmp, *LDFLAGS], capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise CompileStageError("codegen", f"g++ failed on {cpp_path}:\n{proc.stderr[-4000:]}")
    os.replace(tmp, so_path)  # atomic: concurrent processes never load a half-written library
    return so_path


def compile_async(source: str) -> concurrent.futures.Future:
    """Start building `source` (or find it cached); the future's result is a `Library`."""
    key = source_key(source)
    with _LOCK:
        lib = _LOADED.get(key)
    if lib is not None:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(lib)
        return done

    def work():
        path = _compile(source, key)
        with _LOCK:
            if key not in _LOADED:
                _LOADED[key] = Library(path)
            return _LOADED[key]
    return _POOL.submit(work)


def load_library(source: str) -> Library:
    return compile_async(source).result()
