"""The cut of a captured graph at DDP's gradient buckets (kiln/capture/buckets.py), without processes:
`plan` on captured graphs, and `build`'s pieces run against the whole graph."""
from __future__ import annotations

import torch

import kiln
from kiln.capture import buckets


class Stack(torch.nn.Module):
    def __init__(self, width=32, layers=6, autocast_layer=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.autocast_layer = autocast_layer

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i == self.autocast_layer:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    x = torch.relu(layer(x)).float()
            else:
                x = torch.relu(layer(x))
        return x.sum()


def _graph(model, x):
    graphs = []
    kiln.compile(model, backend=lambda gm, ex: graphs.append(gm) or gm.forward)(x)
    assert len(graphs) == 1
    return graphs[0]


def _synced(model):
    return {id(p) for p in model.parameters()}


def test_pieces_fill_buckets_from_the_output_back():
    model = Stack()
    gm = _graph(model, torch.randn(4, 32))
    layer = 32 * 32 * 4 + 32 * 4   # bytes of one Linear
    pieces = buckets.plan(gm, _synced(model), first_bucket=layer, bucket=2 * layer)
    # the tail fills the first bucket with one layer, then two layers a piece
    assert [len(params) for _, params, _ in pieces] == [2, 4, 4, 2]
    assert [nbytes for _, _, nbytes in pieces] == [layer, 2 * layer, 2 * layer, layer]
    assert pieces[-1][1] == ["self_layers_5_weight", "self_layers_5_bias"]
    # every compute node is in exactly one piece, in the graph's order
    nodes = [n for piece, _, _ in pieces for n in piece]
    assert nodes == [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def test_no_cut_inside_an_autocast_region():
    model = Stack(autocast_layer=3)
    gm = _graph(model, torch.randn(4, 32))
    pieces = buckets.plan(gm, _synced(model), first_bucket=1, bucket=1)   # a cut wherever one may go
    enter = torch.amp.autocast_mode._enter_autocast
    for nodes, _, _ in pieces:
        depth = 0
        for n in nodes:
            depth += {enter: 1, torch.amp.autocast_mode._exit_autocast: -1}.get(n.target, 0)
        assert depth == 0, [n.name for n in nodes]
    assert len(pieces) >= 5


def test_pieces_compute_the_graph():
    model = Stack()
    x = torch.randn(4, 32, requires_grad=True)
    gm = _graph(model, x)
    pieces = buckets.plan(gm, _synced(model), first_bucket=1, bucket=1)
    calls = []
    run = buckets.build(gm, [x], pieces, lambda piece, ex: calls.append(piece) or piece.forward)
    assert len(calls) == len(pieces) == 6
    out, = run(x)
    out.backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    model(x).backward()
    for got, want in zip(grads, [p.grad for p in model.parameters()] + [x.grad]):
        torch.testing.assert_close(got, want)


class SizeAcross(torch.nn.Module):
    """A size read in the first layer and used in the last: with symbolic sizes, a SymInt node."""

    def __init__(self):
        super().__init__()
        self.first, self.last = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        n = x.size(0)
        h = torch.relu(self.first(x))
        return self.last(h).reshape(n * 8).sum()


def test_sizes_are_recomputed_not_passed_between_pieces():
    model = SizeAcross()
    x = torch.randn(4, 8)
    graphs = []
    kiln.compile(model, backend=lambda gm, ex: graphs.append(gm) or gm.forward, dynamic=True)(x)
    gm, = graphs
    pieces = buckets.plan(gm, _synced(model), first_bucket=1, bucket=1)
    assert len(pieces) == 2
    modules = []
    run = buckets.build(gm, [x], pieces, lambda piece, ex: modules.append((piece, ex)) or piece.forward)
    for piece, examples in modules:     # only tensors cross: the size is read again in the piece using it
        assert all(isinstance(e, torch.Tensor) for e in examples), piece.code
    for n in (4, 6):
        y = torch.randn(n, 8)
        torch.testing.assert_close(run(y)[0], model(y))
