"""kiln's own meta rules: the outputs of common ATen ops on fake tensors of static sizes, from metadata.

[Note: meta rules without torch's refs] torch registers Python meta kernels for most ATen ops
(`torch._meta_registrations`); those of the elementwise ops, the norms, the reductions, addmm, cat and
arange are its Python refs behind torch's dynamo-disabling wrapper, whose first call imports TorchDynamo (1.0-1.2 s on
the CI machine). A warm start runs capture and no other stage of the compiler, so for a model whose
own imports leave dynamo out (kiln's zoo, a user's plain module) that import was most of it. For the
ops a forward pass is made of, the rules below give sizes, strides and dtype as torch's meta kernels
give them, computed from the operands' metadata; `kiln.symbolic.fake` asks them first when no size is
a symbol. A rule covers only the calls it was checked on: anything else (symbolic sizes, complex
dtypes, an `alpha`, a layout or argument torch may treat otherwise, any call torch would refuse)
returns NotImplemented and torch's own meta kernel runs, so its errors stay the user's errors.
Each rule is compared with torch's meta kernel over layouts, dtypes and broadcasts in
tests/symbolic/test_meta_rules.py; a new rule needs its rows there.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.symbolic.strides import contiguous_strides, dense, pointwise_strides

aten = torch.ops.aten
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _tensor(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == "meta" and x.layout == torch.strided
            and not x.dtype.is_complex and not x.is_quantized)


def _scalar(x) -> bool:
    return type(x) in (bool, int, float)


def _floating(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def _empty(shape, strides, dtype) -> torch.Tensor:
    return torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype, device="meta")


def _broadcast(*shapes) -> list | None:
    """The broadcast of `shapes`, or None where eager would refuse them."""
    out: list = []
    for shape in shapes:
        shape = list(shape)
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        shape = [1] * (len(out) - len(shape)) + shape
        for i, n in enumerate(shape):
            if n != 1:
                if out[i] not in (1, n):
                    return None
                out[i] = n
    return out


# ------------------------------------------------------------------------------ pointwise
DEFAULT, INT_TO_FLOAT, ALWAYS_BOOL = "default", "int_to_float", "always_bool"


def _pointwise_out(promotion: str, *operands) -> Any:
    """A pointwise op's output over `operands` (tensors first; scalars as eager promotes them)."""
    tensors = [x for x in operands if isinstance(x, torch.Tensor)]
    if not tensors or not all(_tensor(x) or _scalar(x) for x in operands):
        return NotImplemented
    shape = _broadcast(*(t.shape for t in tensors))
    if shape is None:
        return NotImplemented
    dtype = operands[0].dtype if len(operands) == 1 else torch.result_type(*operands)
    if promotion == INT_TO_FLOAT and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    elif promotion == ALWAYS_BOOL:
        dtype = torch.bool
    return _empty(shape, pointwise_strides([t.expand(shape) for t in tensors]), dtype)


def _binary(promotion: str, refuse_bool: bool = False) -> Callable:
    def rule(a, b, *, alpha=1):
        if alpha != 1 or isinstance(alpha, bool):
            return NotImplemented       # eager checks alpha against the dtypes: torch's kernel says how
        if refuse_bool and any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in (a, b)):
            return NotImplemented       # bool - bool is refused by eager
        return _pointwise_out(promotion, a, b)
    return rule


def _unary(accepts: Callable[[torch.dtype], bool]) -> Callable:
    def rule(a):
        if not _tensor(a) or not accepts(a.dtype):
            return NotImplemented
        return _pointwise_out(DEFAULT, a)
    return rule


def _float_unary(a):
    """sin, cos, rsqrt, ...: integers and bool compute in the default float dtype."""
    if not _tensor(a):
        return NotImplemented
    return _pointwise_out(INT_TO_FLOAT, a)


def _pow_scalar(a, exponent):
    if not _tensor(a) or not _scalar(exponent) or isinstance(exponent, bool):
        return NotImplemented
    if not _floating(a) and (isinstance(exponent, int) and exponent < 0 or a.dtype == torch.bool):
        return NotImplemented           # integers to negative powers, bool: torch's checks decide
    return _pointwise_out(DEFAULT, a, exponent)


def _gelu(a, approximate: str = "none"):
    if not _tensor(a) or not _floating(a) or approximate not in ("none", "tanh"):
        return NotImplemented
    return _pointwise_out(DEFAULT, a)


def _masked_fill(a, mask, value):
    """torch's meta gives a contiguous result whatever the layouts (checked against it)."""
    if not (_tensor(a) and _tensor(mask) and mask.dtype == torch.bool and _scalar(value)):
        return NotImplemented
    if _broadcast(a.shape, mask.shape) != list(a.shape):
        return NotImplemented
    if isinstance(value, float) and not _floating(a):
        return NotImplemented
    return _empty(a.shape, contiguous_strides(a.shape), a.dtype)


def _channels_last_like(t: torch.Tensor) -> bool:
    """Eager's `suggest_memory_format` test of a 4-d (5-d) tensor's strides: channels, then the
    spatial dims from the last, then the batch dim, each stride at least the span of the previous."""
    order = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}.get(t.ndim)
    if order is None or t.stride(1) == 0:
        return False
    least = 0
    for d in order:
        if t.shape[d] == 0 or t.stride(d) < least or (d == 0 and least == t.stride(1)):
            return False
        least = t.stride(d) * t.shape[d]
    return True


def _channels_last_strides(shape) -> list:
    """`torch.empty(shape, memory_format=torch.channels_last(_3d))`'s strides."""
    strides = [0] * len(shape)
    strides[1], step = 1, shape[1]
    for d in range(len(shape) - 1, 1, -1):
        strides[d], step = step, step * shape[d]
    strides[0] = step
    return strides


def _cat(tensors, dim: int = 0):
    """Inputs of one dtype and rank: the result is contiguous, or channels-last where every input
    is laid out so (4-d and 5-d); legacy empty (0,) inputs and promotion are left to torch."""
    if not tensors or not all(_tensor(t) and t.numel() > 0 for t in tensors):
        return NotImplemented
    first = tensors[0]
    if first.ndim == 0 or any(t.ndim != first.ndim or t.dtype != first.dtype for t in tensors):
        return NotImplemented
    d = dim % first.ndim
    if any(list(t.shape[:d]) + list(t.shape[d + 1:]) != list(first.shape[:d]) + list(first.shape[d + 1:])
           for t in tensors):
        return NotImplemented
    shape = list(first.shape)
    shape[d] = sum(t.shape[d] for t in tensors)
    if all(_channels_last_like(t) for t in tensors):
        return _empty(shape, _channels_last_strides(shape), first.dtype)
    return _empty(shape, contiguous_strides(shape), first.dtype)


def _arange(*bounds, dtype=None, layout=None, device=None, pin_memory=None):
    """Integer bounds only, where eager's length (computed in double) is exact."""
    if len(bounds) == 1:
        start, end, step = 0, bounds[0], 1
    elif len(bounds) == 2:
        (start, end), step = bounds, 1
    else:
        start, end, step = bounds
    if not all(type(x) is int and abs(x) < 2 ** 52 for x in (start, end, step)) or step == 0 or (end - start) * step < 0:
        return NotImplemented
    if layout not in (None, torch.strided) or pin_memory or dtype in (torch.bool, torch.complex64, torch.complex128):
        return NotImplemented
    length = max(0, -((start - end) // step))           # ceil((end - start) / step)
    return _empty([length], [1], dtype or torch.int64)


# ------------------------------------------------------------------------------ reductions, matmul, norms
def _mean_dim(a, dim, keepdim: bool = False, *, dtype=None):
    if not _tensor(a) or not _floating(a) or dtype is not None or a.ndim == 0 or dim is None:
        return NotImplemented
    dims = [d % a.ndim for d in dim] if isinstance(dim, (list, tuple)) and dim else None
    if dims is None or len(set(dims)) != len(dims) or any(a.shape[d] == 0 for d in dims):
        return NotImplemented
    shape = [1 if d in dims else n for d, n in enumerate(a.shape) if keepdim or d not in dims]
    return _empty(shape, contiguous_strides(shape), a.dtype)


def _addmm(bias, m1, m2, *, beta=1, alpha=1):
    if not all(_tensor(t) and _floating(t) and t.dtype == m1.dtype for t in (bias, m1, m2)):
        return NotImplemented
    if m1.ndim != 2 or m2.ndim != 2 or m1.shape[1] != m2.shape[0] or not (_scalar(beta) and _scalar(alpha)):
        return NotImplemented
    shape = [m1.shape[0], m2.shape[1]]
    if bias.ndim > 2 or _broadcast(bias.shape, shape) != shape:
        return NotImplemented
    return _empty(shape, contiguous_strides(shape), m1.dtype)


def _statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _native_layer_norm(a, normalized_shape, weight, bias, eps):
    """torch's meta gives a contiguous output whatever the input's layout (checked against it)."""
    k = len(normalized_shape)
    if not _tensor(a) or not _floating(a) or k == 0 or k > a.ndim or list(a.shape[a.ndim - k:]) != list(normalized_shape):
        return NotImplemented
    for t in (weight, bias):
        if t is not None and not (_tensor(t) and t.dtype == a.dtype and list(t.shape) == list(normalized_shape)):
            return NotImplemented
    stats = list(a.shape[:a.ndim - k]) + [1] * k
    dtype = _statistics_dtype(a.dtype)
    return (_empty(a.shape, contiguous_strides(a.shape), a.dtype),
            _empty(stats, contiguous_strides(stats), dtype), _empty(stats, contiguous_strides(stats), dtype))


def _native_batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps):
    """The output follows a dense input's layout (channels-last stays channels-last); the saved
    statistics are one value per channel, also in inference."""
    if not _tensor(a) or not _floating(a) or a.ndim < 2 or not dense(a) or a.numel() == 0:
        return NotImplemented
    channels = a.shape[1]
    for t in (weight, bias, running_mean, running_var):
        if t is not None and not (_tensor(t) and _floating(t) and list(t.shape) == [channels]):
            return NotImplemented
    if not training and (running_mean is None or running_var is None):
        return NotImplemented
    dtype = _statistics_dtype(a.dtype)
    return (_empty(a.shape, pointwise_strides([a]), a.dtype),
            _empty([channels], [1], dtype), _empty([channels], [1], dtype))


def _not_bool(dtype: torch.dtype) -> bool:
    return dtype != torch.bool


def _integral(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point


META_RULES: dict[Any, Callable] = {
    aten.add.Tensor: _binary(DEFAULT),
    aten.sub.Tensor: _binary(DEFAULT, refuse_bool=True),
    aten.mul.Tensor: _binary(DEFAULT),
    aten.div.Tensor: _binary(INT_TO_FLOAT),
    **{getattr(aten, name).Tensor: _binary(ALWAYS_BOOL) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{getattr(aten, name).Scalar: _binary(ALWAYS_BOOL) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    aten.relu.default: _unary(_not_bool),
    aten.bitwise_not.default: _unary(_integral),
    **{getattr(aten, name).default: _float_unary
       for name in ("sin", "cos", "rsqrt", "sqrt", "exp", "log", "tanh", "sigmoid")},
    aten.neg.default: _unary(_not_bool),
    aten.pow.Tensor_Scalar: _pow_scalar,
    aten.gelu.default: _gelu,
    aten.masked_fill.Scalar: _masked_fill,
    aten.cat.default: _cat,
    aten.arange.default: _arange,
    aten.arange.start: _arange,
    aten.arange.start_step: _arange,
    aten.mean.dim: _mean_dim,
    aten.addmm.default: _addmm,
    aten.native_layer_norm.default: _native_layer_norm,
    aten.native_batch_norm.default: _native_batch_norm,
}


def _column_major_strides(shape) -> list:
    """Contiguous batches of column-major matrices, as LAPACK-backed kernels return them (torch's
    `make_contiguous_strides_for(shape, row_major=False)`, empty sizes counted as 1)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    if len(shape) >= 2:
        strides[-2:] = [1, max(shape[-2], 1)]
    return strides


def _geqrf(a):
    if not (_tensor(a) and _floating(a) and a.dim() >= 2):
        return NotImplemented
    *batch, m, n = a.shape
    tau = (*batch, min(m, n))
    return (_empty(a.shape, _column_major_strides(a.shape), a.dtype),
            _empty(tau, contiguous_strides(tau), a.dtype))


def _histogram(a, bins=100, *, range=None, weight=None, density=False):
    if not (_tensor(a) and _floating(a) and type(bins) is int and bins > 0):
        return NotImplemented
    return _empty((bins,), (1,), a.dtype), _empty((bins + 1,), (1,), a.dtype)


def _histogram_bins(a, bins, *, weight=None, density=False):
    if not (_tensor(a) and _floating(a) and _tensor(bins) and bins.dim() == 1 and bins.dtype == a.dtype
            and bins.numel() >= 1):
        return NotImplemented
    return _empty((bins.numel() - 1,), (1,), a.dtype), _empty((bins.numel(),), (1,), a.dtype)


# [Note: ops torch gives no meta kernel] A few ATen ops run on CPU and CUDA kernels only: a fake
# tensor cannot run them, so a graph holding one could not be captured. kiln's rule gives their
# output metadata as the eager kernel returns it (compared with eager's outputs in
# tests/symbolic/test_meta_rules.py, as there is no meta kernel to compare with); the op itself then
# runs as an extern (kiln/prims/externs.py).
NO_TORCH_META: dict[Any, Callable] = {
    aten.geqrf.default: _geqrf,
    aten.histogram.bin_ct: _histogram,
    aten.histogram.bins_tensor: _histogram_bins,
}


def run_rule(func, args: tuple, kwargs: dict) -> Any:
    """`func`'s output by kiln's rule, or NotImplemented (no rule, or a call it does not cover)."""
    rule = META_RULES.get(func) or NO_TORCH_META.get(func)
    if rule is None:
        return NotImplemented
    try:
        return rule(*args, **kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError):   # an argument the rule cannot read:
        return NotImplemented                                   # torch's kernel decides
