"""The runtime: parameters read at each call, symbolic sizes, inference calls, and pytree outputs."""
import copy

import pytest
import torch

import kiln
from kiln.aot import aot_compile, trace_joint
from kiln.symbolic import FakeTensorMode


def _compile(fn, inputs):
    gm = fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)
    return aot_compile(gm, inputs, fw_compiler=lambda g, _: g.forward, bw_compiler=lambda g, _: g.forward)


def test_optimizer_updates_are_seen(aot_backend):
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=aot_backend)
    x = torch.randn(5, 6)
    for m, opt in ((reference, torch.optim.SGD(reference.parameters(), lr=0.1)),
                   (compiled, torch.optim.SGD(model.parameters(), lr=0.1))):
        for _ in range(3):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    assert aot_backend.runtimes
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def _dynamic_program(x, w):
    h = (x @ w).relu()
    return h.reshape(x.shape[0] * w.shape[1]).sum() + h.mean(0).sum()


def test_parameters_and_buffers_are_read_from_their_modules_at_each_call(aot_backend):
    """The runtime reads each parameter and buffer from its owning dict at every call: a new
    tensor assigned to `.data`, a buffer replaced in place of the old one, are what it uses."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    compiled = kiln.compile(model, backend=aot_backend)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.data = torch.randn(4, 4)
        model[1].running_mean.copy_(torch.randn(4))
        model[1].running_var = torch.rand(4) + 0.5
        torch.testing.assert_close(compiled(x), model(x))
    assert aot_backend.runtimes


def test_symbolic_batch_size():
    mode = FakeTensorMode()
    w = torch.randn(5, 3, requires_grad=True)
    fake_x = mode.from_real(torch.randn(6, 5), source="x", dynamic_dims=[0])
    fake_w = mode.from_real(w, source="w")
    gm = torch.fx.symbolic_trace(_dynamic_program)
    joint = trace_joint(gm, [fake_x, fake_w])
    assert any(n.target is torch.ops.aten.sym_size.int for n in joint.gm.graph.nodes)
    compiled = _compile(gm, [fake_x, fake_w])
    for batch in (6, 9, 2):
        x = torch.randn(batch, 5)
        (expected_grad,) = torch.autograd.grad(expected := _dynamic_program(x, w), w)
        (got_grad,) = torch.autograd.grad(got := compiled(x, w), w)
        torch.testing.assert_close((got, got_grad), (expected, expected_grad))


def test_no_grad_call_runs_the_forward_only():
    w = torch.randn(4, 4, requires_grad=True)
    compiled = _compile(lambda x, w: {"out": (x @ w).sigmoid(), "n": [x.sum()]}, [torch.randn(2, 4), w])
    x = torch.randn(2, 4)
    with torch.no_grad():
        got = compiled(x, w)
    assert not got["out"].requires_grad
    torch.testing.assert_close(got, {"out": (x @ w).sigmoid(), "n": [x.sum()]})


def test_traces_on_fakes_without_compute():
    x = torch.randn(3, 3, requires_grad=True)
    joint = trace_joint(torch.fx.symbolic_trace(lambda t: (t * 2).exp().sum()), [x])
    assert joint.traced_on == "fake"
    val = next(n for n in joint.gm.graph.nodes if n.op == "call_function").meta["val"]
    assert type(val).__name__ == "FakeTensor"


@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_zoo_model_traced_once_with_a_symbolic_batch(name):
    """Traced on fakes whose batch is a symbol; run for real at other batch sizes."""
    from kiln.bench.zoo import ZOO, loss_of

    def train_copy(batch=None):
        model, inputs = ZOO[name].make("cpu", batch=batch)
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        return model.train(), inputs

    model, inputs = train_copy()
    mode = FakeTensorMode()
    fakes = [mode.from_real(x, source=f"x{i}", dynamic_dims=[0]) for i, x in enumerate(inputs)]
    compiled = _compile(torch.fx.symbolic_trace(model), fakes)
    for batch in (3, 5):
        reference, real_inputs = train_copy(batch)
        expected = loss_of(reference(*real_inputs))
        expected.backward()
        model.zero_grad()
        got = loss_of(compiled(*real_inputs))
        got.backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close([p.grad for p in model.parameters()], [p.grad for p in reference.parameters()],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("grad", [False, True])
def test_an_fp32_matmul_the_model_keeps_out_of_autocast_stays_fp32(backend, grad):
    # LLaMA's rotary frequencies: inside a bf16 autocast block, a matmul under autocast(enabled=False).
    # The compiled graph holds autocast's choices already; run under the caller's autocast, its mm would
    # be cast to bf16 a second time (GPT-NeoX's generate() then picked other tokens).
    def f(x, w):
        with torch.autocast("cpu", enabled=False):
            freqs = x.float() @ w.float()
        return torch.cos(freqs) + (x @ w).float()

    torch.manual_seed(0)
    x, w = torch.randn(16, 32), (torch.randn(32, 24) * 3).requires_grad_(grad)
    kiln.reset()
    compiled = kiln.compile(f, backend=backend)
    with torch.autocast("cpu", torch.bfloat16):
        want, got = f(x, w), compiled(x, w)
    assert got.dtype == want.dtype == torch.float32
    # the fp32 part alone: the bf16 matmul agrees to bf16's precision in both
    keep = torch.cos(x @ w)
    torch.testing.assert_close(got - (x.bfloat16() @ w.bfloat16()).float(), keep, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    if grad:
        g_want, = torch.autograd.grad(want.sum(), w)
        g_got, = torch.autograd.grad(got.sum(), w)
        torch.testing.assert_close(g_got, g_want, rtol=2e-2, atol=2e-2)


def test_the_forward_program_is_told_which_inputs_have_concrete_sizes():
    """`kiln_concrete_size` (forward_meta): inputs traced without a symbol in their sizes. A CUDA
    graph compares only the addresses of those; one with a symbolic size must not be among them."""
    mode = FakeTensorMode()
    fake_x = mode.from_real(torch.randn(6, 5), source="x", dynamic_dims=[0])
    fake_w = mode.from_real(torch.randn(5, 3), source="w")
    meta = {}

    def forward_compiler(gm, _):
        meta.update(gm.meta)
        return gm.forward
    aot_compile(torch.fx.symbolic_trace(_dynamic_program), [fake_x, fake_w], fw_compiler=forward_compiler,
                bw_compiler=lambda gm, _: gm.forward)
    assert meta["kiln_concrete_size"] == (1,)


def test_an_inference_call_writes_back_inputs_the_program_did_not_write_in_place():
    """The epilogue's plan: a mutated input whose new value is another tensor is copied into, under
    no_grad and with grad on; the user's outputs keep their pytree."""
    def program(x, counter):
        counter.add_(1)
        return {"y": x * counter, "sum": [x.sum()]}
    x, counter = torch.randn(3), torch.zeros(())
    compiled = _compile(program, [x, counter.clone()])
    for k in range(1, 4):
        with torch.no_grad():
            got = compiled(x, counter)
        assert counter.item() == k
        torch.testing.assert_close(got, {"y": x * k, "sum": [x.sum()]})
    got = compiled(x, counter)
    assert counter.item() == 4
    torch.testing.assert_close(got, {"y": x * 4, "sum": [x.sum()]})
