"""Compiling C++ kernel modules: one shared library per graph, cached on disk by source hash.

g++ costs about a second per invocation, so a graph's kernels share a few translation units (one
per core: `kiln.codegen.compile.save_kernels`), builds run on a pool of one thread per core,
started once (each runs g++ as a subprocess, so the parts of a graph compile at once), a source
asked for while its build runs waits for that build, and a library whose source hash is already in the cache
(`kiln.runtime.store`: `<cache>/cpp/`, checked against its checksum) is loaded without compiling.

[Note: precompiled prelude] Every module starts with the same prelude (headers and helpers:
`kiln.codegen.cpp_prelude`), and parsing it is most of g++'s time on a small graph (0.15 of 0.25
s). A caller names that prefix (`header=`); it is compiled once into a precompiled header, kept in
the cache (`<cache>/cpp-pch/`, checksummed as a library is) or in this process's scratch folder,
and each module is compiled as `-include <header>` plus its own kernels. g++ uses the `.gch` only
when it was built with the same flags, else reads the header's text (the same text), so the
machine code is the same either way; the library is still cached by the hash of its full source.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import os
import subprocess
import threading

from kiln import log, trace
from kiln.errors import CompileStageError
from kiln.runtime import store

CXX = os.environ.get("CXX", "g++")
# -fno-trapping-math: results stay IEEE (NaN and inf as before), but float compares may be
# speculated, so `?:` and clamps if-convert and their loops vectorize.
# -ffp-contract=off: see [Note: no FMA contraction].
CXXFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fno-trapping-math",
            "-ffp-contract=off", "-Wno-unused-variable", "-Wno-unused-label")

# [Note: no FMA contraction] g++ contracts `a * b - c` into one fused multiply-add by default
# (-ffp-contract=fast, in C++ even under -std=c++17), which skips the rounding of `a * b`. Eager
# rounds every op, and a fused kernel often computes one value twice: layer norm's `x - mean(x)`
# recomputes `x` beside the mean that summed its rounded value. With contraction the difference is
# the product's rounding error instead of exactly 0 (over a dim of size 1, where eager's is 0), and
# a normalization after it multiplies that by rsqrt(eps) (fuzz seed 2610). Inductor's C++ backend
# turns contraction off for the same reason.

LDFLAGS = ("-lmvec",)   # glibc's vector math (see cpp.VECTOR_MATH)

# One g++ per core at most; the pool lives as long as the process (builds of every graph share it).
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="kiln-g++")
_LOADED: dict[str, "Library"] = {}
_BUILDING: dict[str, concurrent.futures.Future] = {}   # source key -> the build running now
_WAITED: set[str] = set()     # libraries whose build a compile has waited for already
_LOCK = threading.Lock()


class Library:
    """A loaded kernel library; `function` returns a ctypes function taking data pointers and ints."""

    def __init__(self, path: str, compiled: bool = False):
        self.path = path
        self.compiled = compiled          # g++ ran for it in this process (else it was cached)
        self._lib = ctypes.CDLL(path)

    def function(self, name: str, n_pointers: int, n_ints: int, returns_error: bool = False):
        """`returns_error`: the function returns an int64 error code (a kernel's failed index check)."""
        fn = getattr(self._lib, name)
        fn.argtypes = [ctypes.c_void_p] * n_pointers + [ctypes.c_int64] * n_ints
        fn.restype = ctypes.c_int64 if returns_error else None
        return fn


def source_key(source: str) -> str:
    h = hashlib.sha256()
    h.update(" ".join((CXX,) + CXXFLAGS + LDFLAGS).encode())
    h.update(source.encode())
    return h.hexdigest()[:32]


_HEADERS: dict[str, str | None] = {}   # header key -> the path g++ `-include`s, or None (not usable)
_HEADER_LOCK = threading.Lock()
_PCH_FLAGS = tuple(f for f in CXXFLAGS if f != "-shared")


def precompiled_header(header: str) -> str | None:
    """A path to `-include` whose precompiled form holds `header` ([Note: precompiled prelude]),
    or None where g++ cannot build one."""
    key = source_key("pch\n" + header)
    with _HEADER_LOCK:             # the pool's builds wait for one header build, not start several
        if key not in _HEADERS:
            _HEADERS[key] = _build_header(header, key)
        return _HEADERS[key]


def _build_header(header: str, key: str) -> str | None:
    gch = store.library("cpp-pch", key)
    if gch is None:
        work = store.build_dir("cpp-pch")
        h_path = os.path.join(work, "prelude.h")
        with open(h_path, "w") as f:
            f.write(header)
        proc = subprocess.run([CXX, *_PCH_FLAGS, "-x", "c++-header", h_path, "-o", h_path + ".gch"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            store.remove_tree(work)
            return None
        gch = store.put_library("cpp-pch", key, h_path + ".gch")
        if gch == h_path + ".gch":     # no cache: the build folder is this process's
            return h_path
        store.remove_tree(work)
    # g++ looks for `<included>.gch` beside the included file, whose text is the header's
    return store.source_file("cpp-pch", os.path.basename(gch)[: -len(".gch")], header)


def _compile(source: str, key: str, header: str = "") -> tuple[str, bool]:
    """The path of the library built from `source`, and whether g++ ran: the cached one, else
    g++'s output put in the cache. `header`: a prefix of `source` to read precompiled."""
    cached = store.library("cpp", key)
    trace.emit("cache", cache="C++ library", hit=cached is not None, key=key)
    if cached is not None:
        return cached, False
    work = store.build_dir("cpp")      # private to this build: concurrent builds never collide
    cpp_path, so_path = os.path.join(work, f"k{key}.cpp"), os.path.join(work, f"k{key}.so")
    included = precompiled_header(header) if header and source.startswith(header) else None
    with open(cpp_path, "w") as f:
        f.write(source[len(header):] if included else source)
    pch = ["-Winvalid-pch", "-include", included] if included else []
    proc = subprocess.run([CXX, *CXXFLAGS, *pch, cpp_path, "-o", so_path, *LDFLAGS], capture_output=True, text=True)
    if proc.returncode != 0:           # the folder stays, so the error's path can be read
        raise CompileStageError("codegen", f"g++ failed on {cpp_path}:\n{proc.stderr[-4000:]}")
    path = store.put_library("cpp", key, so_path)
    if path != so_path:
        store.remove_tree(work)
    return path, True


def compile_async(source: str, header: str = "") -> concurrent.futures.Future:
    """Start building `source` (or find it cached); the future's result is a `Library`.
    `header`: a prefix of `source` g++ may read precompiled ([Note: precompiled prelude])."""
    key = source_key(source)
    with _LOCK:
        lib = _LOADED.get(key)
        if lib is None and key in _BUILDING:     # asked for again while g++ runs: the same build
            return _BUILDING[key]
        if lib is None:
            def work():
                try:
                    path, compiled = _compile(source, key, header)
                    with _LOCK:
                        if key not in _LOADED:
                            _LOADED[key] = Library(path, compiled)
                        return _LOADED[key]
                finally:
                    with _LOCK:
                        _BUILDING.pop(key, None)
            future = _BUILDING[key] = _POOL.submit(work)
            return future
    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result(lib)
    return done


def load_library(source: str, header: str = "") -> Library:
    future = compile_async(source, header)
    with log.stage("compile") as waited:     # [Note: compile stages]: g++, else loading a cached library
        lib = future.result()
        if not lib.compiled or lib.path in _WAITED:
            waited.name = "load"
        _WAITED.add(lib.path)
    return lib
