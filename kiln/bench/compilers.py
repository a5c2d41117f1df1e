"""The compilers a benchmark row can name, and the graph counting that wraps each one.

A compiler turns a model into the callable that is timed: `compile(model, counter) -> callable`.
Built in: `eager` (the model itself), `inductor` (torch.compile, the thing to beat), `kiln`
(kiln.compile's own backend), their `-reduce-overhead` and `-max-autotune` modes, and `kiln-aot_eager` (kiln's capture and AOT autograd, graphs run as
FX Python). Any `module:function` names a custom compiler taking the model (and the counter, if
it accepts two arguments); the harness tests use this for a deliberately wrong and a crashing
one. Graph counts come from wrapping the backend, so every captured graph is seen once
(for inductor, from torch._dynamo's counters, which bench alone may read).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable

import torch


@dataclasses.dataclass
class GraphCounter:
    """What a compiler reported while compiling: graphs handed to its backend, graph breaks."""

    graphs: int = 0
    breaks: int | None = None    # None: the compiler has no notion of breaks (eager)

    def wrap(self, backend: Callable) -> Callable:
        def counting_backend(gm, example_inputs, *rest):
            self.graphs += 1
            return backend(gm, example_inputs, *rest)
        counting_backend.__name__ = getattr(backend, "__name__", "backend")
        return counting_backend

    def finish(self, compiler: str) -> None:
        """Read the breaks after the first compiled call, the way each compiler counts them."""
        if compiler.startswith("inductor"):
            from torch._dynamo.utils import counters   # bench only: reading torch.compile's own counters
            self.graphs = counters["stats"]["unique_graphs"]
            self.breaks = sum(counters["graph_break"].values())
        elif compiler.startswith("kiln"):
            # Approximated from the graphs handed over (kiln.explain has the real break events);
            # no graph at all means the code ran eagerly: one break.
            self.breaks = max(self.graphs - 1, 0) if self.graphs else 1


@dataclasses.dataclass(frozen=True)
class Compiler:
    name: str
    compile: Callable[[torch.nn.Module, GraphCounter], Callable]
    compiles: bool = True        # False for eager: no compile time, no warm-start process
    description: str = ""


def _eager(model: torch.nn.Module, counter: GraphCounter) -> Callable:
    return model


def _inductor(mode: str | None = None) -> Callable[[torch.nn.Module, GraphCounter], Callable]:
    def compile_with_inductor(model: torch.nn.Module, counter: GraphCounter) -> Callable:
        # backend="inductor" by name, exactly as users call it (the named path sets Inductor's own
        # wrapper up); its graphs are read from dynamo's counters in GraphCounter.finish.
        return torch.compile(model, backend="inductor", mode=mode)
    return compile_with_inductor


def _kiln_backend(name: str, mode: str | None = None) -> Callable[[torch.nn.Module, GraphCounter], Callable]:
    def compile_with_kiln(model: torch.nn.Module, counter: GraphCounter) -> Callable:
        import kiln
        from kiln import backends
        from kiln.config import Options
        # resolve() keeps kiln's error handling (NotYetImplemented stays NotYetImplemented).
        backend = backends.resolve(name, Options.from_user(mode, None))
        return kiln.compile(model, backend=counter.wrap(backend))
    return compile_with_kiln


COMPILERS: dict[str, Compiler] = {c.name: c for c in (
    Compiler("eager", _eager, compiles=False, description="the model as written"),
    Compiler("inductor", _inductor(), description="torch.compile (TorchDynamo + Inductor)"),
    Compiler("kiln", _kiln_backend("kiln"), description="kiln.compile, kiln's own backend"),
    Compiler("inductor-reduce-overhead", _inductor("reduce-overhead"),
             description="torch.compile(mode='reduce-overhead'): Inductor with CUDA graphs"),
    Compiler("kiln-reduce-overhead", _kiln_backend("kiln", "reduce-overhead"),
             description="kiln.compile(mode='reduce-overhead'): kiln with CUDA graphs"),
    Compiler("inductor-max-autotune", _inductor("max-autotune"),
             description="torch.compile(mode='max-autotune'): Inductor's timed matmul templates, CUDA graphs"),
    Compiler("kiln-max-autotune", _kiln_backend("kiln", "max-autotune"),
             description="kiln.compile(mode='max-autotune'): kiln's timed matmul templates, CUDA graphs"),
    Compiler("kiln-aot_eager", _kiln_backend("aot_eager"), description="kiln capture + AOT autograd, run as FX"),
)}


def register_compiler(name: str, compile: Callable, compiles: bool = True, description: str = "") -> Compiler:
    """Add a compiler under `name` (in-process only; subprocess cases use `module:function`)."""
    COMPILERS[name] = Compiler(name, _accepting_counter(compile), compiles, description)
    return COMPILERS[name]


def get_compiler(name: str) -> Compiler:
    """A registered name, or `package.module:function` with function(model[, counter]) -> callable."""
    if name in COMPILERS:
        return COMPILERS[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"compiler {name!r}: cannot load {attr!r} from module {module_name!r} ({e})") from e
        return Compiler(name, _accepting_counter(function), description=f"custom: {name}")
    raise ValueError(f"unknown compiler {name!r}; built in: {sorted(COMPILERS)}, "
                     "or give 'package.module:function' taking the model and returning a callable")


def _accepting_counter(function: Callable) -> Callable[[torch.nn.Module, GraphCounter], Callable]:
    try:
        takes_counter = len(inspect.signature(function).parameters) >= 2
    except (TypeError, ValueError):
        takes_counter = False
    if takes_counter:
        return function
    return lambda model, counter: function(model)
