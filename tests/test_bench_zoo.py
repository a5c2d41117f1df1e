"""The built-in zoo: every model runs forward and backward, is deterministic under its seed,
traces with torch.fx.symbolic_trace to the same results, and its architecture does what the real
one does (causal masking, padding masking, dropout in training)."""
import pytest
import torch

from kiln.bench.zoo import ZOO, loss_of

NAMES = sorted(ZOO)
WITH_DROPOUT = {"mlp", "gpt2", "bert", "vit"}


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward_and_seeded_determinism(name):
    model, inputs = ZOO[name].make("cpu")
    again, inputs_again = ZOO[name].make("cpu")
    for a, b in zip(inputs, inputs_again):
        assert torch.equal(a, b)
    for (key, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), key
    with torch.no_grad():
        out = model(*inputs)
    assert torch.isfinite(out).all()
    model.train()
    loss = loss_of(model(*inputs))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


@pytest.mark.parametrize("name", NAMES)
def test_symbolic_trace_matches_eager_in_float64(name):
    model, inputs = ZOO[name].make("cpu")
    model = model.double()
    inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        torch.testing.assert_close(traced(*inputs), model(*inputs), rtol=1e-12, atol=1e-12)


def test_make_leaves_the_callers_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ZOO["gpt2"].make("cpu")
    assert torch.equal(torch.rand(3), expected)


def test_bench_size_is_bigger_and_batch_is_overridable():
    small, (x,) = ZOO["mlp"].make("cpu")
    big, (y,) = ZOO["mlp"].make("cpu", size="bench")
    assert sum(p.numel() for p in big.parameters()) > sum(p.numel() for p in small.parameters())
    _, (z,) = ZOO["mlp"].make("cpu", batch=5)
    assert z.shape[0] == 5
    with pytest.raises(ValueError, match="size must be one of"):
        ZOO["mlp"].make("cpu", size="huge")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoders_are_causal(name):
    model, (ids,) = ZOO[name].make("cpu")
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 512
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])       # the past does not see the future
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_bert_ignores_padded_tokens():
    model, (ids, mask) = ZOO["bert"].make("cpu")
    assert (mask == 0).any(), "the example inputs should contain padding"
    changed = torch.where(mask == 0, (ids + 7) % 512, ids)
    with torch.no_grad():
        a, b = model(ids, mask), model(changed, mask)
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep])
    assert not torch.allclose(a[~keep], b[~keep])


@pytest.mark.parametrize("name", sorted(WITH_DROPOUT))
def test_dropout_is_active_in_training_only(name):
    model, inputs = ZOO[name].make("cpu")
    with torch.no_grad():
        assert torch.equal(model(*inputs), model(*inputs))
        model.train()
        assert not torch.equal(model(*inputs), model(*inputs))


def test_resnet_updates_batchnorm_statistics_in_training():
    model, inputs = ZOO["resnet"].make("cpu")
    before = model.stem[1].running_mean.clone()
    model.train()
    model(*inputs)
    assert not torch.equal(before, model.stem[1].running_mean)


def test_loss_of_walks_structures_and_rejects_non_float_outputs():
    x = torch.ones(2, 3, requires_grad=True)
    loss = loss_of({"a": x * 2, "b": (x, torch.arange(3))})
    assert loss.item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="no floating tensor"):
        loss_of(torch.arange(3))
