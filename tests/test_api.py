"""The public API of kiln (DESIGN.md's user contract): argument checks, OptimizedModule's shared
state, the backend registry and its torch.compile entry point, and compiler-error handling."""
import importlib.metadata
import os

import pytest
import torch

import kiln
from kiln.errors import CompileStageError, InvalidOption, Unsupported


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="fastest"), "mode='fastest'"),
    (dict(dynamic="yes"), "dynamic must be"),
    (dict(fullgraph=1), "fullgraph must be"),
    (dict(backend="nope"), "unknown backend 'nope'"),
    (dict(backend=42), "backend must be a name or a callable"),
    (dict(options={"no_such_option": 1}), "unknown option 'no_such_option'"),
    (dict(options={"on_error": "ignore"}), "on_error"),
    (dict(options=[("on_error", "eager")]), "options must be a dict"),
    (dict(mode="reduce-overhead", backend="eager"), "applies to the kiln backend only"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(InvalidOption, match=message.replace("(", r"\(")):
        kiln.compile(small_model(), **kwargs)


def test_not_callable_is_rejected():
    with pytest.raises(InvalidOption, match="function or an nn.Module"):
        kiln.compile(3)


def test_optimized_module_shares_state_with_original():
    model = small_model()
    fast = kiln.compile(model, backend="eager")
    assert isinstance(fast, kiln.OptimizedModule)
    assert list(fast.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(fast.parameters(), model.parameters()))
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in model.named_parameters()]
    x = torch.randn(3, 8)
    torch.testing.assert_close(fast(x), model(x))
    # Loading through the wrapper changes the original, and the compiled call sees it.
    new_state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    fast.load_state_dict(new_state)
    torch.testing.assert_close(model[0].weight, new_state["0.weight"])
    torch.testing.assert_close(fast(x), model(x))
    fast.eval()
    assert not model.training and not model[0].training
    fast.train()
    assert model.training
    model.custom_attribute = "kept"  # attributes the wrapper lacks come from the original
    assert fast.custom_attribute == "kept" and fast._orig_mod is model


def test_optimizer_through_wrapper_updates_original():
    model = small_model()
    reference = small_model()
    fast = kiln.compile(model, backend="eager")
    opt = torch.optim.SGD(fast.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(5, 8)
    for m, o in ((fast, opt), (reference, ref_opt)):
        m(x).square().sum().backward()
        o.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_function_and_decorator_forms():
    def f(x, y):
        return torch.sin(x) * y + 1

    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x, y), f(x, y))

    @kiln.compile(backend="eager")
    def g(x):
        return x.relu() - 2

    torch.testing.assert_close(g(x), x.relu() - 2)

    @kiln.compile
    def h(x):
        return x * 3

    assert callable(h)


def test_custom_backend_callable_receives_graph_and_inputs():
    seen = []

    def recording_backend(gm, example_inputs):
        seen.append((gm, [tuple(t.shape) for t in example_inputs]))
        return gm.forward

    def f(x, y):
        return (x @ y).tanh()

    x, y = torch.randn(3, 5), torch.randn(5, 2)
    out = kiln.compile(f, backend=recording_backend)(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert len(seen) == 1
    gm, shapes = seen[0]
    assert isinstance(gm, torch.fx.GraphModule) and shapes == [(3, 5), (5, 2)]
    assert any(n.op == "call_function" for n in gm.graph.nodes)


def test_registry_lists_and_registers():
    assert {"eager", "aot_eager", "kiln"} <= set(kiln.list_backends())

    calls = []

    @kiln.register_backend("test_counting")
    def counting(gm, example_inputs, options):
        calls.append(options.on_error)
        return gm.forward

    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(lambda t: t + 1, backend="test_counting")(x), x + 1)
    assert calls == ["raise"] and "test_counting" in kiln.list_backends()


def test_torch_compile_entry_point_names_kiln_backend():
    entries = {e.name: e for e in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    assert "kiln" in entries
    assert entries["kiln"].load() is kiln.backends.kiln_backend
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("kiln") is kiln.backends.kiln_backend


def crashing_backend(gm, example_inputs):
    raise RuntimeError("boom in the backend")


def test_compiler_bug_names_stage_and_writes_repro(tmp_path):
    f = kiln.compile(lambda x: x * 2, backend=crashing_backend, options={"debug_dir": str(tmp_path)})
    with pytest.raises(CompileStageError, match="boom in the backend") as info:
        f(torch.randn(3))
    assert info.value.repro and os.path.exists(info.value.repro)
    assert "on_error" in str(info.value)


def test_on_error_eager_falls_back_with_warning():
    x = torch.randn(3)
    f = kiln.compile(lambda x: x * 2, backend=crashing_backend, options={"on_error": "eager"})
    with pytest.warns(UserWarning, match="running eagerly"):
        out = f(x)
    torch.testing.assert_close(out, x * 2)


def data_dependent(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def test_graph_break_runs_eagerly_and_fullgraph_raises():
    x = torch.ones(3)
    with pytest.warns(UserWarning):
        torch.testing.assert_close(kiln.compile(data_dependent, backend="eager")(x), x + 1)
    torch.testing.assert_close(kiln.compile(data_dependent, backend="eager")(-x), -x - 1)
    with pytest.raises(Unsupported):
        kiln.compile(data_dependent, backend="eager", fullgraph=True)(x)


def test_reset_forces_recompile():
    count = []

    def backend(gm, example_inputs):
        count.append(1)
        return gm.forward

    f = kiln.compile(lambda x: x.cos(), backend=backend)
    x = torch.randn(4)
    f(x)
    f(x)
    assert len(count) == 1
    kiln.reset()
    f(x)
    assert len(count) == 2


def test_torch_compile_with_kiln_backend_matches_eager():
    def f(x, y):
        return (x.sin() @ y).relu().sum(1)

    x, y = torch.randn(4, 5), torch.randn(5, 3)
    torch.testing.assert_close(torch.compile(f, backend="kiln")(x, y), f(x, y))
    model = small_model()
    out = torch.compile(model, backend="kiln")(torch.randn(6, 8, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(out, model(torch.randn(6, 8, generator=torch.Generator().manual_seed(1))))


def test_torch_compile_dynamic_with_kiln_backend_matches_eager():
    # dynamo hands its own SymInts and symbolic fakes: kiln compiles per layout of the real arguments
    def f(x, y):
        return (x * 2 + y).relu().sum(-1)

    compiled = torch.compile(f, backend="kiln", dynamic=True)
    for n in (4, 7, 9):
        x, y = torch.randn(n, 5), torch.randn(n, 5)
        torch.testing.assert_close(compiled(x, y), f(x, y))


def test_saved_tensor_hooks_of_the_caller_see_real_tensors_only():
    # Capture and the aot trace run autograd on fake tensors; the caller's hooks (activation
    # offloading, a storage-pointer hook) must not see them, and must see every real saved tensor.
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    packed = []

    def pack(t):
        packed.append(t.untyped_storage().data_ptr())   # fails on a fake tensor
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        eager_packed, packed[:] = len(packed), []
        model.zero_grad()
        kiln.compile(model, fullgraph=True)(x).sum().backward()
    assert packed, "the compiled step saved nothing through the caller's hooks"
    assert len(packed) <= eager_packed
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


def test_any_callable_compiles_as_torch_compile_accepts_it():
    """A builtin (`torch.polar`), a functools.partial and an object with `__call__` compile like a
    function (they were refused: "kiln captures Python functions and nn.Modules")."""
    import functools

    class Doubler:
        def __call__(self, x):
            return x.cos() * 2
    a, b = torch.rand(5), torch.tensor(0.3)
    for fn, args in [(torch.polar, (a, b)), (functools.partial(torch.add, alpha=2), (a, a)), (Doubler(), (a,))]:
        kiln.reset()
        torch.testing.assert_close(kiln.compile(fn, fullgraph=True)(*args), fn(*args))
