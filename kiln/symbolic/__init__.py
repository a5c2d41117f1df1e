"""Symbolic shapes and fake tensors: the layer under every stage of kiln.

Capture, ahead-of-time autograd and code generation all run programs on tensors that hold no
data (fake tensors) and whose sizes may be symbols. This package owns those symbols, what is
known about them, the guards raised when traced code branches on them, and the fake tensors.

Public API (stable; other stages build on it):

    env = ShapeEnv()
    env.create_symint(hint: int, source: str) -> torch.SymInt | int
        # an int input named `source`; hints 0 and 1 come back as plain ints (specialized),
        # every symbol is known to be >= 2
    env.guards -> list[Guard]
        # Guard(expr: sympy boolean, sources: tuple[Source, ...],
        #       user_location: "file:line" | None, kernel_location: "file:line" | None)
    env.guard_function(*names: str) -> Callable[..., bool]
        # one generated Python function over the real inputs named `names` (tensors for
        # from_real sources, ints for create_symint sources), in that order; True when a trace
        # made under these guards may be reused for them. Its source text is `fn.source`.
    env.format_guards() -> str
    env.user_location(where: str)            # context manager: attribute guards to "file:line"
    env.symbol_of(x: SymInt | int) -> sympy.Expr
    env.static_value(expr) -> value | None   # decided from the facts alone, no guard
    env.hint_of(expr) -> int | float | bool  # value for the traced inputs

    mode = FakeTensorMode(shape_env: ShapeEnv | None = None, allow_non_fake_inputs=False)
    with mode: ...                            # a TorchDispatchMode: factories make fakes
    mode.from_real(t, source: str | None = None, dynamic_dims: Sequence[int] = (),
                   constant: bool = False) -> FakeTensor
        # keeps dtype, device, sizes, strides, storage offset, requires_grad, and aliasing
        # (two views of one real storage share one fake storage); dims in dynamic_dims get
        # symbols sourced "<source>.size()[d]"
    FakeTensor: torch.Tensor wrapper subclass; `.fake_mode`, `._meta` (the meta tensor it
        holds), `.constant` (the real value for tensors made by torch.tensor(...) under the
        mode). Ops on fakes return fakes, under the mode or not; they work under autograd
        (requires_grad fakes, torch.autograd.grad) on CPU devices.
    Errors: MissingMetaKernel(op), DataDependentOp(op) for tolist()/bool(t)/a float item(),
        DataDependentGuard(expr) for a branch on an unbacked symbol, RealTensorInput,
        UnsupportedFakeOp -- all kiln.errors.KilnError subclasses.

    Unbacked symbols ([Note: unbacked sizes] in shape_env.py): ops whose output size depends on
    data (nonzero, masked_select, x[mask], unique, repeat_interleave(tensor), item() of an int
    tensor) give fresh symbols u0, u1, ... (`env.create_unbacked`, `env.unbacked`), with no hint
    and never guarded on; data_dependent.py holds their fake rules.

    SymNode (kiln.symbolic.node): a sympy expression plus its hint; what torch.SymInt,
    SymFloat and SymBool wrap. Users rarely touch it: `sym.node.expr` is the expression.

Modules: node.py (SymNode and its operation tables), data_dependent.py (fake rules of ops with
data-dependent output sizes), sympy_ops.py (integer sympy functions and
the printer to Python), shape_env.py (ShapeEnv, Source, Guard), guard_codegen.py (the guard
function), fake.py (FakeTensor, FakeTensorMode), dispatch_cache.py (output metadata of
functional ops, cached per mode), torch_protocol.py (what torch's own Python meta kernels call
on a ShapeEnv).

Tests and the op_db sweep live in tests/symbolic/ (sym_op_sweep.py writes
tests/symbolic/results/op_sweep.md; expected failures with reasons: sym_expected_failures.py).
"""
from kiln.symbolic import sympy_mod

sympy_mod.install()        # [Note: sympy's Mod of a product], before any index is built

from kiln.symbolic.fake import (DataDependentOp, FakeTensor, FakeTensorError, FakeTensorMode,
                                MissingMetaKernel, RealTensorInput, UnsupportedFakeOp)
from kiln.symbolic.node import SymNode
from kiln.symbolic.shape_env import (DataDependentGuard, Guard, GuardSourceError, ShapeEnv, Source,
                                     TensorInput)

__all__ = [
    "DataDependentGuard", "DataDependentOp", "FakeTensor", "FakeTensorError", "FakeTensorMode", "Guard",
    "GuardSourceError", "MissingMetaKernel", "RealTensorInput", "ShapeEnv", "Source", "SymNode",
    "TensorInput", "UnsupportedFakeOp",
]
