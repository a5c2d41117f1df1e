"""Helpers that decompositions share: type promotion, broadcasting, scalars as tensors, reshapes.

These are eager's implicit rules written out over prims, so each decomposition states its math and
calls `elementwise(...)` / `reduce(...)` for the bookkeeping. Type promotion follows ATen's
TensorIterator: dimensioned tensors outrank 0-d tensors, which outrank Python scalars, unless a
lower-ranked operand is of a higher category (bool < integer < float < complex).
"""
from __future__ import annotations

import enum
import math
from numbers import Number

import torch

from kiln.prims.elementwise import contiguous_strides, dense as _dense
from kiln.symbolic.strides import definitely_contiguous
from kiln.prims.ops import ops as p
from kiln.symbolic.decide import expect_true, guard_or_true, same_size

LOW_PRECISION = (torch.float16, torch.bfloat16)


_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128)
# torch.promote_types is an ATen op (it would reach the evaluator's mode); tabulate it once here.
_PROMOTE = {(a, b): torch.promote_types(a, b) for a in _DTYPES for b in _DTYPES}


def promote_types(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return _PROMOTE[(a, b)]


class Promotion(enum.Enum):
    DEFAULT = "default"            # result dtype of the operands
    INT_TO_FLOAT = "int_to_float"  # integers and bool compute in the default float dtype
    ALWAYS_BOOL = "always_bool"    # comparisons: operands promoted, result bool
    NO_OPMATH = "no_opmath"        # compute in the result dtype even for float16/bfloat16
    BOOL_TO_LONG = "bool_to_long"  # bool becomes int64 (sum of bools)


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def scalar_dtype(x) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int) or isinstance(x, torch.SymInt):
        return torch.int64
    if isinstance(x, complex):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return torch.get_default_dtype()


def _combine(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    if _category(higher) == 3:
        return higher
    if _category(lower) == 3:
        return promote_types(higher, lower) if higher.is_floating_point else lower
    if _category(higher) == 2:
        return higher
    if higher == torch.bool or _category(lower) == 2:
        return promote_types(higher, lower)
    return higher


def result_dtype(*args) -> torch.dtype:
    dim_t = zero_t = scalar_t = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.ndim > 0:
                dim_t = a.dtype if dim_t is None else promote_types(dim_t, a.dtype)
            else:
                zero_t = a.dtype if zero_t is None else promote_types(zero_t, a.dtype)
        elif a is not None:
            d = scalar_dtype(a)
            scalar_t = d if scalar_t is None else promote_types(scalar_t, d)
    return _combine(dim_t, _combine(zero_t, scalar_t))


def is_float(dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16 math runs in float32, as eager's kernels do (opmath)."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def convert(a, dtype):
    if isinstance(a, torch.Tensor):
        return a if a.dtype == dtype else p.convert_element_type(a, dtype)
    return a


def full(shape, value, dtype, device):
    return p.full(list(shape), value, dtype=dtype, device=device)


def scalar_tensor(value, like: torch.Tensor, dtype=None):
    """A tensor of `like`'s shape holding `value` (a Python number or a 0-d tensor)."""
    dtype = dtype or like.dtype
    if isinstance(value, torch.Tensor):
        return broadcast_to(convert(to_device(value, like.device), dtype), like.shape)
    return full(like.shape, value, dtype, like.device)


def to_device(a: torch.Tensor, device) -> torch.Tensor:
    return a if a.device == device else p.device_put(a, device)


def broadcast_shapes(*shapes):
    """An unbacked size (a count known at run time) is taken not to be 1: the general case, as
    eager's broadcasting of it to another size would be ([Note: unbacked sizes])."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, size in enumerate(s):
            j = ndim - len(s) + i
            if guard_or_true(size != 1):
                if guard_or_true(out[j] != 1) and not expect_true(out[j] == size):
                    raise RuntimeError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[j] = size
    return out


def broadcast_to(a: torch.Tensor, shape) -> torch.Tensor:
    shape = list(shape)
    if a.ndim == len(shape) and all(same_size(x, y) for x, y in zip(a.shape, shape)):
        return a
    offset = len(shape) - a.ndim
    # a dim whose size is 1 only under a guard (a strided slice's `(s2 - 3) // 3` at s2 = 8) is
    # squeezed away and broadcast as a new dim: lowering tells a broadcast dim by a literal size 1,
    # and read the slice at every position of the dim instead (fuzz seed 1006522, dynamic=True)
    ones = [k for k, n in enumerate(a.shape)
            if not isinstance(n, int) and not same_size(n, shape[offset + k]) and not guard_or_true(n != 1)]
    if ones:
        a = p.squeeze(a, ones)
    return p.broadcast_in_dim(a, shape, [offset + k for k in range(len(shape) - offset) if k not in ones])


def common_device(args):
    """The device of the op: a dimensioned tensor's, else any tensor's (CPU 0-d tensors follow CUDA ones)."""
    device = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if device is None or (a.ndim > 0 and a.device.type != "cpu"):
                device = a.device
    return device


def complex_parts(z):
    """(real, imaginary) of a complex tensor, each in its real dtype."""
    parts = p.view_as_real(z)
    last = z.ndim
    return tuple(p.squeeze(p.slice(parts, last, k, k + 1, 1), [last]) for k in (0, 1))


def magnitude(z):
    """|z| of a complex tensor, in its real dtype. Not libm's hypot: g++ computes that with
    libmvec's vector variant in a loop's body and scalar hypot in its tail, an ulp apart, and a
    magnitude computed twice must agree bit for bit (an inf-norm's maximum against the mask of its
    gradient: a count of 0 made the gradient NaN). IEEE operations only, so every kernel gives the
    same bits: the larger part times sqrt(1 + ratio^2), no overflow where hypot has none, inf
    where either part is inf (hypot(inf, nan) = inf)."""
    real, imag = complex_parts(z)
    a, b = p.abs(real), p.abs(imag)
    big, small = p.maximum(a, b), p.minimum(a, b)
    ratio = p.div(small, big)
    one, zero = full(a.shape, 1, a.dtype, a.device), full(a.shape, 0, a.dtype, a.device)
    size = p.mul(big, p.sqrt(p.add(one, p.mul(ratio, ratio))))
    size = p.where(p.eq(big, zero), zero, size)
    return p.where(p.bitwise_or(p.isinf(a), p.isinf(b)), full(a.shape, math.inf, a.dtype, a.device), size)


def elementwise(prim, *args, promotion: Promotion = Promotion.DEFAULT, out_dtype=None):
    """Apply an elementwise prim with eager's promotion and broadcasting made explicit.

    Returns a tensor of the broadcast shape and of the dtype eager's op would give."""
    dtype = result_dtype(*args)
    if promotion is Promotion.INT_TO_FLOAT and not is_float(dtype):
        dtype = torch.get_default_dtype()
    if promotion is Promotion.BOOL_TO_LONG and dtype == torch.bool:
        dtype = torch.int64
    compute = dtype if promotion is Promotion.NO_OPMATH else computation_dtype(dtype)
    result = dtype if promotion is not Promotion.ALWAYS_BOOL else torch.bool
    if out_dtype is not None:
        result = out_dtype
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    device = common_device(tensors)
    shape = broadcast_shapes(*(a.shape for a in tensors))
    operands = []
    for a in args:
        if isinstance(a, torch.Tensor):
            operands.append(broadcast_to(convert(to_device(a, device), compute), shape))
        else:
            operands.append(full(shape, a, compute, device))
    return convert(prim(*operands), result)


def map_float(fn, *args, promotion: Promotion = Promotion.INT_TO_FLOAT):
    """Run `fn` (a function of broadcast tensors in the computation dtype) with eager's promotion."""
    dtype = result_dtype(*args)
    if promotion is Promotion.INT_TO_FLOAT and not is_float(dtype):
        dtype = torch.get_default_dtype()
    compute = computation_dtype(dtype)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    device = common_device(tensors)
    shape = broadcast_shapes(*(a.shape for a in tensors))
    operands = [broadcast_to(convert(to_device(a, device), compute), shape) if isinstance(a, torch.Tensor)
                else full(shape, a, compute, device) for a in args]
    return convert(fn(*operands), dtype)


def canonical_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dimension {dim} out of range for a tensor of {ndim} dims")
    return dim % n


def canonical_dims(dims, ndim: int) -> list:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({canonical_dim(d, ndim) for d in dims}) if ndim > 0 else []


def keepdim_shape(a: torch.Tensor, dims) -> list:
    return [1 if i in dims else s for i, s in enumerate(a.shape)]


def restore_dims(r: torch.Tensor, a: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
    if not keepdim or a.ndim == 0:
        return r
    kept = [i for i in range(a.ndim) if i not in dims]
    return p.broadcast_in_dim(r, keepdim_shape(a, dims), kept)


def numel(shape) -> int:
    return math.prod(shape)


def reshape(a: torch.Tensor, shape) -> torch.Tensor:
    shape = infer_size(shape, a.numel())
    if list(shape) == list(a.shape):
        return a
    if not _viewable(a, shape):
        a = contiguous(a)
    return p.view(a, shape)


def _viewable(a: torch.Tensor, shape) -> bool:
    return definitely_contiguous(a) or view_strides(list(a.shape), list(a.stride()), list(shape)) is not None


def view_strides(sizes: list, strides: list, shape: list) -> list | None:
    """The strides of a view of (sizes, strides) as `shape`, or None when no view has that shape
    (the rule ATen's `view` applies). Each run of dims that is contiguous with itself must split or
    merge into whole dims of the new shape. Computed here, not by asking `view` on a meta tensor:
    what a meta `view` accepts depends on which meta kernels other libraries registered (after
    torch.compile ran in the process, one accepted BERT's batch-expanded position ids)."""
    if math.prod(sizes) == 0 or not sizes:
        return contiguous_strides(shape)
    out = [0] * len(shape)
    view_d = len(shape) - 1
    chunk_stride, tensor_numel, view_numel = strides[-1], 1, 1
    for d in reversed(range(len(sizes))):
        tensor_numel *= sizes[d]
        if d == 0 or (sizes[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_stride):
            while view_d >= 0 and (view_numel < tensor_numel or shape[view_d] == 1):
                out[view_d] = view_numel * chunk_stride
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_stride, tensor_numel, view_numel = strides[d - 1], 1, 1
    return out if view_d == -1 else None


def infer_size(shape, total):
    """`shape` with its -1 inferred. Only a literal -1 is inferred: a symbolic size is taken to be
    a size (a number read with `.item()` that turns out -1 at run time is not supported)."""
    shape = list(shape)
    wild = [i for i, d in enumerate(shape) if isinstance(d, int) and d == -1]
    if wild:
        i = wild[0]
        known = numel(shape[:i] + shape[i + 1:])
        shape[i] = total // known if guard_or_true(known != 0) else 0
    return shape


def contiguous(a: torch.Tensor) -> torch.Tensor:
    if definitely_contiguous(a):
        return a
    return p.copy_strided(a, contiguous_strides(a.shape))


def clone(a: torch.Tensor, memory_format=None) -> torch.Tensor:
    if memory_format in (None, torch.preserve_format) and _dense(a):
        return p.copy_strided(a, list(a.stride()))
    if memory_format == torch.channels_last and a.ndim == 4:
        return p.copy_strided(a, _channels_last_strides(a.shape))
    return p.copy_strided(a, contiguous_strides(a.shape))


def _channels_last_strides(shape):
    n, c, h, w = shape
    return [h * w * c, 1, w * c, c]


def is_number(x) -> bool:
    return isinstance(x, (Number, torch.SymInt, torch.SymFloat, torch.SymBool))


def as_tensor(value, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return full([], value, scalar_dtype(value) if not isinstance(value, float) else like.dtype
                if is_float(like.dtype) else torch.get_default_dtype(), like.device)


def shifted_mean(x, dims, n):
    """[Note: shifted mean] The mean of `x` over `dims` (n elements, none of those dims empty) as
    first + mean(x - first): equal values give exactly their value, so their variance is exactly 0,
    as eager's Welford gives (a plain sum / n rounds: 3v is not always a float). Batch norm of
    equal values then normalizes to exactly 0 where noise / sqrt(eps) came out (fuzz seed 1736),
    and std's backward takes eager's `std == 0` branch (fuzz seed 2)."""
    first = x
    for d in dims:
        first = p.slice(first, d, 0, 1, 1)
    s = p.sum(p.sub(x, p.broadcast_in_dim(first, list(x.shape), list(range(x.ndim)))), dims)
    return p.add(p.squeeze(first, list(dims)), p.div(s, full(s.shape, n, x.dtype, x.device)))


def has_elements(x, dims) -> bool:
    """Whether every one of `dims` of `x` is known to be non-empty."""
    return x.ndim > 0 and all(not (isinstance(x.shape[d], int) and x.shape[d] == 0) for d in dims)
