"""The backend registry: names to compilers with torch.compile's contract.

A backend is `backend(gm: torch.fx.GraphModule, example_inputs: list) -> callable`. Capture hands
each graph it extracts to the backend that `kiln.compile(backend=...)` resolved here. Any
torch.compile backend works as a kiln backend, and `kiln_backend` is registered as the
`torch_dynamo_backends` entry point, so torch.compile finds it under backend="kiln".
"""
from __future__ import annotations

import functools
import os
import time
import warnings
from typing import Any, Callable

import torch

from kiln import trace
from kiln.config import Options
from kiln.errors import CompileStageError, InvalidOption, KilnError

Backend = Callable[[torch.fx.GraphModule, list], Callable]

_REGISTRY: dict[str, Callable[..., Callable]] = {}


def register_backend(name: str, compiler: Callable[..., Callable] | None = None):
    """Register `compiler(gm, example_inputs, options)` under `name`; usable as a decorator."""
    if compiler is None:
        return functools.partial(register_backend, name)
    _REGISTRY[name] = compiler
    return compiler


def list_backends() -> list[str]:
    return sorted(_REGISTRY)


@register_backend("eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list, options: Options = Options()):
    """Run the captured graph as FX Python: tests capture alone."""
    return gm.forward


@register_backend("aot_eager")
def aot_eager(gm: torch.fx.GraphModule, example_inputs: list, options: Options = Options()):
    """Trace forward and backward ahead of time, then run the ATen graphs as FX Python."""
    from kiln.aot import aot_compile   # imported here so that `import kiln` stays light
    return aot_compile(gm, example_inputs, fw_compiler=_run_as_fx, bw_compiler=_run_as_fx)


@register_backend("aot_eager_decomp_partition")
def aot_eager_decomp_partition(gm: torch.fx.GraphModule, example_inputs: list, options: Options = Options()):
    """kiln's backend up to code generation: aot with every ATen op decomposed into prims and the
    min-cut partition, then the prim graphs run as FX Python (each prim's reference in eager torch),
    as torch's backend of that name tests decompositions and partition without kernels."""
    from kiln.pipeline import aot_to_prims
    return aot_to_prims(gm, example_inputs, options, _run_as_fx)


def _run_as_fx(gm: torch.fx.GraphModule, example_inputs: list):
    return gm.forward


@register_backend("kiln")
def kiln(gm: torch.fx.GraphModule, example_inputs: list, options: Options = Options()):
    """kiln's own backend: aot autograd, prims, and the fusing code generator."""
    from kiln import log
    with log.stage("import"):      # heavy: imported on first compile ([Note: compile stages])
        from kiln.pipeline import compile_graph_module
    return compile_graph_module(gm, example_inputs, options)


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                 options: dict | None = None):
    """The `torch_dynamo_backends` entry point: torch.compile with `backend="kiln"` hands its
    `mode=` and `options=` here (transformers' `CompileConfig(backend="kiln")`
    passes mode="reduce-overhead"); they mean what they mean to `kiln.compile`."""
    return kiln(gm, example_inputs, Options.from_user(mode, options))


def resolve(backend: str | Callable, options: Options) -> Backend:
    """Turn `kiln.compile(backend=...)` into one `(gm, example_inputs) -> callable`.

    Failures inside the compiler become a `CompileStageError` with a repro script, or, with
    `options={'on_error': 'eager'}`, a warning and the graph run eagerly.
    """
    if isinstance(backend, str):
        if backend not in _REGISTRY:
            raise InvalidOption(f"unknown backend {backend!r}; registered backends are {list_backends()}"
                                " (or pass a callable (gm, example_inputs) -> callable)")
        name, compiler = backend, functools.partial(_REGISTRY[backend], options=options)
    elif callable(backend):
        name, compiler = getattr(backend, "__name__", repr(backend)), backend
    else:
        raise InvalidOption(f"backend must be a name or a callable, got {type(backend).__name__}")

    def compile_with_fallback(gm: torch.fx.GraphModule, example_inputs: list):
        started = time.perf_counter()
        try:
            return compiler(gm, example_inputs)
        except KilnError as e:   # said for the user already (unsupported, not yet built, bad option)
            if options.on_error == "eager":
                warnings.warn(f"kiln backend {name!r} cannot compile this graph, running eagerly: {e}")
                return gm.forward
            raise
        except Exception as e:  # a compiler bug: name the stage, leave a repro
            if options.on_error == "eager":
                warnings.warn(f"kiln backend {name!r} failed, running eagerly: {type(e).__name__}: {e}")
                return gm.forward
            repro = write_repro(gm, example_inputs, name, options)
            raise CompileStageError(_stage_of(e), f"backend {name!r}: {type(e).__name__}: {e}", repro) from e
        finally:   # the event log tells the backend's seconds from capture's
            trace.emit("backend", name=name, seconds=round(time.perf_counter() - started, 6))

    compile_with_fallback.backend_name = name
    return compile_with_fallback


def _stage_of(error: BaseException) -> str:
    """The pipeline stage whose code raised `error`, read from the innermost kiln frame."""
    tb, stage = error.__traceback__, "backend"
    while tb is not None:
        parts = tb.tb_frame.f_code.co_filename.replace(os.sep, "/").split("/kiln/")
        if len(parts) > 1 and "/" in parts[-1]:
            stage = parts[-1].split("/")[0]
        tb = tb.tb_next
    return stage


def write_repro(gm: torch.fx.GraphModule, example_inputs: list, backend: str, options: Options) -> str | None:
    """Write a standalone folder (the graph via `GraphModule.to_folder`, and `repro.py`) that
    rebuilds the graph, makes inputs of the same metadata and calls the backend again."""
    try:
        root = options.debug_dir or os.path.join(os.getcwd(), "kiln_debug")
        folder = os.path.join(root, f"repro_{abs(hash(gm.code)) % 10**10}")
        gm.to_folder(folder, "ReproModule")
        inputs = []
        for x in example_inputs:
            if isinstance(x, torch.Tensor):
                make = "randn" if x.is_floating_point() or x.is_complex() else "zeros"
                inputs.append(f"torch.{make}({tuple(x.shape)}, dtype={x.dtype}, device='{x.device.type}')")
            else:
                inputs.append(repr(x))
        script = os.path.join(folder, "repro.py")
        with open(script, "w") as f:
            f.write("# kiln repro: the captured graph, and inputs of the same metadata\n")
            f.write("import os, sys, torch, kiln\nsys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))\n")
            f.write(f"from {os.path.basename(folder)} import ReproModule\n\n")
            f.write(f"inputs = [{', '.join(inputs)}]\n")
            f.write("gm = torch.fx.symbolic_trace(ReproModule())\n")
            f.write(f"compiled = kiln.backends.resolve({backend!r}, kiln.config.Options())(gm, inputs)\n")
            f.write("print(compiled(*inputs))\n")
        return script
    except Exception:  # a repro is a courtesy; never hide the real error behind its failure
        return None
