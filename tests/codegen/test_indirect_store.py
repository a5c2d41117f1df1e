"""Writes at loaded indices ([Note: scatters write in place] in kiln/codegen/ir.py): index_copy_,
index_put_ (with and without accumulate) and a static KV cache's update become kernels of kiln's
own whose store address is loaded from the index tensor, on the C++ printer and under Triton's
interpreter, compared with eager: the values returned and the inputs as eager mutates them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.codegen import ir
from kiln.codegen import triton as triton_printer
from kiln.codegen.compile import compile_prim_graph
from kiln.codegen.dedupe import dedupe_buffers
from kiln.codegen.layout import optimize_layouts
from kiln.codegen.lowering import lower_graph
from kiln.codegen.reinplace import reinplace_input_writes
from kiln.codegen.scheduler import schedule
from tests.codegen.conftest import prim_graphs

PRINTERS = {"cpp": {}, "triton": {"triton_interpret": True}}


def _run_both(fn, inputs, options):
    """fn eager and kiln-compiled on clones of `inputs`: the results and every input after the call."""
    eager_in = [x.clone() for x in inputs]
    kiln_in = [x.clone() for x in inputs]
    expected = fn(*eager_in)
    got = kiln.compile(fn, options=options)(*kiln_in)
    torch.testing.assert_close(got, expected)
    for e, k in zip(eager_in, kiln_in):
        torch.testing.assert_close(k, e)


def _schedule(fn, *inputs, printer=None):
    """The forward's schedule, as compile_prim_graph makes it (after the in-place pass)."""
    (gm, examples), _ = prim_graphs(fn, *inputs)
    reinplace_input_writes(gm)
    dtypes = printer.KERNEL_DTYPES if printer is not None else None
    graph, _ = lower_graph(gm, examples, *([dtypes] if dtypes else []))
    graph = optimize_layouts(dedupe_buffers(graph))
    return graph, schedule(graph)


def _scatter_stores(sched) -> list[ir.Store]:
    return [s for k in sched.steps if isinstance(k, ir.Kernel) for st in k.stages for s in st.body
            if isinstance(s, ir.Store) and s.indirect]


def _index_externs(sched) -> list:
    return [s for s in sched.steps if isinstance(s, ir.ExternKernel) and "index" in str(s.op)]


# ---------------------------------------------------------------------------- the functions

def _index_copy(x, idx, src):
    x.index_copy_(1, idx, src)
    return x * 2


def _index_copy_out_of_place(x, idx, src):   # the operand stays as it was: a copy is written
    y = x.index_copy(0, idx, src)
    return y + x


def _index_put(x, i, j, v):
    x.index_put_((i, j), v)
    return x.sum(0)


def _index_put_accumulate(x, idx, v):
    x.index_put_((idx,), v, accumulate=True)
    return x.sum(0)


def _index_put_fused(x, idx, v, w):          # the written values are computed: they fuse into the write
    x.index_put_((idx,), torch.sin(v) * w)
    return x.clone()


def _negative_index(x, idx, src):          # index_put_ counts negatives from the end (index_copy_ refuses them)
    x.index_put_((idx,), src)
    return x.sum()


class StaticCache(torch.nn.Module):
    """A static KV cache as transformers' StaticCache writes it: caches [B, H, S, D] as buffers,
    the new key and value written at `cache_position` with index_copy_, then attention over the
    whole cache (masked beyond the position)."""

    def __init__(self, b=2, h=3, s=12, d=8):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(b, h, s, d))
        self.register_buffer("v_cache", torch.zeros(b, h, s, d))
        self.proj = torch.nn.Linear(d, d)

    def forward(self, q, k, v, cache_position, mask):
        self.k_cache.index_copy_(2, cache_position, self.proj(k))
        self.v_cache.index_copy_(2, cache_position, v)
        scores = q @ self.k_cache.transpose(-1, -2) / 8 ** 0.5
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ self.v_cache


# ---------------------------------------------------------------------------- values

@pytest.mark.parametrize("printer", PRINTERS)
def test_index_copy_into_an_input(printer):
    _run_both(_index_copy, (torch.randn(3, 7, 5), torch.tensor([4, 0, 6]), torch.randn(3, 3, 5)), PRINTERS[printer])


@pytest.mark.parametrize("printer", PRINTERS)
def test_index_copy_out_of_place_leaves_the_operand(printer):
    _run_both(_index_copy_out_of_place, (torch.randn(6, 4), torch.tensor([5, 1]), torch.randn(2, 4)),
              PRINTERS[printer])


@pytest.mark.parametrize("printer", PRINTERS)
def test_index_put_with_two_index_tensors(printer):
    _run_both(_index_put, (torch.randn(5, 6, 3), torch.tensor([0, 4, 2]), torch.tensor([5, 1, 1]),
                           torch.randn(3, 3)), PRINTERS[printer])


@pytest.mark.parametrize("printer", PRINTERS)
def test_index_put_accumulate_adds_duplicates(printer):
    idx = torch.tensor([1, 4, 1, 1, 0, 4])
    _run_both(_index_put_accumulate, (torch.randn(6, 5, dtype=torch.float64), idx, torch.randn(6, 5, dtype=torch.float64)),
              PRINTERS[printer])
    _run_both(_index_put_accumulate, (torch.zeros(6, 5, dtype=torch.int64), idx, torch.randint(-9, 9, (6, 5))),
              PRINTERS[printer])


@pytest.mark.parametrize("printer", PRINTERS)
def test_negative_indices_count_from_the_end(printer):
    _run_both(_negative_index, (torch.randn(5, 4), torch.tensor([-1, 1]), torch.randn(2, 4)), PRINTERS[printer])


@pytest.mark.parametrize("printer", PRINTERS)
def test_computed_values_fuse_into_the_write(printer):
    inputs = (torch.randn(9, 4), torch.tensor([7, 2]), torch.randn(2, 4), torch.randn(4))
    _run_both(_index_put_fused, inputs, PRINTERS[printer])
    _, sched = _schedule(_index_put_fused, *inputs)
    [store] = _scatter_stores(sched)
    kernel = next(k for k in sched.steps if isinstance(k, ir.Kernel) and any(store in st.body for st in k.stages))
    assert not any(isinstance(s, ir.Store) and not s.indirect for st in kernel.stages for s in st.body), kernel


@pytest.mark.parametrize("printer", PRINTERS)
def test_static_kv_cache_over_positions(printer):
    """The cache buffers are mutated as eager mutates them, position after position."""
    torch.manual_seed(0)
    eager, model = StaticCache(), StaticCache()
    model.load_state_dict(eager.state_dict())
    compiled = kiln.compile(model, options=PRINTERS[printer])
    for position in (0, 1, 5, 11):
        q, k, v = (torch.randn(2, 3, 1, 8) for _ in range(3))
        pos = torch.tensor([position])
        mask = (torch.arange(12) <= position).view(1, 1, 1, 12)
        expected = eager(q, k, v, pos, mask)
        torch.testing.assert_close(compiled(q, k, v, pos, mask), expected)
        torch.testing.assert_close(model.k_cache, eager.k_cache)
        torch.testing.assert_close(model.v_cache, eager.v_cache)


def _setitem_write(k_cache, pos, new, q):     # StaticCache's fallback where index_copy_ is refused
    k_cache[:, :, pos] = new
    return (q @ k_cache.transpose(-1, -2)).softmax(-1)


@pytest.mark.parametrize("printer", PRINTERS)
def test_a_cache_written_by_setitem_at_a_position_tensor(printer):
    compiled = kiln.compile(_setitem_write, options=PRINTERS[printer])
    k, k_eager = torch.zeros(2, 3, 12, 8), torch.zeros(2, 3, 12, 8)
    for position in (3, 0, 11):
        pos, new, q = torch.tensor([position]), torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
        torch.testing.assert_close(compiled(k, pos, new, q), _setitem_write(k_eager, pos, new, q))
        torch.testing.assert_close(k, k_eager)


# ---------------------------------------------------------------------------- what is generated

def _kv_inputs():
    return (torch.zeros(2, 3, 12, 8), torch.tensor([4]), torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8))


def _kv_update(k_cache, pos, new, q):
    k_cache.index_copy_(2, pos, new)
    return (q @ k_cache.transpose(-1, -2)).softmax(-1)


@pytest.mark.parametrize("printer", [None, triton_printer], ids=["cpp", "triton"])
def test_a_cache_write_is_one_scatter_into_the_input(printer):
    """No extern index kernel, and no kernel writes the cache whole: one store at the loaded
    position writes the new row (B*H*D elements) into the input's own storage."""
    graph, sched = _schedule(_kv_update, *_kv_inputs(), printer=printer)
    assert not _index_externs(sched), sched
    [store] = _scatter_stores(sched)
    scatter = next(n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.buffer == store.buffer)
    assert scatter.body.into == graph.inputs[0]           # the cache input itself
    assert ir.product(scatter.body.ranges) == 2 * 3 * 8   # one position's key for each batch and head
    cache_numel = 2 * 3 * 12 * 8
    buffers = graph.buffer_map()
    whole = [s for k in sched.steps if isinstance(k, ir.Kernel) for st in k.stages for s in st.body
             if isinstance(s, ir.Store) and not s.indirect and buffers[s.buffer].numel == cache_numel]
    assert not whole, whole                               # no copy of the cache


def test_the_host_program_binds_the_written_cache_to_the_input():
    (gm, examples), _ = prim_graphs(_kv_update, *_kv_inputs())
    call = compile_prim_graph(gm, examples, use_cache=False)
    k = torch.zeros(2, 3, 12, 8)
    _, written = call(k, *_kv_inputs()[1:])
    assert written.data_ptr() == k.data_ptr()             # the epilogue has nothing to copy back


def test_an_accumulating_write_into_an_input_copies_it_once():
    """accumulate=True is not made in place ([Note: writes into inputs in place]): one copy of the
    input, then the atomic adds into it; still no extern."""
    x, idx, v = torch.randn(8, 5), torch.tensor([1, 1, 6]), torch.randn(3, 5)
    _, sched = _schedule(_index_put_accumulate, x, idx, v)
    assert not _index_externs(sched), sched
    [store] = _scatter_stores(sched)
    assert store.accumulate
    assert "atomic_add" in str(store)


def test_out_of_range_indices_raise_and_write_nothing():
    """An index past the dim raises, as eager's ([Note: index bounds checks] in lowering_reduce),
    and nothing is written, out of bounds or in: the in-place scatter's kernel checks every index
    before it writes ([Note: a scatter into an input checks before it writes] in cpp.py)."""
    x = torch.zeros(4, 3)
    guard = torch.zeros(64, 3)          # memory after x, if a write strayed
    (gm, examples), _ = prim_graphs(_negative_index, x, torch.tensor([1, 1]), torch.ones(2, 3))
    call = compile_prim_graph(gm, examples, use_cache=False)
    with pytest.raises(IndexError, match="index out of range"):
        call(x, torch.tensor([2, 40]), torch.ones(2, 3))
    assert x.eq(0).all() and guard.eq(0).all()


def test_dynamic_sizes_write_into_the_input(monkeypatch, tmp_path):
    """Under dynamic=True the graph reads the cache's sizes (`sym_size`): still written in place,
    one scatter and no copy of the cache, for any length, batch and number of positions."""
    from kiln.codegen import compile as compile_module
    schedules, scheduler = [], compile_module.schedule

    def keep(graph):
        schedules.append((graph, scheduler(graph)))
        return schedules[-1][1]
    monkeypatch.setattr(compile_module, "schedule", keep)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))      # compiled here, not found in the cache
    compiled = kiln.compile(_kv_update, dynamic=True)
    for b, s, n in ((2, 12, 1), (2, 20, 1), (4, 16, 5)):
        k, k_eager = torch.zeros(b, 3, s, 8), torch.zeros(b, 3, s, 8)
        pos, new, q = torch.arange(n) + 2, torch.randn(b, 3, n, 8), torch.randn(b, 3, n, 8)
        torch.testing.assert_close(compiled(k, pos, new, q), _kv_update(k_eager, pos, new, q))
        torch.testing.assert_close(k, k_eager)
    assert schedules
    for graph, sched in schedules:
        [store] = _scatter_stores(sched)
        scatter = next(n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.buffer == store.buffer)
        assert scatter.body.into == graph.inputs[0]
        assert not _index_externs(sched)
