"""torch.distributed in captured code: which modules run natively, and process-group queries.

[Note: DDP and FSDP2 run as torch wrote them] `DistributedDataParallel.forward` talks to its C++
reducer (prepare_for_forward/backward, bucket rebuilds, buffer broadcasts) and FSDP2's forward
hooks all-gather and free parameters: none of it belongs in a graph, and the collectives must
stay torch's own. So a call of a DDP module, or of a module with hooks kiln does not capture
(FSDP2 registers its pre-forward hook with kwargs), breaks the graph with `wrap_callee` set: the
call runs natively through `frame.NativeModuleCall`, which points the forward that DDP calls
(the wrapped module's) or that the hooks surround (the module's own) at that forward captured in
its own frame. Under DDP the captured graphs are then cut at its gradient buckets (buckets.py);
under FSDP2 each block's computation is a graph between its all-gather and its reduce-scatter,
which FSDP2's hooks on the block's inputs and outputs drive in backward as in eager.

[Note: rank-dependent values] `dist.get_rank()` read in traced code is answered at capture time
and guarded (`GuardKind.PROCESS_GROUP`), so a graph specialized on rank 0 never runs on rank 1.
The guard is marked rank-dependent: each rank compiles its own graph, which `kiln.explain` lists
(`rank_dependent`: also reads of RANK, LOCAL_RANK, ... through `os.environ`, which capture reads
through a source for that reason) and a warning says once per line of a `dist` query, since ranks that run different graphs (or one rank that
recompiles alone) are how distributed programs come to hang or diverge. `get_world_size()`,
`is_initialized()` and friends are guarded the same way, not marked: every rank reads one value.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any, Callable

import torch

from kiln.capture import variables as V
from kiln.capture.callables import handles
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.sources import AttrSource


def _ddp_class():
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel


def module_run_natively(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose forward to capture when `module` itself runs natively (DDP: the module
    it wraps), else None."""
    ddp = _ddp_class()
    if ddp is not None and isinstance(module, ddp):
        return module.module
    return None


def _fsdp_class():
    # no module is sharded before the program imported FSDP (an import of about a second)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FSDPModule", None)   # FSDP2; torch 2.6 and later


def native_reason(module: torch.nn.Module) -> str | None:
    """Why a call of `module` is not inlined but run natively, or None."""
    if module_run_natively(module) is not None:
        return (f"{type(module).__name__}'s forward runs as torch wrote it (its reducer's hooks); kiln "
                "captures the forward of the module it wraps")
    fsdp = _fsdp_class()
    if fsdp is not None and isinstance(module, fsdp) and type(module).__call__ is torch.nn.Module.__call__:
        return (f"{type(module).__name__} is sharded by FSDP2, whose hooks all-gather its parameters and "
                "reduce-scatter their gradients: they run as torch wrote them, and kiln captures its forward "
                "on its own")
    return None


# -- process-group queries --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ProcessQuery:
    """A torch.distributed query answered at capture time: `fn(*args) == value`."""
    fn: Callable
    args: tuple
    value: Any
    rank_dependent: bool

    def call_text(self) -> str:
        args = ", ".join("group" if not isinstance(a, (int, str, type(None))) else repr(a) for a in self.args)
        module = getattr(self.fn, "__module__", None) or ""
        module = "torch.distributed" if module.startswith("torch.distributed") or not module else module
        return f"{module}.{self.fn.__name__}({args})"


def rank() -> int | None:
    """This process's rank when a default process group exists, else None."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


_WARNED: set = set()
# what torchrun and friends set per process; WORLD_SIZE and MASTER_* are every rank's alike
RANK_VARIABLES = frozenset(os.environ.encodekey(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK",
                                                              "NODE_RANK", "LOCAL_PROCESS_RANK"))


def rank_dependent(guard: Guard) -> bool:
    """Whether `guard` checks a value that differs between ranks: `dist.get_rank()` and friends,
    or an environment variable that holds a rank (read through `os.environ`)."""
    if guard.kind is GuardKind.PROCESS_GROUP:
        return guard.expected.rank_dependent
    source = guard.source
    if guard.kind not in (GuardKind.CONST, GuardKind.ABSENT) or source is None:
        return False
    key = guard.expected if guard.kind is GuardKind.ABSENT else getattr(source, "key", None)
    if guard.kind is GuardKind.CONST:
        source = getattr(source, "base", None)
    return (key in RANK_VARIABLES and isinstance(source, AttrSource) and source.attr == "_data"
            and isinstance(source.base, AttrSource) and source.base.attr == "environ")


def _query(fn: Callable, rank_dependent: bool):
    def handle(tx, args, kwargs):
        from kiln.capture.constants import is_python_constant, python_value
        if not all(is_python_constant(a) for a in (*args, *kwargs.values())):
            raise tx.unsupported(f"torch.distributed.{fn.__name__} on values known only at run time")
        real = tuple(python_value(a) for a in args)
        real_kwargs = {k: python_value(v) for k, v in kwargs.items()}
        if real_kwargs:   # one spelling for the guard: keywords become positions
            import inspect
            bound = inspect.signature(fn).bind(*real, **real_kwargs)
            real = tuple(bound.args)
        try:
            value = fn(*real)
        except Exception as e:   # no process group yet: the program raises, as it would eagerly,
            initialized = torch.distributed.is_initialized()   # and does so until there is one
            tx.out.guard(Guard(GuardKind.PROCESS_GROUP, None,
                               ProcessQuery(torch.distributed.is_initialized, (), initialized, False)))
            tx.raise_(type(e), str(e))
        query = ProcessQuery(fn, real, value, rank_dependent)
        where = tx.where()
        tx.out.guard(Guard(GuardKind.PROCESS_GROUP, None, query, where=where))
        if rank_dependent and world_size() > 1 and where not in _WARNED:
            _WARNED.add(where)
            warnings.warn(f"kiln: {where or 'traced code'} reads {query.call_text()} (= {value!r}): the graph is "
                          "specialized on this process's rank, so each rank compiles a different graph; keep "
                          "collectives and parameter use the same on every rank", stacklevel=2)
        return V.Constant(value)
    return handle


if torch.distributed.is_available():
    _dist = torch.distributed
    for _fn, _ranked in ((_dist.get_rank, True), (getattr(_dist, "get_node_local_rank", None), True),
                         (_dist.get_world_size, False), (_dist.is_initialized, False),
                         (_dist.is_available, False), (_dist.get_backend, False)):
        if _fn is not None:
            handles(_fn)(_query(_fn, _ranked))


# [Note: process state a trace's example run sets] A torch call made for its effect on the
# process (`torch._C._set_sdp_use_flash(False)`, which `sdpa_kernel` enters with) runs on the
# example values while capturing, and its node replays it when the graph runs. A trace that then
# stops (a graph break, a refusal, a generator left paused) would leave the program's process in
# the state its unfinished region set, and the eager run that follows would start there: each
# (getter, setter) below is read before the trace and put back after it, as grad mode is
# (`convert.trace_frame`). What the trace left changed is set again by the entry after its graph
# ran (`convert.build_entry`): a backend that compiles the graph whole need not keep a node whose
# only output is its effect. A getter read where the trace has not changed the state is guarded,
# as a process-group query is: the graph holds the value it read.
def _state_pairs(*names):
    return [(getattr(torch._C, get), getattr(torch._C, set_)) for get, set_ in names
            if hasattr(torch._C, get) and hasattr(torch._C, set_)]


def _set_deterministic(enabled: bool):
    torch._C._set_deterministic_algorithms(enabled, warn_only=torch._C._get_deterministic_algorithms_warn_only())


def _set_deterministic_warn_only(warn_only: bool):
    torch._C._set_deterministic_algorithms(torch._C._get_deterministic_algorithms(), warn_only=warn_only)


PROCESS_STATE = _state_pairs(
    *[(f"_get_{name}_sdp_enabled", f"_set_sdp_use_{name}")
      for name in ("flash", "mem_efficient", "math", "cudnn", "overrideable", "fa3")],
    ("_get_sdp_priority_order", "_set_sdp_priority_order"),
    ("_get_math_sdp_allow_fp16_bf16_reduction", "_set_math_sdp_allow_fp16_bf16_reduction"),
) + [
    # torch.use_deterministic_algorithms(mode, warn_only=...) sets both at once: each is put back alone
    (torch._C._get_deterministic_algorithms, _set_deterministic),
    (torch._C._get_deterministic_algorithms_warn_only, _set_deterministic_warn_only),
    (torch.get_default_dtype, torch.set_default_dtype),
]


def _state_read(getter: Callable):
    def handle(tx, args, kwargs):
        if args or kwargs:
            raise tx.unsupported(f"{getter.__name__} with arguments")
        value = getter()
        if value == tx.out.__dict__.get("process_state_before", {}).get(getter, value):
            tx.out.guard(Guard(GuardKind.PROCESS_GROUP, None, ProcessQuery(getter, (), value, False),
                               where=tx.where()))
        if isinstance(value, list):
            return V.ListVar([V.Constant(v) for v in value])
        return V.Constant(value)
    return handle


for _getter, _ in PROCESS_STATE[:-1]:   # the default dtype stays folded (torch_calls.FOLDED)
    handles(_getter)(_state_read(_getter))


# -- the exception being handled (sys.exc_info) -------------------------------------------------------
def handled_exception(tx):
    """The exception the nearest traced frame is handling (callers included, as CPython's exception
    state is per thread), or None where none is; an exception the compiled function's own caller
    handles is beyond the trace: refused. With none anywhere, the entry is guarded on the caller
    handling none, so it never serves a call made inside an `except` block."""
    handling = tx
    while handling is not None and not handling.exc_info:
        handling = handling.parent
    if handling is not None:
        return handling.exc_info[-1]
    if sys.exc_info() != (None, None, None):
        raise tx.unsupported("reading the exception the compiled function's caller is handling")
    tx.out.guard(Guard(GuardKind.PROCESS_GROUP, None, ProcessQuery(sys.exc_info, (), (None, None, None), False)))
    return None


@handles(sys.exc_info)
def _exc_info(tx, args, kwargs):
    exc = handled_exception(tx)
    if exc is None:
        return V.TupleVar([V.Constant(None)] * 3)
    raise tx.unsupported("sys.exc_info() while an exception is handled (kiln keeps no tracebacks)")


if hasattr(sys, "exception"):   # Python 3.11
    @handles(sys.exception)
    def _exception(tx, args, kwargs):
        exc = handled_exception(tx)
        return V.Constant(None) if exc is None else exc
