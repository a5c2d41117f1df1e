"""Example values: the tensor metadata capture propagates while it interprets, without real compute.

Each graph node carries an example value (`node.meta['example_value']`) so that capture can answer
`x.shape`, `x.dtype`, `x.device` and pick the next op's behaviour. Examples are kiln.symbolic's
fake tensors (meta tensors that report the real device), made and run under one FakeTensorMode per
capture, whose ShapeEnv holds the symbols of dynamic dims and the guards raised when traced code
branches on them. Nothing runs for real, nothing real is allocated or mutated.
"""
from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import torch
import torch.utils._python_dispatch

from kiln.symbolic import FakeTensorMode, ShapeEnv
from kiln.symbolic.rules import SYMBOLIC_RULES


class Examples:
    def __init__(self):
        self.shape_env = ShapeEnv()
        self.mode = FakeTensorMode(self.shape_env)

    def from_real(self, t: torch.Tensor, name: str, dynamic_dims: Sequence[int] = ()) -> torch.Tensor:
        """A fake of `t` named `name` in the ShapeEnv; `dynamic_dims` get symbols."""
        return self.mode.from_real(t, source=name, dynamic_dims=tuple(dynamic_dims))

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """Run `fn` on example values (factories under the mode make fakes too)."""
        if isinstance(fn, types.BuiltinFunctionType):     # the rules' keys; any other callable may not hash
            fn = SYMBOLIC_RULES.get(fn, fn)
        with self.mode:
            if self.watching_random:
                with _RandomOpWatch(self):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)

    # Inside a region that restores the RNG state when it ends (`freeze_rng_state`), capture must
    # know whether the region drew random numbers: ops tagged nondeterministic_seeded are counted.
    watching_random: int = 0
    random_ops: int = 0


class _RandomOpWatch(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, examples: Examples):
        super().__init__()
        self.examples = examples

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.examples.random_ops += 1
        return func(*args, **(kwargs or {}))


def device_of(example: torch.Tensor) -> torch.device:
    return example.device
