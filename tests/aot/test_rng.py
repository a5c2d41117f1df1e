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


def test_zoo_dropout_recomputed_masks_match_saved_masks(aot_backend_class):
    """GPT-2 with dropout 0.1 in training: the min-cut partition recomputes the masks in the
    backward, the save-all partition saves them; with one seed both give the same gradients."""
    import copy

    RecordingAotEager = aot_backend_class
    from kiln.aot import save_all_partition
    from kiln.bench.zoo import ZOO, loss_of

    model, inputs = ZOO["gpt2"].make("cpu")
    model.train()
    results = []
    for partition in ("min_cut", "save_all"):
        backend = RecordingAotEager() if partition == "min_cut" else RecordingAotEager(save_all_partition)
        replica = copy.deepcopy(model)
        compiled = kiln.compile(replica, backend=backend)
        torch.manual_seed(7)
        loss = loss_of(compiled(*inputs))
        loss.backward()
        results.append((loss.detach(), [p.grad for p in replica.parameters()]))
        if partition == "min_cut":
            assert any("philox" in r.graphs[1].code for r in backend.runtimes), "no mask was recomputed"
    torch.testing.assert_close(results[0], results[1])
