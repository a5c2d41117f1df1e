"""Reduction and scan prims.

A reduction folds a list of dimensions away (no keepdim: decompositions re-insert dimensions with
`broadcast_in_dim`) and keeps the input dtype; accumulating in a wider dtype is the
decomposition's choice, made explicit with `convert_element_type`. `argmax`/`argmin` reduce one
dimension and return int64 positions. A scan keeps the shape and runs along one dimension.
"""
from __future__ import annotations

import torch

from kiln.prims.prim import Category, check, define


def _reduced_shape(name: str, a: torch.Tensor, dims) -> list:
    dims = list(dims)
    check(all(0 <= d < max(a.ndim, 1) for d in dims), name,
          f"dims {dims} must be normalized (0 <= d < ndim={a.ndim})")
    check(len(set(dims)) == len(dims), name, f"dims {dims} repeat")
    return [s for i, s in enumerate(a.shape) if i not in dims]


def _reduction_meta(name: str):
    def meta(a, dims):
        return a.new_empty(_reduced_shape(name, a, dims))
    return meta


def _amax(a, dims):
    return torch.amax(a, dims) if dims else a.clone()


def _amin(a, dims):
    return torch.amin(a, dims) if dims else a.clone()


def _sum(a, dims):
    # torch.sum promotes integers to int64; the prim keeps the dtype, so cast back.
    return torch.sum(a, dims, dtype=a.dtype) if dims else a.clone()


def _prod(a, dims):
    out = a.clone()
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, d, dtype=a.dtype)
    return out


REDUCTIONS = {
    "sum": ("sum over dims", _sum),
    "prod": ("product over dims", _prod),
    "amax": ("maximum over dims, NaN-propagating", _amax),
    "amin": ("minimum over dims, NaN-propagating", _amin),
}

def _checked_reduction(name, reference):
    def checked(a, dims):
        _reduced_shape(name, a, dims)
        return reference(a, dims)
    return checked


for _name, (_doc, _ref) in REDUCTIONS.items():
    define(f"{_name}(Tensor a, int[] dims) -> Tensor", Category.REDUCTION, _doc, _reduction_meta(_name),
           _checked_reduction(_name, _ref), (torch.Tag.reduction,))


def _var_mean_meta(a, dims):
    shape = _reduced_shape("var_mean", a, dims)
    return a.new_empty(shape), a.new_empty(shape)


def _var_mean(a, dims):
    if not dims:
        return torch.zeros_like(a), a.clone()
    return tuple(torch.var_mean(a, list(dims), correction=0))


# One pass over the data for both statistics, so a backend can reproduce the order of eager's own
# kernel (layer_norm's: [Note: eager's layer_norm statistics] in kiln/codegen/triton/reductions.py).
define("var_mean(Tensor a, int[] dims) -> (Tensor, Tensor)", Category.REDUCTION,
       "biased variance and mean over dims, in one pass", _var_mean_meta, _var_mean, (torch.Tag.reduction,))


def _arg_meta(name: str):
    def meta(a, dim):
        check(a.ndim > 0, name, "needs at least one dimension (decompositions flatten 0-d inputs)")
        return a.new_empty(_reduced_shape(name, a, [dim]), dtype=torch.int64)
    return meta


def _orderable(a):
    # ATen's argmax refuses bool; as a prim, bool orders False < True like uint8.
    return a.to(torch.uint8) if a.dtype == torch.bool else a


define("argmax(Tensor a, int dim) -> Tensor", Category.REDUCTION,
       "position of the first maximum along dim (NaN counts as maximal)", _arg_meta("argmax"),
       lambda a, dim: torch.argmax(_orderable(a), dim), (torch.Tag.reduction,))
define("argmin(Tensor a, int dim) -> Tensor", Category.REDUCTION,
       "position of the first minimum along dim (NaN counts as minimal)", _arg_meta("argmin"),
       lambda a, dim: torch.argmin(_orderable(a), dim), (torch.Tag.reduction,))


def _scan_meta(name: str, with_indices: bool):
    def meta(a, dim):
        check(0 <= dim < max(a.ndim, 1), name, f"dim {dim} must be normalized for ndim={a.ndim}")
        values = a.new_empty(a.shape)
        return (values, a.new_empty(a.shape, dtype=torch.int64)) if with_indices else values
    return meta


def _cumsum(a, dim):
    return torch.cumsum(a, dim, dtype=a.dtype)


def _cumprod(a, dim):
    return torch.cumprod(a, dim, dtype=a.dtype)


def _cummax(a, dim):
    return tuple(torch.cummax(a, dim))


def _cummin(a, dim):
    return tuple(torch.cummin(a, dim))


define("cumsum(Tensor a, int dim) -> Tensor", Category.SCAN, "inclusive prefix sum along dim",
       _scan_meta("cumsum", False), _cumsum)
define("cumprod(Tensor a, int dim) -> Tensor", Category.SCAN, "inclusive prefix product along dim",
       _scan_meta("cumprod", False), _cumprod)
define("cummax(Tensor a, int dim) -> (Tensor, Tensor)", Category.SCAN,
       "running maximum along dim and the position where it was found", _scan_meta("cummax", True), _cummax)
define("cummin(Tensor a, int dim) -> (Tensor, Tensor)", Category.SCAN,
       "running minimum along dim and the position where it was found", _scan_meta("cummin", True), _cummin)
