"""[Note: writes into inputs in place]: an index_put into a copy of an input that the graph writes
back becomes index_put_ on the input, only where that computes what eager computes."""
from __future__ import annotations

import torch

import kiln
from kiln.codegen.reinplace import reinplace_input_writes
from tests.codegen.conftest import prim_graphs


def _writes_in_place(fn, *inputs) -> int:
    (fw, _), _ = prim_graphs(fn, *inputs)
    n = reinplace_input_writes(fw)
    targets = {str(node.target) for node in fw.graph.nodes}
    assert ("kiln_prims.index_put_.default" in targets) == (n > 0)
    return n


def _cache_update(k, pos, new, q):           # a static KV cache's update, then attention over it
    k.index_copy_(2, pos, new)
    return (q @ k.transpose(-1, -2)).softmax(-1)


def _row_write(x, idx, v):                   # x[idx] = v on the leading dim: no permute
    x.index_put_((idx,), v)
    return x.sum(0)


def _read_before_write(k, pos, new):         # the old value is read: the copy must stay
    before = k.sum()
    k.index_copy_(2, pos, new)
    return before + k.sum()


def _inputs(requires_grad: bool = False):
    return (torch.zeros(1, 4, 32, 16), torch.tensor([3]), torch.randn(1, 4, 1, 16, requires_grad=requires_grad),
            torch.randn(1, 4, 1, 16))


def _run_both(fn, *inputs):
    eager_in = [x.clone() for x in inputs]
    kiln_in = [x.clone() for x in inputs]
    expected = fn(*eager_in)
    got = kiln.compile(fn)(*kiln_in)
    torch.testing.assert_close(got, expected)
    for e, k in zip(eager_in, kiln_in):
        torch.testing.assert_close(k, e)         # the written input too


def test_a_cache_update_is_written_into_the_input_and_matches_eager():
    assert _writes_in_place(_cache_update, *_inputs()) == 1
    _run_both(_cache_update, *_inputs())
    # a second call on the same cache at another position sees the first write
    k = torch.zeros(1, 4, 32, 16)
    k_eager = k.clone()
    compiled = kiln.compile(_cache_update)
    for position in (0, 5, 31):
        new, q = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16)
        pos = torch.tensor([position])
        torch.testing.assert_close(compiled(k, pos, new, q), _cache_update(k_eager, pos, new, q))
        assert torch.equal(k, k_eager)


def test_a_leading_dim_write_is_in_place():
    x, idx, v = torch.randn(8, 5), torch.tensor([1, 6]), torch.randn(2, 5)
    assert _writes_in_place(_row_write, x, idx, v) == 1
    _run_both(_row_write, x, idx, v)


def test_an_input_read_before_its_write_keeps_its_copy():
    k, pos, new, _ = _inputs()
    assert _writes_in_place(_read_before_write, k, pos, new) == 0
    _run_both(_read_before_write, k, pos, new)


def _accumulate(x, idx, v):                  # x.index_put_(..., accumulate=True): stays out of place
    x.index_put_((idx,), v, accumulate=True)
    return x.sum(0)


def test_an_accumulating_write_keeps_its_copy():
    x, idx, v = torch.randn(8, 5), torch.tensor([1, 1, 6]), torch.randn(3, 5)
    assert _writes_in_place(_accumulate, x, idx, v) == 0
    _run_both(_accumulate, x, idx, v)
