"""Triton source text to loaded `@triton.jit` functions, cached on disk by the text's hash.

Triton needs a kernel's source in a real file (it reads it back with `inspect`), so each printed
source is kept as `<cache>/triton/k<hash>.py` (`kiln.runtime.store.source_file`: a file is
imported only when its text is the source just printed) and imported from there; Triton's own
cache finds the compiled binary. The module is loaded in the
target's mode: kernels for CPU tensors run under Triton's interpreter, whatever
`TRITON_INTERPRET` said when triton was imported, because Triton decides interpreted-or-compiled
when `@triton.jit` runs, i.e. when this module imports the file.

Hands on: `load_module(source, interpret) -> module`, `source_hash(source)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import sys
import threading
import types

import triton

from kiln.runtime import store

_LOADED: dict[tuple[str, bool], types.ModuleType] = {}
_LOCK = threading.Lock()


def source_hash(source: str) -> str:
    # Triton's version is part of the key: a file printed for one Triton may not parse in another.
    return hashlib.sha256(f"triton {triton.__version__}\n{source}".encode()).hexdigest()[:32]


@contextlib.contextmanager
def _interpret_mode(interpret: bool):
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs.runtime, "scope"):
        with knobs.runtime.scope():
            knobs.runtime.interpret = interpret
            yield
        return
    # Older Triton reads the environment at decoration time.
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def _interpreter_like_gpu() -> None:
    """Triton's interpreter checks every int32 add/mul for overflow with a device assert, which a
    GPU build only does under `debug=True`; the check costs ~8 ms per op on CPU, most of CI's
    time. Turn it off so interpreted kernels run as compiled ones do."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and getattr(options, "sanitize_overflow", False) and dataclasses.is_dataclass(options):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    _comparisons_are_bool(interpreter)


# [Note: interpreted comparisons are bool] Triton 3.6's interpreter computes a comparison as any
# binary op: numpy's bool result under the *left operand's* type tag (fp32 for `a < b` of floats).
# A block comparison keeps its bool array, but a scalar one (a 0-d load: `x0` of shape ()) is
# broadcast to a block by `np.full(..., dtype=<the tag>)`, i.e. to float32 zeros and ones, and
# `(a < b) | (a != a)` (maximum's NaN rule) then fails in numpy ("ufunc 'bitwise_or' not
# supported"); fuzz seed 100010. A compiled kernel has no such problem, so comparisons here are
# tagged int1, as the tensor semantics around them already say.
def _comparisons_are_bool(interpreter) -> None:
    cls = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if cls is None or handle is None or getattr(cls, "_kiln_bool_comparisons", False):
        return
    import triton.language as tl
    for name in [n for n in vars(cls) if n.startswith(("create_icmp", "create_fcmp"))]:
        compare = getattr(cls, name)

        def tagged(self, lhs, rhs, compare=compare):
            result = compare(self, lhs, rhs)
            return handle(result.data.astype(bool, copy=False), tl.int1)
        setattr(cls, name, tagged)
    cls._kiln_bool_comparisons = True


def load_module(source: str, interpret: bool) -> types.ModuleType:
    """Import `source` (once per process and mode); its `@triton.jit` functions are attributes."""
    key = (source_hash(source), interpret)
    with _LOCK:
        module = _LOADED.get(key)
        if module is not None:
            return module
        path = store.source_file("triton", f"k{key[0]}.py", source)
        name = f"kiln_triton_{key[0]}_{'interp' if interpret else 'gpu'}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        # Registered in sys.modules so `inspect` and Triton's source lookups find the file.
        sys.modules[name] = module
        if interpret:
            _interpreter_like_gpu()
        try:
            with _interpret_mode(interpret):
                spec.loader.exec_module(module)
        except Exception:
            del sys.modules[name]
            raise
        _LOADED[key] = module
        return module
