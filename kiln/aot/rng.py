"""Functional random numbers: every random op becomes a pure function of (seed, offset).

[Note: functional RNG] A compiled graph may run a random op twice: the partitioner recomputes a
cheap dropout mask in the backward instead of saving it, and a fused kernel may evaluate it in a
different order than eager. Both need the op to give the same bits each time it is evaluated, so
the tracer replaces each random op by `kiln::philox_uniform(size, seed, offset)` or
`kiln::philox_normal(...)`: `seed` is a graph input drawn once per call from torch's default
generator (so `torch.manual_seed` makes runs reproducible), `offset` numbers the random ops of one
graph. The reference kernels below seed a private `torch.Generator` from (seed, offset); a code
generator may lower the same ops to Philox in Triton or C++, which then must be used for both the
forward and the backward graph of one compiled function (it gives other bits than these kernels).
The masks are therefore not eager's masks: only their distribution is, as with torch.compile.

`RANDOM_REPLACEMENTS` maps ATen random ops to functions over these ops; the tracer calls them
under its dispatch mode so their pieces are recorded. A random op missing from the table is
recorded as is and the partitioner never recomputes it (see `schema.OpEffects.random`).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

aten = torch.ops.aten
_MIX = 0x9E3779B97F4A7C15


def _generator(seed: torch.Tensor, offset: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((int(seed.item()) * _MIX + offset * 0xBF58476D1CE4E5B9) % (2**63 - 1))
    return g


# [Note: kiln's random ops as a Library] Defined as kiln's prims are (`kiln.prims.prim`): a schema,
# the eager kernel for every device, a meta kernel (kiln's fake tensors run meta kernels, and hand
# them `device="meta"`). `torch.library.custom_op` did the same and also looked up the decorated
# function's source, which walks every loaded module's path: 35-45 ms of every process that
# imports kiln.aot, a warm start's included (`kiln.pipeline.warm_start`).
_LIB = torch.library.Library("kiln", "DEF")


def _define(name: str, kernel: Callable) -> None:
    _LIB.define(f"{name}(SymInt[] size, Tensor seed, int offset, ScalarType dtype, *, Device device) -> Tensor")
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    _LIB.impl(name, _meta, "Meta")


def _meta(size, seed, offset, dtype, *, device):
    return torch.empty(size, dtype=dtype, device="meta")


def philox_uniform(size: Sequence[int], seed: torch.Tensor, offset: int, dtype: torch.dtype, *,
                   device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) numbers, a pure function of (size, seed, offset)."""
    return torch.rand(size, generator=_generator(seed, offset, device), dtype=dtype, device=device)


def philox_normal(size: Sequence[int], seed: torch.Tensor, offset: int, dtype: torch.dtype, *,
                  device: torch.device) -> torch.Tensor:
    """Standard normal numbers, a pure function of (size, seed, offset)."""
    return torch.randn(size, generator=_generator(seed, offset, device), dtype=dtype, device=device)


# `device` is keyword-only so that fake-tensor modes see it as `device=` and report it.
_define("philox_uniform", philox_uniform)
_define("philox_normal", philox_normal)


class RngStream:
    """Hands out offsets for the random ops of one trace; `seed` is the trace's seed tensor."""

    def __init__(self, seed_factory: Callable[[], torch.Tensor]):
        self._seed_factory = seed_factory
        self._seed: torch.Tensor | None = None
        self.count = 0

    @property
    def used(self) -> bool:
        return self._seed is not None

    def uniform(self, size, dtype, device) -> torch.Tensor:
        return self._draw(torch.ops.kiln.philox_uniform, size, dtype, device)

    def normal(self, size, dtype, device) -> torch.Tensor:
        return self._draw(torch.ops.kiln.philox_normal, size, dtype, device)

    def _draw(self, op, size, dtype, device):
        if self._seed is None:
            self._seed = self._seed_factory()
        self.count += 1
        return op(list(size), self._seed, self.count, dtype, device=torch.device(device))


def _float(dtype):
    return dtype if dtype is not None and dtype.is_floating_point else torch.get_default_dtype()


def _bernoulli_(rng, self, p=0.5, generator=None):
    u = rng.uniform(self.shape, _float(self.dtype), self.device)
    return self.copy_(u < p)


def _bernoulli(rng, self, generator=None):
    return (rng.uniform(self.shape, self.dtype, self.device) < self).to(self.dtype)


def _bernoulli_p(rng, self, p, generator=None):
    return (rng.uniform(self.shape, _float(self.dtype), self.device) < p).to(self.dtype)


def _native_dropout(rng, input, p, train):
    if not train or p == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p == 1:
        return input * 0, torch.zeros_like(input, dtype=torch.bool)
    keep = rng.uniform(input.shape, _float(input.dtype), input.device) >= p
    return input * keep * (1.0 / (1.0 - p)), keep


def _factory(draw):
    def make(rng, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
        return draw(rng, size, _float(dtype), device or torch.device("cpu"))
    return make


def _like(draw):
    def make(rng, self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return draw(rng, self.shape, dtype or self.dtype, device or self.device)
    return make


def _uniform_(rng, self, from_=0.0, to=1.0, *, generator=None):
    u = rng.uniform(self.shape, self.dtype, self.device)
    return self.copy_(u * (to - from_) + from_)


def _normal_(rng, self, mean=0.0, std=1.0, *, generator=None):
    z = rng.normal(self.shape, self.dtype, self.device)
    return self.copy_(z * std + mean)


def _uniform_draw(rng, size, dtype, device):
    return rng.uniform(size, dtype, device)


def _normal_draw(rng, size, dtype, device):
    return rng.normal(size, dtype, device)


RANDOM_REPLACEMENTS: dict = {
    aten.bernoulli_.float: _bernoulli_,
    aten.bernoulli_.Tensor: _bernoulli_,
    aten.bernoulli.default: _bernoulli,
    aten.bernoulli.p: _bernoulli_p,
    aten.native_dropout.default: _native_dropout,
    aten.rand.default: _factory(_uniform_draw),
    aten.randn.default: _factory(_normal_draw),
    aten.rand_like.default: _like(_uniform_draw),
    aten.randn_like.default: _like(_normal_draw),
    aten.uniform_.default: _uniform_,
    aten.normal_.default: _normal_,
}


def new_seed() -> torch.Tensor:
    """A fresh seed for one call of a compiled graph, drawn from torch's default generator."""
    return torch.randint(0, 2**62, (), dtype=torch.int64)
