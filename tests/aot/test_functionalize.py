"""Functionalization: in-place ops and writes through views, compared with eager.

Each program runs eagerly on one copy of its inputs and through aot_compile (forward and backward
as FX graphs) on another; outputs, mutated inputs and aliasing must agree.
"""
import pytest
import torch

from kiln.aot import aot_compile, functionalize, trace_joint
from kiln.aot.schema import effects


def _compile(fn, inputs):
    gm = torch.fx.symbolic_trace(fn)
    return aot_compile(gm, inputs, fw_compiler=lambda g, _: g.forward, bw_compiler=lambda g, _: g.forward)


def _clones(inputs):
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
            for x in inputs]


def _check(fn, inputs):
    """Run eager and compiled on copies; compare outputs and (possibly mutated) inputs."""
    eager_in, compiled_in = _clones(inputs), _clones(inputs)
    expected = fn(*eager_in)
    got = _compile(fn, _clones(inputs))(*compiled_in)
    torch.testing.assert_close(got, expected)
    for a, b in zip(compiled_in, eager_in):
        torch.testing.assert_close(a, b)
    return got, compiled_in


def _shares_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def inplace_on_input(x):
    x.add_(1)
    return x * 2


def inplace_on_view_of_input(x):
    x[0].mul_(3)
    x.t()[1].add_(1)
    return x.sum(0)


def inplace_on_view_of_intermediate(x):
    y = x * 2
    y[:, 1].zero_()
    y.view(-1)[0:3].add_(10)
    return y


def inplace_through_split(x):
    a, b = x.split(2)
    a.add_(1)
    b[0].mul_(-1)
    return x + 0


def out_variant(x, y, z):
    torch.add(x, y, out=z)
    return z * 1


def write_then_read_alias(x):
    v = x.view(-1)
    x.mul_(2)
    return v + 1


@pytest.mark.parametrize("fn", [inplace_on_input, inplace_on_view_of_input, inplace_on_view_of_intermediate,
                                inplace_through_split, write_then_read_alias])
def test_mutations_match_eager(fn):
    _check(fn, [torch.randn(4, 4)])


def test_out_variant_writes_its_out_argument():
    _check(out_variant, [torch.randn(3), torch.randn(3), torch.empty(3)])


def test_functional_graph_writes_nothing():
    gm = torch.fx.symbolic_trace(inplace_on_view_of_intermediate)
    joint = functionalize(trace_joint(gm, [torch.randn(4, 4)]))
    for node in joint.gm.graph.nodes:
        assert not effects(node.target).mutated, f"{node.target} still writes into its input"
    assert joint.output_indices("mutation") == []


def outputs_alias_inputs(x):
    return x, x.view(-1), x.t()


def test_outputs_alias_inputs_as_in_eager():
    x = torch.randn(3, 4)
    same_x, flat, transposed = _compile(outputs_alias_inputs, [x])(x)
    assert same_x is x
    assert _shares_storage(flat, x) and _shares_storage(transposed, x)
    assert transposed.stride() == x.t().stride()
    flat[0] = 100.0   # a write through the returned view reaches the input, as in eager
    assert x[0, 0] == 100.0


def outputs_alias_each_other(x):
    y = x + 1
    return y, y[0], y.t()


def test_outputs_alias_each_other_as_in_eager():
    x = torch.randn(3, 4, requires_grad=True)
    got, _ = _check(outputs_alias_each_other, [x])
    y, row, transposed = got
    assert _shares_storage(y, row) and _shares_storage(y, transposed)


def test_mutated_input_requiring_grad_gives_eager_gradients():
    def program(a, w):
        a.mul_(w)
        return (a * a).sum()

    p, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    grads = []
    for run in (program, _compile(program, [p.detach().clone().requires_grad_() * 1, w])):
        p.grad = w.grad = None
        a = p * 1.0          # a non-leaf: eager allows the in-place write
        loss = run(a, w)
        loss.backward()
        grads.append((loss.detach(), a.detach(), p.grad.clone(), w.grad.clone()))
    torch.testing.assert_close(grads[1], grads[0])


def test_batchnorm_running_stats_written_back():
    bn = torch.nn.Sequential(torch.nn.BatchNorm1d(4)).train()
    ref = torch.nn.Sequential(torch.nn.BatchNorm1d(4)).train()
    x = torch.randn(8, 4, requires_grad=True)
    compiled = _compile(bn, [x])
    for _ in range(2):
        torch.testing.assert_close(compiled(x), ref(x))
    for a, b in zip(bn.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b)


def _grad_mode_graph() -> torch.fx.GraphModule:
    """y = x * 2; with no_grad: z = x + 1; return y, z, y.detach(), x.argmax(), y.sum() -- built by
    hand, because fx.symbolic_trace runs `no_grad` instead of recording it (kiln's capture records
    grad-mode changes as `torch._C._set_grad_enabled` calls, as here)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.mul, (x, 2))
    g.call_function(torch._C._set_grad_enabled, (False,))
    z = g.call_function(torch.add, (x, 1))
    g.call_function(torch._C._set_grad_enabled, (True,))
    g.output((y, z, g.call_method("detach", (y,)), g.call_method("argmax", (x,)), g.call_method("sum", (y,))))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_requires_grad_as_eager():
    gm = _grad_mode_graph()
    x = torch.randn(6, requires_grad=True)
    expected = gm(x)
    assert not expected[1].requires_grad
    got = aot_compile(gm, [x], fw_compiler=lambda g, _: g.forward, bw_compiler=lambda g, _: g.forward)(x)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]
    torch.testing.assert_close(got, expected)


def test_double_backward_is_a_clear_error():
    x = torch.randn(4, requires_grad=True)
    loss = _compile(lambda t: (t.sin() ** 2).sum(), [x])(x)
    (g,) = torch.autograd.grad(loss, x)   # first order works
    torch.testing.assert_close(g, 2 * x.sin() * x.cos())
    loss = _compile(lambda t: (t.sin() ** 2).sum(), [x])(x)
    with pytest.raises(Exception, match="double backward"):
        torch.autograd.grad(loss, x, create_graph=True)


def test_bf16_autocast_matches_eager():
    def program(x, w):
        return torch.nn.functional.linear(x, w).relu().sum(-1)

    x, w = torch.randn(4, 8), torch.randn(3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = program(x, w)
        compiled = _compile(program, [x, w])
        got = compiled(x, w)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)
    (ge,) = torch.autograd.grad(expected.float().sum(), w)
    (gg,) = torch.autograd.grad(got.float().sum(), w)
    torch.testing.assert_close(gg, ge)


def test_unsupported_input_mutations_are_refused_plainly():
    from kiln.errors import NotYetImplemented

    with pytest.raises(NotYetImplemented, match="sizes or strides of an input"):
        _compile(lambda x: x.t_() * 1, [torch.randn(2, 3)])
    base = torch.randn(4)
    with pytest.raises(NotYetImplemented, match="share memory"):
        _compile(lambda a, b: a.add_(b), [base[:2], base[2:]])


def test_metadata_mutation_of_an_intermediate_is_fine():
    _check(lambda x: (x * 2).t_().unsqueeze_(0) + 1, [torch.randn(2, 3)])


def test_write_into_a_plain_tensor_attribute_is_refused():
    from kiln.errors import NotYetImplemented

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.count = torch.zeros(1)   # not a buffer: kiln cannot write it back

        def forward(self, x):
            self.count.add_(1)
            return x * self.count

    with pytest.raises(NotYetImplemented, match="register_buffer"):
        aot_compile(Counter(), [torch.randn(3)], fw_compiler=lambda g, _: g.forward,
                    bw_compiler=lambda g, _: g.forward)


@pytest.mark.parametrize("fake", [True, False])
def test_recorded_values_survive_later_inplace_metadata_changes(fake):
    # at::matmul computes vector @ matrix as unsqueeze(0).mm(w).squeeze_(0): the mm's recorded value
    # must keep the mm's own shape (1, 4), not follow the later squeeze_ of the same tensor
    gm = torch.fx.symbolic_trace(lambda x, w: (torch.matmul(x, w) * 2, (x.unsqueeze(0) * 3).t_()))
    joint = trace_joint(gm, [torch.randn(3), torch.randn(3, 4)], fake=fake)
    values = {n: n.meta["val"] for n in joint.gm.graph.nodes if n.op == "call_function"}
    mm = [v for n, v in values.items() if n.target is torch.ops.aten.mm.default]
    assert [tuple(v.shape) for v in mm] == [(1, 4)]
    # the mul's own layout, recorded before t_ transposed that tensor in place
    muls = [v for n, v in values.items() if n.target is torch.ops.aten.mul.Tensor and v.dim() == 2]
    assert [(tuple(v.shape), v.stride()) for v in muls] == [((1, 3), (3, 1))]
    out = joint.gm(torch.randn(3), torch.randn(3, 4))
    assert out[0].shape == (4,) and out[1].shape == (3, 1)


def test_recorded_tuple_values_survive_later_inplace_metadata_changes():
    # a multi-output op's record is a tuple of its outputs' metadata: a later t_ of one output
    # must not show in it ([Note: traced fakes as their own records])
    def fn(x):
        a, b = torch.ops.aten.unbind.int(x * 2)
        return a.unsqueeze_(0) + 1, b
    joint = trace_joint(torch.fx.symbolic_trace(fn), [torch.randn(2, 3)])
    unbinds = [n for n in joint.gm.graph.nodes if n.target is torch.ops.aten.unbind.int]
    assert [[tuple(v.shape) for v in n.meta["val"]] for n in unbinds] == [[(3,), (3,)]]
    items = [n.meta["val"] for n in joint.gm.graph.nodes if n.target is __import__("operator").getitem]
    assert [tuple(v.shape) for v in items] == [(3,), (3,)]
    _check(fn, [torch.randn(2, 3)])
