"""Indexing, creation and random prims.

Indexing prims read or write through integer index tensors: `gather`/`scatter`/`scatter_reduce`
along one dim with an index of the operand's rank, and `index`/`index_put` with a list of int64
index tensors of one shape applied to the leading dims (decompositions move indexed dims to the
front and broadcast the indices). Creation prims make tensors from sizes alone; random prims draw
from torch's generator in the reference (aot makes them functional with a seed and offset).
"""
from __future__ import annotations

import torch

from kiln.prims.prim import Category, check, define


def _check_index(name, index):
    check(index.dtype == torch.int64, name, f"index must be int64, got {index.dtype}")


def _gather_meta(a, dim, index):
    _check_index("gather", index)
    check(index.ndim == a.ndim, "gather", f"index rank {index.ndim} != operand rank {a.ndim}")
    return a.new_empty(index.shape)


def _scatter_meta_check(name, a, dim, index, src):
    _check_index(name, index)
    check(src.shape == index.shape and src.dtype == a.dtype, name,
          f"src must match index shape {tuple(index.shape)} and operand dtype {a.dtype}, "
          f"got {tuple(src.shape)} {src.dtype}")
    return torch.empty_like(a)


def _index_check(name, a, indices):
    check(0 < len(indices) <= a.ndim, name, f"needs 1..{a.ndim} index tensors, got {len(indices)}")
    for i in indices:
        _check_index(name, i)
        check(i.shape == indices[0].shape, name, f"index shapes differ: {[tuple(x.shape) for x in indices]}")
    return [*indices[0].shape, *a.shape[len(indices):]]


def _index_meta(a, indices):
    return a.new_empty(_index_check("index", a, indices))


def _index(a, indices):
    _index_check("index", a, indices)
    return a[tuple(indices)]


def _index_put_meta(a, indices, values, accumulate):
    shape = _index_check("index_put", a, indices)
    check(list(values.shape) == list(shape) and values.dtype == a.dtype, "index_put",
          f"values must have shape {shape} and dtype {a.dtype}, got {tuple(values.shape)} {values.dtype}")
    return torch.empty_like(a)


def _index_put(a, indices, values, accumulate):
    _index_put_meta(a, indices, values, accumulate)
    if accumulate and len(indices) == 1 and a.is_cuda and not torch.are_deterministic_algorithms_enabled():
        # [Note: accumulating index_put on CUDA] ATen's index_put_(accumulate=True) sorts the indices
        # and adds each run of equal ones in order: 9 ms for the relative-position bias gradient of
        # T5 (262,144 rows into 32), 0.6 ms for BERT's word embeddings, where index_add's atomic
        # adds take a fraction of that. The sum's order differs from run to run (as eager's
        # embedding backward's does not), within rounding; deterministic mode keeps the sort.
        return a.index_add(0, indices[0].reshape(-1), values.reshape(-1, *a.shape[1:]))
    return a.index_put(tuple(indices), values, accumulate)


define("gather(Tensor a, int dim, Tensor index) -> Tensor", Category.INDEXING,
       "out[i][j] = a[index[i][j]][j] (for dim 0): read along dim at index positions", _gather_meta,
       lambda a, dim, index: torch.gather(a, dim, index))
define("scatter(Tensor a, int dim, Tensor index, Tensor src) -> Tensor", Category.INDEXING,
       "a copy of a with src written along dim at index positions",
       lambda a, dim, index, src: _scatter_meta_check("scatter", a, dim, index, src),
       lambda a, dim, index, src: torch.scatter(a, dim, index, src))
define("scatter_reduce(Tensor a, int dim, Tensor index, Tensor src, str reduce, bool include_self) -> Tensor",
       Category.INDEXING, "a copy of a with src combined along dim at index positions (sum, prod, mean, amax, amin)",
       lambda a, dim, index, src, reduce, include_self: _scatter_meta_check("scatter_reduce", a, dim, index, src),
       lambda a, dim, index, src, reduce, include_self: torch.scatter_reduce(a, dim, index, src, reduce,
                                                                             include_self=include_self))
define("index(Tensor a, Tensor[] indices) -> Tensor", Category.INDEXING,
       "a[i0, i1, ...] with int64 index tensors of one shape over the leading dims", _index_meta, _index)
define("index_put(Tensor a, Tensor[] indices, Tensor values, bool accumulate) -> Tensor", Category.INDEXING,
       "a copy of a with values written (or added) at a[i0, i1, ...]", _index_put_meta, _index_put)


def _index_put_into(a, indices, values, accumulate):
    return a.index_put_(tuple(indices), values, accumulate)


# The one prim that writes into its operand; no decomposition produces it: codegen puts it in place of
# an index_put whose operand is a copy of a graph input the graph writes back ([Note: writes into
# inputs in place] in kiln/codegen/reinplace.py).
define("index_put_(Tensor(a!) a, Tensor[] indices, Tensor values, bool accumulate) -> Tensor(a!)",
       Category.INDEXING, "index_put written into a itself (a graph input's storage); returns a",
       lambda a, indices, values, accumulate: (_index_put_meta(a, indices, values, accumulate), a)[1],
       _index_put_into)


def _full(shape, value, *, dtype, device):
    return torch.full(shape, value, dtype=dtype, device=device)


def _iota(length, *, start, step, dtype, device):
    return (torch.arange(length, dtype=torch.int64, device=device) * step + start).to(dtype)


def _iota_meta(length, *, start, step, dtype, device):
    return torch.empty(length, dtype=dtype, device="meta")


def _empty_strided(shape, stride, *, dtype, device):
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


define("full(SymInt[] shape, Scalar value, *, ScalarType dtype, Device device) -> Tensor", Category.CREATION,
       "a contiguous tensor filled with value",
       lambda shape, value, *, dtype, device: torch.empty(shape, dtype=dtype, device="meta"), _full)
define("iota(SymInt length, *, SymInt start, SymInt step, ScalarType dtype, Device device) -> Tensor",
       Category.CREATION, "start, start+step, ... (length elements)", _iota_meta, _iota)
define("empty_strided(SymInt[] shape, SymInt[] stride, *, ScalarType dtype, Device device) -> Tensor",
       Category.CREATION, "an uninitialized tensor with the given strides",
       lambda shape, stride, *, dtype, device: torch.empty_strided(shape, stride, dtype=dtype, device="meta"),
       _empty_strided)


def _uniform(shape, *, dtype, device):
    return torch.rand(shape, dtype=dtype, device=device)


def _normal(shape, *, dtype, device):
    return torch.randn(shape, dtype=dtype, device=device)


_SEEDED = (torch.Tag.nondeterministic_seeded,)
define("uniform(SymInt[] shape, *, ScalarType dtype, Device device) -> Tensor", Category.RANDOM,
       "uniform samples in [0, 1)", lambda shape, *, dtype, device: torch.empty(shape, dtype=dtype, device="meta"),
       _uniform, _SEEDED)
define("normal(SymInt[] shape, *, ScalarType dtype, Device device) -> Tensor", Category.RANDOM,
       "standard normal samples", lambda shape, *, dtype, device: torch.empty(shape, dtype=dtype, device="meta"),
       _normal, _SEEDED)
