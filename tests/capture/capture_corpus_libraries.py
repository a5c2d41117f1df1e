"""Corpus programs for library values inside captured code: torch.utils._pytree (inlined, specs
as constants), NumPy on tensors (traced as torch ops), and objects passed around (options
dataclasses, modules, typing objects, torch.distributions). Each runs under fullgraph=True and
equals eager."""
from __future__ import annotations

import collections
import dataclasses
import typing

import numpy as np
import torch
from torch.testing._utils import freeze_rng_state
from torch.utils import _pytree as pytree

from capture_corpus import program, t

_Pair = collections.namedtuple("_Pair", "left right")


# -- pytree ---------------------------------------------------------------------------------------------
@program()
def pytree_flatten_unflatten(x):
    tree = {"a": x, "b": [x * 2, (x * 3, None)], "c": 4}
    leaves, spec = pytree.tree_flatten(tree)
    again = pytree.tree_unflatten([leaf + 1 if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)
    return again, spec, len(leaves), spec.num_leaves


@program()
def pytree_map_and_friends(x):
    tree = (x, {"k": [x * 2, 3]}, _Pair(x, x - 1), collections.deque([x]))
    doubled = pytree.tree_map(lambda t: t * 2, tree)
    summed = pytree.tree_map(lambda a, b: a + b, tree, doubled)
    only = pytree.tree_map_only(torch.Tensor, lambda t: t.sum(), tree)
    same = pytree.tree_structure(tree) == pytree.tree_structure(doubled)
    return doubled, summed, only, pytree.tree_leaves(tree)[1], same


@program()
def pytree_predicates(x):
    tree = [x, {"z": x + 1}, 2]
    return x * pytree.tree_all(lambda v: v is not None, tree), pytree.tree_any_only(int, lambda v: v > 1, tree)


@program()
def pytree_map_inplace(x):
    box = {"a": [x.clone()]}
    pytree.tree_map_(lambda t: t.mul_(3), box)
    return box["a"][0]


@program()
def pytree_leaf_iterators(x):
    tree = {"a": [x, x * 2], "b": (3, x - 1)}
    out = []
    out.extend(pytree.tree_iter(tree))            # pytree's generator over the leaves
    leaves = pytree.arg_tree_leaves(tree, [x + 1], k=(x * 4,))
    return out, leaves, sum(1 for leaf in pytree.tree_iter(tree) if isinstance(leaf, torch.Tensor))


# -- NumPy on tensors: traced as torch ops ----------------------------------------------------------------
@program()
def numpy_sum_from_numpy(x):
    return torch.from_numpy(np.sum(x.numpy(), axis=0)) * 2


@program()
def numpy_ufuncs_and_scalars(x):
    a = x.numpy()
    y = np.exp(a) * 2 + np.mean(a)           # a float32 array, a float32 NumPy scalar
    return y, np.sum(a), np.max(a, axis=1), np.sqrt(np.abs(a)).dtype


@program()
def numpy_promotion_rules(x):
    i = (x * 3).long().numpy()
    halves = i / 2                           # NumPy: int64 / int -> float64
    strong = x.numpy() * np.float64(2.0)     # a NumPy scalar is strong: float64
    weak = x.numpy() * 2.0                   # a Python float is weak: float32
    return halves, strong, weak, np.arange(3) / 2, np.zeros(2) + 1


@program()
def numpy_scalar_with_tensor(x):
    total = np.sum(x.numpy())                # a NumPy scalar next to tensors acts as a Python number
    ints = (x * 3).long()
    return x * total, ints * np.float64(0.5), ints + np.int32(2), x + x.numpy() * 0, np.float32(2) < x


@program()
def numpy_methods_and_attributes(x):
    a = x.numpy()
    b = a.reshape(5, 4).T.astype(np.float64)
    return b, a.sum(axis=1), a.shape, a.ndim, a.dtype == np.float32, b.dtype, a.size, a.mean(), a[1:, ::2], a[0, 1]


@program()
def numpy_array_functions(x):
    a = x.numpy()
    return (np.where(a > 0, a, -a), np.concatenate([a, a * 2], axis=0), np.maximum(a, 0.1), np.clip(a, -0.5, 0.5),
            np.linalg.norm(a), np.stack([a[0], a[1]]), np.matmul(a, a.T), np.cumsum(a, axis=1))


@program()
def numpy_inplace_writes_the_tensor(x):
    y = x.clone()
    a = y.numpy()
    alias = a
    alias += 1
    a[0] = 0.0
    a *= np.float32(2)
    return y, a


@program()
def numpy_constants(x):
    return x * np.finfo(np.float32).eps + np.iinfo(np.int32).max, np.finfo(np.float64).tiny, np.float32(2) * 3, np.pi


# -- objects passed around: options, modules, typing, RNG regions, distributions ----------------------------
@dataclasses.dataclass(frozen=True)
class _Options:
    p: float = 1.0
    eps: float = 1e-5
    scale: float = 0.5


_PDIST = torch.nn.PairwiseDistance(p=1.0)


def _apply(module, options, a):
    return module(a, a * options.scale)[:, None] + torch.nn.functional.normalize(a, p=options.p, dim=1, eps=options.eps)


# a module argument is guarded by identity: the harness deep-copies inputs, so each call recompiles
@program(inputs=lambda seed: (torch.randn(4, 5, generator=torch.Generator().manual_seed(seed)), _Options(),
                              torch.nn.PairwiseDistance(p=3.0)), graphs=4)
def options_and_module_arguments(x, options, module):
    return _apply(module, options, x) + _apply(_PDIST, _Options(p=2.0, scale=2.0), x)


@program()
def typing_objects(x):
    t = typing.Optional[torch.Tensor]
    d = typing.Dict[str, typing.List[int]]
    y = typing.cast(torch.Tensor, x)
    return y * len(typing.get_args(t)) + len(typing.get_args(d)), typing.get_origin(t) is typing.Union, str(d)


@program()
def freeze_rng_state_without_random_ops(x):
    with freeze_rng_state():
        y = x * 2
    with torch.random.fork_rng():
        z = y + 1
    return z


@program()
def distributions_normal(x):
    d = torch.distributions.Normal(x, 1.0 + x.abs())
    return d.log_prob(x + 0.5), d.mean, d.stddev, d.entropy(), d.cdf(x), d.batch_shape


@program()
def distributions_kl_and_arguments(x):
    p = torch.distributions.Normal(x, 1.0 + x.abs())
    q = torch.distributions.Normal(torch.zeros_like(x), 2.0)
    b = torch.distributions.Bernoulli(probs=torch.sigmoid(x))
    return torch.distributions.kl_divergence(p, q), b.log_prob((x > 0).float()), b.entropy(), \
        torch.distributions.Categorical(logits=x).log_prob(torch.tensor([0, 1, 2, 3]))


@dataclasses.dataclass
class _Inner:
    k: int = 3


@dataclasses.dataclass
class _Config:
    width: int = 2
    inner: _Inner = dataclasses.field(default_factory=_Inner)


@program(inputs=lambda seed: (torch.randn(4, 5, generator=torch.Generator().manual_seed(seed)),
                              _Config(width=2 + seed, inner=_Inner(seed))), graphs=2)
def dataclass_asdict_astuple_argument(x, config):
    d = dataclasses.asdict(config)
    d["extra"] = 1
    return x * d["width"] + d["inner"]["k"], dataclasses.astuple(config), d, dataclasses.replace(config, width=7)


_LINEAR = torch.nn.Linear(5, 3)


@program()
def checkpoint_module_and_function(x):
    a = torch.utils.checkpoint.checkpoint(_PDIST, x, x + 1, use_reentrant=False)
    b = torch.utils.checkpoint.checkpoint(_LINEAR, x, use_reentrant=True)  # no input requires grad
    c = torch.utils.checkpoint.checkpoint(lambda t, s: t * s, x, 2.0, use_reentrant=False)
    return a, b, b.requires_grad, c


# -- torch.vmap (unrolled per example) ----------------------------------------------------------------------
@program()
def vmap_in_dims_out_dims(x):
    """vmap with a tuple of in_dims (None for an argument passed whole), out_dims, a pytree output,
    and vmap of a vmap, as transformers builds its masks over (batch, query, key) indices."""
    def pair(row, col):
        return row * col.sum(), (row > 0, col[0])
    first = torch.vmap(pair, in_dims=(0, None), out_dims=(1, 0))(x, x[0])
    grid = torch.vmap(torch.vmap(lambda i, j: i >= j, in_dims=(None, 0)), in_dims=(0, None))
    rows = torch.arange(x.shape[0])
    return first, grid(rows, rows), torch.func.vmap(torch.dot)(x, x)


@program()
def vmap_mask_function_index_by_tensor(x):
    """transformers' sdpa_mask: a mask function that indexes a padding mask by 0-d index tensors,
    vmapped over two index vectors inside TransformGetItemToIndex (a TorchFunctionMode of torch's
    compiler, a context that changes no value)."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    padding = x[:, 0] > 0

    def mask(q, kv):
        return (kv <= q) & padding[kv]
    with TransformGetItemToIndex():
        out = torch.vmap(torch.vmap(mask, in_dims=(None, 0)), in_dims=(0, None))(
            torch.arange(x.shape[0]), torch.arange(x.shape[0]))
    return out


@program()
def associative_scan_generic(x):
    """torch's associative_scan, generic mode (Mamba's scan on CPU): its combine function vmapped,
    its helpers (`_interleave`, read through a package that shadows its module by a function)
    inlined."""
    from torch._higher_order_ops.associative_scan import associative_scan

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]
    _, states = associative_scan(combine, (x.sigmoid(), x), dim=1, combine_mode="generic")
    return states


@program(inputs=t(300, 3), graphs=2, breaks=1)
def vmap_past_the_unroll_limit_breaks(x):
    """A vmap over more examples than kiln unrolls breaks the graph (at the user's call) and runs
    eagerly; the code before and after it is captured."""
    y = x * 2
    return torch.vmap(lambda r: r.sum() * 2)(y) + 1
