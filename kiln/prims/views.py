"""View and movement prims.

Views (`broadcast_in_dim`, `view`, `permute`, `slice`, `squeeze`, `as_strided`) return a tensor
sharing the input's storage: a code generator lowers them to index arithmetic, never to a kernel.
Their meta rule is the view itself applied to the meta tensor, which is exactly their shape and
stride semantics. Movement prims (`copy_strided`, `cat`, `pad`, `flip`) make new tensors.
"""
from __future__ import annotations

import torch

from kiln.prims.prim import Category, check, define
from kiln.symbolic.decide import guard_or_false, guard_or_true, same_size


def _broadcast_in_dim(a, shape, broadcast_dimensions):
    check(len(broadcast_dimensions) == a.ndim, "broadcast_in_dim",
          f"needs one target dim per input dim: input ndim {a.ndim}, dims {list(broadcast_dimensions)}")
    check(list(broadcast_dimensions) == sorted(set(broadcast_dimensions)), "broadcast_in_dim",
          f"broadcast_dimensions {list(broadcast_dimensions)} must increase")
    for size, d in zip(a.shape, broadcast_dimensions):
        check(guard_or_false(size == 1) or same_size(size, shape[d]), "broadcast_in_dim",
              f"input size {size} cannot broadcast to {shape[d]} at dim {d}")
    return _unsqueeze_to(a, len(shape), broadcast_dimensions).expand(shape)


def _unsqueeze_to(a, ndim, dims):
    out, placed = a, 0
    for d in range(ndim):
        if placed < len(dims) and dims[placed] == d:
            placed += 1
        else:
            out = out.unsqueeze(d)
    return out


def _view(a, shape):
    return a.view(shape)


def _permute(a, dims):
    check(sorted(dims) == list(range(a.ndim)), "permute", f"dims {list(dims)} are not a permutation of {a.ndim}")
    return a.permute(dims)


def _slice(a, dim, start, end, step):
    check(0 <= dim < a.ndim, "slice", f"dim {dim} must be normalized for ndim={a.ndim}")
    check(0 <= start <= end <= a.shape[dim] and step >= 1, "slice",
          f"needs 0 <= start <= end <= size and step >= 1, got start={start} end={end} "
          f"size={a.shape[dim]} step={step}")
    return a.narrow(dim, start, end - start)[(slice(None),) * dim + (slice(None, None, step),)]


def _squeeze(a, dims):
    for d in dims:
        check(a.shape[d] == 1, "squeeze", f"dim {d} has size {a.shape[d]}, not 1")
    return a.squeeze(tuple(dims)) if dims else a.view(a.shape)


def _as_strided(a, size, stride, storage_offset):
    return a.as_strided(size, stride, storage_offset)


VIEWS = {
    "broadcast_in_dim": ("broadcast_in_dim(Tensor(a) a, SymInt[] shape, int[] broadcast_dimensions) -> Tensor(a)",
                         "place input dim i at output dim broadcast_dimensions[i]; expand size-1 dims",
                         _broadcast_in_dim),
    "view": ("view(Tensor(a) a, SymInt[] shape) -> Tensor(a)",
             "reinterpret with a new shape; the input's strides must allow it", _view),
    "permute": ("permute(Tensor(a) a, int[] dims) -> Tensor(a)", "reorder dimensions", _permute),
    "slice": ("slice(Tensor(a) a, int dim, SymInt start, SymInt end, SymInt step) -> Tensor(a)",
              "elements start, start+step, ... < end of one dim (normalized bounds)", _slice),
    "squeeze": ("squeeze(Tensor(a) a, int[] dims) -> Tensor(a)", "drop the given size-1 dims", _squeeze),
    "as_strided": ("as_strided(Tensor(a) a, SymInt[] size, SymInt[] stride, SymInt storage_offset) -> Tensor(a)",
                   "view the input's storage with explicit sizes, strides and offset", _as_strided),
}

for _name, (_schema, _doc, _ref) in VIEWS.items():
    # The reference applied to meta tensors is the meta rule: a view is metadata only.
    define(_schema, Category.VIEW, _doc, _ref, _ref)


def _copy_strided_meta(a, stride):
    return torch.empty_strided(a.shape, stride, dtype=a.dtype, device=a.device)


def _copy_strided(a, stride):
    out = torch.empty_strided(a.shape, stride, dtype=a.dtype, device=a.device)
    out.copy_(a)
    return out


def _cat_check(tensors, dim):
    check(len(tensors) > 0, "cat", "needs at least one tensor")
    first = tensors[0]
    check(0 <= dim < first.ndim, "cat", f"dim {dim} must be normalized for ndim={first.ndim}")
    for t in tensors:
        check(t.dtype == first.dtype and t.ndim == first.ndim, "cat",
              f"operands differ in dtype or rank: {[(x.dtype, x.ndim) for x in tensors]}")
        check(all(t.shape[i] == first.shape[i] for i in range(t.ndim) if i != dim), "cat",
              f"operand shapes differ outside dim {dim}: {[tuple(x.shape) for x in tensors]}")


def _cat(tensors, dim):
    _cat_check(tensors, dim)
    return torch.cat(tensors, dim)


def _pad_shape(a, low, high, interior):
    check(len(low) == len(high) == len(interior) == a.ndim, "pad", "needs low, high, interior per dim")
    # a padding computed from a count known only at run time (`numel - u0`) is taken non-negative
    check(all(guard_or_true(x >= 0) for x in (*low, *high, *interior)), "pad",
          "paddings must be non-negative (decompositions crop with slice)")
    return [lo + hi + (s if isinstance(it, int) and it == 0 else s + (s - 1) * it if s > 0 else 0)
            for s, lo, hi, it in zip(a.shape, low, high, interior)]


def _pad_meta(a, value, low, high, interior):
    return a.new_empty(_pad_shape(a, low, high, interior))


def _pad(a, value, low, high, interior):
    out = torch.full(_pad_shape(a, low, high, interior), value, dtype=a.dtype, device=a.device)
    region = tuple(slice(lo, lo + (s - 1) * (it + 1) + 1 if s > 0 else lo, it + 1)
                   for s, lo, it in zip(a.shape, low, interior))
    out[region] = a
    return out


def _flip_meta(a, dims):
    return torch.empty_like(a, memory_format=torch.contiguous_format)


define("copy_strided(Tensor a, SymInt[] stride) -> Tensor", Category.VIEW,
       "a copy of the input with the given strides (clone, contiguous, layout changes)",
       _copy_strided_meta, _copy_strided)
define("cat(Tensor[] tensors, int dim) -> Tensor", Category.VIEW, "concatenate along dim",
       lambda tensors, dim: (_cat_check(tensors, dim), torch.cat(tensors, dim))[1], _cat)
define("pad(Tensor a, Scalar value, SymInt[] low, SymInt[] high, SymInt[] interior) -> Tensor", Category.VIEW,
       "pad each dim with value: low before, high after, interior between elements", _pad_meta, _pad)
define("flip(Tensor a, int[] dims) -> Tensor", Category.VIEW, "reverse the order of elements along dims",
       _flip_meta, lambda a, dims: torch.flip(a, dims))


def _device_put_meta(a, device):
    return torch.empty_like(a)


define("device_put(Tensor a, Device device) -> Tensor", Category.VIEW,
       "a copy of the input on another device (a CPU 0-d operand joining a CUDA op)",
       _device_put_meta, lambda a, device: a.to(device, copy=True))
