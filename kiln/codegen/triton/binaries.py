"""A static kernel's compiled binary found again without Triton's JIT front end (the warm start).

[Note: warm binaries] A warm start used to rebuild each static-size kernel's binary through
`fn.warmup(...)`: Triton binds the arguments, computes the specialization key, hashes the source
and every function it calls, finds the binary in its on-disk cache and parses the metadata, some
milliseconds a kernel of which only the last steps find anything. kiln's cache entry already holds
the kernel's source and launch plan, so after a cold precompile it also keeps, per kernel, where
Triton filed that plan's binary (`record`): Triton's cache hash (the folder `<cache dir>/<base32
of hash>`), the metadata JSON's and the binary's file names, and the signature, constants and
attributes the compile was specialized on, as JSON. A warm start builds the `CompiledKernel` from
those two files (`load`), as Triton's own cache hit does, and the kernel's first call launches it
through [Note: direct launch] for the plan the warmup would have made.

The hash is not recomputed (that is the cost avoided), so what it covers is checked instead, and
any doubt falls back to the JIT path, which finds or compiles the right binary: the same Triton
version (the record's and the metadata's), the file names plain names inside the hash's folder,
the files present, the metadata's hash and function name the record's, the compile options those
the JIT would pass now (warps, stages, libdevice, debug, instrumentation), the same cache-
invalidating environment, a plain on-disk cache with no override, dump or always-compile, and at
the first launch the GPU's target (`runs_here`). The source and plan are the cache entry's, whose
key covers kiln's code. The binary was compiled for 16-byte aligned pointers; a call whose
pointers are not takes the JIT path, as after any first launch.

Hands on: `record(compiled) -> dict | None`, `load(record, fn, options) -> CompiledKernel | None`,
`runs_here(compiled) -> bool`.
"""
from __future__ import annotations

import base64
import json
import os
import re

import triton
import triton.language as tl

_HASH = re.compile(r"[0-9a-f]{64}")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _folder(hash_: str) -> str:
    """Where Triton's file cache keeps the group of `hash_` (`triton.runtime.cache`'s naming)."""
    return os.path.join(triton.knobs.cache.dir, base64.b32encode(bytes.fromhex(hash_)).decode().rstrip("="))


def _plain_cache() -> bool:
    """Whether Triton's cache is the on-disk one, consulted as usual."""
    from triton.runtime.cache import FileCacheManager
    k = triton.knobs
    return (k.cache.manager_class in (None, FileCacheManager) and bool(k.cache.dir) and not k.compilation.always_compile
            and not k.compilation.override and not k.compilation.dump_ir)


def _env() -> dict:
    from triton._C.libtriton import get_cache_invalidating_env_vars
    return dict(get_cache_invalidating_env_vars())


def _constant_to_json(value):
    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"constexpr {value!r}")


def _constant_from_json(value):
    return tl.dtype(value["dtype"]) if isinstance(value, dict) else value


def record(compiled) -> dict | None:
    """Where Triton filed `compiled` and what it was specialized on, as JSON; None when it is not
    in a plain on-disk cache (nothing a later process could find without the JIT)."""
    from triton.compiler.compiler import ASTSource, make_backend
    src = compiled.src
    if not _plain_cache() or not isinstance(src, ASTSource) or not _HASH.fullmatch(compiled.hash):
        return None
    ext = make_backend(compiled.metadata.target).binary_ext
    folder = os.path.abspath(_folder(compiled.hash))
    names = [n for n in compiled.metadata_group if n.endswith((".json", f".{ext}"))]
    if len(names) != 2 or any(os.path.abspath(compiled.metadata_group[n]) != os.path.join(folder, n) for n in names):
        return None
    try:
        constants = [[list(k), _constant_to_json(v)] for k, v in src.constants.items()]
    except TypeError:
        return None
    return {"triton": triton.__version__, "hash": compiled.hash, "files": sorted(names), "env": _env(),
            "signature": list(map(list, src.signature.items())), "constants": constants,
            "attrs": [[list(k), v] for k, v in src.attrs.items()]}


def load(entry: dict, fn, options: dict):
    """The `CompiledKernel` `entry` (a `record`) names for the JIT function `fn`, compiled with
    `options` (num_warps, num_stages, link options), or None when it may not be the binary the
    JIT would pick ([Note: warm binaries]). Reads two files; touches no GPU."""
    from triton.compiler.compiler import ASTSource, CompiledKernel
    try:
        if (entry["triton"] != triton.__version__ or not _plain_cache() or not _HASH.fullmatch(entry["hash"])
                or entry["env"] != _env()):
            return None
        folder = _folder(entry["hash"])
        group = {}
        for name in entry["files"]:
            path = os.path.join(folder, name)
            if not _FILE.fullmatch(name) or not os.path.isfile(path):
                return None
            group[name] = path
        # in the order of the function's parameters: Triton's launcher parses the arguments by the
        # signature's order, and a JSON object's keys do not keep one (kiln's store sorts them: the
        # first warm launch on the H200 read INDEX_DTYPE where an int was due)
        signature = dict(map(tuple, entry["signature"]))
        if set(signature) != set(fn.arg_names):
            return None
        src = ASTSource(fn, {name: signature[name] for name in fn.arg_names},
                        {tuple(k): _constant_from_json(v) for k, v in entry["constants"]},
                        {tuple(k): v for k, v in entry["attrs"]})
        compiled = CompiledKernel(src, group, entry["hash"])
    except (KeyError, TypeError, ValueError, AttributeError, StopIteration, OSError):
        return None
    meta = compiled.metadata
    if meta.hash != entry["hash"] or meta.triton_version != triton.__version__ or meta.name != fn.__name__:
        return None
    jit = dict(options, debug=fn.debug or triton.knobs.runtime.debug,
               instrumentation_mode=triton.knobs.compilation.instrumentation_mode)
    wanted = _options(meta.target, repr(sorted(jit.items())), jit)
    if any(getattr(meta, k, None) != v for k, v in wanted.items()):
        return None
    return compiled


_OPTIONS: dict[tuple, dict] = {}


def _options(target, key: str, jit: dict) -> dict:
    """The compile options the JIT derives from its keyword arguments `jit` (`key`: their repr) for
    `target`, as the metadata JSON holds them; a graph's kernels share a few."""
    found = _OPTIONS.get((target, key))
    if found is None:
        from triton.compiler.compiler import make_backend
        found = _OPTIONS[(target, key)] = json.loads(json.dumps(make_backend(target).parse_options(jit).__dict__,
                                                                default=vars))
    return found


def runs_here(compiled) -> bool:
    """Whether the current GPU is the target `compiled` was built for (needs the GPU driver)."""
    from triton.runtime import driver
    return compiled.metadata.target == driver.active.get_current_target()
