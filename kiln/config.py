"""The typed options of one `kiln.compile` call, checked once where the user passes them.

Passes receive a `CompileConfig`; nothing deeper reads global flags.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from kiln.errors import InvalidOption

TRITON_INTERPRET_ENV = "KILN_TRITON_INTERPRET"   # 1: the default of options["triton_interpret"]


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise InvalidOption(f"{name}={value!r}: set it to 1 (on) or 0 (off)")
    return value == "1"


MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclasses.dataclass(frozen=True)
class Options:
    """`options={...}` of `kiln.compile`. Each field is documented where it is used."""

    on_error: str = "raise"          # "raise": a compiler bug raises; "eager": warn and run eagerly
    cache_size_limit: int = 8        # compiled entries per code object before falling back to eager
    cudagraphs: bool = False         # capture the host program in a CUDA graph (reduce-overhead)
    max_autotune: bool = False       # autotune Triton kernels and templates
    debug_dir: str | None = None     # where repro scripts and reports go (default: ./kiln_debug)
    cpp_threads: int | None = None   # OpenMP threads for C++ kernels (default: torch's)
    numerics: str = "fast"           # "eager": eager's bits where kiln can give them ([Note: numerics])
    ddp_split: bool = True           # under DDP, one graph per gradient bucket (kiln/capture/buckets.py)
    # CPU tensors through the Triton printer under Triton's interpreter instead of C++: the GPU code
    # path on a machine without one ([Note: the Triton interpreter switch] in kiln/codegen/triton/interpret.py)
    triton_interpret: bool = dataclasses.field(default_factory=lambda: _env_flag(TRITON_INTERPRET_ENV))

    @staticmethod
    def from_user(mode: str | None, options: dict[str, Any] | None) -> "Options":
        if mode not in MODES:
            raise InvalidOption(f"mode={mode!r} is not a kiln mode; choose one of {MODES}")
        base: dict[str, Any] = {}
        if mode == "reduce-overhead":
            base["cudagraphs"] = True
        elif mode == "max-autotune":
            base.update(max_autotune=True, cudagraphs=True)
        elif mode == "max-autotune-no-cudagraphs":
            base["max_autotune"] = True
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise InvalidOption(f"options must be a dict, got {type(options).__name__}")
        fields = {f.name: f for f in dataclasses.fields(Options)}
        for key, value in options.items():
            if key not in fields:
                raise InvalidOption(
                    f"unknown option {key!r}; kiln's options are {sorted(fields)}")
            base[key] = value
        result = Options(**base)
        if result.on_error not in ("raise", "eager"):
            raise InvalidOption(f"options['on_error'] must be 'raise' or 'eager', got {result.on_error!r}")
        if result.numerics not in ("fast", "eager"):
            raise InvalidOption(f"options['numerics'] must be 'fast' or 'eager', got {result.numerics!r}")
        if not isinstance(result.ddp_split, bool):
            raise InvalidOption(f"options['ddp_split'] must be True or False, got {result.ddp_split!r}")
        if not isinstance(result.triton_interpret, bool):
            raise InvalidOption(f"options['triton_interpret'] must be True or False, got {result.triton_interpret!r}")
        if not isinstance(result.cache_size_limit, int) or result.cache_size_limit < 1:
            raise InvalidOption(f"options['cache_size_limit'] must be a positive int, got {result.cache_size_limit!r}")
        return result


@dataclasses.dataclass(frozen=True)
class CaptureConfig:
    """What graph capture needs to know: how to treat shapes and graph breaks."""

    dynamic: bool | None = None      # None: static first, a dim that changes becomes symbolic
    fullgraph: bool = False          # True: any graph break raises `Unsupported`
    cache_size_limit: int = 8
    ddp_split: bool = True           # split graphs at DDP's gradient buckets ([Note: why a captured graph is split for DDP])
    token_dims: bool = False         # [Note: token dims of a model-calling method] in kiln/api.py
