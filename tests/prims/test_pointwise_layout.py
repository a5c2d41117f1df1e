"""Elementwise prims lay their outputs out as eager's pointwise ops do ([Note: pointwise outputs
follow their inputs' layout] in kiln/prims/elementwise.py): the meta rule against eager's own
result, over random layouts (contiguous, permuted, strided, broadcast) of every operand."""
import random

import pytest
import torch

from kiln.prims.ops import ops as p


def _layout(rng: random.Random, shape: list[int], dtype=torch.float32) -> torch.Tensor:
    def make(sizes):
        return torch.randn(sizes).to(dtype)
    kind = rng.choice(["contiguous", "permuted", "strided", "broadcast", "permuted_broadcast"])
    if not shape or kind == "contiguous":
        return make(shape)
    if kind == "strided":
        d = rng.randrange(len(shape))
        wide = [n * 2 if i == d else n for i, n in enumerate(shape)]
        return make(wide)[tuple(slice(None, None, 2) if i == d else slice(None) for i in range(len(shape)))]
    if kind == "broadcast":
        return make([1 if rng.random() < 0.5 else n for n in shape]).expand(shape)
    order = list(range(len(shape)))
    rng.shuffle(order)
    t = make([shape[i] for i in order]).permute([order.index(i) for i in range(len(shape))])
    if kind == "permuted_broadcast":
        t = t[tuple(slice(0, 1) if rng.random() < 0.5 else slice(None) for _ in shape)].expand(shape)
    return t


def _meta(t: torch.Tensor) -> torch.Tensor:
    storage = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device="meta")
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def _significant(t) -> list:
    return [st for n, st in zip(t.shape, t.stride()) if n != 1]


CASES = {   # name: (operand dtypes, eager, prim)
    "neg": ((torch.float32,), torch.neg, p.neg),
    "add": ((torch.float32, torch.float32), torch.add, p.add),
    "lt": ((torch.float32, torch.float32), torch.lt, p.lt),
    "where": ((torch.bool, torch.float32, torch.float32), torch.where, p.where),
    "convert": ((torch.float32,), lambda a: a.long(), lambda a: p.convert_element_type(a, torch.int64)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pointwise_output_strides_match_eager(name):
    dtypes, eager, prim = CASES[name]
    rng = random.Random(len(name) * 7919 + ord(name[0]))
    for _ in range(400):
        shape = [rng.randint(1, 4) for _ in range(rng.randint(0, 4))]
        operands = [_layout(rng, shape, dtype) for dtype in dtypes]
        want, got = eager(*operands), prim(*[_meta(t) for t in operands])
        assert _significant(got) == _significant(want), \
            (name, shape, [t.stride() for t in operands], got.stride(), want.stride())
