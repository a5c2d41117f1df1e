"""Functional rng: dropout under aot_eager draws one mask, used by forward and recomputed backward."""
import torch
import torch.nn.functional as F

import kiln


def _dropout_program(x, w):
    y = F.dropout(x, p=0.5, training=True) * w
    return y, y.sum()


def test_recomputed_dropout_mask_equals_forward_mask(aot_backend):
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.rand(64, 32) + 0.5
    compiled = kiln.compile(_dropout_program, backend=aot_backend)
    torch.manual_seed(0)
    y, loss = compiled(x, w)
    loss.backward()
    (runtime,) = aot_backend.runtimes
    fw_gm, bw_gm = runtime.graphs
    assert "philox" in bw_gm.code, "the partition should recompute the mask in the backward, not save it"
    kept = y != 0
    assert 0.4 < kept.float().mean() < 0.6
    # eager's rule: the gradient is the kept mask scaled by 1/(1-p), times w
    torch.testing.assert_close(x.grad, kept * 2.0 * w)


def test_fixed_seed_reproduces_and_calls_differ(aot_backend):
    x, w = torch.randn(16, 16), torch.ones(16, 16)
    compiled = kiln.compile(_dropout_program, backend=aot_backend)
    torch.manual_seed(123)
    first, _ = compiled(x, w)
    second, _ = compiled(x, w)
    torch.manual_seed(123)
    again, _ = compiled(x, w)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_dropout_in_eval_draws_nothing(aot_backend):
    x = torch.randn(8, 8, requires_grad=True)
    compiled = kiln.compile(lambda t: F.dropout(t, 0.5, training=False) * 2, backend=aot_backend)
    out = compiled(x)
    torch.testing.assert_close(out, x * 2)
    assert "philox" not in aot_backend.runtimes[0].graphs[0].code
