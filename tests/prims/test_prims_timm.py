"""timm models through the prim evaluator (issue #5): a training step (forward and backward, fp32 and
bf16 autocast) of each of the five leaves no ATen op undecomposed, except declared externs; in fp32
the decomposed step also computes eager's loss.

On CPU. cuDNN batch norm, what these models dispatch on CUDA in fp32, is covered by
test_cuda_only_ops.py, since a CPU program never reaches it."""
import pytest
import torch

from kiln.prims import PrimEvaluator
from timm_support import TIMM_MODELS, tiny_timm


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_training_step_has_only_prims_and_externs(name, autocast):
    model, images = tiny_timm(name)
    evaluator = PrimEvaluator(strict=False)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with evaluator:
            loss = model(images).float().pow(2).mean()
            torch.autograd.grad(loss, list(model.parameters()))
        if not autocast:   # train mode, no dropout: the decomposed step is deterministic
            expected = tiny_timm(name)[0](images).float().pow(2).mean()
    assert not evaluator.log.undecomposed, f"{name}: undecomposed ATen ops {dict(evaluator.log.undecomposed)}"
    assert evaluator.log.prims["convolution"] or evaluator.log.prims["mm"], "no extern seen: a vacuous pass"
    if not autocast:
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-6)
