"""The built-in zoo through the prim evaluator: forward and backward leave no ATen op undecomposed
(except declared externs), and the decomposed program computes what eager computes."""
import pytest
import torch

from kiln.bench.zoo import ZOO, loss_of
from kiln.prims import PrimEvaluator


def _step(model, inputs):
    loss = loss_of(model(*inputs))
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_training_step_has_only_prims_and_externs(name, autocast):
    model, inputs = ZOO[name].make("cpu")
    model.train()                                   # dropout and batch-norm statistics in the trace
    evaluator = PrimEvaluator(strict=False)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), evaluator:
        _step(model, inputs)
    assert not evaluator.log.undecomposed, f"{name}: undecomposed ATen ops {dict(evaluator.log.undecomposed)}"
    assert evaluator.log.prims, "the evaluator saw no ops: the test would pass vacuously"


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_decomposed_step_matches_eager(name):
    model, inputs = ZOO[name].make("cpu")           # eval mode: no dropout, deterministic
    loss, grads = _step(model, inputs)
    with PrimEvaluator(strict=True, check_meta=True):
        got_loss, got_grads = _step(model, inputs)
    torch.testing.assert_close(got_loss, loss, rtol=1e-4, atol=1e-5)
    for g, e in zip(got_grads, grads):
        if e is not None:
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-5)
