"""Every built-in zoo model: one training step under `aot_eager` matches eager.

Loss and every parameter's gradient by the benchmark's `same` rule (fp32, float64 run as arbiter),
BatchNorm running statistics as in eager. Dropout is set to p=0 here, because kiln's functional
rng draws other bits than eager's generator (test_rng.py checks dropout on its own).
"""
import copy

import pytest
import torch

import kiln
from kiln.bench.accuracy import same, tolerance
from kiln.bench.zoo import ZOO, loss_of


def _train_step(model, inputs):
    loss = loss_of(model(*inputs))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    return loss.detach(), grads, [b.clone() for b in model.buffers()]


def _without_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_training_step_matches_eager(name, aot_backend):
    kiln.reset()
    model, inputs = ZOO[name].make("cpu")
    model = _without_dropout(model)
    reference = copy.deepcopy(model)
    fp64 = copy.deepcopy(model).double()
    fp64_inputs = [x.double() if x.is_floating_point() else x for x in inputs]

    expected = _train_step(reference, inputs)
    arbiter = _train_step(fp64, fp64_inputs)
    compiled = kiln.compile(model, backend=aot_backend)
    got = _train_step(compiled, inputs)
    assert aot_backend.runtimes, f"{name}: no graph reached aot_compile (the model ran eagerly)"
    assert any(r.bw is not None for r in aot_backend.runtimes), f"{name}: no backward graph was compiled"

    tol = tolerance("zoo", "train", "fp32")
    for what, e, g, a in zip(("loss", "grads", "buffers"), expected, got, arbiter):
        verdict = same(e, g, a, tol=tol)
        assert verdict.ok, f"{name}: {what} differ from eager: {verdict.detail}"
    # the second step reads the updated buffers (running statistics, num_batches_tracked)
    expected2, got2 = _train_step(reference, inputs), _train_step(compiled, inputs)
    assert same(expected2[2], got2[2], tol=tol).ok, f"{name}: buffers after two steps differ"


@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_bf16_autocast_training_step_matches_eager(name, aot_backend):
    kiln.reset()
    model, inputs = ZOO[name].make("cpu")
    model = _without_dropout(model)
    reference, fp64 = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = kiln.compile(model, backend=aot_backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = loss_of(reference(*inputs))
        got = loss_of(compiled(*inputs))
    expected.backward()
    got.backward()
    arbiter = loss_of(fp64(*[x.double() if x.is_floating_point() else x for x in inputs]))
    arbiter.backward()
    assert aot_backend.runtimes
    verdict = same([expected.detach()] + [p.grad for p in reference.parameters()],
                   [got.detach()] + [p.grad for p in model.parameters()],
                   [arbiter.detach()] + [p.grad for p in fp64.parameters()], tol=tolerance("zoo", "train", "bf16"))
    assert verdict.ok, f"{name} under bf16 autocast: {verdict.detail}"
