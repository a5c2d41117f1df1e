"""[Note: one buffer per value] in kiln/codegen/lowering.py: a cheap value that an extern and a graph
output both need whole is computed into one buffer, not once for each."""
import torch

import kiln
import kiln.prims  # noqa: F401  (registers the prims)
from kiln.codegen import ir
from kiln.codegen.lowering import lower_graph

prims = torch.ops.kiln_prims


def _cast_feeding_a_matmul_and_saved(x, w):
    wb = prims.convert_element_type.default(w, torch.float64)
    xb = prims.convert_element_type.default(x, torch.float64)
    return prims.mm.default(xb, wb), wb       # the second output: saved for a backward


def _casts(graph: ir.Graph) -> list[str]:
    return [n.buffer for n in graph.nodes if isinstance(n, ir.ComputedBuffer)
            and "to_dtype[float64](load(arg1" in str(n.body)]


def test_a_cast_fed_to_an_extern_and_saved_is_computed_once():
    gm = torch.fx.symbolic_trace(_cast_feeding_a_matmul_and_saved)
    gm.meta["kiln_user_outputs"] = 1
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    graph, _ = lower_graph(gm, [x, w])
    casts = _casts(graph)
    assert len(casts) == 1, [str(n) for n in graph.nodes]
    assert graph.outputs[1] == casts[0]


def test_conv_bn_training_under_autocast_equals_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(8)).to(memory_format=torch.channels_last)
    reference = [p.detach().clone() for p in model.state_dict().values()]
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)

    def step(fn):
        for p in model.parameters():
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(x)
        y.float().square().sum().backward()
        return y.float(), [p.grad.clone() for p in model.parameters()], \
            [b.clone() for b in model.buffers()]

    kiln.reset()
    got = step(kiln.compile(model))
    for t, r in zip(model.state_dict().values(), reference):   # running stats back to their start
        t.copy_(r)
    want = step(model)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
