"""kiln: a compiler for PyTorch programs.

    fast = kiln.compile(model)      # same results as model, faster

The pipeline, one package per stage: capture -> aot -> prims -> codegen -> runtime, with
symbolic under all of them; `kiln.pipeline` composes them. See README.md and DESIGN.md.
"""
from kiln.api import OptimizedModule, compile, explain, reset
from kiln.backends import list_backends, register_backend

__version__ = "0.1.0"
__all__ = ["compile", "reset", "explain", "OptimizedModule", "list_backends", "register_backend"]
