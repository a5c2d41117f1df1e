"""Fake tensors: tensors with metadata (and possibly symbolic sizes) but no data.

A `FakeTensor` is a wrapper subclass (`torch.Tensor._make_wrapper_subclass`) that reports the real
device and holds a meta tensor (`fake._meta`) with the same sizes, strides, storage offset and
dtype. Every ATen op on fakes runs the op's meta kernel on the held meta tensors and wraps the
results again, so shapes (symbolic ones too) propagate while no memory is touched. Autograd sits
above the Python dispatch key, so fakes that require grad work with `torch.autograd.grad`.

`FakeTensorMode` is the `TorchDispatchMode` that owns a `ShapeEnv` and converts real tensors
(`from_real`), keeping aliasing between inputs: two real tensors on one storage become fakes whose
meta tensors share one meta storage. Under the mode, factory functions (torch.empty, torch.ones,
...) make fakes too. Ops work on fakes also outside the mode (the fake knows its mode).

Handed on: FakeTensor, FakeTensorMode, and the errors users see (MissingMetaKernel,
DataDependentOp, RealTensorInput, UnsupportedFakeOp).
"""
from __future__ import annotations

import functools

from typing import Any, Callable, Sequence

import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln.errors import KilnError
from kiln.symbolic import arguments, data_dependent
from kiln.symbolic.dispatch_cache import FUNCTIONAL, VIEW, cache_key, cacheable, record, record_view, replay, replay_view
from kiln.symbolic.meta_rules import run_rule
from kiln.symbolic.shape_env import ShapeEnv, Source, TensorInput

aten = torch.ops.aten


class FakeTensorError(KilnError):
    """An op on fake tensors could not be run."""


class MissingMetaKernel(FakeTensorError, NotImplementedError):
    """The op has no meta kernel, so its output metadata cannot be computed without data."""

    def __init__(self, op, cause: BaseException):
        self.op = op
        super().__init__(
            f"{op} has no meta kernel, so kiln cannot run it on fake tensors "
            f"(cause: {str(cause).splitlines()[0] if str(cause) else type(cause).__name__}). "
            f"Move the call out of the compiled region, or register a meta kernel with "
            f"torch.library.register_fake.")


class DataDependentOp(FakeTensorError):
    """The op needs the tensor's values (item(), tolist(), bool(tensor), data-dependent shapes)."""

    def __init__(self, op, reason: str | None = None):
        self.op = op
        self.reason = reason        # why this call depends on values, where the op's rule says
        if reason is not None:
            super().__init__(f"{op}: {reason}. Capture breaks the graph here.")
            return
        super().__init__(
            f"{op} needs the values of a tensor, which a fake tensor does not have "
            f"(e.g. .item(), .tolist(), `if tensor:`). Capture breaks the graph here; in your own "
            f"code, compute the value outside the traced function.")


class RealTensorInput(FakeTensorError):
    """A real tensor reached an op under FakeTensorMode, which was not told to allow it."""

    def __init__(self, op, tensor: torch.Tensor):
        super().__init__(
            f"{op} got a real tensor (shape {tuple(tensor.shape)}, {tensor.dtype}) among fake "
            f"tensors. Convert it with fake_mode.from_real(t), or create the mode with "
            f"FakeTensorMode(allow_non_fake_inputs=True).")


class UnsupportedFakeOp(FakeTensorError, NotImplementedError):
    """An op kiln's fake tensors do not support yet (said plainly)."""


class FakeTensor(torch.Tensor):
    """A tensor with metadata but no data: wraps a meta tensor, reports the real device."""

    _meta: torch.Tensor
    fake_mode: "FakeTensorMode"
    constant: torch.Tensor | None

    @staticmethod
    def __new__(cls, meta: torch.Tensor, device: torch.device, mode: "FakeTensorMode",
                requires_grad: bool = False, constant: torch.Tensor | None = None):
        self = torch.Tensor._make_wrapper_subclass(
            cls, meta.size(), strides=meta.stride(), storage_offset=meta.storage_offset(),
            dtype=meta.dtype, layout=meta.layout, device=device, requires_grad=requires_grad)
        self._meta = meta
        self._symbolic = any(isinstance(v, torch.SymInt) for v in (*meta.shape, *meta.stride()))
        self.fake_mode = mode
        self.constant = constant
        self._key = None        # dispatch_cache.tensor_key
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        mode = _mode_of(args, kwargs)
        return mode.run(func, args, kwargs or {})

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"FakeTensor(size={tuple(self.shape)}, dtype={self.dtype}, "
                f"device={self.device}{grad})")


class _NonLeaf(torch.autograd.Function):
    """The fake of a real tensor that requires grad and is no leaf (the output of an op, a buffer a
    parameter was added into) is no leaf either: eager lets such a tensor be written in place
    (`x.add_(y)`), where a leaf that requires grad raises, and capture runs its ops on the fakes.
    It holds the same meta tensor (storage, sizes, strides) as the leaf it is made from; nothing
    differentiates through capture's fakes, so the backward only raises."""

    @staticmethod
    def forward(ctx, fake):
        return FakeTensor(fake._meta, fake.device, fake.fake_mode, constant=fake.constant)

    @staticmethod
    def backward(ctx, grad):
        raise FakeTensorError("kiln: a backward through the fake of a non-leaf input")


def _mode_of(args, kwargs) -> "FakeTensorMode":
    for x in args:               # nearly always a positional tensor: no flattening (`run` checks the rest)
        if isinstance(x, FakeTensor):
            return x.fake_mode
    flat, _ = tree_flatten((args, kwargs))
    for x in flat:
        if isinstance(x, FakeTensor):
            return x.fake_mode
    raise AssertionError("FakeTensor.__torch_dispatch__ without a FakeTensor argument")


def _same(t):
    return t


class FakeTensorMode(TorchDispatchMode):
    """Makes and runs fake tensors; owns the ShapeEnv their symbolic sizes live in."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """[Note: dispatch modes without dynamo] torch wraps a mode's `__torch_dispatch__` in
        `torch._disable_dynamo` unless this says False: a wrapper on every op, whose first call
        imports torch's dynamo package (1.5-5 s, most of a warm start on CPU). kiln never runs under
        dynamo, so its modes opt out (kiln/aot/trace.py's recorder too)."""
        return False

    def __init__(self, shape_env: ShapeEnv | None = None, allow_non_fake_inputs: bool = False):
        super().__init__()
        self.shape_env = shape_env if shape_env is not None else ShapeEnv()
        self.allow_non_fake_inputs = allow_non_fake_inputs
        # id(real tensor) -> (real, fake); the real tensor is kept alive so ids are not reused.
        self._fakes: dict[int, tuple[torch.Tensor, FakeTensor]] = {}
        # real storage -> the meta storage its fakes share (keeps aliasing between inputs).
        self._storages: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        self._unnamed = 0
        self._cache: dict[tuple, tuple] = {}       # see dispatch_cache.py
        self._hooks: list = []

    def __enter__(self):
        """Also hides the caller's saved-tensor hooks: autograd would hand them fake tensors to pack
        (`torch.autograd.graph.save_on_cpu` copies each one to host memory, a data-pointer hook
        fails on them). Autograd applies only the innermost hooks, so an identity pair hides them."""
        hooks = torch.autograd.graph.saved_tensors_hooks(_same, _same)
        hooks.__enter__()
        self._hooks.append(hooks)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._hooks.pop().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.run(func, args, kwargs or {})

    # --- real -> fake ---------------------------------------------------------------------
    def from_real(self, t: torch.Tensor, source: str | None = None,
                  dynamic_dims: Sequence[int] = (), constant: bool = False) -> FakeTensor:
        """A fake of `t`: same dtype, device, sizes, strides, storage offset, requires_grad.

        Dims in `dynamic_dims` get symbols (sources "<source>.size()[d]") unless their size is
        0 or 1. Two tensors on one real storage give fakes on one meta storage. The same real
        tensor always gives the same fake (the first call's source and dynamic dims win).
        """
        if isinstance(t, FakeTensor):
            if t.fake_mode is not self:
                raise FakeTensorError("from_real got a FakeTensor of another FakeTensorMode")
            return t
        if id(t) in self._fakes:
            return self._fakes[id(t)][1]
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise UnsupportedFakeOp(
                f"kiln's fake tensors support strided dense tensors, not {t.layout}"
                f"{' quantized' if t.is_quantized else ''}")
        if source is None:
            source = f"input{self._unnamed}"
            self._unnamed += 1
        env = self.shape_env
        dynamic = {d % t.dim() for d in dynamic_dims} if t.dim() else set()
        sizes = [env.create_symbol(n, Source(source, "size", d)) if d in dynamic
                 else sympy.Integer(n) for d, n in enumerate(t.shape)]
        strides = _stride_exprs(env, source, t, sizes)
        offset = sympy.Integer(t.storage_offset())
        env.inputs[source] = TensorInput(tuple(sizes), tuple(strides), offset)

        sym_sizes = [env.to_symint(e, n) for e, n in zip(sizes, t.shape)]
        sym_strides = [env.to_symint(e, n) for e, n in zip(strides, t.stride())]
        # Build the meta tensor with this (or any) dispatch mode out of the way.
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            storage = self._meta_storage(t, sizes, strides, sym_sizes, sym_strides)
            meta = torch.empty(0, dtype=t.dtype, device="meta")
            # TensorBase's own set_: a fresh meta tensor's metadata is no module tensor's write
            # ([Note: module tensors' metadata] counts torch.Tensor.set_ calls)
            torch._C.TensorBase.set_(meta, storage, t.storage_offset(), sym_sizes, sym_strides)
        fake = FakeTensor(meta, t.device, self, requires_grad=t.requires_grad,
                          constant=t.detach() if constant else None)
        if t.requires_grad and not t.is_leaf:
            with torch.enable_grad():      # under no_grad its output would not require grad
                fake = _NonLeaf.apply(fake)
        self._fakes[id(t)] = (t, fake)
        return fake

    def forget_reals(self) -> None:
        """Forget the real tensors and storages fakes were made from (a caller done making fakes
        from them: kiln's capture once a trace is compiled), so that the mode, which the graph's
        example values hold, does not keep them alive."""
        self._fakes.clear()
        self._storages.clear()

    def _meta_storage(self, t, sizes, strides, sym_sizes, sym_strides) -> torch.UntypedStorage:
        real = t.untyped_storage()
        key = real._cdata
        if key in self._storages:
            return self._storages[key][1]
        if t.numel() == 0 or all(e.is_Integer for e in (*sizes, *strides)):
            # (an empty input reaches no element: its size-0 dim would take a stride off the
            # extent below, `2*s5 - 2*s6` bytes for a (0, 6, 1) slice: fuzz seed 1000316)
            nbytes: Any = real.nbytes()
        else:
            # A dynamic input's storage is exactly as large as it needs to be, symbolically.
            extent = t.storage_offset() + 1
            for size, stride in zip(sym_sizes, sym_strides):
                extent = extent + (size - 1) * stride
            nbytes = extent * t.element_size()
        storage = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
        self._storages[key] = (real, storage)
        return storage

    # --- running ops ----------------------------------------------------------------------
    def run(self, func, args: tuple, kwargs: dict) -> Any:
        special = SPECIAL_OPS.get(func)
        if special is not None:
            return special(self, func, args, kwargs)
        conditional = data_dependent.CONDITIONAL.get(func)
        if conditional is not None and conditional[0](func, args, kwargs):
            return conditional[1](self, func, args, kwargs)
        flat, spec = arguments.flatten(args, kwargs)
        fakes: dict[int, FakeTensor] = {}
        devices: list[torch.device] = []
        for i, x in enumerate(flat):
            if isinstance(x, torch.Tensor):
                if not isinstance(x, FakeTensor):
                    if not self.allow_non_fake_inputs:
                        raise RealTensorInput(func, x)
                    x = self.from_real(x)
                elif x.fake_mode is not self:
                    raise FakeTensorError(f"{func} mixes fake tensors of two FakeTensorModes")
                fakes[id(x._meta)] = x
                devices.append((x.device, x.dim() == 0))
                flat[i] = x
        device = _output_device(func, args, kwargs, devices)
        kind = cacheable(func)
        base = flat[0]._meta if kind is VIEW and args and isinstance(flat[0], FakeTensor) else None
        key = cache_key(func, flat, spec, FakeTensor) if kind is FUNCTIONAL or base is not None else None
        if key is not None and key in self._cache:
            entry = self._cache[key]
            return _wrap_outputs(self, replay(entry) if base is None else replay_view(entry, base), {}, device)
        meta_args, meta_kwargs = arguments.unflatten([x._meta if isinstance(x, FakeTensor) else x
                                                      for x in flat], spec)
        if "device" in meta_kwargs and meta_kwargs["device"] is not None:
            meta_kwargs["device"] = torch.device("meta")
        try:
            symbolic = any(isinstance(x, _SYM_TYPES) or getattr(x, "_symbolic", False)
                           for x in flat)
            out = _run_meta(func, meta_args, meta_kwargs, symbolic)
        except FakeTensorError:
            raise
        except NotImplementedError as e:
            raise MissingMetaKernel(func, e) from e
        except RuntimeError as e:
            if "Meta" in str(e) and ("backend" in str(e) or "meta" in str(e).lower()):
                raise MissingMetaKernel(func, e) from e
            raise
        if key is not None:
            entry = record(out) if base is None else record_view(out, base)
            if entry is not None:
                self._cache[key] = entry
        out = _wrap_outputs(self, out, fakes, device)
        if func in METADATA_MUTATING:
            _follow_metadata(func, out)
        for name in _out_arguments(func):   # [Note: out= resizes]
            if isinstance(kwargs.get(name), FakeTensor):
                _follow_metadata(func, kwargs[name])
        return out


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _run_meta(func, args, kwargs, symbolic: bool) -> Any:
    """Run `func` on meta tensors.

    With symbolic sizes, through the Python dispatcher: it lets torch's Python meta kernels
    run, which accept SymInts where some C++ composite kernels would specialize them (guard_int)
    or refuse them. With static sizes, kiln's own rule where it has one ([Note: meta rules without
    torch's refs]), then the registered kernels, the Python dispatcher's if those refuse."""
    if not symbolic:
        out = run_rule(func, args, kwargs)
        if out is not NotImplemented:
            return out
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError):
            pass
    with torch._C._EnablePythonDispatcher():
        return func(*args, **kwargs)


def _wrap_outputs(mode: FakeTensorMode, out: Any, fakes: dict[int, FakeTensor],
                  device: torch.device) -> Any:
    def wrap(x):
        if not isinstance(x, torch.Tensor):
            return x
        # An in-place or out= op returns its argument: give back the same FakeTensor.
        same = fakes.get(id(x))
        return same if same is not None else FakeTensor(x, device, mode)
    if isinstance(out, torch.Tensor):    # most ops: one tensor, no pytree round trip
        return wrap(out)
    if type(out) in (tuple, list) and not any(isinstance(x, (tuple, list)) for x in out):
        return type(out)(map(wrap, out))
    flat, spec = tree_flatten(out)
    return tree_unflatten([wrap(x) for x in flat], spec)


def _follow_metadata(func, fake: FakeTensor) -> None:
    """After an in-place op changed the meta tensor's sizes/strides, make the wrapper match.

    as_strided_ on the wrapper itself (Python dispatch off) updates its metadata. It cannot grow
    past the wrapper's storage; a wrapper's storage holds no data, so a growing op (`resize_`, an
    out= op writing into `torch.empty(0)`) gives it a storage as large as the meta tensor needs:
    that of a new wrapper of the meta tensor's metadata, which allocates nothing either.
    """
    meta = fake._meta
    fake._key = None
    with torch._C._DisableTorchDispatch():
        try:
            aten.as_strided_.default(fake, meta.shape, meta.stride(), meta.storage_offset())
        except RuntimeError:
            larger = torch.Tensor._make_wrapper_subclass(
                FakeTensor, meta.shape, strides=meta.stride(), storage_offset=meta.storage_offset(),
                dtype=meta.dtype, device=fake.device).untyped_storage()
            aten.set_.source_Storage_storage_offset(fake, larger, meta.storage_offset(), meta.shape, meta.stride())


@functools.lru_cache(maxsize=None)
def _out_arguments(func) -> tuple[str, ...]:
    """[Note: out= resizes] The names of `func`'s out= arguments: an out= op resizes a tensor it
    writes whose size differs from the result's (`torch.sigmoid(x, out=torch.empty(0))`), inside
    the meta kernel, where the wrapper does not see it; the wrapper follows as after `resize_`."""
    schema = getattr(func, "_schema", None)
    return tuple(a.name for a in schema.arguments if a.is_out) if schema is not None else ()


def _output_device(func, args: tuple, kwargs: dict, devices: list[tuple[torch.device, bool]]) -> torch.device:
    """The device of an op's outputs: its `device` argument if given (by keyword or by position:
    `device_put(a, device)`), else the inputs' (0-dim CPU scalars mix with any device, as in eager)."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    position = _device_position(func)
    if position is not None and position < len(args) and args[position] is not None:
        return torch.device(args[position])
    for device, is_scalar in devices:
        if not (is_scalar and device.type == "cpu"):
            return device
    if devices:
        return devices[0][0]
    return torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")


_DEVICE_POSITIONS: dict[Any, int | None] = {}


def _device_position(func) -> int | None:
    """Where `func`'s schema takes a `device` argument, if it does (read once per op: each read of
    `_schema.arguments` builds its Python objects anew)."""
    if func not in _DEVICE_POSITIONS:
        schema = getattr(func, "_schema", None)
        names = [argument.name for argument in schema.arguments] if schema is not None else []
        _DEVICE_POSITIONS[func] = names.index("device") if "device" in names else None
    return _DEVICE_POSITIONS[func]


def _stride_exprs(env: ShapeEnv, source: str, t: torch.Tensor, sizes: list) -> list:
    """Strides as expressions of the sizes where the layout is dense (walking dims from the
    smallest stride); other strides of a dynamic tensor get their own symbols."""
    strides: list = [None] * t.dim()
    expected_expr, expected = sympy.Integer(1), 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d])):
        stride = t.stride(d)
        if stride == expected:
            strides[d] = expected_expr
        elif expected_expr.is_Integer:
            strides[d] = sympy.Integer(stride)
        else:
            strides[d] = env.create_symbol(stride, Source(source, "stride", d))
        if stride != 0:
            expected_expr, expected = strides[d] * sizes[d], stride * t.shape[d]
    return strides


def _metadata(read: Callable) -> Callable:
    # size/stride/numel/dim: answered from the meta tensor (same metadata as the wrapper), as
    # SymInts where symbolic, without dispatching again.
    return lambda mode, func, args, kwargs: read(args[0]._meta, *args[1:])


def _lift_fresh(mode, func, args, kwargs):
    # torch.tensor(data) under the mode: the data was made for real; keep it as a constant fake.
    (t,) = args
    return t if isinstance(t, FakeTensor) else mode.from_real(t, constant=True)


SPECIAL_OPS: dict[Any, Callable] = {
    **data_dependent.RULES,      # output sizes known only at run time: unbacked symbols
    aten.lift_fresh.default: _lift_fresh,
    aten.lift_fresh_copy.default: _lift_fresh,
    aten.size.default: _metadata(lambda t: list(t.shape)),
    aten.sym_size.default: _metadata(lambda t: list(t.shape)),
    aten.size.int: _metadata(lambda t, d: t.shape[d]),
    aten.sym_size.int: _metadata(lambda t, d: t.shape[d]),
    aten.stride.default: _metadata(lambda t: list(t.stride())),
    aten.sym_stride.default: _metadata(lambda t: list(t.stride())),
    aten.stride.int: _metadata(lambda t, d: t.stride(d)),
    aten.sym_stride.int: _metadata(lambda t, d: t.stride(d)),
    aten.numel.default: _metadata(lambda t: t.numel()),
    aten.sym_numel.default: _metadata(lambda t: t.numel()),
    aten.dim.default: _metadata(lambda t: t.dim()),
    aten.storage_offset.default: _metadata(lambda t: t.storage_offset()),
    aten.sym_storage_offset.default: _metadata(lambda t: t.storage_offset()),
}



def alias_rule(op, like) -> None:
    """Run `op` on fakes as `like` is run: an extern prim mirroring an ATen overload whose output
    sizes depend on data (kiln/prims/externs.py) gets that overload's rule (data_dependent.py)."""
    if like in SPECIAL_OPS:
        SPECIAL_OPS[op] = SPECIAL_OPS[like]


# In-place ops that change the sizes/strides of their argument: the wrapper must follow.
METADATA_MUTATING = {
    aten.resize_.default, aten.t_.default, aten.transpose_.default, aten.squeeze_.default,
    aten.squeeze_.dim, aten.unsqueeze_.default, aten.as_strided_.default,
    aten.swapdims_.default, aten.swapaxes_.default, aten.set_.source_Tensor,
    aten.set_.source_Storage, aten.set_.source_Storage_storage_offset,
}
