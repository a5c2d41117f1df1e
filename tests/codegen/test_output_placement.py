"""[Note: outputs realized where they are computed] in kiln/codegen/lowering.py: a returned value no
node stored is stored just after what it reads, not after the graph's last node, when it is no
bigger than what it reads."""
import torch

import kiln
import kiln.prims  # noqa: F401  (registers the prims)
from kiln.codegen import ir
from kiln.codegen.lowering import lower_graph

prims = torch.ops.kiln_prims


def _scores_saved_then_more_layers(x, w):
    s = prims.mm.default(x, w)
    saved = prims.exp.default(s)                   # read by nothing in the graph: returned for a backward
    h = prims.mm.default(prims.sin.default(s), w)
    return prims.mm.default(h, w), saved, prims.convert_element_type.default(h, torch.float64)


def _writer_positions(graph: ir.Graph) -> dict[str, int]:
    return {b: i for i, n in enumerate(graph.nodes)
            for b in (n.outputs if isinstance(n, ir.ExternKernel) else (n.buffer,))}


def test_a_returned_value_is_stored_where_what_it_reads_is_made():
    gm = torch.fx.symbolic_trace(_scores_saved_then_more_layers)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    graph, _ = lower_graph(gm, [x, w])
    at = _writer_positions(graph)
    mms = [i for i, n in enumerate(graph.nodes) if isinstance(n, ir.ExternKernel)]
    assert len(mms) == 3, [str(n) for n in graph.nodes]
    saved, widened = graph.outputs[1], graph.outputs[2]
    assert mms[0] < at[saved] < mms[1], [str(n) for n in graph.nodes]   # its input may die before the next layer
    assert at[widened] > mms[2], "a value bigger than what it reads stays at the end"


def test_the_moved_output_equals_eager():
    fn = lambda x, w: (lambda s: ((s.sin() @ w) @ w, s.exp()))(x @ w)   # noqa: E731
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    got, expected = kiln.compile(fn, fullgraph=True)(x, w), fn(x, w)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_two_outputs_with_equal_values_are_distinct_tensors():
    """Two zero fills (fuzz seed 5628) lowered to one buffer: a write into one output changed the
    other, and autograd marking one non-differentiable marked both."""
    def fn(x):
        z = torch.zeros_like(x)
        y = x.clone()
        y.zero_()
        return z, y
    x = torch.randn(5, 4, requires_grad=True)
    z, y = kiln.compile(fn)(x)
    assert z.data_ptr() != y.data_ptr() and not z.requires_grad and y.requires_grad
    z.add_(1)
    assert y.detach().eq(0).all()
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x))
